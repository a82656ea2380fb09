// kernels/cpu/wide_bf16-inl.h — bf16 dot products for many rows (prefill tiles, wide GQA groups):
// outer products.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_WIDE_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_WIDE_BF16_INL_H_
#undef PA_CPU_WIDE_BF16_INL_H_
#else
#define PA_CPU_WIDE_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include "decode_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP  // AVX3_DL (decode_bf16-inl.h)

// The row-vectorised path with vdpbf16ps: vectors run over 16 rows and pair two dims (scores) or
// two keys (P.V), so each instruction does 32 of the multiply-adds an FMA does 16 of. K is read
// straight from a bf16 cache (fp8: converted once per tile), V rows are interleaved in key pairs
// per tile, q and the weights are rounded to bf16 as in the decode path.

// Dot-product wide path eligibility: the decode path's dtype rules, any row count up to kMaxRows.
HWY_INLINE bool dp_wide_eligible(const AttnItem& it) {
  // Any even head size: the last group of dims (bf16 32, fp8 64) is padded with zeros
  // (dpw_width), which still beats the float32 path.
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

#endif  // PA_DP

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_WIDE_BF16_INL_H_
