// kernels/cpu/convert-inl.h — cache element conversion: cache rows (float32, float16, bf16, fp8) to
// float32, in registers (one vector at a time; fp8 two or four at a time where the target has a
// fast way) or into float32 scratch (load_row).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_CONVERT_INL_H_
#undef PA_CPU_CONVERT_INL_H_
#else
#define PA_CPU_CONVERT_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#if HWY_TARGET < HWY_SSE4
// f16 bits of the fp8 bytes at src, one per int16 lane of d16, exact; e4m3 comes out 2^-8 too
// small (its exponent bias is 8 below f16's).
template <int DT, class D16>
HWY_INLINE hn::Vec<D16> fp8_f16_bits(D16 d16, const int8_t* src) {
  const hn::RebindToUnsigned<D16> du16;
  const hn::Rebind<uint8_t, D16> du8;
  const auto u = hn::PromoteTo(du16, hn::LoadU(du8, reinterpret_cast<const uint8_t*>(src)));
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3) {
    // Zero-extended and shifted, t = [0, sign, 7-bit magnitude, 0 x 7]: e and m sit in f16's
    // exponent and mantissa, the sign one bit low. Adding t's bit 14 carries the sign up and
    // clears bit 14. Taking bits 14-15 of t + 0x80 instead also leaves bit 14 set (f16 exponent
    // 31, NaN) for magnitude 0x7F, e4m3fn's NaN (a NaN store gives it), with its sign: 4 ops
    // after the widening, no blend.
    const auto t = hn::ShiftLeft<7>(u);
    const auto top = hn::And(hn::Add(t, hn::Set(du16, 0x0080)), hn::Set(du16, 0xC000));
    return hn::BitCast(d16, hn::Add(t, top));
  } else {
    return hn::BitCast(d16, hn::ShiftLeft<8>(u));  // e5m2 is f16's top byte
  }
}
#endif

// N fp8 elements at p + i as float32, unscaled; e4m3 comes back 2^-8 too small (its exponent bias
// is 8 below f16's). Callers fold fp8_factor into q (keys) and the accumulators (values).
template <int DT>
HWY_INLINE hn::Vec<DF> load_fp8(const void* p, int i) {
  const DF d;
  const int8_t* src = static_cast<const int8_t*>(p) + i;
#if HWY_TARGET >= HWY_SSE4
  // No F16C here: Highway converts f16 in software without inf/NaN, so build float32 bits directly.
  const hn::Rebind<int8_t, DF> d8;
  const hn::RebindToSigned<DF> di;
  const auto w = hn::PromoteTo(di, hn::LoadU(d8, src));  // sign-extended
  const auto sign = hn::And(w, hn::Set(di, static_cast<int32_t>(0x80000000u)));
  const auto m = hn::And(w, hn::Set(di, 0x7F));
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3) {
    auto r = hn::Add(hn::ShiftLeft<20>(m), hn::Set(di, 112 << 23));
    const auto sub = hn::BitCast(di, hn::Mul(hn::ConvertTo(d, m), hn::Set(d, 1.0f / 131072.0f)));
    r = hn::IfThenElse(hn::Lt(m, hn::Set(di, 8)), sub, r);
    r = hn::IfThenElse(hn::Eq(m, hn::Set(di, 0x7F)), hn::Set(di, 0x7FC00000), r);
    return hn::BitCast(d, hn::Or(r, sign));
  } else {
    auto r = hn::Add(hn::ShiftLeft<21>(m), hn::Set(di, 112 << 23));
    // Exponent 31 (inf/NaN) needs 112 more to reach float32's 255.
    r = hn::Add(r, hn::IfThenElseZero(hn::Lt(hn::Set(di, 0x7B), m), hn::Set(di, 112 << 23)));
    const auto sub = hn::BitCast(di, hn::Mul(hn::ConvertTo(d, m), hn::Set(d, 1.0f / 65536.0f)));
    r = hn::IfThenElse(hn::Lt(m, hn::Set(di, 4)), sub, r);
    return hn::BitCast(d, hn::Or(r, sign));
  }
#else
  // fp8 -> f16 bit pattern (exact), then the hardware f16 -> f32 conversion, so fp8 subnormals
  // never reach a float32 multiply as denormals.
  const hn::Rebind<int16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(d, hn::BitCast(dh, fp8_f16_bits<DT>(d16, src)));
#endif
}

// N float16 elements at p + i as float32.
HWY_INLINE hn::Vec<DF> load_f16(const void* p, int i) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto f = hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(p) + i));
#if HWY_TARGET >= HWY_SSE4
  // Highway's software conversion reads exponent 31 as a finite 2^16..: make it inf/NaN.
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> du16;
  const auto w = hn::PromoteTo(du, hn::LoadU(du16, static_cast<const uint16_t*>(p) + i));
  const auto k7c00 = hn::Set(du, 0x7C00u);
  const auto special = hn::Eq(hn::And(w, k7c00), k7c00);
  return hn::BitCast(d, hn::IfThenElse(special, hn::Or(hn::BitCast(du, f), hn::Set(du, 0x7F800000u)),
                                       hn::BitCast(du, f)));
