// types.cuh — element types of tensors and caches, and their float conversions.
// bf16 and fp8 are converted by bit manipulation so CUDA and HIP 5.2 (which lacks fp8 types)
// compute bit-identical values.
#ifndef PAGEDATTN_GPU_TYPES_CUH
#define PAGEDATTN_GPU_TYPES_CUH

#include <stdint.h>

#include <type_traits>

#include "vendor.cuh"

#if defined(PA_CUDA)
#include <cuda_fp8.h>
#endif

namespace pagedattn_gpu {

struct bf16_t { uint16_t bits; };
struct e4m3_t { uint8_t bits; };
struct e5m2_t { uint8_t bits; };
typedef __half f16_t;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(f16_t x) { return __half2float(x); }
__device__ __forceinline__ float to_float(bf16_t x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
// e4m3 bits shifted into a half land 8 binades low (bias 7 vs 15); subnormals come out right too.
// e4m3fn has no infinities and one NaN per sign, S.1111.111 (0x7f / 0xff): the shift would make
// it 480, so it is decoded to NaN explicitly (as kernels/cpu/convert.h does).
__device__ __forceinline__ float to_float(e4m3_t x) {
  const unsigned short h = static_cast<unsigned short>((x.bits & 0x7f) << 7);
  float f = __half2float(__ushort_as_half(h)) * 256.0f;
  if ((x.bits & 0x7f) == 0x7f) f = __uint_as_float(0x7fc00000u);
  return (x.bits & 0x80) ? -f : f;
}
// e5m2 is the upper byte of a half.
__device__ __forceinline__ float to_float(e5m2_t x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x.bits << 8)));
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ f16_t from_float<f16_t>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  uint32_t u = __float_as_uint(x);
  bf16_t r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN (quiet, sign kept)
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    r.bits = static_cast<uint16_t>(u >> 16);
  }
  return r;
}
// The bits of a 16-bit element, and two floats rounded to T (f16 or bf16) as one 32-bit
// register of them, the lower-numbered element in the low half: how the tensor-core and
// matrix-core operands are packed.
__device__ __forceinline__ uint32_t bits16(bf16_t x) { return x.bits; }
__device__ __forceinline__ uint32_t bits16(f16_t x) { return __half_as_ushort(x); }
template <typename T>
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  return bits16(from_float<T>(lo)) | (bits16(from_float<T>(hi)) << 16);
}
// Saturating round-to-nearest-even to e4m3fn (max 448, no infinities).
template <> __device__ __forceinline__ e4m3_t from_float<e4m3_t>(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  e4m3_t r;
  if (a > 0x7f800000u) { r.bits = static_cast<uint8_t>(sign | 0x7f); return r; }  // NaN
  const float fa = __uint_as_float(a);
  uint32_t code;
  if (fa >= 448.0f) {
    code = 0x7e;
  } else if (fa < 0.015625f) {                                // below 2^-6: subnormal steps 2^-9
    code = static_cast<uint32_t>(rintf(fa * 512.0f));
  } else {
    code = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    if (code > 0x7e) code = 0x7e;
  }
  r.bits = static_cast<uint8_t>(sign | code);
  return r;
}
// Saturating round-to-nearest-even to e5m2 (max 57344).
template <> __device__ __forceinline__ e5m2_t from_float<e5m2_t>(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7fffffffu;
  e5m2_t r;
  if (a > 0x7f800000u) { r.bits = static_cast<uint8_t>(sign | 0x7f); return r; }  // NaN
  const float fa = __uint_as_float(a);
  uint32_t code;
  if (fa >= 57344.0f) {
    code = 0x7b;
  } else if (fa < 6.103515625e-05f) {                         // below 2^-14: steps 2^-16
    code = static_cast<uint32_t>(rintf(fa * 65536.0f));
  } else {
    code = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
    if (code > 0x7b) code = 0x7b;
  }
  r.bits = static_cast<uint8_t>(sign | code);
  return r;
}

