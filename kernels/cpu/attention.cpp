// kernels/cpu/attention.cpp — paged attention work items (decode, prefill, chunked prefill,
// encoder, cross), one Highway instantiation per SIMD target.
//
// A work item is (sequence, KV head, some of its query heads, a query-token tile, a key range):
// its rows are every (token, head) pair, so each K/V tile is loaded and converted to float32 ONCE
// for the whole GQA group and tile. Flash-style loop over key tiles with an online softmax; no
// T x T score matrix. Keys outside the causal/window range of every row are never visited.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// ---- Cache element conversion ----

#if HWY_TARGET < HWY_SSE4
// f16 bits of sign-extended fp8 bytes x (int16 lanes), exact; e4m3 comes out 2^-8 too small.
// Sign extension copies the sign into bits 8..15: one shift puts it at bit 15.
template <int DT, class V>
HWY_INLINE V fp8_f16_bits(V x) {
  const hn::DFromV<V> d16;
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3) {
    // Bit 14 (a sign copy) cleared; e and m land in f16's exponent and mantissa.
    const auto h = hn::And(hn::ShiftLeft<7>(x), hn::Set(d16, static_cast<int16_t>(0xBF80)));
    // 0x7F/0xFF are e4m3fn's NaN (a NaN store gives them): f16 exponent 31 keeps them NaN. Only
    // their magnitude, 0x3F80, carries into bit 14 when 0x80 is added (one ternary op on AVX-512).
    return hn::OrAnd(h, hn::Add(h, hn::Set(d16, static_cast<int16_t>(0x0080))),
                     hn::Set(d16, static_cast<int16_t>(0x4000)));
  } else {
    return hn::ShiftLeft<8>(x);  // e5m2 is f16's top byte
  }
}
#endif

// N fp8 elements at p + i as float32, unscaled; e4m3 comes back 2^-8 too small (its exponent bias
// is 8 below f16's). Callers fold fp8_factor into q (keys) and the accumulators (values).
template <int DT>
HWY_INLINE hn::Vec<DF> load_fp8(const void* p, int i) {
  const DF d;
  const hn::Rebind<int8_t, DF> d8;
  const int8_t* src = static_cast<const int8_t*>(p) + i;
#if HWY_TARGET >= HWY_SSE4
  // No F16C here: Highway converts f16 in software without inf/NaN, so build float32 bits directly.
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
  return hn::PromoteTo(d, hn::BitCast(dh, fp8_f16_bits<DT>(hn::PromoteTo(d16, hn::LoadU(d8, src)))));
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
// Decode uses it when the head size is a multiple of 64 (kFp8Quads below).
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

// fp8 pairs (load_pair) on AVX2. Not on AVX3: Zen 4 splits 512-bit integer ops in two, so
// widening 2N bytes at once saved nothing there (in cache e4m3 0.55 -> 0.58 ms); untried on
// CPUs with full-width AVX-512 units.
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

// ---- Cache stores (reshape-and-cache): float32 to the cache dtype, bit for bit store_elem ----

// fp8 codes (E exponent, M mantissa bits) of x in int32 lanes, as f32_to_fp8<E, M> (convert.h):
// nearest even, magnitudes past the largest finite one saturate to max_code, NaN gives nan_code.
template <int E, int M>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> fp8_codes(hn::Vec<DF> x, int max_code, int nan_code) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr int kEmin = 1 - kBias;
  constexpr int kShift = 23 - M;
  const auto u = hn::BitCast(du, x);
  const auto sign = hn::BitCast(di, hn::And(hn::ShiftRight<24>(u), hn::Set(du, 0x80u)));
  const auto a = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  const auto ai = hn::BitCast(di, a);  // >= 0, so signed compares order it
  // Below the smallest normal 2^kEmin: a count of 2^(kEmin - M) steps (up to 2^M, which is the
  // smallest normal's code), nearest even in the default rounding mode, as nearbyint.
  const auto scaled = hn::Mul(hn::BitCast(d, a), hn::Set(d, static_cast<float>(1 << (M - kEmin))));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // vcvtps2dq alone: only lanes below the smallest normal keep sub, where it cannot overflow
  // (NearestInt's fix-up for large inputs cost four ops per vector).
  const hn::Vec<decltype(di)> sub{_mm512_cvtps_epi32(scaled.raw)};
#else
  const auto sub = hn::NearestInt(scaled);
#endif
  // Normal: drop kShift mantissa bits, nearest even (a carry moves up the exponent), rebias.
  const auto odd = hn::And(hn::ShiftRight<kShift>(a), hn::Set(du, 1u));
  const auto r = hn::ShiftRight<kShift>(hn::Add(hn::Add(a, hn::Set(du, (1u << (kShift - 1)) - 1u)), odd));
  const auto code = hn::Sub(hn::BitCast(di, r), hn::Set(di, (127 - kBias) << M));
  // One Min saturates both the finite overflow and inf: their codes are larger (and < 2^31).
  auto c = hn::Min(code, hn::Set(di, max_code));
  c = hn::IfThenElse(hn::Lt(ai, hn::Set(di, (127 + kEmin) << 23)), sub, c);
  c = hn::IfThenElse(hn::Gt(ai, hn::Set(di, 0x7F800000)), hn::Set(di, nan_code), c);
  return hn::Or(c, sign);
}

// fp8 codes of src[0, n) (n a multiple of N; float32, or bf16 when kBf16Src) times f (kMul, f =
// 1 / scale exactly) or divided by f (the scale), stored as bytes at o.
template <int E, int M, bool kMul, bool kBf16Src>
HWY_INLINE void store_fp8_row(uint8_t* HWY_RESTRICT o, const void* HWY_RESTRICT src, int n,
                              float f) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  constexpr int kMax = E == 4 ? 0x7E : 0x7B;
  const auto vf = hn::Set(d, f);
  for (int i = 0; i < n; i += N) {
    hn::Vec<DF> x;
    if constexpr (kBf16Src) {
      const hn::Rebind<hwy::bfloat16_t, DF> dbf;
      x = hn::PromoteTo(d, hn::LoadU(dbf, static_cast<const hwy::bfloat16_t*>(src) + i));
    } else {
      x = hn::LoadU(d, static_cast<const float*>(src) + i);
    }
    const auto c = fp8_codes<E, M>(kMul ? hn::Mul(x, vf) : hn::Div(x, vf), kMax, 0x7F);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm512_cvtepi32_epi8(c.raw));
#else
    const hn::Rebind<uint8_t, DF> d8;
    hn::StoreU(hn::DemoteTo(d8, c), d8, o + i);
#endif
  }
}

// 1 / scale when that is exact (scale a normal power of two): x * (1 / scale) then rounds the
// same real number x / scale does, so it gives the same float. 0 otherwise.
HWY_INLINE float exact_reciprocal(float scale) {
  uint32_t b;
  memcpy(&b, &scale, sizeof(b));
  const uint32_t e = (b >> 23) & 0xFFu;
  return (b & 0x807FFFFFu) == 0 && e >= 1 && e <= 253 ? 1.0f / scale : 0.0f;
}

// store_fp8_row for a runtime source dtype (bf16_src: bf16, else float32) and scale: a multiply
// by 1 / scale where that is exact (scale 1, the usual case; the division was ~1/5 of the
// conversion's time on Zen 4), else a division.
template <int E, int M>
HWY_INLINE void store_fp8_any(uint8_t* HWY_RESTRICT o, const void* HWY_RESTRICT src, int n,
                              bool bf16_src, float scale) {
  const float inv = exact_reciprocal(scale);
  if (inv != 0.0f) {
    if (bf16_src) store_fp8_row<E, M, true, true>(o, src, n, inv);
    else store_fp8_row<E, M, true, false>(o, src, n, inv);
  } else {
    if (bf16_src) store_fp8_row<E, M, false, true>(o, src, n, scale);
    else store_fp8_row<E, M, false, false>(o, src, n, scale);
  }
}

// bf16 bits of x in int32 lanes, as f32_to_bf16: nearest even; NaN stays NaN, quieted.
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> bf16_codes(hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, x);
  const auto hi = hn::ShiftRight<16>(u);
  const auto rounded =
      hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hi, hn::Set(du, 1u)))));
  const auto nan = hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu))),
                          hn::Set(di, 0x7F800000));
  return hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, nan), hn::Or(hi, hn::Set(du, 0x40u)),
                                        rounded));
}

// n elements of src (dtype sdt) stored as dtype ddt at dst, fp8 as x / scale: what store_elem
// gives for each (load_elem of src first), vectorised where the destination is bf16, float32 or
// fp8. n <= kMaxHeadSize.
HWY_INLINE void store_cache_row(void* dst, pagedattn_dtype ddt, const void* src,
                                pagedattn_dtype sdt, int n, float scale) {
  if (ddt == sdt) {
    memcpy(dst, src, static_cast<size_t>(n) * elem_size(sdt));
    return;
  }
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  HWY_ALIGN float tmp[kMaxHeadSize];
  // fp8 stores read bf16 and float32 rows in place; everything else goes through tmp.
  const bool fp8 = ddt == PAGEDATTN_DTYPE_FP8_E4M3 || ddt == PAGEDATTN_DTYPE_FP8_E5M2;
  const bool in_place = fp8 && (sdt == PAGEDATTN_DTYPE_BFLOAT16 || sdt == PAGEDATTN_DTYPE_FLOAT32);
  if (!in_place) load_row(src, sdt, 1.0f, tmp, n);
  int i = 0;
  switch (ddt) {
    case PAGEDATTN_DTYPE_FLOAT32:
      memcpy(dst, tmp, sizeof(float) * static_cast<size_t>(n));
      return;
    case PAGEDATTN_DTYPE_BFLOAT16: {
      const hn::Rebind<uint16_t, DF> d16;
      uint16_t* o = static_cast<uint16_t*>(dst);
      for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(d16, bf16_codes(hn::Load(d, tmp + i))), d16, o + i);
      break;
    }
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: {
      const bool bf = sdt == PAGEDATTN_DTYPE_BFLOAT16;
      const void* from = in_place ? src : tmp;
      uint8_t* o = static_cast<uint8_t*>(dst);
      i = n / N * N;
      if (ddt == PAGEDATTN_DTYPE_FP8_E4M3)
        store_fp8_any<4, 3>(o, from, i, bf, scale);
      else
        store_fp8_any<5, 2>(o, from, i, bf, scale);
      break;
    }
    default:  // float16: scalar (Highway's software f16 rounding is not store_elem's everywhere)
      break;
  }
  for (; i < n; ++i) store_elem(dst, i, ddt, load_elem(src, i, sdt, 1.0f), scale);
}

void StoreCacheRow(void* dst, pagedattn_dtype ddt, const void* src, pagedattn_dtype sdt, int n,
                   float scale) {
  store_cache_row(dst, ddt, src, sdt, n, scale);
}

// Element offsets of key `pos`'s K and V rows of the item's KV head: through the block table
// (both at one offset), or rows of contiguous K/V (encoder, cross attention without a cache).
HWY_INLINE void key_offsets(const AttnItem& it, int64_t pos, int64_t* koff, int64_t* voff) {
  const KVSource& s = it.kv;
  if (s.table != nullptr) {  // block sizes are powers of two: shift and mask, no division
    const int shift = __builtin_ctz(static_cast<unsigned>(s.block_size));
    *koff = *voff = s.table[pos >> shift] * s.block_stride +
                    (pos & (s.block_size - 1)) * s.slot_stride + it.kv_head * s.head_stride;
  } else {
    *koff = (s.row0 + pos) * s.block_stride + it.kv_head * s.head_stride;
    *voff = (s.row0 + pos) * s.v_block_stride + it.kv_head * s.v_head_stride;
  }
}

// Prefetches the K and V rows of key `pos`: paged rows are scattered (shuffled blocks, strided
// heads), which the hardware prefetchers do not follow.
HWY_INLINE void prefetch_key(const AttnItem& it, int64_t pos) {
#ifdef PA_NO_PREFETCH
  return;
#endif
  const KVSource& s = it.kv;
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  const int64_t bytes = static_cast<int64_t>(it.head_size) * esz;
  int64_t koff, voff;
  key_offsets(it, pos, &koff, &voff);
  const char* kp = static_cast<const char*>(s.k) + koff * esz;
  const char* vp = static_cast<const char*>(s.v) + voff * esz;
  for (int64_t b = 0; b < bytes; b += 64) {
    __builtin_prefetch(kp + b);
    __builtin_prefetch(vp + b);
  }
}

// Keys prefetched ahead of the one being converted (two tiles), spread over the K loads so the
// requests interleave with compute.
constexpr int kPrefetchKeys = 2 * kKeyTile;

HWY_INLINE void prefetch_first(const AttnItem& it, int64_t kbeg, int64_t kend) {
  const int64_t n = std::min<int64_t>(kPrefetchKeys, kend - kbeg);
  for (int64_t k = 0; k < n; ++k) prefetch_key(it, kbeg + k);
}

// Converts keys (or values) [kt0, kt0 + nk) of the item's KV head into rows of dst (stride Dp).
// Also prefetches keys kPrefetchKeys ahead while they are below pf_end (0: none).
HWY_INLINE void load_tile(const AttnItem& it, bool value, int64_t kt0, int nk, float* dst,
                          int Dp, int64_t pf_end) {
  const KVSource& s = it.kv;
  const char* base = static_cast<const char*>(value ? s.v : s.k);
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  const float scale = value ? s.v_scale : s.k_scale;
  for (int k = 0; k < nk; ++k) {
    const int64_t pos = kt0 + k;
    int64_t koff, voff;
    key_offsets(it, pos, &koff, &voff);
    load_row(base + (value ? voff : koff) * esz, s.dtype, scale, dst + static_cast<size_t>(k) * Dp,
             it.head_size);
    if (pos + kPrefetchKeys < pf_end) prefetch_key(it, pos + kPrefetchKeys);
  }
}

// s[r * kKeyTile + k] = q_r . k_k for rows [0, rows) and keys [0, nk); Dp is a multiple of the
// vector length (zero padded).
HWY_INLINE void scores(const float* HWY_RESTRICT q, const float* HWY_RESTRICT kt, int rows, int nk,
                       int Dp, float* HWY_RESTRICT s) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* q0 = q + static_cast<size_t>(r) * Dp;
    const float* q1 = q0 + Dp;
    const float* q2 = q1 + Dp;
    const float* q3 = q2 + Dp;
    for (int k = 0; k < nk; ++k) {
      const float* kp = kt + static_cast<size_t>(k) * Dp;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      for (int i = 0; i < Dp; i += N) {
        const auto kv = hn::Load(d, kp + i);
        a0 = hn::MulAdd(hn::Load(d, q0 + i), kv, a0);
        a1 = hn::MulAdd(hn::Load(d, q1 + i), kv, a1);
        a2 = hn::MulAdd(hn::Load(d, q2 + i), kv, a2);
        a3 = hn::MulAdd(hn::Load(d, q3 + i), kv, a3);
      }
      s[(r + 0) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a0));
      s[(r + 1) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a1));
      s[(r + 2) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a2));
      s[(r + 3) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a3));
    }
  }
  for (; r < rows; ++r) {
    const float* q0 = q + static_cast<size_t>(r) * Dp;
    for (int k = 0; k < nk; ++k) {
      const float* kp = kt + static_cast<size_t>(k) * Dp;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d);
      int i = 0;
      for (; i + 2 * N <= Dp; i += 2 * N) {
        a0 = hn::MulAdd(hn::Load(d, q0 + i), hn::Load(d, kp + i), a0);
        a1 = hn::MulAdd(hn::Load(d, q0 + i + N), hn::Load(d, kp + i + N), a1);
      }
      if (i < Dp) a0 = hn::MulAdd(hn::Load(d, q0 + i), hn::Load(d, kp + i), a0);
      s[r * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
    }
  }
}

// acc_r += sum_k p[r][k] * v_k for rows [0, rows).
HWY_INLINE void accumulate(float* HWY_RESTRICT acc, const float* HWY_RESTRICT p,
                           const float* HWY_RESTRICT vt, int rows, int nk, int Dp) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* p0 = p + r * kKeyTile;
    for (int i = 0; i < Dp; i += N) {
      float* c0 = acc + static_cast<size_t>(r) * Dp + i;
      auto a0 = hn::Load(d, c0), a1 = hn::Load(d, c0 + Dp), a2 = hn::Load(d, c0 + 2 * Dp),
           a3 = hn::Load(d, c0 + 3 * Dp);
      for (int k = 0; k < nk; ++k) {
        const auto v = hn::Load(d, vt + static_cast<size_t>(k) * Dp + i);
        a0 = hn::MulAdd(hn::Set(d, p0[k]), v, a0);
        a1 = hn::MulAdd(hn::Set(d, p0[kKeyTile + k]), v, a1);
        a2 = hn::MulAdd(hn::Set(d, p0[2 * kKeyTile + k]), v, a2);
        a3 = hn::MulAdd(hn::Set(d, p0[3 * kKeyTile + k]), v, a3);
      }
      hn::Store(a0, d, c0);
      hn::Store(a1, d, c0 + Dp);
      hn::Store(a2, d, c0 + 2 * Dp);
      hn::Store(a3, d, c0 + 3 * Dp);
    }
  }
  for (; r < rows; ++r) {
    const float* p0 = p + r * kKeyTile;
    for (int i = 0; i < Dp; i += N) {
      float* c0 = acc + static_cast<size_t>(r) * Dp + i;
      auto a0 = hn::Load(d, c0);
      for (int k = 0; k < nk; ++k)
        a0 = hn::MulAdd(hn::Set(d, p0[k]), hn::Load(d, vt + static_cast<size_t>(k) * Dp + i), a0);
      hn::Store(a0, d, c0);
    }
  }
}

HWY_INLINE void scale_row(float* HWY_RESTRICT x, float f, int Dp) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  for (int i = 0; i < Dp; i += N) hn::Store(hn::Mul(hn::Load(d, x + i), vf), d, x + i);
}

// p = exp(s - m) in place for nk entries (the row is kKeyTile long, padded); returns the sum.
HWY_INLINE float exp_row(float* HWY_RESTRICT s, float m, int nk) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  int k = 0;
  for (; k + N <= nk; k += N) {
    const auto p = hn::Exp(d, hn::Sub(hn::LoadU(d, s + k), vm));
    hn::StoreU(p, d, s + k);
    sum = hn::Add(sum, p);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; k < nk; ++k) {
    const float p = s[k] == -std::numeric_limits<float>::infinity() ? 0.0f : expf(s[k] - m);
    s[k] = p;
    total += p;
  }
  return total;
}

