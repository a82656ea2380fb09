// variant.cuh — the attention variant of docs/semantics.md section 5, defined once for the GPU
// kernels (as kernels/cpu/variant.h is for the CPU ones): what one CTA computes (its query heads
// and rows, and the keys its tokens may see: the sequence's keys, the item's split, causal order,
// sliding window, attention chunk), the fp8 scales of its KV head, where a key's K and V rows are,
// how a scaled score becomes a logit (soft cap, ALiBi, then the decoder's masks), and how a row's
// softmax ends (the sink logit).
#ifndef PAGEDATTN_GPU_VARIANT_CUH
#define PAGEDATTN_GPU_VARIANT_CUH

#include <math.h>

#include "gpu_kernels.h"
#include "types.cuh"
#include "vendor.cuh"

namespace pagedattn_gpu {

// The first key a decoder query at position pos sees: 0, or with a window W the W-th key back
// (pos itself included), and with an attention chunk C the first key of pos's chunk; the later
// of the two when both are set (kernels/cpu/variant.h's visible_lo).
__device__ __forceinline__ int visible_lo(const AttnParams& p, int pos) {
  int lo = 0;
  if (p.window > 0) lo = max(lo, pos - p.window + 1);
  if (p.chunk > 0) lo = max(lo, pos / p.chunk * p.chunk);
  return lo;
}

// The keys [lo, hi) that query tokens [pos_first, pos_first + tlen) of sequence seq may see
// within the item's split [kv_begin, kv_end): every key of the sequence (its context and new
// tokens, its own tokens for an encoder, its encoder tokens for cross attention), for a decoder
// up to the last token itself and from the first token's visible_lo on (later tokens see no
// earlier key).
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
    r.lo = max(r.lo, visible_lo(p, pos_first));
  }
  return r;
}

// The fp8 dequantisation scale of KV head h: scales[h], or `scalar` when there are no per-head
// scales. The host cannot check values in device memory, so one that is not finite and > 0 is
// NaN here: the write stores NaN and the rows reading the head become NaN.
__device__ __forceinline__ float head_scale(const float* scales, int h, float scalar) {
  if (!scales) return scalar;
  const float s = scales[h];
  return (s > 0.f && s < INFINITY) ? s : NAN;
}

// What the CTA (blockIdx.x: work item `it`, blockIdx.y: KV head and group of heads_per_cta query
// heads) computes: query heads [h0, h0 + gh) of KV head kvh, tokens [t0, t0 + tlen) of sequence
// seq at q/out rows row0.., positions pos_first.., over the keys [keys.lo, keys.hi). qk_scale
// turns a dot product into a scaled score (the softmax scale times K's scale); v_scale is V's,
// NaN when either of the head's per-head scales is bad, so that every row of the head is NaN,
// rows without keys included.
struct CtaWork {
  int kvh, g0, gh, h0;
  int seq, qlen, ctx, row0, pos_first;
  KeyRange keys;
  float qk_scale, v_scale;
  const uint8_t* tree;  // the sequence's tree mask (decoder, 2+ new tokens), or NULL
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
  const float ks = head_scale(p.k_head_scales, w.kvh, p.k_scale);
  w.qk_scale = p.scale * ks;
  w.v_scale = ks != ks ? NAN : head_scale(p.v_head_scales, w.kvh, p.v_scale);
  w.tree = nullptr;
  if (p.tree_ip && p.kind == kDecoder && w.qlen > 1 && p.tree_ip[w.seq + 1] > p.tree_ip[w.seq])
    w.tree = p.tree + p.tree_ip[w.seq];
  return w;
}

// Whether new token r of the CTA's sequence sees its new token j under the sequence's tree mask
// (kernels/cpu/variant.h tree_sees: q x q bits, row-major, least significant bit first).
__device__ __forceinline__ bool tree_sees(const CtaWork& w, int r, int j) {
  const int64_t b = static_cast<int64_t>(r) * w.qlen + j;
  return (w.tree[b >> 3] >> (b & 7)) & 1;
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

// The logit of key kpos for the query at qpos of head h (CTA w) from its scaled score s: soft
// cap, ALiBi, then a decoder's masks: causal order, window, chunk and tree mask (-inf for a key
// the query does not see).
__device__ __forceinline__ float variant_logit(const AttnParams& p, const CtaWork& w, float s,
                                               int h, int kpos, int qpos) {
  if (p.soft_cap > 0.f) s = p.soft_cap * tanhf(s / p.soft_cap);
  if (p.alibi) s += p.alibi[h] * static_cast<float>(kpos - qpos);
  if (p.kind == kDecoder && (kpos > qpos || kpos < visible_lo(p, qpos))) s = -INFINITY;
  if (w.tree && kpos >= w.ctx && kpos <= qpos && !tree_sees(w, qpos - w.ctx, kpos - w.ctx))
    s = -INFINITY;
  return s;
}

// The sink logit of query head h for a row that ends in this CTA, or -inf (none): a split-KV
// partial leaves it out, the merge of the partials adds it, so it counts once per row.
__device__ __forceinline__ float row_sink(const float* sinks, int h, bool partial) {
  return (sinks && !partial) ? sinks[h] : -INFINITY;
}

// How a row's softmax ends (kernels/cpu/variant.h's row_norm): its output is acc * inv (acc the
// weighted sum of V, not yet normalised nor scaled by v_scale) and its log-sum-exp lse, from its
// running max m, its sum l of exp(s - m) over the keys it saw, and the sink logit (-inf: none),
// which joins the softmax without a value. A NaN or +inf score or sink, or a NaN v_scale (a bad
// per-head scale), makes the row NaN; a row with no key gives 0 and lse -inf, or the sink.
struct RowNorm {
  float inv, lse;
};
__device__ __forceinline__ RowNorm row_norm(float m, float l, float sink, float v_scale) {
  if (max_poisoned(m) || max_poisoned(sink) || v_scale != v_scale) return {NAN, NAN};
  if (sink != -INFINITY) {
    const float mx = fmaxf(m, sink);
    const float a = m == -INFINITY ? 0.f : expf(m - mx);
    const float total = l * a + expf(sink - mx);
    return {v_scale * a / total, mx + logf(total)};
  }
  if (!(l > 0.f)) return {0.f, -INFINITY};
  return {v_scale / l, m + logf(l)};
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
