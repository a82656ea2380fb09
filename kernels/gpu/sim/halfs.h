// halfs.h — __half, __nv_bfloat16 and the fp8 pair conversion of the CUDA headers, over the CPU
// converters of kernels/cpu/convert.h (round-to-nearest-even, bit-identical to the GPU's), so the
// emulated kernels convert exactly as the hardware does.
#ifndef PAGEDATTN_GPUSIM_HALFS_H
#define PAGEDATTN_GPUSIM_HALFS_H

#include <stdint.h>

#include "../../cpu/convert.h"
#include "device.h"

struct __half_raw {
  unsigned short x;
};
struct __half2_raw {
  unsigned short x, y;
};
struct __half {
  unsigned short __x;
  __half() = default;
  __half(__half_raw r) : __x(r.x) {}
};
struct alignas(4) __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  unsigned short __x;
};

inline float __half2float(__half h) { return pa_cpu::f16_to_f32(h.__x); }
inline __half __float2half_rn(float f) { return __half(__half_raw{pa_cpu::f32_to_f16(f)}); }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return pa_cpu::bf16_to_f32(b.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {pa_cpu::f32_to_bf16(f)}; }

// The sm_89 cvt instruction: two fp8 codes (low byte first) to two halves, exactly (both fp8
// formats are subsets of half; NaN stays NaN).
typedef unsigned short __nv_fp8x2_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t pair,
                                              __nv_fp8_interpretation_t kind) {
  const uint8_t lo = static_cast<uint8_t>(pair & 0xff), hi = static_cast<uint8_t>(pair >> 8);
  auto one = [kind](uint8_t b) {
    const float f = kind == __NV_E4M3 ? pa_cpu::e4m3_to_f32(b) : pa_cpu::e5m2_to_f32(b);
    return pa_cpu::f32_to_f16(f);
  };
  return {one(lo), one(hi)};
}

#endif  // PAGEDATTN_GPUSIM_HALFS_H