// dst[0, n) = x[0, n) * f in the output dtype (float32, float16, bfloat16; bf16 and f16 rounded
// to nearest even as store_elem does).
HWY_INLINE void store_row(void* dst, pagedattn_dtype dt, const float* HWY_RESTRICT x, float f,
                          int n) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int i = 0;
  if (dt == PAGEDATTN_DTYPE_FLOAT32) {
    float* o = static_cast<float*>(dst);
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vf), d, o + i);
    for (; i < n; ++i) o[i] = x[i] * f;
  } else if (dt == PAGEDATTN_DTYPE_BFLOAT16) {
    const hn::Rebind<uint16_t, DF> du16;
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (; i + N <= n; i += N)
      hn::StoreU(hn::DemoteTo(du16, bf16_codes(hn::Mul(hn::LoadU(d, x + i), vf))), du16, o + i);
    for (; i < n; ++i) o[i] = f32_to_bf16(x[i] * f);
  } else {
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (; i < n; ++i) o[i] = f32_to_f16(x[i] * f);
  }
}

// ---- Row-vectorised path (rows >= vector length: prefill tiles, wide GQA groups) ----
// Vectors run over the item's rows: qT[d][r], s[k][r], accT[d][r]. Scores and P.V become
// register-blocked outer products (no horizontal sums) and the softmax, masks, ALiBi and soft cap
// are vectorised over rows.

// s[k][rv0*N ...] for keys [0, nk4) (a multiple of 4) and RB row vectors from rv0.
template <int RB>
HWY_INLINE void wide_scores(const float* HWY_RESTRICT qT, const float* HWY_RESTRICT kt, int D,
                            int Dp, int Rp, int rv0, int nk4, float* HWY_RESTRICT s) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int k0 = 0; k0 < nk4; k0 += 4) {
    hn::Vec<DF> a[4][RB];
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i)
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) a[i][j] = hn::Zero(d);
    const float* k0p = kt + static_cast<size_t>(k0) * Dp;
    for (int x = 0; x < D; ++x) {
      hn::Vec<DF> qv[RB];
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) qv[j] = hn::Load(d, qT + static_cast<size_t>(x) * Rp + (rv0 + j) * N);
      HWY_UNROLL(4)
      for (int i = 0; i < 4; ++i) {
        const auto kb = hn::Set(d, k0p[static_cast<size_t>(i) * Dp + x]);
        HWY_UNROLL(4)
        for (int j = 0; j < RB; ++j) a[i][j] = hn::MulAdd(qv[j], kb, a[i][j]);
      }
    }
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i)
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) hn::Store(a[i][j], d, s + static_cast<size_t>(k0 + i) * Rp + (rv0 + j) * N);
  }
}

// accT[d][rows] += sum_k vt[k][d] * p[k][rows] for 4 dims from x0 and RB row vectors from rv0.
template <int RB>
HWY_INLINE void wide_accumulate(float* HWY_RESTRICT accT, const float* HWY_RESTRICT p,
                                const float* HWY_RESTRICT vt, int D, int Dp, int Rp, int rv0,
                                int nk) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int x0 = 0; x0 < D; x0 += 4) {
    hn::Vec<DF> a[4][RB];
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i)
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) a[i][j] = hn::Load(d, accT + static_cast<size_t>(x0 + i) * Rp + (rv0 + j) * N);
    for (int k = 0; k < nk; ++k) {
      hn::Vec<DF> pv[RB];
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) pv[j] = hn::Load(d, p + static_cast<size_t>(k) * Rp + (rv0 + j) * N);
      const float* vk = vt + static_cast<size_t>(k) * Dp + x0;
      HWY_UNROLL(4)
      for (int i = 0; i < 4; ++i) {
        const auto vb = hn::Set(d, vk[i]);
        HWY_UNROLL(4)
        for (int j = 0; j < RB; ++j) a[i][j] = hn::MulAdd(pv[j], vb, a[i][j]);
      }
    }
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i)
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) hn::Store(a[i][j], d, accT + static_cast<size_t>(x0 + i) * Rp + (rv0 + j) * N);
  }
}

// First and last (inclusive) key token t of the item may see: causal rule and sliding window.
HWY_INLINE int64_t item_row_lo(const AttnItem& it, int t) {
  if (!it.causal || it.window <= 0) return 0;
  return std::max<int64_t>(0, static_cast<int64_t>(it.pos_offset) + it.tok0 + t - it.window + 1);
}
HWY_INLINE int64_t item_row_hi(const AttnItem& it, int t) {
  if (!it.causal) return it.num_keys - 1;
  return std::min<int64_t>(it.num_keys - 1, static_cast<int64_t>(it.pos_offset) + it.tok0 + t);
}

// Key range and masking data of the row-vectorised paths' rows [0, Rp): per row its visible keys
// [lo, hi], position and ALiBi slope, m = -inf, l = 0; padding rows see nothing.
struct WideRows {
  int64_t kbeg, kend;      // keys any row sees
  int32_t max_lo, min_hi;  // keys every row sees: [max_lo, min_hi]
};

HWY_INLINE WideRows wide_rows(const AttnItem& it, Scratch* sc, int Rp) {
  const int nh = it.h1 - it.h0;
  const int rows = nh * (it.tok1 - it.tok0);
  WideRows w{it.num_keys, 0, 0, std::numeric_limits<int32_t>::max()};
  for (int r = 0; r < Rp; ++r) {
    sc->m[r] = -std::numeric_limits<float>::infinity();
    sc->l[r] = 0.0f;
    if (r >= rows) {
      sc->lo[r] = std::numeric_limits<int32_t>::max();
      sc->hi[r] = -1;
      sc->posf[r] = sc->slope[r] = 0.0f;
      continue;
    }
    const int t = r / nh, g = r % nh;
    const int64_t lo = std::max(it.key0, item_row_lo(it, t));
    const int64_t hi = std::min(it.key1 - 1, item_row_hi(it, t));
    sc->lo[r] = static_cast<int32_t>(lo);
    sc->hi[r] = static_cast<int32_t>(hi);
    sc->posf[r] = static_cast<float>(static_cast<int64_t>(it.pos_offset) + it.tok0 + t);
    sc->slope[r] = it.alibi != nullptr ? it.alibi[it.h0 + g] : 0.0f;
    w.kbeg = std::min(w.kbeg, lo);
    w.kend = std::max(w.kend, hi + 1);
    w.max_lo = std::max(w.max_lo, sc->lo[r]);
    w.min_hi = std::min(w.min_hi, sc->hi[r]);
  }
  return w;
}

// Row-vectorised masking of one key tile for row vector o (N rows): scores times sfac, soft cap,
// ALiBi, causal/window visibility (-inf outside); returns the tile's max per row. full: every
// row sees every key of the tile and nothing is added (scale only).
HWY_INLINE hn::Vec<DF> wide_mask_max(const AttnItem& it, Scratch* sc, int64_t kt0, int nk, int Rp,
                                     size_t o, bool full, float sfac) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto vsfac = hn::Set(d, sfac);
  auto mt = ninf;
  if (full) {
    for (int k = 0; k < nk; ++k) {
      float* sp = sc->s + static_cast<size_t>(k) * Rp + o;
      auto x = hn::Load(d, sp);
      if (sfac != 1.0f) {
        x = hn::Mul(x, vsfac);
        hn::Store(x, d, sp);
      }
      mt = hn::Max(mt, x);
    }
    return mt;
  }
  const auto lo = hn::Load(di, sc->lo + o), hi = hn::Load(di, sc->hi + o);
  const auto posf = hn::Load(d, sc->posf + o), slope = hn::Load(d, sc->slope + o);
  const auto cap = hn::Set(d, it.soft_cap);
  const auto inv_cap = hn::Set(d, it.soft_cap > 0.0f ? 1.0f / it.soft_cap : 0.0f);
  for (int k = 0; k < nk; ++k) {
    float* sp = sc->s + static_cast<size_t>(k) * Rp + o;
    auto x = hn::Load(d, sp);
    if (sfac != 1.0f) x = hn::Mul(x, vsfac);
    if (it.soft_cap > 0.0f) x = hn::Mul(cap, hn::Tanh(d, hn::Mul(x, inv_cap)));
    if (it.alibi != nullptr)
      x = hn::MulAdd(slope, hn::Sub(hn::Set(d, static_cast<float>(kt0 + k)), posf), x);
    const auto kp = hn::Set(di, static_cast<int32_t>(kt0 + k));
    const auto vis = hn::RebindMask(d, hn::And(hn::Not(hn::Lt(kp, lo)), hn::Not(hn::Lt(hi, kp))));
    x = hn::IfThenElse(vis, x, ninf);
    hn::Store(x, d, sp);
    mt = hn::Max(mt, x);
  }
  return mt;
}

// The new running max of row vector o given the tile's max mt: stores m and alpha (the factor
// for the old accumulators) and returns the value to subtract before exp (0 for rows that have
// seen nothing yet, so exp gives 0 rather than NaN).
HWY_INLINE hn::Vec<DF> wide_new_max(Scratch* sc, size_t o, hn::Vec<DF> mt) {
  const DF d;
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto mold = hn::Load(d, sc->m + o);
  const auto mnew = hn::Max(mold, mt);
  const auto msafe = hn::IfThenElse(hn::Eq(mnew, ninf), hn::Zero(d), mnew);
  hn::Store(mnew, d, sc->m + o);
  hn::Store(hn::Exp(d, hn::Sub(mold, msafe)), d, sc->alpha + o);
  return msafe;
}

void AttentionItemWide(const AttnItem& it, Scratch* sc) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int D = it.head_size;
  const int Dp = (D + N - 1) / N * N;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  const int Rp = (rows + N - 1) / N * N;
  const int Rv = Rp / N;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  float* qT = sc->q;
  float* accT = sc->acc;

  // Per-row data; padding rows see nothing.
  const WideRows wr = wide_rows(it, sc, Rp);
  const int64_t kbeg = wr.kbeg, kend = wr.kend;
  const int32_t max_lo = wr.max_lo, min_hi = wr.min_hi;
  // qT (times the scale) and accT, zero padded.
  memset(qT, 0, sizeof(float) * static_cast<size_t>(D) * Rp);
  memset(accT, 0, sizeof(float) * static_cast<size_t>(D) * Rp);
  float row[kMaxHeadSize];
  for (int r = 0; r < rows; ++r) {
    const int t = r / nh, g = r % nh;
    const char* qp = item_q(it, t, g);
    load_row(qp, it.dtype, 1.0f, row, D);
    for (int x = 0; x < D; ++x) qT[static_cast<size_t>(x) * Rp + r] = row[x] * it.scale;
  }
  const bool plain = it.soft_cap <= 0.0f && it.alibi == nullptr;

  prefetch_first(it, kbeg, kend);
  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0));
    load_tile(it, false, kt0, nk, sc->kt, Dp, kend);
    const int nk4 = (nk + 3) / 4 * 4;
    for (int k = nk; k < nk4; ++k)  // finite filler for the 4-key blocking; never used
      for (int x = 0; x < D; ++x) sc->kt[static_cast<size_t>(k) * Dp + x] = 0.0f;
    int rv = 0;
    for (; rv + 4 <= Rv; rv += 4) wide_scores<4>(qT, sc->kt, D, Dp, Rp, rv, nk4, sc->s);
    switch (Rv - rv) {
      case 3: wide_scores<3>(qT, sc->kt, D, Dp, Rp, rv, nk4, sc->s); break;
      case 2: wide_scores<2>(qT, sc->kt, D, Dp, Rp, rv, nk4, sc->s); break;
      case 1: wide_scores<1>(qT, sc->kt, D, Dp, Rp, rv, nk4, sc->s); break;
      default: break;
    }
    // Masks, cap, ALiBi; online softmax per row vector.
    const bool full = plain && max_lo <= kt0 && kt0 + nk - 1 <= min_hi;
    for (int v = 0; v < Rv; ++v) {
      const size_t o = static_cast<size_t>(v) * N;
      const auto msafe = wide_new_max(sc, o, wide_mask_max(it, sc, kt0, nk, Rp, o, full, 1.0f));
      auto sum = hn::Zero(d);
      for (int k = 0; k < nk; ++k) {
        float* sp = sc->s + static_cast<size_t>(k) * Rp + o;
        const auto p = hn::Exp(d, hn::Sub(hn::Load(d, sp), msafe));
        hn::Store(p, d, sp);
        sum = hn::Add(sum, p);
      }
      hn::Store(hn::MulAdd(hn::Load(d, sc->l + o), hn::Load(d, sc->alpha + o), sum), d, sc->l + o);
    }
    // Rescale the accumulators by alpha (rows whose max moved).
    for (int x = 0; x < D; ++x) {
      float* ap = accT + static_cast<size_t>(x) * Rp;
      for (int v = 0; v < Rv; ++v)
        hn::Store(hn::Mul(hn::Load(d, ap + v * N), hn::Load(d, sc->alpha + v * N)), d, ap + v * N);
    }
    load_tile(it, true, kt0, nk, sc->vt, Dp, 0);
    rv = 0;
    for (; rv + 4 <= Rv; rv += 4) wide_accumulate<4>(accT, sc->s, sc->vt, D, Dp, Rp, rv, nk);
    switch (Rv - rv) {
      case 3: wide_accumulate<3>(accT, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
      case 2: wide_accumulate<2>(accT, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
      case 1: wide_accumulate<1>(accT, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
      default: break;
    }
  }

  for (int r = 0; r < rows; ++r) {
    const int t = r / nh, g = r % nh;
    for (int x = 0; x < D; ++x) row[x] = accT[static_cast<size_t>(x) * Rp + r];
    if (it.out == nullptr) {
      memcpy(it.part_acc + static_cast<size_t>(r) * D, row, sizeof(float) * static_cast<size_t>(D));
      it.part_m[r] = sc->m[r];
      it.part_l[r] = sc->l[r];
      continue;
    }
    const float l = sc->l[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    char* op = item_out(it, t, g);
    store_row(op, it.dtype, row, inv, D);
    if (it.lse != nullptr) {
      it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] =
          l > 0.0f ? sc->m[r] + logf(l) : kNegInf;
    }
  }
}

// Addresses of the K and V rows of keys [kt0, kt0 + nk), prefetching kPrefetchKeys ahead.
HWY_INLINE void key_ptrs(const AttnItem& it, int64_t kt0, int nk, const void** kp,
                         const void** vp, int64_t pf_end) {
  const KVSource& s = it.kv;
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  for (int k = 0; k < nk; ++k) {
    const int64_t pos = kt0 + k;
    int64_t koff, voff;
    key_offsets(it, pos, &koff, &voff);
    kp[k] = static_cast<const char*>(s.k) + koff * esz;
    vp[k] = static_cast<const char*>(s.v) + voff * esz;
    if (pos + kPrefetchKeys < pf_end) prefetch_key(it, pos + kPrefetchKeys);
  }
}

// bf16 decode reads K/V rows as full-width 32-bit words: the low halves are the even elements,
// the high halves the odd ones, so bf16 -> f32 is one shift or one mask, no widening shuffle. q
// and the accumulators hold each 2N-element chunk as [even elements, odd elements] (permute_pairs).

template <int DT>
HWY_INLINE void load_pair(const void* p, int i, hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
  const DF d;
  if constexpr (DT == kBF16Pairs) {
    const hn::RebindToUnsigned<DF> du;
    const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p) + i));
    lo = hn::BitCast(d, hn::ShiftLeft<16>(w));
    hi = hn::BitCast(d, hn::And(w, hn::Set(du, 0xFFFF0000u)));
#if PA_FP8_PAIRS
  } else if constexpr (is_fp8_pairs(DT)) {
    // 2N bytes widened at once, so the bit ops run once per 2N values (9 ops per 16 values
    // against 14 through load_vec), then the two halves go through f16 -> f32. In order.
    const hn::Repartition<int16_t, DF> d16;
    const hn::Half<decltype(d16)> d16h;
    const hn::Rebind<int8_t, decltype(d16)> d8;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto x = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const int8_t*>(p) + i));
    const auto h = fp8_f16_bits<base_dtype(DT)>(x);
    lo = hn::PromoteTo(d, hn::BitCast(dh, hn::LowerHalf(d16h, h)));
    hi = hn::PromoteTo(d, hn::BitCast(dh, hn::UpperHalf(d16h, h)));
#endif
  } else {
    lo = load_vec<DT>(p, i);
    hi = load_vec<DT>(p, i + static_cast<int>(hn::Lanes(d)));
  }
}

// Reorders each 2N-chunk of x (n floats, a multiple of 2N) between natural order and
// [even elements, odd elements] (to_pairs false: back).
HWY_INLINE void permute_pairs(float* x, int n, bool to_pairs) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  float tmp[2 * hn::MaxLanes(DF())];
  for (int c = 0; c < n; c += 2 * N) {
    for (int j = 0; j < N; ++j) {
      if (to_pairs) {
        tmp[j] = x[c + 2 * j];
        tmp[N + j] = x[c + 2 * j + 1];
      } else {
        tmp[2 * j] = x[c + j];
        tmp[2 * j + 1] = x[c + N + j];
      }
    }
    memcpy(x + c, tmp, sizeof(float) * 2 * static_cast<size_t>(N));
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Sixteen accumulators -> one vector: lane i = the sum of a[i]'s lanes. The two rounds within
// 128-bit blocks come first, on 16 and 8 vectors; the two across blocks last, on 4 and 2: 6
// cross-block shuffles, not 24. Zen 4 runs block-internal shuffles beside vdpbf16ps for free,
// cross-block ones only up to ~1 per 2 dot products (24 dots + 24 vshuff32x4: 36.5 cycles; + 24
// unpacks: 24). In cache bf16 decode 3-4% faster; fp8 (whose lookups share that pipe) unchanged.
HWY_INLINE __m512 reduce16(const __m512* a) {
  __m512 u[8], w[4];
  // u[i], each block: a[2i]'s lanes 0+2, a[2i+1]'s 0+2, a[2i]'s 1+3, a[2i+1]'s 1+3.
  for (int i = 0; i < 8; ++i)
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  // w[j], each block: the block sums of a[4j], a[4j + 1], a[4j + 2], a[4j + 3].
  for (int j = 0; j < 4; ++j)
    w[j] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x44),
                                   _mm512_shuffle_f32x4(w[0], w[1], 0xEE));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x44),
                                   _mm512_shuffle_f32x4(w[2], w[3], 0xEE));
  // Block j: w[j]'s four blocks summed.
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}
#endif

