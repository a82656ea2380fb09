// The emulator's profile (kernels/gpu/sim/profile.h): its counters on hand-written kernels with
// known access patterns (coalesced and strided global loads, bank conflicts, ldmatrix with and
// without padding, instruction classes), then real forwards through the emulated plugin
// (PAGEDATTN_PLUGIN_PATH), whose K/V staging must stay coalesced, read each K/V byte once per GQA
// group (decode) or once per query tile (causal prefill), and, on the tensor-core kernels, keep
// its ldmatrix reads and cp.async stores free of bank conflicts.
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <stdio.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mma.cuh"
#include "pagedattn_test_support.h"
#include "profile.h"
#include "staging.cuh"
#include "types.cuh"

namespace {

using namespace pagedattn_gpu;
using pa_sim::LaunchProfile;

template <typename... P, typename... A>
LaunchProfile profile_one(void (*k)(P...), unsigned threads, size_t smem, int warp, A... a) {
  pa_sim::profile_begin();
  pa_sim::launcher(k, "test kernel", 1, threads, smem, nullptr, __FILE__, __LINE__, warp)(a...);
  pa_sim::profile_end();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<LaunchProfile> v = pa_sim::profile_get();
  EXPECT_EQ(v.size(), 1u);
  return v.empty() ? LaunchProfile() : v[0];
}

// Lane l loads the float at p + l * stride (coalesced at stride 1) and stores it back.
__global__ void strided_floats(float* p, int stride) {
  const int l = static_cast<int>(threadIdx.x);
  st_global(p + l * stride, ld_global(p + l * stride, kUseKV) + 1.f, kUseOut);
}

TEST(GpuSimProfile, CoalescedAndStridedGlobalLoads) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 32 * 32 * sizeof(float)), cudaSuccess);
  LaunchProfile p = profile_one(strided_floats, 32, 0, 32, d, 1);
  const pa_sim::GlobalStat ld = p.global[pa_sim::kGlobalLd][pa_sim::kUseKV];
  EXPECT_EQ(ld.requests, 1u);
  EXPECT_EQ(ld.bytes, 128u);
  EXPECT_EQ(ld.sectors, 4u);  // 128 aligned bytes: 4 sectors
  EXPECT_DOUBLE_EQ(pa_sim::sector_efficiency(ld), 1.0);
  EXPECT_EQ(p.global[pa_sim::kGlobalSt][pa_sim::kUseOut].sectors, 4u);
  EXPECT_EQ(p.bytes_moved(), 256u);

  p = profile_one(strided_floats, 32, 0, 32, d, 32);  // a lane per 128-byte line
  const pa_sim::GlobalStat st = p.global[pa_sim::kGlobalLd][pa_sim::kUseKV];
  EXPECT_EQ(st.requests, 1u);
  EXPECT_EQ(st.sectors, 32u);
  EXPECT_DOUBLE_EQ(pa_sim::sector_efficiency(st), 4.0 / 32.0);
  EXPECT_EQ(p.warps_active, 1u);
  EXPECT_EQ(p.blocks_active, 1u);
  cudaFree(d);
}

// Every lane reads shared float `lane * stride` (stride 0: one word for all), a loop of `reps`
// iterations (one request each), then writes 16 bytes at lane * 16.
__global__ void shared_pattern(int stride, int reps, float* out) {
  PA_DYNAMIC_SHARED(16, smem);
  float* s = reinterpret_cast<float*>(smem);
  const int l = static_cast<int>(threadIdx.x) % 32;
  float acc = 0.f;
  for (int r = 0; r < reps; ++r) acc += ld_shared(s + l * stride);
  st_shared(reinterpret_cast<uint4*>(smem) + l, make_uint4(0, 0, 0, 0));
  out[threadIdx.x] = acc;
}

