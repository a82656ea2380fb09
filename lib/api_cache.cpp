/* lib/api_cache.cpp — entry points of kv_cache.h: geometry, create/wrap/destroy, write
 * (reshape-and-cache), copy/swap of blocks, read/load of blocks. Everything is validated before
 * the backend op runs, so a refused call writes nothing. */
#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "handles.h"
#include "validate.h"

namespace pa {

namespace {

void compact_strides(const pagedattn_kv_cache_desc& d, int64_t* block, int64_t* slot,
                     int64_t* head) {
  const int64_t D = d.head_size, H = d.num_kv_heads, bs = d.block_size;
  if (d.layout == PAGEDATTN_LAYOUT_NHD) {
    *block = bs * H * D;
    *slot = H * D;
    *head = D;
  } else {
    *block = H * bs * D;
    *head = bs * D;
    *slot = D;
  }
}

bool is_gpu_backend(const pagedattn_backend* b) {
  return !is_host_device_type(b->caps.device.device_type);
}

pagedattn_device host_device_of(const pagedattn_backend* b) {
  pagedattn_device d = b->caps.device;
  if (d.device_type == PAGEDATTN_DEVICE_CUDA) d.device_type = PAGEDATTN_DEVICE_CUDA_HOST;
  else if (d.device_type == PAGEDATTN_DEVICE_ROCM) d.device_type = PAGEDATTN_DEVICE_ROCM_HOST;
  else d.device_type = PAGEDATTN_DEVICE_CPU;
  return d;
}

/* A handle with geometry and compact strides filled; pointers and device set by the caller. */
std::unique_ptr<pagedattn_kv_cache> new_cache(pagedattn_backend* b,
                                              const pagedattn_kv_cache_desc& d, uint64_t bpb) {
  std::unique_ptr<pagedattn_kv_cache> c(new pagedattn_kv_cache());
  c->magic = 0;
  c->backend = b;
  c->desc = d;
  c->desc.struct_size = sizeof(pagedattn_kv_cache_desc);
  c->k_layers.assign(static_cast<size_t>(d.num_layers), nullptr);
  c->v_layers.assign(static_cast<size_t>(d.num_layers), nullptr);
  c->slab = nullptr;
  c->bytes = 0;
  c->bytes_per_block = bpb;
  c->attached = false;
  pa_cache& pc = c->pc;
  std::memset(&pc, 0, sizeof pc);
  pc.num_layers = d.num_layers;
  pc.num_blocks = d.num_blocks;
  pc.block_size = d.block_size;
  pc.num_kv_heads = d.num_kv_heads;
  pc.head_size = d.head_size;
  pc.dtype = d.dtype;
  pc.layout = d.layout;
  compact_strides(d, &pc.block_stride, &pc.slot_stride, &pc.head_stride);
  c->strides[0] = pc.block_stride;
  c->strides[1] = pc.slot_stride;
  c->strides[2] = pc.head_stride;
  pc.latent = (d.flags & PAGEDATTN_KV_CACHE_LATENT) ? 1 : 0;
  pc.k_layers = c->k_layers.data();
  /* A latent cache's values lead its rows: V reads the rows themselves. */
  pc.v_layers = pc.latent ? c->k_layers.data() : c->v_layers.data();
  pc.device = b->caps.device;
  return c;
}

/* Runs the optional cache_attach op and publishes the handle. */
pagedattn_kv_cache* finish_cache(std::unique_ptr<pagedattn_kv_cache> c) {
  pagedattn_backend* b = c->backend;
  if (b->ops->cache_attach) {
    char msg[PA_MSG_LEN] = {0};
    check_op(b->ops->cache_attach(b->state, &c->pc, msg), backend_name(b), "cache_attach", msg);
    c->attached = true;
  }
  c->magic = kCacheMagic;
  try {
    register_handle(c.get());
  } catch (...) {
    if (c->attached && b->ops->cache_detach) b->ops->cache_detach(b->state, &c->pc);
    throw;
  }
  backend_retain(b);
  b->live_caches += 1;
  if (log_enabled(PAGEDATTN_LOG_DEBUG))
    log(PAGEDATTN_LOG_DEBUG,
        "%s: cache created: %d layers x %d blocks of %d tokens, %d kv heads x %d, %s; %s %llu "
        "bytes",
        backend_name(b), c->desc.num_layers, c->desc.num_blocks, c->desc.block_size,
        c->desc.num_kv_heads, c->desc.head_size, dtype_name(c->desc.dtype),
        !c->slab ? "wraps caller memory," : c->pc.host ? "pinned host memory," : "allocated",
        static_cast<unsigned long long>(c->slab ? c->bytes : 0));
  return c.release();
}

/* Strides of a wrapped cache must keep every (block, slot, head) row of head_size elements
 * apart: sorted by stride, each stride must step over the previous dimension's extent. */
void check_wrap_strides(const pagedattn_kv_cache_desc& d, int64_t bst, int64_t sst, int64_t hst) {
  if (bst <= 0 || sst <= 0 || hst <= 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "memory strides (block %lld, slot %lld, head %lld) must all be > 0, or all 0 for the "
         "compact layout",
         static_cast<long long>(bst), static_cast<long long>(sst), static_cast<long long>(hst));
  std::pair<int64_t, int64_t> dims[3] = {
      {bst, d.num_blocks}, {sst, d.block_size}, {hst, d.num_kv_heads}};
  std::sort(std::begin(dims), std::end(dims));
  int64_t need = d.head_size; /* the next stride must be at least this */
  int64_t max_off = d.head_size - 1;
  for (const auto& dim : dims) {
    const int64_t stride = dim.first, extent = dim.second;
    if (extent == 1) continue;
    if (stride < need)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "memory strides (block %lld, slot %lld, head %lld) make blocks, slots or heads "
           "overlap (stride %lld < %lld, block_size %d, num_kv_heads %d, head_size %d)",
           static_cast<long long>(bst), static_cast<long long>(sst),
           static_cast<long long>(hst), static_cast<long long>(stride),
           static_cast<long long>(need), d.block_size, d.num_kv_heads, d.head_size);
    int64_t span;
    if (__builtin_mul_overflow(stride, extent, &span) ||
        __builtin_add_overflow(max_off, span - stride, &max_off))
      fail(PAGEDATTN_ERROR_OVERFLOW, "memory strides overflow int64 element offsets");
    need = span;
  }
  /* The kernels form byte offsets: the last element's must fit too. */
  int64_t bytes;
  if (__builtin_mul_overflow(max_off + 1, static_cast<int64_t>(dtype_size(d.dtype)), &bytes))
    fail(PAGEDATTN_ERROR_OVERFLOW, "memory strides overflow int64 byte offsets");
}

void check_layer(const pagedattn_kv_cache* c, int32_t layer) {
  if (layer < 0 || layer >= c->desc.num_layers)
    fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = %d is not in [0, %d)", layer, c->desc.num_layers);
}

void check_pairs_ptr(const int32_t* pairs, size_t n) {
  if (n > 0 && !pairs) fail(PAGEDATTN_ERROR_NULL_POINTER, "pairs is NULL (num_pairs = %zu)", n);
  if (n > static_cast<size_t>(INT32_MAX))
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "num_pairs = %zu is too large", n);
}

