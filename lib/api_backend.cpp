/* lib/api_backend.cpp — entry points of backend.h (list, create, destroy, capabilities,
 * synchronize) and the handle checks / reference counting shared by the other entry points. */
#include <memory>
#include <cstring>
#include <new>
#include <unordered_set>
#include <mutex>
#include <string>

#include "handles.h"
#include "registry.h"

namespace pa {

namespace {
/* The set of live handles. Handles may be destroyed from static destructors at exit, in any
 * order, so the set is never destroyed: it lives in static storage (placement new, no exit-time
 * destructor) and gives its heap memory back whenever it empties, so a program that destroys
 * every handle and then dlclose()s the library leaks nothing. std::mutex is constant-initialised
 * and trivially destructible on glibc, so it is safe at any point of exit. */
using LiveSet = std::unordered_set<const void*>;
std::mutex g_live_mutex;
alignas(LiveSet) unsigned char g_live_storage[sizeof(LiveSet)];
LiveSet* g_live = nullptr;  // guarded by g_live_mutex

LiveSet& live_set_locked() {
  if (!g_live) g_live = new (g_live_storage) LiveSet();
  return *g_live;
}
}  // namespace

void register_handle(const void* h) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  live_set_locked().insert(h);
}

bool handle_live(const void* h) noexcept {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  return g_live && g_live->count(h) != 0;
}

bool take_handle(const void* h) noexcept {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  if (!g_live || g_live->erase(h) == 0) return false;
  if (g_live->empty()) LiveSet().swap(*g_live);  // frees the bucket array
  return true;
}

pagedattn_backend* check_backend(const pagedattn_backend* b, const char* name) {
  if (!b) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  if (!handle_live(b) || b->magic != kBackendMagic)
    fail(PAGEDATTN_ERROR_INVALID_HANDLE, "%s was destroyed or is not a pagedattn_backend", name);
  return const_cast<pagedattn_backend*>(b);
}

pagedattn_kv_cache* check_cache(const pagedattn_kv_cache* c, const char* name) {
  if (!c) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  if (!handle_live(c) || c->magic != kCacheMagic)
    fail(PAGEDATTN_ERROR_INVALID_HANDLE, "%s was destroyed or is not a pagedattn_kv_cache", name);
  return const_cast<pagedattn_kv_cache*>(c);
}

pagedattn_batch* check_batch(const pagedattn_batch* b, const char* name) {
  if (!b) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  if (!handle_live(b) || b->magic != kBatchMagic)
    fail(PAGEDATTN_ERROR_INVALID_HANDLE, "%s was destroyed or is not a pagedattn_batch", name);
  return const_cast<pagedattn_batch*>(b);
}

void backend_retain(pagedattn_backend* b) noexcept { b->refs.fetch_add(1); }

void backend_release(pagedattn_backend* b) noexcept {
  if (b->refs.fetch_sub(1) != 1) return;
  b->ops->destroy(b->state);
  b->magic = 0;
  delete b;
}

void backend_reserve(pagedattn_backend* b, uint64_t bytes) {
  const uint64_t limit = b->opts.memory_limit;
  uint64_t used = b->mem_used.load();
  for (;;) {
    uint64_t next = used + bytes;
    if (next < used || (limit != 0 && next > limit))
      fail(PAGEDATTN_ERROR_OUT_OF_MEMORY,
           "%s: allocating %llu bytes exceeds memory_limit %llu (%llu bytes in use)",
           backend_name(b), static_cast<unsigned long long>(bytes),
           static_cast<unsigned long long>(limit), static_cast<unsigned long long>(used));
    if (b->mem_used.compare_exchange_weak(used, next)) return;
  }
}

void backend_unreserve(pagedattn_backend* b, uint64_t bytes) noexcept {
  b->mem_used.fetch_sub(bytes);
}

const char* intern(const std::string& s) {
  /* Append-only pool in static storage: returned pointers stay valid while the library is loaded,
   * are safe to read from any thread, and nothing is left on the heap after dlclose(). The strings
   * are the few distinct "unavailable" reasons of the backends, far below the pool's size. */
  static std::mutex mu;
  static char pool[16384];
  static size_t used = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (size_t at = 0; at < used; at += std::strlen(pool + at) + 1)
    if (s == pool + at) return pool + at;
  if (s.size() + 1 > sizeof pool - used) return "(reason not kept: message pool full)";
  char* p = pool + used;
  std::memcpy(p, s.c_str(), s.size() + 1);
  used += s.size() + 1;
  return p;
}