TEST(GpuSimProfile, SharedMemoryBankConflicts) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 64 * sizeof(float)), cudaSuccess);
  struct Want {
    int stride;
    double wavefronts;
  } const wants[] = {{1, 1}, {0, 1}, {2, 2}, {4, 4}, {32, 32}, {33, 1}};
  for (const Want& w : wants) {
    const LaunchProfile p = profile_one(shared_pattern, 32, 32 * 33 * 4, 32, w.stride, 3, out);
    const pa_sim::SharedStat& ld = p.shared[pa_sim::kSharedLd];
    EXPECT_EQ(ld.requests, 3u) << "stride " << w.stride;
    EXPECT_DOUBLE_EQ(pa_sim::wavefronts_per_request(ld), w.wavefronts) << "stride " << w.stride;
    EXPECT_EQ(ld.ideal, 3u) << "stride " << w.stride;  // at most 128 distinct bytes
    // 512 consecutive bytes: 4 passes of 8 lanes, no conflict.
    EXPECT_EQ(p.shared[pa_sim::kSharedSt].wavefronts, 4u);
    EXPECT_EQ(p.shared[pa_sim::kSharedSt].ideal, 4u);
  }
  // A wave of 64 lanes: 4-byte accesses go a half-wave (32 lanes, 32 banks) a pass.
  const LaunchProfile p = profile_one(shared_pattern, 64, 32 * 33 * 4, 64, 1, 1, out);
  EXPECT_EQ(p.shared[pa_sim::kSharedLd].requests, 1u);
  EXPECT_EQ(p.shared[pa_sim::kSharedLd].wavefronts, 2u);  // lanes 32..63 repeat 0..31's words
  cudaFree(out);
}

// One ldmatrix x4 over 32 rows of 8 halves, `ld` halves apart (ld 8: contiguous, 64: every row
// on banks 0..3, 72: rows padded by 16 bytes), then one mma.sync, a shuffle and a barrier.
__global__ void ldmatrix_rows(int ld, float* out) {
  PA_DYNAMIC_SHARED(16, smem);
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 32 * ld; i += 32) s[i] = 0;
  __syncthreads();
  uint32_t a[4];
  ldmatrix_x4(a, s + lane * ld);
  const uint32_t b[2] = {a[0], a[1]};
  float d[4] = {0, 0, 0, 0};
  mma_m16n8k16_bf16(d, a, b, d);
  out[lane] = __shfl_xor_sync(0xffffffffu, d[0], 1);
}

TEST(GpuSimProfile, LdmatrixWavefrontsAndInstructionClasses) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)), cudaSuccess);
  struct Want {
    int ld;
    uint64_t wavefronts;
  } const wants[] = {{8, 4}, {72, 4}, {64, 32}, {16, 8}};
  for (const Want& w : wants) {
    const LaunchProfile p = profile_one(ldmatrix_rows, 32, 32 * 72 * 2, 32, w.ld, out);
    const pa_sim::SharedStat& lm = p.shared[pa_sim::kSharedLdmatrix];
    EXPECT_EQ(lm.requests, 1u) << "ld " << w.ld;
    EXPECT_EQ(lm.bytes, 512u) << "ld " << w.ld;
    EXPECT_EQ(lm.wavefronts, w.wavefronts) << "ld " << w.ld;
    EXPECT_EQ(lm.ideal, 4u) << "ld " << w.ld;
    EXPECT_EQ(p.ops[static_cast<int>(pa_sim::Op::kMma)], 1u);
    EXPECT_EQ(p.ops[static_cast<int>(pa_sim::Op::kShuffle)], 1u);
    EXPECT_EQ(p.ops[static_cast<int>(pa_sim::Op::kBarrier)], 1u);
    EXPECT_EQ(p.tensor_flops(), 4096u);
  }
  cudaFree(out);
}

// Each lane copies 16 bytes with cp.async (lanes 16 bytes apart in both memories).
__global__ void async_rows(const char* src, float* out) {
  PA_DYNAMIC_SHARED(16, smem);
  const int l = static_cast<int>(threadIdx.x);
  copy_unit_async(smem + 16 * l, src + 16 * l, 16);
  async_commit();
  async_wait<0>();
  __syncthreads();
  out[l] = static_cast<float>(smem[16 * ((l + 1) % 32)]);
}

