// Device-memory hooks of the shared test support, over the CUDA runtime: linked into every GPU
// test binary so the shared suites run unchanged on the cuda backend (PAGEDATTN_TEST_BACKEND).
// The GPU emulator's HIP configuration (tests/gpusim) builds them with PA_TEST_HOOKS_ROCM: its
// runtime keeps CUDA's names, its memory is of the ROCm device types.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "pagedattn_test_support.h"

namespace {

#if defined(PA_TEST_HOOKS_ROCM)
constexpr int32_t kDevice = PAGEDATTN_DEVICE_ROCM, kHost = PAGEDATTN_DEVICE_ROCM_HOST;
#else
constexpr int32_t kDevice = PAGEDATTN_DEVICE_CUDA, kHost = PAGEDATTN_DEVICE_CUDA_HOST;
#endif

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc(" << bytes << "): " << cudaGetErrorString(e);
    return nullptr;
  }
  return p;
}
void dev_free(void* p) { (void)cudaFree(p); }
void dev_copy(void* dst, const void* src, size_t bytes) {
  // Synchronous: tests read results right after a forward on the default or their own stream.
  const cudaError_t e = cudaDeviceSynchronize();
  const cudaError_t e2 = e == cudaSuccess ? cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) : e;
  if (e2 != cudaSuccess) ADD_FAILURE() << "cuda copy of " << bytes << " bytes: " << cudaGetErrorString(e2);
}
void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    ADD_FAILURE() << "cudaHostAlloc(" << bytes << "): " << cudaGetErrorString(e);
    return nullptr;
  }
  return p;
}
void pinned_free(void* p) { (void)cudaFreeHost(p); }
void pinned_copy(void* dst, const void* src, size_t bytes) {
  (void)cudaDeviceSynchronize();
  std::memcpy(dst, src, bytes);
}

struct Register {
  Register() {
    const pat::device_hooks dev = {kDevice, dev_alloc, dev_free, dev_copy, dev_copy};
    const pat::device_hooks host = {kHost, pinned_alloc, pinned_free, pinned_copy, pinned_copy};
    pat::set_device_hooks(&dev);
    pat::set_device_hooks(&host);
  }
};
const Register kRegister;

}  // namespace