// Horizontal sums of R accumulators into out[j * kKeyTile]. For four rows, two interleave rounds
// leave [sum a0, sum a1, sum a2, sum a3] in every 128-bit block, then the blocks are added.
template <int R>
HWY_INLINE void reduce_rows(const hn::Vec<DF>* a, float* out) {
  const DF d;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (R == 4) {
    const hn::Repartition<uint64_t, DF> d64;
    const auto b0 = hn::Add(hn::InterleaveLower(d, a[0], a[1]), hn::InterleaveUpper(d, a[0], a[1]));
    const auto b1 = hn::Add(hn::InterleaveLower(d, a[2], a[3]), hn::InterleaveUpper(d, a[2], a[3]));
    const auto c = hn::Add(
        hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, b0), hn::BitCast(d64, b1))),
        hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, b0), hn::BitCast(d64, b1))));
    HWY_ALIGN float tmp[hn::MaxLanes(d)];
    hn::Store(c, d, tmp);
    const int N = static_cast<int>(hn::Lanes(d));
    for (int j = 0; j < 4; ++j) {
      float x = tmp[j];
      for (int b = 4; b < N; b += 4) x += tmp[b + j];
      out[j * kKeyTile] = x;
    }
    return;
  }
#endif
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) out[j * kKeyTile] = hn::GetLane(hn::SumOfLanes(d, a[j]));
}

// The next tile's memory, prefetched into L2 a few lines per compute step so the requests stream
// evenly behind the work, each span in address order: one span per key row (a multi-head item's
// row of an NHD cache is one contiguous run), or, where an item reads (nearly) all of each
// block, one span per block. The spans take turns, four lines each: two blocks streamed side by
// side read faster than one after the other (Zen 4, b16 x 4096 NHD decode 2-8% faster).
struct PfStream {
  const char* ptr[2 * kKeyTile];  // next line of each span (a tile's K and V rows at most)
  const char* end[2 * kKeyTile];
  int n = 0, k = 0, live = 0, quota = 0;  // live: spans not done; quota: turns per step()
  // Adds spans of row_bytes at rows[0, nrows).
  void rows(const void* const* r, int nrows, int64_t row_bytes) {
    for (int i = 0; i < nrows; ++i, ++n) {
      ptr[n] = static_cast<const char*>(r[i]);
      end[n] = ptr[n] + (row_bytes + 63) / 64 * 64;
    }
  }
  // Adds one span per block for keys [pos0, pos0 + nrows) (rows r of the item's first head):
  // from a block's first row to its last row's end, span_extra bytes past the last row's start.
  void blocks(const void* const* r, int nrows, int64_t pos0, int bs, int64_t slot_bytes,
              int64_t span_extra) {
    for (int i = 0; i < nrows;) {
      const int s0 = static_cast<int>((pos0 + i) & (bs - 1));
      const int cnt = std::min(bs - s0, nrows - i);
      ptr[n] = static_cast<const char*>(r[i]);
      end[n] = ptr[n] + ((cnt - 1) * slot_bytes + span_extra + 63) / 64 * 64;
      ++n;
      i += cnt;
    }
  }
  // Spreads the spans' lines left (part of them: the quota is set by that share) over `steps`
  // calls of step(). Planning again moves the rest to the next phase's steps.
  void plan(int64_t steps, int64_t part = 1, int64_t of = 1) {
    k = 0;
    live = 0;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      total += (end[i] - ptr[i]) / 64;
      live += ptr[i] != end[i];
    }
    total = total * part / of;
    const int64_t per = steps > 0 ? (total + steps - 1) / steps : total;
    quota = static_cast<int>((per + 3) / 4);
  }
  // A second stream taking its turns with this one: lines asked for again (TileSpans, twice).
  PfStream* again = nullptr;
  HWY_INLINE void step() {
    if (again != nullptr) again->turn();
    turn();
  }
  // Four lines per turn: the per-line loop cost 17% of an in-cache decode (Zen 4, one thread).
  // A span's last turn may issue fewer. Span lengths are whole lines, so ptr meets end exactly.
  HWY_INLINE void turn() {
    for (int m = quota; m > 0 && live > 0; --m) {
      while (ptr[k] == end[k]) k = k + 1 == n ? 0 : k + 1;
      // prefetcht2 (locality 1): on Zen 4 decode ran 6-9% faster than with prefetcht1 (bf16
      // cache, 1 and 2 threads, NHD and HND; fp8 unchanged). Every line: prefetching only a
      // page's first line and leaving the rest to the hardware doubled the time.
      const char* p = ptr[k];
      const char* e = end[k];
      if (e - p >= 256) {
        __builtin_prefetch(p, 0, 1);
        __builtin_prefetch(p + 64, 0, 1);
        __builtin_prefetch(p + 128, 0, 1);
        __builtin_prefetch(p + 192, 0, 1);
        p += 256;
      } else {
        for (; p < e; p += 64) __builtin_prefetch(p, 0, 1);
      }
      ptr[k] = p;
      if (p == e) --live;
      k = k + 1 == n ? 0 : k + 1;
    }
  }
  void flush() {  // this stream's lines left; again takes one more turn, as in the version timed
    quota = 1 << 30;
    step();
  }
};

// Row p of a tile as T elements, off bytes on (a later head's part of an NHD slot row).
template <class T>
HWY_INLINE const T* row_at(const void* p, int64_t off) {
  return reinterpret_cast<const T*>(static_cast<const char*>(p) + off);
}

// Scores of R rows (q at stride D) against KB keys from k, converting K in registers; each q
// load serves KB keys. Key rows are read at kp[k + b] + off bytes (off: the head's offset in a
// slot row, for items of several KV heads).
template <int DT, int R, int KB>
HWY_INLINE void score_keys(const float* HWY_RESTRICT q, int D, const void* const* kp, int k,
                           float* HWY_RESTRICT s, int64_t off) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> a[KB][R];
  HWY_UNROLL(4)
  for (int b = 0; b < KB; ++b) {
    HWY_UNROLL(4)
    for (int j = 0; j < R; ++j) a[b][j] = hn::Zero(d);
  }
  if constexpr (is_pairs(DT)) {
    for (int i = 0; i < D; i += 2 * N) {
      hn::Vec<DF> q0[R], q1[R];
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) {
        q0[j] = hn::Load(d, q + j * D + i);
        q1[j] = hn::Load(d, q + j * D + i + N);
      }
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        hn::Vec<DF> k0, k1;
        load_pair<DT>(row_at<char>(kp[k + b], off), i, k0, k1);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[b][j] = hn::MulAdd(q1[j], k1, hn::MulAdd(q0[j], k0, a[b][j]));
      }
    }
  } else if constexpr (is_fp8_quads(DT)) {
#if PA_FP8_QUADS
    // q is read straight from L1 as the FMAs' memory operand: 4 x R accumulators, four converted
    // K vectors and the lookup tables fill the 32 registers.
    for (int i = 0; i < D; i += 4 * N) {
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        hn::Vec<DF> kv[4];
        load_fp8_quad<base_dtype(DT)>(row_at<char>(kp[k + b], off), i, kv);
        HWY_UNROLL(4)
        for (int c = 0; c < 4; ++c) {
          HWY_UNROLL(4)
          for (int j = 0; j < R; ++j)
            a[b][j] = hn::MulAdd(hn::Load(d, q + j * D + i + c * N), kv[c], a[b][j]);
        }
      }
    }
#endif
  } else {
    for (int i = 0; i < D; i += N) {
      hn::Vec<DF> qv[R];
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) qv[j] = hn::Load(d, q + j * D + i);
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        const auto kv = load_vec<DT>(row_at<char>(kp[k + b], off), i);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[b][j] = hn::MulAdd(qv[j], kv, a[b][j]);
      }
    }
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (R == 4 && KB == 4) {
    // All 16 sums in one reduction: lane 4j + b is row j's score of key k + b.
    __m512 v[16];
    HWY_UNROLL(4)
    for (int b = 0; b < 4; ++b) {
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j) v[4 * j + b] = a[b][j].raw;
    }
    alignas(64) float t[16];
    _mm512_store_ps(t, reduce16(v));
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) memcpy(s + j * kKeyTile + k, t + 4 * j, sizeof(float) * 4);
    return;
  }
#endif
  HWY_UNROLL(4)
  for (int b = 0; b < KB; ++b) reduce_rows<R>(a[b], s + k + b);
}

// Registers: KB x R accumulators + R q + one k; 4 x 4 fits AVX-512's 32, 2 x 4 AVX2's 16.
constexpr int kScoreKeys = hn::MaxLanes(DF()) >= 16 ? 4 : 2;
// 32 vector registers (AVX-512) hold 4 rows x 4 chunks plus p and v; 16 only half of that.
constexpr int kAccChunks = hn::MaxLanes(DF()) >= 16 ? 4 : 2;

// Scores of R rows against keys [0, nk) of kp; pf->step() after each score_keys.
template <int DT, int R>
HWY_INLINE void score_group(const float* HWY_RESTRICT q, int D, const void* const* kp, int nk,
                            float* HWY_RESTRICT s, PfStream* pf, int64_t off) {
  constexpr int KB = kScoreKeys;
  int k = 0;
  for (; k + KB <= nk; k += KB) {
    score_keys<DT, R, KB>(q, D, kp, k, s, off);
    pf->step();
  }
  for (; k < nk; ++k) {
    score_keys<DT, R, 1>(q, D, kp, k, s, off);
    pf->step();
  }
}

// acc rows (stride D) += sum_k p[j][k] * v_k for R rows, converting V in registers (rows read at
// vp[k] + off bytes). Keys outer, CH vectors of every row held in registers, so each p is
// broadcast once per CH chunks; pf->step() once per key.
template <int DT, int R, int CH>
HWY_INLINE void acc_chunks(float* HWY_RESTRICT acc, int D, int i0, const float* HWY_RESTRICT p,
                           const void* const* vp, int nk, PfStream* pf, int64_t off) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> a[R][CH];
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) {
    HWY_UNROLL(4)
    for (int c = 0; c < CH; ++c) a[j][c] = hn::Load(d, acc + j * D + i0 + c * N);
  }
  for (int k = 0; k < nk; ++k) {
    pf->step();
    hn::Vec<DF> pj[R];
    HWY_UNROLL(4)
    for (int j = 0; j < R; ++j) pj[j] = hn::Set(d, p[j * kKeyTile + k]);
    if constexpr (is_pairs(DT)) {
      static_assert(CH % 2 == 0, "pairs come two chunks at a time");
      HWY_UNROLL(4)
      for (int c = 0; c < CH; c += 2) {
        hn::Vec<DF> v0, v1;
        load_pair<DT>(row_at<char>(vp[k], off), i0 + c * N, v0, v1);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) {
          a[j][c] = hn::MulAdd(pj[j], v0, a[j][c]);
          a[j][c + 1] = hn::MulAdd(pj[j], v1, a[j][c + 1]);
        }
      }
    } else if constexpr (is_fp8_quads(DT)) {
#if PA_FP8_QUADS
      static_assert(CH == 4, "fp8 quads come four chunks at a time");
      hn::Vec<DF> v[4];
      load_fp8_quad<base_dtype(DT)>(row_at<char>(vp[k], off), i0, v);
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) {
        HWY_UNROLL(4)
        for (int c = 0; c < 4; ++c) a[j][c] = hn::MulAdd(pj[j], v[c], a[j][c]);
      }
#endif
    } else {
      HWY_UNROLL(4)
      for (int c = 0; c < CH; ++c) {
        const auto v = load_vec<DT>(row_at<char>(vp[k], off), i0 + c * N);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[j][c] = hn::MulAdd(pj[j], v, a[j][c]);
      }
    }
  }
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) {
    HWY_UNROLL(4)
    for (int c = 0; c < CH; ++c) hn::Store(a[j][c], d, acc + j * D + i0 + c * N);
  }
}

template <int DT, int R>
HWY_INLINE void acc_group(float* HWY_RESTRICT acc, int D, const float* HWY_RESTRICT p,
                          const void* const* vp, int nk, PfStream* pf, int64_t off) {
  constexpr int CH = kAccChunks;
  const int N = static_cast<int>(hn::Lanes(DF()));
  int i0 = 0;
  for (; i0 + CH * N <= D; i0 += CH * N)
    acc_chunks<DT, R, CH>(acc, D, i0, p, vp, nk, pf, off);
  if constexpr (is_pairs(DT)) {
    for (; i0 < D; i0 += 2 * N)
      acc_chunks<DT, R, 2>(acc, D, i0, p, vp, nk, pf, off);
  } else if constexpr (is_fp8_quads(DT)) {
    // D is a multiple of 4N here: the loop above did every chunk.
  } else {
    for (; i0 < D; i0 += N) acc_chunks<DT, R, 1>(acc, D, i0, p, vp, nk, pf, off);
  }
}

// pf->step() calls of scores_fast (score) or accumulate_fast (P.V) over `rows` rows and nk
// keys: the loops above, counted.
template <int DT>
HWY_INLINE int64_t in_calls(bool score, int rows, int D, int nk) {
  const int groups = (rows + 3) / 4;
  if (score) return static_cast<int64_t>(groups) * (nk / kScoreKeys + nk % kScoreKeys);
  const int N = static_cast<int>(hn::Lanes(DF()));
  const int whole = D / (kAccChunks * N), rest = D % (kAccChunks * N);
  const int passes = whole + (is_pairs(DT) ? rest / (2 * N) : (is_fp8_quads(DT) ? 0 : rest / N));
  return static_cast<int64_t>(groups) * passes * nk;
}

template <int DT>
HWY_INLINE void scores_fast(const float* q, int rows, int D, const void* const* kp, int nk,
                            float* s, PfStream* pf, int64_t off) {
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    score_group<DT, 4>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off);
  switch (rows - r) {
    case 3: score_group<DT, 3>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    case 2: score_group<DT, 2>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    case 1: score_group<DT, 1>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    default: break;
  }
}

template <int DT>
HWY_INLINE void accumulate_fast(float* acc, int rows, int D, const float* p,
                                const void* const* vp, int nk, PfStream* pf, int64_t off) {
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    acc_group<DT, 4>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off);
  switch (rows - r) {
    case 3: acc_group<DT, 3>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    case 2: acc_group<DT, 2>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    case 1: acc_group<DT, 1>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    default: break;
  }
}

// Rounds p[0, n) (finite, >= 0; n a multiple of N) to bf16 values, to nearest even, in place;
// returns their sum.
HWY_INLINE float round_bf16_sum(float* HWY_RESTRICT p, int n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const int N = static_cast<int>(hn::Lanes(d));
  auto sum = hn::Zero(d);
  for (int k = 0; k < n; k += N) {
    const auto u = hn::BitCast(du, hn::Load(d, p + k));
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto r = hn::BitCast(d, hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), odd)),
                                          hn::Set(du, 0xFFFF0000u)));
    hn::Store(r, d, p + k);
    sum = hn::Add(sum, r);
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// Row r's running max becomes max(m[r], mt); when it grows, the row's sum and its Dp accumulators
// are rescaled to it (alpha 0 for a row that had seen nothing). Returns the new max.
HWY_INLINE float raise_max(Scratch* sc, int r, float mt, int Dp) {
  const float mold = sc->m[r];
  const float mnew = std::max(mold, mt);
  if (mold != mnew) {
    const float alpha = mold == -std::numeric_limits<float>::infinity() ? 0.0f : expf(mold - mnew);
    sc->l[r] *= alpha;
    scale_row(sc->acc + static_cast<size_t>(r) * Dp, alpha, Dp);
    sc->m[r] = mnew;
  }
  return mnew;
}

// Online softmax over one key tile of the dot-product paths: rows r = t * nh + g hold raw scores
// s[r][0, nk) (times sfac), which become masked, capped, biased, exponentiated weights; m and l
// are updated and the accumulator rows (Dp floats) rescaled when a row's maximum grows. Entries
// nk..kKeyTile are -inf. bf16_weights: the weights are rounded to bf16 values and l sums the
// rounded ones, so P.V in bf16 divides by exactly the weights it used. Returns false when no row
// sees any key of the tile.
HWY_INLINE bool softmax_tile(const AttnItem& it, Scratch* sc, int64_t kt0, int nk, bool plain,
                             int Dp, float sfac, bool bf16_weights = false) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  bool any = false;
  for (int t = 0; t < ntok; ++t) {
    const int64_t lo = item_row_lo(it, t), hi = item_row_hi(it, t);
    const int64_t pos = static_cast<int64_t>(it.pos_offset) + it.tok0 + t;
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      float* s = sc->s + r * kKeyTile;
      if (sfac != 1.0f) scale_row(s, sfac, kKeyTile);
      const float slope = it.alibi != nullptr ? it.alibi[it.h0 + g] : 0.0f;
      float mt = kNegInf;
      if (plain && lo <= kt0 && kt0 + nk - 1 <= hi) {  // whole tile visible, nothing to add
        int k = 0;
        if (nk == kKeyTile) {
          const DF d;
          const int N = static_cast<int>(hn::Lanes(d));
          auto vmax = hn::Load(d, s);
          for (k = N; k < kKeyTile; k += N) vmax = hn::Max(vmax, hn::Load(d, s + k));
          mt = hn::GetLane(hn::MaxOfLanes(d, vmax));
        }
        for (; k < nk; ++k) mt = std::max(mt, s[k]);
      } else {
        for (int k = 0; k < nk; ++k) {
          const int64_t kp = kt0 + k;
          float x = s[k];
          if (kp < lo || kp > hi) {
            x = kNegInf;
          } else {
            if (it.soft_cap > 0.0f) x = it.soft_cap * tanhf(x / it.soft_cap);
            if (it.alibi != nullptr) x += slope * static_cast<float>(kp - pos);
          }
          s[k] = x;
          mt = std::max(mt, x);
        }
      }
      for (int k = nk; k < kKeyTile; ++k) s[k] = kNegInf;
      if (mt == kNegInf) {  // nothing visible in this tile for this row: weights 0
        for (int k = 0; k < (bf16_weights ? kKeyTile : nk); ++k) s[k] = 0.0f;
        continue;
      }
      any = true;
      const float mnew = raise_max(sc, r, mt, Dp);
      const float tile_sum = exp_row(s, mnew, nk);
      if (bf16_weights) {
        for (int k = nk; k < kKeyTile; ++k) s[k] = 0.0f;
        sc->l[r] += round_bf16_sum(s, kKeyTile);
      } else {
        sc->l[r] += tile_sum;
      }
    }
  }
  return any;
}

// The output pass of the dot-product paths: each row's normalised output (and lse), or its
// partial state for a later merge. Accumulator rows have stride Dp, natural dim order.
HWY_INLINE void write_rows(const AttnItem& it, const float* acc, const float* m, const float* l_,
                           int Dp) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      const float* a = acc + static_cast<size_t>(r) * Dp;
      if (it.out == nullptr) {
        memcpy(it.part_acc + static_cast<size_t>(r) * D, a, sizeof(float) * static_cast<size_t>(D));
        it.part_m[r] = m[r];
        it.part_l[r] = l_[r];
        continue;
      }
      const float l = l_[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      char* op = item_out(it, t, g);
      store_row(op, it.dtype, a, inv, D);
      if (it.lse != nullptr) {
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] =
            l > 0.0f ? m[r] + logf(l) : kNegInf;
      }
    }
  }
}

