// kernels/onednn/schedule.cpp — the work split of an onednn forward (see schedule.h).
#include "schedule.h"

#include <string.h>

#include <algorithm>

namespace pa_onednn {

namespace {

// How sequence s splits into oneDNN tile items (none when its rows go to the CPU backend).
struct SeqSplit {
  int hc;   // heads per item
  int nhc;  // head chunks per KV head
  int tq;   // tokens per item
  int nt;   // token tiles
};

bool fp8_cache(const pa_cache* c) {
  return c != nullptr &&
         (c->dtype == PAGEDATTN_DTYPE_FP8_E4M3 || c->dtype == PAGEDATTN_DTYPE_FP8_E5M2);
}

SeqSplit split_of(int min_query, int ql, int G, int Hkv, int64_t* items) {
  SeqSplit s;
  s.hc = std::min(G, kMaxM);
  s.nhc = (G + s.hc - 1) / s.hc;
  s.tq = std::max(1, kMaxM / s.hc);
  s.nt = ql >= min_query ? (ql + s.tq - 1) / s.tq : 0;
  *items = static_cast<int64_t>(s.nt) * Hkv * s.nhc;
  return s;
}

}  // namespace

int tile_min_query(const pa_forward_args& a, const TileRule& r, bool* bf16) {
  *bf16 = r.bf16 && a.q.dtype == PAGEDATTN_DTYPE_BFLOAT16;
  // The cpu kernels convert fp8 in registers and ran such steps faster than these tiles
  // (docs/perf.md, "Rule for `auto` on CPU"), so they run there whole, as decode steps do.
  const bool fp8_on_cpu = fp8_cache(a.cache) && r.bf16_dp;
  if ((!*bf16 && !r.f32_tiles) || fp8_on_cpu || a.batch->max_query_len < r.min_query)
    return kNoTiles;
  return r.min_query;
}

bool short_rows(const pa_batch& bt, int min_query, int32_t* short_lens) {
  bool any_short = false;
  for (int s = 0; s < bt.num_seqs; ++s) {
    const int32_t ql = bt.query_lens[s];
    short_lens[s] = ql < min_query ? ql : 0;
    any_short = any_short || (ql > 0 && ql < min_query);
  }
  return any_short;
}

int64_t count_tile_items(const pa_forward_args& a, int min_query, int64_t* prefix) {
  const pa_batch& bt = *a.batch;
  const int Hkv = a.num_kv_heads, G = a.num_heads / Hkv;
  int64_t total = 0;
  for (int s = 0; s < bt.num_seqs; ++s) {
    int64_t items;
    split_of(min_query, bt.query_lens[s], G, Hkv, &items);
    prefix[s] = total;
    total += items;
  }
  prefix[bt.num_seqs] = total;
  return total;
}

void tile_item_at(const pa_forward_args& a, int min_query, const int64_t* prefix, int64_t i,
                  TileItem* out) {
  const pa_batch& bt = *a.batch;
  const pa_cache* c = a.cache;
  const int Hkv = a.num_kv_heads, G = a.num_heads / Hkv;
  const bool fp8 = fp8_cache(c);
  const bool cross = a.attention_type == PAGEDATTN_ATTENTION_CROSS;
  const bool encoder = a.attention_type == PAGEDATTN_ATTENTION_ENCODER ||
                       a.attention_type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
  const int s =
      static_cast<int>(std::upper_bound(prefix, prefix + bt.num_seqs + 1, i) - prefix - 1);
  const int ql = bt.query_lens[s];
  int64_t items;
  const SeqSplit sp = split_of(min_query, ql, G, Hkv, &items);
  int64_t j = i - prefix[s];
  // Largest token tiles (most keys under the causal mask) first.
  const int tile = sp.nt - 1 - static_cast<int>(j / (static_cast<int64_t>(Hkv) * sp.nhc));
  j %= static_cast<int64_t>(Hkv) * sp.nhc;
  const int kvh = static_cast<int>(j / sp.nhc), hchunk = static_cast<int>(j % sp.nhc);

  TileItem& it = *out;
  memset(&it, 0, sizeof it);
  it.q = a.q.data;
  it.out = a.out.data;
  it.dtype = a.q.dtype;
  it.q_row_stride = a.q.row_stride;
  it.q_head_stride = a.q.head_stride;
  it.out_row_stride = a.out.row_stride;
  it.out_head_stride = a.out.head_stride;
  it.lse = a.lse.data;
  it.lse_row_stride = a.lse.row_stride;
  it.lse_head_stride = a.lse.head_stride;
  it.tok0 = tile * sp.tq;
  it.tok1 = std::min(ql, it.tok0 + sp.tq);
  it.q_row0 = bt.query_start[s] + it.tok0;
  it.kv_head = kvh;
  it.h0 = kvh * G + hchunk * sp.hc;
  it.h1 = std::min(kvh * G + G, it.h0 + sp.hc);
  it.head_size = a.head_size;
  it.scale = a.scale;
  it.soft_cap = a.soft_cap;
  it.alibi = a.alibi_slopes;
  it.window = a.sliding_window;
  it.chunk = a.attention_chunk;
  it.tree = nullptr;
  it.tree_q = 0;
  if (bt.tree_indptr != nullptr && !encoder && !cross && ql > 1 &&
      bt.tree_indptr[s + 1] > bt.tree_indptr[s]) {
    it.tree = bt.tree_mask + bt.tree_indptr[s];
    it.tree_q = ql;
  }
  it.sinks = a.sinks;
  KeySource& kv = it.kv;
  kv.k_scale = !fp8 ? 1.0f : a.k_head_scales != nullptr ? a.k_head_scales[kvh] : a.k_scale;
  kv.v_scale = !fp8 ? 1.0f : a.v_head_scales != nullptr ? a.v_head_scales[kvh] : a.v_scale;
  if (encoder) {
    it.causal = 0;
    it.num_keys = ql;
    kv.k = a.k.data;
    kv.v = a.v.data;
    kv.dtype = a.k.dtype;
    kv.block_stride = a.k.row_stride;
    kv.head_stride = a.k.head_stride;
    kv.v_block_stride = a.v.row_stride;
    kv.v_head_stride = a.v.head_stride;
    kv.row0 = bt.query_start[s];
    kv.k_scale = kv.v_scale = 1.0f;
  } else {
    kv.k = c->k_layers[a.layer];
    kv.v = c->v_layers[a.layer];
    kv.dtype = c->dtype;
    kv.block_stride = c->block_stride;
    kv.slot_stride = c->slot_stride;
    kv.head_stride = c->head_stride;
    kv.block_size = c->block_size;
    if (cross) {
      it.causal = 0;
      it.num_keys = bt.encoder_lens[s];
      kv.table = bt.cross_tables + static_cast<int64_t>(s) * bt.cross_table_stride;
    } else {
      it.causal = 1;
      it.pos_offset = bt.context_lens[s];
      it.num_keys = static_cast<int64_t>(bt.context_lens[s]) + ql;
      kv.table = bt.block_tables + static_cast<int64_t>(s) * bt.table_stride;
    }
  }
}

}  // namespace pa_onednn