/* Within one cache, a destination may not be the source of another pair. */
void check_dst_not_src(const int32_t* pairs, size_t n) {
  std::vector<std::pair<int32_t, size_t>> dsts(n);
  for (size_t k = 0; k < n; ++k) dsts[k] = {pairs[2 * k + 1], k};
  std::sort(dsts.begin(), dsts.end());
  for (size_t j = 0; j < n; ++j) {
    const int32_t src = pairs[2 * j];
    auto it = std::lower_bound(dsts.begin(), dsts.end(), std::make_pair(src, size_t{0}));
    if (it != dsts.end() && it->first == src && it->second != j)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "pairs[%zu] = %d is a source but also the destination pairs[%zu] of another pair",
           2 * j, src, 2 * it->second + 1);
  }
}

/* Pairs without src == dst entries (no-ops); returns n of the filtered list in *out. */
const int32_t* drop_noops(const int32_t* pairs, size_t n, std::vector<int32_t>& buf, size_t* out) {
  size_t noops = 0;
  for (size_t k = 0; k < n; ++k) noops += pairs[2 * k] == pairs[2 * k + 1];
  if (noops == 0) {
    *out = n;
    return pairs;
  }
  buf.reserve(2 * (n - noops));
  for (size_t k = 0; k < n; ++k) {
    if (pairs[2 * k] == pairs[2 * k + 1]) continue;
    buf.push_back(pairs[2 * k]);
    buf.push_back(pairs[2 * k + 1]);
  }
  *out = n - noops;
  return buf.data();
}

