// kernels/cpu/wide_amx-inl.h — the wide path's scores and P.V on AMX-BF16 tiles (AVX3_AMX).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <stddef.h>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_WIDE_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_WIDE_AMX_INL_H_
#undef PA_CPU_WIDE_AMX_INL_H_
#else
#define PA_CPU_WIDE_AMX_INL_H_
#endif

#include <hwy/highway.h>

#include "decode_amx-inl.h"
#include "wide_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP  // AVX3_DL (decode_bf16-inl.h)

// Same layouts as the vdpbf16ps loops (wide_bf16-inl.h), so the masks, the softmax and the
// output pass are shared. Scores: K rows (16 keys x 32 dims, bf16) as A times qT2 (16 dim pairs x
// 16 rows) as B give s[k][r] 16 x 16 at a time. P.V: V^T (16 accumulator positions x 16 key
// pairs, the transposed vt2) as A times pT2 (16 key pairs x 16 rows) as B add into accT. One tile
// op does 16 x 16 x 32 multiply-adds, where vdpbf16ps does 16 x 2. Every tile is 16 rows of 64
// bytes (dp_amx_configure(16)).

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

#endif  // PA_DP

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_WIDE_AMX_INL_H_
