// simt.h — what an emulated GPU thread asks of the block runner (block.cpp): its built-in
// indices, block barriers, warp-scoped rendezvous (shuffles, __syncwarp, the gathers of
// mma.sync and ldmatrix), the block's dynamic shared memory and deferred (cp.async) copies.
// Every call names its source line so a divergence is reported where it happens.
#ifndef PAGEDATTN_GPUSIM_SIMT_H
#define PAGEDATTN_GPUSIM_SIMT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

namespace pa_sim {

struct Builtins {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
// The running thread's indices (valid only inside a kernel).
PA_SIM_API const Builtins& builtins();
// __syncthreads: every live thread of the block waits here (the same barrier, none exited).
PA_SIM_API void sync_block(const char* file, int line, const char* fn);
// __syncwarp and warp-collective operations: every lane of the warp waits at this one site.
PA_SIM_API void sync_warp(unsigned mask, const char* file, int line, const char* fn);
// Full-warp xor shuffle of 8 bytes: returns the bits that lane ^ lane_mask passed.
PA_SIM_API uint64_t shfl_xor_bits(uint64_t bits, int lane_mask, unsigned mask, const char* file,
                                  int line, const char* fn);
// Warp all-gather: each lane names `bytes` (at most `stride`) at `src`; once every lane of the
// warp waits at this one site, the runner reads every lane's bytes (then, while no lane runs, so
// a source in shared memory is read as of that instant) and copies lane l's to dst + l * stride
// of every lane (dst holds warp_size() * stride bytes; a lane naming 0 bytes leaves its slot
// zero). `stride` must be the same on every lane.
PA_SIM_API void warp_gather(const void* src, size_t bytes, void* dst, size_t stride,
                            unsigned mask, const char* file, int line, const char* fn);
// Aborts as a divergence does: the message, then the kernel, its block and the seed.
[[noreturn]] PA_SIM_API void kernel_abort(const char* what, const char* file, int line,
                                          const char* fn);
// This thread's lane count per warp (32 or 64 by configuration), and its lane.
PA_SIM_API int warp_size();
PA_SIM_API int lane_id();
// Scratch shared by the lanes of this thread's warp (one 16x16 float tile), for collectives
// that split their work across the lanes.
PA_SIM_API float* warp_scratch();
// The block's dynamic shared memory: a heap buffer of exactly the launch's size.
PA_SIM_API char* dynamic_smem();
PA_SIM_API size_t dynamic_smem_bytes();
// cp.async: a copy that lands only at the wait that retires its group (src NULL: zeros).
PA_SIM_API void async_copy(void* dst, const void* src, size_t bytes);
PA_SIM_API void async_commit();
PA_SIM_API void async_wait_prior(int pending);

// The profile (profile.h). While it counts, the kernels' access wrappers (kernels/gpu/types.cuh,
// staging.cuh) name each global or shared access of a thread with its call site, and the warp
// operations count themselves; a block's records become warp-wide requests when it ends.
enum class Access : uint8_t {
  kGlobalLoad,
  kGlobalStore,
  kAsyncSrc,  // cp.async: the global read
  kSharedLoad,
  kSharedStore,
  kAsyncDst,  // cp.async: the shared-memory write
  kLdmatrix,  // one row address of an ldmatrix (16 bytes)
};
enum class Op : uint8_t { kMma, kShuffle, kSyncwarp, kBarrier, kCommit, kWait, kMfma, kCount };
extern PA_SIM_API bool g_profiling;
inline bool profiling() { return g_profiling; }
// `use` sorts global traffic: 0 K/V, 1 queries, 2 outputs, 3 other (pagedattn_gpu::MemUse).
PA_SIM_API void note_access(Access kind, int use, const void* addr, unsigned bytes,
                            const char* file, int line);
// One warp instruction `op` (called by every lane; lane 0 counts it).
PA_SIM_API void note_op(Op op);

// Runs every block of the grid (in a seeded random order) to completion.
cudaError_t run_grid(const LaunchConfig& c, const std::function<void()>& body);

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_SIMT_H
