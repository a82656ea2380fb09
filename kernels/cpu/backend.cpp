// kernels/cpu/backend.cpp — the built-in CPU backend: its op table (pa_cpu_backend_ops), state,
// memory and batch workspace, and each op's run over the workers (a forward's work split is in
// schedule.cpp). The core validated every argument already; nothing here throws across the
// table (every op catches).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <thread>

#include "kernels.h"
#include "backend.h"
#include "plugin_abi.h"
#include "schedule.h"
#include "kernels/runtime/env.h"
#include "kernels/runtime/host_alloc.h"
#include "kernels/runtime/spin.h"
#include "kernels/runtime/thread_pool.h"

namespace pa_cpu {
namespace {

constexpr size_t kAlign = 64;  // slack at the end of a batch workspace

struct Backend {
  Target target;
  std::string settings;         // pagedattn_capabilities.settings
  pa_runtime::ThreadPool* pool;
  uint64_t memory_limit;        // 0 = unlimited
  std::atomic<uint64_t> own_used{0};
  // Bytes of caches and workspaces allocated here (pa_runtime::host_alloc), counted against
  // memory_limit: own_used, or the counter of a backend that embeds this one (create_embedded)
  // so one limit covers both.
  std::atomic<uint64_t>* used = &own_used;
};

void set_msg(char* msg, const char* text) {
  if (msg != nullptr) snprintf(msg, PA_MSG_LEN, "%s", text);
}

// ---- plan ----

// A batch's workspace: the workers' scratch and the arrays of the schedule of each forward,
// which is recomputed per call (it depends on heads and head size, which the batch does not know).
struct Plan {
  std::mutex mu;  // concurrent forwards on one batch take turns (see batch.h)
  int nworkers = 0;
  Scratch* scratch = nullptr;   // [nworkers]
  int32_t cap_seqs = 0;
  Schedule sched{};             // its arrays for cap_seqs sequences
  void* block = nullptr;        // the one allocation holding all of the above
  // The workers' MLA scratch, sized by the batch's first MLA forward (or a larger one's).
  float* mla = nullptr;
  size_t mla_floats = 0;        // per worker
};

pagedattn_status plan_batch(void* state, pa_batch* batch, int32_t is_update, char* msg) {
  auto* b = static_cast<Backend*>(state);
  if (is_update) return PAGEDATTN_OK;  // sized for the capacities; the split is per forward
  try {
    auto* p = new (std::nothrow) Plan;
    if (p == nullptr) {
      set_msg(msg, "cpu: out of host memory for a batch plan");
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    p->nworkers = b->pool->size();
    p->cap_seqs = std::max(batch->cap_num_seqs, batch->num_seqs);
    // Room for 16 split parts per worker (splitting only happens when items are few), at most
    // 8 MiB; a forward that needs more splits than fit uses fewer.
    Schedule& sc = p->sched;
    sc.part_floats = std::min(static_cast<size_t>(p->nworkers) * 16, kMaxParts) * kPartFloats;
    const size_t seqs = static_cast<size_t>(p->cap_seqs) + 1;
    const size_t bytes = sizeof(Scratch) * static_cast<size_t>(p->nworkers) +
                         sizeof(float) * sc.part_floats + 3 * sizeof(int64_t) * seqs +
                         sizeof(int32_t) * seqs + kAlign;
    p->block =
        pa_runtime::host_alloc(b->used, b->memory_limit, bytes, msg, "cpu: batch workspace");
    if (p->block == nullptr) {
      delete p;
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    char* c = static_cast<char*>(p->block);
    p->scratch = reinterpret_cast<Scratch*>(c);
    c += sizeof(Scratch) * static_cast<size_t>(p->nworkers);
    sc.parts = reinterpret_cast<float*>(c);
    c += sizeof(float) * sc.part_floats;
    sc.item_prefix = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    sc.base_prefix = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    sc.part_off = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    sc.splits = reinterpret_cast<int32_t*>(c);
    batch->backend_data = p;
    batch->backend_bytes = bytes;
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: could not plan the batch (out of memory)");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
}

void free_batch(void* state, pa_batch* batch) {
  auto* p = static_cast<Plan*>(batch->backend_data);
  if (p == nullptr) return;
  if (p->mla != nullptr) pa_runtime::host_free(static_cast<Backend*>(state)->used, p->mla);
  pa_runtime::host_free(static_cast<Backend*>(state)->used, p->block);
  delete p;
  batch->backend_data = nullptr;
}

// Cache-write rows per parallel_for index: up to 64, but at least one index per worker, so a
// decode step's few rows (one per sequence) are converted on every thread.
int64_t write_chunk(int64_t n, int workers) {
  return std::max<int64_t>(1, std::min<int64_t>(64, (n + workers - 1) / std::max(workers, 1)));
}

// ---- forward ----

// Merges the split-KV parts of a forward's schedule into its output rows, `dim` values each.
void merge_splits(pa_runtime::ThreadPool& pool, uint32_t ti, const pa_forward_args& a,
                  const Schedule& sc, int32_t dim) {
  if (!sc.any_split) return;
  pool.parallel_for(sc.base_items, [&](int64_t item, int) {
    AttnItem it;
    SplitParts parts;
    merge_item(a, sc, item, &it, &parts);
    if (parts.n <= 1) return;
    it.head_size = dim;
    attention_merge_parts(ti, it, parts.n, parts.acc, parts.stride, parts.m, parts.l,
                          parts.stride);
  });
}

pagedattn_status forward(void* state, const pa_forward_args* args, char* msg) {
  auto* b = static_cast<Backend*>(state);
  const pa_forward_args& a = *args;
  const pa_batch& bt = *a.batch;
  try {
    auto* plan = static_cast<Plan*>(bt.backend_data);
    if (plan == nullptr) {
      set_msg(msg, "cpu: batch was not planned for this backend");
      return PAGEDATTN_ERROR_INTERNAL;
    }
    std::lock_guard<std::mutex> lock(plan->mu);
    pa_runtime::ThreadPool& pool = *b->pool;
    const uint32_t ti = b->target.index;

    // 1. The step's K/V into the cache.
    pa_write_args w;
    if (pa_forward_write_args(&a, &w)) {
      const int64_t chunk = write_chunk(w.n, pool.size());
      pool.parallel_for((w.n + chunk - 1) / chunk, [&](int64_t c, int) {
        cache_write_rows(ti, w, c * chunk, std::min(w.n, (c + 1) * chunk));
      });
    }
    if (bt.num_tokens == 0) return PAGEDATTN_OK;

    // 2. Work split: base items per sequence, then split-KV when there are too few of them.
    Schedule& sc = plan->sched;
    schedule_forward(b->target, a, pool.size(), &sc);

    // 3. The items.
    pool.parallel_for(sc.items, [&](int64_t item, int worker) {
      AttnItem it;
      work_item(a, sc, item, &it);
      attention_item(b->target, it, &plan->scratch[worker]);
    });

    // 4. Merge the split parts.
    merge_splits(pool, ti, a, sc, a.head_size);
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in forward");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

// ---- multi-head latent attention ----

// Value sizes the MLA kernel takes: whole vectors of every target (16 floats).
bool mla_value_size_ok(int32_t R, int32_t D) { return R % 16 == 0 && R > 0 && R < D; }

pagedattn_status forward_mla(void* state, const pa_forward_args* args, char* msg) {
  auto* b = static_cast<Backend*>(state);
  const pa_forward_args& a = *args;
  const pa_batch& bt = *a.batch;
  try {
    auto* plan = static_cast<Plan*>(bt.backend_data);
    if (plan == nullptr) {
      set_msg(msg, "cpu: batch was not planned for this backend");
      return PAGEDATTN_ERROR_INTERNAL;
    }
    if (!mla_value_size_ok(a.value_size, a.head_size)) {
      snprintf(msg, PA_MSG_LEN,
               "cpu: value size %d is not supported with latent rows of %d (supported: a "
               "multiple of 16 below the row size)",
               a.value_size, a.head_size);
      return PAGEDATTN_ERROR_UNSUPPORTED;
    }
    std::lock_guard<std::mutex> lock(plan->mu);
    pa_runtime::ThreadPool& pool = *b->pool;
    Schedule& sc = plan->sched;
    schedule_forward(b->target, a, pool.size(), &sc);
    const int rows = sc.shape.heads_per_item * sc.shape.tokens_per_item;
    const size_t need = mla_layout(std::min(rows, kMlaMaxRows), a.head_size, a.value_size).total;
    if (need > plan->mla_floats) {
      void* m = pa_runtime::host_alloc(b->used, b->memory_limit,
                                       need * sizeof(float) * static_cast<size_t>(plan->nworkers),
                                       msg, "cpu: MLA workspace");
      if (m == nullptr) return PAGEDATTN_ERROR_OUT_OF_MEMORY;
      if (plan->mla != nullptr) pa_runtime::host_free(b->used, plan->mla);
      plan->mla = static_cast<float*>(m);
      plan->mla_floats = need;
    }
    pool.parallel_for(sc.items, [&](int64_t item, int worker) {
      MlaItem m;
      work_item(a, sc, item, &m.a);
      m.q_pe = a.q_pe.data;
      m.q_pe_row_stride = a.q_pe.row_stride;
      m.q_pe_head_stride = a.q_pe.head_stride;
      m.value_size = a.value_size;
      mla_item(b->target, m, plan->mla + static_cast<size_t>(worker) * plan->mla_floats);
    });
    // The parts and the output rows are value_size wide.
    merge_splits(pool, b->target.index, a, sc, a.value_size);
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in forward_mla");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

// ---- the rest of the table ----

pagedattn_status probe(int32_t device_index, char* msg) {
  if (device_index != 0) {
    snprintf(msg, PA_MSG_LEN, "cpu: device_index %d requested; the CPU backend has only device 0",
             device_index);
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
  return PAGEDATTN_OK;
}

// The target of a backend created now, and the status a create op fails with (see
// choose_target in backend.h).
pagedattn_status select_target(Target* target, char* msg) {
  // Forces the SIMD target of this backend only (see targets.cpp).
  if (!target_select(getenv("PAGEDATTN_CPU_TARGET"), target, msg))
    return PAGEDATTN_ERROR_UNSUPPORTED;
  if (!prefetch_select(target, msg)) return PAGEDATTN_ERROR_INVALID_ARGUMENT;
  return PAGEDATTN_OK;
}

// The settings line: what this backend runs and every variable it read.
std::string describe(const Target& t, int threads, int spin_us) {
  std::string s = "target ";
  s += t.name;
  s += getenv("PAGEDATTN_CPU_TARGET") ? " (PAGEDATTN_CPU_TARGET)"
                                       : " (best runnable; PAGEDATTN_CPU_TARGET unset)";
  s += t.prefetch_twice ? ", prefetch twice (" : ", prefetch once (";
  s += pa_runtime::env_note("PAGEDATTN_CPU_PREFETCH") + "), " + std::to_string(threads) +
       " threads, spin " + std::to_string(spin_us) + " us (" +
       pa_runtime::env_note("PAGEDATTN_CPU_SPIN_US") + ")";
  return s;
}

pagedattn_status create_with(void** state, const pagedattn_backend_options* opts,
                             std::atomic<uint64_t>* shared_used, char* msg) {
  try {
    Target target;
    const pagedattn_status target_st = select_target(&target, msg);
    if (target_st != PAGEDATTN_OK) return target_st;
    int spin_us = 0;
    if (!pa_runtime::spin_us_from_env(&spin_us, msg)) return PAGEDATTN_ERROR_INVALID_ARGUMENT;
    int n = opts->num_threads;
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
    auto* b = new (std::nothrow) Backend;
    if (b == nullptr) {
      set_msg(msg, "cpu: out of host memory for the backend");
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    b->target = target;
    b->settings = describe(target, n, spin_us);
    b->memory_limit = opts->memory_limit;
    if (shared_used != nullptr) b->used = shared_used;
    try {
      b->pool = new pa_runtime::ThreadPool(n, spin_us);
    } catch (...) {
      delete b;
      snprintf(msg, PA_MSG_LEN, "cpu: could not start %d worker threads", n);
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    *state = b;
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception creating the backend");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

pagedattn_status create(void** state, const pagedattn_backend_options* opts, char* msg) {
  return create_with(state, opts, nullptr, msg);
}

void destroy(void* state) {
  auto* b = static_cast<Backend*>(state);
  if (b == nullptr) return;
  delete b->pool;
  delete b;
}

void get_capabilities(void* state, pagedattn_capabilities* caps) {
  auto* b = static_cast<Backend*>(state);
  caps->name = "cpu";
  caps->device.device_type = PAGEDATTN_DEVICE_CPU;
  caps->device.device_id = 0;
  caps->features = PAGEDATTN_FEATURE_ALIBI | PAGEDATTN_FEATURE_SOFT_CAP |
                   PAGEDATTN_FEATURE_SLIDING_WINDOW | PAGEDATTN_FEATURE_CROSS_ATTENTION |
                   PAGEDATTN_FEATURE_ENCODER | PAGEDATTN_FEATURE_FP8_CACHE |
                   PAGEDATTN_FEATURE_LSE | PAGEDATTN_FEATURE_MERGE_STATES |
                   PAGEDATTN_FEATURE_CHUNKED_PREFILL | PAGEDATTN_FEATURE_HOST_SWAP |
                   PAGEDATTN_FEATURE_WRAP_CACHE | PAGEDATTN_FEATURE_SINKS |
                   PAGEDATTN_FEATURE_CHUNKED_LOCAL | PAGEDATTN_FEATURE_HEAD_SCALES |
                   PAGEDATTN_FEATURE_TREE_MASK | PAGEDATTN_FEATURE_MLA;
  caps->dtypes = PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FLOAT32) |
                 PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FLOAT16) |
                 PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_BFLOAT16);
  caps->cache_dtypes = caps->dtypes | PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FP8_E4M3) |
                       PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_FP8_E5M2);
  caps->layouts = (1u << PAGEDATTN_LAYOUT_NHD) | (1u << PAGEDATTN_LAYOUT_HND);
  caps->block_sizes = 0x1FFu;
  caps->head_sizes = 0xFFFFFFFFu;
  caps->max_num_threads = b->pool->size();
  caps->total_memory = 0;
  caps->target = b->target.name;
  caps->settings = b->settings.c_str();
  caps->latent_sizes = 0xFFFFFFFFu;  // every multiple of 32 up to 1024
}

pagedattn_status alloc(void* state, size_t bytes, int32_t /*host*/, void** ptr, char* msg) {
  auto* b = static_cast<Backend*>(state);
  void* p = pa_runtime::host_alloc(b->used, b->memory_limit, bytes, msg, "cpu: cache memory");
  if (p == nullptr) return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  *ptr = p;
  return PAGEDATTN_OK;
}

void free_mem(void* state, void* ptr, int32_t /*host*/) {
  pa_runtime::host_free(static_cast<Backend*>(state)->used, ptr);
}

pagedattn_status cache_write(void* state, const pa_write_args* args, char* msg) {
  auto* b = static_cast<Backend*>(state);
  try {
    const int64_t chunk = write_chunk(args->n, b->pool->size());
    const uint32_t ti = b->target.index;
    b->pool->parallel_for((args->n + chunk - 1) / chunk, [&](int64_t c, int) {
      cache_write_rows(ti, *args, c * chunk, std::min(args->n, (c + 1) * chunk));
    });
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in cache_write");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

pagedattn_status copy_blocks(void* state, const pa_cache* cache, const int32_t* pairs, size_t n,
                             void* /*stream*/, char* msg) {
  auto* b = static_cast<Backend*>(state);
  try {
    const int64_t L = cache->num_layers;
    b->pool->parallel_for(static_cast<int64_t>(n) * L, [&](int64_t w, int) {
      const int64_t pi = w / L;
      const int32_t layer = static_cast<int32_t>(w % L);
      if (pairs[2 * pi] == pairs[2 * pi + 1]) return;
      copy_block(*cache, pairs[2 * pi + 1], *cache, pairs[2 * pi], layer);
    });
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in copy_blocks");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

pagedattn_status swap_blocks(void* state, const pa_cache* dst, const pa_cache* src,
                             const int32_t* pairs, size_t n, void* /*stream*/, char* msg) {
  auto* b = static_cast<Backend*>(state);
  try {
    const int64_t L = src->num_layers;
    b->pool->parallel_for(static_cast<int64_t>(n) * L, [&](int64_t w, int) {
      const int64_t pi = w / L;
      copy_block(*dst, pairs[2 * pi + 1], *src, pairs[2 * pi], static_cast<int32_t>(w % L));
    });
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in swap_blocks");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

size_t half_block_bytes(const pa_cache& c) {
  return static_cast<size_t>(c.block_size) * static_cast<size_t>(c.num_kv_heads) *
         static_cast<size_t>(c.head_size) *
         (c.dtype == PAGEDATTN_DTYPE_FLOAT32 ? 4 : c.dtype <= PAGEDATTN_DTYPE_BFLOAT16 ? 2 : 1);
}

pagedattn_status pack_blocks(Backend* b, const pa_cache* cache, const int32_t* ids, size_t n,
                             void* buffer, bool unpack, char* msg) {
  try {
    const int64_t L = cache->num_layers;
    const size_t rec = (cache->latent ? 1 : 2) * half_block_bytes(*cache);
    b->pool->parallel_for(static_cast<int64_t>(n) * L, [&](int64_t w, int) {
      char* at = static_cast<char*>(buffer) + static_cast<size_t>(w) * rec;
      pack_block(*cache, ids[w / L], static_cast<int32_t>(w % L), at, unpack);
    });
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception packing blocks");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

pagedattn_status read_blocks(void* state, const pa_cache* cache, const int32_t* ids, size_t n,
                             void* buffer, void* /*stream*/, char* msg) {
  return pack_blocks(static_cast<Backend*>(state), cache, ids, n, buffer, false, msg);
}

pagedattn_status load_blocks(void* state, const pa_cache* cache, const int32_t* ids, size_t n,
                             const void* buffer, void* /*stream*/, char* msg) {
  return pack_blocks(static_cast<Backend*>(state), cache, ids, n, const_cast<void*>(buffer), true,
                     msg);
}

pagedattn_status merge_states(void* state, const pa_merge_args* args, char* msg) {
  auto* b = static_cast<Backend*>(state);
  try {
    const int64_t T = args->out.rows, chunk = 16;
    const uint32_t ti = b->target.index;
    b->pool->parallel_for((T + chunk - 1) / chunk, [&](int64_t c, int) {
      merge_rows(ti, *args, c * chunk, std::min(T, (c + 1) * chunk));
    });
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in merge_states");
    return PAGEDATTN_ERROR_INTERNAL;
  }
}

pagedattn_status synchronize(void*, void*, char*) { return PAGEDATTN_OK; }

const pa_backend_ops kOps = {
    PA_PLUGIN_ABI_VERSION,
    static_cast<uint32_t>(sizeof(pa_backend_ops)),
    "cpu",
    probe,
    create,
    destroy,
    get_capabilities,
    alloc,
    free_mem,
    nullptr,  // cache_attach: no per-cache state
    nullptr,  // cache_detach
    cache_write,
    copy_blocks,
    swap_blocks,
    read_blocks,
    load_blocks,
    plan_batch,
    free_batch,
    forward,
    merge_states,
    synchronize,
    forward_mla,
};

}  // namespace

pagedattn_status create_embedded(void** state, const pagedattn_backend_options* opts,
                                 std::atomic<uint64_t>* shared_used, char* msg) {
  return create_with(state, opts, shared_used, msg);
}

pagedattn_status choose_target(TargetChoice* out, char* msg) {
  Target target;
  const pagedattn_status st = select_target(&target, msg);
  if (st != PAGEDATTN_OK) return st;
  out->index = target.index;
  out->bf16_dp = target.bf16_dp;
  return PAGEDATTN_OK;
}

}  // namespace pa_cpu

extern "C" const pa_backend_ops* pa_cpu_backend_ops(void) { return &pa_cpu::kOps; }
