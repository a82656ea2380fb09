// kernels/cpu/schedule.cpp — the work split of a cpu forward (see schedule.h).
#include "schedule.h"

#include <algorithm>

namespace pa_cpu {

namespace {

void seq_item(const pa_forward_args& a, int32_t i, AttnItem* it);

Shape shape_of(const Target& target, const pa_forward_args& a) {
  Shape s;
  s.group = a.num_heads / a.num_kv_heads;
  if (a.cache != nullptr && a.cache->latent) {
    // MLA: every head reads the one latent row, so an item takes as many rows as fit.
    s.heads_per_item = std::min(s.group, kMlaMaxRows);
    s.head_chunks = (s.group + s.heads_per_item - 1) / s.heads_per_item;
    s.tokens_per_item = std::max(1, kMlaMaxRows / s.heads_per_item);
    s.kv_per_item = 1;
    return s;
  }
  s.heads_per_item = std::min(s.group, kMaxRows);
  s.head_chunks = (s.group + s.heads_per_item - 1) / s.heads_per_item;
  s.tokens_per_item = std::max(1, kMaxRows / s.heads_per_item);
  s.kv_per_item = 1;
  // Decode items that take several KV heads read whole runs of a block instead of one head's
  // scattered rows, which the memory system serves far faster: whole slot rows of an NHD cache
  // (heads contiguous), or whole blocks of any layout when one item takes every KV head. Only
  // where the kernels read several heads at once.
  const pa_batch& bt = *a.batch;
  const bool nhd = a.cache != nullptr && a.cache->head_stride == a.head_size &&
                   a.cache->slot_stride == static_cast<int64_t>(a.num_kv_heads) * a.head_size;
  const bool all_heads_fit = static_cast<int64_t>(a.num_kv_heads) * s.group <= kMaxRows;
  // Per-head scales differ between the heads one such item would cover.
  if (a.num_kv_heads > 1 && a.cache != nullptr && s.group <= kMaxRows &&
      a.k_head_scales == nullptr && a.v_head_scales == nullptr &&
      (a.attention_type == PAGEDATTN_ATTENTION_DECODER ||
       a.attention_type == PAGEDATTN_ATTENTION_CROSS) &&
      (nhd || all_heads_fit)) {
    for (int32_t i = 0; i < bt.num_seqs; ++i) {
      if (bt.query_lens[i] != 1) continue;
      AttnItem proto;
      seq_item(a, i, &proto);
      proto.tok0 = 0;
      proto.tok1 = 1;
      proto.kv_head = 0;
      proto.kv_heads = std::min(a.num_kv_heads, kMaxRows / s.group);
      proto.h0 = 0;
      proto.h1 = proto.kv_heads * s.group;
      if (multi_head_decode_ok(target, proto)) s.kv_per_item = proto.kv_heads;
      break;
    }
  }
  return s;
}

// Base items (no split) of sequence i with qlen query tokens.
int64_t base_items_of(const pa_forward_args& a, const Shape& sh, int32_t qlen) {
  if (qlen == 1 && sh.kv_per_item > 1)
    return (a.num_kv_heads + sh.kv_per_item - 1) / sh.kv_per_item;
  const int64_t tiles = (qlen + sh.tokens_per_item - 1) / sh.tokens_per_item;
  return tiles * a.num_kv_heads * sh.head_chunks;
}

int64_t keys_of(const pa_forward_args& a, int32_t i) {
  const pa_batch& bt = *a.batch;
  switch (a.attention_type) {
    case PAGEDATTN_ATTENTION_CROSS: return bt.encoder_lens[i];
    case PAGEDATTN_ATTENTION_ENCODER:
    case PAGEDATTN_ATTENTION_ENCODER_ONLY: return bt.query_lens[i];
    default: return static_cast<int64_t>(bt.context_lens[i]) + bt.query_lens[i];
  }
}

// Fills the sequence-level fields of an item (everything but tokens, heads and keys).
void seq_item(const pa_forward_args& a, int32_t i, AttnItem* it) {
  const pa_batch& bt = *a.batch;
  it->q = a.q.data;
  it->out = a.out.data;
  it->dtype = a.q.dtype;
  it->q_row_stride = a.q.row_stride;
  it->q_head_stride = a.q.head_stride;
  it->out_row_stride = a.out.row_stride;
  it->out_head_stride = a.out.head_stride;
  it->lse = a.lse.data;
  it->lse_row_stride = a.lse.row_stride;
  it->lse_head_stride = a.lse.head_stride;
  it->head_size = a.head_size;
  it->window = a.sliding_window;
  it->chunk = a.attention_chunk;
  it->tree = nullptr;
  it->tree_q = 0;
  if (bt.tree_indptr != nullptr && a.attention_type == PAGEDATTN_ATTENTION_DECODER &&
      bt.query_lens[i] > 1 && bt.tree_indptr[i + 1] > bt.tree_indptr[i]) {
    it->tree = bt.tree_mask + bt.tree_indptr[i];
    it->tree_q = bt.query_lens[i];
  }
  it->num_keys = keys_of(a, i);
  it->scale = a.scale;
  it->soft_cap = a.soft_cap;
  it->alibi = a.alibi_slopes;
  it->sinks = a.sinks;
  it->part_acc = it->part_m = it->part_l = nullptr;
  KVSource& s = it->kv;
  s.k_scale = s.v_scale = 1.0f;
  if (a.attention_type == PAGEDATTN_ATTENTION_ENCODER ||
      a.attention_type == PAGEDATTN_ATTENTION_ENCODER_ONLY) {
    it->causal = 0;
    it->pos_offset = 0;
    s.k = a.k.data;
    s.v = a.v.data;
    s.dtype = a.k.dtype;
    s.block_stride = a.k.row_stride;
    s.slot_stride = 0;
    s.head_stride = a.k.head_stride;
    s.v_block_stride = a.v.row_stride;
    s.v_slot_stride = 0;
    s.v_head_stride = a.v.head_stride;
    s.table = nullptr;
    s.block_size = 1;
    s.row0 = bt.query_start[i];
    return;
  }
  const pa_cache& c = *a.cache;
  s.k = c.k_layers[a.layer];
  s.v = c.v_layers[a.layer];
  s.dtype = c.dtype;
  s.block_stride = s.v_block_stride = c.block_stride;
  s.slot_stride = s.v_slot_stride = c.slot_stride;
  s.head_stride = s.v_head_stride = c.head_stride;
  s.row0 = 0;
  if (c.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || c.dtype == PAGEDATTN_DTYPE_FP8_E5M2) {
    s.k_scale = a.k_scale;
    s.v_scale = a.v_scale;
  }
  if (a.attention_type == PAGEDATTN_ATTENTION_CROSS) {
    it->causal = 0;
    it->pos_offset = 0;
    s.table = bt.cross_tables + static_cast<int64_t>(i) * bt.cross_table_stride;
    s.block_size = bt.cross_block_size;
  } else {
    it->causal = 1;
    it->pos_offset = bt.context_lens[i];
    s.table = bt.block_tables + static_cast<int64_t>(i) * bt.table_stride;
    s.block_size = bt.block_size;
  }
}

// Decomposes a base item (no split) of sequence i into tokens, heads and kv head.
void place_item(const pa_forward_args& a, const Shape& sh, int32_t i, int64_t local,
                AttnItem* it) {
  const int32_t qlen = a.batch->query_lens[i];
  it->kv_heads = 1;
  if (qlen == 1 && sh.kv_per_item > 1) {
    const int32_t kv0 = static_cast<int32_t>(local) * sh.kv_per_item;
    it->kv_head = kv0;
    it->kv_heads = std::min(sh.kv_per_item, a.num_kv_heads - kv0);
    it->tok0 = 0;
    it->tok1 = 1;
    it->q_row0 = a.batch->query_start[i];
    it->h0 = kv0 * sh.group;
    it->h1 = (kv0 + it->kv_heads) * sh.group;
    return;
  }
  const int64_t tiles = (qlen + sh.tokens_per_item - 1) / sh.tokens_per_item;
  const int64_t tile = local % tiles;
  const int64_t rest = local / tiles;
  const int32_t hc = static_cast<int32_t>(rest % sh.head_chunks);
  const int32_t kvh = static_cast<int32_t>(rest / sh.head_chunks);
  it->tok0 = static_cast<int32_t>(tile * sh.tokens_per_item);
  it->tok1 = std::min<int32_t>(qlen, it->tok0 + sh.tokens_per_item);
  it->q_row0 = a.batch->query_start[i] + it->tok0;
  it->kv_head = kvh;
  it->h0 = kvh * sh.group + hc * sh.heads_per_item;
  it->h1 = std::min(it->h0 + sh.heads_per_item, (kvh + 1) * sh.group);
  if (a.k_head_scales != nullptr) it->kv.k_scale = a.k_head_scales[kvh];
  if (a.v_head_scales != nullptr) it->kv.v_scale = a.v_head_scales[kvh];
}

int32_t seq_of(const int64_t* prefix, int32_t n, int64_t item) {
  // Last i with prefix[i] <= item (prefix is non-decreasing; idle sequences add nothing).
  const int64_t* p = std::upper_bound(prefix, prefix + n + 1, item);
  return static_cast<int32_t>(p - prefix) - 1;
}

}  // namespace

void schedule_forward(const Target& target, const pa_forward_args& a, int workers, Schedule* s) {
  const pa_batch& bt = *a.batch;
  const int64_t nw = workers;
  const Shape sh = shape_of(target, a);
  const int32_t ns = bt.num_seqs;
  s->base_prefix[0] = 0;
  int64_t max_keys = 0;
  for (int32_t i = 0; i < ns; ++i) {
    const int32_t q = bt.query_lens[i];
    s->base_prefix[i + 1] = s->base_prefix[i] + base_items_of(a, sh, q);
    if (q > 0) max_keys = std::max(max_keys, keys_of(a, i));
  }
  const int64_t base_items = s->base_prefix[ns];
  int32_t want = 1;
  if (nw > 1 && base_items > 0 && base_items < 4 * nw && max_keys >= 512) {
    want = static_cast<int32_t>(std::min<int64_t>(kMaxSplits, (8 * nw + base_items - 1) /
                                                                  base_items));
  }
  // A part holds rows x dim accumulators, then the rows' m and l.
  const bool mla = a.cache != nullptr && a.cache->latent;
  s->part_rows = kMaxRows;
  s->part_dim = kMaxHeadSize;
  if (mla) {
    s->part_rows = sh.heads_per_item * std::min(sh.tokens_per_item, std::max(bt.max_query_len, 1));
    s->part_dim = a.value_size;
  }
  s->part_stride = static_cast<size_t>(s->part_rows) * (static_cast<size_t>(s->part_dim) + 2);
  const size_t part_stride = s->part_stride;
  for (;;) {
    size_t parts = 0;
    for (int32_t i = 0; i < ns; ++i) {
      int32_t n = 1;
      if (want > 1 && bt.query_lens[i] > 0) {
        n = static_cast<int32_t>(std::min<int64_t>(want, (keys_of(a, i) + 255) / 256));
        n = std::max(n, 1);
      }
      s->splits[i] = n;
      s->part_off[i] = -1;
      if (n > 1) {
        s->part_off[i] = static_cast<int64_t>(parts * part_stride);
        parts += static_cast<size_t>(s->base_prefix[i + 1] - s->base_prefix[i]) *
                 static_cast<size_t>(n);
      }
    }
    if (parts * part_stride <= s->part_floats || want == 1) break;
    want /= 2;  // not enough workspace: fewer splits
  }
  s->item_prefix[0] = 0;
  for (int32_t i = 0; i < ns; ++i) {
    s->item_prefix[i + 1] =
        s->item_prefix[i] + (s->base_prefix[i + 1] - s->base_prefix[i]) * s->splits[i];
  }
  s->shape = sh;
  s->items = s->item_prefix[ns];
  s->base_items = base_items;
  s->any_split = false;
  for (int32_t i = 0; i < ns; ++i) s->any_split = s->any_split || s->splits[i] > 1;
}

void work_item(const pa_forward_args& a, const Schedule& s, int64_t item, AttnItem* it) {
  const int32_t i = seq_of(s.item_prefix, a.batch->num_seqs, item);
  const int32_t n = s.splits[i];
  const int64_t local = item - s.item_prefix[i];
  const int64_t base = local / n;
  const int32_t split = static_cast<int32_t>(local % n);
  seq_item(a, i, it);
  place_item(a, s.shape, i, base, it);
  it->key0 = 0;
  it->key1 = it->num_keys;
  if (n > 1) {
    const int64_t chunk = ((it->num_keys + n - 1) / n + 15) / 16 * 16;
    it->key0 = std::min<int64_t>(it->num_keys, split * chunk);
    it->key1 = std::min<int64_t>(it->num_keys, it->key0 + chunk);
    float* part = s.parts + s.part_off[i] + static_cast<size_t>(local) * s.part_stride;
    it->out = nullptr;
    it->part_acc = part;
    it->part_m = part + static_cast<size_t>(s.part_rows) * s.part_dim;
    it->part_l = it->part_m + s.part_rows;
  }
}

void merge_item(const pa_forward_args& a, const Schedule& s, int64_t base, AttnItem* it,
                SplitParts* parts) {
  const int32_t i = seq_of(s.base_prefix, a.batch->num_seqs, base);
  parts->n = s.splits[i];
  if (parts->n <= 1) return;
  const int64_t local = base - s.base_prefix[i];
  seq_item(a, i, it);
  place_item(a, s.shape, i, local, it);
  parts->acc = s.parts + s.part_off[i] + static_cast<size_t>(local) * parts->n * s.part_stride;
  parts->m = parts->acc + static_cast<size_t>(s.part_rows) * s.part_dim;
  parts->l = parts->m + s.part_rows;
  parts->stride = static_cast<int64_t>(s.part_stride);
}

}  // namespace pa_cpu