void check_buffer(const pagedattn_kv_cache* c, const int32_t* ids, size_t n, const void* buffer,
                  size_t buffer_bytes) {
  if (n > 0 && !ids) fail(PAGEDATTN_ERROR_NULL_POINTER, "block_ids is NULL (num_ids = %zu)", n);
  if (n > 0 && !buffer) fail(PAGEDATTN_ERROR_NULL_POINTER, "buffer is NULL (num_ids = %zu)", n);
  check_ids(ids, n, 1, 0, c->desc.num_blocks, "block_ids", "num_blocks");
  uint64_t need;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n), c->bytes_per_block, &need))
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "num_ids %zu x bytes_per_block %llu overflows", n,
         static_cast<unsigned long long>(c->bytes_per_block));
  if (buffer_bytes < need)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "buffer_bytes = %zu < %zu blocks x %llu bytes per block = %llu", buffer_bytes, n,
         static_cast<unsigned long long>(c->bytes_per_block),
         static_cast<unsigned long long>(need));
}

}  // namespace

}  // namespace pa

namespace pa {
namespace {

/* A write's slot mapping, checked: a 1-D int32/int64 tensor on the cache's device or in host
 * memory; host slots are range-checked and must be distinct (GPU-resident ones are checked by
 * the kernel). */
struct Slots {
  const void* data;
  int64_t n;
  bool i64;
  bool on_device;
};

Slots check_slots(const pagedattn_kv_cache* c, const pagedattn_tensor* slot_mapping) {
  const pagedattn_backend* b = c->backend;
  if (!slot_mapping) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "slot_mapping is NULL");
  const pagedattn_tensor& sm = *slot_mapping;
  if (sm.ndim != 1 || !sm.shape)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "slot_mapping: ndim %d != 1", sm.ndim);
  const bool i64 = sm.dtype.code == PAGEDATTN_DLPACK_INT && sm.dtype.bits == 64 &&
                   sm.dtype.lanes == 1;
  const bool i32 = sm.dtype.code == PAGEDATTN_DLPACK_INT && sm.dtype.bits == 32 &&
                   sm.dtype.lanes == 1;
  if (!i64 && !i32)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "slot_mapping: dtype %s is not int32 or int64",
             pa::dlpack_dtype_str(sm.dtype).c_str());
  const int64_t n = sm.shape[0];
  if (n < 0)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "slot_mapping: shape [%lld] is negative",
             static_cast<long long>(n));
  /* tensor.h: every tensor read needs a unit innermost stride, a one-element one too. */
  if (sm.strides && sm.strides[0] != 1)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "slot_mapping: innermost stride %lld != 1",
             static_cast<long long>(sm.strides[0]));
  const int64_t unit = 1;
  pa::check_extent(&sm, "slot_mapping", 1, &unit, i64 ? 8 : 4);
  /* Slots in host memory are read here; slots on the GPU are checked by the kernel. */
  bool on_device = false;
  if (pa::is_host_device_type(sm.device.device_type)) {
    if (c->pc.device.device_type == PAGEDATTN_DEVICE_CPU)
      pa::check_device(sm.device, c->pc.device, "slot_mapping", "the cache");
  } else {
    if (c->pc.host || !pa::device_matches(sm.device, b->caps.device))
      pa::fail(PAGEDATTN_ERROR_WRONG_DEVICE, "slot_mapping: on %s, the cache is on %s",
               pa::device_str(sm.device).c_str(), pa::device_str(c->pc.device).c_str());
    on_device = true;
  }
  if (n > 0 && !sm.data) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "slot_mapping->data is NULL");
  const void* slots =
      sm.data ? static_cast<const char*>(sm.data) + sm.byte_offset : nullptr;
  return {slots, n, i64, on_device};
}

void check_host_slots(const pagedattn_kv_cache* c, const Slots& sl) {
  if (sl.on_device) return;
  const int64_t limit = static_cast<int64_t>(c->desc.num_blocks) * c->desc.block_size;
  for (int64_t t = 0; t < sl.n; ++t) {
    const int64_t s = sl.i64 ? static_cast<const int64_t*>(sl.data)[t]
                             : static_cast<const int32_t*>(sl.data)[t];
    if (s < -1)
      pa::fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "slot_mapping[%lld] = %lld < -1",
               static_cast<long long>(t), static_cast<long long>(s));
    if (s >= limit)
      pa::fail(PAGEDATTN_ERROR_OUT_OF_RANGE,
               "slot_mapping[%lld] = %lld >= num_blocks*block_size %lld",
               static_cast<long long>(t), static_cast<long long>(s),
               static_cast<long long>(limit));
  }
  pa::check_distinct_slots(sl.data, sl.i64, sl.n, "slot_mapping");
}

