// Element conversions for the reference, written from the formats' definitions (not the
// library's code): IEEE binary16, bfloat16 (top half of binary32), OCP fp8 e4m3fn and e5m2.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagedattn_test_support.h"

namespace pat {

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Decodes a small float format with e exponent bits and m mantissa bits; `fn` = no infinities
// (e4m3fn: only S.1111.111 is NaN).
float decode_small(uint32_t b, int e, int m, bool fn) {
  const uint32_t sign = (b >> (e + m)) & 1u;
  const uint32_t ex = (b >> m) & ((1u << e) - 1u);
  const uint32_t man = b & ((1u << m) - 1u);
  const int bias = (1 << (e - 1)) - 1;
  double v;
  if (ex == (1u << e) - 1u && (!fn || man == (1u << m) - 1u)) {
    v = (man == 0 && !fn) ? INFINITY : NAN;
  } else if (ex == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - m);
  } else {
    v = std::ldexp(static_cast<double>(man + (1u << m)), static_cast<int>(ex) - bias - m);
  }
  return static_cast<float>(sign ? -v : v);
}

// Round-to-nearest-even onto the finite values of an fp8 format, saturating at the largest.
// Done by searching the sorted table of non-negative finite codes: slow but obviously right.
struct Fp8Table {
  std::vector<float> vals;    // ascending
  std::vector<uint8_t> codes; // matching codes (sign bit clear)
  uint8_t nan_code;
};

Fp8Table build_table(int e, int m, bool fn) {
  Fp8Table t;
  for (uint32_t c = 0; c < 128; ++c) {
    float v = decode_small(c, e, m, fn);
    if (std::isfinite(v)) {
      t.vals.push_back(v);
      t.codes.push_back(static_cast<uint8_t>(c));
    }
  }
  // codes 0..127 decode in ascending order for both formats
  t.nan_code = fn ? 0x7F : 0x7E;
  return t;
}

uint8_t encode_fp8(const Fp8Table& t, float x) {
  if (std::isnan(x)) return t.nan_code;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= t.vals.back()) return sign | t.codes.back();  // saturate (also +-inf)
  auto it = std::upper_bound(t.vals.begin(), t.vals.end(), a);
  const size_t hi = static_cast<size_t>(it - t.vals.begin());
  const size_t lo = hi - 1;  // vals[0] = 0 <= a, so hi >= 1
  const double dlo = static_cast<double>(a) - t.vals[lo];
  const double dhi = static_cast<double>(t.vals[hi]) - a;
  size_t pick;
  if (dlo < dhi) pick = lo;
  else if (dhi < dlo) pick = hi;
  else pick = (t.codes[lo] & 1u) == 0 ? lo : hi;  // tie: even mantissa
  return sign | t.codes[pick];
}

const Fp8Table& e4m3_table() {
  static const Fp8Table t = build_table(4, 3, true);
  return t;
}
const Fp8Table& e5m2_table() {
  static const Fp8Table t = build_table(5, 2, false);
  return t;
}

}  // namespace

