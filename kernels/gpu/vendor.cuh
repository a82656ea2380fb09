// vendor.cuh — the few names that differ between CUDA (nvcc) and ROCm/HIP (hipcc).
// Everything else in kernels/gpu is written once against these.
#ifndef PAGEDATTN_GPU_VENDOR_CUH
#define PAGEDATTN_GPU_VENDOR_CUH

#include "gpu_config.h"  // PA_*_CODE_OBJECTS: what each plugin build carries (meson)

// The kernels choose code paths by feature, not by vendor, so each emulated configuration
// (sim/, PA_SIM) runs exactly the path of the hardware it stands for:
//   PA_HAS_CP_ASYNC  cp.async pipelines (CUDA sm_80+)
//   PA_HAS_MMA_SYNC  mma.sync m16n8k16 and ldmatrix register fragments (CUDA sm_80+; mma.cuh)
//   PA_MFMA_TILES    the MFMA tiles are built (every HIP pass, host included): the host sends
//                    16-bit tiles to them on a device with matrix cores (AttnParams.matrix_cores)
//   PA_HAS_MFMA      v_mfma_f32_16x16x16 f16/bf16_1k (CDNA gfx90a, gfx94x device passes; mfma.cuh)
//   PA_HAS_FP8_CVT   the fp8 -> half conversion instruction (CUDA sm_89+, per device pass)
//   PA_LDS_64K       64 KiB of shared memory (LDS) per block: smaller tiles (AMD)
//   PA_TARGET_GFX    devices named by gcnArchName (gfxNNN), not by compute capability (AMD)
// and PA_WARP_SIZE. The emulator's HIP configuration (PA_SIM_HIP) keeps the emulator's runtime
// (CUDA's names) with the features and wave size of an AMD GPU.
#if !defined(PA_SIM) && \
    (defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || defined(__HIPCC__))
#define PA_HIP 1
#define PA_GPU_CODE_OBJECTS PA_HIP_CODE_OBJECTS
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>

typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipDeviceProp_t gpuDeviceProp;
#define gpuSuccess hipSuccess
#define gpuErrorInvalidValue hipErrorInvalidValue
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuHostAlloc(p, n) hipHostMalloc((p), (n), hipHostMallocDefault)
#define gpuFreeHost hipHostFree
#define gpuMemset hipMemset
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpy2DAsync hipMemcpy2DAsync
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuMemGetInfo hipMemGetInfo
#define gpuFuncSetMaxDynamicSmem(f, n) \
  hipFuncSetAttribute(reinterpret_cast<const void*>(f), hipFuncAttributeMaxDynamicSharedMemorySize, (n))
typedef hipFuncAttributes gpuFuncAttributes;
#define gpuFuncGetAttributes(a, f) hipFuncGetAttributes((a), reinterpret_cast<const void*>(f))
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
// AMD GPUs have no opt-in beyond the LDS a workgroup may use.
#define PA_SMEM_PER_BLOCK(prop) ((prop).sharedMemPerBlock)
#define PA_TARGET_GFX 1  // devices are named by gcnArchName (gfxNNN), not compute capability
#define PA_RUNTIME_NAME "hip"
#define PA_DEVICE_TYPE PAGEDATTN_DEVICE_ROCM
#define PA_HOST_DEVICE_TYPE PAGEDATTN_DEVICE_ROCM_HOST

// The wave size is a per-device-pass constant: 64 on CDNA (gfx90a, gfx940), 32 on RDNA (gfx1030).
// Host passes never see it; host code only launches multiples of 64 threads.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define PA_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define PA_WARP_SIZE 64
#endif
// HIP shuffles take no mask: the whole wave takes part.
#define PA_SHFL_XOR(v, m) __shfl_xor((v), (m))
// A wavefront runs in lockstep; the barrier only keeps the compiler from reordering across it.
#define PA_SYNCWARP() __builtin_amdgcn_wave_barrier()
#define PA_LDS_64K 1
// Matrix cores with the bf16_1k forms: CDNA2 and CDNA3 (gfx908 and RDNA stay scalar). One
// plugin carries every architecture, so the host chooses the tile per device at run time.
#define PA_MFMA_TILES 1
#if defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define PA_HAS_MFMA 1
#endif

