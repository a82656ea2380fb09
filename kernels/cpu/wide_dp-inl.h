// kernels/cpu/wide_dp-inl.h — AttentionItemWideDp, the bf16 wide path: vdpbf16ps outer products
// (wide_bf16-inl.h) or AMX tiles (wide_amx-inl.h).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include <algorithm>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_WIDE_DP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_WIDE_DP_INL_H_
#undef PA_CPU_WIDE_DP_INL_H_
#else
#define PA_CPU_WIDE_DP_INL_H_
#endif

#include <hwy/highway.h>

#include "tile-inl.h"
#include "wide_rows-inl.h"
#include "decode_rows-inl.h"
#include "decode_bf16-inl.h"
#include "wide_bf16-inl.h"
#include "wide_amx-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP  // AVX3_DL (decode_bf16-inl.h)

// The bf16 wide path of one item (dp_wide_eligible). use_amx: scores and P.V on AMX tiles
// (dpw_amx_*), a bf16 head's K rows copied zero padded to whole tile rows of 32 dims; else
// vdpbf16ps. One function, as AttentionItemDp, for the same reason.
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

#endif  // PA_DP

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_WIDE_DP_INL_H_