// The PfStream spans of a tile for an item of kvn KV heads (decode paths): per key, its rows of
// all the item's heads (one contiguous run when kvn > 1 on an NHD cache); or, where a block's
// span of the item's heads is nearly all data the item reads (all heads of any layout, one head
// of HND), whole blocks.
struct TileSpans {
  int64_t row_bytes, head_bytes, slot_bytes, span_extra;
  int bs;
  bool blocks;
  bool twice;  // the backend's plan (Target::prefetch_twice)
  TileSpans(const AttnItem& it, int kvn, bool twice_) : twice(twice_) {
    const int64_t esz = static_cast<int64_t>(elem_size(it.kv.dtype));
    const int D = it.head_size;
    row_bytes = (it.kv.head_stride == D ? kvn : 1) * D * esz;
    head_bytes = it.kv.head_stride * esz;
    slot_bytes = it.kv.slot_stride * esz;
    span_extra = (kvn - 1) * head_bytes + D * esz;
    bs = it.kv.table != nullptr ? it.kv.block_size : 1;
    blocks = it.kv.table != nullptr &&
             4 * ((bs - 1) * slot_bytes + span_extra) <= 5 * static_cast<int64_t>(bs) * kvn * D * esz;
  }
  // The spans of keys [pos0, pos0 + n), whose first head's rows are at r[0, n).
  void add(PfStream* pf, const void* const* r, int n, int64_t pos0) const {
    if (blocks)
      pf->blocks(r, n, pos0, bs, slot_bytes, span_extra);
    else
      pf->rows(r, n, row_bytes);
  }
  // Sets up pf for a tile's scores, which step() it `steps` times: the next tile's lines, K
  // rows nk_rows and V rows nv_rows of keys [next_pos, next_pos + next_n); and (twice) this
  // tile's V rows v_rows of keys [pos, pos + n) again, through `again`.
  // - twice (all CPUs but Intel's): each tile's lines are asked for twice, half a tile apart.
  //   During the scores the next tile's K streams in and this tile's V is asked for again;
  //   during P.V the next tile's V streams in and its K is asked for again. Zen 4 has been
  //   reported to drop some prefetcht1/t2 requests; whatever the cause there, the second request
  //   made the b16 x 4096 decode 3-19% faster (bf16 and fp8, NHD and HND, 1 and 2 threads, 8
  //   alternating rounds; 5-13% on the AVX3_DL and AVX2 kernels), and the fp8 decode's P.V loads
  //   went from ~20% of its samples to ~4-8%.
  // - Intel: once, K and V of the next tile together, their blocks in turn (four streams side by
  //   side, not two), half of the lines during the scores and the rest during P.V. On a Xeon
  //   with AMX the second request cost 2-5%, and the four streams made the decode 5-10% faster
  //   (b16 x 4096, bf16 and fp8, NHD and HND, 1 and 2 threads); a read-only probe with the decode's arithmetic
  //   read 95% of the stream rate that way against 88% with two (pagedattn-read-patterns).
  void before_scores(PfStream* pf, PfStream* again, const void* const* nk_rows,
                     const void* const* nv_rows, int next_n, int64_t next_pos,
                     const void* const* v_rows, int n, int64_t pos, int64_t steps) const {
    pf->n = 0;
    add(pf, nk_rows, next_n, next_pos);
    if (!twice) {
      add(pf, nv_rows, next_n, next_pos);
      pf->plan(steps, 1, 2);
      return;
    }
    pf->plan(steps);
    again->n = 0;
    add(again, v_rows, n, pos);
    again->plan(steps);
    pf->again = again;
  }
  // Sets up pf for the tile's P.V (after before_scores), which step()s it `steps` times.
  void before_pv(PfStream* pf, PfStream* again, const void* const* nk_rows,
                 const void* const* nv_rows, int next_n, int64_t next_pos, int64_t steps) const {
    if (!twice) {
      pf->plan(steps);
      return;
    }
    pf->flush();
    pf->n = 0;
    add(pf, nv_rows, next_n, next_pos);
    pf->plan(steps);
    again->n = 0;
    add(again, nk_rows, next_n, next_pos);
    again->plan(steps);
    pf->again = again;
  }
  // Prefetches the first tile (K rows kr, V rows vr of keys [pos0, pos0 + n)) at once.
  void first(const void* const* kr, const void* const* vr, int n, int64_t pos0) const {
    PfStream pf;
    for (const void* const* r : {kr, vr}) {
      pf.n = 0;
      add(&pf, r, n, pos0);
      pf.plan(1);
      pf.flush();
    }
  }
};

// ---- Dot-product path (fewer rows than a vector: decode with small GQA groups) ----
// Rows are (token, head) pairs; each score is a dot product over D, four rows per K load.
// DT >= 0: the cache dtype, converted in registers (needs D % N == 0); DT < 0: any dtype and head
// size, through the converted K/V tiles. Items of several KV heads (kv_heads > 1, DT >= 0 only,
// one token: multi-head decode) run tile by tile over all their heads, G = rows / kv_heads rows
// each, so they read whole slot rows (NHD) or whole blocks, streamed in by a PfStream.
template <int DT>
void AttentionItemDot(const AttnItem& it, Scratch* sc) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int D = it.head_size;
  const int Dp = (D + N - 1) / N * N;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  const float kNegInf = -std::numeric_limits<float>::infinity();

  // Rows are (token t, head g) at r = t * nh + g. Load q (times the scale), zero accumulators.
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      const char* qp = item_q(it, t, g);
      float* qr = sc->q + static_cast<size_t>(r) * Dp;
      load_row(qp, it.dtype, 1.0f, qr, D);
      for (int i = D; i < Dp; ++i) qr[i] = 0.0f;
      // The in-register path loads fp8 keys unscaled: fold their factor into q.
      scale_row(qr, DT >= 0 ? it.scale * fp8_factor(it.kv.dtype, it.kv.k_scale) : it.scale, Dp);
      if constexpr (DT == kBF16Pairs) permute_pairs(qr, D, true);
      memset(sc->acc + static_cast<size_t>(r) * Dp, 0, sizeof(float) * static_cast<size_t>(Dp));
      sc->m[r] = kNegInf;
      sc->l[r] = 0.0f;
    }
  }
  // Zero the padding of the K/V tiles once; load_row only writes the first D columns.
  if (Dp != D) {
    for (int k = 0; k < kKeyTile; ++k) {
      for (int i = D; i < Dp; ++i) sc->kt[k * Dp + i] = sc->vt[k * Dp + i] = 0.0f;
    }
  }

  const int64_t kbeg = std::max(it.key0, item_row_lo(it, 0));
  const int64_t kend = std::min(it.key1, item_row_hi(it, ntok - 1) + 1);
  const bool plain = it.soft_cap <= 0.0f && it.alibi == nullptr;
  // This tile's and the next tile's row addresses (the next one is prefetched during scores).
  const void* ptrs[2][2][kKeyTile];
  int cur = 0;
  const void** kptr = ptrs[0][0];
  const void** vptr = ptrs[0][1];
  const int kvn = DT >= 0 && it.kv_heads > 1 ? it.kv_heads : 1;
  const int G = rows / kvn;
  const TileSpans spans(it, kvn, sc->prefetch_twice);

  if (DT < 0) prefetch_first(it, kbeg, kend);
  if (DT >= 0 && kbeg < kend) {
    const int n0 = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kbeg));
    key_ptrs(it, kbeg, n0, ptrs[0][0], ptrs[0][1], 0);
    spans.first(ptrs[0][0], ptrs[0][1], n0, kbeg);
  }
  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0));
    // The next tile streams in during this one (TileSpans::before_scores).
    PfStream pf, pf2;
    if constexpr (DT >= 0) {
      kptr = ptrs[cur][0];
      vptr = ptrs[cur][1];
      int next_n = 0;
      if (kt0 + kKeyTile < kend) {
        next_n = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0 - kKeyTile));
        key_ptrs(it, kt0 + kKeyTile, next_n, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], 0);
      }
      spans.before_scores(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                          vptr, nk, kt0, kvn * in_calls<DT>(true, G, D, nk));
      for (int h = 0; h < kvn; ++h)
        scores_fast<DT>(sc->q + static_cast<size_t>(h) * G * Dp, G, D, kptr, nk,
                        sc->s + h * G * kKeyTile, &pf, h * spans.head_bytes);
      spans.before_pv(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                      kvn * in_calls<DT>(false, G, D, nk));
      cur ^= 1;
    } else {
      load_tile(it, false, kt0, nk, sc->kt, Dp, kend);
      scores(sc->q, sc->kt, rows, nk, Dp, sc->s);
    }
    if (!softmax_tile(it, sc, kt0, nk, plain, Dp, 1.0f)) {
      pf.flush();
      continue;
    }
    if constexpr (DT >= 0) {
      for (int h = 0; h < kvn; ++h)
        accumulate_fast<DT>(sc->acc + static_cast<size_t>(h) * G * Dp, G, D,
                            sc->s + h * G * kKeyTile, vptr, nk, &pf, h * spans.head_bytes);
      pf.flush();
    } else {
      load_tile(it, true, kt0, nk, sc->vt, Dp, 0);
      accumulate(sc->acc, sc->s, sc->vt, rows, nk, Dp);
    }
  }

  // The in-register path accumulated unscaled fp8 values: apply their factor once.
  if constexpr (DT >= 0) {
    const float vf = fp8_factor(it.kv.dtype, it.kv.v_scale);
    if (vf != 1.0f) {
      for (int r = 0; r < rows; ++r) scale_row(sc->acc + static_cast<size_t>(r) * Dp, vf, Dp);
    }
  }
  if constexpr (DT == kBF16Pairs) {
    for (int r = 0; r < rows; ++r) permute_pairs(sc->acc + static_cast<size_t>(r) * Dp, D, false);
  }

  write_rows(it, sc->acc, sc->m, sc->l, Dp);
}

// ---- bf16 dot-product decode (AVX3_DL CPUs with AVX512_BF16: Zen 4, Sapphire Rapids) ----
// vdpbf16ps multiplies bf16 pairs into float32 accumulators: 32 products per instruction against
// 16 for an FMA, and bf16 K/V need no conversion. Scores: q is rounded to bf16 (exact for a bf16
// model; fp8 caches only otherwise: its error is far below fp8's), dot products over pairs of
// dims, the scale applied to the scores. P.V: the weights are rounded to bf16 (as flash-attention
// kernels do) and paired over two keys, so each instruction adds two keys' V rows. fp8 K/V become
// bf16 through two VBMI byte lookups (exact: every fp8 value is a bf16 value). Accumulators keep
// the dims in the order the unpacks leave them; the output pass puts them back.
#undef PA_DP
#undef PA_DP_ATTR
#if HWY_TARGET == HWY_AVX3_DL
#define PA_DP 1
#define PA_DP_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// bf16 bits of the fp8 magnitude m7 (7 bits), exact; the sign is added separately.
constexpr uint16_t fp8_bf16_mag(bool e4m3, int m7) {
  const int mbits = e4m3 ? 3 : 2;
  const int e = m7 >> mbits, m = m7 & ((1 << mbits) - 1);
  if (e4m3 && m7 == 0x7F) return 0x7FC0;                                     // e4m3fn's NaN
  if (!e4m3 && e == 31) return static_cast<uint16_t>(0x7F80 | (m << 5));     // inf, NaN
  const int bias = e4m3 ? 7 : 15;
  if (e > 0) return static_cast<uint16_t>(((e - bias + 127) << 7) | (m << (7 - mbits)));
  if (m == 0) return 0;
  const int lead = m >= 4 ? 2 : (m >= 2 ? 1 : 0);  // subnormal: m * 2^(1 - bias - mbits)
  return static_cast<uint16_t>(((lead + 1 - bias - mbits + 127) << 7) |
                               ((m - (1 << lead)) << (7 - lead)));
}

struct Bf16Tables {
  alignas(64) uint8_t lo[128];  // low byte of the magnitude's bf16 bits
  alignas(64) uint8_t hi[128];  // high byte
};

constexpr Bf16Tables make_bf16_tables(bool e4m3) {
  Bf16Tables t{};
  for (int m7 = 0; m7 < 128; ++m7) {
    t.lo[m7] = static_cast<uint8_t>(fp8_bf16_mag(e4m3, m7) & 0xFF);
    t.hi[m7] = static_cast<uint8_t>(fp8_bf16_mag(e4m3, m7) >> 8);
  }
  return t;
}

constexpr Bf16Tables kE4M3Bf16 = make_bf16_tables(true);
constexpr Bf16Tables kE5M2Bf16 = make_bf16_tables(false);

// The lookup tables in registers.
struct Fp8Lut {
  __m512i lo0, lo1, hi0, hi1, sign;
};

template <int DT>
PA_DP_ATTR HWY_INLINE Fp8Lut fp8_lut() {
  const Bf16Tables& t = DT == PAGEDATTN_DTYPE_FP8_E4M3 ? kE4M3Bf16 : kE5M2Bf16;
  return Fp8Lut{_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64), _mm512_load_si512(t.hi),
                _mm512_load_si512(t.hi + 64), _mm512_set1_epi8(static_cast<char>(0x80))};
}

// 64 fp8 bytes x as bf16: w0 word 8b + t is byte 16b + t, w1 word 8b + t byte 16b + 8 + t
// (b the 128-bit block, t < 8).
PA_DP_ATTR HWY_INLINE void fp8_bf16(const Fp8Lut& L, __m512i x, __m512i& w0, __m512i& w1) {
  const __m512i lo = _mm512_permutex2var_epi8(L.lo0, x, L.lo1);  // index bit 7 ignored
  __m512i hi = _mm512_permutex2var_epi8(L.hi0, x, L.hi1);
  hi = _mm512_ternarylogic_epi32(hi, x, L.sign, 0xF8);  // hi | (x & 0x80)
  w0 = _mm512_unpacklo_epi8(lo, hi);
  w1 = _mm512_unpackhi_epi8(lo, hi);
}

constexpr bool dp_fp8(int DT) { return DT != PAGEDATTN_DTYPE_BFLOAT16; }

// Dims per group of the P.V accumulators (bf16: 64, or 32 for a last half group; fp8: 64) and the
// natural dim of accumulator position x of a group (x = 16v + 4b + t: vector v, block b, lane t).
template <int DT>
HWY_INLINE int dp_dim(int x) {
  const int v = x >> 4, b = (x >> 2) & 3, t = x & 3;
  if constexpr (dp_fp8(DT)) return 16 * b + 4 * v + t;
  return 32 * (v >> 1) + 8 * b + 4 * (v & 1) + t;
}

// A row of D accumulators from accumulator order back to natural dim order, times f (dp_dim as
// 128-bit block shuffles).
template <int DT>
PA_DP_ATTR HWY_INLINE void dp_unpermute(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst,
                                        int D, float f) {
  const __m512 vf = _mm512_set1_ps(f);
  if constexpr (dp_fp8(DT)) {
    for (int x = 0; x < D; x += 64) {
      const __m512 v0 = _mm512_loadu_ps(src + x), v1 = _mm512_loadu_ps(src + x + 16);
      const __m512 v2 = _mm512_loadu_ps(src + x + 32), v3 = _mm512_loadu_ps(src + x + 48);
      const __m512 lo01 = _mm512_shuffle_f32x4(v0, v1, 0x44), lo23 = _mm512_shuffle_f32x4(v2, v3, 0x44);
      const __m512 hi01 = _mm512_shuffle_f32x4(v0, v1, 0xEE), hi23 = _mm512_shuffle_f32x4(v2, v3, 0xEE);
      _mm512_storeu_ps(dst + x, _mm512_mul_ps(_mm512_shuffle_f32x4(lo01, lo23, 0x88), vf));
      _mm512_storeu_ps(dst + x + 16, _mm512_mul_ps(_mm512_shuffle_f32x4(lo01, lo23, 0xDD), vf));
      _mm512_storeu_ps(dst + x + 32, _mm512_mul_ps(_mm512_shuffle_f32x4(hi01, hi23, 0x88), vf));
      _mm512_storeu_ps(dst + x + 48, _mm512_mul_ps(_mm512_shuffle_f32x4(hi01, hi23, 0xDD), vf));
    }
  } else {
    for (int x = 0; x < D; x += 32) {
      const __m512 v0 = _mm512_loadu_ps(src + x), v1 = _mm512_loadu_ps(src + x + 16);
      const __m512 lo = _mm512_shuffle_f32x4(v0, v1, 0x44), hi = _mm512_shuffle_f32x4(v0, v1, 0xEE);
      _mm512_storeu_ps(dst + x, _mm512_mul_ps(_mm512_shuffle_f32x4(lo, lo, 0xD8), vf));
      _mm512_storeu_ps(dst + x + 16, _mm512_mul_ps(_mm512_shuffle_f32x4(hi, hi, 0xD8), vf));
    }
  }
}

// The natural dim of q16 position x as the fp8 scores read it: K's fp8_bf16 order, which
// permutes dims within each group of 64.
HWY_INLINE int dp_q_dim_fp8(int x) {
  const int v = (x >> 5) & 1, w = x & 31;
  return (x & ~63) + 16 * (w >> 3) + 8 * v + (w & 7);
}

// A q row of Dq floats (zero past D) as bf16 in the fp8 scores' dim order (dp_q_dim_fp8): in
// each group of 64, the 8-dim chunks 0, 2, 4, 6, then 1, 3, 5, 7. Vectorised: the scalar loop
// was ~1/3 of a one-key decode item (Zen 4).
PA_DP_ATTR HWY_INLINE void dp_q_row_fp8(const float* HWY_RESTRICT qf, int Dq,
                                        uint16_t* HWY_RESTRICT qr) {
  for (int c = 0; c < Dq; c += 64) {
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {  // chunks 2j and 2j + 1
      // bf16_codes: f32_to_bf16's rounding (vcvtneps2bf16 would flush subnormals).
      const __m256i w = _mm512_cvtepi32_epi16(bf16_codes(hn::LoadU(DF(), qf + c + 16 * j)).raw);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + c + 8 * j), _mm256_castsi256_si128(w));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + c + 32 + 8 * j),
                       _mm256_extracti128_si256(w, 1));
    }
  }
}

