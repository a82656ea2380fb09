// cuda_fp16.h (gpusim) — __half and its conversions (halfs.h).
#pragma once
#include "../halfs.h"
