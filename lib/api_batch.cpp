/* lib/api_batch.cpp — entry points of batch.h: create (plan + backend plan_batch), update in
 * place within the planned capacities (the batch is unchanged on failure), destroy, and the
 * accessors of the planned arrays. */
#include <memory>

#include "handles.h"

namespace pa {

namespace {

Geometry geometry_of(const pagedattn_kv_cache* c) {
  Geometry g;
  if (c) {
    g.present = true;
    g.block_size = c->desc.block_size;
    g.num_blocks = c->desc.num_blocks;
  }
  return g;
}

void check_same_backend(const pagedattn_kv_cache* c, const pagedattn_backend* b,
                        const char* name) {
  if (c->backend != b)
    fail(PAGEDATTN_ERROR_INVALID_HANDLE, "%s belongs to another backend (%s)", name,
         backend_name(c->backend));
}

}  // namespace

}  // namespace pa

extern "C" {

PAGEDATTN_API pagedattn_status pagedattn_batch_desc_init(pagedattn_batch_desc* desc) {
  /* The 0.1 layout only: callers that bound this symbol with a 0.1 struct (binaries, FFI
   * mirrors) must not be written past its end. */
  return pagedattn_batch_desc_init_sized(
      desc, static_cast<uint32_t>(pa::first_size<pagedattn_batch_desc>()));
}

PAGEDATTN_API pagedattn_status pagedattn_batch_desc_init_sized(pagedattn_batch_desc* desc,
                                                              uint32_t size) {
  return pa::guard([&] {
    if (!desc) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "desc is NULL");
    pa::check_struct_size(size, pa::first_size<pagedattn_batch_desc>(), sizeof *desc, "desc");
    std::memset(desc, 0, size);
    desc->struct_size = size;
  });
}

PAGEDATTN_API pagedattn_status pagedattn_batch_create(pagedattn_batch** out,
                                                     pagedattn_backend* backend,
                                                     const pagedattn_kv_cache* cache,
                                                     const pagedattn_kv_cache* cross_cache,
                                                     const pagedattn_batch_desc* desc) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    const pagedattn_batch_desc d = pa::read_struct(desc, "desc");
    if (cache) {
      pa::check_cache(cache, "cache");
      pa::check_same_backend(cache, b, "cache");
    }
    /* A cross cache only matters for a batch with encoder_lens. */
    const pagedattn_kv_cache* cross = d.encoder_lens ? cross_cache : nullptr;
    if (cross) {
      pa::check_cache(cross, "cross_cache");
      pa::check_same_backend(cross, b, "cross_cache");
    }
    std::unique_ptr<pagedattn_batch> h(new pagedattn_batch());
    h->magic = 0;
    h->backend = b;
    h->self = pa::geometry_of(cache);
    h->cross = pa::geometry_of(cross);
    h->planned = false;
    /* The host arrays count against memory_limit like cache memory: charged before they are
     * allocated, released on failure here and by destroy (recomputed from the capacities). */
    uint64_t charged = 0;
    const auto admit = [&](const pa::PlanCaps& cp) {
      const uint64_t bytes = pa::plan_host_bytes(cp, h->self, h->cross);
      try {
        pa::backend_reserve(b, bytes);
      } catch (pa::Error& e) {
        e.msg = "batch host metadata: " + e.msg;
        throw;
      }
      charged = bytes;
    };
    try {
      pa::Plan tmp;
      pa::plan(d, h->self, h->cross, nullptr, &h->caps, tmp, admit);
      pa::reserve_plan(h->plan, h->caps, h->self, h->cross);
      pa::copy_plan(h->plan, tmp);
      std::memset(&h->pb, 0, sizeof h->pb);
      pa::fill_pa_batch(h->pb, h->plan, h->caps, h->self, h->cross);
      char msg[PA_MSG_LEN] = {0};
      pa::check_op(b->ops->plan_batch(b->state, &h->pb, 0, msg), pa::backend_name(b),
                   "plan_batch", msg);
      h->planned = true;
      h->magic = pa::kBatchMagic;
      try {
        /* The backend's workspace counts against the same limit, so that caches, metadata
         * and workspaces together stay within it (the backend checked only its own share). */
        try {
          pa::backend_reserve(b, h->pb.backend_bytes);
        } catch (pa::Error& e) {
          e.msg = "batch workspace: " + e.msg;
          throw;
        }
        try {
          pa::register_handle(h.get());
        } catch (...) {
          pa::backend_unreserve(b, h->pb.backend_bytes);
          throw;
        }
      } catch (...) {
        b->ops->free_batch(b->state, &h->pb);
        throw;
      }
    } catch (...) {
      if (charged) pa::backend_unreserve(b, charged);
      throw;
    }
    pa::backend_retain(b);
    b->live_batches += 1;
    if (pa::log_enabled(PAGEDATTN_LOG_DEBUG))
      pa::log(PAGEDATTN_LOG_DEBUG,
              "%s: batch planned: %d sequences, %lld tokens; capacities %d sequences, %lld "
              "tokens, %d blocks per sequence, sequence length %lld; %llu bytes of host "
              "metadata, %llu of workspace",
              pa::backend_name(b), h->plan.num_seqs, static_cast<long long>(h->plan.num_tokens),
              h->caps.num_seqs, static_cast<long long>(h->caps.num_tokens),
              h->caps.blocks_per_seq, static_cast<long long>(h->caps.seq_len),
              static_cast<unsigned long long>(charged),
              static_cast<unsigned long long>(h->pb.backend_bytes));
    *out = h.release();
  });
}

