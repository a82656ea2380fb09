// staging.cuh — what the attention kernels share to bring K/V into shared memory: the dynamic
// shared-memory limit, vector loads converted to float, and global -> shared copies that need not
// wait (cp.async where the hardware has it).
#ifndef PAGEDATTN_GPU_STAGING_CUH
#define PAGEDATTN_GPU_STAGING_CUH

#include <stdint.h>

#include <atomic>

#include "types.cuh"
#include "vendor.cuh"

#if defined(PA_CUDA)
#include <cuda_pipeline.h>
#endif

namespace pagedattn_gpu {

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device. The attribute
// belongs to the kernel in one device's context, so it is set once per device (bit d of `done`;
// devices past 63 set it on every launch). No host sync and no allocation: legal inside a graph
// capture, though the first call for a device is best made outside one (a warm-up forward).
template <typename K>
gpuError_t raise_smem_limit(K kernel, int bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  gpuError_t e = gpuGetDevice(&dev);
  if (e != gpuSuccess) return e;
  const uint64_t bit = (dev >= 0 && dev < 64) ? (uint64_t{1} << dev) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return gpuSuccess;
  e = gpuFuncSetMaxDynamicSmem(kernel, bytes);
  if (e == gpuSuccess && bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

// Loads 8 consecutive elements at p (aligned to 8 * sizeof(T)) as floats.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* f) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
  } else if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    load_floats<T, 8>(reinterpret_cast<const T*>(&u), f);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    load_floats<T, 8>(reinterpret_cast<const T*>(&u), f);
  }
}

// load8 from shared memory (the scalar kernel's V rows), recorded as the vector loads it makes.
template <typename T>
__device__ __forceinline__ void load8_shared(const T* p, float* f PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kSharedLoad, kUseOther, p, sizeof(T) == 1 ? 8 : 16);
  if (sizeof(T) == 4) PA_ACCESS_NOTE(kSharedLoad, kUseOther, p + 4, 16);
  load8<T>(p, f);
}

// Copies vec bytes (16, 8, 4, 2 or 1) of K/V from src (global) to dst (shared) with one access.
__device__ __forceinline__ void copy_unit(char* dst, const char* src, int vec PA_ACCESS_SITE) {
  PA_ACCESS_NOTE(kGlobalLoad, kUseKV, src, vec);
  PA_ACCESS_NOTE(kSharedStore, kUseOther, dst, vec);
  switch (vec) {
    case 16: *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src); break;
    case 8: *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src); break;
    case 4: *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src); break;
    case 2: *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src); break;
    default: *dst = *src; break;
  }
}

// Global -> shared copies that do not wait for the data: on CUDA (cp.async, sm_80+) the next
// K/V chunk streams in while the current one is computed on; elsewhere a plain copy. kStages:
// the K/V buffers the scalar kernel cycles through.
#if defined(PA_HAS_CP_ASYNC)
constexpr int kStages = 2;
__device__ __forceinline__ void copy_unit_async(char* dst, const char* src,
                                                int vec PA_ACCESS_SITE) {
  if (vec >= 4) {
    PA_ACCESS_NOTE(kAsyncSrc, kUseKV, src, vec);
    PA_ACCESS_NOTE(kAsyncDst, kUseOther, dst, vec);
  }
  switch (vec) {
    case 16: __pipeline_memcpy_async(dst, src, 16); break;
    case 8: __pipeline_memcpy_async(dst, src, 8); break;
    case 4: __pipeline_memcpy_async(dst, src, 4); break;
    default: copy_unit(dst, src, vec PA_ACCESS_FWD); break;
  }
}
// 16 bytes from src to dst, or 16 zero bytes when !valid (src is then not read): cp.async's
// zero fill, so that a tile's edge needs no branch.
__device__ __forceinline__ void copy16_async_or_zero(char* dst, const char* src,
                                                     bool valid PA_ACCESS_SITE) {
  if (valid) {
    PA_ACCESS_NOTE(kAsyncSrc, kUseKV, src, 16);
    PA_ACCESS_NOTE(kAsyncDst, kUseOther, dst, 16);
  }
#if defined(PA_SIM)
  __pipeline_memcpy_async(dst, src, 16, valid ? 0 : 16);
#else
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void async_commit() { __pipeline_commit(); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void async_wait() { __pipeline_wait_prior(pending); }
#else
constexpr int kStages = 1;
__device__ __forceinline__ void copy_unit_async(char* dst, const char* src,
                                                int vec PA_ACCESS_SITE) {
  copy_unit(dst, src, vec PA_ACCESS_FWD);
}
__device__ __forceinline__ void async_commit() {}
template <int pending>
__device__ __forceinline__ void async_wait() {}
#endif

// Converts 8 key/value elements at src (aligned to 8 * sizeof(KT): a register copy of the raw
// bytes) to T and stores them at dst (16-byte aligned).
template <typename T, typename KT>
__device__ __forceinline__ void stage8(T* dst, const KT* src PA_ACCESS_SITE) {
  float f[8];
  load8<KT>(src, f);
  __align__(16) T o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = from_float<T>(f[e]);
  st_shared(reinterpret_cast<uint4*>(dst), *reinterpret_cast<const uint4*>(o) PA_ACCESS_FWD);
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_STAGING_CUH