TEST(GpuSimProfile, AsyncCopiesCountBothSides) {
  char* src = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), 512), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)), cudaSuccess);
  const LaunchProfile p = profile_one(async_rows, 32, 512, 32, static_cast<const char*>(src), out);
  const pa_sim::GlobalStat g = p.global[pa_sim::kGlobalAsync][pa_sim::kUseKV];
  EXPECT_EQ(g.requests, 1u);
  EXPECT_EQ(g.sectors, 16u);
  EXPECT_EQ(p.shared[pa_sim::kSharedAsync].requests, 1u);
  EXPECT_EQ(p.shared[pa_sim::kSharedAsync].wavefronts, 4u);
  EXPECT_EQ(p.ops[static_cast<int>(pa_sim::Op::kCommit)], 1u);
  EXPECT_EQ(p.ops[static_cast<int>(pa_sim::Op::kWait)], 1u);
  // Counting is off outside profile_begin/end: nothing is kept.
  pa_sim::launcher(async_rows, "test kernel", 1, 32, 512, nullptr, __FILE__, __LINE__, 32)(
      static_cast<const char*>(src), out);
  EXPECT_EQ(pa_sim::profile_get().size(), 1u);
  cudaFree(src);
  cudaFree(out);
}

// ---- Real forwards through the emulated plugin ----

class GpuSimProfileForward : public pat::BackendTest {
 protected:
  // Runs case c (checked against the float64 reference) and returns its attention launches,
  // merged per kernel.
  std::vector<LaunchProfile> run(const pat::AttnCase& c) {
    pa_sim::profile_begin();
    pat::CaseResult res;
    const auto ok = pat::run_attention_case(be, c, 0x5eed, &res);
    pa_sim::profile_end();
    EXPECT_TRUE(ok) << c.describe();
    std::vector<LaunchProfile> attn;
    for (const LaunchProfile& l : pa_sim::profile_by_kernel(pa_sim::profile_get()))
      if (l.global_use(pa_sim::kUseKV).requests) attn.push_back(l);
    EXPECT_FALSE(attn.empty()) << "no launch read K/V";
    return attn;
  }
};

pat::AttnCase bf16_case(pagedattn_layout layout, int block) {
  pat::AttnCase c;
  c.dtype = PAGEDATTN_DTYPE_BFLOAT16;
  c.H = 32;
  c.Hkv = 8;
  c.D = 128;
  c.block_size = block;
  c.layout = layout;
  return c;
}

// K and V bytes the work needs at least: every key of every sequence once per KV head.
double kv_min_bytes(const pat::AttnCase& c) {
  double keys = 0;
  for (const pat::SeqSpec& s : c.seqs) keys += s.ctx + s.qlen;
  return keys * c.Hkv * c.D * 2.0 /* bf16 */ * 2.0 /* K and V */;
}

struct Totals {
  pa_sim::GlobalStat kv;
  pa_sim::SharedStat ldmatrix, async_dst;
  bool mma = false;
};
Totals totals(const std::vector<LaunchProfile>& v, double min_bytes, const char* what) {
  Totals t;
  for (const LaunchProfile& l : v) {
    const pa_sim::GlobalStat g = l.global_use(pa_sim::kUseKV);
    t.kv.requests += g.requests;
    t.kv.bytes += g.bytes;
    t.kv.unique_bytes += g.unique_bytes;
    t.kv.sectors += g.sectors;
    const pa_sim::SharedStat& a = l.shared[pa_sim::kSharedLdmatrix];
    const pa_sim::SharedStat& b = l.shared[pa_sim::kSharedAsync];
    t.ldmatrix.requests += a.requests;
    t.ldmatrix.wavefronts += a.wavefronts;
    t.ldmatrix.ideal += a.ideal;
    t.async_dst.requests += b.requests;
    t.async_dst.wavefronts += b.wavefronts;
    t.async_dst.ideal += b.ideal;
    t.mma = t.mma || l.kernel.rfind("attention_mma", 0) == 0;
    if (getenv("PAGEDATTN_GPUSIM_PROFILE_PRINT"))
      fprintf(stderr, "%s:\n%s", what, pa_sim::profile_report(l, min_bytes).c_str());
  }
  return t;
}

