// schedule.h — the GPU backend's work split: a batch's plan (work items, the split-KV choice,
// the layout of its device buffer) and the constants a forward's launches take from it.
//
// Host code only; backend.cu owns the plan's memory, copies its image to the device and launches.
#ifndef PAGEDATTN_GPU_SCHEDULE_H
#define PAGEDATTN_GPU_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "gpu_kernels.h"
#include "plugin_abi.h"

namespace pagedattn_gpu {

// Tokens per prefill tile, by heads per CTA (4, 2, 1): tiles of kPrefillRows rows.
constexpr int kPrefillTiles[3] = {kPrefillRows / 4, kPrefillRows / 2, kPrefillRows};
constexpr int64_t kPartFloats = 8192;            // per split partial: num_heads * head_size max
constexpr int64_t kPartHeads = kPartFloats / 8;

// The counts at o_counts, which kernels read on the device: rows to write, items per work list.
enum Count { kTokens = 0, kEncTokens, kDecSplit, kDecWhole, kMerge, kPre0, kNumCounts = kPre0 + 3 };

// A batch's plan: one device buffer (the metadata image, then the split-KV workspace), the host
// image it is copied from, and the offsets (o_*) into both.
struct Plan {
  char* dev = nullptr;        // one device allocation: metadata, then the split workspace
  size_t dev_bytes = 0;
  size_t meta_bytes = 0;
  std::vector<char> host;     // staging image of the metadata region
  size_t o_qlen = 0, o_ctx = 0, o_qstart = 0, o_enc = 0, o_tab = 0, o_xtab = 0, o_slots = 0,
         o_xslots = 0, o_counts = 0, o_dsplit = 0, o_dwhole = 0, o_merge = 0, o_pre[3] = {0, 0, 0},
         o_part = 0, o_plse = 0, o_tree_ip = 0, o_tree = 0;
  int64_t cap_tree = 0;       // tree mask bytes planned for (0: none)
  int32_t cap_seqs = 0;
  int64_t cap_tokens = 0, cap_enc = 0, cap_seq_len = 0;
  int32_t tab_stride = 0, xtab_stride = 0;
  bool split = false;         // decode rows may take the split-KV list (a workspace exists)
  int32_t sm_count = 0;
  int32_t cap_dsplit = 0, cap_pre[3] = {0, 0, 0};
  template <typename T> T* h(size_t off) { return reinterpret_cast<T*>(host.data() + off); }
  template <typename T> T* d(size_t off) const { return reinterpret_cast<T*>(dev + off); }
};

// Formats an op's message into msg (PA_MSG_LEN bytes; nothing when msg is NULL). In backend.cu.
void set_msg(char* msg, const char* fmt, ...);

// Sizes a new plan for the batch's capacities: table widths, whether decode rows may split
// (fill_plan picks each step's partition, from the device's SM count), the offsets of the
// metadata and workspace in its device buffer, and meta_bytes / dev_bytes. Allocates nothing.
void plan_layout(Plan* pl, const pa_batch* b, int sm_count);

// Fills the staging image from the batch's host arrays: lengths, tables, slot mappings, the
// work lists and their counts. CAPACITY when the batch outgrows the plan.
pagedattn_status fill_plan(Plan* pl, const pa_batch* b, char* msg);

// Whether decode rows take the split-KV lists: the plan has a split workspace and a partial of
// num_heads * head_size floats fits it. Fixed for the plan's life, so a captured graph launches
// the same lists after any update; a step without partitions gives the split list whole rows.
bool decode_split(const Plan& pl, int32_t num_heads, int32_t head_size);

// Launch shapes. Each set_*_launch points one launch's parameters at its list in the plan's
// device buffer and at the list's device count, and returns the grid's width: the list's
// capacity, so a captured graph covers any later update.

// A forward's cache write: the self or the cross slot mapping (int64, -1 for padding).
int64_t set_write_launch(const Plan& pl, bool cross, WriteParams* w);

// Decode rows (query_len == 1): one token and up to kDecodeRows heads of a group per CTA, over
// the split or the whole list; split partials go to the plan's workspace.
int32_t set_decode_launch(const Plan& pl, bool split, AttnParams* p);

// The merge of the split partials: one item per decode row split into several partitions.
int32_t set_merge_launch(const Plan& pl, SplitMergeParams* m);

// Prefill tiles: up to 4 heads of a group times the tokens that fill kPrefillRows rows.
int32_t set_prefill_launch(const Plan& pl, AttnParams* p);

// MLA decode rows (mla.cuh): one token and up to kMlaRows of its heads per CTA, over the split
// or the whole list (split when decode_split allows partials of num_heads * kMlaValue floats).
int32_t set_mla_decode_launch(const Plan& pl, bool split, AttnParams* p);

// MLA prefill: the list of the smallest prefill tiles, each item cut into *subtiles sub-tiles
// (grid z) of tile_tokens tokens, so that a CTA's tokens x heads fill at most kMlaRows rows.
int32_t set_mla_prefill_launch(const Plan& pl, AttnParams* p, int32_t* subtiles);

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_SCHEDULE_H
