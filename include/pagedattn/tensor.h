/* pagedattn/tensor.h — the tensor descriptor that crosses the boundary.
 *
 * pagedattn_tensor is laid out exactly like DLPack's DLTensor (and its parts like DLDevice and
 * DLDataType), with DLPack's numeric codes, so a framework's `DLTensor*` can be passed by casting
 * the pointer. The library never takes ownership of a tensor or of its shape/strides arrays; they
 * only need to stay valid for the duration of the call. On GPU backends the data must stay valid
 * until the work queued on the call's stream has finished.
 */
#ifndef PAGEDATTN_TENSOR_H
#define PAGEDATTN_TENSOR_H

#include "pagedattn/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DLPack device types (DLDeviceType). */
#define PAGEDATTN_DEVICE_CPU 1
#define PAGEDATTN_DEVICE_CUDA 2
#define PAGEDATTN_DEVICE_CUDA_HOST 3 /* pinned host memory, visible to CUDA */
#define PAGEDATTN_DEVICE_ROCM 10
#define PAGEDATTN_DEVICE_ROCM_HOST 11 /* pinned host memory, visible to ROCm */

/* DLPack dtype codes (DLDataTypeCode). The fp8 codes are DLPack 1.1's. */
#define PAGEDATTN_DLPACK_INT 0
#define PAGEDATTN_DLPACK_UINT 1
#define PAGEDATTN_DLPACK_FLOAT 2
#define PAGEDATTN_DLPACK_BFLOAT 4
#define PAGEDATTN_DLPACK_FLOAT8_E4M3FN 10
#define PAGEDATTN_DLPACK_FLOAT8_E5M2 12

/* DLDevice. device_type is an int-sized enum in DLPack; int32_t here has the same size. */
typedef struct pagedattn_device {
  int32_t device_type; /* PAGEDATTN_DEVICE_* */
  int32_t device_id;   /* ordinal of the device (0 for CPU) */
} pagedattn_device;

/* DLDataType. A float32 scalar type is {PAGEDATTN_DLPACK_FLOAT, 32, 1}. */
typedef struct pagedattn_dlpack_dtype {
  uint8_t code;   /* PAGEDATTN_DLPACK_* */
  uint8_t bits;   /* 32, 16, 8 */
  uint16_t lanes; /* must be 1 */
} pagedattn_dlpack_dtype;

/* DLTensor. `strides` counts elements, not bytes; NULL means compact row-major. Every tensor
 * pagedattn reads or writes must have a unit innermost stride. The element at index (i0, i1...) is
 * at (char*)data + byte_offset + sizeof(elem) * sum(i_k * strides[k]). The stride of a dimension
 * of size 1 is never used (its index is 0) and may be any value. */
typedef struct pagedattn_tensor {
  void* data;
  pagedattn_device device;
  int32_t ndim;
  pagedattn_dlpack_dtype dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} pagedattn_tensor;

/* Maps a pagedattn dtype to its DLPack dtype. Returns PAGEDATTN_ERROR_INVALID_ARGUMENT for
 * PAGEDATTN_DTYPE_INVALID or an unknown value, PAGEDATTN_ERROR_NULL_POINTER if out is NULL.
 * Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_dtype_to_dlpack(pagedattn_dlpack_dtype* out,
                                                        pagedattn_dtype dtype);

/* Maps a DLPack dtype to a pagedattn dtype. Returns PAGEDATTN_ERROR_UNSUPPORTED (message names the
 * code/bits/lanes) for types pagedattn has no use for, PAGEDATTN_ERROR_NULL_POINTER if out is
 * NULL. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_dtype_from_dlpack(pagedattn_dtype* out,
                                                          pagedattn_dlpack_dtype dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_TENSOR_H */