/* The rows' dtype dt against the cache's (equal, or an fp8 cache) and the backend's list. */
void check_write_dtype(const pagedattn_kv_cache* c, pagedattn_dtype dt, const char* name) {
  const pagedattn_backend* b = c->backend;
  const pagedattn_dtype cdt = c->desc.dtype;
  const bool fp8 = cdt == PAGEDATTN_DTYPE_FP8_E4M3 || cdt == PAGEDATTN_DTYPE_FP8_E5M2;
  if (!fp8 && dt != cdt)
    pa::fail(PAGEDATTN_ERROR_UNSUPPORTED,
             "%s dtype %s with a %s cache is not supported (the cache must be %s or fp8)", name,
             pa::dtype_name(dt), pa::dtype_name(cdt), pa::dtype_name(dt));
  if (!(b->caps.dtypes & PAGEDATTN_DTYPE_BIT(dt)))
    pa::fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: %s dtype %s is not supported (supported: %s)",
             pa::backend_name(b), name, pa::dtype_name(dt),
             pa::dtype_mask_names(b->caps.dtypes).c_str());
}

bool is_fp8_cache(const pagedattn_kv_cache* c) {
  return c->desc.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || c->desc.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
}

void run_write(pagedattn_kv_cache* c, pa_write_args& a) {
  pagedattn_backend* b = c->backend;
  char msg[PA_MSG_LEN] = {0};
  pa::check_op(b->ops->cache_write(b->state, &a, msg), pa::backend_name(b), "cache_write", msg);
}

/* pagedattn_kv_cache_write and _write_scaled: scalar scales, and per-head ones when given. */
void cache_write(pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* key,
                 const pagedattn_tensor* value, const pagedattn_tensor* slot_mapping,
                 float k_scale, float v_scale, const pagedattn_tensor* k_head_scales,
                 const pagedattn_tensor* v_head_scales, void* stream) {
  pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
  pagedattn_backend* b = c->backend;
  pa::check_layer(c, layer);
  if (c->pc.latent)
    pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
             "cache is a latent (MLA) cache: write its rows with pagedattn_kv_cache_write_latent");
  const Slots sl = check_slots(c, slot_mapping);
  const int64_t n = sl.n;
  const pagedattn_dtype dt = pa::tensor_float_dtype(key, "key");
  check_write_dtype(c, dt, "key");
  const bool fp8 = is_fp8_cache(c);
  const int32_t H = c->desc.num_kv_heads, D = c->desc.head_size;
  pa_write_args a;
  std::memset(&a, 0, sizeof a);
  /* A GPU backend's host cache takes any host memory (pinned or not). */
  const pagedattn_device want = c->pc.host ? pa::host_device_of(b) : c->pc.device;
  /* One key/value row per slot: say so when only the row counts disagree. */
  for (const pagedattn_tensor* t : {key, value})
    if (t && t->ndim == 3 && t->shape && t->shape[0] != n)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape[0] = %lld rows != slot_mapping length %lld",
               t == key ? "key" : "value", static_cast<long long>(t->shape[0]),
               static_cast<long long>(n));
  a.k = pa::resolve3(key, "key", n, H, D, dt, want);
  a.v = pa::resolve3(value, "value", n, H, D, dt, want);
  if (fp8) {
    if (!std::isfinite(k_scale) || !(k_scale > 0.0f))
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "k_scale = %g must be finite and > 0",
               static_cast<double>(k_scale));
    if (!std::isfinite(v_scale) || !(v_scale > 0.0f))
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "v_scale = %g must be finite and > 0",
               static_cast<double>(v_scale));
  }
  check_host_slots(c, sl);
  /* Per-head scales are checked whatever the cache, but only an fp8 cache uses them. */
  const float* khs = k_head_scales ? pa::resolve_vec_f32(k_head_scales, "k_head_scales", H,
                                                         "num_kv_heads", want, true)
                                   : nullptr;
  const float* vhs = v_head_scales ? pa::resolve_vec_f32(v_head_scales, "v_head_scales", H,
                                                         "num_kv_heads", want, true)
                                   : nullptr;
  if (k_head_scales || v_head_scales)
    pa::need_feature(b, PAGEDATTN_FEATURE_HEAD_SCALES, "per-head fp8 scales");
  if (n == 0) return;
  a.cache = &c->pc;
  a.layer = layer;
  a.slots = sl.data;
  a.slots_int64 = sl.i64 ? 1 : 0;
  a.slots_on_device = sl.on_device ? 1 : 0;
  a.n = n;
  a.k_scale = fp8 ? k_scale : 1.0f;
  a.v_scale = fp8 ? v_scale : 1.0f;
  a.k_head_scales = fp8 ? khs : nullptr;
  a.v_head_scales = fp8 ? vhs : nullptr;
  a.stream = stream;
  run_write(c, a);
}

