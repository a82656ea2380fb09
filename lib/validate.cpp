/* lib/validate.cpp — argument checks shared by the entry points: device matching, tensor
 * resolution into pa_tensor3 / pa_lse, cache geometry and capability checks, block-id lists.
 * Every failure raises pa::Error with a message naming the argument and the offending value. */
#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>
#include <vector>

#include "validate.h"

namespace pa {

bool is_host_device_type(int32_t type) {
  return type == PAGEDATTN_DEVICE_CPU || type == PAGEDATTN_DEVICE_CUDA_HOST ||
         type == PAGEDATTN_DEVICE_ROCM_HOST;
}

std::string device_str(const pagedattn_device& d) {
  const char* t = nullptr;
  switch (d.device_type) {
    case PAGEDATTN_DEVICE_CPU: t = "cpu"; break;
    case PAGEDATTN_DEVICE_CUDA: t = "cuda"; break;
    case PAGEDATTN_DEVICE_CUDA_HOST: t = "cuda_host"; break;
    case PAGEDATTN_DEVICE_ROCM: t = "rocm"; break;
    case PAGEDATTN_DEVICE_ROCM_HOST: t = "rocm_host"; break;
    default: break;
  }
  if (t) return format("%s:%d", t, d.device_id);
  return format("device type %d:%d", d.device_type, d.device_id);
}

bool device_matches(const pagedattn_device& have, const pagedattn_device& want) {
  if (want.device_type == PAGEDATTN_DEVICE_CPU) return have.device_type == PAGEDATTN_DEVICE_CPU;
  if (is_host_device_type(want.device_type)) return is_host_device_type(have.device_type);
  return have.device_type == want.device_type && have.device_id == want.device_id;
}

void check_device(const pagedattn_device& have, const pagedattn_device& want, const char* name,
                  const char* where) {
  if (!device_matches(have, want))
    fail(PAGEDATTN_ERROR_WRONG_DEVICE, "%s: on %s, %s needs %s", name, device_str(have).c_str(),
         where, device_str(want).c_str());
}

std::string shape_str(const int64_t* s, int32_t n) {
  std::string out = "[";
  for (int32_t i = 0; i < n; ++i)
    out += format("%s%lld", i ? ", " : "", static_cast<long long>(s[i]));
  return out + "]";
}

std::string dlpack_dtype_str(const pagedattn_dlpack_dtype& d) {
  return format("{code %u, bits %u, lanes %u}", static_cast<unsigned>(d.code),
                static_cast<unsigned>(d.bits), static_cast<unsigned>(d.lanes));
}

namespace {

pagedattn_dtype map_dtype(const pagedattn_dlpack_dtype& d) {
  if (d.lanes != 1) return PAGEDATTN_DTYPE_INVALID;
  if (d.code == PAGEDATTN_DLPACK_FLOAT && d.bits == 32) return PAGEDATTN_DTYPE_FLOAT32;
  if (d.code == PAGEDATTN_DLPACK_FLOAT && d.bits == 16) return PAGEDATTN_DTYPE_FLOAT16;
  if (d.code == PAGEDATTN_DLPACK_BFLOAT && d.bits == 16) return PAGEDATTN_DTYPE_BFLOAT16;
  if (d.code == PAGEDATTN_DLPACK_FLOAT8_E4M3FN && d.bits == 8) return PAGEDATTN_DTYPE_FP8_E4M3;
  if (d.code == PAGEDATTN_DLPACK_FLOAT8_E5M2 && d.bits == 8) return PAGEDATTN_DTYPE_FP8_E5M2;
  return PAGEDATTN_DTYPE_INVALID;
}

/* Common rank/shape/stride checks; returns the strides (compact when NULL). */
/* `padded`: shape[0] may exceed want[0] (rows past it are padding, never addressed). */
void check_shape(const pagedattn_tensor* t, const char* name, const int64_t* want, int32_t n,
                 int64_t* strides, bool padded = false) {
  if (t->ndim != n)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: ndim %d != %d (expected shape %s)", name, t->ndim, n,
         shape_str(want, n).c_str());
  if (!t->shape) fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape is NULL", name);
  for (int32_t i = 0; i < n; ++i) {
    if (i == 0 && padded) {
      if (t->shape[0] < want[0])
        fail(PAGEDATTN_ERROR_BAD_TENSOR,
             "%s: shape %s has %lld rows, fewer than the %lld the batch needs (expected %s, or "
             "more rows: those past them are padding)",
             name, shape_str(t->shape, n).c_str(), static_cast<long long>(t->shape[0]),
             static_cast<long long>(want[0]), shape_str(want, n).c_str());
      continue;
    }
    if (t->shape[i] != want[i])
      fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape %s != expected %s", name,
           shape_str(t->shape, n).c_str(), shape_str(want, n).c_str());
  }
  if (t->strides) {
    if (t->strides[n - 1] != 1)
      fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: innermost stride %lld != 1", name,
           static_cast<long long>(t->strides[n - 1]));
    for (int32_t i = 0; i < n; ++i) strides[i] = t->strides[i];
    /* A dimension of size 1 is only ever indexed by 0, so its stride is any value (DLPack
     * producers leave huge or arbitrary ones there). Give it the compact stride, or 0 where that
     * overflows, so no kernel multiplies the caller's value into a byte offset. */
    for (int32_t i = n - 2; i >= 0; --i)
      if (t->shape[i] == 1 && __builtin_mul_overflow(strides[i + 1], want[i + 1], &strides[i]))
        strides[i] = 0;
  } else {
    int64_t s = 1;
    for (int32_t i = n - 1; i >= 0; --i) {
      strides[i] = s;
      s *= want[i];
    }
  }
}

}  // namespace