// Load masks of a group's first n elements (the whole group when n reaches its size).
HWY_INLINE __mmask32 first_words(int n) {
  return n >= 32 ? ~0u : static_cast<__mmask32>((1u << n) - 1u);
}
HWY_INLINE __mmask64 first_bytes(int n) {
  return n >= 64 ? ~0ull : static_cast<__mmask64>((1ull << n) - 1ull);
}

// An fp8 row of D dims as Dw bf16 (Dw a multiple of 64) in fp8_bf16's order, the order q16 pairs
// K in; zeros past D. The last part is read masked: no load leaves the row. (Whole chunks read
// unmasked: the AMX scores, which convert every K row, were 2-4% slower in cache all masked.)
PA_DP_ATTR HWY_INLINE void fp8_row_bf16(const Fp8Lut& L, const uint8_t* src, int D, int Dw,
                                        uint16_t* dst) {
  for (int x = 0; x < Dw; x += 64) {
    __m512i w0, w1;
    fp8_bf16(L, D - x >= 64 ? _mm512_loadu_si512(src + x)
                            : _mm512_maskz_loadu_epi8(first_bytes(D - x), src + x),
             w0, w1);
    _mm512_storeu_si512(dst + x, w0);
    _mm512_storeu_si512(dst + x + 32, w1);
  }
}

// Dims [x, x + 64) of two fp8 V rows as bf16 key pairs: w[v] as dp_acc_group's vector v (dp_dim
// order); zeros past D, read masked.
PA_DP_ATTR HWY_INLINE void fp8_pairs_bf16(const Fp8Lut& L, const uint8_t* v0, const uint8_t* v1,
                                          int x, int D, __m512i* w) {
  const __mmask64 m = first_bytes(D - x);
  const __m512i x0 = _mm512_maskz_loadu_epi8(m, v0 + x);
  const __m512i x1 = _mm512_maskz_loadu_epi8(m, v1 + x);
  fp8_bf16(L, _mm512_unpacklo_epi8(x0, x1), w[0], w[1]);
  fp8_bf16(L, _mm512_unpackhi_epi8(x0, x1), w[2], w[3]);
}

// Accumulator slot of (row r, key b) in a block of R rows x 16/R keys: reduce16 leaves row r's
// keys in lanes [r * 16/R, (r + 1) * 16/R).
constexpr int dp_slot(int R, int r, int b) { return r * (16 / R) + b; }

// One chunk of dims [i, i + C) (C = 32 bf16, 64 fp8) of the scores of R rows (q16 at stride Dq
// words) against 16/R keys from kp[k], into the 16 accumulators a (lanes as dp_slot). Each key
// row is read at kp[k + b] + off bytes (off: the head's offset in a slot row). Masked: the head
// ends inside the chunk; only its first n dims are loaded (q16 is zero past the head).
template <int DT, int R, bool Masked>
PA_DP_ATTR HWY_INLINE void dp_score_chunk(const uint16_t* HWY_RESTRICT q16, int Dq,
                                          const void* const* kp, int k, int i, int n,
                                          const Fp8Lut& L, int64_t off, __m512* a) {
  constexpr int KB = 16 / R;
  if constexpr (!dp_fp8(DT)) {
    const __mmask32 mask = Masked ? first_words(n) : 0;
    __m512i qv[R];
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) qv[r] = _mm512_load_si512(q16 + r * Dq + i);
    HWY_UNROLL(16)
    for (int b = 0; b < KB; ++b) {
      const uint16_t* kr = row_at<uint16_t>(kp[k + b], off) + i;
      const __m512i kv = Masked ? _mm512_maskz_loadu_epi16(mask, kr) : _mm512_loadu_si512(kr);
      HWY_UNROLL(4)
      for (int r = 0; r < R; ++r) {
        __m512& acc = a[dp_slot(R, r, b)];
        acc = _mm512_dpbf16_ps(acc, (__m512bh)qv[r], (__m512bh)kv);
      }
    }
  } else {
    // Two keys per load of q (KB is even), half the q loads; the same sums in the same order.
    // In cache 1.5-2% faster than one key per load (b1 x 2048, one thread).
    const __mmask64 mask = Masked ? first_bytes(n) : 0;
    HWY_UNROLL(8)
    for (int b = 0; b < KB; b += 2) {
      const uint8_t* k0 = row_at<uint8_t>(kp[k + b], off) + i;
      const uint8_t* k1 = row_at<uint8_t>(kp[k + b + 1], off) + i;
      __m512i w0, w1, w2, w3;
      fp8_bf16(L, Masked ? _mm512_maskz_loadu_epi8(mask, k0) : _mm512_loadu_si512(k0), w0, w1);
      fp8_bf16(L, Masked ? _mm512_maskz_loadu_epi8(mask, k1) : _mm512_loadu_si512(k1), w2, w3);
      HWY_UNROLL(4)
      for (int r = 0; r < R; ++r) {
        const __m512i q0 = _mm512_load_si512(q16 + r * Dq + i);
        const __m512i q1 = _mm512_load_si512(q16 + r * Dq + i + 32);
        __m512& a0 = a[dp_slot(R, r, b)];
        __m512& a1 = a[dp_slot(R, r, b + 1)];
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)w0, (__m512bh)q0);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)w2, (__m512bh)q0);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)w1, (__m512bh)q1);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)w3, (__m512bh)q1);
      }
    }
  }
}

// Scores of R rows (q16 at stride Dq words) against 16/R keys from kp[k]: s[r][k + b] = q . k
// over the head's D dims, whole chunks first, then a masked last one where D is not a multiple.
template <int DT, int R>
PA_DP_ATTR HWY_INLINE void dp_score_block(const uint16_t* HWY_RESTRICT q16, int Dq, int D,
                                          const void* const* kp, int k, float* HWY_RESTRICT s,
                                          const Fp8Lut& L, int64_t off) {
  constexpr int KB = 16 / R;
  constexpr int C = dp_fp8(DT) ? 64 : 32;
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  int i = 0;
  for (; i + C <= D; i += C) dp_score_chunk<DT, R, false>(q16, Dq, kp, k, i, C, L, off, a);
  if (i < D) dp_score_chunk<DT, R, true>(q16, Dq, kp, k, i, D - i, L, off, a);
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, reduce16(a));
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) memcpy(s + r * kKeyTile + k, tmp + r * KB, sizeof(float) * KB);
}

// What a decode phase asks the cache for while it computes: for each key k it reads, the head's
// part (poff bytes into the row, `lines` lines of it) of two other rows, at pb[k] and
// pb[kKeyTile + k]: during a tile's scores the next tile's K (first request) and this tile's V
// (second), during its P.V the next tile's V and K. Each line is asked for twice, half a tile
// apart (see TileSpans::before_scores for why), and the requests are spread over the phase by the
// keys the phase reads.
struct DpPf {
  const void* const* pb;
  int64_t poff;
  int lines;
  // Asks for `n` lines from byte `at` of key k's two rows.
  HWY_INLINE void ask(int k, int64_t at, int n) const {
    const char* x = row_at<char>(pb[k], at);
    const char* y = row_at<char>(pb[kKeyTile + k], at);
    for (int l = 0; l < n; ++l) {
      __builtin_prefetch(x + 64 * l, 0, 1);
      __builtin_prefetch(y + 64 * l, 0, 1);
    }
  }
};

// Scores of R rows against keys [0, nk) of kp (nk a multiple of 16 / R; zero rows past the keys).
// Pf: the head's first pass, which asks for the lines of P (DpPf).
template <int DT, int R, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_score_rows(const uint16_t* q16, int Dq, int D, const void* const* kp,
                                         int nk, float* s, PfStream* pf, const DpPf& P,
                                         const Fp8Lut& L, int64_t off) {
  constexpr int KB = 16 / R;
  for (int k = 0; k < nk; k += KB) {
    dp_score_block<DT, R>(q16, Dq, D, kp, k, s, L, off);
    if constexpr (!dp_fp8(DT)) {
      pf->step();
    } else if constexpr (Pf) {
      for (int b = 0; b < KB; ++b) P.ask(k + b, P.poff, P.lines);
    }
  }
}

// Keys ahead of P.V's loads that fp8 V lines are pulled into L1 (even: one key pair).
constexpr int kPvL1Ahead = 8;

// acc rows (stride Dq, accumulator order) += sum_k p[r][k] v_k over the group of 16 * NV dims
// at g, keys [0, nk) in pairs (nk even, padded with a zero row and weight 0). p16 holds the
// weights as bf16, row stride kKeyTile: the 32-bit word at key k is the pair (p_k, p_k+1). V rows
// are read at vp[k] + off bytes, as the scores read K. Masked: the head ends n dims into the
// group; the dims past it accumulate zeros, and no load leaves the row (the pool's last row may
// end a mapping).
template <int DT, int R, int NV, bool Pf, bool Masked = false>
PA_DP_ATTR HWY_INLINE void dp_acc_group(float* HWY_RESTRICT acc, int Dq, int g,
                                        const uint16_t* HWY_RESTRICT p16, const void* const* vp,
                                        int nk, PfStream* pf, const DpPf& P, const Fp8Lut& L,
                                        int64_t off, int n = 0) {
  static_assert(!Masked || NV == (dp_fp8(DT) ? 4 : 2), "a masked group is one load per row");
  const __mmask32 m16 = Masked && !dp_fp8(DT) ? first_words(n) : 0;
  const __mmask64 m8 = Masked && dp_fp8(DT) ? first_bytes(n) : 0;
  __m512 a[R][NV];
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) a[r][v] = _mm512_load_ps(acc + r * Dq + g + 16 * v);
  }
  // The group's lines (64 bytes each) of the two keys' rows in P.
  constexpr int kGroupLines = NV * 16 * (dp_fp8(DT) ? 1 : 2) / 64;
  const int64_t pg = P.poff + g * (dp_fp8(DT) ? 1 : 2);
  for (int k = 0; k < nk; k += 2) {
    if constexpr (!dp_fp8(DT)) {
      pf->step();
    } else if constexpr (Pf) {
      P.ask(k, pg, kGroupLines);
      P.ask(k + 1, pg, kGroupLines);
    }
    // fp8: the V lines of the pair kPvL1Ahead keys on, from L2 (where pf put them) into L1. With
    // NHD's 1 KiB slot rows a group's lines are 1 KiB apart, which the hardware does not fetch
    // ahead; the loads stalled here (~20% of samples at b16 x 4096, 2 threads). 3-4% faster
    // in DRAM and in cache, 1 and 2 threads; HND unchanged; bf16 (two lines per group) no gain.
    if constexpr (dp_fp8(DT)) {
      if (k + kPvL1Ahead < nk) {
        _mm_prefetch(row_at<char>(vp[k + kPvL1Ahead], off) + g, _MM_HINT_T0);
        _mm_prefetch(row_at<char>(vp[k + kPvL1Ahead + 1], off) + g, _MM_HINT_T0);
      }
    }
    __m512i w[NV];
    if constexpr (!dp_fp8(DT)) {
      const uint16_t* v0 = row_at<uint16_t>(vp[k], off) + g;
      const uint16_t* v1 = row_at<uint16_t>(vp[k + 1], off) + g;
      HWY_UNROLL(2)
      for (int c = 0; c < NV / 2; ++c) {
        const __m512i x0 = Masked ? _mm512_maskz_loadu_epi16(m16, v0) : _mm512_loadu_si512(v0 + 32 * c);
        const __m512i x1 = Masked ? _mm512_maskz_loadu_epi16(m16, v1) : _mm512_loadu_si512(v1 + 32 * c);
        w[2 * c] = _mm512_unpacklo_epi16(x0, x1);
        w[2 * c + 1] = _mm512_unpackhi_epi16(x0, x1);
      }
    } else {
      static_assert(!dp_fp8(DT) || NV == 4, "fp8 groups are 64 dims");
      const uint8_t* v0 = row_at<uint8_t>(vp[k], off) + g;
      const uint8_t* v1 = row_at<uint8_t>(vp[k + 1], off) + g;
      const __m512i x0 = Masked ? _mm512_maskz_loadu_epi8(m8, v0) : _mm512_loadu_si512(v0);
      const __m512i x1 = Masked ? _mm512_maskz_loadu_epi8(m8, v1) : _mm512_loadu_si512(v1);
      fp8_bf16(L, _mm512_unpacklo_epi8(x0, x1), w[0], w[1]);
      fp8_bf16(L, _mm512_unpackhi_epi8(x0, x1), w[2], w[3]);
    }
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      memcpy(&pair, p16 + r * kKeyTile + k, 4);
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      HWY_UNROLL(4)
      for (int v = 0; v < NV; ++v) a[r][v] = _mm512_dpbf16_ps(a[r][v], (__m512bh)w[v], pb);
    }
  }
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(acc + r * Dq + g + 16 * v, a[r][v]);
  }
}

// P.V over a head's D dims: groups of 64, then (bf16) one of 32, then a masked last group
// where the head ends inside one. dp_pv_groups counts them (pf->step() calls per key pair).
template <int DT, int R, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_acc_rows(float* acc, int Dq, int D, const uint16_t* p16,
                                       const void* const* vp, int nk, PfStream* pf,
                                       const DpPf& P, const Fp8Lut& L, int64_t off) {
  int g = 0;
  for (; g + 64 <= D; g += 64) dp_acc_group<DT, R, 4, Pf>(acc, Dq, g, p16, vp, nk, pf, P, L, off);
  if constexpr (!dp_fp8(DT)) {
    if (g + 32 <= D) {
      dp_acc_group<DT, R, 2, Pf>(acc, Dq, g, p16, vp, nk, pf, P, L, off);
      g += 32;
    }
    if (g < D) dp_acc_group<DT, R, 2, Pf, true>(acc, Dq, g, p16, vp, nk, pf, P, L, off, D - g);
  } else {
    if (g < D) dp_acc_group<DT, R, 4, Pf, true>(acc, Dq, g, p16, vp, nk, pf, P, L, off, D - g);
  }
}

template <int DT>
constexpr int dp_pv_groups(int D) {
  return dp_fp8(DT) ? (D + 63) / 64 : D / 64 + (D % 64 >= 32) + (D % 32 != 0);
}

// One pass of R rows (a head's rows, pass_rows / pv_rows in AttentionItemDp): its scores, and
// its P.V. Pf as in dp_score_rows and dp_acc_group.
template <int DT, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_score_pass(int R, const uint16_t* qr, int Dq, int D,
                                         const void* const* kh, int nk, float* sr, PfStream* pf,
                                         const DpPf& P, const Fp8Lut& L, int64_t off) {
  switch (R) {
    case 4: dp_score_rows<DT, 4, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
    case 2: dp_score_rows<DT, 2, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
    default: dp_score_rows<DT, 1, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
  }
}
template <int DT, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_acc_pass(int R, float* acc, int Dq, int D, const uint16_t* pr,
                                       const void* const* vh, int nk, PfStream* pf,
                                       const DpPf& P, const Fp8Lut& L, int64_t off) {
  switch (R) {
    case 5: dp_acc_rows<DT, 5, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 4: dp_acc_rows<DT, 4, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 3: dp_acc_rows<DT, 3, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 2: dp_acc_rows<DT, 2, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    default: dp_acc_rows<DT, 1, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
  }
}

// exp(x) as 2^n 2^f, n = round(x log2 e), f in [-1/2, 1/2]: 2^f by a degree-5 polynomial
// (minimax for relative error, 1.6e-7, about an f32 ulp; x log2 e itself is rounded, which adds
// |x| 1e-7 relative: 2e-6 at x = -20, below which the weight is < 2e-9), 2^n by vscalefps, which
// underflows to 0 as Exp does. 10 instructions against Highway's ~20: the weights are rounded to
// bf16 (2^-9) right after, which is why the last digits of f32 need not be worked for.
PA_DP_ATTR HWY_INLINE __m512 dp_exp(__m512 x) {
  // Clamped below (-inf gives 0, as Exp does; NaN stays NaN: vmaxps returns its second operand).
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(-200.0f),
                                 _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(0.001327647129073739f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009675540961325169f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550713092088699f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022120237350464f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931469440460205f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  return _mm512_scalef_ps(p, n);
}

// Adds rows [r0, r1)' vector partial sums lv into l and clears them (before l is read or
// rescaled by anything but dp_softmax_full's lane adds).
PA_DP_ATTR HWY_INLINE void dp_fold_l(Scratch* sc, int r0, int r1) {
  for (int r = r0; r < r1; ++r) {
    sc->l[r] += _mm512_reduce_add_ps(_mm512_load_ps(sc->lv + 16 * r));
    _mm512_store_ps(sc->lv + 16 * r, _mm512_setzero_ps());
  }
}

// softmax_tile's bf16-weight pass for a tile that every row sees whole, with no soft cap or ALiBi
// (a decode's tiles), in registers: scale, max, online-softmax update, exp, and the weights
// rounded to bf16 straight into p16 (kKeyTile = 32 of them per row: two vectors). l adds up the
// rounded weights, as softmax_tile's does, so P.V divides by exactly the weights it used; it does
// so in the 16 lanes of lv (dp_fold_l sums them), and the tile's maximum reaches every lane by
// shuffles, so a row takes no horizontal sum and no scalar round trip unless its maximum grows.
// Partial: only the first nk keys of the tile exist (a sequence's last tile); the other lanes'
// scores are not read (they may be stale) and their weights are 0, as softmax_tile gives them.
// At b16 x 1 (one key a sequence) taking it here, not through softmax_tile, made the call 27-30%
// faster.
static_assert(kKeyTile == 32, "dp_softmax_full holds a row's scores in two vectors");
template <bool Partial = false>
PA_DP_ATTR HWY_INLINE void dp_softmax_full(Scratch* sc, uint16_t* p16, int rows, int D,
                                           float sfac, int nk = kKeyTile) {
  const __m512 vf = _mm512_set1_ps(sfac);
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __mmask16 k0 = Partial ? static_cast<__mmask16>(nk >= 16 ? 0xFFFF : (1u << nk) - 1) : 0;
  const __mmask16 k1 = Partial ? static_cast<__mmask16>(nk <= 16 ? 0 : (1u << (nk - 16)) - 1) : 0;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < rows; ++r) {
    const float* s = sc->s + r * kKeyTile;
    // Missing keys score 0 here (never NaN or stale bits into exp; their weights are zeroed
    // after it) and -inf for the maximum.
    const __m512 s0 = _mm512_mul_ps(Partial ? _mm512_maskz_load_ps(k0, s) : _mm512_load_ps(s), vf);
    const __m512 s1 =
        _mm512_mul_ps(Partial ? _mm512_maskz_load_ps(k1, s + 16) : _mm512_load_ps(s + 16), vf);
    __m512 mx = Partial ? _mm512_max_ps(_mm512_mask_blend_ps(k0, ninf, s0),
                                        _mm512_mask_blend_ps(k1, ninf, s1))
                        : _mm512_max_ps(s0, s1);
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0x4E));
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0xB1));
    mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0x4E));
    mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0xB1));
    const float mold = sc->m[r];
    const __m512 vm = _mm512_max_ps(mx, _mm512_set1_ps(mold));
    const float mt = _mm512_cvtss_f32(mx);
    if (mt > mold) {  // the row's maximum grows (rare after the first tiles): rescale its state
      dp_fold_l(sc, r, r + 1);
      raise_max(sc, r, mt, D);
    }
    float* lv = sc->lv + 16 * r;
    __m512 p0 = dp_exp(_mm512_sub_ps(s0, vm));
    __m512 p1 = dp_exp(_mm512_sub_ps(s1, vm));
    if constexpr (Partial) {
      p0 = _mm512_maskz_mov_ps(k0, p0);
      p1 = _mm512_maskz_mov_ps(k1, p1);
    }
    const __m512i pb = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_store_si512(p16 + r * kKeyTile, pb);
    // Back to float32: each dword holds two weights, the low one (<< 16) and the high one.
    const __m512 w = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pb, 16)),
                                   _mm512_castsi512_ps(_mm512_and_si512(pb, hi_mask)));
    _mm512_store_ps(lv, _mm512_add_ps(_mm512_load_ps(lv), w));
  }
}

