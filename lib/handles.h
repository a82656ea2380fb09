/* lib/handles.h — what the opaque public handles are inside: a backend (ops table + state +
 * reference count), a KV cache (geometry + resolved pa_cache) and a planned batch. Each starts
 * with a magic number checked on every use (after a look-up in the set of live handles) and
 * cleared on destroy. Caches and batches hold a reference on their backend so out-of-order
 * destruction never frees a backend still in use. The functions below are in handles.cpp. */
#ifndef PAGEDATTN_LIB_HANDLES_H
#define PAGEDATTN_LIB_HANDLES_H

#include <atomic>
#include <mutex>
#include <vector>

#include "internal.h"
#include "planner.h"

namespace pa {

constexpr uint64_t kBackendMagic = 0x31424b4341504150ull; /* "PAPACKB1" */
constexpr uint64_t kBackendDead = 0x44424b4341504150ull;  /* user-destroyed, still referenced */
constexpr uint64_t kCacheMagic = 0x3143564b41504150ull;   /* "PAPAKVC1" */
constexpr uint64_t kBatchMagic = 0x3154434241504150ull;   /* "PAPABCT1" */

}  // namespace pa

struct pagedattn_backend {
  uint64_t magic;
  const pa_backend_ops* ops;
  void* state;
  std::atomic<int64_t> refs; /* 1 for the user + 1 per live cache/batch */
  pagedattn_capabilities caps;
  pagedattn_backend_options opts;
  std::atomic<uint64_t> mem_used; /* bytes of caches allocated through ops->alloc, batch host
                                     metadata and backend workspaces: what memory_limit bounds */
  std::atomic<int32_t> live_caches;
  std::atomic<int32_t> live_batches;
};

struct pagedattn_kv_cache {
  uint64_t magic;
  pagedattn_backend* backend;
  pagedattn_kv_cache_desc desc;
  std::vector<void*> k_layers;
  std::vector<void*> v_layers;
  pa_cache pc;
  void* slab;      /* owned memory (NULL when wrapping) */
  uint64_t bytes;  /* size of slab */
  uint64_t bytes_per_block; /* all layers, K and V: one record of read_blocks */
  bool attached;   /* cache_attach succeeded */
  /* The strides get_layer reports: the caller's for a wrapped cache (pc keeps the compact one
   * in a dimension of extent 1, whose stride is never used), else pc's. */
  int64_t strides[3];
};

struct pagedattn_batch {
  uint64_t magic;
  pagedattn_backend* backend;
  pa::Plan plan;       /* host arrays, reserved to the capacities */
  pa::PlanCaps caps;
  pa::Geometry self;   /* the cache planned against */
  pa::Geometry cross;
  pa_batch pb;         /* what the backend sees; points into plan */
  bool planned;        /* plan_batch succeeded at least once (free_batch needed) */
  mutable std::mutex in_use; /* forwards on one batch share its workspace */
};

namespace pa {

/* Live handles are kept in a set, so a destroyed or foreign pointer is recognised without
 * reading freed memory. register_handle may throw (bad_alloc); take_handle removes a live handle
 * and says whether it was live (a second destroy is then a no-op). */
void register_handle(const void* h);
bool handle_live(const void* h) noexcept;
bool take_handle(const void* h) noexcept;

/* Handle checks: NULL -> NULL_POINTER, wrong/destroyed -> INVALID_HANDLE naming `name`. */
pagedattn_backend* check_backend(const pagedattn_backend* b, const char* name);
pagedattn_kv_cache* check_cache(const pagedattn_kv_cache* c, const char* name);
pagedattn_batch* check_batch(const pagedattn_batch* b, const char* name);

void backend_retain(pagedattn_backend* b) noexcept;
void backend_release(pagedattn_backend* b) noexcept;

/* Memory-limit accounting (mem_used): reserve fails with OUT_OF_MEMORY past the limit. */
void backend_reserve(pagedattn_backend* b, uint64_t bytes);
void backend_unreserve(pagedattn_backend* b, uint64_t bytes) noexcept;

/* A copy of s that lives as long as the process (for strings handed out in info structs). */
const char* intern(const std::string& s);

inline const char* backend_name(const pagedattn_backend* b) {
  return b->ops && b->ops->name ? b->ops->name : "backend";
}

}  // namespace pa

#endif /* PAGEDATTN_LIB_HANDLES_H */
