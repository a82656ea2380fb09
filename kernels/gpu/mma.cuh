// mma.cuh — the register-fragment tensor-core instructions a FlashAttention-2-class kernel
// uses: mma.sync m16n8k16 (f16/bf16 in, f32 accumulators) and ldmatrix m8n8 .b16 (x2, x4,
// optional .trans). On nvcc (sm_80+) each is one inline PTX instruction; under the emulator
// (PA_SIM) each calls its lane-by-lane semantics (sim/mma.h), which name the caller's line on
// divergence. Fragments are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating
// point type"): groupID = lane >> 2, threadID_in_group = lane % 4, two 16-bit elements per
// register with the lower-numbered one in the low half.
#ifndef PAGEDATTN_GPU_MMA_CUH
#define PAGEDATTN_GPU_MMA_CUH

#include <stdint.h>

#include "vendor.cuh"

#if defined(PA_HAS_MMA_SYNC)

#if defined(PA_SIM)
#include <mma.h>
// The emulator reports the caller's line, so the wrappers take it as defaulted arguments.
#define PA_MMA_CALL_SITE \
  , const char *file = __builtin_FILE(), int line = __builtin_LINE(), \
    const char *fn = __builtin_FUNCTION()
#else
#define PA_MMA_CALL_SITE
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.cuh: mma.sync m16n8k16 with bf16 needs sm_80 or newer"
#endif
#endif

namespace pagedattn_gpu {

// Every wrapper's asm is volatile: the instructions are warp-collective (.sync.aligned), so the
// compiler must not sink one into a branch that only some lanes take, or drop one whose result
// only some lanes use.

// D (16x8 f32) = A (16x16 bf16, row) * B (16x8 bf16, col) + C. d may be c (accumulate in place).
//   a[0]: (groupID, 2t..2t+1)  a[1]: (groupID+8, 2t..2t+1)
//   a[2]: (groupID, 2t+8..2t+9)  a[3]: (groupID+8, 2t+8..2t+9)      t = threadID_in_group
//   b[0]: (k 2t..2t+1, n groupID)  b[1]: (k 2t+8..2t+9, n groupID)
//   c, d [0..1]: (groupID, 2t..2t+1)  [2..3]: (groupID+8, 2t..2t+1)
__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2],
                                                  const float c[4] PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::mma_m16n8k16(true, d, a, b, c, file, line, fn);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// The same with f16 inputs (.f32.f16.f16.f32), fragments laid out alike.
__device__ __forceinline__ void mma_m16n8k16_f16(float d[4], const uint32_t a[4],
                                                 const uint32_t b[2],
                                                 const float c[4] PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::mma_m16n8k16(false, d, a, b, c, file, line, fn);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// ldmatrix: each lane passes the shared-memory address of the row it supplies (16 contiguous,
// 16-byte-aligned bytes): lanes 8m..8m+7 give rows 0..7 of matrix m. r[m] of lane l then holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m; .trans gives the transposed
// matrix's, i.e. rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4, which turns a row-major K x N
// tile (V in attention) into mma B fragments. The "memory" clobber keeps each load after the
// shared-memory stores and barriers before it, which the compiler cannot see it read.
// Four matrices: every lane supplies a row. For an mma A tile (16x16, row-major at p with ld
// elements a row), lane l passes p + (l % 16) * ld + (l / 16) * 8 and gets a[0..3].
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4],
                                            const void* smem_row_ptr PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::ldmatrix_m8n8(r, 4, false, smem_row_ptr, file, line, fn);
#elif defined(__CUDA_ARCH__)
  const uint32_t p = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(p)
               : "memory");
#endif
}

// Two matrices: lanes 0..15 supply the rows; the other lanes' addresses are ignored.
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2],
                                            const void* smem_row_ptr PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::ldmatrix_m8n8(r, 2, false, smem_row_ptr, file, line, fn);
#elif defined(__CUDA_ARCH__)
  const uint32_t p = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(p)
               : "memory");
#endif
}

// Four transposed matrices. For the B fragments of two n-tiles from a row-major K x N tile
// (16 x 16 at p, ld elements a row), lane l passes p + (l % 16) * ld + (l / 16) * 8 and gets
// b[0..1] of columns 0..7 in r[0..1], of columns 8..15 in r[2..3].
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4],
                                                  const void* smem_row_ptr PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::ldmatrix_m8n8(r, 4, true, smem_row_ptr, file, line, fn);
#elif defined(__CUDA_ARCH__)
  const uint32_t p = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(p)
               : "memory");
#endif
}

// Two transposed matrices (lanes 0..15 supply the rows): one n-tile's B fragment from a
// row-major 16 x 8 K x N tile, lane l passing p + l * ld.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2],
                                                  const void* smem_row_ptr PA_MMA_CALL_SITE) {
#if defined(PA_SIM)
  ::pa_sim::ldmatrix_m8n8(r, 2, true, smem_row_ptr, file, line, fn);
#elif defined(__CUDA_ARCH__)
  const uint32_t p = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row_ptr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(p)
               : "memory");
#endif
}

}  // namespace pagedattn_gpu

#undef PA_MMA_CALL_SITE

#endif  // PA_HAS_MMA_SYNC

#endif  // PAGEDATTN_GPU_MMA_CUH