#else
  return f;
#endif
}

// ---- fp8, four vectors at a time, through byte lookups (AVX3_DL: AVX512-VBMI) ----
// 64 fp8 bytes -> 4 x N float32 in 7 shuffle-port ops, against ~7 ops per N for load_fp8: two
// vpermi2b lookups give the upper two bytes of each float32 (the lower two are always zero), one
// ternary op puts the sign in, four vpermt2b spread the byte pairs over the dwords. The values
// are load_fp8's (e4m3 2^-8 too small); the tables cover subnormals, inf and NaN exactly.
// Decode uses it when the head size is a multiple of 64 (kE4M3Quads, kE5M2Quads below).
#undef PA_FP8_QUADS
#if HWY_TARGET == HWY_AVX3_DL
#define PA_FP8_QUADS 1

// float32 bits of the fp8 magnitude m7 (7 bits) as load_fp8 returns it.
constexpr uint32_t fp8_mag_bits(bool e4m3, int m7) {
  if (e4m3) {
    const int e = m7 >> 3, m = m7 & 7;
    if (m7 == 0x7F) return 0x7FC00000u;  // e4m3fn's NaN
    if (e > 0) return (static_cast<uint32_t>(e + 112) << 23) | (static_cast<uint32_t>(m) << 20);
    if (m == 0) return 0;
    const int lead = m >= 4 ? 2 : (m >= 2 ? 1 : 0);  // subnormal m * 2^-9, times 2^-8
    return (static_cast<uint32_t>(lead - 17 + 127) << 23) |
           (static_cast<uint32_t>(m - (1 << lead)) << (23 - lead));
  }
  const int e = m7 >> 2, m = m7 & 3;
  if (e == 31) return (255u << 23) | (static_cast<uint32_t>(m) << 21);  // inf, NaN
  if (e > 0) return (static_cast<uint32_t>(e + 112) << 23) | (static_cast<uint32_t>(m) << 21);
  if (m == 0) return 0;
  const int lead = m >= 2 ? 1 : 0;  // subnormal m * 2^-16
  return (static_cast<uint32_t>(lead - 16 + 127) << 23) |
         (static_cast<uint32_t>(m - (1 << lead)) << (23 - lead));
}

struct Fp8Tables {
  alignas(64) uint8_t hi[128];  // bits 24..31 of the magnitude's float32
  alignas(64) uint8_t lo[128];  // bits 16..23
};

constexpr Fp8Tables make_fp8_tables(bool e4m3) {
  Fp8Tables t{};
  for (int m7 = 0; m7 < 128; ++m7) {
    const uint32_t b = fp8_mag_bits(e4m3, m7);
    t.hi[m7] = static_cast<uint8_t>(b >> 24);
    t.lo[m7] = static_cast<uint8_t>(b >> 16);
  }
  return t;
}

// Byte indices for vpermt2b over (lo, hi): dword j of vector c takes lo[16c + j] into its byte 2
// and hi[16c + j] into byte 3 (bytes 0 and 1 are zeroed by the mask).
struct Fp8Spread {
  alignas(64) uint8_t idx[4][64];
};

constexpr Fp8Spread make_fp8_spread() {
  Fp8Spread s{};
  for (int c = 0; c < 4; ++c) {
    for (int j = 0; j < 16; ++j) {
      s.idx[c][4 * j + 2] = static_cast<uint8_t>(16 * c + j);
      s.idx[c][4 * j + 3] = static_cast<uint8_t>(64 + 16 * c + j);
    }
  }
  return s;
}

constexpr Fp8Tables kE4M3Tables = make_fp8_tables(true);
constexpr Fp8Tables kE5M2Tables = make_fp8_tables(false);
constexpr Fp8Spread kFp8Spread = make_fp8_spread();

// Elements [i, i + 64) of an fp8 row at p as four float32 vectors v[0..3].
template <int DT>
HWY_INLINE void load_fp8_quad(const void* p, int i, hn::Vec<DF>* v) {
  const Fp8Tables& t = DT == PAGEDATTN_DTYPE_FP8_E4M3 ? kE4M3Tables : kE5M2Tables;
  const __m512i x = _mm512_loadu_si512(static_cast<const uint8_t*>(p) + i);
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t.lo), x,
                                              _mm512_load_si512(t.lo + 64));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(t.hi), x, _mm512_load_si512(t.hi + 64));
  // hi | (x & 0x80): vpermi2b ignores bit 7 of the index, the sign goes in here.
  hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
  const __mmask64 upper = 0xCCCCCCCCCCCCCCCCull;
  HWY_UNROLL(4)
  for (int c = 0; c < 4; ++c) {
    v[c] = hn::Vec<DF>{_mm512_castsi512_ps(
        _mm512_maskz_permutex2var_epi8(upper, lo, _mm512_load_si512(kFp8Spread.idx[c]), hi))};
  }
}
#else
#define PA_FP8_QUADS 0
#endif

