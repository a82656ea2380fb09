// mfma.cuh — AMD's matrix-core instruction for 16-bit inputs on CDNA (gfx90a, gfx942; wave 64):
// v_mfma_f32_16x16x16f16 and v_mfma_f32_16x16x16bf16_1k, D (16x16 f32) = A (16x16) * B (16x16)
// + C. On a real device pass each is one clang builtin; under the emulator (PA_SIM) it calls the
// lane-by-lane semantics (sim/mfma.h), which name the caller's line on divergence. Declared
// where PA_MFMA_TILES is (vendor.cuh); a device pass without the instruction (RDNA, gfx908)
// traps, as the host never launches an MFMA tile on such a device.
// Fragments (AMD's CDNA ISA guides), lane l of 64, element i = 0..3, two 16-bit elements per
// 32-bit register with the lower-numbered one in the low half:
//   a[0..1]: A (row l % 16, k 4 (l / 16) + i)
//   b[0..1]: B (k 4 (l / 16) + i, column l % 16)
//   c, d[0..3]: D (row 4 (l / 16) + i, column l % 16)
#ifndef PAGEDATTN_GPU_MFMA_CUH
#define PAGEDATTN_GPU_MFMA_CUH

#include <stdint.h>

#include "vendor.cuh"

#if defined(PA_MFMA_TILES)

#if defined(PA_SIM)
#include "sim/mfma.h"
#define PA_MFMA_CALL_SITE \
  , const char *file = __builtin_FILE(), int line = __builtin_LINE(), \
    const char *fn = __builtin_FUNCTION()
#else
#define PA_MFMA_CALL_SITE
#endif

namespace pagedattn_gpu {

#if !defined(PA_SIM) && defined(__HIP_DEVICE_COMPILE__) && defined(PA_HAS_MFMA)
typedef float pa_mfma_f32x4 __attribute__((ext_vector_type(4)));
typedef _Float16 pa_mfma_f16x4 __attribute__((ext_vector_type(4)));
typedef short pa_mfma_i16x4 __attribute__((ext_vector_type(4)));
#endif

// d may be c (accumulate in place).
__device__ __forceinline__ void mfma_16x16x16_bf16(float d[4], const uint32_t a[2],
                                                   const uint32_t b[2],
                                                   const float c[4] PA_MFMA_CALL_SITE) {
  (void)d, (void)a, (void)b, (void)c;  // a pass without the instruction uses none
#if defined(PA_SIM)
  ::pa_sim::mfma_16x16x16(true, d, a, b, c, file, line, fn);
#elif defined(__HIP_DEVICE_COMPILE__) && defined(PA_HAS_MFMA)
  pa_mfma_i16x4 va, vb;
  pa_mfma_f32x4 vc = {c[0], c[1], c[2], c[3]};
  __builtin_memcpy(&va, a, 8);
  __builtin_memcpy(&vb, b, 8);
  const pa_mfma_f32x4 vd = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(va, vb, vc, 0, 0, 0);
  d[0] = vd[0];
  d[1] = vd[1];
  d[2] = vd[2];
  d[3] = vd[3];
#elif defined(__HIP_DEVICE_COMPILE__)
  __builtin_trap();
#endif
}

__device__ __forceinline__ void mfma_16x16x16_f16(float d[4], const uint32_t a[2],
                                                  const uint32_t b[2],
                                                  const float c[4] PA_MFMA_CALL_SITE) {
  (void)d, (void)a, (void)b, (void)c;  // a pass without the instruction uses none
#if defined(PA_SIM)
  ::pa_sim::mfma_16x16x16(false, d, a, b, c, file, line, fn);
#elif defined(__HIP_DEVICE_COMPILE__) && defined(PA_HAS_MFMA)
  pa_mfma_f16x4 va, vb;
  pa_mfma_f32x4 vc = {c[0], c[1], c[2], c[3]};
  __builtin_memcpy(&va, a, 8);
  __builtin_memcpy(&vb, b, 8);
  const pa_mfma_f32x4 vd = __builtin_amdgcn_mfma_f32_16x16x16f16(va, vb, vc, 0, 0, 0);
  d[0] = vd[0];
  d[1] = vd[1];
  d[2] = vd[2];
  d[3] = vd[3];
#elif defined(__HIP_DEVICE_COMPILE__)
  __builtin_trap();
#endif
}

}  // namespace pagedattn_gpu

#undef PA_MFMA_CALL_SITE

#endif  // PA_MFMA_TILES

#endif  // PAGEDATTN_GPU_MFMA_CUH
