// pagedattn_tensor and its parts are laid out exactly like DLPack's DLTensor, DLDevice and
// DLDataType (Debian's dlpack 0.6 header), so a framework's DLTensor* can be passed as is.
#include <dlpack/dlpack.h>

#include <cstddef>

#include "pagedattn_test_support.h"

#define SAME_FIELD(P, D, pf, df)                                              \
  static_assert(offsetof(P, pf) == offsetof(D, df), #P "." #pf " offset");   \
  static_assert(sizeof(((P*)nullptr)->pf) == sizeof(((D*)nullptr)->df), #P "." #pf " size")

static_assert(sizeof(pagedattn_device) == sizeof(DLDevice), "DLDevice size");
static_assert(alignof(pagedattn_device) == alignof(DLDevice), "DLDevice alignment");
SAME_FIELD(pagedattn_device, DLDevice, device_type, device_type);
SAME_FIELD(pagedattn_device, DLDevice, device_id, device_id);

static_assert(sizeof(pagedattn_dlpack_dtype) == sizeof(DLDataType), "DLDataType size");
SAME_FIELD(pagedattn_dlpack_dtype, DLDataType, code, code);
SAME_FIELD(pagedattn_dlpack_dtype, DLDataType, bits, bits);
SAME_FIELD(pagedattn_dlpack_dtype, DLDataType, lanes, lanes);

static_assert(sizeof(pagedattn_tensor) == sizeof(DLTensor), "DLTensor size");
static_assert(alignof(pagedattn_tensor) == alignof(DLTensor), "DLTensor alignment");
SAME_FIELD(pagedattn_tensor, DLTensor, data, data);
SAME_FIELD(pagedattn_tensor, DLTensor, device, device);
SAME_FIELD(pagedattn_tensor, DLTensor, ndim, ndim);
SAME_FIELD(pagedattn_tensor, DLTensor, dtype, dtype);
SAME_FIELD(pagedattn_tensor, DLTensor, shape, shape);
SAME_FIELD(pagedattn_tensor, DLTensor, strides, strides);
SAME_FIELD(pagedattn_tensor, DLTensor, byte_offset, byte_offset);

// The codes that exist in dlpack 0.6 (the fp8 codes are DLPack 1.1's and are not in this header).
static_assert(PAGEDATTN_DEVICE_CPU == kDLCPU, "kDLCPU");
static_assert(PAGEDATTN_DEVICE_CUDA == kDLCUDA, "kDLCUDA");
static_assert(PAGEDATTN_DEVICE_CUDA_HOST == kDLCUDAHost, "kDLCUDAHost");
static_assert(PAGEDATTN_DEVICE_ROCM == kDLROCM, "kDLROCM");
static_assert(PAGEDATTN_DEVICE_ROCM_HOST == kDLROCMHost, "kDLROCMHost");
static_assert(PAGEDATTN_DLPACK_INT == kDLInt, "kDLInt");
static_assert(PAGEDATTN_DLPACK_UINT == kDLUInt, "kDLUInt");
static_assert(PAGEDATTN_DLPACK_FLOAT == kDLFloat, "kDLFloat");
static_assert(PAGEDATTN_DLPACK_BFLOAT == kDLBfloat, "kDLBfloat");

TEST(DLPackLayout, RuntimeFieldOffsets) {
  // The static_asserts above are the test; this repeats them at run time so the result is
  // visible in the log together with the header version.
  EXPECT_EQ(DLPACK_VERSION >= 60, true) << "dlpack " << DLPACK_VERSION;
  EXPECT_EQ(offsetof(pagedattn_tensor, byte_offset), offsetof(DLTensor, byte_offset));
  EXPECT_EQ(sizeof(pagedattn_tensor), sizeof(DLTensor));
}

TEST(DLPackLayout, DLTensorIsAcceptedAsIs) {
  // A DLTensor built with DLPack's own types goes through the API by a pointer cast.
  float data[2 * 3 * 8] = {};
  int64_t shape[3] = {2, 3, 8};
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 3;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  pagedattn_dtype dt = PAGEDATTN_DTYPE_INVALID;
  const pagedattn_tensor* pt = reinterpret_cast<const pagedattn_tensor*>(&t);
  ASSERT_EQ(pagedattn_dtype_from_dlpack(&dt, pt->dtype), PAGEDATTN_OK);
  EXPECT_EQ(dt, PAGEDATTN_DTYPE_FLOAT32);
  EXPECT_EQ(pt->shape[2], 8);
  EXPECT_EQ(pt->device.device_type, PAGEDATTN_DEVICE_CPU);
}