#else  // CUDA, or the emulator (PA_SIM: the host compiler against sim/include)
#define PA_CUDA 1
// Before the runtime header: the emulator's cudaFuncGetAttributes answers by this list.
#if defined(PA_SIM_HIP) && defined(PA_SIM_WAVE32)
#define PA_GPU_CODE_OBJECTS PA_SIM_HIP_WAVE32_CODE_OBJECTS
#elif defined(PA_SIM_HIP)
#define PA_GPU_CODE_OBJECTS PA_SIM_HIP_CODE_OBJECTS
#else
#define PA_GPU_CODE_OBJECTS PA_CUDA_CODE_OBJECTS
#endif
#include <cuda_runtime.h>
#include <cuda_fp16.h>

typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaDeviceProp gpuDeviceProp;
#define gpuSuccess cudaSuccess
#define gpuErrorInvalidValue cudaErrorInvalidValue
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuHostAlloc(p, n) cudaHostAlloc((p), (n), cudaHostAllocDefault)
#define gpuFreeHost cudaFreeHost
#define gpuMemset cudaMemset
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpy2DAsync cudaMemcpy2DAsync
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuMemGetInfo cudaMemGetInfo
#define gpuFuncSetMaxDynamicSmem(f, n) \
  cudaFuncSetAttribute((f), cudaFuncAttributeMaxDynamicSharedMemorySize, (n))
typedef cudaFuncAttributes gpuFuncAttributes;
#define gpuFuncGetAttributes(a, f) cudaFuncGetAttributes((a), (f))
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define PA_SMEM_PER_BLOCK(prop) ((prop).sharedMemPerBlockOptin)
#if defined(PA_SIM) && defined(PA_SIM_HIP)
// The emulator as an AMD GPU: wave 64 (CDNA) or, with PA_SIM_WAVE32, wave 32 (RDNA), 64 KiB of
// LDS, none of CUDA's features.
#define PA_RUNTIME_NAME "hip"
#define PA_DEVICE_TYPE PAGEDATTN_DEVICE_ROCM
#define PA_HOST_DEVICE_TYPE PAGEDATTN_DEVICE_ROCM_HOST
#if defined(PA_SIM_WAVE32)
#define PA_WARP_SIZE 32
#else
#define PA_WARP_SIZE 64
#define PA_MFMA_TILES 1
#define PA_HAS_MFMA 1
#endif
#define PA_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define PA_SYNCWARP() __builtin_amdgcn_wave_barrier()
#define PA_LDS_64K 1
#define PA_TARGET_GFX 1
#else
#define PA_RUNTIME_NAME "cuda"
#define PA_DEVICE_TYPE PAGEDATTN_DEVICE_CUDA
#define PA_HOST_DEVICE_TYPE PAGEDATTN_DEVICE_CUDA_HOST

#define PA_WARP_SIZE 32
#define PA_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
// Orders shared-memory accesses between the lanes of a warp (independent thread scheduling).
#define PA_SYNCWARP() __syncwarp()
#define PA_HAS_CP_ASYNC 1
#define PA_HAS_MMA_SYNC 1
// The emulator stands for sm_90.
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890) || defined(PA_SIM)
#define PA_HAS_FP8_CVT 1
#endif
#endif
#endif

// Kernel launches and dynamic shared memory go through these two macros, so the emulator
// (sim/, built with PA_SIM by the host compiler) can give them their semantics on a CPU.
// PA_LAUNCH(kernel, grid, block, smem, stream)(args...) is kernel<<<grid, block, smem, stream>>>.
#if defined(PA_SIM)
#define PA_LAUNCH(k, grid, block, smem, stream) \
  ::pa_sim::launcher(k, #k, grid, block, smem, stream, __FILE__, __LINE__, PA_WARP_SIZE, \
                     __PRETTY_FUNCTION__)
#define PA_DYNAMIC_SHARED(align, name) char* const name = ::pa_sim::dynamic_smem()
#else
#define PA_LAUNCH(k, grid, block, smem, stream) k<<<grid, block, smem, stream>>>
#define PA_DYNAMIC_SHARED(align, name) extern __shared__ __align__(align) char name[]
#endif

#endif  // PAGEDATTN_GPU_VENDOR_CUH