// Can the dot-product decode run this item? bf16 caches read by bf16 queries, fp8 caches with
// any query dtype; any head size (a last partial chunk of dims is read masked).
HWY_INLINE bool dp_eligible(const AttnItem& it) {
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.kv_heads > 1) {  // planned for this path (multi_head_decode_ok)
    if (it.tok1 - it.tok0 != 1 || rows > kMaxRows) return false;
  } else if (rows >= 16) {
    return false;
  }
  if (it.head_size > kMaxHeadSize) return false;
  if (it.kv.dtype == PAGEDATTN_DTYPE_BFLOAT16) return it.dtype == PAGEDATTN_DTYPE_BFLOAT16;
  return it.kv.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || it.kv.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
}

// A zero K/V row: padding keys of a tile point here (fp8 0x00 and bf16 0x0000 are +0).
// kMaxRows rows long, so that a later head's offset from it (by_offset below) stays inside.
alignas(64) const uint8_t kZeroRow[kMaxRows * kMaxHeadSize * 2] = {};

// ---- the decode's scores and P.V on AMX-BF16 tiles (AVX3_AMX) ----
// A tile multiply adds 16 keys x 32 dims (K rows as A) times 32 dims x n query rows (B) into a
// 16 x n block of float32 scores: the whole GQA group of a key block in D / 32 instructions, with
// no lane sums, where the AVX512_BF16 loop spends G * D / 32 dot products and a 16-to-1 sum per
// key and row. fp8 caches only: K rows are converted by the same lookups into a bf16 scratch
// that the tile loads. The products are the same bf16 pairs summed in float32, so the scores
// match the AVX512_BF16 path to its rounding. P.V likewise (dp_amx_pv).
#undef PA_AMX_ATTR
#define PA_AMX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))

// LDTILECFG's 64-byte operand (palette 1).
struct AmxTileCfg {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: 0 the scores (16 keys x G float32), 1 K (16 keys x 32 dims) or V (16 key pairs x 16
// dims), 2 q (16 dim pairs x G), 3 P (G rows x 32 keys), 4-7 accumulators (G rows x 16 dims).
PA_AMX_ATTR HWY_INLINE void dp_amx_configure(int G) {
  AmxTileCfg cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  cfg.rows[0] = 16;
  cfg.colsb[0] = static_cast<uint16_t>(4 * G);
  cfg.rows[1] = 16;
  cfg.colsb[1] = 64;
  cfg.rows[2] = 16;
  cfg.colsb[2] = static_cast<uint16_t>(4 * G);
  for (int t = 3; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(G);
    cfg.colsb[t] = 64;
  }
  // GCC 12 treats the ldtilecfg builtin as not reading its operand and drops the stores above
  // (SIGILL at the first tile instruction); the barrier keeps them.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// q of a head's G rows as tile B, chunk by chunk: qt[(c * 16 + p) * G + n] is the 32-bit pair p
// of chunk c (dims 32c + 2p, + 1 in q16's order) of row n.
HWY_INLINE void dp_amx_q(const uint16_t* q16, int Dq, int G, uint32_t* qt) {
  for (int n = 0; n < G; ++n) {
    const uint16_t* qr = q16 + static_cast<size_t>(n) * Dq;
    for (int w = 0; w < Dq / 2; ++w) {
      uint32_t pair;
      memcpy(&pair, qr + 2 * w, 4);
      qt[w * G + n] = pair;
    }
  }
}

// Scores of a head's G rows against keys [0, nk16) of kh (16 at a time; zero rows past the
// tile's keys): s[n][k] at row stride kKeyTile. kb: 16 rows of Dq bf16; cbuf: 256 floats. One
// PfStream turn per key block.
template <int DT>
PA_AMX_ATTR HWY_INLINE void dp_amx_scores(int G, const uint32_t* qt, int Dq, int D,
                                          const void* const* kh, int nk16, float* s, uint16_t* kb,
                                          float* cbuf, PfStream* pf, const Fp8Lut& L,
                                          int64_t off) {
  static_assert(dp_fp8(DT), "bf16 caches keep the AVX512_BF16 scores");
  const __m512i col = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (int k0 = 0; k0 < nk16; k0 += 16) {
    for (int j = 0; j < 16; ++j)
      fp8_row_bf16(L, row_at<uint8_t>(kh[k0 + j], off), D, Dq, kb + j * Dq);
    pf->step();
    _tile_zero(0);
    for (int c = 0; c < Dq / 32; ++c) {
      _tile_loadd(1, kb + 32 * c, 2 * Dq);
      _tile_loadd(2, qt + c * 16 * G, 4 * G);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, cbuf, 64);
    for (int n = 0; n < G; ++n)
      _mm512_storeu_ps(s + n * kKeyTile + k0,
                       _mm512_i32gather_ps(_mm512_add_epi32(col, _mm512_set1_epi32(n)), cbuf, 4));
  }
}

// P.V of a head's G rows over a whole tile of 32 keys (weights of missing keys are 0, their V
// rows the zero row) on tiles: the tile's V rows converted by key pairs into a bf16 scratch in
// the pair order of tile B (vs: per 64-dim group, four 16 x 16-pair blocks, each as dp_acc_group
// leaves its vector v), P (p16 rows, 64 bytes each) as A, the accumulators (accumulator order,
// as dp_acc_group keeps them) loaded, added to and stored back as four G x 16 tiles. One
// PfStream turn per key pair.
template <int DT>
PA_AMX_ATTR HWY_INLINE void dp_amx_pv(int G, float* acc, int Dq, int D, const uint16_t* p16,
                                      const void* const* vh, uint16_t* vs, PfStream* pf,
                                      const Fp8Lut& L, int64_t off) {
  static_assert(dp_fp8(DT), "bf16 caches keep the AVX512_BF16 P.V");
  (void)G;  // the tile configuration (dp_amx_configure) holds the row count
  for (int k = 0; k < kKeyTile; k += 2) {
    const uint8_t* v0 = row_at<uint8_t>(vh[k], off);
    const uint8_t* v1 = row_at<uint8_t>(vh[k + 1], off);
    pf->step();
    for (int g = 0; g < Dq; g += 64) {
      __m512i w[4];
      fp8_pairs_bf16(L, v0, v1, g, D, w);
      uint16_t* b = vs + static_cast<size_t>(g / 64) * 4 * 16 * 32 + (k / 2) * 32;
      for (int v = 0; v < 4; ++v) _mm512_storeu_si512(b + v * 16 * 32, w[v]);
    }
  }
  const int64_t as = 4 * static_cast<int64_t>(Dq);
  _tile_loadd(3, p16, 2 * kKeyTile);
  for (int g = 0; g < Dq; g += 64) {
    const uint16_t* b = vs + static_cast<size_t>(g / 64) * 4 * 16 * 32;
    float* a = acc + g;
    _tile_loadd(4, a, as);
    _tile_loadd(5, a + 16, as);
    _tile_loadd(6, a + 32, as);
    _tile_loadd(7, a + 48, as);
    _tile_loadd(1, b, 64);
    _tile_dpbf16ps(4, 3, 1);
    _tile_loadd(1, b + 16 * 32, 64);
    _tile_dpbf16ps(5, 3, 1);
    _tile_loadd(1, b + 2 * 16 * 32, 64);
    _tile_dpbf16ps(6, 3, 1);
    _tile_loadd(1, b + 3 * 16 * 32, 64);
    _tile_dpbf16ps(7, 3, 1);
    _tile_stored(4, a, as);
    _tile_stored(5, a + 16, as);
    _tile_stored(6, a + 32, as);
    _tile_stored(7, a + 48, as);
  }
}

template <int DT>
PA_AMX_ATTR void AttentionItemDp(const AttnItem& it, Scratch* sc, bool amx) {
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  // Several KV heads (decode, contiguous heads: kv_heads > 1) run tile by tile together, so one
  // item reads whole slot rows of the cache; each head has G rows.
  const int kvn = it.kv_heads > 1 ? it.kv_heads : 1;
  const int G = rows / kvn;
  // A head's rows are scored in passes (pass_rows) of 4 rows, then 2, then 1, except that a last
  // group of 3 is scored as 4 in one-head items (in cache as fast as 2 and 1) and on fp8 caches,
  // which convert K once per pass (in cache 24/8 heads 7% faster, 56/8 and 28/4 3-4%; passes of
  // 8 rows were 1.3-1.7x slower). A padded pass runs into the next head's rows, whose own pass
  // comes later and overwrites those scores, or into zero rows after the item's last (q16 and
  // the scores have kMaxRows rows; no padding where it would not fit).
  int pass_rows[kMaxRows];
  int npass = 0, G_s = 0;
  for (int left = G; left > 0;) {
    const int exact = left >= 4 ? 4 : (left >= 2 ? 2 : 1);
    int R = left == 3 && (kvn == 1 || dp_fp8(DT)) ? 4 : exact;
    if (rows - G + G_s + R > kMaxRows) R = exact;  // padding past the last head would not fit
    pass_rows[npass++] = R;
    G_s += R;
    left -= std::min(R, left);
  }
  const int rows_s = rows - G + G_s;
  // P.V runs a head's rows 4 at a time, but a last 5 in one pass, so their V rows are read (and
  // converted) once: in cache 40/8 heads 10% faster with a bf16 cache, 7% with fp8.
  int pv_rows[kMaxRows];
  int npv = 0;
  for (int left = G; left > 0; left -= pv_rows[npv++])
    pv_rows[npv] = left == 5 ? 5 : std::min(left, 4);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t esz = elem_size(it.kv.dtype);
  const Fp8Lut L = dp_fp8(DT) ? fp8_lut<DT>() : Fp8Lut{};
  // Row stride of q16 and the accumulators: whole chunks of the dot products (32 bf16 dims, 64
  // fp8 ones), zero past D, where K and V are read masked.
  const int Dq = dp_fp8(DT) ? (D + 63) & ~63 : (D + 31) & ~31;
  // q as bf16 (in K's element order), rows at stride Dq words; the weights of a tile as bf16.
  uint16_t* q16 = reinterpret_cast<uint16_t*>(sc->kt);
  uint16_t* p16 = reinterpret_cast<uint16_t*>(sc->vt);
  float* qf = sc->q;  // float staging of one q row

  for (int r = 0; r < rows_s; ++r) {
    uint16_t* qr = q16 + static_cast<size_t>(r) * Dq;
    if (r >= rows) {
      memset(qr, 0, sizeof(uint16_t) * static_cast<size_t>(Dq));
      continue;
    }
    const int t = r / nh, g = r % nh;
    const char* qp = item_q(it, t, g);
    if (it.dtype == PAGEDATTN_DTYPE_BFLOAT16 && !dp_fp8(DT)) {
      memcpy(qr, qp, sizeof(uint16_t) * static_cast<size_t>(D));
      memset(qr + D, 0, sizeof(uint16_t) * static_cast<size_t>(Dq - D));
    } else {
      load_row(qp, it.dtype, 1.0f, qf, D);
      memset(qf + D, 0, sizeof(float) * static_cast<size_t>(Dq - D));
      dp_q_row_fp8(qf, Dq, qr);
    }
    memset(sc->acc + static_cast<size_t>(r) * Dq, 0, sizeof(float) * static_cast<size_t>(Dq));
    sc->m[r] = kNegInf;
    sc->l[r] = 0.0f;
    _mm512_store_ps(sc->lv + 16 * r, _mm512_setzero_ps());
  }

  const int64_t kbeg = std::max(it.key0, item_row_lo(it, 0));
  const int64_t kend = std::min(it.key1, item_row_hi(it, ntok - 1) + 1);
  const bool plain = it.soft_cap <= 0.0f && it.alibi == nullptr;
  const float sfac = it.scale * (dp_fp8(DT) ? it.kv.k_scale : 1.0f);
  // AMX scores and P.V: a tile's B operand holds up to 16 rows; short items skip the setup (q as
  // tile operands, the tile configuration). Scratch in sc->q, free between the q rows and the
  // output pass: the q operands (rows * Dq * 2 bytes <= 32 KiB), K rows as bf16 (<= 8 KiB), one
  // tile of scores, V rows as bf16.
  // fp8 only: a bf16 decode is memory-bound, and with its K tiles loaded in place it ran 11%
  // slower from DRAM (b16 x 4096, 2 threads), level in cache.
  const bool use_amx = amx && dp_fp8(DT) && G <= 16 && kend - kbeg >= 128;
  uint32_t* amx_q = reinterpret_cast<uint32_t*>(sc->q);
  uint16_t* amx_k = reinterpret_cast<uint16_t*>(sc->q + kMaxRows * kMaxHeadSize / 2);
  float* amx_c = sc->q + kMaxRows * kMaxHeadSize / 2 + 16 * kMaxHeadSize / 2;
  // V of a tile as tile B operands (P.V): 32 keys x Dq bf16 (<= 16 KiB).
  uint16_t* amx_v = reinterpret_cast<uint16_t*>(amx_c + 256);
  static_assert(kMaxRows * kMaxHeadSize / 2 + 16 * kMaxHeadSize / 2 + 256 +
                        kKeyTile * kMaxHeadSize / 2 <=
                    kMaxRows * kMaxHeadSize,
                "the AMX operands fit in Scratch::q");
  if (use_amx) {
    for (int h = 0; h < kvn; ++h)
      dp_amx_q(q16 + static_cast<size_t>(h) * G * Dq, Dq, G,
               amx_q + static_cast<size_t>(h) * G * Dq / 2);
    dp_amx_configure(G);
  }
  // This tile's and the next tile's row addresses, padded with the zero row to 16 keys.
  const void* ptrs[2][2][kKeyTile];
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < kKeyTile; ++k) ptrs[b][0][k] = ptrs[b][1][k] = kZeroRow;
  int cur = 0;
  const TileSpans spans(it, kvn, sc->prefetch_twice);
  const int64_t head_bytes = spans.head_bytes;
  const void* hptr[kKeyTile];  // one head's row addresses (kvn > 1)
  // Row addresses of head h (0: the item's first) of keys [0, n); padding keeps the zero row.
  auto head_rows = [&](const void* const* base, int h, int n) -> const void* const* {
    if (h == 0) return base;
    for (int k = 0; k < n; ++k)
      hptr[k] = base[k] == kZeroRow ? base[k] : static_cast<const char*>(base[k]) + h * head_bytes;
    return hptr;
  };

  // Head h's rows as the first head's row addresses plus h * head_bytes, when a padding key's
  // zero row is long enough for that too; else rebuilt per head (head_rows). In cache the
  // rebuilding cost 7% of a bf16 decode (b1 x 2048, one thread).
  const bool by_offset = kvn > 1 && (kvn - 1) * head_bytes + D * static_cast<int64_t>(esz) <=
                                        static_cast<int64_t>(sizeof(kZeroRow));
  if (kbeg < kend) {
    const int n0 = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kbeg));
    key_ptrs(it, kbeg, n0, ptrs[0][0], ptrs[0][1], 0);
    spans.first(ptrs[0][0], ptrs[0][1], n0, kbeg);
  }
  // Row addresses the phases ask the cache for (DpPf), and the lines of a head's row part: one
  // more where rows may start inside a line, so the part's last line is asked for too.
  const void* pf_scores[2 * kKeyTile];
  const void* pf_pv[2 * kKeyTile];
  const int64_t part_bytes = D * static_cast<int64_t>(esz);
  const bool lined = part_bytes % 64 == 0 && head_bytes % 64 == 0 && spans.slot_bytes % 64 == 0;
  const int pf_lines = static_cast<int>((part_bytes + 63) / 64) + (lined ? 0 : 1);
  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0));
    const int nk16 = (nk + 15) & ~15;
    // Keys a pass of R rows scores: nk rounded up to its blocks of 16 / R (zero rows past nk).
    auto score_keys_of = [nk](int R) { return (nk + 16 / R - 1) / (16 / R) * (16 / R); };
    const void** kptr = ptrs[cur][0];
    const void** vptr = ptrs[cur][1];
    int next_n = 0;
    if (kt0 + kKeyTile < kend) {
      next_n = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0 - kKeyTile));
      key_ptrs(it, kt0 + kKeyTile, next_n, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], 0);
      for (int k = next_n; k < kKeyTile; ++k) ptrs[cur ^ 1][0][k] = ptrs[cur ^ 1][1][k] = kZeroRow;
    }
    // The next tile streams in during this one (TileSpans::before_scores).
    // bf16 (memory-bound): whole blocks in address order, by PfStream turns. fp8 (core-bound,
    // as fast from DRAM as in cache): the rows of the keys the loops read (DpPf), without the
    // turns' bookkeeping. b16 x 4096, 10 alternating rounds: fp8 6-8% faster that way, bf16
    // ~5% slower at two threads (the blocks' lines no longer asked for in address order).
    PfStream pf, pf2;
    // With AMX the fp8 decode's core time falls by a third and it waits on memory like bf16:
    // turns, 4-5% faster than row requests (b16 x 4096, 2 threads, Sapphire-Rapids-class).
    const bool turns = !dp_fp8(DT) || use_amx;
    if (!turns) {
      if (next_n == 0)
        for (int k = 0; k < kKeyTile; ++k) ptrs[cur ^ 1][0][k] = ptrs[cur ^ 1][1][k] = kZeroRow;
      for (int k = 0; k < kKeyTile; ++k) {
        pf_scores[k] = ptrs[cur ^ 1][0][k];
        pf_scores[kKeyTile + k] = vptr[k];
        pf_pv[k] = ptrs[cur ^ 1][1][k];
        pf_pv[kKeyTile + k] = ptrs[cur ^ 1][0][k];
      }
    } else {
      // pf.step() calls of one head's scores: one per score block of 16 / R keys (AMX: of 16).
      int64_t score_steps = use_amx ? nk16 / 16 : 0;
      for (int i = 0; !use_amx && i < npass; ++i)
        score_steps += score_keys_of(pass_rows[i]) * pass_rows[i] / 16;
      spans.before_scores(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                          vptr, nk, kt0, static_cast<int64_t>(kvn) * score_steps);
    }
    for (int h = 0; h < kvn; ++h) {
      const void* const* kh = by_offset ? kptr : head_rows(kptr, h, nk16);
      const int64_t off = by_offset ? h * head_bytes : 0;
      const DpPf P{pf_scores, h * head_bytes, pf_lines};
      if constexpr (dp_fp8(DT)) {
        if (use_amx) {
          dp_amx_scores<DT>(G, amx_q + static_cast<size_t>(h) * G * Dq / 2, Dq, D, kh, nk16,
                            sc->s + h * G * kKeyTile, amx_k, amx_c, &pf, L, off);
          continue;
        }
      }
      int r = h * G;
      for (int i = 0; i < npass; r += pass_rows[i++]) {
        const uint16_t* qr = q16 + r * Dq;
        float* sr = sc->s + r * kKeyTile;
        const int R = pass_rows[i];
        const int nks = score_keys_of(R);
        if (dp_fp8(DT) && i == 0)  // bf16: PfStream turns in every pass
          dp_score_pass<DT, true>(R, qr, Dq, D, kh, nks, sr, &pf, P, L, off);
        else
          dp_score_pass<DT, false>(R, qr, Dq, D, kh, nks, sr, &pf, P, L, off);
      }
    }
    const int nk2 = (nk + 1) & ~1;
    if (turns) {
      spans.before_pv(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                      static_cast<int64_t>(kvn) *
                          (use_amx ? kKeyTile / 2 : npv * dp_pv_groups<DT>(D) * (nk2 / 2)));
    }
    cur ^= 1;
    // Every row sees all nk keys of the tile (a decode's tiles, its last one included).
    bool whole = plain;
    for (int t = 0; whole && t < ntok; ++t)
      whole = item_row_lo(it, t) <= kt0 && kt0 + nk - 1 <= item_row_hi(it, t);
    if (whole && nk == kKeyTile) {
      dp_softmax_full(sc, p16, rows, Dq, sfac);
    } else if (whole) {
      dp_softmax_full<true>(sc, p16, rows, Dq, sfac, nk);
    } else {
      dp_fold_l(sc, 0, rows);  // softmax_tile reads and rescales l
      if (!softmax_tile(it, sc, kt0, nk, plain, Dq, sfac, true)) {
        pf.flush();
        continue;
      }
      for (int r = 0; r < rows; ++r) {  // bf16 values already (weights of keys >= nk are 0)
        const float* s = sc->s + r * kKeyTile;
        const __m512bh pb = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + 16), _mm512_load_ps(s));
        _mm512_store_si512(p16 + r * kKeyTile, (__m512i)pb);
      }
    }
    for (int h = 0; h < kvn; ++h) {
      const void* const* vh = by_offset ? vptr : head_rows(vptr, h, use_amx ? kKeyTile : nk2);
      const int64_t off = by_offset ? h * head_bytes : 0;
      const DpPf P{pf_pv, h * head_bytes, pf_lines};
      if constexpr (dp_fp8(DT)) {
        if (use_amx) {
          dp_amx_pv<DT>(G, sc->acc + h * G * Dq, Dq, D, p16 + h * G * kKeyTile, vh, amx_v, &pf,
                        L, off);
          continue;
        }
      }
      int r = h * G;
      for (int i = 0; i < npv; r += pv_rows[i++]) {
        float* acc = sc->acc + r * Dq;
        const uint16_t* pr = p16 + r * kKeyTile;
        if (dp_fp8(DT) && i == 0)
          dp_acc_pass<DT, true>(pv_rows[i], acc, Dq, D, pr, vh, nk2, &pf, P, L, off);
        else
          dp_acc_pass<DT, false>(pv_rows[i], acc, Dq, D, pr, vh, nk2, &pf, P, L, off);
      }
    }
    pf.flush();
  }

  if (use_amx) _tile_release();
  dp_fold_l(sc, 0, rows);
  // Back to natural dim order (and the V scale of fp8), then the output pass.
  const float vf = dp_fp8(DT) ? it.kv.v_scale : 1.0f;
  for (int r = 0; r < rows; ++r) {
    float* a = sc->acc + static_cast<size_t>(r) * Dq;
    dp_unpermute<DT>(a, sc->q, Dq, vf);
    memcpy(a, sc->q, sizeof(float) * static_cast<size_t>(D));
  }
  write_rows(it, sc->acc, sc->m, sc->l, Dq);
}