void check_extent(const pagedattn_tensor* t, const char* name, int32_t n, const int64_t* strides,
                  size_t esize) {
  for (int32_t i = 0; i < n; ++i)
    if (t->shape[i] == 0) return;  // no element is ever addressed
  /* Lowest and highest element offsets; negative strides are allowed (tensor.h: the element is
   * at sum(i_k * strides[k])), so each dimension adds to one side. Every partial sum the kernels
   * form then lies in [lo, hi]. */
  int64_t lo = 0, hi = 0;
  for (int32_t i = 0; i < n; ++i) {
    int64_t term = 0;
    bool ovf = __builtin_mul_overflow(t->shape[i] - 1, strides[i], &term);
    ovf = ovf || (term >= 0 ? __builtin_add_overflow(hi, term, &hi)
                            : __builtin_add_overflow(lo, term, &lo));
    if (ovf)
      fail(PAGEDATTN_ERROR_OVERFLOW,
           "%s: dimension %d (size %lld, stride %lld) makes element offsets overflow int64", name,
           i, static_cast<long long>(t->shape[i]), static_cast<long long>(strides[i]));
  }
  /* Byte offsets from data: byte_offset + [lo, hi + 1) * esize must fit int64. */
  const int64_t es = static_cast<int64_t>(esize);
  int64_t lob = 0, hib = 0;
  bool ovf = t->byte_offset > static_cast<uint64_t>(INT64_MAX);
  ovf = ovf || __builtin_mul_overflow(lo, es, &lob) || __builtin_add_overflow(hi, 1, &hib) ||
        __builtin_mul_overflow(hib, es, &hib) ||
        __builtin_add_overflow(hib, static_cast<int64_t>(t->byte_offset), &hib) ||
        __builtin_add_overflow(lob, static_cast<int64_t>(t->byte_offset), &lob);
  if (ovf)
    fail(PAGEDATTN_ERROR_OVERFLOW,
         "%s: byte_offset %llu + element offsets [%lld, %lld] x %zu bytes overflow int64", name,
         static_cast<unsigned long long>(t->byte_offset), static_cast<long long>(lo),
         static_cast<long long>(hi), esize);
}

namespace {

void* data_of(const pagedattn_tensor* t, const char* name, int64_t numel) {
  if (!t->data) {
    if (numel > 0) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s->data is NULL", name);
    return nullptr;
  }
  return static_cast<char*>(t->data) + t->byte_offset;
}

}  // namespace

