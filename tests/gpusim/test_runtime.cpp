// The emulator's own semantics, checked directly (kernels/gpu/sim): warp-scoped shuffles and
// gathers at warp sizes 32 and 64, cp.async copies that land only at their wait, barrier
// divergence aborting with its line, the shared-memory attribute rule, and stream-capture
// discipline.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <vector>

#include <gtest/gtest.h>

namespace {

template <typename... P, typename... A>
cudaError_t launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int warp,
                   A... a) {
  pa_sim::launcher(k, "test kernel", grid, block, smem, s, __FILE__, __LINE__, warp)(a...);
  return cudaGetLastError();
}

// Each warp sums its lanes' ids with xor shuffles; warps do different numbers of rounds.
__global__ void warp_sums(int* out, int warp) {
  int v = static_cast<int>(threadIdx.x % warp);
  const int rounds = static_cast<int>(threadIdx.x / warp) + 1;  // warp-uniform
  for (int r = 0; r < rounds; ++r)
    for (int o = warp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

TEST(GpuSim, ShufflesAreWarpScoped) {
  for (int warp : {32, 64}) {
    std::vector<int> out(128);
    int* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 128 * sizeof(int)), cudaSuccess);
    ASSERT_EQ(launch(warp_sums, 1, 128, 0, nullptr, warp, d, warp), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.data(), d, 128 * sizeof(int), cudaMemcpyDefault), cudaSuccess);
    for (int t = 0; t < 128; ++t) {
      long expect = static_cast<long>(warp) * (warp - 1) / 2;
      for (int r = 1; r < t / warp + 1; ++r) expect *= warp;
      EXPECT_EQ(out[t], expect) << "warp " << warp << " thread " << t;
    }
    cudaFree(d);
  }
}

// Each lane gathers its warp's values (lane * 3 + 1 and the warp, 8 bytes; odd lanes name none,
// leaving their slot zero) at one site.
__global__ void gather_lanes(long* out, int warp) {
  const int lane = static_cast<int>(threadIdx.x) % warp;
  const int mine[2] = {lane * 3 + 1, static_cast<int>(threadIdx.x) / warp};
  int all[64][2];
  pa_sim::warp_gather(mine, lane % 2 ? 0 : sizeof mine, all, sizeof all[0], 0xffffffffu, __FILE__,
                      __LINE__, __PRETTY_FUNCTION__);
  long sum = 0;
  for (int l = 0; l < warp; ++l) sum += all[l][0] * 1000 + all[l][1];
  out[threadIdx.x] = sum;
}

TEST(GpuSim, WarpGatherHandsEveryLaneAllSlots) {
  for (int warp : {32, 64}) {
    long* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 128 * sizeof(long)), cudaSuccess);
    ASSERT_EQ(launch(gather_lanes, 1, 128, 0, nullptr, warp, d, warp), cudaSuccess);
    for (int t = 0; t < 128; ++t) {
      long expect = 0;
      for (int l = 0; l < warp; l += 2) expect += (l * 3 + 1) * 1000L + t / warp;
      EXPECT_EQ(d[t], expect) << "warp " << warp << " thread " << t;
    }
    cudaFree(d);
  }
}

// Reads its shared slot before and after the wait of a deferred copy.
__global__ void deferred_copy(const int* src, int* before, int* after) {
  char* smem = pa_sim::dynamic_smem();
  int* s = reinterpret_cast<int*>(smem);
  s[threadIdx.x] = -1;
  __pipeline_memcpy_async(&s[threadIdx.x], &src[threadIdx.x], sizeof(int));
  __pipeline_commit();
  before[threadIdx.x] = s[threadIdx.x];
  __pipeline_wait_prior(0);
  after[threadIdx.x] = s[threadIdx.x];
}

TEST(GpuSim, AsyncCopiesLandAtTheirWait) {
  int *src, *before, *after;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), 32 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&before), 32 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&after), 32 * sizeof(int)), cudaSuccess);
  for (int i = 0; i < 32; ++i) src[i] = i;  // emulated device memory is host memory
  ASSERT_EQ(launch(deferred_copy, 1, 32, 32 * sizeof(int), nullptr, 32, src, before, after),
            cudaSuccess);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(before[i], -1);
    EXPECT_EQ(after[i], i);
  }
  cudaFree(src);
  cudaFree(before);
  cudaFree(after);
}

__global__ void diverges(int) {
  if (threadIdx.x == 3) return;
  __syncthreads();
}

TEST(GpuSimDeathTest, BarrierDivergenceAborts) {
  EXPECT_DEATH(launch(diverges, 1, 64, 0, nullptr, 32, 0),
               "thread 3 exited while thread [0-9]+ waits at __syncthreads at .*test_runtime.cpp");
}

__global__ void big_smem(int) {}

TEST(GpuSim, SharedMemoryOver48KiBNeedsTheAttribute) {
  EXPECT_EQ(launch(big_smem, 1, 32, 64 * 1024, nullptr, 32, 0), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  EXPECT_EQ(launch(big_smem, 1, 32, 64 * 1024, nullptr, 32, 0), cudaSuccess);
  EXPECT_EQ(launch(big_smem, 1, 32, 228 * 1024, nullptr, 32, 0), cudaErrorInvalidValue);
}

__global__ void add_one(int* p) { p[threadIdx.x] += 1; }

TEST(GpuSim, CaptureRecordsAndRefusesSynchronousCalls) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 32 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, 32 * sizeof(int)), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(launch(add_one, 1, 32, 0, s, 32, d), cudaSuccess);
  EXPECT_EQ(d[0], 0);  // recorded, not run
  cudaGraph_t g;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t e;
  ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(d[31], 2);

  // A synchronous copy during a global capture is refused and invalidates the capture.
  int h = 0;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDefault), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g2;
  EXPECT_EQ(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();

  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaFree(d);
  cudaStreamDestroy(s);
}

}  // namespace
