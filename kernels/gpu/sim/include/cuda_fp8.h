// cuda_fp8.h (gpusim) — the fp8 pair conversion (halfs.h).
#pragma once
#include "../halfs.h"
