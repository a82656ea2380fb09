// Device-memory hooks for the HIP configuration of the emulator: the memory of device type ROCm
// (and ROCm host) is the emulator's, so the shared suites run unchanged on backend "hip". The
// emulator's runtime keeps CUDA's names (kernels/gpu/sim/runtime.h) for both configurations.
#include <cuda_runtime.h>

#include <cstring>

#include "pagedattn_test_support.h"

namespace {

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    ADD_FAILURE() << "gpusim malloc(" << bytes << "): " << cudaGetErrorString(e);
    return nullptr;
  }
  return p;
}
void dev_free(void* p) { (void)cudaFree(p); }
void dev_copy(void* dst, const void* src, size_t bytes) {
  const cudaError_t e = cudaDeviceSynchronize();
  const cudaError_t e2 = e == cudaSuccess ? cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) : e;
  if (e2 != cudaSuccess) ADD_FAILURE() << "gpusim copy of " << bytes << " bytes: " << cudaGetErrorString(e2);
}

struct Register {
  Register() {
    const pat::device_hooks dev = {PAGEDATTN_DEVICE_ROCM, dev_alloc, dev_free, dev_copy, dev_copy};
    const pat::device_hooks host = {PAGEDATTN_DEVICE_ROCM_HOST, dev_alloc, dev_free, dev_copy,
                                    dev_copy};
    pat::set_device_hooks(&dev);
    pat::set_device_hooks(&host);
  }
};
const Register kRegister;

}  // namespace