uint16_t f32_to_f16(float x) {
  const uint32_t u = bits_of(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return sign | (a > 0x7F800000u ? 0x7E00 : 0x7C00);
  if (a >= 0x477FF000u) return sign | 0x7C00;  // >= 65520 rounds to infinity
  if (a < 0x38800000u) {
    // below 2^-14: subnormal in binary16, units of 2^-24; scaling by 2^24 is exact in float.
    const float s = std::fabs(x) * 16777216.0f;
    const uint32_t r = static_cast<uint32_t>(std::nearbyint(s));  // ties to even
    return sign | static_cast<uint16_t>(r);
  }
  const uint32_t odd = (a >> 13) & 1u;
  uint32_t r = a + 0xFFFu + odd;
  r -= (127u - 15u) << 23;
  return sign | static_cast<uint16_t>(r >> 13);
}

float f16_to_f32(uint16_t h) { return decode_small(h, 5, 10, false); }

uint16_t f32_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t r = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(r >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint8_t f32_to_e4m3(float x) { return encode_fp8(e4m3_table(), x); }
float e4m3_to_f32(uint8_t b) { return decode_small(b, 4, 3, true); }
uint8_t f32_to_e5m2(float x) { return encode_fp8(e5m2_table(), x); }
float e5m2_to_f32(uint8_t b) { return decode_small(b, 5, 2, false); }

bool is_fp8(pagedattn_dtype dt) {
  return dt == PAGEDATTN_DTYPE_FP8_E4M3 || dt == PAGEDATTN_DTYPE_FP8_E5M2;
}

size_t dtype_bytes(pagedattn_dtype dt) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return 4;
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16: return 2;
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

void store(pagedattn_dtype dt, void* p, float x) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: std::memcpy(p, &x, 4); break;
    case PAGEDATTN_DTYPE_FLOAT16: { uint16_t h = f32_to_f16(x); std::memcpy(p, &h, 2); break; }
    case PAGEDATTN_DTYPE_BFLOAT16: { uint16_t h = f32_to_bf16(x); std::memcpy(p, &h, 2); break; }
    case PAGEDATTN_DTYPE_FP8_E4M3: *static_cast<uint8_t*>(p) = f32_to_e4m3(x); break;
    case PAGEDATTN_DTYPE_FP8_E5M2: *static_cast<uint8_t*>(p) = f32_to_e5m2(x); break;
    default: break;
  }
}

float load(pagedattn_dtype dt, const void* p) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: { float x; std::memcpy(&x, p, 4); return x; }
    case PAGEDATTN_DTYPE_FLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    case PAGEDATTN_DTYPE_BFLOAT16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case PAGEDATTN_DTYPE_FP8_E4M3: return e4m3_to_f32(*static_cast<const uint8_t*>(p));
    case PAGEDATTN_DTYPE_FP8_E5M2: return e5m2_to_f32(*static_cast<const uint8_t*>(p));
    default: return NAN;
  }
}

float round_to(pagedattn_dtype dt, float x) {
  uint8_t b[4];
  store(dt, b, x);
  return load(dt, b);
}

void store_poison(pagedattn_dtype dt, void* p) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: { uint32_t u = 0x7FD5A5A5u; std::memcpy(p, &u, 4); break; }
    case PAGEDATTN_DTYPE_FLOAT16: { uint16_t h = 0x7E5A; std::memcpy(p, &h, 2); break; }
    case PAGEDATTN_DTYPE_BFLOAT16: { uint16_t h = 0x7FD5; std::memcpy(p, &h, 2); break; }
    default: *static_cast<uint8_t*>(p) = 0x7F; break;
  }
}

pagedattn_dlpack_dtype dlpack_of(pagedattn_dtype dt) {
  pagedattn_dlpack_dtype d{};
  d.lanes = 1;
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: d.code = PAGEDATTN_DLPACK_FLOAT; d.bits = 32; break;
    case PAGEDATTN_DTYPE_FLOAT16: d.code = PAGEDATTN_DLPACK_FLOAT; d.bits = 16; break;
    case PAGEDATTN_DTYPE_BFLOAT16: d.code = PAGEDATTN_DLPACK_BFLOAT; d.bits = 16; break;
    case PAGEDATTN_DTYPE_FP8_E4M3: d.code = PAGEDATTN_DLPACK_FLOAT8_E4M3FN; d.bits = 8; break;
    case PAGEDATTN_DTYPE_FP8_E5M2: d.code = PAGEDATTN_DLPACK_FLOAT8_E5M2; d.bits = 8; break;
    default: break;
  }
  return d;
}

const char* dtype_str(pagedattn_dtype dt) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return "f32";
    case PAGEDATTN_DTYPE_FLOAT16: return "f16";
    case PAGEDATTN_DTYPE_BFLOAT16: return "bf16";
    case PAGEDATTN_DTYPE_FP8_E4M3: return "e4m3";
    case PAGEDATTN_DTYPE_FP8_E5M2: return "e5m2";
    default: return "invalid";
  }
}

}  // namespace pat