// ---- bf16 dot products for many rows (prefill tiles, wide GQA groups): outer products ----
// The row-vectorised path with vdpbf16ps: vectors run over 16 rows and pair two dims (scores) or
// two keys (P.V), so each instruction does 32 of the multiply-adds an FMA does 16 of. K is read
// straight from a bf16 cache (fp8: converted once per tile), V rows are interleaved in key pairs
// per tile, q and the weights are rounded to bf16 as in the decode path.

// Dot-product wide path eligibility: the decode path's dtype rules, any row count up to kMaxRows.
HWY_INLINE bool dp_wide_eligible(const AttnItem& it) {
  // Any even head size: the last group of dims (bf16 32, fp8 64) is padded with zeros
  // (dpw_width). One thread against the f32 path: bf16 D 80 70-75 -> 107-117 GFLOP/s; fp8
  // D 40-200 1.1-1.6x, D 8 level.
  if (it.head_size > kMaxHeadSize || it.head_size % 2 != 0) return false;
  if (it.kv.dtype == PAGEDATTN_DTYPE_BFLOAT16) return it.dtype == PAGEDATTN_DTYPE_BFLOAT16;
  return it.kv.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || it.kv.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
}

// The wide path's accumulator width: D rounded up to whole groups of P.V pairs (bf16 32 dims,
// fp8 64); the padding positions accumulate zeros.
template <int DT>
constexpr int dpw_width(int D) {
  return dp_fp8(DT) ? (D + 63) / 64 * 64 : (D + 31) / 32 * 32;
}

// s[k][rv0*16 ...] = sum over dims of qT2 . k for 4 keys from k0 and RB row vectors from rv0.
// qT2[x2][r]: bf16 pair (q[r][2 x2], q[r][2 x2 + 1]); krow[i]: bf16 K rows.
template <int RB>
PA_DP_ATTR HWY_INLINE void dpw_scores(const uint32_t* HWY_RESTRICT qT2, const uint16_t* const* krow,
                                      int D, int Rp, int rv0, float* HWY_RESTRICT s) {
  __m512 a[4][RB];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < RB; ++j) a[i][j] = _mm512_setzero_ps();
  for (int x2 = 0; x2 < D / 2; ++x2) {
    __m512i qv[RB];
    HWY_UNROLL(4)
    for (int j = 0; j < RB; ++j) qv[j] = _mm512_load_si512(qT2 + static_cast<size_t>(x2) * Rp + (rv0 + j) * 16);
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i) {
      uint32_t kpair;
      memcpy(&kpair, krow[i] + 2 * x2, 4);
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(kpair));
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)qv[j], kb);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < RB; ++j) _mm512_store_ps(s + static_cast<size_t>(i) * Rp + (rv0 + j) * 16, a[i][j]);
}

// accT[x][rows] += sum over key pairs of pT2[kk][rows] . vt2[kk][x] for accumulator positions
// x < Dw (vt2's row length, dpw_width), 4 at a time, and RB row vectors from rv0; npair key pairs.
template <int RB>
PA_DP_ATTR HWY_INLINE void dpw_accumulate(float* HWY_RESTRICT accT, const uint32_t* HWY_RESTRICT pT2,
                                          const uint32_t* HWY_RESTRICT vt2, int Dw, int Rp,
                                          int rv0, int npair) {
  for (int x0 = 0; x0 < Dw; x0 += 4) {
    __m512 a[4][RB];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < RB; ++j) a[i][j] = _mm512_load_ps(accT + static_cast<size_t>(x0 + i) * Rp + (rv0 + j) * 16);
    for (int kk = 0; kk < npair; ++kk) {
      __m512i pv[RB];
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j) pv[j] = _mm512_load_si512(pT2 + static_cast<size_t>(kk) * Rp + (rv0 + j) * 16);
      const uint32_t* vk = vt2 + static_cast<size_t>(kk) * Dw + x0;
      HWY_UNROLL(4)
      for (int i = 0; i < 4; ++i) {
        const __m512bh vb = (__m512bh)_mm512_set1_epi32(static_cast<int>(vk[i]));
        HWY_UNROLL(4)
        for (int j = 0; j < RB; ++j) a[i][j] = _mm512_dpbf16_ps(a[i][j], (__m512bh)pv[j], vb);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < RB; ++j) _mm512_store_ps(accT + static_cast<size_t>(x0 + i) * Rp + (rv0 + j) * 16, a[i][j]);
  }
}

// Interleaves the V rows of keys (2kk, 2kk + 1) into vt2[kk][x] dword pairs, x in accumulator
// order (dp_dim), for kk < npair; a missing odd key reads the zero row. Rows are dpw_width(D)
// long: a head that ends inside its last group is read masked (no load leaves the row) and
// pairs zeros past its end.
template <int DT>
PA_DP_ATTR HWY_INLINE void dpw_v_pairs(const void* const* vp, int D, int npair, uint32_t* vt2,
                                       const Fp8Lut& L) {
  const int Dw = dpw_width<DT>(D);
  for (int kk = 0; kk < npair; ++kk) {
    uint32_t* dst = vt2 + static_cast<size_t>(kk) * Dw;
    if constexpr (!dp_fp8(DT)) {
      const uint16_t* v0 = static_cast<const uint16_t*>(vp[2 * kk]);
      const uint16_t* v1 = static_cast<const uint16_t*>(vp[2 * kk + 1]);
      for (int x = 0; x < Dw; x += 32) {
        const __mmask32 m = first_words(D - x);
        const __m512i x0 = _mm512_maskz_loadu_epi16(m, v0 + x);
        const __m512i x1 = _mm512_maskz_loadu_epi16(m, v1 + x);
        _mm512_store_si512(dst + x, _mm512_unpacklo_epi16(x0, x1));
        _mm512_store_si512(dst + x + 16, _mm512_unpackhi_epi16(x0, x1));
      }
    } else {
      const uint8_t* v0 = static_cast<const uint8_t*>(vp[2 * kk]);
      const uint8_t* v1 = static_cast<const uint8_t*>(vp[2 * kk + 1]);
      for (int x = 0; x < Dw; x += 64) {
        __m512i w[4];
        fp8_pairs_bf16(L, v0, v1, x, D, w);
        for (int v = 0; v < 4; ++v) _mm512_store_si512(dst + x + 16 * v, w[v]);
      }
    }
  }
}

// ---- the wide path's scores and P.V on AMX-BF16 tiles (AVX3_AMX) ----
// Same layouts as the vdpbf16ps loops above, so the masks, the softmax and the output pass are
// shared. Scores: K rows (16 keys x 32 dims, bf16) as A times qT2 (16 dim pairs x 16 rows) as B
// give s[k][r] 16 x 16 at a time. P.V: V^T (16 accumulator positions x 16 key pairs, the
// transposed vt2) as A times pT2 (16 key pairs x 16 rows) as B add into accT. One tile op does
// 16 x 16 x 32 multiply-adds, where vdpbf16ps does 16 x 2. Every tile is 16 rows of 64 bytes
// (dp_amx_configure(16)).
// dst[16 x 16] (row stride 16) = the transpose of the 16 x 16 dwords at src (row stride ss).
PA_DP_ATTR HWY_INLINE void transpose16_epi32(const uint32_t* src, size_t ss, uint32_t* dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ss);
  // Per 128-bit lane L: t[2i], t[2i + 1] hold columns 4L, 4L + 1 and 4L + 2, 4L + 3 of rows
  // 2i, 2i + 1; then r[4i + c] holds column 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Column 4L + c is lane L of r[c], r[4 + c], r[8 + c], r[12 + c], in that order.
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i v2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i v3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_si512(dst + (0 + c) * 16, _mm512_shuffle_i32x4(v0, v2, 0x88));
    _mm512_storeu_si512(dst + (4 + c) * 16, _mm512_shuffle_i32x4(v1, v3, 0x88));
    _mm512_storeu_si512(dst + (8 + c) * 16, _mm512_shuffle_i32x4(v0, v2, 0xDD));
    _mm512_storeu_si512(dst + (12 + c) * 16, _mm512_shuffle_i32x4(v1, v3, 0xDD));
  }
}

// s[k][r] for keys [16 g, 16 g + 16) of kb (rows of Ds bf16) and all Rv row vectors (<= 4).
PA_AMX_ATTR HWY_INLINE void dpw_amx_scores(const uint32_t* qT2, const uint16_t* kb, int Ds,
                                           int Rp, int Rv, int g, float* s) {
  const uint16_t* k = kb + static_cast<size_t>(16 * g) * Ds;
  const int64_t qs = 4 * static_cast<int64_t>(Rp);
  _tile_zero(4);
  if (Rv > 1) _tile_zero(5);
  if (Rv > 2) _tile_zero(6);
  if (Rv > 3) _tile_zero(7);
  for (int c = 0; c < Ds / 32; ++c) {
    const uint32_t* q = qT2 + static_cast<size_t>(16 * c) * Rp;
    _tile_loadd(0, k + 32 * c, 2 * Ds);
    _tile_loadd(1, q, qs);
    _tile_dpbf16ps(4, 0, 1);
    if (Rv > 1) {
      _tile_loadd(2, q + 16, qs);
      _tile_dpbf16ps(5, 0, 2);
    }
    if (Rv > 2) {
      _tile_loadd(1, q + 32, qs);
      _tile_dpbf16ps(6, 0, 1);
    }
    if (Rv > 3) {
      _tile_loadd(2, q + 48, qs);
      _tile_dpbf16ps(7, 0, 2);
    }
  }
  float* o = s + static_cast<size_t>(16 * g) * Rp;
  _tile_stored(4, o, qs);
  if (Rv > 1) _tile_stored(5, o + 16, qs);
  if (Rv > 2) _tile_stored(6, o + 32, qs);
  if (Rv > 3) _tile_stored(7, o + 48, qs);
}

// accT[x][r] += sum over the 16 key pairs of vA[x][kk] . pT2[kk][r], all Dw positions (a multiple
// of 32) and Rv row vectors. vA: per 16 positions a 16 x 16 block (transposed vt2).
PA_AMX_ATTR HWY_INLINE void dpw_amx_pv(float* accT, const uint32_t* pT2, const uint32_t* vA,
                                       int Dw, int Rp, int Rv) {
  const int64_t rs = 4 * static_cast<int64_t>(Rp);
  for (int j = 0; j < Rv; ++j) {
    _tile_loadd(1, pT2 + 16 * j, rs);
    for (int x = 0; x < Dw; x += 32) {
      float* a = accT + static_cast<size_t>(x) * Rp + 16 * j;
      _tile_loadd(4, a, rs);
      _tile_loadd(5, a + 16 * Rp, rs);
      _tile_loadd(0, vA + static_cast<size_t>(x) * 16, 64);
      _tile_dpbf16ps(4, 0, 1);
      _tile_loadd(2, vA + static_cast<size_t>(x + 16) * 16, 64);
      _tile_dpbf16ps(5, 2, 1);
      _tile_stored(4, a, rs);
      _tile_stored(5, a + 16 * Rp, rs);
    }
  }
}