pagedattn_dtype tensor_float_dtype(const pagedattn_tensor* t, const char* name) {
  if (!t) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  const pagedattn_dtype dt = map_dtype(t->dtype);
  if (dt != PAGEDATTN_DTYPE_FLOAT32 && dt != PAGEDATTN_DTYPE_FLOAT16 &&
      dt != PAGEDATTN_DTYPE_BFLOAT16)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: dtype %s is not float32, float16 or bfloat16", name,
         dlpack_dtype_str(t->dtype).c_str());
  return dt;
}

pa_tensor3 resolve3(const pagedattn_tensor* t, const char* name, int64_t rows, int32_t heads,
                    int32_t dim, pagedattn_dtype dt, const pagedattn_device& dev, bool padded) {
  if (!t) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  const int64_t want[3] = {rows, heads, dim};
  int64_t strides[3];
  check_shape(t, name, want, 3, strides, padded);
  const pagedattn_dtype got = tensor_float_dtype(t, name);
  if (got != dt)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: dtype %s != expected %s", name, dtype_name(got),
         dtype_name(dt));
  check_device(t->device, dev, name, "the backend");
  check_extent(t, name, 3, strides, dtype_size(dt));
  pa_tensor3 r;
  r.data = data_of(t, name, rows * heads * static_cast<int64_t>(dim));
  r.dtype = dt;
  r.rows = rows;
  r.heads = heads;
  r.dim = dim;
  r.row_stride = strides[0];
  r.head_stride = strides[1];
  return r;
}

void need_feature(const pagedattn_backend* b, uint32_t bit, const char* what) {
  if (!(b->caps.features & bit))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: %s is not supported by this backend", backend_name(b),
         what);
}

const float* resolve_vec_f32(const pagedattn_tensor* t, const char* name, int64_t n,
                             const char* what, const pagedattn_device& dev,
                             bool finite_positive) {
  const pagedattn_tensor& s = *t;
  if (s.ndim != 1)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: ndim %d != 1 (expected shape [%lld], %s)", name,
         s.ndim, static_cast<long long>(n), what);
  if (!s.shape) fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape is NULL", name);
  if (s.shape[0] != n)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: shape %s != expected [%lld] (%s)", name,
         shape_str(s.shape, 1).c_str(), static_cast<long long>(n), what);
  if (s.dtype.code != PAGEDATTN_DLPACK_FLOAT || s.dtype.bits != 32 || s.dtype.lanes != 1)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: dtype %s is not float32", name,
         dlpack_dtype_str(s.dtype).c_str());
  if (s.strides && s.strides[0] != 1)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: innermost stride %lld != 1", name,
         static_cast<long long>(s.strides[0]));
  const int64_t unit = 1;
  check_extent(&s, name, 1, &unit, sizeof(float));
  check_device(s.device, dev, name, "the backend");
  if (!s.data) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s->data is NULL", name);
  const float* p = reinterpret_cast<const float*>(static_cast<const char*>(s.data) + s.byte_offset);
  if (finite_positive && is_host_device_type(s.device.device_type)) {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i]) || !(p[i] > 0.0f))
        fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "%s[%lld] = %g must be finite and > 0", name,
             static_cast<long long>(i), static_cast<double>(p[i]));
  }
  return p;
}

pa_lse resolve_lse(const pagedattn_tensor* t, const char* name, int64_t rows, int32_t heads,
                   const pagedattn_device& dev, bool padded) {
  if (!t) fail(PAGEDATTN_ERROR_NULL_POINTER, "%s is NULL", name);
  const int64_t want[2] = {rows, heads};
  int64_t strides[2];
  check_shape(t, name, want, 2, strides, padded);
  if (map_dtype(t->dtype) != PAGEDATTN_DTYPE_FLOAT32)
    fail(PAGEDATTN_ERROR_BAD_TENSOR, "%s: dtype %s is not float32", name,
         dlpack_dtype_str(t->dtype).c_str());
  check_device(t->device, dev, name, "the backend");
  check_extent(t, name, 2, strides, sizeof(float));
  pa_lse r;
  r.data = static_cast<float*>(data_of(t, name, rows * heads));
  r.row_stride = strides[0];
  r.head_stride = strides[1];
  return r;
}

