// kernels/cpu/mla-inl.h — multi-head latent attention over a latent cache, one work item: every
// (token, head) row of the item reads each key's one latent row, so a tile of keys is loaded and
// converted to float32 once for all of them. Scores are a small GEMM (rows x keys over the D
// values of a row), the weighted sum another (rows x R over the keys), both in float32 on
// register blocks; an online softmax between them as the other kernels run it.
//
// Included by entry-inl.h alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <math.h>
#include <string.h>

#include <limits>

#include "convert.h"
#include "kernels.h"
#include "variant.h"

#if defined(PA_CPU_MLA_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_MLA_INL_H_
#undef PA_CPU_MLA_INL_H_
#else
#define PA_CPU_MLA_INL_H_
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

// Rows per register block: four with 32 vector registers, two with 16.
#if HWY_TARGET <= HWY_AVX3
constexpr int kMlaRowBlock = 4;
#else
constexpr int kMlaRowBlock = 2;
#endif

// Keeps v in a register. Without it GCC folds the load of a query vector into each of the KC
// FMAs that use it: KC loads where one does, and the score loop becomes load-bound.
template <class V>
HWY_INLINE void mla_pin(V& v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  asm("" : "+v"(v.raw));
#elif HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3)
  asm("" : "+x"(v.raw));
#else
  (void)v;
#endif
}

// s[r][j] = q[r] . k[j] over D values for RA rows from r0 and KC keys from j0.
template <int RA, int KC>
HWY_INLINE void mla_score_block(const float* HWY_RESTRICT q, int D, int r0,
                                const float* const* krow, int j0, float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<decltype(d)> acc[RA][KC];
  for (int a = 0; a < RA; ++a)
    for (int c = 0; c < KC; ++c) acc[a][c] = hn::Zero(d);
  const float* qr[RA];
  for (int a = 0; a < RA; ++a) qr[a] = q + static_cast<size_t>(r0 + a) * D;
  for (int i = 0; i < D; i += N) {
    hn::Vec<decltype(d)> kv[KC];
    for (int c = 0; c < KC; ++c) kv[c] = hn::LoadU(d, krow[j0 + c] + i);
    for (int a = 0; a < RA; ++a) {
      auto qv = hn::LoadU(d, qr[a] + i);
      if (KC > 1) mla_pin(qv);
      for (int c = 0; c < KC; ++c) acc[a][c] = hn::MulAdd(qv, kv[c], acc[a][c]);
    }
  }
  for (int a = 0; a < RA; ++a)
    for (int c = 0; c < KC; ++c)
      s[(r0 + a) * kMlaKeyTile + j0 + c] = hn::GetLane(hn::SumOfLanes(d, acc[a][c]));
}

template <int RA>
HWY_INLINE void mla_score_rows(const float* q, int D, int r0, const float* const* krow, int nk,
                               float* s) {
  int j = 0;
  for (; j + 4 <= nk; j += 4) mla_score_block<RA, 4>(q, D, r0, krow, j, s);
  for (; j < nk; ++j) mla_score_block<RA, 1>(q, D, r0, krow, j, s);
}

// Scores of every row against the tile's nk keys.
HWY_INLINE void mla_scores(const float* q, int rows, int D, const float* const* krow, int nk,
                           float* s) {
  int r = 0;
  for (; r + kMlaRowBlock <= rows; r += kMlaRowBlock)
    mla_score_rows<kMlaRowBlock>(q, D, r, krow, nk, s);
  for (; r < rows; ++r) mla_score_rows<1>(q, D, r, krow, nk, s);
}

// acc[r][d0 .. d0 + VC*N) += sum_j p[r][j] * v[j][d0 ..] for RA rows from r0.
template <int RA, int VC>
HWY_INLINE void mla_pv_block(float* HWY_RESTRICT acc, int R, int r0, const float* HWY_RESTRICT p,
                             const float* const* krow, int nk, int d0) {
  const hn::ScalableTag<float> d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<decltype(d)> o[RA][VC];
  for (int a = 0; a < RA; ++a)
    for (int c = 0; c < VC; ++c)
      o[a][c] = hn::LoadU(d, acc + static_cast<size_t>(r0 + a) * R + d0 + c * N);
  for (int j = 0; j < nk; ++j) {
    hn::Vec<decltype(d)> v[VC];
    for (int c = 0; c < VC; ++c) v[c] = hn::LoadU(d, krow[j] + d0 + c * N);
    for (int a = 0; a < RA; ++a) {
      const auto w = hn::Set(d, p[(r0 + a) * kMlaKeyTile + j]);
      for (int c = 0; c < VC; ++c) o[a][c] = hn::MulAdd(w, v[c], o[a][c]);
    }
  }
  for (int a = 0; a < RA; ++a)
    for (int c = 0; c < VC; ++c)
      hn::StoreU(o[a][c], d, acc + static_cast<size_t>(r0 + a) * R + d0 + c * N);
}

