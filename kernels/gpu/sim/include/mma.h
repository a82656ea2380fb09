// mma.h (gpusim) — CUDA's tensor-core header: nvcuda::wmma as warp-collective whole tiles
// (wmma.h), and here also mma.sync and ldmatrix lane by lane (../mma.h), which real CUDA reaches
// through inline PTX (kernels/gpu/mma.cuh).
#pragma once
#include "../wmma.h"
#include "../mma.h"
