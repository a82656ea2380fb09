// schedule.cu — the GPU backend's work split (see schedule.h).
#include "schedule.h"

#include <string.h>

#include <algorithm>

namespace pagedattn_gpu {

namespace {

// Reserves `bytes` at *cur and moves *cur past them, to the next 256-byte boundary.
size_t take(size_t* cur, size_t bytes) {
  const size_t off = *cur;
  *cur = (off + bytes + 255) & ~static_cast<size_t>(255);
  return off;
}

// ceil(a / b); 0 when b <= 0.
int64_t cdiv(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : 0; }

// CTAs a decode step should launch to keep the device busy: two per SM.
int64_t busy_ctas(int sm_count) { return 2 * static_cast<int64_t>(sm_count); }

// The smallest power of two >= x.
int pow2ceil(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

}  // namespace

void plan_layout(Plan* pl, const pa_batch* b, int sm_count) {
  pl->cap_seqs = std::max(b->cap_num_seqs, b->num_seqs);
  pl->cap_tokens = std::max(b->cap_num_tokens, b->num_tokens);
  pl->cap_enc = std::max(b->cap_num_encoder_tokens, b->num_encoder_tokens);
  pl->cap_seq_len = std::max(b->cap_seq_len, b->max_seq_len);
  pl->tab_stride = b->block_size > 0
                       ? static_cast<int32_t>(std::max<int64_t>(b->cap_blocks_per_seq,
                                                                cdiv(pl->cap_seq_len, b->block_size)))
                       : 0;
  if (!b->block_tables) pl->tab_stride = 0;
  pl->xtab_stride = (b->encoder_lens && b->cross_block_size > 0)
                        ? static_cast<int32_t>(cdiv(pl->cap_seq_len, b->cross_block_size))
                        : 0;
  // Split-KV: decode rows longer than 512 keys may be split into partitions (multiples of 256
  // keys) when the step's rows alone leave most of the GPU idle; fill_plan picks the partition
  // from each step's rows, so a batch planned for many sequences still splits a step of few.
  // A step of n rows splits each into at most cdiv(want, 8 n) parts (assuming 8 CTAs of heads
  // per row): n + want / 8 items at most.
  pl->sm_count = sm_count;
  pl->split = pl->cap_seq_len > 512;
  const int64_t want = busy_ctas(sm_count);
  pl->cap_dsplit =
      static_cast<int32_t>(pl->split ? pl->cap_seqs + cdiv(want, 8) : pl->cap_seqs);
  for (int j = 0; j < 3; ++j)
    pl->cap_pre[j] = static_cast<int32_t>(cdiv(pl->cap_tokens, kPrefillTiles[j]) + pl->cap_seqs);
  size_t cur = 0;
  const size_t ns = static_cast<size_t>(pl->cap_seqs);
  pl->o_qlen = take(&cur, ns * 4);
  pl->o_ctx = take(&cur, ns * 4);
  pl->o_qstart = take(&cur, (ns + 1) * 4);
  pl->o_enc = take(&cur, ns * 4);
  pl->o_tab = take(&cur, ns * static_cast<size_t>(pl->tab_stride) * 4);
  pl->o_xtab = take(&cur, ns * static_cast<size_t>(pl->xtab_stride) * 4);
  pl->o_slots = take(&cur, static_cast<size_t>(pl->cap_tokens) * 8);
  pl->o_xslots = take(&cur, static_cast<size_t>(pl->cap_enc) * 8);
  pl->cap_tree = b->cap_tree_mask_bytes;
  if (pl->cap_tree > 0) {
    pl->o_tree_ip = take(&cur, (ns + 1) * 8);
    pl->o_tree = take(&cur, static_cast<size_t>(pl->cap_tree));
  }
  pl->o_counts = take(&cur, kNumCounts * 4);
  pl->o_dsplit = take(&cur, static_cast<size_t>(pl->cap_dsplit) * sizeof(WorkItem));
  pl->o_dwhole = take(&cur, ns * sizeof(WorkItem));
  pl->o_merge = take(&cur, ns * sizeof(MergeItem));
  for (int j = 0; j < 3; ++j)
    pl->o_pre[j] = take(&cur, static_cast<size_t>(pl->cap_pre[j]) * sizeof(WorkItem));
  pl->meta_bytes = cur;
  if (pl->split) {
    pl->o_part = take(&cur, static_cast<size_t>(pl->cap_dsplit) * kPartFloats * 4);
    pl->o_plse = take(&cur, static_cast<size_t>(pl->cap_dsplit) * kPartHeads * 4);
  }
  pl->dev_bytes = cur;
}

pagedattn_status fill_plan(Plan* pl, const pa_batch* b, char* msg) {
  std::fill(pl->host.begin(), pl->host.end(), 0);
  int32_t* qlen = pl->h<int32_t>(pl->o_qlen);
  int32_t* ctx = pl->h<int32_t>(pl->o_ctx);
  int32_t* qst = pl->h<int32_t>(pl->o_qstart);
  int32_t* enc = pl->h<int32_t>(pl->o_enc);
  int32_t* tab = pl->h<int32_t>(pl->o_tab);
  int32_t* xtab = pl->h<int32_t>(pl->o_xtab);
  int32_t* counts = pl->h<int32_t>(pl->o_counts);
  WorkItem* dsplit = pl->h<WorkItem>(pl->o_dsplit);
  WorkItem* dwhole = pl->h<WorkItem>(pl->o_dwhole);
  MergeItem* merge = pl->h<MergeItem>(pl->o_merge);
  // Tree masks: the step's offsets and bits, or zero offsets (every segment causal).
  if (pl->cap_tree > 0 && b->tree_indptr) {
    const int64_t bytes = b->tree_indptr[b->num_seqs];
    if (bytes > pl->cap_tree) {
      set_msg(msg, "tree masks of %lld bytes, the batch was planned for %lld",
              static_cast<long long>(bytes), static_cast<long long>(pl->cap_tree));
      return PAGEDATTN_ERROR_CAPACITY;
    }
    memcpy(pl->h<int64_t>(pl->o_tree_ip), b->tree_indptr, (b->num_seqs + 1) * sizeof(int64_t));
    memcpy(pl->h<uint8_t>(pl->o_tree), b->tree_mask, static_cast<size_t>(bytes));
  }
  // This step's split-KV partition (0: none) from its decode rows (plan_layout).
  int64_t part_len = 0;
  if (pl->split) {
    int64_t rows = 0, max_len = 0;
    for (int32_t i = 0; i < b->num_seqs; ++i) {
      if (b->query_lens[i] != 1) continue;
      ++rows;
      max_len = std::max<int64_t>({max_len, static_cast<int64_t>(b->context_lens[i]) + 1,
                                   b->encoder_lens ? b->encoder_lens[i] : 0});
    }
    const int64_t want = busy_ctas(pl->sm_count);
    if (rows > 0 && rows * 8 < want && max_len > 512) {
      const int64_t splits = std::min<int64_t>({cdiv(want, rows * 8), cdiv(max_len, 256), 32});
      if (splits > 1) part_len = cdiv(cdiv(max_len, splits), 256) * 256;
    }
  }
  const int32_t kAll = 0x7fffffff;
  int32_t nsplit = 0, nwhole = 0, nmerge = 0, npart = 0, npre[3] = {0, 0, 0};
  for (int32_t i = 0; i < b->num_seqs; ++i) {
    const int32_t q = b->query_lens[i], c = b->context_lens[i];
    const int32_t e = b->encoder_lens ? b->encoder_lens[i] : 0;
    qlen[i] = q;
    ctx[i] = c;
    enc[i] = e;
    if (b->block_tables && b->block_size > 0) {
      const int64_t need = cdiv(static_cast<int64_t>(c) + q, b->block_size);
      if (need > pl->tab_stride) {
        set_msg(msg, "sequence %d needs %lld blocks, the batch was planned for %d", i,
                static_cast<long long>(need), pl->tab_stride);
        return PAGEDATTN_ERROR_CAPACITY;
      }
      memcpy(tab + static_cast<int64_t>(i) * pl->tab_stride,
             b->block_tables + static_cast<int64_t>(i) * b->table_stride, need * sizeof(int32_t));
    }
    if (b->encoder_lens && b->cross_tables && b->cross_block_size > 0) {
      const int64_t need = cdiv(e, b->cross_block_size);
      if (need > pl->xtab_stride) {
        set_msg(msg, "sequence %d needs %lld cross blocks, the batch was planned for %d", i,
                static_cast<long long>(need), pl->xtab_stride);
        return PAGEDATTN_ERROR_CAPACITY;
      }
      memcpy(xtab + static_cast<int64_t>(i) * pl->xtab_stride,
             b->cross_tables + static_cast<int64_t>(i) * b->cross_table_stride, need * sizeof(int32_t));
    }
    if (q == 1) {
      dwhole[nwhole++] = WorkItem{i, 0, 1, 0, kAll, -1};
      const int64_t len = std::max<int64_t>(static_cast<int64_t>(c) + 1, e);
      const int64_t ns = part_len > 0 ? std::max<int64_t>(1, cdiv(len, part_len)) : 1;
      if (ns == 1) {
        dsplit[nsplit++] = WorkItem{i, 0, 1, 0, kAll, -1};
      } else {
        merge[nmerge++] = MergeItem{i, npart, static_cast<int32_t>(ns), 0};
        for (int64_t sidx = 0; sidx < ns; ++sidx)
          dsplit[nsplit++] = WorkItem{i, 0, 1, static_cast<int32_t>(sidx * part_len),
                                      static_cast<int32_t>((sidx + 1) * part_len), npart++};
      }
    } else if (q > 1) {
      for (int j = 0; j < 3; ++j) {
        WorkItem* pre = pl->h<WorkItem>(pl->o_pre[j]);
        for (int32_t t0 = 0; t0 < q; t0 += kPrefillTiles[j])
          pre[npre[j]++] = WorkItem{i, t0, std::min(kPrefillTiles[j], q - t0), 0, kAll, -1};
      }
    }
  }
  if (nsplit > pl->cap_dsplit) {  // cannot happen: plan_layout's bound
    set_msg(msg, "split-KV work list overflow (%d > %d)", nsplit, pl->cap_dsplit);
    return PAGEDATTN_ERROR_CAPACITY;
  }
  int32_t acc = 0;
  for (int32_t i = 0; i < b->num_seqs; ++i) {
    qst[i] = acc;
    acc += b->query_lens[i];
  }
  qst[b->num_seqs] = acc;
  // Without a mapping every slot is padding (-1), so a write skips it.
  int64_t* slots = pl->h<int64_t>(pl->o_slots);
  for (int64_t t = 0; t < b->num_tokens; ++t) slots[t] = b->slot_mapping ? b->slot_mapping[t] : -1;
  int64_t* xslots = pl->h<int64_t>(pl->o_xslots);
  for (int64_t t = 0; t < b->num_encoder_tokens; ++t)
    xslots[t] = b->cross_slot_mapping ? b->cross_slot_mapping[t] : -1;
  counts[kTokens] = static_cast<int32_t>(b->num_tokens);
  counts[kEncTokens] = static_cast<int32_t>(b->num_encoder_tokens);
  counts[kDecSplit] = nsplit;
  counts[kDecWhole] = nwhole;
  counts[kMerge] = nmerge;
  for (int j = 0; j < 3; ++j) counts[kPre0 + j] = npre[j];
  return PAGEDATTN_OK;
}

bool decode_split(const Plan& pl, int32_t num_heads, int32_t head_size) {
  return pl.split && static_cast<int64_t>(num_heads) * head_size <= kPartFloats;
}

int64_t set_write_launch(const Plan& pl, bool cross, WriteParams* w) {
  const int32_t* counts = pl.d<int32_t>(pl.o_counts);
  w->slots = cross ? pl.d<int64_t>(pl.o_xslots) : pl.d<int64_t>(pl.o_slots);
  w->slots_int64 = 1;
  w->n_dev = counts + (cross ? kEncTokens : kTokens);
  return cross ? pl.cap_enc : pl.cap_tokens;
}

int32_t set_decode_launch(const Plan& pl, bool split, AttnParams* p) {
  const int32_t* counts = pl.d<int32_t>(pl.o_counts);
  p->heads_per_cta = std::min(p->group, kDecodeRows);
  p->tile_tokens = 1;
  p->items = split ? pl.d<WorkItem>(pl.o_dsplit) : pl.d<WorkItem>(pl.o_dwhole);
  p->num_items = counts + (split ? kDecSplit : kDecWhole);
  p->part_o = pl.d<float>(pl.o_part);
  p->part_lse = pl.d<float>(pl.o_plse);
  return split ? pl.cap_dsplit : pl.cap_seqs;
}

int32_t set_merge_launch(const Plan& pl, SplitMergeParams* m) {
  m->items = pl.d<MergeItem>(pl.o_merge);
  m->num_items = pl.d<int32_t>(pl.o_counts) + kMerge;
  return pl.cap_seqs;
}

int32_t set_prefill_launch(const Plan& pl, AttnParams* p) {
  const int32_t* counts = pl.d<int32_t>(pl.o_counts);
  p->heads_per_cta = std::min(p->group, 4);
  const int tm = kPrefillRows / pow2ceil(p->heads_per_cta);
  const int j = tm == kPrefillTiles[2] ? 2 : (tm == kPrefillTiles[1] ? 1 : 0);
  p->tile_tokens = tm;
  p->items = pl.d<WorkItem>(pl.o_pre[j]);
  p->num_items = counts + kPre0 + j;
  return pl.cap_pre[j];
}

int32_t set_mla_decode_launch(const Plan& pl, bool split, AttnParams* p) {
  const int32_t n = set_decode_launch(pl, split, p);
  p->heads_per_cta = std::min(p->group, kMlaRows);
  p->tile_tokens = 1;
  return n;
}

int32_t set_mla_prefill_launch(const Plan& pl, AttnParams* p, int32_t* subtiles) {
  const int32_t* counts = pl.d<int32_t>(pl.o_counts);
  p->heads_per_cta = std::min(p->group, kMlaRows);
  const int tt = std::min(kMlaRows / pow2ceil(p->heads_per_cta), kPrefillTiles[0]);
  p->tile_tokens = tt;
  p->items = pl.d<WorkItem>(pl.o_pre[0]);
  p->num_items = counts + kPre0;
  *subtiles = static_cast<int32_t>(cdiv(kPrefillTiles[0], tt));
  return pl.cap_pre[0];
}

}  // namespace pagedattn_gpu