uint64_t check_cache_desc(const pagedattn_kv_cache_desc& d, bool need_blocks) {
  if (d.num_layers < 1)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->num_layers = %d < 1", d.num_layers);
  if (d.num_blocks < (need_blocks ? 1 : 0))
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->num_blocks = %d < %d", d.num_blocks,
         need_blocks ? 1 : 0);
  if (d.block_size < 1 || d.block_size > 256 || (d.block_size & (d.block_size - 1)) != 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->block_size = %d is not a power of two in 1..256", d.block_size);
  if (d.num_kv_heads < 1)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->num_kv_heads = %d < 1", d.num_kv_heads);
  if (d.head_size < 1)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->head_size = %d < 1", d.head_size);
  const int32_t dt = raw_enum(d.dtype), layout = raw_enum(d.layout);
  if (!dtype_valid(dt))
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->dtype = %d is not a valid pagedattn_dtype", dt);
  if (layout != PAGEDATTN_LAYOUT_NHD && layout != PAGEDATTN_LAYOUT_HND)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->layout = %d is not NHD (0) or HND (1)", layout);
  const uint32_t unknown =
      d.flags & ~static_cast<uint32_t>(PAGEDATTN_KV_CACHE_HOST | PAGEDATTN_KV_CACHE_LATENT);
  if (unknown)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->flags = 0x%x has unknown bits 0x%x", d.flags,
         unknown);
  const bool latent = (d.flags & PAGEDATTN_KV_CACHE_LATENT) != 0;
  if (latent && d.num_kv_heads != 1)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->num_kv_heads = %d: a latent (MLA) cache has one row per token, num_kv_heads 1",
         d.num_kv_heads);
  /* bytes per block = layers * (2, or 1 latent) * bs * Hkv * D * esize; the whole cache must
   * also be addressable with int64 element offsets. */
  uint64_t bpb = 0, total = 0;
  bool ovf = __builtin_mul_overflow(static_cast<uint64_t>(d.num_layers), latent ? 1ull : 2ull,
                                    &bpb);
  ovf = ovf || __builtin_mul_overflow(bpb, static_cast<uint64_t>(d.block_size), &bpb);
  ovf = ovf || __builtin_mul_overflow(bpb, static_cast<uint64_t>(d.num_kv_heads), &bpb);
  ovf = ovf || __builtin_mul_overflow(bpb, static_cast<uint64_t>(d.head_size), &bpb);
  ovf = ovf || __builtin_mul_overflow(bpb, static_cast<uint64_t>(dtype_size(d.dtype)), &bpb);
  ovf = ovf || __builtin_mul_overflow(bpb, static_cast<uint64_t>(d.num_blocks), &total);
  if (ovf || total > static_cast<uint64_t>(INT64_MAX) || bpb > static_cast<uint64_t>(INT64_MAX))
    fail(PAGEDATTN_ERROR_OVERFLOW,
         "cache size overflows: %d layers x %d x %d blocks x %d slots x %d heads x %d x %zu bytes",
         d.num_layers, latent ? 1 : 2, d.num_blocks, d.block_size, d.num_kv_heads, d.head_size,
         dtype_size(d.dtype));
  return bpb;
}

std::string block_size_list(uint32_t mask) {
  std::string s;
  for (int k = 0; k <= 8; ++k)
    if (mask & (1u << k)) s += format("%s%d", s.empty() ? "" : ", ", 1 << k);
  return s.empty() ? std::string("none") : s;
}

std::string head_size_list(uint32_t mask) {
  std::string s;
  for (int i = 0; i < 32; ++i)
    if (mask & (1u << i)) s += format("%s%d", s.empty() ? "" : ", ", 8 * (i + 1));
  return s.empty() ? std::string("none") : s;
}

std::string latent_size_list(uint32_t mask) {
  std::string s;
  for (int i = 0; i < 32; ++i)
    if (mask & (1u << i)) s += format("%s%d", s.empty() ? "" : ", ", 32 * (i + 1));
  return s.empty() ? std::string("none") : s;
}

