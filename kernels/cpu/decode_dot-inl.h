// kernels/cpu/decode_dot-inl.h — the dot-product path (AttentionItemDot; fewer rows than a vector:
// decode with small GQA groups), on every target.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_DECODE_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_DECODE_DOT_INL_H_
#undef PA_CPU_DECODE_DOT_INL_H_
#else
#define PA_CPU_DECODE_DOT_INL_H_
#endif

#include <hwy/highway.h>

#include "convert-inl.h"
#include "tile-inl.h"
#include "prefetch-inl.h"
#include "decode_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

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

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_DECODE_DOT_INL_H_