/* A latent write's [T, W] or [T, 1, W] tensor, resolved as [T, 1, W]: its width W from the
 * tensor itself (want_dim < 0) or checked against want_dim. */
pa_tensor3 resolve_rows(const pagedattn_tensor* t, const char* name, int64_t n, int32_t want_dim,
                        pagedattn_dtype dt, const pagedattn_device& dev) {
  if (!t) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  if ((t->ndim != 2 && t->ndim != 3) || !t->shape)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: ndim %d is not 2 ([T, W]) or 3 ([T, 1, W])", name,
             t->ndim);
  if (t->ndim == 3 && t->shape[1] != 1)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape %s: a 3-D row tensor is [T, 1, W]", name,
             pa::shape_str(t->shape, 3).c_str());
  if (t->shape[0] != n)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape[0] = %lld rows != slot_mapping length %lld",
             name, static_cast<long long>(t->shape[0]), static_cast<long long>(n));
  const int64_t w = t->shape[t->ndim - 1];
  if (w < 1 || w > INT32_MAX)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: width %lld is not valid", name,
             static_cast<long long>(w));
  if (want_dim >= 0 && w != want_dim)
    pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: width %lld != %d", name, static_cast<long long>(w),
             want_dim);
  /* resolve3 checks a 3-D view: present a 2-D tensor as [T, 1, W]. */
  pagedattn_tensor v = *t;
  int64_t shape[3] = {t->shape[0], 1, w};
  int64_t strides[3];
  if (t->ndim == 2) {
    v.ndim = 3;
    v.shape = shape;
    if (t->strides) {
      strides[0] = t->strides[0];
      strides[1] = w;
      strides[2] = t->strides[1];
      v.strides = strides;
    }
  }
  return pa::resolve3(&v, name, n, 1, static_cast<int32_t>(w), dt, dev);
}

void cache_write_latent(pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* kv_c,
                        const pagedattn_tensor* k_pe, const pagedattn_tensor* slot_mapping,
                        float scale, void* stream) {
  pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
  pagedattn_backend* b = c->backend;
  pa::check_layer(c, layer);
  if (!c->pc.latent)
    pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
             "cache is not a latent (MLA) cache (PAGEDATTN_KV_CACHE_LATENT): write it with "
             "pagedattn_kv_cache_write");
  const Slots sl = check_slots(c, slot_mapping);
  const int64_t n = sl.n;
  const pagedattn_dtype dt = pa::tensor_float_dtype(kv_c, "kv_c");
  check_write_dtype(c, dt, "kv_c");
  const int32_t D = c->desc.head_size;
  const pagedattn_device want = c->pc.host ? pa::host_device_of(b) : c->pc.device;
  pa_write_args a;
  std::memset(&a, 0, sizeof a);
  a.k = resolve_rows(kv_c, "kv_c", n, k_pe ? -1 : D, dt, want);
  if (k_pe) {
    if (a.k.dim >= D)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR,
               "kv_c: width %d leaves no room for k_pe in rows of head_size %d", a.k.dim, D);
    const pagedattn_dtype pdt = pa::tensor_float_dtype(k_pe, "k_pe");
    if (pdt != dt)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "k_pe: dtype %s != kv_c dtype %s",
               pa::dtype_name(pdt), pa::dtype_name(dt));
    a.v = resolve_rows(k_pe, "k_pe", n, D - a.k.dim, dt, want);
  } else {
    a.v.dtype = dt;
    a.v.heads = 1;
  }
  const bool fp8 = is_fp8_cache(c);
  if (fp8 && (!std::isfinite(scale) || !(scale > 0.0f)))
    pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "scale = %g must be finite and > 0",
             static_cast<double>(scale));
  check_host_slots(c, sl);
  if (n == 0) return;
  a.cache = &c->pc;
  a.layer = layer;
  a.slots = sl.data;
  a.slots_int64 = sl.i64 ? 1 : 0;
  a.slots_on_device = sl.on_device ? 1 : 0;
  a.n = n;
  a.k_scale = a.v_scale = fp8 ? scale : 1.0f;
  a.stream = stream;
  run_write(c, a);
}

}  // namespace
}  // namespace pa