void check_cache_caps(const pagedattn_kv_cache_desc& d, const pagedattn_capabilities& caps) {
  const char* be = caps.name ? caps.name : "backend";
  if (!(caps.cache_dtypes & PAGEDATTN_DTYPE_BIT(d.dtype)))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: cache dtype %s is not supported (supported: %s)", be,
         dtype_name(d.dtype), dtype_mask_names(caps.cache_dtypes).c_str());
  if ((d.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || d.dtype == PAGEDATTN_DTYPE_FP8_E5M2) &&
      !(caps.features & PAGEDATTN_FEATURE_FP8_CACHE))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: fp8 caches are not supported", be);
  const int log2bs = __builtin_ctz(static_cast<unsigned>(d.block_size));
  if (!(caps.block_sizes & (1u << log2bs)))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: block_size %d is not supported (supported: %s)", be,
         d.block_size, block_size_list(caps.block_sizes).c_str());
  if (d.flags & PAGEDATTN_KV_CACHE_LATENT) {
    if (!(caps.features & PAGEDATTN_FEATURE_MLA))
      fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: latent (MLA) caches are not supported", be);
    const bool row_ok = d.head_size % 32 == 0 && d.head_size <= 1024 &&
                        (caps.latent_sizes & (1u << (d.head_size / 32 - 1)));
    if (!row_ok)
      fail(PAGEDATTN_ERROR_UNSUPPORTED,
           "%s: latent row size (head_size) %d is not supported (supported: %s)", be,
           d.head_size, latent_size_list(caps.latent_sizes).c_str());
  } else if (!(d.head_size % 8 == 0 && d.head_size <= 256 &&
               (caps.head_sizes & (1u << (d.head_size / 8 - 1)))))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: head_size %d is not supported (supported: %s)", be,
         d.head_size, head_size_list(caps.head_sizes).c_str());
  if (!(caps.layouts & (1u << d.layout)))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: layout %s is not supported", be,
         d.layout == PAGEDATTN_LAYOUT_NHD ? "NHD" : "HND");
}

void check_ids(const int32_t* arr, size_t n, size_t step, size_t offset, int32_t num_blocks,
               const char* arrname, const char* limit_name) {
  for (size_t k = 0; k < n; ++k) {
    const size_t idx = k * step + offset;
    const int32_t id = arr[idx];
    if (id < 0)
      fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "%s[%zu] = %d < 0", arrname, idx, id);
    if (id >= num_blocks)
      fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "%s[%zu] = %d >= %s %d", arrname, idx, id, limit_name,
           num_blocks);
  }
}

void check_distinct_slots(const void* slots, bool i64, int64_t n, const char* arrname) {
  if (n < 2) return;
  std::vector<std::pair<int64_t, int64_t>> v;
  v.reserve(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t s = i64 ? static_cast<const int64_t*>(slots)[t]
                          : static_cast<const int32_t*>(slots)[t];
    if (s >= 0) v.emplace_back(s, t);
  }
  std::sort(v.begin(), v.end());
  for (size_t k = 1; k < v.size(); ++k)
    if (v[k].first == v[k - 1].first)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "%s[%lld] and %s[%lld] are both slot %lld; a call writes each slot at most once",
           arrname, static_cast<long long>(v[k - 1].second), arrname,
           static_cast<long long>(v[k].second), static_cast<long long>(v[k].first));
}

void check_unique(const int32_t* arr, size_t n, size_t step, size_t offset, const char* arrname,
                  const char* role) {
  if (n < 2) return;
  std::vector<std::pair<int32_t, size_t>> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = {arr[k * step + offset], k * step + offset};
  std::sort(v.begin(), v.end());
  for (size_t k = 1; k < n; ++k)
    if (v[k].first == v[k - 1].first)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "%s[%zu] = %d repeats %s[%zu] (%s appears twice)",
           arrname, v[k].second, v[k].first, arrname, v[k - 1].second, role);
}

}  // namespace pa
