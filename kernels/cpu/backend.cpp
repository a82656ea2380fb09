// lib/cpu/cpu_backend.cpp — the built-in CPU backend: its op table (pa_cpu_backend_ops), state,
// memory, planning and the work split of a forward. The core validated every argument already;
// nothing here throws across the table (every op catches).
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
#include "kernels/runtime/host_alloc.h"
#include "kernels/runtime/spin.h"
#include "kernels/runtime/thread_pool.h"

namespace pa_cpu {
namespace {

constexpr size_t kAlign = 64;  // slack at the end of a batch workspace

struct Backend {
  Target target;
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

// What one forward splits into; recomputed per call (it depends on heads and head size, which
// the batch does not know) into arrays allocated at plan time.
struct Plan {
  std::mutex mu;  // concurrent forwards on one batch take turns (see batch.h)
  int nworkers = 0;
  Scratch* scratch = nullptr;   // [nworkers]
  float* parts = nullptr;       // split-KV partial states
  size_t part_floats = 0;
  int32_t cap_seqs = 0;
  int64_t* item_prefix = nullptr;  // [cap_seqs + 1] work items before sequence i
  int64_t* base_prefix = nullptr;  // [cap_seqs + 1] the same without the splits
  int32_t* splits = nullptr;       // [cap_seqs]
  int64_t* part_off = nullptr;     // [cap_seqs] first float of the sequence's partials, or -1
  void* block = nullptr;           // the one allocation holding all of the above
};

// Floats of partial state per split-KV part (acc, m, l for kMaxRows rows of up to 256 dims).
constexpr size_t kPartFloats = static_cast<size_t>(kMaxRows) * (kMaxHeadSize + 2);
constexpr size_t kMaxParts = (size_t{8} << 20) / (sizeof(float) * kPartFloats);

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
    p->part_floats = std::min(static_cast<size_t>(p->nworkers) * 16, kMaxParts) * kPartFloats;
    const size_t seqs = static_cast<size_t>(p->cap_seqs) + 1;
    const size_t bytes = sizeof(Scratch) * static_cast<size_t>(p->nworkers) +
                         sizeof(float) * p->part_floats + 3 * sizeof(int64_t) * seqs +
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
    p->parts = reinterpret_cast<float*>(c);
    c += sizeof(float) * p->part_floats;
    p->item_prefix = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    p->base_prefix = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    p->part_off = reinterpret_cast<int64_t*>(c);
    c += sizeof(int64_t) * seqs;
    p->splits = reinterpret_cast<int32_t*>(c);
    batch->backend_data = p;
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: could not plan the batch (out of memory)");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
}

void free_batch(void* state, pa_batch* batch) {
  auto* p = static_cast<Plan*>(batch->backend_data);
  if (p == nullptr) return;
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

// How one sequence's rows are cut: heads per item and tokens per item; decode sequences (one
// token) may instead take kv_per_item whole KV heads per item.
struct Shape {
  int32_t group, heads_per_item, head_chunks, tokens_per_item, kv_per_item;
};

void seq_item(const pa_forward_args& a, int32_t i, AttnItem* it);

Shape shape_of(const Backend* b, const pa_forward_args& a) {
  Shape s;
  s.group = a.num_heads / a.num_kv_heads;
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
  if (a.num_kv_heads > 1 && a.cache != nullptr && s.group <= kMaxRows &&
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
      if (multi_head_decode_ok(b->target, proto)) s.kv_per_item = proto.kv_heads;
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
  it->num_keys = keys_of(a, i);
  it->scale = a.scale;
  it->soft_cap = a.soft_cap;
  it->alibi = a.alibi_slopes;
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
}

int32_t seq_of(const int64_t* prefix, int32_t n, int64_t item) {
  // Last i with prefix[i] <= item (prefix is non-decreasing; idle sequences add nothing).
  const int64_t* p = std::upper_bound(prefix, prefix + n + 1, item);
  return static_cast<int32_t>(p - prefix) - 1;
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
    if (a.write_kv && a.cache != nullptr && a.attention_type != PAGEDATTN_ATTENTION_ENCODER_ONLY) {
      pa_write_args w;
      w.cache = a.cache;
      w.layer = a.layer;
      w.k = a.k;
      w.v = a.v;
      w.slots_int64 = 1;
      w.slots_on_device = 0;
      w.k_scale = a.k_scale;
      w.v_scale = a.v_scale;
      w.stream = a.stream;
      if (a.attention_type == PAGEDATTN_ATTENTION_CROSS) {
        w.slots = bt.cross_slot_mapping;
        w.n = bt.num_encoder_tokens;
      } else {
        w.slots = bt.slot_mapping;
        w.n = bt.num_tokens;
      }
      if (w.n > 0 && w.slots != nullptr) {
        const int64_t chunk = write_chunk(w.n, pool.size());
        pool.parallel_for((w.n + chunk - 1) / chunk, [&](int64_t c, int) {
          cache_write_rows(ti, w, c * chunk, std::min(w.n, (c + 1) * chunk));
        });
      }
    }
    if (bt.num_tokens == 0) return PAGEDATTN_OK;

    // 2. Work split: base items per sequence, then split-KV when there are too few of them.
    const Shape sh = shape_of(b, a);
    const int32_t ns = bt.num_seqs;
    plan->base_prefix[0] = 0;
    int64_t max_keys = 0;
    for (int32_t i = 0; i < ns; ++i) {
      const int32_t q = bt.query_lens[i];
      plan->base_prefix[i + 1] = plan->base_prefix[i] + base_items_of(a, sh, q);
      if (q > 0) max_keys = std::max(max_keys, keys_of(a, i));
    }
    const int64_t base_items = plan->base_prefix[ns];
    const int64_t workers = pool.size();
    int32_t want = 1;
    if (workers > 1 && base_items > 0 && base_items < 4 * workers && max_keys >= 512) {
      want = static_cast<int32_t>(std::min<int64_t>(kMaxSplits, (8 * workers + base_items - 1) /
                                                                    base_items));
    }
    const size_t part_stride = kPartFloats;
    for (;;) {
      size_t parts = 0;
      for (int32_t i = 0; i < ns; ++i) {
        int32_t s = 1;
        if (want > 1 && bt.query_lens[i] > 0) {
          s = static_cast<int32_t>(std::min<int64_t>(want, (keys_of(a, i) + 255) / 256));
          s = std::max(s, 1);
        }
        plan->splits[i] = s;
        plan->part_off[i] = -1;
        if (s > 1) {
          plan->part_off[i] = static_cast<int64_t>(parts * part_stride);
          parts += static_cast<size_t>(plan->base_prefix[i + 1] - plan->base_prefix[i]) *
                   static_cast<size_t>(s);
        }
      }
      if (parts * part_stride <= plan->part_floats || want == 1) break;
      want /= 2;  // not enough workspace: fewer splits
    }
    plan->item_prefix[0] = 0;
    for (int32_t i = 0; i < ns; ++i) {
      plan->item_prefix[i + 1] =
          plan->item_prefix[i] + (plan->base_prefix[i + 1] - plan->base_prefix[i]) * plan->splits[i];
    }

    // 3. The items.
    pool.parallel_for(plan->item_prefix[ns], [&](int64_t item, int worker) {
      const int32_t i = seq_of(plan->item_prefix, ns, item);
      const int32_t s = plan->splits[i];
      const int64_t local = item - plan->item_prefix[i];
      const int64_t base = local / s;
      const int32_t split = static_cast<int32_t>(local % s);
      AttnItem it;
      seq_item(a, i, &it);
      place_item(a, sh, i, base, &it);
      it.key0 = 0;
      it.key1 = it.num_keys;
      if (s > 1) {
        const int64_t chunk = ((it.num_keys + s - 1) / s + 15) / 16 * 16;
        it.key0 = std::min<int64_t>(it.num_keys, split * chunk);
        it.key1 = std::min<int64_t>(it.num_keys, it.key0 + chunk);
        float* part = plan->parts + plan->part_off[i] + static_cast<size_t>(local) * part_stride;
        it.out = nullptr;
        it.part_acc = part;
        it.part_m = part + static_cast<size_t>(kMaxRows) * kMaxHeadSize;
        it.part_l = it.part_m + kMaxRows;
      }
      attention_item(b->target, it, &plan->scratch[worker]);
    });

    // 4. Merge the split parts.
    bool any_split = false;
    for (int32_t i = 0; i < ns; ++i) any_split = any_split || plan->splits[i] > 1;
    if (any_split) {
      pool.parallel_for(base_items, [&](int64_t item, int) {
        const int32_t i = seq_of(plan->base_prefix, ns, item);
        const int32_t s = plan->splits[i];
        if (s <= 1) return;
        const int64_t base = item - plan->base_prefix[i];
        AttnItem it;
        seq_item(a, i, &it);
        place_item(a, sh, i, base, &it);
        const float* part = plan->parts + plan->part_off[i] +
                            static_cast<size_t>(base) * s * part_stride;
        const float* m = part + static_cast<size_t>(kMaxRows) * kMaxHeadSize;
        attention_merge_parts(ti, it, s, part, static_cast<int64_t>(part_stride), m,
                              m + kMaxRows, static_cast<int64_t>(part_stride));
      });
    }
    return PAGEDATTN_OK;
  } catch (...) {
    set_msg(msg, "cpu: unexpected exception in forward");
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

pagedattn_status create_with(void** state, const pagedattn_backend_options* opts,
                             std::atomic<uint64_t>* shared_used, char* msg) {
  try {
    Target target;
    // Forces the SIMD target of this backend only (see kernels/cpu/targets.cpp).
    if (!target_select(getenv("PAGEDATTN_CPU_TARGET"), &target, msg))
      return PAGEDATTN_ERROR_UNSUPPORTED;
    if (!prefetch_select(&target, msg)) return PAGEDATTN_ERROR_INVALID_ARGUMENT;
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
                   PAGEDATTN_FEATURE_WRAP_CACHE;
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
    const size_t rec = 2 * half_block_bytes(*cache);
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
};

}  // namespace

pagedattn_status create_embedded(void** state, const pagedattn_backend_options* opts,
                                 std::atomic<uint64_t>* shared_used, char* msg) {
  return create_with(state, opts, shared_used, msg);
}

}  // namespace pa_cpu

extern "C" const pa_backend_ops* pa_cpu_backend_ops(void) { return &pa_cpu::kOps; }