namespace {

/* The message for backend `index`'s own probe or create failing: for a plugin it names the file,
 * "onednn: /usr/lib/libpagedattn-onednn.so: create failed: <the plugin's reason>"; the built-in
 * backend keeps "cpu: <reason>". A reason that starts with the backend's name does not repeat it. */
std::string op_failure(int32_t index, const char* op, pagedattn_status st, const char* msg) {
  const char* name = backend_name_at(index);
  const size_t n = std::strlen(name);
  std::string reason = msg ? msg : "";
  if (reason.compare(0, n, name) == 0 && reason.size() > n && reason[n] == ':') {
    size_t at = n + 1;
    while (at < reason.size() && reason[at] == ' ') ++at;
    reason.erase(0, at);
  }
  if (reason.empty()) reason = format("%s returned %s", op, pagedattn_status_string(st));
  const std::string origin = backend_origin(index);
  if (origin == name) return format("%s: %s", name, reason.c_str());
  return format("%s: %s failed: %s", origin.c_str(), op, reason.c_str());
}

/* Loads, probes and creates backend `index`; returns the new handle. */
pagedattn_backend* create_one(int32_t index, const pagedattn_backend_options& opts) {
  const pa_backend_ops* ops = backend_ops(index);
  const char* name = backend_name_at(index);
  char msg[PA_MSG_LEN] = {0};
  pagedattn_status st = ops->probe(opts.device_index, msg);
  if (st != PAGEDATTN_OK) {
    const std::string op = format("probe of device %d", opts.device_index);
    fail(st, "%s", op_failure(index, op.c_str(), st, msg).c_str());
  }
  std::unique_ptr<pagedattn_backend> b(new pagedattn_backend());
  void* state = nullptr;
  msg[0] = '\0';
  st = ops->create(&state, &opts, msg);
  if (st != PAGEDATTN_OK) fail(st, "%s", op_failure(index, "create", st, msg).c_str());
  b->magic = kBackendMagic;
  b->ops = ops;
  b->state = state;
  b->refs.store(1);
  b->opts = opts;
  b->mem_used.store(0);
  std::memset(&b->caps, 0, sizeof b->caps);
  ops->get_capabilities(state, &b->caps);
  b->caps.struct_size = sizeof(pagedattn_capabilities);
  if (!b->caps.name) b->caps.name = name;
  return b.release();
}

pagedattn_backend* publish(pagedattn_backend* b) {
  try {
    register_handle(b);
  } catch (...) {
    backend_release(b);
    throw;
  }
  return b;
}

}  // namespace

}  // namespace pa

extern "C" {

PAGEDATTN_API pagedattn_status pagedattn_backend_options_init(pagedattn_backend_options* opts) {
  return pa::guard([&] {
    if (!opts) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "opts is NULL");
    std::memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
  });
}

PAGEDATTN_API int32_t pagedattn_backend_count(void) { return pa::kNumBackends; }

PAGEDATTN_API pagedattn_status pagedattn_backend_get_info(pagedattn_backend_info* out,
                                                         int32_t index) {
  return pa::guard([&] {
    pa::check_out_struct(out, "out");
    if (index < 0 || index >= pa::kNumBackends)
      pa::fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "index = %d is not in [0, %d)", index,
               pa::kNumBackends);
    pagedattn_backend_info info;
    std::memset(&info, 0, sizeof info);
    info.name = pa::backend_name_at(index);
    info.available = 0;
    info.reason = "";
    try {
      const pa_backend_ops* ops = pa::backend_ops(index);
      char msg[PA_MSG_LEN] = {0};
      const pagedattn_status st = ops->probe(0, msg);
      if (st == PAGEDATTN_OK)
        info.available = 1;
      else  /* the same words pagedattn_backend_create says for device 0 */
        info.reason = pa::intern(pa::op_failure(index, "probe of device 0", st, msg));
    } catch (const pa::Error& e) {
      info.reason = pa::intern(e.msg);
    }
    pa::write_struct(out, info);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_backend_create(pagedattn_backend** out, const char* name,
                                                       const pagedattn_backend_options* opts) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    if (!name) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "name is NULL");
    pagedattn_backend_options o;
    if (opts) {
      o = pa::read_struct(opts, "opts");
    } else {
      std::memset(&o, 0, sizeof o);
    }
    o.struct_size = sizeof o;
    if (o.device_index < 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->device_index = %d < 0", o.device_index);
    if (o.num_threads < 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->num_threads = %d < 0", o.num_threads);
    if (o.flags != 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->flags = 0x%x, must be 0", o.flags);
    if (std::strcmp(name, "auto") == 0) {
      /* First that creates successfully of cuda, hip, onednn, cpu. onednn runs decode with the
       * cpu kernels and prefill through oneDNN matmuls, which bench/RESULTS.md measured faster
       * than cpu for every chunk of 16+ tokens and equal below, so it wins whenever it loads. */
      static const int32_t order[] = {2, 3, 1, 0};
      std::string reasons;
      for (int32_t idx : order) {
        try {
          *out = pa::publish(pa::create_one(idx, o));
          return;
        } catch (const pa::Error& e) {
          reasons += (reasons.empty() ? "" : "; ") + e.msg;
          if (idx == 0) pa::fail(e.status, "auto: no backend could be created: %s", reasons.c_str());
        }
      }
    }
    const int32_t idx = pa::backend_index(name);
    if (idx < 0)
      pa::fail(PAGEDATTN_ERROR_UNKNOWN_BACKEND, "unknown backend \"%s\" (known: %s)", name,
               pa::known_backend_names().c_str());
    *out = pa::publish(pa::create_one(idx, o));
  });
}

PAGEDATTN_API void pagedattn_backend_destroy(pagedattn_backend* backend) {
  if (!backend || !pa::take_handle(backend)) return;
  backend->magic = pa::kBackendDead;
  pa::backend_release(backend);
}

PAGEDATTN_API pagedattn_status pagedattn_backend_get_capabilities(
    pagedattn_capabilities* out, const pagedattn_backend* backend) {
  return pa::guard([&] {
    pa::check_out_struct(out, "out");
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    pa::write_struct(out, b->caps);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_backend_synchronize(pagedattn_backend* backend,
                                                            void* stream) {
  return pa::guard([&] {
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->synchronize(b->state, stream, msg), pa::backend_name(b), "synchronize",
                 msg);
  });
}

}  // extern "C"
