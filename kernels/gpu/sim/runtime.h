// runtime.h — the host API of the GPU emulator, spelled as the CUDA runtime's: one virtual
// device whose memory is host memory, streams that run their work at once (or record it while
// captured, for graph replay), function attributes and sticky-free errors. The plugin (through
// vendor.cuh's gpu* names) and the GPU tests call these instead of libcudart.
#ifndef PAGEDATTN_GPUSIM_RUNTIME_H
#define PAGEDATTN_GPUSIM_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include <functional>

#define PA_SIM_API __attribute__((visibility("default")))

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
// The fields of cudaFuncAttributes the plugin reads.
struct cudaFuncAttributes {
  int maxThreadsPerBlock;
  int maxDynamicSharedSizeBytes;
};
#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaHostAllocDefault 0x0u

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

// The fields of cudaDeviceProp (and hipDeviceProp_t) the plugin reads.
struct cudaDeviceProp {
  char name[256];
  char gcnArchName[256];
  int major, minor;
  int multiProcessorCount;
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
};

namespace pa_sim {
struct Stream;
struct Graph;
struct GraphExec;
}  // namespace pa_sim
typedef pa_sim::Stream* cudaStream_t;
typedef pa_sim::Graph* cudaGraph_t;
typedef pa_sim::GraphExec* cudaGraphExec_t;

PA_SIM_API const char* cudaGetErrorString(cudaError_t e);
PA_SIM_API cudaError_t cudaGetLastError();
PA_SIM_API cudaError_t cudaPeekAtLastError();
PA_SIM_API cudaError_t cudaGetDeviceCount(int* n);
PA_SIM_API cudaError_t cudaGetDevice(int* d);
PA_SIM_API cudaError_t cudaSetDevice(int d);
PA_SIM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d);
PA_SIM_API cudaError_t cudaDeviceSynchronize();
PA_SIM_API cudaError_t cudaMalloc(void** p, size_t bytes);
PA_SIM_API cudaError_t cudaFree(void* p);
PA_SIM_API cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
PA_SIM_API cudaError_t cudaFreeHost(void* p);
PA_SIM_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
PA_SIM_API cudaError_t cudaMemset(void* p, int value, size_t bytes);
PA_SIM_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind k);
PA_SIM_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                                       cudaMemcpyKind k, cudaStream_t s = nullptr);
PA_SIM_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src,
                                         size_t spitch, size_t width, size_t height,
                                         cudaMemcpyKind k, cudaStream_t s = nullptr);
PA_SIM_API cudaError_t cudaStreamCreate(cudaStream_t* s);
PA_SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
PA_SIM_API cudaError_t cudaStreamDestroy(cudaStream_t s);
PA_SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t s);
PA_SIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
PA_SIM_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g);
PA_SIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g,
                                            unsigned long long flags = 0);
PA_SIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
PA_SIM_API cudaError_t cudaGraphDestroy(cudaGraph_t g);
PA_SIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);

namespace pa_sim {

PA_SIM_API cudaError_t func_set_attribute(const void* f, cudaFuncAttribute a, int value);
// A kernel's attributes, or cudaErrorNoKernelImageForDevice when the code objects `built` names
// (space-separated sm_XY, sm_XYa, compute_XY, gfxNNN) cannot run on the declared device.
PA_SIM_API cudaError_t func_get_attributes(cudaFuncAttributes* a, const void* f,
                                           const char* built);

// One kernel launch: the grid, the block, the dynamic shared memory, where it was launched,
// and the kernel's body (called once per emulated thread, the arguments bound by value).
struct LaunchConfig {
  dim3 grid, block;
  size_t smem;
  const void* func;
  const char* name;
  const char* file;
  int line;
  int warp_size;
  const char* from;  // the launching function (its __PRETTY_FUNCTION__), for the profile
};
PA_SIM_API cudaError_t submit(cudaStream_t s, const LaunchConfig& c, std::function<void()> body);

}  // namespace pa_sim

template <typename F>
inline cudaError_t cudaFuncSetAttribute(F* f, cudaFuncAttribute a, int value) {
  return pa_sim::func_set_attribute(reinterpret_cast<const void*>(f), a, value);
}
// The code objects a plugin build stands for come from its PA_GPU_CODE_OBJECTS (meson).
#if defined(PA_GPU_CODE_OBJECTS)
template <typename F>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, F* f) {
  return pa_sim::func_get_attributes(a, reinterpret_cast<const void*>(f), PA_GPU_CODE_OBJECTS);
}
#endif

#endif  // PAGEDATTN_GPUSIM_RUNTIME_H
