/* lib/validate.h — checks shared by the entry points: devices, tensors (rank, shape, dtype,
 * strides) resolved into the backend ABI's pa_tensor3 / pa_lse, cache geometry, block-id lists. */
#ifndef PAGEDATTN_LIB_VALIDATE_H
#define PAGEDATTN_LIB_VALIDATE_H

#include <string>

#include "handles.h"

namespace pa {

bool is_host_device_type(int32_t type);
/* "[4, 8, 64]" for n dimensions; "{code 2, bits 16, lanes 1}" for a DLPack dtype (messages). */
std::string shape_str(const int64_t* s, int32_t n);
std::string dlpack_dtype_str(const pagedattn_dlpack_dtype& d);
std::string device_str(const pagedattn_device& d);

/* Is memory on `have` usable where `want` is expected? CPU wants exactly CPU; a host cache of a
 * GPU backend (CUDA_HOST/ROCM_HOST) takes any host memory; a GPU wants its type and ordinal. */
bool device_matches(const pagedattn_device& have, const pagedattn_device& want);
void check_device(const pagedattn_device& have, const pagedattn_device& want, const char* name,
                  const char* where);

/* The tensor's element type; BAD_TENSOR naming `name` if it is not float32/float16/bfloat16. */
pagedattn_dtype tensor_float_dtype(const pagedattn_tensor* t, const char* name);

/* Refuses (OVERFLOW, naming `name` and the dimension) a tensor whose element offsets
 * sum((shape[i]-1) * strides[i]) (either sign) or byte offsets byte_offset + offset * esize
 * overflow int64. `strides` are the resolved ones (n entries, never NULL). */
void check_extent(const pagedattn_tensor* t, const char* name, int32_t n, const int64_t* strides,
                  size_t esize);

/* Checks a [rows, heads, dim] tensor (ndim, shape, unit innermost stride, data) of dtype `dt`
 * on `dev` and resolves it. With `padded`, the tensor may have more rows than `rows` (a padded
 * token dimension): the resolved tensor is its first `rows` rows. */
pa_tensor3 resolve3(const pagedattn_tensor* t, const char* name, int64_t rows, int32_t heads,
                    int32_t dim, pagedattn_dtype dt, const pagedattn_device& dev,
                    bool padded = false);

/* Checks a float32 [rows, heads] tensor on `dev` and resolves it (`padded` as for resolve3). */
pa_lse resolve_lse(const pagedattn_tensor* t, const char* name, int64_t rows, int32_t heads,
                   const pagedattn_device& dev, bool padded = false);

/* Refuses (UNSUPPORTED, naming the backend and `what`) a feature bit the backend lacks. */
void need_feature(const pagedattn_backend* b, uint32_t bit, const char* what);

/* Checks a float32 [n] tensor with unit stride on `dev` (ALiBi slopes, sinks, per-head scales;
 * `what` names the extent in messages: "num_heads") and returns its first element's address.
 * With `finite_positive` and the tensor in host memory, every value must be finite and > 0
 * (INVALID_ARGUMENT naming the index); values in device memory are not read. */
const float* resolve_vec_f32(const pagedattn_tensor* t, const char* name, int64_t n,
                             const char* what, const pagedattn_device& dev,
                             bool finite_positive = false);

/* Validates a cache geometry without a backend (sizes, power-of-two block size, dtype, layout,
 * flags, byte counts that fit). Returns bytes per block (all layers, K and V). */
uint64_t check_cache_desc(const pagedattn_kv_cache_desc& d, bool need_blocks);

/* Refuses a geometry the backend's capabilities do not cover (UNSUPPORTED listing them). */
void check_cache_caps(const pagedattn_kv_cache_desc& d, const pagedattn_capabilities& caps);

std::string block_size_list(uint32_t mask);
std::string head_size_list(uint32_t mask);
std::string latent_size_list(uint32_t mask); /* pagedattn_capabilities.latent_sizes */

/* Checks arr[offset + k*step] in [0, num_blocks) for k < n; `limit_name` names the bound
 * ("num_blocks", "src num_blocks"). */
void check_ids(const int32_t* arr, size_t n, size_t step, size_t offset, int32_t num_blocks,
               const char* arrname, const char* limit_name);
/* Refuses a slot (>= 0) that two of the n entries of a host slot mapping (int64 if i64, else
 * int32) share, naming both entries: which row would land is not defined. */
void check_distinct_slots(const void* slots, bool i64, int64_t n, const char* arrname);
/* Refuses a repeated id among arr[offset], arr[offset + step], ... (n entries), naming arr. */
void check_unique(const int32_t* arr, size_t n, size_t step, size_t offset, const char* arrname,
                  const char* role);

}  // namespace pa

#endif /* PAGEDATTN_LIB_VALIDATE_H */
