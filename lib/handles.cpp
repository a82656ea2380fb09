/* lib/handles.cpp — the handles' bookkeeping declared in handles.h: the set of live handles,
 * the handle checks, a backend's reference count and memory accounting, and interned strings. */
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "handles.h"

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

}  // namespace pa
