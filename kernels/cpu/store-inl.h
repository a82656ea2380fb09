// kernels/cpu/store-inl.h — cache stores (reshape-and-cache): float32, float16 or bf16 rows to the
// cache dtype, bit for bit what store_elem (convert.h) gives; entry-inl.h's StoreCacheRow is the
// per-target entry point that runs it.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_STORE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_STORE_INL_H_
#undef PA_CPU_STORE_INL_H_
#else
#define PA_CPU_STORE_INL_H_
#endif

#include <hwy/highway.h>

#include "convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

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
  // (NearestInt's fix-up for large inputs costs four ops per vector).
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
// by 1 / scale where that is exact (scale 1, the usual case; a division is a large part of the
// conversion's time), else a division.
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

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_STORE_INL_H_