// fp8 pairs (load_pair) on AVX2 only. Not on AVX3: where 512-bit integer ops are split in two
// (Zen 4), widening 2N bytes at once gains nothing; CPUs with full-width AVX-512 units are
// untried.
#undef PA_FP8_PAIRS
#if HWY_TARGET == HWY_AVX2
#define PA_FP8_PAIRS 1
#else
#define PA_FP8_PAIRS 0
#endif

// Kernel "dtypes" of the in-register decode paths that read rows in multi-vector chunks
// (bf16 and fp8 pairs below, fp8 quads above), and the cache dtype each one reads.
constexpr int kBF16Pairs = 100;
constexpr int kE4M3Quads = 101;
constexpr int kE5M2Quads = 102;
constexpr int kE4M3Pairs = 103;
constexpr int kE5M2Pairs = 104;
constexpr bool is_fp8_quads(int DT) { return DT == kE4M3Quads || DT == kE5M2Quads; }
constexpr bool is_fp8_pairs(int DT) { return DT == kE4M3Pairs || DT == kE5M2Pairs; }
// Two vectors per load_pair: 2N-element chunks (bf16 pairs permuted, fp8 pairs in order).
constexpr bool is_pairs(int DT) { return DT == kBF16Pairs || is_fp8_pairs(DT); }
constexpr int base_dtype(int DT) {
  return DT == kBF16Pairs                       ? PAGEDATTN_DTYPE_BFLOAT16
         : DT == kE4M3Quads || DT == kE4M3Pairs ? PAGEDATTN_DTYPE_FP8_E4M3
         : DT == kE5M2Quads || DT == kE5M2Pairs ? PAGEDATTN_DTYPE_FP8_E5M2
                                                : DT;
}

// N elements of cache type DT at p + i as float32 (fp8 as load_fp8).
template <int DT0>
HWY_INLINE hn::Vec<DF> load_vec(const void* p, int i) {
  constexpr int DT = base_dtype(DT0);
  const DF d;
  if constexpr (DT == PAGEDATTN_DTYPE_FLOAT32) {
    return hn::LoadU(d, static_cast<const float*>(p) + i);
  } else if constexpr (DT == PAGEDATTN_DTYPE_BFLOAT16) {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(d, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(p) + i));
  } else if constexpr (DT == PAGEDATTN_DTYPE_FLOAT16) {
    return load_f16(p, i);
  } else {
    return load_fp8<DT>(p, i);
  }
}

HWY_INLINE float fp8_factor(pagedattn_dtype dt, float scale) {
  if (dt == PAGEDATTN_DTYPE_FP8_E4M3) return scale * 256.0f;
  return dt == PAGEDATTN_DTYPE_FP8_E5M2 ? scale : 1.0f;
}

// Converts n (a multiple of 8) elements of src to float32 in dst, times `scale` for fp8.
HWY_INLINE void load_row(const void* src, pagedattn_dtype dt, float scale, float* HWY_RESTRICT dst,
                         int n) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int i = 0;
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: {
      memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
      return;
    }
    case PAGEDATTN_DTYPE_BFLOAT16: {
      const hn::Rebind<hwy::bfloat16_t, DF> dbf;
      const hwy::bfloat16_t* p = static_cast<const hwy::bfloat16_t*>(src);
      for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dbf, p + i)), d, dst + i);
      break;
    }
    case PAGEDATTN_DTYPE_FLOAT16: {
      for (; i + N <= n; i += N) hn::StoreU(load_f16(src, i), d, dst + i);
      break;
    }
    case PAGEDATTN_DTYPE_FP8_E4M3: {
      const auto mul = hn::Set(d, fp8_factor(dt, scale));
      for (; i + N <= n; i += N)
        hn::StoreU(hn::Mul(load_fp8<PAGEDATTN_DTYPE_FP8_E4M3>(src, i), mul), d, dst + i);
      break;
    }
    case PAGEDATTN_DTYPE_FP8_E5M2: {
      const auto mul = hn::Set(d, fp8_factor(dt, scale));
      for (; i + N <= n; i += N)
        hn::StoreU(hn::Mul(load_fp8<PAGEDATTN_DTYPE_FP8_E5M2>(src, i), mul), d, dst + i);
      break;
    }
    default:
      break;
  }
  for (; i < n; ++i) dst[i] = load_elem(src, i, dt, scale);
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_CONVERT_INL_H_
