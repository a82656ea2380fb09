/* lib/log.cpp — the application's log callback (pagedattn_set_log_callback) and the core's way
 * to reach it. One callback per process. Callers take a shared lock while they call it, so
 * replacing it waits for calls in flight and the old one is never called afterwards; a
 * thread-local flag keeps calls made from inside the callback from logging (or re-entering the
 * lock). */
#include <atomic>
#include <mutex>
#include <shared_mutex>

#include "internal.h"

namespace pa {

namespace {

struct Sink {
  pagedattn_log_fn fn = nullptr;
  void* user = nullptr;
  int32_t max_level = -1;
};

std::shared_mutex g_mu;
Sink g_sink;                            /* under g_mu */
std::atomic<int32_t> g_max_level{-1};   /* g_sink.max_level, or -1 without a callback */
thread_local bool tl_in_callback = false;

}  // namespace

bool log_enabled(pagedattn_log_level level) noexcept {
  return !tl_in_callback && raw_enum(level) <= g_max_level.load(std::memory_order_relaxed);
}

void log(pagedattn_log_level level, const char* fmt, ...) noexcept {
  if (!log_enabled(level)) return;
  try {
    va_list ap;
    va_start(ap, fmt);
    const std::string line = vformat(fmt, ap);
    va_end(ap);
    std::shared_lock<std::shared_mutex> lock(g_mu);
    if (g_sink.fn == nullptr || raw_enum(level) > g_sink.max_level) return;
    tl_in_callback = true;
    g_sink.fn(g_sink.user, level, line.c_str());
    tl_in_callback = false;
  } catch (...) {
    /* Composing the line ran out of memory, or the callback threw: the call it reports on
     * stands as it is. */
    tl_in_callback = false;
  }
}

pagedattn_status failed(pagedattn_status status, const char* msg) noexcept {
  set_last_error(msg);
  log(PAGEDATTN_LOG_ERROR, "%s: %s", pagedattn_status_string(status), msg);
  return status;
}

}  // namespace pa

extern "C" {

PAGEDATTN_API pagedattn_status pagedattn_set_log_callback(pagedattn_log_fn fn, void* user_data,
                                                         pagedattn_log_level max_level) {
  return pa::guard([&] {
    if (pa::tl_in_callback)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "pagedattn_set_log_callback called from inside the log callback");
    const int32_t level = pa::raw_enum(max_level);
    if (level < PAGEDATTN_LOG_ERROR || level > PAGEDATTN_LOG_DEBUG)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "max_level = %d is not a pagedattn_log_level (%d..%d)", level, PAGEDATTN_LOG_ERROR,
               PAGEDATTN_LOG_DEBUG);
    std::unique_lock<std::shared_mutex> lock(pa::g_mu);
    pa::g_sink.fn = fn;
    pa::g_sink.user = user_data;
    pa::g_sink.max_level = fn ? level : -1;
    pa::g_max_level.store(pa::g_sink.max_level, std::memory_order_relaxed);
  });
}

}  // extern "C"