// What a global access moves, for the emulator's profile (sim/README.md, "What it counts").
enum MemUse : int { kUseKV = 0, kUseQ = 1, kUseOut = 2, kUseOther = 3 };

// The call site of an access wrapper, which the emulator's profile pairs lanes by: defaulted
// arguments under PA_SIM, nothing on a GPU. PA_ACCESS_FWD passes a caller's site on.
#if defined(PA_SIM)
#define PA_ACCESS_SITE \
  , const char *site_file = __builtin_FILE(), int site_line = __builtin_LINE()
#define PA_ACCESS_FWD , site_file, site_line
#define PA_ACCESS_NOTE(kind, use, p, bytes)                                                  \
  do {                                                                                      \
    if (::pa_sim::profiling())                                                              \
      ::pa_sim::note_access(::pa_sim::Access::kind, (use), (p), (bytes), site_file, site_line); \
  } while (0)
#else
#define PA_ACCESS_SITE
#define PA_ACCESS_FWD
#define PA_ACCESS_NOTE(kind, use, p, bytes) \
  do {                                      \
    (void)(use);                            \
  } while (0)
#endif

// The kernels' global and shared accesses on their hot paths: the plain access on a GPU; under
// the emulator also a record of the lane's address and width for the profile.
template <typename V>
__device__ __forceinline__ V ld_global(const V* p, MemUse use PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kGlobalLoad, use, p, sizeof(V));
  return *p;
}
template <typename V>
struct same_type {
  typedef V type;
};
template <typename V>
__device__ __forceinline__ void st_global(V* p, typename same_type<V>::type v,
                                          MemUse use PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kGlobalStore, use, p, sizeof(V));
  *p = v;
}
template <typename V>
__device__ __forceinline__ V ld_shared(const V* p PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kSharedLoad, 3, p, sizeof(V));
  return *p;
}
template <typename V>
__device__ __forceinline__ void st_shared(V* p, typename same_type<V>::type v PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kSharedStore, 3, p, sizeof(V));
  *p = v;
}

template <typename T> struct is_fp8 { static constexpr bool value = false; };
template <> struct is_fp8<e4m3_t> { static constexpr bool value = true; };
template <> struct is_fp8<e5m2_t> { static constexpr bool value = true; };

// Whether load_floats converts T through the cvt instruction in this compilation pass.
template <typename T>
constexpr bool fp8_cvt_path() {
#if defined(PA_HAS_FP8_CVT)
  return std::is_same<T, e4m3_t>::value;
#else
  return false;
#endif
}

// Converts N consecutive elements at p (any alignment of sizeof(T)) to float. fp8 pairs go
// through a half2 (both formats are subsets of half, so every value is exact): e5m2 by placing
// the bytes, e4m3 by the cvt instruction on sm_89 and later (NaN stays NaN), which the kernels'
// inner loops otherwise spend most of their instructions on.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float* out) {
  if constexpr (std::is_same<T, e5m2_t>::value && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const uint32_t w = (static_cast<uint32_t>(p[i].bits) << 8) |
                         (static_cast<uint32_t>(p[i + 1].bits) << 24);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
      out[i] = f.x;
      out[i + 1] = f.y;
    }
  } else if constexpr (fp8_cvt_path<T>() && N % 2 == 0) {
#if defined(PA_HAS_FP8_CVT)
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(
          p[i].bits | (static_cast<unsigned>(p[i + 1].bits) << 8));
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      out[i] = f.x;
      out[i + 1] = f.y;
    }
#endif
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

// The online softmax's rule for non-finite scores (docs/semantics.md section 5), as the CPU
// backends keep it (kernels/runtime/softmax_rules.h): a NaN or +inf score poisons the row's
// running maximum for good, and a poisoned row outputs NaN with log-sum-exp NaN. fmaxf drops
// NaN; max_keep_nan keeps it.
__device__ __forceinline__ bool max_poisoned(float m) { return !(m < INFINITY); }
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (a != a || b != b) ? a + b : fmaxf(a, b);
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_TYPES_CUH
