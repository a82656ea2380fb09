// cuda_bf16.h (gpusim) — __nv_bfloat16 and its conversions (halfs.h).
#pragma once
#include "../halfs.h"