template <int RA>
HWY_INLINE void mla_pv_rows(float* acc, int R, int r0, const float* p, const float* const* krow,
                            int nk) {
  const hn::ScalableTag<float> d;
  const int N = static_cast<int>(hn::Lanes(d));
  int d0 = 0;
  for (; d0 + 4 * N <= R; d0 += 4 * N) mla_pv_block<RA, 4>(acc, R, r0, p, krow, nk, d0);
  for (; d0 + N <= R; d0 += N) mla_pv_block<RA, 1>(acc, R, r0, p, krow, nk, d0);
}

// Every row's accumulators += its weights times the tile's values (the rows' leading R values).
HWY_INLINE void mla_pv(float* acc, int rows, int R, const float* p, const float* const* krow,
                       int nk) {
  int r = 0;
  for (; r + kMlaRowBlock <= rows; r += kMlaRowBlock)
    mla_pv_rows<kMlaRowBlock>(acc, R, r, p, krow, nk);
  for (; r < rows; ++r) mla_pv_rows<1>(acc, R, r, p, krow, nk);
}

// One row's scores of a tile of nk keys from key k0 -> weights, in place, with its running max
// m and sum l (online softmax); returns the factor its accumulators must be scaled by. Keys the
// row does not see weigh 0.
HWY_INLINE float mla_softmax_row(const AttnItem& it, int t, int g, int64_t k0, int nk,
                                 float* HWY_RESTRICT s, float* m, float* l) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const int N = static_cast<int>(hn::Lanes(d));
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t pos = item_pos(it, t);
  const int64_t lo = item_row_lo(it, t), hi = item_row_hi(it, t);
  const bool has_alibi = it.alibi != nullptr;
  const auto cap = hn::Set(d, it.soft_cap);
  const auto inv_cap = hn::Set(d, it.soft_cap > 0.0f ? 1.0f / it.soft_cap : 0.0f);
  const auto slope = hn::Set(d, has_alibi ? it.alibi[it.h0 + g] : 0.0f);
  const auto rel0 = hn::Set(d, static_cast<float>(k0 - pos));  // key - pos of the tile's first
  // The visible keys [lo, hi] as offsets from k0, clamped to the tile's nk keys.
  const auto vlo = hn::Set(
      di, static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(lo - k0, 0), kMlaKeyTile)));
  const auto vhi =
      hn::Set(di, static_cast<int32_t>(std::max<int64_t>(std::min<int64_t>(hi - k0, nk - 1), -1)));
  for (int j = 0; j < kMlaKeyTile; j += N) {
    const auto idx = hn::Add(hn::Iota(di, 0), hn::Set(di, j));
    const auto see = hn::And(hn::Not(hn::Lt(idx, vlo)), hn::Not(hn::Lt(vhi, idx)));
    auto x = hn::LoadU(d, s + j);
    if (it.soft_cap > 0.0f) x = hn::Mul(cap, hn::Tanh(d, hn::Mul(x, inv_cap)));
    if (has_alibi) x = hn::MulAdd(slope, hn::Add(rel0, hn::ConvertTo(d, idx)), x);
    hn::StoreU(hn::IfThenElse(hn::RebindMask(d, see), x, hn::Set(d, kNegInf)), d, s + j);
  }
  // A tree mask hides some of the sequence's new tokens one by one.
  if (it.tree != nullptr) {
    for (int j = 0; j < nk; ++j)
      if (!item_tree_sees(it, t, k0 + j)) s[j] = kNegInf;
  }
  auto vmax = hn::Set(d, kNegInf);
  bool nan = false;
  for (int j = 0; j < kMlaKeyTile; j += N) {
    const auto x = hn::LoadU(d, s + j);
    nan = nan || !hn::AllFalse(d, hn::IsNaN(x));
    vmax = hn::Max(vmax, x);
  }
  const float mx = nan ? __builtin_nanf("") : hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float m_old = *m;
  const float m_new = max_keep_nan(m_old, mx);
  if (m_new == kNegInf) {
    // No key seen yet: nothing weighs, nothing to rescale.
    for (int j = 0; j < kMlaKeyTile; ++j) s[j] = 0.0f;
    return 1.0f;
  }
  const auto vm = hn::Set(d, m_new);
  auto vsum = hn::Zero(d);
  for (int j = 0; j < kMlaKeyTile; j += N) {
    // exp(-inf - m) = 0 for the keys the row does not see.
    const auto p = exp_weights(d, hn::Sub(hn::LoadU(d, s + j), vm));
    hn::StoreU(p, d, s + j);
    vsum = hn::Add(vsum, p);
  }
  const float alpha = m_old == kNegInf ? 0.0f : expf(m_old - m_new);
  *l = *l * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
  *m = m_new;
  return alpha;
}

HWY_INLINE void mla_scale_row(float* HWY_RESTRICT row, int n, float alpha) {
  const hn::ScalableTag<float> d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  for (int i = 0; i < n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, row + i), va), d, row + i);
}

