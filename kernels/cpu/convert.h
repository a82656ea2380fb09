/* kernels/cpu/convert.h — scalar element conversions (round-to-nearest-even), shared by the CPU
 * kernels. The vectorised loads live inside the Highway kernels. */
#ifndef PAGEDATTN_KERNELS_CPU_CONVERT_H
#define PAGEDATTN_KERNELS_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>

#include <cmath>

#include "pagedattn/common.h"

namespace pa_cpu {

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_f32(f32_bits(v) | sign);
  }
  if (exp == 31) return bits_f32(sign | 0x7F800000u | (man << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal 2^-14: subnormal, units of 2^-24
    const float q = std::nearbyint(bits_f32(a) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even; a carry bumps the exponent.
  const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r >> 13) - (112u << 10)));
}

/* fp8 with `E` exponent and `M` mantissa bits, IEEE-like bias; saturates to `max_code` (the
 * largest finite magnitude). NaN in gives the format's NaN. */
template <int E, int M>
static inline uint8_t f32_to_fp8(float f, uint8_t max_code, uint8_t nan_code) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | nan_code);
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr int kEmin = 1 - kBias;
  const float af = bits_f32(a);
  // Smallest normal 2^kEmin.
  if (af < std::ldexp(1.0f, kEmin)) {
    const float q = std::nearbyint(af * std::ldexp(1.0f, M - kEmin));
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  constexpr int kShift = 23 - M;
  uint32_t r = a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u);
  r >>= kShift;
  const uint32_t code = r - (static_cast<uint32_t>(127 - kBias) << M);
  if (a >= 0x7F800000u || code > max_code) return static_cast<uint8_t>(sign | max_code);
  return static_cast<uint8_t>(sign | code);
}

static inline uint8_t f32_to_e4m3(float f) { return f32_to_fp8<4, 3>(f, 0x7E, 0x7F); }
static inline uint8_t f32_to_e5m2(float f) { return f32_to_fp8<5, 2>(f, 0x7B, 0x7F); }

static inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xFu, man = b & 7u;
  if (exp == 15 && man == 7) return bits_f32(sign | 0x7FC00000u);
  if (exp == 0) return bits_f32(f32_bits(static_cast<float>(man) * 0.001953125f) | sign);  // 2^-9
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

static inline float e5m2_to_f32(uint8_t b) {
  return f16_to_f32(static_cast<uint16_t>(static_cast<uint16_t>(b) << 8));
}

/* Loads element i of an array of dtype dt as float (fp8: times scale). */
static inline float load_elem(const void* p, int64_t i, pagedattn_dtype dt, float scale) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return static_cast<const float*>(p)[i];
    case PAGEDATTN_DTYPE_FLOAT16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case PAGEDATTN_DTYPE_BFLOAT16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case PAGEDATTN_DTYPE_FP8_E4M3: return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]) * scale;
    case PAGEDATTN_DTYPE_FP8_E5M2: return e5m2_to_f32(static_cast<const uint8_t*>(p)[i]) * scale;
    default: return 0.0f;
  }
}

/* Stores x as element i of an array of dtype dt (fp8: x / scale, saturating). */
static inline void store_elem(void* p, int64_t i, pagedattn_dtype dt, float x, float scale) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: static_cast<float*>(p)[i] = x; break;
    case PAGEDATTN_DTYPE_FLOAT16: static_cast<uint16_t*>(p)[i] = f32_to_f16(x); break;
    case PAGEDATTN_DTYPE_BFLOAT16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); break;
    case PAGEDATTN_DTYPE_FP8_E4M3: static_cast<uint8_t*>(p)[i] = f32_to_e4m3(x / scale); break;
    case PAGEDATTN_DTYPE_FP8_E5M2: static_cast<uint8_t*>(p)[i] = f32_to_e5m2(x / scale); break;
    default: break;
  }
}

static inline size_t elem_size(pagedattn_dtype dt) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return 4;
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16: return 2;
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

}  // namespace pa_cpu

#endif  // PAGEDATTN_KERNELS_CPU_CONVERT_H
