/* kernels/cpu/variant.h — the attention variant of docs/semantics.md section 5, defined once for
 * the CPU kernels and the onednn plugin: which keys a query sees (causal order, sliding window,
 * attention chunk), how a scaled score becomes a logit (soft cap, then ALiBi), and how a row's
 * softmax ends (the sink logit). Kernels that work on vectors of rows use the same rules in
 * variant-inl.h; none restates them. */
#ifndef PAGEDATTN_KERNELS_CPU_VARIANT_H
#define PAGEDATTN_KERNELS_CPU_VARIANT_H

#include <math.h>
#include <stdint.h>

#include "kernels/runtime/softmax_rules.h"

namespace pa_cpu {

/* The first key (inclusive) a query at position pos sees: 0, or under the causal rule with a
 * window W > 0 the W-th key back (pos itself included), and with an attention chunk C > 0 the
 * first key of pos's chunk (pos / C * C); the later of the two when both are set. */
static inline int64_t visible_lo(bool causal, int32_t window, int32_t chunk, int64_t pos) {
  if (!causal) return 0;
  int64_t lo = 0;
  if (window > 0 && pos - window + 1 > lo) lo = pos - window + 1;
  if (chunk > 0 && pos / chunk * chunk > lo) lo = pos / chunk * chunk;
  return lo;
}

/* The last key (inclusive) a query at position pos sees among num_keys: pos itself under the
 * causal rule, else every key. */
static inline int64_t visible_hi(bool causal, int64_t pos, int64_t num_keys) {
  if (!causal) return num_keys - 1;
  return pos < num_keys - 1 ? pos : num_keys - 1;
}

/* Whether new token r of a sequence with a tree mask (bits: its q x q matrix, row-major, least
 * significant bit first) sees its new token j (docs/semantics.md 4.7). The context is always
 * visible; a tree admits no window, chunk or ALiBi. */
static inline bool tree_sees(const uint8_t* bits, int32_t q, int64_t r, int64_t j) {
  const int64_t b = r * q + j;
  return (bits[b >> 3] >> (b & 7)) & 1;
}

/* The logit of the scaled score s of key kp for a query at pos: soft cap (cap > 0), then the
 * ALiBi bias slope * (kp - pos) (has_alibi). */
static inline float logit(float s, float soft_cap, bool has_alibi, float slope, int64_t kp,
                          int64_t pos) {
  if (soft_cap > 0.0f) s = soft_cap * tanhf(s / soft_cap);
  if (has_alibi) s += slope * static_cast<float>(kp - pos);
  return s;
}

/* How a row's softmax ends: its output is acc * inv (acc the unnormalised weighted sum of V) and
 * its log-sum-exp lse, from its running max m and sum l of exp(s - m) over the keys it saw, and
 * the sink logit when there is one (NULL: none). The sink joins the softmax without a value, once
 * per row, however its keys were split. A NaN or +inf score or sink makes the row NaN; -inf
 * weighs nothing. A row with no key gives 0 and lse -inf, or with a sink 0 and lse = sink. */
struct RowNorm {
  float inv;
  float lse;
};
static inline RowNorm row_norm(float m, float l, const float* sink) {
  const float nan = __builtin_nanf("");
  const float inf = __builtin_inff();
  if (sink != nullptr && *sink != -inf) {
    const float s = *sink;
    if (pa_runtime::max_poisoned(m) || pa_runtime::max_poisoned(s)) return {nan, nan};
    const float mx = m > s ? m : s;
    const float a = m == -inf ? 0.0f : expf(m - mx);
    const float total = l * a + expf(s - mx);
    return {a / total, mx + logf(total)};
  }
  if (pa_runtime::max_poisoned(m)) return {nan, nan};
  if (!(l > 0.0f)) return {0.0f, -inf};
  return {1.0f / l, m + logf(l)};
}

}  // namespace pa_cpu

#endif /* PAGEDATTN_KERNELS_CPU_VARIANT_H */