extern "C" {

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_desc_init(pagedattn_kv_cache_desc* desc) {
  return pa::guard([&] {
    if (!desc) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "desc is NULL");
    std::memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->dtype = PAGEDATTN_DTYPE_BFLOAT16;
    desc->layout = PAGEDATTN_LAYOUT_NHD;
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_bytes_per_block(
    uint64_t* out, const pagedattn_kv_cache_desc* desc) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    const pagedattn_kv_cache_desc d = pa::read_struct(desc, "desc");
    /* Sizing happens before the pool size is known: num_blocks 0 is accepted here. */
    *out = pa::check_cache_desc(d, false);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_create(pagedattn_kv_cache** out,
                                                        pagedattn_backend* backend,
                                                        const pagedattn_kv_cache_desc* desc) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    const pagedattn_kv_cache_desc d = pa::read_struct(desc, "desc");
    const uint64_t bpb = pa::check_cache_desc(d, true);
    pa::check_cache_caps(d, b->caps);
    const uint64_t total = bpb * static_cast<uint64_t>(d.num_blocks);
    const bool latent = (d.flags & PAGEDATTN_KV_CACHE_LATENT) != 0;
    const uint64_t halves = latent ? 1u : 2u; /* K and V blocks of a layer, or its rows */
    const uint64_t layer_bytes = total / (halves * static_cast<uint64_t>(d.num_layers));
    const bool host = (d.flags & PAGEDATTN_KV_CACHE_HOST) && pa::is_gpu_backend(b);

    std::unique_ptr<pagedattn_kv_cache> c = pa::new_cache(b, d, bpb);
    pa::backend_reserve(b, total);
    void* slab = nullptr;
    char msg[PA_MSG_LEN] = {0};
    const pagedattn_status st = b->ops->alloc(b->state, total, host ? 1 : 0, &slab, msg);
    if (st != PAGEDATTN_OK || !slab) {
      pa::backend_unreserve(b, total);
      if (st == PAGEDATTN_OK)
        pa::fail(PAGEDATTN_ERROR_INTERNAL, "%s: alloc returned no memory", pa::backend_name(b));
      pa::check_op(st, pa::backend_name(b), "alloc", msg);
    }
    c->slab = slab;
    c->bytes = total;
    for (int32_t l = 0; l < d.num_layers; ++l) {
      char* base = static_cast<char*>(slab) + halves * layer_bytes * static_cast<uint64_t>(l);
      c->k_layers[l] = base;
      c->v_layers[l] = latent ? base : base + layer_bytes;
    }
    c->pc.device = host ? pa::host_device_of(b) : b->caps.device;
    c->pc.host = host ? 1 : 0;
    c->pc.owned = 1;
    try {
      *out = pa::finish_cache(std::move(c));
    } catch (...) {
      b->ops->free(b->state, slab, host ? 1 : 0);
      pa::backend_unreserve(b, total);
      throw;
    }
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_wrap(pagedattn_kv_cache** out,
                                                      pagedattn_backend* backend,
                                                      const pagedattn_kv_cache_desc* desc,
                                                      const pagedattn_kv_cache_memory* memory) {
  return pa::guard([&] {
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    const pagedattn_kv_cache_desc d = pa::read_struct(desc, "desc");
    const pagedattn_kv_cache_memory m = pa::read_struct(memory, "memory");
    const uint64_t bpb = pa::check_cache_desc(d, true);
    pa::check_cache_caps(d, b->caps);
    if (!(b->caps.features & PAGEDATTN_FEATURE_WRAP_CACHE))
      pa::fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: caches over caller memory are not supported",
               pa::backend_name(b));
    /* A latent cache has rows only: v_layers is not read. */
    const bool latent = (d.flags & PAGEDATTN_KV_CACHE_LATENT) != 0;
    if (!m.k_layers) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "memory->k_layers is NULL");
    if (!latent && !m.v_layers)
      pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "memory->v_layers is NULL");
    for (int32_t l = 0; l < d.num_layers; ++l) {
      if (!m.k_layers[l])
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "memory->k_layers[%d] is NULL", l);
      if (!latent && !m.v_layers[l])
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "memory->v_layers[%d] is NULL", l);
    }
    bool host = false;
    if (!pa::device_matches(m.device, b->caps.device)) {
      if (pa::is_gpu_backend(b) && pa::is_host_device_type(m.device.device_type))
        host = true;
      else
        pa::fail(PAGEDATTN_ERROR_WRONG_DEVICE, "memory->device is %s, %s needs %s",
                 pa::device_str(m.device).c_str(), pa::backend_name(b),
                 pa::device_str(b->caps.device).c_str());
    }
    std::unique_ptr<pagedattn_kv_cache> c = pa::new_cache(b, d, bpb);
    if (m.block_stride != 0 || m.slot_stride != 0 || m.head_stride != 0) {
      pa::check_wrap_strides(d, m.block_stride, m.slot_stride, m.head_stride);
      /* A dimension of extent 1 is only indexed by 0: it keeps the compact stride (set by
       * new_cache), whatever the caller's, so no kernel multiplies an unchecked value. */
      if (d.num_blocks > 1) c->pc.block_stride = m.block_stride;
      if (d.block_size > 1) c->pc.slot_stride = m.slot_stride;
      if (d.num_kv_heads > 1) c->pc.head_stride = m.head_stride;
      c->strides[0] = m.block_stride;
      c->strides[1] = m.slot_stride;
      c->strides[2] = m.head_stride;
    }
    for (int32_t l = 0; l < d.num_layers; ++l) {
      c->k_layers[l] = m.k_layers[l];
      c->v_layers[l] = latent ? m.k_layers[l] : m.v_layers[l];
    }
    c->pc.device = host ? m.device : b->caps.device;
    c->pc.host = host ? 1 : 0;
    c->pc.owned = 0;
    *out = pa::finish_cache(std::move(c));
  });
}

