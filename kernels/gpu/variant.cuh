// variant.cuh — the attention variant of docs/semantics.md section 5, defined once for the GPU
// kernels (as kernels/cpu/variant.h is for the CPU ones): the keys an item's query tokens may
// see (the sequence's keys, the item's split, causal order, sliding window) and how a scaled score
// becomes a logit (soft cap, ALiBi, then the decoder's masks).
#ifndef PAGEDATTN_GPU_VARIANT_CUH
#define PAGEDATTN_GPU_VARIANT_CUH

#include <math.h>

#include "gpu_kernels.h"
#include "vendor.cuh"

namespace pagedattn_gpu {

// The keys [lo, hi) that query tokens [pos_first, pos_first + tlen) of sequence seq may see
// within the item's split [kv_begin, kv_end): every key of the sequence (its context and new
// tokens, its own tokens for an encoder, its encoder tokens for cross attention), for a decoder
// up to the last token itself and from the first token's window on.
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange item_keys(const AttnParams& p, const WorkItem& it, int seq,
                                              int ctx, int qlen, int pos_first) {
  int kv_len;
  if (p.kind == kDecoder) kv_len = ctx + qlen;
  else if (p.kind == kEncoder) kv_len = qlen;
  else kv_len = p.encoder_lens[seq];
  KeyRange r{max(it.kv_begin, 0), min(it.kv_end, kv_len)};
  if (p.kind == kDecoder) {
    r.hi = min(r.hi, pos_first + it.tlen);
    if (p.window > 0) r.lo = max(r.lo, pos_first - p.window + 1);
  }
  return r;
}

// The logit of key kpos for the query at qpos of head h from its scaled score s: soft cap, ALiBi,
// then a decoder's causal and window masks (-inf for a key the query does not see).
__device__ __forceinline__ float variant_logit(const AttnParams& p, float s, int h, int kpos,
                                               int qpos) {
  if (p.soft_cap > 0.f) s = p.soft_cap * tanhf(s / p.soft_cap);
  if (p.alibi) s += p.alibi[h] * static_cast<float>(kpos - qpos);
  if (p.kind == kDecoder && (kpos > qpos || (p.window > 0 && qpos - kpos >= p.window)))
    s = -INFINITY;
  return s;
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_VARIANT_CUH