PAGEDATTN_API pagedattn_status pagedattn_batch_update(pagedattn_batch* batch,
                                                     const pagedattn_batch_desc* desc) {
  return pa::guard([&] {
    pagedattn_batch* h = pa::check_batch(batch, "batch");
    const pagedattn_batch_desc d = pa::read_struct(desc, "desc");
    if (d.block_tables && !h->self.present)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "desc->block_tables is set but the batch was planned without a cache");
    if (d.encoder_lens && !h->cross.present)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "desc->encoder_lens is set but the batch was planned without a cross cache");
    pa::Plan next;
    pa::plan(d, h->self, h->cross, &h->caps, nullptr, next);
    pa::Plan old = h->plan; /* to restore if the backend refuses the new plan */
    std::lock_guard<std::mutex> lock(h->in_use);
    pa::copy_plan(h->plan, next);
    pa::fill_pa_batch(h->pb, h->plan, h->caps, h->self, h->cross);
    pagedattn_backend* b = h->backend;
    char msg[PA_MSG_LEN] = {0};
    const pagedattn_status st = b->ops->plan_batch(b->state, &h->pb, 1, msg);
    if (st != PAGEDATTN_OK) {
      pa::copy_plan(h->plan, old);
      pa::fill_pa_batch(h->pb, h->plan, h->caps, h->self, h->cross);
      char ignored[PA_MSG_LEN] = {0};
      b->ops->plan_batch(b->state, &h->pb, 1, ignored);
      pa::check_op(st, pa::backend_name(b), "plan_batch", msg);
    }
  });
}

PAGEDATTN_API void pagedattn_batch_destroy(pagedattn_batch* batch) {
  if (!batch || !pa::take_handle(batch)) return;
  batch->magic = 0;
  pagedattn_backend* b = batch->backend;
  if (batch->planned) b->ops->free_batch(b->state, &batch->pb);
  const uint64_t charged = pa::plan_host_bytes(batch->caps, batch->self, batch->cross);
  const uint64_t workspace = batch->pb.backend_bytes;
  delete batch;
  pa::backend_unreserve(b, charged + workspace);
  b->live_batches -= 1;
  pa::log(PAGEDATTN_LOG_DEBUG, "%s: batch destroyed: %llu bytes released", pa::backend_name(b),
          static_cast<unsigned long long>(charged + workspace));
  pa::backend_release(b);
}

PAGEDATTN_API pagedattn_status pagedattn_batch_get_info(pagedattn_batch_info* out,
                                                       const pagedattn_batch* batch) {
  return pa::guard([&] {
    pa::check_out_struct(out, "out");
    const pagedattn_batch* h = pa::check_batch(batch, "batch");
    const pa::Plan& p = h->plan;
    pagedattn_batch_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.num_seqs = p.num_seqs;
    info.num_tokens = p.num_tokens;
    info.num_encoder_tokens = p.num_encoder_tokens;
    info.num_decode_seqs = p.num_decode;
    info.num_prefill_seqs = p.num_prefill;
    info.max_query_len = p.max_query_len;
    info.max_seq_len = p.max_seq_len;
    info.max_num_seqs = h->caps.num_seqs;
    info.max_num_tokens = h->caps.num_tokens;
    info.max_blocks_per_seq = h->caps.blocks_per_seq;
    info.block_size = h->self.block_size;
    info.host_bytes = pa::plan_host_bytes(h->caps, h->self, h->cross);
    info.workspace_bytes = h->pb.backend_bytes;
    info.max_num_encoder_tokens = h->caps.num_encoder_tokens;
    info.max_seq_len_capacity = h->caps.seq_len;
    info.max_tree_mask_bytes = h->caps.tree_mask_bytes;
    pa::write_struct(out, info);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_batch_get_slot_mapping(const int64_t** out,
                                                               int64_t* count,
                                                               const pagedattn_batch* batch) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    if (!count) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "count is NULL");
    const pagedattn_batch* h = pa::check_batch(batch, "batch");
    *out = h->plan.slots.data();
    *count = h->plan.num_tokens;
  });
}

PAGEDATTN_API pagedattn_status pagedattn_batch_get_query_start(const int32_t** out,
                                                              int32_t* count,
                                                              const pagedattn_batch* batch) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    if (!count) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "count is NULL");
    const pagedattn_batch* h = pa::check_batch(batch, "batch");
    *out = h->plan.query_start.data();
    *count = h->plan.num_seqs + 1;
  });
}

PAGEDATTN_API pagedattn_status pagedattn_batch_get_cross_slot_mapping(
    const int64_t** out, int64_t* count, const pagedattn_batch* batch) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    if (!count) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "count is NULL");
    const pagedattn_batch* h = pa::check_batch(batch, "batch");
    *out = h->plan.has_cross ? h->plan.cross_slots.data() : nullptr;
    *count = h->plan.has_cross ? h->plan.num_encoder_tokens : 0;
  });
}

}  // extern "C"
