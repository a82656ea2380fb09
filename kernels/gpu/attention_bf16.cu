// attention_bf16.cu — the attention kernels of bf16 queries: every head size and cache type that
// instantiations.h lists for them (one translation unit per entry of PA_GPU_DTYPES, so the build
// compiles the query types in parallel).
#include "attention.cuh"

PA_GPU_INSTANTIATE_ATTENTION(bf16_t)
