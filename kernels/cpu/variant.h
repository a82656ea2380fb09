/* kernels/cpu/variant.h — the attention variant of docs/semantics.md section 5, defined once for
 * the CPU kernels and the onednn plugin: which keys a query sees (causal order, sliding window)
 * and how a scaled score becomes a logit (soft cap, then ALiBi). Kernels that work on vectors of
 * rows use the same rules in variant-inl.h; none restates them. */
#ifndef PAGEDATTN_KERNELS_CPU_VARIANT_H
#define PAGEDATTN_KERNELS_CPU_VARIANT_H

#include <math.h>
#include <stdint.h>

namespace pa_cpu {

/* The first key (inclusive) a query at position pos sees: 0, or with a window W > 0 under the
 * causal rule, the W-th key back (pos itself included). */
static inline int64_t visible_lo(bool causal, int32_t window, int64_t pos) {
  if (!causal || window <= 0) return 0;
  const int64_t lo = pos - window + 1;
  return lo > 0 ? lo : 0;
}

/* The last key (inclusive) a query at position pos sees among num_keys: pos itself under the
 * causal rule, else every key. */
static inline int64_t visible_hi(bool causal, int64_t pos, int64_t num_keys) {
  if (!causal) return num_keys - 1;
  return pos < num_keys - 1 ? pos : num_keys - 1;
}

/* The logit of the scaled score s of key kp for a query at pos: soft cap (cap > 0), then the
 * ALiBi bias slope * (kp - pos) (has_alibi). */
static inline float logit(float s, float soft_cap, bool has_alibi, float slope, int64_t kp,
                          int64_t pos) {
  if (soft_cap > 0.0f) s = soft_cap * tanhf(s / soft_cap);
  if (has_alibi) s += slope * static_cast<float>(kp - pos);
  return s;
}

}  // namespace pa_cpu

#endif /* PAGEDATTN_KERNELS_CPU_VARIANT_H */