PAGEDATTN_API void pagedattn_kv_cache_destroy(pagedattn_kv_cache* cache) {
  if (!cache || !pa::take_handle(cache)) return;
  cache->magic = 0;
  pagedattn_backend* b = cache->backend;
  if (cache->attached && b->ops->cache_detach) b->ops->cache_detach(b->state, &cache->pc);
  const uint64_t bytes = cache->slab ? cache->bytes : 0;
  if (cache->slab) {
    b->ops->free(b->state, cache->slab, cache->pc.host);
    pa::backend_unreserve(b, cache->bytes);
  }
  delete cache;
  b->live_caches -= 1;
  pa::log(PAGEDATTN_LOG_DEBUG, "%s: cache destroyed: %llu bytes released", pa::backend_name(b),
          static_cast<unsigned long long>(bytes));
  pa::backend_release(b);
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_get_desc(pagedattn_kv_cache_desc* out,
                                                          const pagedattn_kv_cache* cache) {
  return pa::guard([&] {
    pa::check_out_struct(out, "out");
    const pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    pa::write_struct(out, c->desc);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_get_layer(void** k, void** v,
                                                           int64_t strides[3],
                                                           const pagedattn_kv_cache* cache,
                                                           int32_t layer) {
  return pa::guard([&] {
    const pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    pa::check_layer(c, layer);
    if (k) *k = c->k_layers[layer];
    if (v) *v = c->v_layers[layer];
    if (strides) {
      strides[0] = c->strides[0];
      strides[1] = c->strides[1];
      strides[2] = c->strides[2];
    }
  });
}


PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write(pagedattn_kv_cache* cache, int32_t layer,
                                                       const pagedattn_tensor* key,
                                                       const pagedattn_tensor* value,
                                                       const pagedattn_tensor* slot_mapping,
                                                       float k_scale, float v_scale,
                                                       void* stream) {
  return pa::guard([&] {
    pa::cache_write(cache, layer, key, value, slot_mapping, k_scale, v_scale, nullptr, nullptr,
                    stream);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write_scaled(
    pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* key,
    const pagedattn_tensor* value, const pagedattn_tensor* slot_mapping,
    const pagedattn_tensor* k_head_scales, const pagedattn_tensor* v_head_scales, void* stream) {
  return pa::guard([&] {
    pa::cache_write(cache, layer, key, value, slot_mapping, 1.0f, 1.0f, k_head_scales,
                    v_head_scales, stream);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write_latent(
    pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* kv_c,
    const pagedattn_tensor* k_pe, const pagedattn_tensor* slot_mapping, float scale,
    void* stream) {
  return pa::guard(
      [&] { pa::cache_write_latent(cache, layer, kv_c, k_pe, slot_mapping, scale, stream); });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_copy_blocks(pagedattn_kv_cache* cache,
                                                             const int32_t* pairs,
                                                             size_t num_pairs, void* stream) {
  return pa::guard([&] {
    pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    pagedattn_backend* b = c->backend;
    pa::check_pairs_ptr(pairs, num_pairs);
    pa::check_ids(pairs, num_pairs, 2, 0, c->desc.num_blocks, "pairs", "num_blocks");
    pa::check_ids(pairs, num_pairs, 2, 1, c->desc.num_blocks, "pairs", "num_blocks");
    pa::check_unique(pairs, num_pairs, 2, 1, "pairs", "destination block");
    pa::check_dst_not_src(pairs, num_pairs);
    std::vector<int32_t> buf;
    size_t n = 0;
    const int32_t* p = pa::drop_noops(pairs, num_pairs, buf, &n);
    if (n == 0) return;
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->copy_blocks(b->state, &c->pc, p, n, stream, msg), pa::backend_name(b),
                 "copy_blocks", msg);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_swap_blocks(pagedattn_kv_cache* dst,
                                                             const pagedattn_kv_cache* src,
                                                             const int32_t* pairs,
                                                             size_t num_pairs, void* stream) {
  return pa::guard([&] {
    pagedattn_kv_cache* d = pa::check_cache(dst, "dst");
    pagedattn_kv_cache* s = pa::check_cache(src, "src");
    pa::check_pairs_ptr(pairs, num_pairs);
    const pagedattn_kv_cache_desc &dd = d->desc, &sd = s->desc;
    struct {
      const char* name;
      int64_t sv, dv;
    } fields[] = {{"num_layers", sd.num_layers, dd.num_layers},
                  {"block_size", sd.block_size, dd.block_size},
                  {"num_kv_heads", sd.num_kv_heads, dd.num_kv_heads},
                  {"head_size", sd.head_size, dd.head_size}};
    for (const auto& f : fields)
      if (f.sv != f.dv)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "src %s %lld != dst %s %lld", f.name,
                 static_cast<long long>(f.sv), f.name, static_cast<long long>(f.dv));
    if (sd.dtype != dd.dtype)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "src dtype %s != dst dtype %s",
               pa::dtype_name(sd.dtype), pa::dtype_name(dd.dtype));
    if (s->pc.latent != d->pc.latent)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "%s is a latent (MLA) cache and %s is not",
               s->pc.latent ? "src" : "dst", s->pc.latent ? "dst" : "src");
    pa::check_ids(pairs, num_pairs, 2, 0, sd.num_blocks, "pairs", "src num_blocks");
    pa::check_ids(pairs, num_pairs, 2, 1, dd.num_blocks, "pairs", "dst num_blocks");
    pa::check_unique(pairs, num_pairs, 2, 1, "pairs", "destination block");
    std::vector<int32_t> buf;
    size_t n = num_pairs;
    const int32_t* p = pairs;
    if (d == s) {
      pa::check_dst_not_src(pairs, num_pairs);
      p = pa::drop_noops(pairs, num_pairs, buf, &n);
    }
    /* A GPU backend of either side does the copy (it can reach host memory); else dst's. */
    pagedattn_backend* db = d->backend;
    pagedattn_backend* sb = s->backend;
    pagedattn_backend* run = db;
    if (pa::is_gpu_backend(db) && pa::is_gpu_backend(sb)) {
      const pagedattn_device a = db->caps.device, c = sb->caps.device;
      if (a.device_type != c.device_type || a.device_id != c.device_id)
        pa::fail(PAGEDATTN_ERROR_WRONG_DEVICE, "dst is on %s and src on %s: two different GPUs",
                 pa::device_str(a).c_str(), pa::device_str(c).c_str());
    } else if (pa::is_gpu_backend(sb)) {
      run = sb;
    }
    if (n == 0) return;
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(run->ops->swap_blocks(run->state, &d->pc, &s->pc, p, n, stream, msg),
                 pa::backend_name(run), "swap_blocks", msg);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_read_blocks(const pagedattn_kv_cache* cache,
                                                             const int32_t* block_ids,
                                                             size_t num_ids, void* buffer,
                                                             size_t buffer_bytes, void* stream) {
  return pa::guard([&] {
    const pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    pa::check_buffer(c, block_ids, num_ids, buffer, buffer_bytes);
    if (num_ids == 0) return;
    pagedattn_backend* b = c->backend;
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->read_blocks(b->state, &c->pc, block_ids, num_ids, buffer, stream, msg),
                 pa::backend_name(b), "read_blocks", msg);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_kv_cache_load_blocks(pagedattn_kv_cache* cache,
                                                             const int32_t* block_ids,
                                                             size_t num_ids, const void* buffer,
                                                             size_t buffer_bytes, void* stream) {
  return pa::guard([&] {
    pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    pa::check_buffer(c, block_ids, num_ids, buffer, buffer_bytes);
    pa::check_unique(block_ids, num_ids, 1, 0, "block_ids", "block id");
    if (num_ids == 0) return;
    pagedattn_backend* b = c->backend;
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->load_blocks(b->state, &c->pc, block_ids, num_ids, buffer, stream, msg),
                 pa::backend_name(b), "load_blocks", msg);
  });
}

}  // extern "C"
