// kernels/cpu/wide_rows-inl.h — the row-vectorised path (AttentionItemWide; rows >= vector length:
// prefill tiles, wide GQA groups), with the per-row key ranges and masks that the bf16 wide path
// (wide_dp-inl.h) shares.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_WIDE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_WIDE_ROWS_INL_H_
#undef PA_CPU_WIDE_ROWS_INL_H_
#else
#define PA_CPU_WIDE_ROWS_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "convert-inl.h"
#include "tile-inl.h"
#include "variant-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Vectors run over the item's rows: qT[d][r], s[k][r], accT[d][r]. Scores and P.V become
// register-blocked outer products (no horizontal sums) and the softmax, masks, ALiBi and soft cap
// are vectorised over rows.

// Row vectors per register block of wide_scores and wide_accumulate: 4 x RB accumulators, RB
// operand vectors and a broadcast. AVX2's 16 registers hold RB 3 exactly (RB 4 spills the
// accumulators on every FMA); SSE4 (no FMA) measured no faster with 2.
constexpr int kWideRB = HWY_ARCH_X86 && hn::MaxLanes(DF()) == 8 ? 3 : 4;

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

// accT[d][rows] = accT[d][rows] * alpha[rows] + sum_k vt[k][d] * p[k][rows] for RB row vectors
// from rv0 (the online softmax's rescale folded into the accumulators' load).
template <int RB>
HWY_INLINE void wide_accumulate(float* HWY_RESTRICT accT, const float* HWY_RESTRICT alpha,
                                const float* HWY_RESTRICT p, const float* HWY_RESTRICT vt, int D,
                                int Dp, int Rp, int rv0, int nk) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int x0 = 0; x0 < D; x0 += 4) {
    hn::Vec<DF> a[4][RB];
    HWY_UNROLL(4)
    for (int i = 0; i < 4; ++i)
      HWY_UNROLL(4)
      for (int j = 0; j < RB; ++j)
        a[i][j] = hn::Mul(hn::Load(d, accT + static_cast<size_t>(x0 + i) * Rp + (rv0 + j) * N),
                          hn::Load(d, alpha + (rv0 + j) * N));
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
    sc->posf[r] = static_cast<float>(item_pos(it, t));
    sc->slope[r] = it.alibi != nullptr ? it.alibi[it.h0 + g] : 0.0f;
    w.kbeg = std::min(w.kbeg, lo);
    w.kend = std::max(w.kend, hi + 1);
    w.max_lo = std::max(w.max_lo, sc->lo[r]);
    w.min_hi = std::min<int64_t>(w.min_hi, std::min(hi, item_row_dense_hi(it, t)));
  }
  return w;
}

// The lanes of row vector o (rows r = t * nh + g) whose tokens' tree masks let them see new-token
// key kp (variant-inl.h item_tree_sees); padding rows see nothing.
template <class DI>
HWY_INLINE hn::Mask<DI> tree_lanes(const AttnItem& it, DI di, size_t o, int64_t kp) {
  const int nh = it.h1 - it.h0;
  const int rows = nh * (it.tok1 - it.tok0);
  HWY_ALIGN int32_t vis[kMaxRows];
  const size_t n = hn::Lanes(di);
  for (size_t i = 0; i < n; ++i) {
    const int r = static_cast<int>(o + i);
    vis[i] = r < rows && item_tree_sees(it, r / nh, kp) ? 1 : 0;
  }
  return hn::Ne(hn::Load(di, vis), hn::Zero(di));
}

