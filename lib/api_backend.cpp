/* lib/api_backend.cpp — entry points of backend.h: list, create (with `auto`), destroy,
 * capabilities, synchronize. */
#include <cstring>
#include <memory>
#include <string>

#include "handles.h"
#include "registry.h"

namespace pa {

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
  b->live_caches.store(0);
  b->live_batches.store(0);
  std::memset(&b->caps, 0, sizeof b->caps);
  ops->get_capabilities(state, &b->caps);
  b->caps.struct_size = sizeof(pagedattn_capabilities);
  /* MLA needs the op: a backend without it claims no latent caches. */
  if (!ops->forward_mla) {
    b->caps.features &= ~static_cast<uint32_t>(PAGEDATTN_FEATURE_MLA);
    b->caps.latent_sizes = 0;
  }
  if (!b->caps.name) b->caps.name = name;
  if (!b->caps.target) b->caps.target = "";
  if (!b->caps.settings) b->caps.settings = "";
  log(PAGEDATTN_LOG_INFO, "%s: backend created on device %d: %s", b->caps.name,
      opts.device_index, b->caps.settings);
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
      /* First that creates successfully of cuda, hip, onednn, cpu. onednn runs decode and short
       * chunks with the cpu kernels, so those are the same code, and longer chunks through
       * oneDNN matmuls. docs/perf.md ("Rule for `auto` on CPU") measured those faster than cpu
       * on a Xeon with AMX and on Zen 4 from 32 to 128 tokens; on Zen 4 the two are level at 512
       * tokens and cpu is slightly faster at 2048. onednn is taken whenever it loads. */
      static const int32_t order[] = {2, 3, 1, 0};
      std::string reasons;
      for (int32_t idx : order) {
        try {
          *out = pa::publish(pa::create_one(idx, o));
          if (!reasons.empty())
            pa::log(PAGEDATTN_LOG_INFO, "auto: picked %s; passed over: %s", (*out)->caps.name,
                    reasons.c_str());
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

PAGEDATTN_API pagedattn_status pagedattn_backend_get_memory_usage(
    pagedattn_memory_usage* out, const pagedattn_backend* backend) {
  return pa::guard([&] {
    pa::check_out_struct(out, "out");
    const pagedattn_backend* b = pa::check_backend(backend, "backend");
    pagedattn_memory_usage u;
    std::memset(&u, 0, sizeof u);
    u.bytes_in_use = b->mem_used.load();
    u.memory_limit = b->opts.memory_limit;
    u.num_caches = b->live_caches.load();
    u.num_batches = b->live_batches.load();
    pa::write_struct(out, u);
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
