// device.h — the device side of CUDA as the emulated kernels see it, compiled by the host
// compiler: the qualifiers (empty), the built-in indices (the running fiber's), barriers and
// shuffles (rendezvous of the block runner, each naming its source line), vector types, math
// intrinsics and the launch path that PA_LAUNCH (vendor.cuh) expands to.
#ifndef PAGEDATTN_GPUSIM_DEVICE_H
#define PAGEDATTN_GPUSIM_DEVICE_H

#include <math.h>
#include <string.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "simt.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

#define threadIdx (::pa_sim::builtins().thread_idx)
#define blockIdx (::pa_sim::builtins().block_idx)
#define blockDim (::pa_sim::builtins().block_dim)
#define gridDim (::pa_sim::builtins().grid_dim)
#define warpSize (::pa_sim::warp_size())

#define __syncthreads() ::pa_sim::sync_block(__FILE__, __LINE__, __PRETTY_FUNCTION__)
#define __syncwarp(...) \
  ::pa_sim::sync_warp(::pa_sim::warp_mask(__VA_ARGS__), __FILE__, __LINE__, __PRETTY_FUNCTION__)
#define __shfl_xor_sync(mask, v, m) \
  ::pa_sim::shfl_xor((mask), (v), (m), __FILE__, __LINE__, __PRETTY_FUNCTION__)
// HIP's spellings: the whole wave takes part.
#define __shfl_xor(v, m) \
  ::pa_sim::shfl_xor(0xffffffffu, (v), (m), __FILE__, __LINE__, __PRETTY_FUNCTION__)
#define __builtin_amdgcn_wave_barrier() \
  ::pa_sim::sync_warp(0xffffffffu, __FILE__, __LINE__, __PRETTY_FUNCTION__)

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// The integer min/max that device code calls unqualified.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}

namespace pa_sim {

inline unsigned warp_mask() { return 0xffffffffu; }
inline unsigned warp_mask(unsigned m) { return m; }

// A full-warp xor shuffle of any trivially copyable value of up to 8 bytes.
template <typename T>
T shfl_xor(unsigned mask, T v, int lane_mask, const char* file, int line, const char* fn) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = shfl_xor_bits(bits, lane_mask, mask, file, line, fn);
  memcpy(&v, &bits, sizeof(T));
  return v;
}

// What PA_LAUNCH(kernel, grid, block, smem, stream)(args...) builds: binds the arguments by
// value (converted to the kernel's parameter types, as a launch does) and submits the grid.
template <typename F>
struct Launcher;
template <typename... P>
struct Launcher<void (*)(P...)> {
  void (*kernel)(P...);
  LaunchConfig cfg;
  cudaStream_t stream;
  Launcher(void (*k)(P...), const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
           const char* file, int line, int warp, const char* from)
      : kernel(k),
        cfg{grid, block, smem, reinterpret_cast<const void*>(k), name, file, line, warp, from},
        stream(s) {}
  template <typename... A>
  void operator()(A&&... a) const {
    auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
    auto k = kernel;
    (void)submit(stream, cfg, [k, args]() { std::apply(k, *args); });
  }
};

template <typename... P>
Launcher<void (*)(P...)> launcher(void (*k)(P...), const char* name, dim3 grid, dim3 block,
                                  size_t smem, cudaStream_t s, const char* file, int line,
                                  int warp, const char* from = "") {
  return Launcher<void (*)(P...)>(k, name, grid, block, smem, s, file, line, warp, from);
}

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_DEVICE_H