void check_kv(const Totals& t, double min_bytes, double reread, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_GE(pa_sim::sector_efficiency(t.kv), 0.9)
      << t.kv.sectors << " sectors for " << t.kv.unique_bytes << " bytes";
  const double ratio = 32.0 * t.kv.sectors / min_bytes;
  EXPECT_GE(ratio, reread * 0.999);
  EXPECT_LE(ratio, reread * 1.05);
  if (!t.mma) return;
  EXPECT_GT(t.ldmatrix.requests, 0u);
  EXPECT_EQ(t.ldmatrix.wavefronts, t.ldmatrix.ideal) << "ldmatrix bank conflicts";
  EXPECT_GT(t.async_dst.requests, 0u);
  EXPECT_EQ(t.async_dst.wavefronts, t.async_dst.ideal) << "cp.async store bank conflicts";
}

TEST_F(GpuSimProfileForward, DecodeKvStagingIsCoalescedAndReadOncePerGroup) {
  for (pagedattn_layout layout : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND})
    for (int block : {16, 32}) {
      pat::AttnCase c = bf16_case(layout, block);
      c.seqs = {{1, 255}, {1, 300}};
      const double min_bytes = kv_min_bytes(c);
      const std::string what = "decode " + c.describe();
      check_kv(totals(run(c), min_bytes, what.c_str()), min_bytes, 1.0, what);
    }
}

// A causal prefill tile reads the keys up to its last token: sum over tiles of T (i + 1) keys
// for N tokens in tiles of T (16 on the tensor-core kernel: 64 rows of 4 heads).
TEST_F(GpuSimProfileForward, PrefillKvStagingIsCoalescedAndReadOncePerTile) {
  for (pagedattn_layout layout : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND})
    for (int block : {16, 32}) {
      pat::AttnCase c = bf16_case(layout, block);
      const int n = 48;
      c.seqs = {{n, 0}};
      const double min_bytes = kv_min_bytes(c);
      const std::string what = "prefill " + c.describe();
      const Totals t = totals(run(c), min_bytes, what.c_str());
      if (!t.mma) {
        // The scalar kernels (HIP) tile by other sizes: only the coalescing is checked.
        EXPECT_GE(pa_sim::sector_efficiency(t.kv), 0.9) << what;
        continue;
      }
      const int tile = 16;
      double keys = 0;
      for (int i = 0; i * tile < n; ++i) keys += std::min(n, tile * (i + 1));
      check_kv(t, min_bytes, keys / n, what);
    }
}

// Issue 48's cases: decode of 4 sequences of 1024 keys (split-KV partitions on sm_90) and a
// causal prefill of 512 tokens, 32/8 heads of 128, bf16, blocks of 16, both layouts.
// PAGEDATTN_GPUSIM_PROFILE_PRINT=1 prints their reports.
TEST_F(GpuSimProfileForward, IssueCasesDecode4x1024AndPrefill512) {
  for (pagedattn_layout layout : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND}) {
    pat::AttnCase c = bf16_case(layout, 16);
    c.seqs = {{1, 1023}, {1, 1023}, {1, 1023}, {1, 1023}};
    double min_bytes = kv_min_bytes(c);
    std::string what = "decode " + c.describe();
    check_kv(totals(run(c), min_bytes, what.c_str()), min_bytes, 1.0, what);

    c.seqs = {{512, 0}};
    min_bytes = kv_min_bytes(c);
    what = "prefill " + c.describe();
    const Totals t = totals(run(c), min_bytes, what.c_str());
    if (!t.mma) {
      EXPECT_GE(pa_sim::sector_efficiency(t.kv), 0.9) << what;
      continue;
    }
    double keys = 0;
    for (int i = 0; i * 16 < 512; ++i) keys += 16 * (i + 1);
    check_kv(t, min_bytes, keys / 512, what);
  }
}

}  // namespace
