/* lib/planner.h — turning a pagedattn_batch_desc into the validated host arrays of a pa_batch
 * (query_start, copied block tables, slot mappings, summary counts). */
#ifndef PAGEDATTN_LIB_PLANNER_H
#define PAGEDATTN_LIB_PLANNER_H

#include <functional>
#include <vector>

#include "internal.h"

namespace pa {

/* The cache a batch is planned against (present = false: none). */
struct Geometry {
  bool present = false;
  int32_t block_size = 0;
  int32_t num_blocks = 0;
};

/* Capacities a batch was planned for. */
struct PlanCaps {
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  int32_t blocks_per_seq = 0;
  int64_t num_encoder_tokens = 0;
  int64_t seq_len = 0;
  int64_t tree_mask_bytes = 0;
};

struct Plan {
  std::vector<int32_t> query_lens, context_lens, query_start, tables, encoder_lens, cross_tables;
  std::vector<int64_t> slots, cross_slots;
  std::vector<uint8_t> tree_mask;     /* the masks' bytes, [tree_indptr.back()] */
  std::vector<int64_t> tree_indptr;   /* [num_seqs + 1]; empty without masks */
  bool has_tree = false;              /* desc->tree_mask_indptr was given */
  bool any_tree = false;              /* some sequence has a non-empty mask */
  int32_t num_seqs = 0;
  int64_t num_tokens = 0;
  int32_t table_stride = 0;        /* stride of `tables` (the capacity width) */
  int32_t cross_table_stride = 0;  /* stride of `cross_tables` */
  bool has_tables = false;
  bool has_cross = false;
  int64_t num_encoder_tokens = 0;  /* rows of k/v in a writing cross forward */
  int64_t sum_encoder_lens = 0;
  int32_t max_blocks_used = 0;     /* widest self table row needed */
  int32_t max_cross_blocks_used = 0;
  int32_t max_query_len = 0;
  int64_t max_seq_len = 0;
  bool all_context_zero = true;
  bool has_chunked_prefill = false;  /* a sequence with query_len > 1 and context_len > 0 */
  int32_t num_decode = 0;
  int32_t num_prefill = 0;
  bool caller_slots = false;       /* slots came from desc->slot_mapping */
  /* The first two tokens (rows of slots / cross_slots) found to share a slot, else -1: a
   * writing forward refuses the batch, since which row would land is not defined. */
  int64_t slot_repeat[2] = {-1, -1};
  int64_t cross_slot_repeat[2] = {-1, -1};
};

/* Validates desc against the geometries and computes every array into `out` (whose vectors are
 * resized; their capacity is kept). `caps` NULL: first plan (the capacities are read from desc
 * and returned in *caps_out); otherwise an update checked against *caps (CAPACITY errors).
 * `admit`, when set, sees the capacities before anything is allocated and may throw (the
 * memory_limit charge of a new batch). */
void plan(const pagedattn_batch_desc& desc, const Geometry& self, const Geometry& cross,
          const PlanCaps* caps, PlanCaps* caps_out, Plan& out,
          const std::function<void(const PlanCaps&)>& admit = {});

/* Host bytes of a plan reserved for `caps` (what a batch charges against memory_limit);
 * saturates at UINT64_MAX. */
uint64_t plan_host_bytes(const PlanCaps& caps, const Geometry& self, const Geometry& cross);

/* Reserves every vector of `p` for the capacities, so later plans into it do not reallocate. */
void reserve_plan(Plan& p, const PlanCaps& caps, const Geometry& self, const Geometry& cross);

/* Copies src into dst without reallocating dst's vectors (dst is reserved for the capacities). */
void copy_plan(Plan& dst, const Plan& src);

/* Fills the pa_batch view of a plan (backend_data is left alone). */
void fill_pa_batch(pa_batch& pb, const Plan& p, const PlanCaps& caps, const Geometry& self,
                   const Geometry& cross);

}  // namespace pa

#endif /* PAGEDATTN_LIB_PLANNER_H */
