/* kernels/cpu/schedule.h — how the cpu backend cuts one forward into work items for its workers:
 * items of (sequence, KV heads, query heads, token tile, key range), several KV heads per decode
 * item where the kernels read them together, and split-KV (one sequence's keys over several
 * items, merged after them) when the items are too few for the threads. Arithmetic over the
 * forward's arguments into arrays the batch workspace holds: no threads, no allocation. */
#ifndef PAGEDATTN_KERNELS_CPU_SCHEDULE_H
#define PAGEDATTN_KERNELS_CPU_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "plugin_abi.h"

namespace pa_cpu {

/* Floats of partial state per split-KV part (acc, m, l for kMaxRows rows of up to 256 dims). */
constexpr size_t kPartFloats = static_cast<size_t>(kMaxRows) * (kMaxHeadSize + 2);
/* Most split-KV parts a batch workspace holds: 8 MiB of them. */
constexpr size_t kMaxParts = (size_t{8} << 20) / (sizeof(float) * kPartFloats);

/* How one sequence's rows are cut: heads per item and tokens per item; decode sequences (one
 * token) may instead take kv_per_item whole KV heads per item. An MLA forward (latent cache)
 * takes up to kMlaMaxRows rows per item. */
struct Shape {
  int32_t group, heads_per_item, head_chunks, tokens_per_item, kv_per_item;
};

/* One forward's work items. The arrays are the batch workspace's, sized at plan time for the
 * batch's capacity of sequences (cap_seqs); schedule_forward fills them and the counts. */
struct Schedule {
  float* parts;          /* split-KV partial states, part_floats floats */
  size_t part_floats;
  int64_t* item_prefix;  /* [cap_seqs + 1] work items before sequence i */
  int64_t* base_prefix;  /* [cap_seqs + 1] the same without the splits */
  int32_t* splits;       /* [cap_seqs] parts each of the sequence's base items is split into */
  int64_t* part_off;     /* [cap_seqs] first float of the sequence's partials, or -1 */
  Shape shape;
  int64_t items;         /* work items of the forward, item_prefix[num_seqs] */
  int64_t base_items;    /* the same without the splits, base_prefix[num_seqs] */
  bool any_split;        /* some sequence is split: run merge_item over the base items after */
  /* A split part's layout: part_rows x part_dim accumulators, then part_rows m and l; parts are
   * part_stride floats apart (kPartFloats; an MLA forward's are value_size wide). */
  int32_t part_rows;
  int32_t part_dim;
  size_t part_stride;
};

/* Schedules forward `a` (a batch with num_tokens > 0) for `workers` threads running `target`:
 * the items' shape, the base items of each sequence and, when there are fewer than 4 per worker
 * over 512 keys or more, key splits (at most kMaxSplits per item, fewer when their partial
 * states would not fit in s->part_floats). Writes s's arrays for the batch's sequences and its
 * counts. */
void schedule_forward(const Target& target, const pa_forward_args& a, int workers, Schedule* s);

/* Work item `item` (< s.items) of the forward `s` schedules, ready for attention_item: its
 * sequence, tokens, heads and key range; the item of a split sequence writes its partial state
 * into s.parts (out NULL) for merge_item. */
void work_item(const pa_forward_args& a, const Schedule& s, int64_t item, AttnItem* it);

/* The partial states of one split base item, as attention_merge_parts takes them. */
struct SplitParts {
  int32_t n;             /* parts; 1 when the base item was not split (nothing to merge) */
  const float* acc;      /* first part's accumulators; parts are `stride` floats apart */
  const float* m;
  const float* l;
  int64_t stride;
};

/* Base item `base` (< s.base_items) of the forward `s` schedules: its output rows in *it and its
 * partial states in *parts. When parts->n is 1 the item was not split and *it is left as is. */
void merge_item(const pa_forward_args& a, const Schedule& s, int64_t base, AttnItem* it,
                SplitParts* parts);

}  // namespace pa_cpu

#endif  // PAGEDATTN_KERNELS_CPU_SCHEDULE_H
