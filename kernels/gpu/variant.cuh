// variant.cuh — the attention variant of docs/semantics.md section 5, defined once for the GPU
// kernels (as kernels/cpu/variant.h is for the CPU ones): what one CTA computes (its query heads
// and rows, and the keys its tokens may see: the sequence's keys, the item's split, causal order,
// sliding window), where a key's K and V rows are, and how a scaled score becomes a logit (soft
// cap, ALiBi, then the decoder's masks).
#ifndef PAGEDATTN_GPU_VARIANT_CUH
#define PAGEDATTN_GPU_VARIANT_CUH

#include <math.h>

#include "gpu_kernels.h"
#include "types.cuh"
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

// What the CTA (blockIdx.x: work item `it`, blockIdx.y: KV head and group of heads_per_cta query
// heads) computes: query heads [h0, h0 + gh) of KV head kvh, tokens [t0, t0 + tlen) of sequence
// seq at q/out rows row0.., positions pos_first.., over the keys [keys.lo, keys.hi).
struct CtaWork {
  int kvh, g0, gh, h0;
  int seq, qlen, ctx, row0, pos_first;
  KeyRange keys;
};
__device__ __forceinline__ CtaWork cta_work(const AttnParams& p, const WorkItem& it) {
  CtaWork w;
  const int hpc = p.heads_per_cta;
  const int nhg = (p.group + hpc - 1) / hpc;
  w.kvh = blockIdx.y / nhg;
  w.g0 = (blockIdx.y % nhg) * hpc;
  w.gh = min(hpc, p.group - w.g0);
  w.h0 = w.kvh * p.group + w.g0;
  w.seq = it.seq;
  w.qlen = p.query_lens[w.seq];
  w.ctx = (p.kind == kDecoder) ? p.context_lens[w.seq] : 0;
  w.row0 = p.query_start[w.seq] + it.t0;
  w.pos_first = w.ctx + it.t0;
  w.keys = item_keys(p, it, w.seq, w.ctx, w.qlen, w.pos_first);
  return w;
}

// Element offsets of key pos's K and V rows of KV head kvh of sequence seq: through the block
// table (both at one offset) or rows of contiguous k/v (encoder attention).
__device__ __forceinline__ void key_offsets(const AttnParams& p, int seq, int kvh, int pos,
                                            int64_t* koff, int64_t* voff) {
  if (p.kv.paged) {
    const int blk =
        p.kv.tables[static_cast<int64_t>(seq) * p.kv.table_stride + pos / p.kv.block_size];
    *koff = static_cast<int64_t>(blk) * p.kv.block_stride +
            static_cast<int64_t>(pos % p.kv.block_size) * p.kv.slot_stride +
            static_cast<int64_t>(kvh) * p.kv.head_stride;
    *voff = *koff;
  } else {
    const int64_t row = p.query_start[seq] + pos;
    *koff = row * p.kv.slot_stride + static_cast<int64_t>(kvh) * p.kv.head_stride;
    *voff = row * p.kv.v_slot_stride + static_cast<int64_t>(kvh) * p.kv.v_head_stride;
  }
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

// One row's online-softmax step over n scores s (one warp of W lanes; -inf for keys the row does
// not see): the row's running max *m, sum *l and the factor *a for its accumulators (lane 0 writes
// them), and the weights exp(s - m) into p (which may be s itself). A NaN or +inf score poisons
// the row for good (max_poisoned): its weights and factor are 0, the output pass writes NaN.
template <int W, typename P>
__device__ __forceinline__ void softmax_row(const float* s, P* p, int n, int lane, float* m,
                                            float* l, float* a) {
  float mx = -INFINITY;
  for (int k = lane; k < n; k += W) mx = max_keep_nan(mx, s[k]);
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) mx = max_keep_nan(mx, PA_SHFL_XOR(mx, o));
  const float m_old = *m;
  const float m_new = max_keep_nan(m_old, mx);
  const bool poisoned = max_poisoned(m_new);
  float sum = 0.f;
  for (int k = lane; k < n; k += W) {
    const float x = s[k];
    const float e = (x == -INFINITY || poisoned) ? 0.f : __expf(x - m_new);
    p[k] = from_float<P>(e);
    sum += e;
  }
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) sum += PA_SHFL_XOR(sum, o);
  PA_SYNCWARP();  // every lane has read *m before lane 0 overwrites it
  if (lane == 0) {
    const float alpha = (m_old == -INFINITY || poisoned) ? 0.f : __expf(m_old - m_new);
    *l = *l * alpha + sum;
    *m = m_new;
    *a = alpha;
  }
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_VARIANT_CUH