// use_amx: scores and P.V on AMX tiles (dpw_amx_*), a bf16 head's K rows copied zero padded to whole
// tile rows of 32 dims; else vdpbf16ps.
template <int DT>
PA_AMX_ATTR void AttentionItemWideDp(const AttnItem& it, Scratch* sc, bool use_amx) {
  const DF d;
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  const int Rp = (rows + 15) / 16 * 16;
  const int Rv = Rp / 16;
  const int Dw = dpw_width<DT>(D);  // accumulator positions: D, then zero padding
  // Dims the scores run over: bf16 K rows are read in place (D), or copied zero padded to Dw for
  // the tiles; converted fp8 rows are Dw long, in the lookup's order, which mixes the padding of
  // the last group with real dims.
  const int Ds = dp_fp8(DT) || use_amx ? Dw : D;
  const Fp8Lut L = dp_fp8(DT) ? fp8_lut<DT>() : Fp8Lut{};
  // Scratch: qT2 in q; accT in acc; K as bf16 rows (fp8, or any for AMX) and the weight pairs in
  // kt; V pairs, then (AMX) their transpose vA, in vt.
  uint32_t* qT2 = reinterpret_cast<uint32_t*>(sc->q);
  float* accT = sc->acc;
  uint16_t* kb16 = reinterpret_cast<uint16_t*>(sc->kt);
  uint32_t* pT2 = reinterpret_cast<uint32_t*>(sc->kt) + kKeyTile * kMaxHeadSize / 2;
  uint32_t* vt2 = reinterpret_cast<uint32_t*>(sc->vt);
  uint32_t* vA = reinterpret_cast<uint32_t*>(sc->vt) + kKeyTile * kMaxHeadSize / 2;
  static_assert(kKeyTile == 32, "a tile of keys is two AMX blocks of 16, 16 key pairs");
  static_assert(kMaxRows <= 64, "dpw_amx_* hold up to 4 row vectors");

  const WideRows wr = wide_rows(it, sc, Rp);
  const int64_t kbeg = wr.kbeg, kend = wr.kend;
  const int32_t max_lo = wr.max_lo, min_hi = wr.min_hi;
  // qT2 (bf16 pairs of dims; the scale goes on the scores) and accT, zero padded. fp8 K rows stay
  // in the lookup's dim order (dp_q_dim_fp8), so q's pairs are taken in that order too.
  memset(qT2, 0, sizeof(uint32_t) * static_cast<size_t>(Ds / 2) * Rp);
  memset(accT, 0, sizeof(float) * static_cast<size_t>(Dw) * Rp);
  float row[kMaxHeadSize];
  auto qdim = [](int x) { return dp_fp8(DT) ? dp_q_dim_fp8(x) : x; };
  for (int r = 0; r < rows; ++r) {
    const int t = r / nh, g = r % nh;
    const char* qp = item_q(it, t, g);
    load_row(qp, it.dtype, 1.0f, row, D);
    for (int x2 = 0; x2 < Ds / 2; ++x2) {
      const int d0 = qdim(2 * x2), d1 = qdim(2 * x2 + 1);  // zero past the head
      qT2[static_cast<size_t>(x2) * Rp + r] =
          static_cast<uint32_t>(d0 < D ? f32_to_bf16(row[d0]) : 0) |
          static_cast<uint32_t>(d1 < D ? f32_to_bf16(row[d1]) : 0) << 16;
    }
  }
  const bool plain = it.soft_cap <= 0.0f && it.alibi == nullptr;
  const float sfac = it.scale * (dp_fp8(DT) ? it.kv.k_scale : 1.0f);
  const void* kp[kKeyTile];
  const void* vp[kKeyTile];
  const uint16_t* krow[kKeyTile];
  if (use_amx) dp_amx_configure(16);  // every tile 16 rows of 64 bytes

  prefetch_first(it, kbeg, kend);
  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0));
    const int nk4 = (nk + 3) / 4 * 4;
    const int nk16 = (nk + 15) / 16 * 16;
    key_ptrs(it, kt0, nk, kp, vp, kend);
    for (int k = nk; k < kKeyTile; ++k) kp[k] = vp[k] = kZeroRow;  // finite filler, weight 0
    for (int k = 0; k < (use_amx ? nk16 : nk4); ++k) {
      if constexpr (dp_fp8(DT)) {
        uint16_t* dst = kb16 + static_cast<size_t>(k) * Dw;
        fp8_row_bf16(L, static_cast<const uint8_t*>(kp[k]), D, Dw, dst);  // as qT2 pairs K
        krow[k] = dst;
      } else if (use_amx) {  // a tile loads rows at one stride: K rows gathered into kb16
        uint16_t* dst = kb16 + static_cast<size_t>(k) * Ds;
        const uint16_t* src = static_cast<const uint16_t*>(kp[k]);
        for (int x = 0; x < Ds; x += 32)  // masked: no load leaves the row
          _mm512_store_si512(dst + x, _mm512_maskz_loadu_epi16(first_words(D - x), src + x));
      } else {
        krow[k] = static_cast<const uint16_t*>(kp[k]);
      }
    }
    if (use_amx)
      for (int g = 0; g < nk16 / 16; ++g) dpw_amx_scores(qT2, kb16, Ds, Rp, Rv, g, sc->s);
    for (int k0 = 0; k0 < (use_amx ? 0 : nk4); k0 += 4) {
      float* sk = sc->s + static_cast<size_t>(k0) * Rp;
      int rv = 0;
      for (; rv + 4 <= Rv; rv += 4) dpw_scores<4>(qT2, krow + k0, Ds, Rp, rv, sk);
      switch (Rv - rv) {
        case 3: dpw_scores<3>(qT2, krow + k0, Ds, Rp, rv, sk); break;
        case 2: dpw_scores<2>(qT2, krow + k0, Ds, Rp, rv, sk); break;
        case 1: dpw_scores<1>(qT2, krow + k0, Ds, Rp, rv, sk); break;
        default: break;
      }
    }
    // Scale, masks, cap, ALiBi; online softmax per row vector; weights rounded to bf16 and
    // interleaved in key pairs.
    const bool full = plain && max_lo <= kt0 && kt0 + nk - 1 <= min_hi;
    const int npair = (nk + 1) / 2;
    for (int v = 0; v < Rv; ++v) {
      const size_t o = static_cast<size_t>(v) * 16;
      const auto msafe = wide_new_max(sc, o, wide_mask_max(it, sc, kt0, nk, Rp, o, full, sfac));
      auto sum = hn::Zero(d);
      for (int kk = 0; kk < npair; ++kk) {
        __m512i half[2];
        for (int e = 0; e < 2; ++e) {
          const int k = 2 * kk + e;
          __m512 p = _mm512_setzero_ps();
          if (k < nk) {
            p = dp_exp(_mm512_sub_ps(_mm512_load_ps(sc->s + static_cast<size_t>(k) * Rp + o),
                                     msafe.raw));
            // Round to bf16 (to nearest even) so l sums exactly the weights P.V uses.
            const __m512i u = _mm512_castps_si512(p);
            const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            p = _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)),
                _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
          }
          sum = hn::Add(sum, hn::Vec<DF>{p});
          half[e] = _mm512_srli_epi32(_mm512_castps_si512(p), 16);
        }
        _mm512_store_si512(pT2 + static_cast<size_t>(kk) * Rp + o,
                           _mm512_or_si512(half[0], _mm512_slli_epi32(half[1], 16)));
      }
      hn::Store(hn::MulAdd(hn::Load(d, sc->l + o), hn::Load(d, sc->alpha + o), sum), d, sc->l + o);
    }
    for (int x = 0; x < Dw; ++x) {
      float* ap = accT + static_cast<size_t>(x) * Rp;
      for (int v = 0; v < Rv; ++v)
        hn::Store(hn::Mul(hn::Load(d, ap + v * 16), hn::Load(d, sc->alpha + v * 16)), d, ap + v * 16);
    }
    dpw_v_pairs<DT>(vp, D, npair, vt2, L);
    if (use_amx) {
      // A tile multiplies all 16 key pairs: those past the tile's keys are zero on both sides
      // (stale or never written scratch could hold inf or NaN, and 0 * inf is NaN).
      for (int kk = npair; kk < 16; ++kk) {
        memset(pT2 + static_cast<size_t>(kk) * Rp, 0, sizeof(uint32_t) * static_cast<size_t>(Rp));
        memset(vt2 + static_cast<size_t>(kk) * Dw, 0, sizeof(uint32_t) * static_cast<size_t>(Dw));
      }
      for (int x = 0; x < Dw; x += 16) transpose16_epi32(vt2 + x, Dw, vA + static_cast<size_t>(x) * 16);
      dpw_amx_pv(accT, pT2, vA, Dw, Rp, Rv);
      continue;
    }
    int rv = 0;
    for (; rv + 4 <= Rv; rv += 4) dpw_accumulate<4>(accT, pT2, vt2, Dw, Rp, rv, npair);
    switch (Rv - rv) {
      case 3: dpw_accumulate<3>(accT, pT2, vt2, Dw, Rp, rv, npair); break;
      case 2: dpw_accumulate<2>(accT, pT2, vt2, Dw, Rp, rv, npair); break;
      case 1: dpw_accumulate<1>(accT, pT2, vt2, Dw, Rp, rv, npair); break;
      default: break;
    }
  }

  if (use_amx) _tile_release();
  // Rows back out of accT in natural dim order (times fp8's V scale), then the output pass.
  const float vf = dp_fp8(DT) ? it.kv.v_scale : 1.0f;
  float* acc_rows = sc->q;  // qT2 is no longer needed
  for (int r = 0; r < rows; ++r) {
    float* a = acc_rows + static_cast<size_t>(r) * D;
    for (int x = 0; x < Dw; ++x) {
      const int dim = (x & ~63) + dp_dim<DT>(x & 63);  // padding positions hold zeros
      if (dim < D) a[dim] = accT[static_cast<size_t>(x) * Rp + r] * vf;
    }
  }
  write_rows(it, acc_rows, sc->m, sc->l, D);
}

// fp8 -> bf16 as the dot-product decode reads K, back in natural order and widened to float32
// (exact, unscaled), for the exhaustive conversion test. n a multiple of 64.
template <int DT>
PA_DP_ATTR HWY_NOINLINE void ConvertDpForTest(const void* src, float* dst, int n) {
  const Fp8Lut L = fp8_lut<DT>();
  for (int i = 0; i < n; i += 64) {
    __m512i w[2];
    fp8_bf16(L, _mm512_loadu_si512(static_cast<const uint8_t*>(src) + i), w[0], w[1]);
    alignas(64) uint16_t words[64];
    _mm512_store_si512(words, w[0]);
    _mm512_store_si512(words + 32, w[1]);
    for (int x = 0; x < 64; ++x) dst[i + dp_q_dim_fp8(x)] = bf16_to_f32(words[x]);
  }
}
#endif  // HWY_TARGET == HWY_AVX3_DL

// Whether AttentionItemDot runs the item in registers (DT >= 0): a cache dtype it converts
// there, a head size of whole vectors.
HWY_INLINE bool dot_in_registers(const AttnItem& it) {
  switch (it.kv.dtype) {
    case PAGEDATTN_DTYPE_FLOAT32:
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16:
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: break;
    default: return false;
  }
  return it.head_size % static_cast<int>(hn::Lanes(DF())) == 0;
}

// An item of several KV heads (one token) runs whole: on the bf16 dot-product decode where dp is
// on and it takes the dtypes, else in AttentionItemDot's registers (any dtype it converts there,
// over a paged cache: a later head's rows are the first head's plus a fixed offset).
bool MultiHeadDecodeOk(const AttnItem& it, bool dp) {
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.tok1 - it.tok0 != 1 || rows > kMaxRows) return false;
#ifdef PA_DP
  if (dp && dp_eligible(it)) return true;
#endif
  (void)dp;
  return it.kv.table != nullptr && dot_in_registers(it);
}

// An fp8 cache row in the widest chunks this target reads it in: 4 vectors (AVX3 byte lookups),
// 2 (AVX2 widening 16 bytes at once), else one at a time.
template <int DT>
void AttentionItemFp8(const AttnItem& it, Scratch* sc) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  constexpr bool kE4M3 = DT == PAGEDATTN_DTYPE_FP8_E4M3;
  if (PA_FP8_QUADS && it.head_size % (4 * N) == 0) {
    AttentionItemDot<kE4M3 ? kE4M3Quads : kE5M2Quads>(it, sc);
  } else if (PA_FP8_PAIRS && it.head_size % (2 * N) == 0) {
    AttentionItemDot<kE4M3 ? kE4M3Pairs : kE5M2Pairs>(it, sc);
  } else {
    AttentionItemDot<DT>(it, sc);
  }
}

// dp: 0 none, 1 AVX512_BF16 dot products, 2 those with fp8 caches' decode on AMX tiles.
void AttentionItem(const AttnItem& it, Scratch* sc, int dp) {
  if (it.kv_heads > 1 && !MultiHeadDecodeOk(it, dp != 0)) {
    // Not a path that reads several heads at once: one KV head at a time (rows stay in order).
    const int G = (it.h1 - it.h0) / it.kv_heads;
    for (int h = 0; h < it.kv_heads; ++h) {
      AttnItem one = it;
      one.kv_heads = 1;
      one.kv_head = it.kv_head + h;
      one.h0 = it.h0 + h * G;
      one.h1 = one.h0 + G;
      if (it.out == nullptr) {
        one.part_acc = it.part_acc + static_cast<size_t>(h) * G * it.head_size;
        one.part_m = it.part_m + h * G;
        one.part_l = it.part_l + h * G;
      }
      AttentionItem(one, sc, dp);
    }
    return;
  }
#ifdef PA_DP
  if (dp && it.kv_heads <= 1 && (it.h1 - it.h0) * (it.tok1 - it.tok0) >= 16 &&
      dp_wide_eligible(it)) {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_BFLOAT16: AttentionItemWideDp<PAGEDATTN_DTYPE_BFLOAT16>(it, sc, dp == 2); return;
      case PAGEDATTN_DTYPE_FP8_E4M3: AttentionItemWideDp<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc, dp == 2); return;
      case PAGEDATTN_DTYPE_FP8_E5M2: AttentionItemWideDp<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc, dp == 2); return;
      default: break;
    }
  }
  if (dp && dp_eligible(it)) {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_BFLOAT16:
        AttentionItemDp<PAGEDATTN_DTYPE_BFLOAT16>(it, sc, dp == 2);
        return;
      case PAGEDATTN_DTYPE_FP8_E4M3:
        AttentionItemDp<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc, dp == 2);
        return;
      case PAGEDATTN_DTYPE_FP8_E5M2:
        AttentionItemDp<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc, dp == 2);
        return;
      default: break;
    }
  }
#endif
  (void)dp;
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.kv_heads <= 1 && rows >= static_cast<int>(hn::Lanes(DF()))) {
    AttentionItemWide(it, sc);
  } else if (it.head_size % static_cast<int>(hn::Lanes(DF())) != 0) {
    AttentionItemDot<-1>(it, sc);
  } else {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_FLOAT32: AttentionItemDot<PAGEDATTN_DTYPE_FLOAT32>(it, sc); break;
      case PAGEDATTN_DTYPE_FLOAT16: AttentionItemDot<PAGEDATTN_DTYPE_FLOAT16>(it, sc); break;
      case PAGEDATTN_DTYPE_BFLOAT16:
        if (it.head_size % (2 * static_cast<int>(hn::Lanes(DF()))) == 0) {
          AttentionItemDot<kBF16Pairs>(it, sc);
        } else {
          AttentionItemDot<PAGEDATTN_DTYPE_BFLOAT16>(it, sc);
        }
        break;
      case PAGEDATTN_DTYPE_FP8_E4M3: AttentionItemFp8<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc); break;
      case PAGEDATTN_DTYPE_FP8_E5M2: AttentionItemFp8<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc); break;
      default: AttentionItemDot<-1>(it, sc); break;
    }
  }
}

// The conversions as the kernels run them, for the exhaustive conversion test: in registers one
// vector at a time (mode 0; fp8 unscaled, as load_fp8), through load_row with scale 1 (mode 1),
// or in registers as the fp8 chunk paths read them: 4N at a time (quads) or 2N (pairs), whichever
// this target has (mode 2; one vector at a time where it has neither or n is not a multiple).
template <int DT>
HWY_INLINE void convert_vecs(const void* src, float* dst, int n, bool chunks) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
#if PA_FP8_QUADS
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3 || DT == PAGEDATTN_DTYPE_FP8_E5M2) {
    if (chunks && n % (4 * N) == 0) {
      for (int i = 0; i < n; i += 4 * N) {
        hn::Vec<DF> v[4];
        load_fp8_quad<DT>(src, i, v);
        for (int c = 0; c < 4; ++c) hn::StoreU(v[c], d, dst + i + c * N);
      }
      return;
    }
  }
#endif
#if PA_FP8_PAIRS
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3 || DT == PAGEDATTN_DTYPE_FP8_E5M2) {
    if (chunks && n % (2 * N) == 0) {
      constexpr int kPairs = DT == PAGEDATTN_DTYPE_FP8_E4M3 ? kE4M3Pairs : kE5M2Pairs;
      for (int i = 0; i < n; i += 2 * N) {
        hn::Vec<DF> lo, hi;
        load_pair<kPairs>(src, i, lo, hi);
        hn::StoreU(lo, d, dst + i);
        hn::StoreU(hi, d, dst + i + N);
      }
      return;
    }
  }
#endif
  (void)chunks;
  for (int i = 0; i + N <= n; i += N) hn::StoreU(load_vec<DT>(src, i), d, dst + i);
}

void ConvertForTest(pagedattn_dtype dt, int mode, const void* src, float* dst, int n) {
  if (mode == 1) {
    load_row(src, dt, 1.0f, dst, n);
    return;
  }
  if (mode == 3) {
#ifdef PA_DP
    if (dt == PAGEDATTN_DTYPE_FP8_E4M3) ConvertDpForTest<PAGEDATTN_DTYPE_FP8_E4M3>(src, dst, n);
    if (dt == PAGEDATTN_DTYPE_FP8_E5M2) ConvertDpForTest<PAGEDATTN_DTYPE_FP8_E5M2>(src, dst, n);
#endif
    return;
  }
  const bool chunks = mode == 2;
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT16: convert_vecs<PAGEDATTN_DTYPE_FLOAT16>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_BFLOAT16: convert_vecs<PAGEDATTN_DTYPE_BFLOAT16>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_FP8_E4M3: convert_vecs<PAGEDATTN_DTYPE_FP8_E4M3>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_FP8_E5M2: convert_vecs<PAGEDATTN_DTYPE_FP8_E5M2>(src, dst, n, chunks); break;
    default: break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pa_cpu {

HWY_EXPORT(AttentionItem);
HWY_EXPORT(MultiHeadDecodeOk);
HWY_EXPORT(ConvertForTest);
HWY_EXPORT(StoreCacheRow);

void store_cache_row(uint32_t target_index, void* dst, pagedattn_dtype ddt, const void* src,
                     pagedattn_dtype sdt, int n, float scale) {
  HWY_DISPATCH_TABLE(StoreCacheRow)[target_index](dst, ddt, src, sdt, n, scale);
}

void convert_for_test(uint32_t target_index, pagedattn_dtype dt, int mode, const void* src,
                      float* dst, int n) {
  HWY_DISPATCH_TABLE(ConvertForTest)[target_index](dt, mode, src, dst, n);
}

bool multi_head_decode_ok(const Target& target, const AttnItem& item) {
  return HWY_DISPATCH_TABLE(MultiHeadDecodeOk)[target.index](item, target.bf16_dp);
}

void attention_item(const Target& target, const AttnItem& item, Scratch* scratch) {
  scratch->prefetch_twice = target.prefetch_twice;
  HWY_DISPATCH_TABLE(AttentionItem)[target.index](item, scratch,
                                                   target.amx ? 2 : (target.bf16_dp ? 1 : 0));
}

void attention_merge_parts(uint32_t /*target_index*/, const AttnItem& it, int n, const float* acc,
                           int64_t part_stride, const float* m, const float* l,
                           int64_t ml_stride) {
  // Runs once per split item group over rows x D floats: scalar is plenty next to the key loop.
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      float mx = kNegInf;
      for (int p = 0; p < n; ++p) mx = std::max(mx, m[p * ml_stride + r]);
      float w[kMaxSplits];
      float total = 0.0f;
      for (int p = 0; p < n; ++p) {
        const float mp = m[p * ml_stride + r];
        w[p] = mp == kNegInf ? 0.0f : expf(mp - mx);
        total += w[p] * l[p * ml_stride + r];
      }
      const float inv = total > 0.0f ? 1.0f / total : 0.0f;
      char* op = item_out(it, t, g);
      for (int i = 0; i < D; ++i) {
        float x = 0.0f;
        for (int p = 0; p < n; ++p) {
          if (w[p] != 0.0f) x += w[p] * acc[p * part_stride + static_cast<int64_t>(r) * D + i];
        }
        store_elem(op, i, it.dtype, x * inv, 1.0f);
      }
      if (it.lse != nullptr) {
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] =
            total > 0.0f ? mx + logf(total) : kNegInf;
      }
    }
  }
}

}  // namespace pa_cpu
#endif  // HWY_ONCE
