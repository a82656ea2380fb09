// mma.h (gpusim) — nvcuda::wmma as warp-collective whole tiles (wmma.h).
#pragma once
#include "../wmma.h"
