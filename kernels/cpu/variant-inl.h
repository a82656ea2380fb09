// kernels/cpu/variant-inl.h — variant.h's rules for the kernels' work items and on vectors of
// rows (one lane per query row): a token's visible key range, visibility masks, and logits (soft
// cap, ALiBi).
//
// Included by the per-target units alone, once per Highway target: hence the toggled include
// guard, as in Highway's own -inl.h files.

#include <stdint.h>

#include "kernels.h"
#include "variant.h"

#if defined(PA_CPU_VARIANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_VARIANT_INL_H_
#undef PA_CPU_VARIANT_INL_H_
#else
#define PA_CPU_VARIANT_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Position of the item's token t within its sequence.
HWY_INLINE int64_t item_pos(const AttnItem& it, int t) {
  return static_cast<int64_t>(it.pos_offset) + it.tok0 + t;
}

// First and last (inclusive) key token t of the item may see (variant.h).
HWY_INLINE int64_t item_row_lo(const AttnItem& it, int t) {
  return visible_lo(it.causal != 0, it.window, it.chunk, item_pos(it, t));
}
HWY_INLINE int64_t item_row_hi(const AttnItem& it, int t) {
  return visible_hi(it.causal != 0, item_pos(it, t), it.num_keys);
}

// The last key token t sees from its first visible one on without a gap: item_row_hi, or with a
// tree mask the last context key (its new tokens' keys may be masked one by one).
HWY_INLINE int64_t item_row_dense_hi(const AttnItem& it, int t) {
  const int64_t hi = item_row_hi(it, t);
  if (it.tree == nullptr) return hi;
  return hi < it.pos_offset - 1 ? hi : it.pos_offset - 1;
}

// Whether token t sees key kp inside [item_row_lo, item_row_hi]: always, but for a tree mask's
// keys among the new tokens.
HWY_INLINE bool item_tree_sees(const AttnItem& it, int t, int64_t kp) {
  if (it.tree == nullptr || kp < it.pos_offset) return true;
  return tree_sees(it.tree, it.tree_q, it.tok0 + t, kp - it.pos_offset);
}

// The sink logit of the item's query head h0 + g, or NULL without sinks (row_norm).
HWY_INLINE const float* item_sink(const AttnItem& it, int g) {
  return it.sinks != nullptr ? it.sinks + it.h0 + g : nullptr;
}

// Lanes whose rows see key kp: lo <= kp <= hi, per lane.
template <class DI>
HWY_INLINE hn::Mask<DI> rows_see(DI di, int64_t kp, hn::Vec<DI> lo, hn::Vec<DI> hi) {
  const auto k = hn::Set(di, static_cast<hn::TFromD<DI>>(kp));
  return hn::And(hn::Not(hn::Lt(k, lo)), hn::Not(hn::Lt(hi, k)));
}

// logit() of variant.h on a vector of rows' scores x for key kp: soft cap (cap > 0; inv_cap =
// 1 / cap), then the ALiBi bias slope * (kp - pos) with per-row slope and pos (has_alibi).
template <class DF>
HWY_INLINE hn::Vec<DF> rows_logits(DF d, hn::Vec<DF> x, float soft_cap, hn::Vec<DF> cap,
                                   hn::Vec<DF> inv_cap, bool has_alibi, hn::Vec<DF> slope,
                                   int64_t kp, hn::Vec<DF> pos) {
  if (soft_cap > 0.0f) x = hn::Mul(cap, hn::Tanh(d, hn::Mul(x, inv_cap)));
  if (has_alibi) x = hn::MulAdd(slope, hn::Sub(hn::Set(d, static_cast<float>(kp)), pos), x);
  return x;
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_VARIANT_INL_H_
