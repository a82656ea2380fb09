/* kernels/runtime/softmax_rules.h — how the CPU-side backends' online softmax treats non-finite
 * scores (docs/semantics.md section 5, non-finite inputs), defined once for the built-in cpu
 * backend and the onednn plugin. A NaN score, or a +inf one (exp(inf - inf) is NaN), makes the
 * row's output and log-sum-exp NaN, as float64 gives them; the row's running maximum carries that
 * fact from tile to tile and into split-KV merges. */
#ifndef PAGEDATTN_KERNELS_RUNTIME_SOFTMAX_RULES_H
#define PAGEDATTN_KERNELS_RUNTIME_SOFTMAX_RULES_H

namespace pa_runtime {

/* Whether a row's running score maximum says it read a NaN or +inf score. -inf (no key yet) and
 * finite maxima do not. */
static inline bool max_poisoned(float m) { return !(m < __builtin_inff()); }

/* max(a, b) that keeps a NaN of either side (std::max and the SIMD max drop one of them). */
static inline float max_keep_nan(float a, float b) {
  if (a != a || b != b) return a + b;
  return a > b ? a : b;
}

}  // namespace pa_runtime

#endif /* PAGEDATTN_KERNELS_RUNTIME_SOFTMAX_RULES_H */