// The item's query rows, scaled, into q: [rows][D] float32.
HWY_INLINE void mla_load_q(const MlaItem& m, float* HWY_RESTRICT q) {
  const AttnItem& it = m.a;
  const int D = it.head_size, R = m.value_size;
  const int nh = it.h1 - it.h0, ntok = it.tok1 - it.tok0;
  const int lead = m.q_pe != nullptr ? R : D;
  const int64_t esz = static_cast<int64_t>(elem_size(it.dtype));
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      float* dst = q + static_cast<size_t>(t * nh + g) * D;
      load_row(item_q(it, t, g), it.dtype, 1.0f, dst, lead);
      if (m.q_pe != nullptr) {
        const char* pe = static_cast<const char*>(m.q_pe) +
                         ((it.q_row0 + t) * m.q_pe_row_stride +
                          (it.h0 + g) * m.q_pe_head_stride) * esz;
        load_row(pe, it.dtype, 1.0f, dst + R, D - R);
      }
      mla_scale_row(dst, D, it.scale);
    }
  }
}

// Key kp's latent row in the cache.
HWY_INLINE const char* mla_row(const KVSource& kv, int64_t kp, int64_t esz) {
  return static_cast<const char*>(kv.k) +
         (static_cast<int64_t>(kv.table[kp / kv.block_size]) * kv.block_stride +
          (kp % kv.block_size) * kv.slot_stride) * esz;
}

// Runs one MLA item (see kernels.h). Defined only in the unit that compiles this target's entry
// points (entry-inl.h), its caller.
#if HWY_TARGET == PA_CPU_UNIT
HWY_NOINLINE void mla_run(const MlaItem& m, float* HWY_RESTRICT scratch) {
  const AttnItem& it = m.a;
  const int D = it.head_size, R = m.value_size;
  const int nh = it.h1 - it.h0, ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  const MlaLayout L = mla_layout(rows, D, R);
  float* q = scratch + L.q;
  float* acc = scratch + L.acc;
  float* kt = scratch + L.kt;
  float* s = scratch + L.s;
  float* ms = scratch + L.m;
  float* ls = scratch + L.l;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  mla_load_q(m, q);
  memset(acc, 0, sizeof(float) * static_cast<size_t>(rows) * R);
  for (int r = 0; r < rows; ++r) {
    ms[r] = kNegInf;
    ls[r] = 0.0f;
  }
  // Keys any row of the item sees, within the item's key range.
  int64_t k_lo = it.key1, k_hi = it.key0 - 1;
  for (int t = 0; t < ntok; ++t) {
    k_lo = std::min(k_lo, item_row_lo(it, t));
    k_hi = std::max(k_hi, item_row_hi(it, t));
  }
  k_lo = std::max(k_lo, it.key0);
  k_hi = std::min(k_hi, it.key1 - 1);
  const KVSource& kv = it.kv;
  const int64_t esz = static_cast<int64_t>(elem_size(kv.dtype));
  const bool direct = kv.dtype == PAGEDATTN_DTYPE_FLOAT32;
  const int64_t row_bytes = static_cast<int64_t>(D) * esz;
  const float* krow[kMlaKeyTile];
  for (int64_t k0 = k_lo; k0 <= k_hi; k0 += kMlaKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kMlaKeyTile, k_hi + 1 - k0));
    const int64_t next_hi = std::min<int64_t>(k_hi, k0 + 2 * kMlaKeyTile - 1);
    for (int j = 0; j < nk; ++j) {
      const int64_t kp = k0 + j;
      const char* row = mla_row(kv, kp, esz);
      // The next tile's row, asked for now: its lines arrive while this tile is computed on.
      if (kp + kMlaKeyTile <= next_hi) {
        const char* nx = mla_row(kv, kp + kMlaKeyTile, esz);
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(nx + b, 0, 1);
      }
      if (direct) {
        krow[j] = reinterpret_cast<const float*>(row);
      } else {
        load_row(row, kv.dtype, kv.k_scale, kt + static_cast<size_t>(j) * D, D);
        krow[j] = kt + static_cast<size_t>(j) * D;
      }
    }
    for (int j = nk; j < kMlaKeyTile; ++j)
      for (int r = 0; r < rows; ++r) s[r * kMlaKeyTile + j] = 0.0f;
    mla_scores(q, rows, D, krow, nk, s);
    for (int t = 0; t < ntok; ++t) {
      for (int g = 0; g < nh; ++g) {
        const int r = t * nh + g;
        const float alpha =
            mla_softmax_row(it, t, g, k0, nk, s + r * kMlaKeyTile, ms + r, ls + r);
        if (alpha != 1.0f) mla_scale_row(acc + static_cast<size_t>(r) * R, R, alpha);
      }
    }
    mla_pv(acc, rows, R, s, krow, nk);
  }
  // The rows' ends: normalised output and lse, or the partial state of a split.
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      const float* a = acc + static_cast<size_t>(r) * R;
      if (it.out == nullptr) {
        memcpy(it.part_acc + static_cast<size_t>(r) * R, a, sizeof(float) * R);
        it.part_m[r] = ms[r];
        it.part_l[r] = ls[r];
        continue;
      }
      const RowNorm nr = row_norm(ms[r], ls[r], item_sink(it, g));
      store_row(item_out(it, t, g), it.dtype, a, nr.inv, R);
      if (it.lse != nullptr)
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] = nr.lse;
    }
  }
}
#endif  // HWY_TARGET == PA_CPU_UNIT

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_MLA_INL_H_
