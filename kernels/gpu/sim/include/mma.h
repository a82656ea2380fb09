// mma.h (gpusim) — CUDA's tensor-core header, here mma.sync and ldmatrix lane by lane
// (../mma.h), which real CUDA reaches through inline PTX (kernels/gpu/mma.cuh).
#pragma once
#include "../mma.h"