// Row-vectorised masking of one key tile for row vector o (N rows): scores times sfac, soft cap,
// ALiBi, causal/window visibility (-inf outside); returns the tile's max per row, NaN for a row
// that sees a NaN score. full: every row sees every key of the tile and nothing is added (scale
// only).
HWY_INLINE hn::Vec<DF> wide_mask_max(const AttnItem& it, Scratch* sc, int64_t kt0, int nk, int Rp,
                                     size_t o, bool full, float sfac) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto vsfac = hn::Set(d, sfac);
  auto mt = ninf;
  auto nan = hn::IsNaN(mt);
  if (full) {
    for (int k = 0; k < nk; ++k) {
      float* sp = sc->s + static_cast<size_t>(k) * Rp + o;
      auto x = hn::Load(d, sp);
      if (sfac != 1.0f) {
        x = hn::Mul(x, vsfac);
        hn::Store(x, d, sp);
      }
      mt = hn::Max(mt, x);
      nan = hn::Or(nan, hn::IsNaN(x));
    }
    return hn::IfThenElse(nan, hn::Set(d, std::numeric_limits<float>::quiet_NaN()), mt);
  }
  const auto lo = hn::Load(di, sc->lo + o), hi = hn::Load(di, sc->hi + o);
  const auto posf = hn::Load(d, sc->posf + o), slope = hn::Load(d, sc->slope + o);
  const auto cap = hn::Set(d, it.soft_cap);
  const auto inv_cap = hn::Set(d, it.soft_cap > 0.0f ? 1.0f / it.soft_cap : 0.0f);
  const bool alibi = it.alibi != nullptr;
  for (int k = 0; k < nk; ++k) {
    float* sp = sc->s + static_cast<size_t>(k) * Rp + o;
    auto x = hn::Load(d, sp);
    if (sfac != 1.0f) x = hn::Mul(x, vsfac);
    x = rows_logits(d, x, it.soft_cap, cap, inv_cap, alibi, slope, kt0 + k, posf);
    auto see = rows_see(di, kt0 + k, lo, hi);
    if (it.tree != nullptr && kt0 + k >= it.pos_offset) see = hn::And(see, tree_lanes(it, di, o, kt0 + k));
    x = hn::IfThenElse(hn::RebindMask(d, see), x, ninf);
    hn::Store(x, d, sp);
    mt = hn::Max(mt, x);
    nan = hn::Or(nan, hn::IsNaN(x));
  }
  return hn::IfThenElse(nan, hn::Set(d, std::numeric_limits<float>::quiet_NaN()), mt);
}

// The new running max of row vector o given the tile's max mt: stores m and alpha (the factor
// for the old accumulators) and returns the value to subtract before exp (0 for rows that have
// seen nothing yet, so exp gives 0 rather than NaN; +inf for poisoned rows, whose NaN or +inf max
// sticks, so their weights and alpha are 0 and the output pass writes NaN).
HWY_INLINE hn::Vec<DF> wide_new_max(Scratch* sc, size_t o, hn::Vec<DF> mt) {
  const DF d;
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto pinf = hn::Set(d, std::numeric_limits<float>::infinity());
  const auto mold = hn::Load(d, sc->m + o);
  const auto nan = hn::Or(hn::IsNaN(mold), hn::IsNaN(mt));
  const auto mnew =
      hn::IfThenElse(nan, hn::Set(d, std::numeric_limits<float>::quiet_NaN()), hn::Max(mold, mt));
  const auto msafe = hn::IfThenElse(
      hn::Eq(mnew, ninf), hn::Zero(d), hn::IfThenElse(hn::Lt(mnew, pinf), mnew, pinf));
  hn::Store(mnew, d, sc->m + o);
  hn::Store(hn::Exp(d, hn::Sub(mold, msafe)), d, sc->alpha + o);
  return msafe;
}

// Defined only in the unit that compiles this target's entry points (entry-inl.h), its caller.
#if HWY_TARGET == PA_CPU_UNIT
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
    for (; rv + kWideRB <= Rv; rv += kWideRB)
      wide_scores<kWideRB>(qT, sc->kt, D, Dp, Rp, rv, nk4, sc->s);
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
        const auto p = exp_weights(d, hn::Sub(hn::Load(d, sp), msafe));
        hn::Store(p, d, sp);
        sum = hn::Add(sum, p);
      }
      hn::Store(hn::MulAdd(hn::Load(d, sc->l + o), hn::Load(d, sc->alpha + o), sum), d, sc->l + o);
    }
    // P.V, the accumulators rescaled by alpha (rows whose max moved) as they are loaded.
    load_tile(it, true, kt0, nk, sc->vt, Dp, 0);
    rv = 0;
    for (; rv + kWideRB <= Rv; rv += kWideRB)
      wide_accumulate<kWideRB>(accT, sc->alpha, sc->s, sc->vt, D, Dp, Rp, rv, nk);
    switch (Rv - rv) {
      case 3: wide_accumulate<3>(accT, sc->alpha, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
      case 2: wide_accumulate<2>(accT, sc->alpha, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
      case 1: wide_accumulate<1>(accT, sc->alpha, sc->s, sc->vt, D, Dp, Rp, rv, nk); break;
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
    const RowNorm nr = row_norm(sc->m[r], sc->l[r], item_sink(it, g));
    store_row(item_out(it, t, g), it.dtype, row, nr.inv, D);
    if (it.lse != nullptr)
      it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] = nr.lse;
  }
}
#endif  // HWY_TARGET == PA_CPU_UNIT

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_WIDE_ROWS_INL_H_
