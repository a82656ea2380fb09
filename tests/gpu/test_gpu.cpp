// GPU-only tests on the backend named by PAGEDATTN_TEST_BACKEND (cuda): every supported head size x
// dtype x cache dtype, float32 queries at the widest heads (the lean tiles), GQA ratios 1-8 and beyond, block sizes 8-128, split-KV decode, CUDA-graph
// capture and replay after an in-place batch update (a decode step and a mixed chunked-prefill
// step, an MLA decode), device <-> host swaps, device slot mappings with bad slots, bad per-KV-head fp8 scales
// in device memory, and the small cases that scripts/gpu-check runs under compute-sanitizer. Without a GPU every test prints
// "skipped: no GPU".
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "pagedattn_test_support.h"

namespace {

using pat::AttnCase;
using pat::SeqSpec;

const pagedattn_dtype kModel[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                  PAGEDATTN_DTYPE_BFLOAT16};
const pagedattn_dtype kCache[] = {PAGEDATTN_DTYPE_INVALID, PAGEDATTN_DTYPE_FP8_E4M3,
                                  PAGEDATTN_DTYPE_FP8_E5M2};
const int kSpecHeads[] = {32, 64, 80, 96, 112, 120, 128, 160, 192, 224, 256};
const int kGpuBlocks[] = {8, 16, 32, 64, 128};

#define CUDA_OK(call)                                                              \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);         \
  } while (0)

class Gpu : public pat::BackendTest {
 protected:
  void run_cases(const std::vector<AttnCase>& cases, uint64_t master) {
    SCOPED_TRACE(pat::seed_note(master));
    std::mt19937_64 rng(master);
    int failures = 0;
    for (size_t i = 0; i < cases.size() && failures < 5; ++i) {
      const uint64_t seed = rng();
      if (!pat::case_sampled(master, i, cases.size())) continue;
      pat::CaseResult res;
      auto r = pat::run_attention_case(be, cases[i], seed, &res);
      if (!r) ++failures;
      EXPECT_TRUE(r) << "case " << i << ": " << cases[i].describe() << " (case seed " << seed << ")";
    }
  }
};

// A decode + prefill mix small enough for many cases.
std::vector<SeqSpec> mixed(std::mt19937_64& rng, int max_q, int max_ctx) {
  return pat::random_mixed_seqs(rng, 2 + static_cast<int>(rng() % 4), max_q, max_ctx, true);
}

// Case i of a dtype sweep: its block size and layout follow i, an fp8 cache gets random scales.
AttnCase dtype_case(pagedattn_dtype dt, pagedattn_dtype ct, int d, int h, int hkv, int i,
                    std::mt19937_64& rng) {
  AttnCase c;
  c.dtype = dt;
  c.cache_dtype = ct;
  c.D = d;
  c.H = h;
  c.Hkv = hkv;
  c.block_size = kGpuBlocks[i % 5];
  c.layout = (i % 2) ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
  c.lse = true;
  if (pat::is_fp8(ct)) {
    c.k_scale = 0.5f + static_cast<float>(rng() % 3);
    c.v_scale = 0.25f * static_cast<float>(1 + rng() % 6);
  }
  return c;
}

TEST_F(Gpu, EverySpecHeadSizeDtypeAndCacheDtype) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x1234);
  std::vector<AttnCase> cases;
  int i = 0;
  for (int d : kSpecHeads)
    for (pagedattn_dtype dt : kModel)
      for (pagedattn_dtype ct : kCache) {
        AttnCase c = dtype_case(dt, ct, d, 8, (i % 3 == 0) ? 8 : 2, i, rng);
        c.seqs = mixed(rng, 70, 300);
        cases.push_back(c);
        ++i;
      }
  run_cases(cases, master);
}

// Float32 queries at the widest head sizes, whose default tiles need more shared memory than
// sm_86/sm_89/sm_120 give a block: there (the emulator's sm_86 run) the lean tiles serve them.
TEST_F(Gpu, WideFloat32TilesEveryCacheDtype) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x5a11);
  std::vector<AttnCase> cases;
  int i = 0;
  for (int d : {192, 256, 224})
    for (pagedattn_dtype ct : kCache) {
      AttnCase c = dtype_case(PAGEDATTN_DTYPE_FLOAT32, ct, d, 4, (i % 2) ? 4 : 1, i, rng);
      c.window = (i % 4 == 3) ? 1 + static_cast<int>(rng() % 60) : 0;
      c.seqs = mixed(rng, 80, 200);
      cases.push_back(c);
      ++i;
    }
  run_cases(cases, master);
}

TEST_F(Gpu, GqaRatios1To8AndWider) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x77);
  std::vector<AttnCase> cases;
  const int hkvs[] = {1, 2, 4};
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}) {
    for (int hkv : hkvs) {
      AttnCase c;
      c.dtype = kModel[(g + hkv) % 3];
      c.H = g * hkv;
      c.Hkv = hkv;
      c.D = (g % 2) ? 128 : 64;
      c.block_size = kGpuBlocks[(g + hkv) % 5];
      c.lse = true;
      c.seqs = mixed(rng, 90, 600);
      cases.push_back(c);
    }
  }
  run_cases(cases, master);
}

TEST_F(Gpu, BlockSizesLayoutsAndFeatures) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x99);
  std::vector<AttnCase> cases;
  int i = 0;
  for (int bs : kGpuBlocks)
    for (pagedattn_layout lay : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND})
      for (int feature = 0; feature < 8; ++feature, ++i) {
        AttnCase c;
        c.dtype = kModel[i % 3];
        c.cache_dtype = kCache[(i / 3) % 3];
        c.block_size = bs;
        c.layout = lay;
        c.H = 8;
        c.Hkv = 2;
        c.D = 128;
        c.lse = true;
        c.seqs = mixed(rng, 40, 400);
        switch (feature) {
          case 0: c.alibi = true; break;
          case 1: c.soft_cap = 10.f + static_cast<float>(rng() % 30); break;
          case 2: c.window = 1 + static_cast<int>(rng() % 100); break;
          case 3:
            c.type = PAGEDATTN_ATTENTION_ENCODER;
            for (auto& s : c.seqs) { s.ctx = 0; s.qlen = std::max(1, s.qlen); }
            break;
          case 4:
            c.type = PAGEDATTN_ATTENTION_CROSS;
            for (auto& s : c.seqs) s.enc = static_cast<int>(rng() % 300);
            break;
          case 5: c.strided_io = true; c.wrap_cache = true; break;
          case 6: c.caller_slots = true; c.num_layers = 3; c.layer = 1; break;
          default:
            c.type = PAGEDATTN_ATTENTION_ENCODER_ONLY;
            c.write_kv = false;
            for (auto& s : c.seqs) { s.ctx = 0; s.qlen = std::max(1, s.qlen); }
            break;
        }
        cases.push_back(c);
      }
  run_cases(cases, master);
}

// Few long decodes leave most of the GPU idle: the plan splits the keys and merges the parts.
TEST_F(Gpu, SplitKvLongDecodes) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x5);
  std::vector<AttnCase> cases;
  for (int i = 0; i < 12; ++i) {
    AttnCase c;
    c.dtype = kModel[i % 3];
    c.cache_dtype = kCache[(i / 3) % 3];
    c.H = (i % 2) ? 32 : 16;
    c.Hkv = (i % 2) ? 8 : 16;
    c.D = (i % 4 < 2) ? 128 : 256;
    c.block_size = kGpuBlocks[i % 5];
    c.lse = true;
    if (i % 4 == 1) c.window = 100 + static_cast<int>(rng() % 3000);
    if (i % 4 == 2) c.alibi = true;
    if (i % 4 == 3) c.soft_cap = 30.f;
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n; ++s) {
      SeqSpec q;
      q.qlen = 1;
      q.ctx = 2000 + static_cast<int>(rng() % 7000);
      c.seqs.push_back(q);
    }
    cases.push_back(c);
  }
  run_cases(cases, master);
}

// A batch planned for many sequences (a graph's capacity) and updated to a step of few long
// decodes still splits their keys: the partition follows each step's rows.
TEST_F(Gpu, SplitKvFollowsTheStepNotTheCapacity) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x6);
  std::vector<AttnCase> cases;
  for (int i = 0; i < 4; ++i) {
    AttnCase c;
    c.dtype = kModel[i % 3];
    if (i == 3) c.cache_dtype = kCache[1];
    c.H = 32;
    c.Hkv = 8;
    c.D = 128;
    c.block_size = kGpuBlocks[i % 5];
    c.lse = true;
    c.via_update = true;
    c.spare_seqs = 254;
    if (i == 2) c.sinks = true;
    const int n = 1 + i % 3;
    for (int s = 0; s < n; ++s) {
      SeqSpec q;
      q.qlen = 1;
      q.ctx = 1500 + static_cast<int>(rng() % 3000);
      c.seqs.push_back(q);
    }
    cases.push_back(c);
  }
  run_cases(cases, master);
}

TEST_F(Gpu, LongChunkedPrefill) {
  const uint64_t master = pat::test_seed();
  std::mt19937_64 rng(master ^ 0x3);
  std::vector<AttnCase> cases;
  for (int i = 0; i < 6; ++i) {
    AttnCase c;
    c.dtype = kModel[i % 3];
    c.H = 16;
    c.Hkv = 4;
    c.D = 128;
    c.block_size = 16;
    c.lse = true;
    if (i % 2) c.window = 16 + static_cast<int>(rng() % 2032);
    c.seqs = pat::random_chunked_seqs(rng, 2 + static_cast<int>(rng() % 3), 16, 1024);
    cases.push_back(c);
  }
  run_cases(cases, master);
}

// A few small cases that between them launch every kernel (cache write, decode whole and split
// with its merge, scalar f32 prefill, tensor-core f16/bf16 prefill, encoder and cross tiles, fp8
// caches, padded head sizes, GQA groups of 1 to 8): the reduced suite scripts/gpu-check runs
// under compute-sanitizer memcheck and racecheck, kept small so neither tool can time out.
TEST_F(Gpu, SanitizerSmallCases) {
  const uint64_t master = pat::test_seed();
  auto seq = [](int q, int ctx, int enc = 0) {
    SeqSpec s;
    s.qlen = q;
    s.ctx = ctx;
    s.enc = enc;
    return s;
  };
  std::vector<AttnCase> cases(8);
  // f32: decode + scalar prefill (chunk with context) + an idle entry.
  cases[0].dtype = PAGEDATTN_DTYPE_FLOAT32;
  cases[0].H = 4; cases[0].Hkv = 2; cases[0].D = 64;
  cases[0].seqs = {seq(1, 20), seq(17, 5), seq(0, 0)};
  // f16, head size 80 (a padded 128 tile), HND, block 8: tensor-core prefill and decode.
  cases[1].dtype = PAGEDATTN_DTYPE_FLOAT16;
  cases[1].H = 8; cases[1].Hkv = 2; cases[1].D = 80; cases[1].block_size = 8;
  cases[1].layout = PAGEDATTN_LAYOUT_HND;
  cases[1].seqs = {seq(1, 70), seq(33, 40)};
  // bf16 over e4m3, group 8, one long decode: split-KV partitions and their merge.
  cases[2].dtype = PAGEDATTN_DTYPE_BFLOAT16;
  cases[2].cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3;
  cases[2].k_scale = 0.5f; cases[2].v_scale = 2.0f;
  cases[2].H = 8; cases[2].Hkv = 1; cases[2].D = 128; cases[2].block_size = 32;
  cases[2].seqs = {seq(1, 600)};
  // bf16 over e5m2, head size 256, block 64, ALiBi and soft cap.
  cases[3].dtype = PAGEDATTN_DTYPE_BFLOAT16;
  cases[3].cache_dtype = PAGEDATTN_DTYPE_FP8_E5M2;
  cases[3].H = 4; cases[3].Hkv = 4; cases[3].D = 256; cases[3].block_size = 64;
  cases[3].alibi = true; cases[3].soft_cap = 20.f;
  cases[3].seqs = {seq(20, 0), seq(1, 9)};
  // f16, group 3, sliding window.
  cases[4].dtype = PAGEDATTN_DTYPE_FLOAT16;
  cases[4].H = 6; cases[4].Hkv = 2; cases[4].D = 64; cases[4].window = 7;
  cases[4].seqs = {seq(25, 30), seq(1, 100)};
  // f32 encoder (k/v read from the tensors, written to the cache too).
  cases[5].dtype = PAGEDATTN_DTYPE_FLOAT32;
  cases[5].type = PAGEDATTN_ATTENTION_ENCODER;
  cases[5].H = 2; cases[5].Hkv = 1; cases[5].D = 32;
  cases[5].seqs = {seq(9, 0), seq(1, 0)};
  // bf16 cross attention, a decode and a first step.
  cases[6].dtype = PAGEDATTN_DTYPE_BFLOAT16;
  cases[6].type = PAGEDATTN_ATTENTION_CROSS;
  cases[6].H = 4; cases[6].Hkv = 2; cases[6].D = 64;
  cases[6].seqs = {seq(1, 3, 40), seq(5, 0, 17)};
  // f16 strided tensors over a wrapped cache, head size 96.
  cases[7].dtype = PAGEDATTN_DTYPE_FLOAT16;
  cases[7].H = 4; cases[7].Hkv = 4; cases[7].D = 96;
  cases[7].strided_io = true; cases[7].wrap_cache = true;
  cases[7].seqs = {seq(3, 10), seq(1, 0)};
  for (auto& c : cases) c.lse = true;
  run_cases(cases, master);
}

// ---- helpers for the hand-built tests ----

pagedattn_tensor host_i64(std::vector<int64_t>& v, int64_t* shape) {
  pagedattn_tensor t{};
  t.data = v.data();
  t.device = {PAGEDATTN_DEVICE_CPU, 0};
  t.ndim = 1;
  t.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
  *shape = static_cast<int64_t>(v.size());
  t.shape = shape;
  return t;
}

pagedattn_kv_cache* make_cache(pagedattn_backend* be, int layers, int blocks, int bs, int hkv,
                               int d, pagedattn_dtype dt, pagedattn_layout lay, uint32_t flags) {
  pagedattn_kv_cache_desc desc;
  pagedattn_kv_cache_desc_init(&desc);
  desc.num_layers = layers;
  desc.num_blocks = blocks;
  desc.block_size = bs;
  desc.num_kv_heads = hkv;
  desc.head_size = d;
  desc.dtype = dt;
  desc.layout = lay;
  desc.flags = flags;
  pagedattn_kv_cache* c = nullptr;
  const pagedattn_status st = pagedattn_kv_cache_create(&c, be, &desc);
  EXPECT_EQ(st, PAGEDATTN_OK) << pagedattn_last_error();
  return c;
}

// One decode step's world: K/V of every position on the host, tables, the cache filled with the
// context, device tensors of capacity `cap` rows.
struct DecodeWorld {
  int H = 8, Hkv = 2, D = 128, bs = 16, nb = 256;
  pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  std::vector<int32_t> ctx, table;
  int width = 32;
  std::vector<std::vector<float>> k, v;  // per seq: [(ctx+1)][Hkv][D], rounded to dt
  std::vector<float> q;                  // [nseq][H][D]
};

void fill_world(DecodeWorld& w, std::mt19937_64& rng, int nseq) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<int32_t> pool(w.nb);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  w.ctx.assign(nseq, 0);
  w.table.assign(static_cast<size_t>(nseq) * w.width, 0);
  w.k.assign(nseq, {});
  w.v.assign(nseq, {});
  size_t next = 0;
  for (int s = 0; s < nseq; ++s) {
    w.ctx[s] = static_cast<int32_t>(rng() % 300);
    const int need = (w.ctx[s] + 1 + w.bs - 1) / w.bs;
    for (int b = 0; b < need; ++b) w.table[static_cast<size_t>(s) * w.width + b] = pool[next++];
    const size_t n = static_cast<size_t>(w.ctx[s] + 1) * w.Hkv * w.D;
    w.k[s].resize(n);
    w.v[s].resize(n);
    for (size_t i = 0; i < n; ++i) {
      w.k[s][i] = pat::round_to(w.dt, u(rng));
      w.v[s][i] = pat::round_to(w.dt, u(rng));
    }
  }
  w.q.resize(static_cast<size_t>(nseq) * w.H * w.D);
  for (auto& x : w.q) x = pat::round_to(w.dt, u(rng));
}

// Writes every context position of every sequence of a world (DecodeWorld, StepWorld) into the
// cache (host slot mapping), with scales 1 or per-KV-head scale tensors.
template <class World>
void write_context(const World& w, pagedattn_kv_cache* cache, pagedattn_device dev,
                   const pagedattn_tensor* k_head_scales = nullptr,
                   const pagedattn_tensor* v_head_scales = nullptr) {
  std::vector<int64_t> slots;
  std::vector<float> kr, vr;
  const size_t row = static_cast<size_t>(w.Hkv) * w.D;
  for (size_t s = 0; s < w.ctx.size(); ++s)
    for (int p = 0; p < w.ctx[s]; ++p) {
      slots.push_back(static_cast<int64_t>(w.table[s * w.width + p / w.bs]) * w.bs + p % w.bs);
      kr.insert(kr.end(), w.k[s].begin() + p * row, w.k[s].begin() + (p + 1) * row);
      vr.insert(vr.end(), w.v[s].begin() + p * row, w.v[s].begin() + (p + 1) * row);
    }
  if (slots.empty()) return;
  const int64_t n = static_cast<int64_t>(slots.size());
  pat::Tensor kt(dev, w.dt, n, w.Hkv, w.D), vt(dev, w.dt, n, w.Hkv, w.D);
  for (int64_t r = 0; r < n; ++r)
    for (int h = 0; h < w.Hkv; ++h)
      for (int d = 0; d < w.D; ++d) {
        kt.set(r, h, d, kr[(r * w.Hkv + h) * w.D + d]);
        vt.set(r, h, d, vr[(r * w.Hkv + h) * w.D + d]);
      }
  kt.upload();
  vt.upload();
  int64_t shape = 0;
  pagedattn_tensor st = host_i64(slots, &shape);
  const pagedattn_status ws =
      k_head_scales ? pagedattn_kv_cache_write_scaled(cache, 0, kt.t(), vt.t(), &st, k_head_scales,
                                                      v_head_scales, nullptr)
                    : pagedattn_kv_cache_write(cache, 0, kt.t(), vt.t(), &st, 1.f, 1.f, nullptr);
  ASSERT_EQ(ws, PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaDeviceSynchronize());
}

// Loads q and the new tokens' k/v into device tensors of capacity rows.
void load_step(const DecodeWorld& w, pat::Tensor& q, pat::Tensor& k, pat::Tensor& v) {
  q.poison_all();
  k.poison_all();
  v.poison_all();
  for (size_t s = 0; s < w.ctx.size(); ++s) {
    for (int h = 0; h < w.H; ++h)
      for (int d = 0; d < w.D; ++d) q.set(static_cast<int64_t>(s), h, d, w.q[(s * w.H + h) * w.D + d]);
    const size_t off = static_cast<size_t>(w.ctx[s]) * w.Hkv * w.D;
    for (int h = 0; h < w.Hkv; ++h)
      for (int d = 0; d < w.D; ++d) {
        k.set(static_cast<int64_t>(s), h, d, w.k[s][off + h * w.D + d]);
        v.set(static_cast<int64_t>(s), h, d, w.v[s][off + h * w.D + d]);
      }
  }
  q.upload();
  k.upload();
  v.upload();
}

::testing::AssertionResult check_world(const DecodeWorld& w, pat::Tensor& out) {
  out.download();
  std::vector<double> ref;
  std::vector<float> got;
  pat::RefParams rp;
  rp.H = w.H;
  rp.Hkv = w.Hkv;
  rp.D = w.D;
  rp.scale = 1.0 / std::sqrt(static_cast<double>(w.D));
  for (size_t s = 0; s < w.ctx.size(); ++s) {
    std::vector<double> o(static_cast<size_t>(w.H) * w.D), lse(w.H);
    const int64_t qpos = w.ctx[s];
    pat::ref_attend(rp, 1, w.q.data() + s * w.H * w.D, &qpos, w.ctx[s] + 1, w.k[s].data(),
                    w.v[s].data(), o.data(), lse.data());
    ref.insert(ref.end(), o.begin(), o.end());
    for (int h = 0; h < w.H; ++h)
      for (int d = 0; d < w.D; ++d) got.push_back(out.get(static_cast<int64_t>(s), h, d));
  }
  return pat::check_close("out", ref, got, pat::tolerance(w.dt, w.dt));
}

pagedattn_batch_desc decode_desc(DecodeWorld& w, std::vector<int32_t>& qlens) {
  qlens.assign(w.ctx.size(), 1);
  pagedattn_batch_desc desc;
  pagedattn_batch_desc_init(&desc);
  desc.num_seqs = static_cast<int32_t>(w.ctx.size());
  desc.query_lens = qlens.data();
  desc.context_lens = w.ctx.data();
  desc.block_tables = w.table.data();
  desc.block_table_stride = w.width;
  return desc;
}

// Captures a decode forward in a CUDA graph, updates the batch in place (other lengths, tables
// and sequence count), replays, and checks the replay against the float64 reference and against
// an uncaptured forward of the same step.
TEST_F(Gpu, GraphCaptureDecodeReplayAfterUpdate) {
  if (!(caps.features & PAGEDATTN_FEATURE_GRAPH_CAPTURE)) GTEST_SKIP() << "no graph capture";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  DecodeWorld w;
  const int cap = 8;
  pagedattn_kv_cache* cache = make_cache(be, 1, w.nb, w.bs, w.Hkv, w.D, w.dt,
                                         PAGEDATTN_LAYOUT_NHD, 0);
  ASSERT_NE(cache, nullptr);
  pat::Tensor q(dev, w.dt, cap, w.H, w.D), k(dev, w.dt, cap, w.Hkv, w.D),
      v(dev, w.dt, cap, w.Hkv, w.D), out(dev, w.dt, cap, w.H, w.D), out2(dev, w.dt, cap, w.H, w.D);
  // The tensors handed over say 4 rows; the buffers hold `cap` rows for the replay after update.
  auto rows = [](pat::Tensor& t, int64_t n) {
    pagedattn_tensor x = *t.t();
    t.shape[0] = n;
    x.shape = t.shape.data();
    return x;
  };

  fill_world(w, rng, 4);
  write_context(w, cache, dev);
  load_step(w, q, k, v);
  std::vector<int32_t> qlens;
  pagedattn_batch_desc desc = decode_desc(w, qlens);
  desc.max_num_seqs = cap;
  desc.max_num_tokens = cap;
  desc.max_blocks_per_seq = w.width;
  desc.max_seq_len = w.width * w.bs;
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &desc), PAGEDATTN_OK)
      << pagedattn_last_error();
  pagedattn_attention_options opts;
  pagedattn_attention_options_init(&opts);
  opts.num_heads = w.H;
  opts.num_kv_heads = w.Hkv;
  opts.head_size = w.D;

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pagedattn_tensor tq = rows(q, 4), tk = rows(k, 4), tv = rows(v, 4), to = rows(out, 4);
  // Warm-up outside the capture (kernel attributes are set on first use).
  ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &opts, &tq, &tk, &tv, &to, nullptr, stream),
            PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));

  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const pagedattn_status fst =
      pagedattn_forward(be, batch, cache, 0, &opts, &tq, &tk, &tv, &to, nullptr, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(fst, PAGEDATTN_OK) << pagedattn_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  out.poison_all();
  out.upload();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(check_world(w, out)) << "first replay";

  // A new step: 6 sequences with new lengths and tables, same device buffers and cache.
  DecodeWorld w2;
  fill_world(w2, rng, 6);
  write_context(w2, cache, dev);
  load_step(w2, q, k, v);
  std::vector<int32_t> qlens2;
  pagedattn_batch_desc desc2 = decode_desc(w2, qlens2);
  ASSERT_EQ(pagedattn_batch_update(batch, &desc2), PAGEDATTN_OK) << pagedattn_last_error();
  out.poison_all();
  out.upload();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(check_world(w2, out)) << "replay after update";

  // The same step without a graph (write_kv off: the replay already wrote the new tokens).
  pagedattn_tensor tq6 = rows(q, 6), to6 = rows(out2, 6);
  pagedattn_attention_options o2 = opts;
  o2.write_kv = 0;
  ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &o2, &tq6, nullptr, nullptr, &to6, nullptr,
                              stream), PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  out2.download();
  out.download();
  bool same = true;
  for (int64_t r = 0; r < 6 && same; ++r)
    for (int h = 0; h < w.H && same; ++h)
      for (int d = 0; d < w.D && same; ++d) same = out.get(r, h, d) == out2.get(r, h, d);
  EXPECT_TRUE(same) << "graph replay differs from a direct forward";

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
}

// Tree masks live in the batch's device buffer: a forward captured under chain masks, replayed
// after an update to branching trees, gives the bytes of an uncaptured forward of the new step,
// and not those of the chains.
TEST_F(Gpu, GraphCaptureTreeMaskReplayAfterUpdate) {
  if (!(caps.features & PAGEDATTN_FEATURE_GRAPH_CAPTURE) ||
      !(caps.features & PAGEDATTN_FEATURE_TREE_MASK))
    GTEST_SKIP() << "no graph capture or tree masks";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int H = 8, Hkv = 2, D = 64, bs = 16, nb = 64, q = 6, T = 2 * q;
  const pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  pagedattn_kv_cache* cache = make_cache(be, 1, nb, bs, Hkv, D, dt, PAGEDATTN_LAYOUT_NHD, 0);
  ASSERT_NE(cache, nullptr);
  std::vector<int32_t> ql = {q, q}, cl = {40 + static_cast<int32_t>(rng() % 100), 7};
  std::vector<int32_t> tab(2 * 16);
  for (int i = 0; i < 32; ++i) tab[i] = i;
  std::shuffle(tab.begin(), tab.end(), rng);
  // Chains (each token sees all earlier ones) and branching trees (token j's parent (j-1)/2).
  auto masks = [&](bool branching) {
    std::vector<uint8_t> bits(2 * ((q * q + 7) / 8), 0);
    for (int s = 0; s < 2; ++s)
      for (int r = 0; r < q; ++r)
        for (int a = r; a >= 0; a = branching ? (a == 0 ? -1 : (a - 1) / 2) : a - 1) {
          const int b = s * ((q * q + 7) / 8) * 8 + r * q + a;
          bits[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
        }
    return bits;
  };
  const std::vector<uint8_t> chain = masks(false), tree = masks(true);
  const std::vector<int64_t> ip = {0, (q * q + 7) / 8, 2 * ((q * q + 7) / 8)};
  pagedattn_batch_desc desc;
  ASSERT_EQ(pagedattn_batch_desc_init_sized(&desc, sizeof desc), PAGEDATTN_OK);
  desc.num_seqs = 2;
  desc.query_lens = ql.data();
  desc.context_lens = cl.data();
  desc.block_tables = tab.data();
  desc.block_table_stride = 16;
  desc.tree_mask = chain.data();
  desc.tree_mask_indptr = ip.data();
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &desc), PAGEDATTN_OK)
      << pagedattn_last_error();
  pat::Tensor tq(dev, dt, T, H, D), tk(dev, dt, T, Hkv, D), tv(dev, dt, T, Hkv, D);
  pat::Tensor o_replay(dev, dt, T, H, D), o_eager(dev, dt, T, H, D), o_chain(dev, dt, T, H, D);
  for (pat::Tensor* t : {&tq, &tk, &tv}) {
    for (int64_t r = 0; r < t->rows(); ++r)
      for (int64_t h = 0; h < t->heads(); ++h)
        for (int64_t d = 0; d < D; ++d) t->set(r, h, d, nd(rng));
    t->upload();
  }
  pagedattn_attention_options opts;
  pagedattn_attention_options_init(&opts);
  opts.num_heads = H;
  opts.num_kv_heads = Hkv;
  opts.head_size = D;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &opts, tq.t(), tk.t(), tv.t(), o_chain.t(),
                              nullptr, stream), PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const pagedattn_status fst = pagedattn_forward(be, batch, cache, 0, &opts, tq.t(), tk.t(),
                                                 tv.t(), o_replay.t(), nullptr, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(fst, PAGEDATTN_OK) << pagedattn_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  desc.tree_mask = tree.data();
  ASSERT_EQ(pagedattn_batch_update(batch, &desc), PAGEDATTN_OK) << pagedattn_last_error();
  o_replay.poison_all();
  o_replay.upload();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  // The same step without a graph, on a batch planned with the trees.
  pagedattn_batch* eager = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&eager, be, cache, nullptr, &desc), PAGEDATTN_OK)
      << pagedattn_last_error();
  ASSERT_EQ(pagedattn_forward(be, eager, cache, 0, &opts, tq.t(), tk.t(), tv.t(), o_eager.t(),
                              nullptr, stream), PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  o_replay.download();
  o_eager.download();
  o_chain.download();
  EXPECT_TRUE(o_replay.buf().host() == o_eager.buf().host())
      << "the replay after the update differs from a direct forward of the trees";
  EXPECT_FALSE(o_replay.buf().host() == o_chain.buf().host())
      << "the replay still used the captured step's chain masks";
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  pagedattn_batch_destroy(eager);
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
}

// ---- a mixed step (chunked prefill + decodes) in a CUDA graph ----

// One step of several sequences: query_len and context_len each, K/V of every position (the
// context goes into the cache by a cache write, the new tokens through the forward's write_kv),
// and the queries of the new tokens. Values are rounded to the model dtype.
struct StepWorld {
  int H = 8, Hkv = 2, D = 128, bs = 16, nb = 768, width = 64;
  pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  pagedattn_dtype cache_dt = PAGEDATTN_DTYPE_BFLOAT16;
  std::vector<int32_t> qlen, ctx, table;
  std::vector<std::vector<float>> k, v;  // per seq: [(ctx+qlen)][Hkv][D]
  std::vector<std::vector<float>> q;     // per seq: [qlen][H][D]
  int64_t tokens() const { return std::accumulate(qlen.begin(), qlen.end(), int64_t{0}); }
};

void fill_step(StepWorld& w, std::mt19937_64& rng, const std::vector<SeqSpec>& seqs) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<int32_t> pool(w.nb);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  const size_t n = seqs.size();
  w.qlen.assign(n, 0);
  w.ctx.assign(n, 0);
  w.table.assign(n * w.width, 0);
  w.k.assign(n, {});
  w.v.assign(n, {});
  w.q.assign(n, {});
  size_t next = 0;
  for (size_t s = 0; s < n; ++s) {
    w.qlen[s] = seqs[s].qlen;
    w.ctx[s] = seqs[s].ctx;
    const int len = w.ctx[s] + w.qlen[s];
    const int need = (len + w.bs - 1) / w.bs;
    ASSERT_LE(need, w.width);
    for (int b = 0; b < need; ++b) w.table[s * w.width + b] = pool[next++];
    const size_t kn = static_cast<size_t>(len) * w.Hkv * w.D;
    w.k[s].resize(kn);
    w.v[s].resize(kn);
    for (size_t i = 0; i < kn; ++i) {
      w.k[s][i] = pat::round_to(w.dt, u(rng));
      w.v[s][i] = pat::round_to(w.dt, u(rng));
    }
    w.q[s].resize(static_cast<size_t>(w.qlen[s]) * w.H * w.D);
    for (auto& x : w.q[s]) x = pat::round_to(w.dt, u(rng));
  }
}

// Loads the step's queries and new-token K/V into device tensors of capacity rows (rows past
// the step's tokens stay poisoned).
void load_mixed_step(const StepWorld& w, pat::Tensor& q, pat::Tensor& k, pat::Tensor& v) {
  q.poison_all();
  k.poison_all();
  v.poison_all();
  int64_t row = 0;
  for (size_t s = 0; s < w.qlen.size(); ++s)
    for (int j = 0; j < w.qlen[s]; ++j, ++row) {
      for (int h = 0; h < w.H; ++h)
        for (int d = 0; d < w.D; ++d) q.set(row, h, d, w.q[s][(static_cast<size_t>(j) * w.H + h) * w.D + d]);
      const size_t off = static_cast<size_t>(w.ctx[s] + j) * w.Hkv * w.D;
      for (int h = 0; h < w.Hkv; ++h)
        for (int d = 0; d < w.D; ++d) {
          k.set(row, h, d, w.k[s][off + h * w.D + d]);
          v.set(row, h, d, w.v[s][off + h * w.D + d]);
        }
    }
  q.upload();
  k.upload();
  v.upload();
}

// Checks out and lse of every token against the float64 reference (K/V rounded through the
// cache dtype as the cache holds them) and that rows past the step's tokens were not written.
// The float64 reference of sequence s of a step over kc/vc, its K/V as the cache holds them:
// o [qlen][H][D] and l [qlen][H].
void ref_step_seq(const StepWorld& w, size_t s, const std::vector<float>& kc,
                  const std::vector<float>& vc, std::vector<double>* o, std::vector<double>* l) {
  pat::RefParams rp;
  rp.H = w.H;
  rp.Hkv = w.Hkv;
  rp.D = w.D;
  rp.scale = 1.0 / std::sqrt(static_cast<double>(w.D));
  const int nq = w.qlen[s];
  std::vector<int64_t> qpos(nq);
  std::iota(qpos.begin(), qpos.end(), static_cast<int64_t>(w.ctx[s]));
  o->assign(static_cast<size_t>(nq) * w.H * w.D, 0.0);
  l->assign(static_cast<size_t>(nq) * w.H, 0.0);
  pat::ref_attend(rp, nq, w.q[s].data(), qpos.data(), w.ctx[s] + nq, kc.data(), vc.data(),
                  o->data(), l->data());
}

::testing::AssertionResult check_mixed(const StepWorld& w, pat::Tensor& out, pat::Tensor& lse,
                                       int64_t cap) {
  out.download();
  lse.download();
  std::vector<double> ref, ref_lse;
  std::vector<float> got, got_lse;
  int64_t row = 0;
  for (size_t s = 0; s < w.qlen.size(); ++s) {
    const int nq = w.qlen[s];
    if (nq == 0) continue;
    std::vector<float> kc = w.k[s], vc = w.v[s];
    if (pat::is_fp8(w.cache_dt)) {
      for (auto& x : kc) x = pat::round_to(w.cache_dt, x);
      for (auto& x : vc) x = pat::round_to(w.cache_dt, x);
    }
    std::vector<double> o, l;
    ref_step_seq(w, s, kc, vc, &o, &l);
    ref.insert(ref.end(), o.begin(), o.end());
    ref_lse.insert(ref_lse.end(), l.begin(), l.end());
    for (int j = 0; j < nq; ++j, ++row)
      for (int h = 0; h < w.H; ++h) {
        for (int d = 0; d < w.D; ++d) got.push_back(out.get(row, h, d));
        got_lse.push_back(lse.get(row, h, 0));
      }
  }
  const double tol = pat::tolerance(w.dt, w.cache_dt);
  auto r = pat::check_close("out", ref, got, tol);
  if (!r) return r;
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got_lse[i]) - ref_lse[i]) /
                     std::max(1.0, std::fabs(ref_lse[i]));
    if (std::isnan(got_lse[i]) || !(e <= 10 * tol)) {
      return ::testing::AssertionFailure() << "lse[" << i / w.H << "][" << i % w.H << "] = "
                                           << got_lse[i] << ", reference " << ref_lse[i];
    }
  }
  for (int64_t r2 = row; r2 < cap; ++r2)
    for (int h = 0; h < w.H; ++h) {
      if (!std::isnan(lse.get(r2, h, 0)))
        return ::testing::AssertionFailure() << "lse row " << r2 << " past the step was written";
      for (int d = 0; d < w.D; ++d)
        if (!std::isnan(out.get(r2, h, d)))
          return ::testing::AssertionFailure() << "out row " << r2 << " past the step was written";
    }
  return ::testing::AssertionSuccess();
}

pagedattn_batch_desc mixed_desc(StepWorld& w) {
  pagedattn_batch_desc desc;
  pagedattn_batch_desc_init(&desc);
  desc.num_seqs = static_cast<int32_t>(w.qlen.size());
  desc.query_lens = w.qlen.data();
  desc.context_lens = w.ctx.data();
  desc.block_tables = w.table.data();
  desc.block_table_stride = w.width;
  return desc;
}

// Captures a mixed step (one chunked-prefill chunk among decodes, write_kv on, LSE out) in a
// CUDA graph on a non-blocking stream, then replays it after pagedattn_batch_update with another
// mix (other lengths, tables, chunk position, more sequences and an idle entry) within the
// planned capacity. Each replay is checked against the float64 reference, and the last against
// an uncaptured forward of the same step. The capacity (10 sequences, 1024 keys) makes the plan
// split long decodes, so the split-KV merge is inside the graph too.
TEST_F(Gpu, GraphCaptureMixedStepReplayAfterUpdate) {
  if (!(caps.features & PAGEDATTN_FEATURE_GRAPH_CAPTURE)) GTEST_SKIP() << "no graph capture";
  if (!(caps.features & PAGEDATTN_FEATURE_CHUNKED_PREFILL)) GTEST_SKIP() << "no chunked prefill";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master ^ 0xc0ffee);
  auto draw = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  const struct { pagedattn_dtype dt, cache_dt; } variants[] = {
      {PAGEDATTN_DTYPE_FLOAT16, PAGEDATTN_DTYPE_FLOAT16},
      {PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_BFLOAT16},
      {PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FP8_E4M3}};
  const int cap_seqs = 10;
  const int64_t cap_tokens = 160;
  for (const auto& var : variants) {
    SCOPED_TRACE(std::string("dtype ") + pat::dtype_str(var.dt) + ", cache " +
                 pat::dtype_str(var.cache_dt));
    StepWorld w;
    w.dt = var.dt;
    w.cache_dt = var.cache_dt;
    pagedattn_kv_cache* cache = make_cache(be, 1, w.nb, w.bs, w.Hkv, w.D, w.cache_dt,
                                           PAGEDATTN_LAYOUT_NHD, 0);
    ASSERT_NE(cache, nullptr);
    pat::Tensor q(dev, w.dt, cap_tokens, w.H, w.D), k(dev, w.dt, cap_tokens, w.Hkv, w.D),
        v(dev, w.dt, cap_tokens, w.Hkv, w.D), out(dev, w.dt, cap_tokens, w.H, w.D),
        out2(dev, w.dt, cap_tokens, w.H, w.D);
    auto lse = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, cap_tokens, w.H);
    auto lse2 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, cap_tokens, w.H);
    // Descriptors of the step's rows over the capacity-sized buffers.
    auto rows = [](pat::Tensor& t, int64_t n) {
      t.shape[0] = n;
      pagedattn_tensor x = *t.t();
      x.shape = t.shape.data();
      return x;
    };

    // Step 1: decode, decode, chunk (context > 0), decode, decode (one a first token).
    std::vector<SeqSpec> s1(5);
    for (auto& s : s1) { s.qlen = 1; s.ctx = draw(1, 600); }
    s1[2].qlen = draw(40, 90);
    s1[2].ctx = draw(30, 300);
    s1[4].ctx = 0;
    fill_step(w, rng, s1);
    write_context(w, cache, dev);
    load_mixed_step(w, q, k, v);
    pagedattn_batch_desc desc = mixed_desc(w);
    desc.max_num_seqs = cap_seqs;
    desc.max_num_tokens = cap_tokens;
    desc.max_blocks_per_seq = w.width;
    desc.max_seq_len = static_cast<int64_t>(w.width) * w.bs;
    pagedattn_batch* batch = nullptr;
    ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &desc), PAGEDATTN_OK)
        << pagedattn_last_error();
    pagedattn_attention_options opts;
    pagedattn_attention_options_init(&opts);
    opts.num_heads = w.H;
    opts.num_kv_heads = w.Hkv;
    opts.head_size = w.D;
    opts.write_kv = 1;

    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int64_t t1 = w.tokens();
    pagedattn_tensor tq = rows(q, t1), tk = rows(k, t1), tv = rows(v, t1), to = rows(out, t1),
                     tl = rows(*lse, t1);
    // Warm-up outside the capture (kernel attributes are set on a device's first use); it also
    // writes the step's K/V, which the replay writes again with the same values.
    ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &opts, &tq, &tk, &tv, &to, &tl, stream),
              PAGEDATTN_OK) << pagedattn_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));

    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const pagedattn_status fst =
        pagedattn_forward(be, batch, cache, 0, &opts, &tq, &tk, &tv, &to, &tl, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(fst, PAGEDATTN_OK) << pagedattn_last_error();
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    out.poison_all();
    out.upload();
    lse->poison_all();
    lse->upload();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(check_mixed(w, out, *lse, cap_tokens)) << "first replay";

    // Step 2, planned in place: 7 entries (a longer chunk first, decodes, an idle entry).
    // The stream is idle here (synchronized above): batch_update copies on the legacy stream,
    // which does not wait for a non-blocking stream (kernels/gpu/NOTES.md).
    std::vector<SeqSpec> s2(7);
    for (auto& s : s2) { s.qlen = 1; s.ctx = draw(0, 900); }
    s2[0].qlen = draw(60, 120);
    s2[0].ctx = draw(100, 500);
    s2[5].qlen = 0;
    s2[5].ctx = 0;
    StepWorld w2 = w;
    fill_step(w2, rng, s2);
    write_context(w2, cache, dev);
    load_mixed_step(w2, q, k, v);
    pagedattn_batch_desc desc2 = mixed_desc(w2);
    ASSERT_LE(w2.tokens(), cap_tokens);
    ASSERT_EQ(pagedattn_batch_update(batch, &desc2), PAGEDATTN_OK) << pagedattn_last_error();
    out.poison_all();
    out.upload();
    lse->poison_all();
    lse->upload();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(check_mixed(w2, out, *lse, cap_tokens)) << "replay after update";

    // The same step without a graph (write_kv stays on: it stores the same values again).
    const int64_t t2 = w2.tokens();
    pagedattn_tensor tq2 = rows(q, t2), tk2 = rows(k, t2), tv2 = rows(v, t2),
                     to2 = rows(out2, t2), tl2 = rows(*lse2, t2);
    ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &opts, &tq2, &tk2, &tv2, &to2, &tl2, stream),
              PAGEDATTN_OK) << pagedattn_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    out2.download();
    lse2->download();
    bool same = true;
    for (int64_t r = 0; r < t2 && same; ++r)
      for (int h = 0; h < w.H && same; ++h) {
        same = lse->get(r, h, 0) == lse2->get(r, h, 0);
        for (int d = 0; d < w.D && same; ++d) same = out.get(r, h, d) == out2.get(r, h, d);
      }
    EXPECT_TRUE(same) << "graph replay differs from a direct forward";

    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(stream));
    pagedattn_batch_destroy(batch);
    pagedattn_kv_cache_destroy(cache);
  }
}

// Element (id, layer, kv, slot, head, d) of a read_blocks buffer.
size_t packed_index(int layers, int bs, int hkv, int d, pagedattn_layout lay, size_t i, int l,
                    int kv, int slot, int h, int x) {
  const size_t blk = static_cast<size_t>(bs) * hkv * d;
  const size_t base = ((i * layers + l) * 2 + kv) * blk;
  return base + (lay == PAGEDATTN_LAYOUT_NHD ? (static_cast<size_t>(slot) * hkv + h) * d + x
                                             : (static_cast<size_t>(h) * bs + slot) * d + x);
}

TEST_F(Gpu, SwapDeviceHostRoundTrips) {
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  const int L = 2, nb = 64, bs = 16, hkv = 2, d = 64;
  const pagedattn_dtype dt = PAGEDATTN_DTYPE_FLOAT16;
  for (pagedattn_layout host_layout : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND}) {
    SCOPED_TRACE(host_layout == PAGEDATTN_LAYOUT_NHD ? "host NHD" : "host HND");
    pagedattn_kv_cache* dc = make_cache(be, L, nb, bs, hkv, d, dt, PAGEDATTN_LAYOUT_NHD, 0);
    pagedattn_kv_cache* hc = make_cache(be, L, 32, bs, hkv, d, dt, host_layout,
                                        PAGEDATTN_KV_CACHE_HOST);
    ASSERT_TRUE(dc && hc);
    uint64_t bpb = 0;
    pagedattn_kv_cache_desc desc;
    desc.struct_size = sizeof(desc);
    ASSERT_EQ(pagedattn_kv_cache_get_desc(&desc, dc), PAGEDATTN_OK);
    ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &desc), PAGEDATTN_OK);
    const size_t elems_pb = bpb / 2;
    // Fill every device block with random finite halves.
    std::vector<int32_t> all(nb);
    std::iota(all.begin(), all.end(), 0);
    std::vector<uint8_t> img(bpb * nb);
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    for (size_t i = 0; i < elems_pb * nb; ++i) pat::store(dt, img.data() + 2 * i, u(rng));
    ASSERT_EQ(pagedattn_kv_cache_load_blocks(dc, all.data(), nb, img.data(), img.size(), nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();

    // Out: runs (3,4,5 -> 0,1,2) and scattered ids.
    const int32_t out_pairs[] = {3, 0, 4, 1, 5, 2, 10, 7, 20, 31, 63, 8};
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    ASSERT_EQ(pagedattn_kv_cache_swap_blocks(hc, dc, out_pairs, 6, stream), PAGEDATTN_OK)
        << pagedattn_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    const int32_t host_ids[] = {0, 1, 2, 7, 31, 8};
    std::vector<uint8_t> hb(bpb * 6);
    ASSERT_EQ(pagedattn_kv_cache_read_blocks(hc, host_ids, 6, hb.data(), hb.size(), nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    int bad = 0;
    for (int p = 0; p < 6; ++p)
      for (int l = 0; l < L; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int s = 0; s < bs; ++s)
            for (int h = 0; h < hkv; ++h)
              for (int x = 0; x < d; ++x) {
                const size_t a = packed_index(L, bs, hkv, d, host_layout, p, l, kv, s, h, x);
                const size_t b = packed_index(L, bs, hkv, d, PAGEDATTN_LAYOUT_NHD,
                                              out_pairs[2 * p], l, kv, s, h, x);
                if (std::memcmp(hb.data() + 2 * a, img.data() + 2 * b, 2) != 0) ++bad;
              }
    EXPECT_EQ(bad, 0) << "device -> host swap";

    // Back in, to other device blocks (a run and a single); the rest must stay as loaded.
    const int32_t in_pairs[] = {0, 40, 1, 41, 7, 50};
    ASSERT_EQ(pagedattn_kv_cache_swap_blocks(dc, hc, in_pairs, 3, stream), PAGEDATTN_OK)
        << pagedattn_last_error();
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> after(img.size());
    ASSERT_EQ(pagedattn_kv_cache_read_blocks(dc, all.data(), nb, after.data(), after.size(), nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    std::vector<uint8_t> expect = img;
    const int srcs[] = {3, 4, 10};  // where the host blocks 0, 1, 7 came from
    const int dsts[] = {40, 41, 50};
    for (int j = 0; j < 3; ++j)
      std::memcpy(expect.data() + bpb * dsts[j], img.data() + bpb * srcs[j], bpb);
    EXPECT_TRUE(after == expect) << "host -> device swap (or untouched blocks changed)";
    CUDA_OK(cudaStreamDestroy(stream));
    pagedattn_kv_cache_destroy(hc);
    pagedattn_kv_cache_destroy(dc);
  }
}

// A slot mapping in device memory cannot be checked on the host: bad slots are skipped in the
// kernel and nothing outside the valid slots changes.
TEST_F(Gpu, DeviceSlotMappingSkipsBadSlots) {
  const int nb = 8, bs = 8, hkv = 2, d = 64;
  const pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  for (int bits : {64, 32}) {
    SCOPED_TRACE(bits == 64 ? "int64 slots" : "int32 slots");
    pagedattn_kv_cache* c = make_cache(be, 1, nb, bs, hkv, d, dt, PAGEDATTN_LAYOUT_HND, 0);
    ASSERT_NE(c, nullptr);
    const int64_t slots[] = {5, -1, 63, 64, -7, 10, 1000000};
    const int n = 7;
    pat::Tensor k(dev, dt, n, hkv, d), v(dev, dt, n, hkv, d);
    for (int r = 0; r < n; ++r)
      for (int h = 0; h < hkv; ++h)
        for (int x = 0; x < d; ++x) {
          k.set(r, h, x, static_cast<float>(r + 1));
          v.set(r, h, x, -static_cast<float>(r + 1));
        }
    k.upload();
    v.upload();
    void* ds = nullptr;
    CUDA_OK(cudaMalloc(&ds, sizeof(slots)));
    if (bits == 64) {
      CUDA_OK(cudaMemcpy(ds, slots, sizeof(slots), cudaMemcpyHostToDevice));
    } else {
      int32_t s32[n];
      for (int i = 0; i < n; ++i) s32[i] = static_cast<int32_t>(slots[i]);
      CUDA_OK(cudaMemcpy(ds, s32, sizeof(s32), cudaMemcpyHostToDevice));
    }
    int64_t shape = n;
    pagedattn_tensor st{};
    st.data = ds;
    st.device = dev;
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, static_cast<uint8_t>(bits), 1};
    st.shape = &shape;
    ASSERT_EQ(pagedattn_kv_cache_write(c, 0, k.t(), v.t(), &st, 1.f, 1.f, nullptr), PAGEDATTN_OK)
        << pagedattn_last_error();
    ASSERT_EQ(pagedattn_backend_synchronize(be, nullptr), PAGEDATTN_OK) << pagedattn_last_error();
    std::vector<int32_t> ids(nb);
    std::iota(ids.begin(), ids.end(), 0);
    const size_t blk = static_cast<size_t>(bs) * hkv * d;
    std::vector<uint8_t> buf(2 * blk * 2 * nb);
    ASSERT_EQ(pagedattn_kv_cache_read_blocks(c, ids.data(), nb, buf.data(), buf.size(), nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    int bad = 0;
    for (int b = 0; b < nb; ++b)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < hkv; ++h)
          for (int s = 0; s < bs; ++s)
            for (int x = 0; x < d; ++x) {
              const int slot = b * bs + s;
              float want = 0.f;
              if (slot == 5) want = 1.f;
              if (slot == 63) want = 3.f;
              if (slot == 10) want = 6.f;
              if (kv) want = -want;
              const size_t i = packed_index(1, bs, hkv, d, PAGEDATTN_LAYOUT_HND, b, 0, kv, s, h, x);
              if (pat::load(dt, buf.data() + 2 * i) != want) ++bad;
            }
    EXPECT_EQ(bad, 0);
    CUDA_OK(cudaFree(ds));
    pagedattn_kv_cache_destroy(c);
  }
}

// Per-KV-head fp8 scales in device memory cannot be checked on the host: a NaN, 0, negative or
// infinite one turns into NaN in the kernels. The caller's writes and the forward's write store
// NaN for that head's K or V, every row of its query heads gives NaN out and lse (decode, split
// decode, chunked prefill, prefill; scalar and tensor-core kernels), and the other heads are
// stored and attended as their own scales say.
TEST_F(Gpu, BadDeviceHeadScalesGiveNaNForTheirHeadOnly) {
  if (!(caps.features & PAGEDATTN_FEATURE_HEAD_SCALES)) GTEST_SKIP() << "no per-head scales";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master ^ 0x5ca1e5);
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  // KV heads: 0 and 5 good; 1 K NaN, 2 V zero, 3 K negative, 4 V +inf.
  const float ks[] = {0.5f, kNaN, 1.0f, -1.0f, 2.0f, 0.25f};
  const float vs[] = {2.0f, 1.0f, 0.0f, 0.5f, kInf, 4.0f};
  auto good = [](float x) { return x > 0.f && std::isfinite(x); };
  const struct { pagedattn_dtype dt, cache_dt; } variants[] = {
      {PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FP8_E4M3},
      {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FP8_E5M2},
      {PAGEDATTN_DTYPE_FLOAT16, PAGEDATTN_DTYPE_FP8_E5M2}};
  for (const auto& var : variants) {
    SCOPED_TRACE(std::string("dtype ") + pat::dtype_str(var.dt) + ", cache " +
                 pat::dtype_str(var.cache_dt));
    StepWorld w;
    w.H = 12;
    w.Hkv = 6;
    w.D = 64;
    w.nb = 128;
    w.width = 64;
    w.dt = var.dt;
    w.cache_dt = var.cache_dt;
    const int group = w.H / w.Hkv;
    // A decode long enough to be split, a short one, a chunk over a context, a first prefill.
    std::vector<SeqSpec> seqs(4);
    seqs[0] = {1, 700 + static_cast<int>(rng() % 100), 0};
    seqs[1] = {1, static_cast<int>(rng() % 40), 0};
    seqs[2] = {15 + static_cast<int>(rng() % 10), 20 + static_cast<int>(rng() % 30), 0};
    seqs[3] = {10 + static_cast<int>(rng() % 20), 0, 0};
    fill_step(w, rng, seqs);
    pagedattn_kv_cache* cache = make_cache(be, 1, w.nb, w.bs, w.Hkv, w.D, w.cache_dt,
                                           PAGEDATTN_LAYOUT_NHD, 0);
    ASSERT_NE(cache, nullptr);
    auto kst = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, w.Hkv);
    auto vst = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, w.Hkv);
    for (int h = 0; h < w.Hkv; ++h) {
      kst->set(h, 0, 0, ks[h]);
      vst->set(h, 0, 0, vs[h]);
    }
    kst->upload();
    vst->upload();
    write_context(w, cache, dev, kst->t(), vst->t());

    const int64_t T = w.tokens();
    pat::Tensor q(dev, w.dt, T, w.H, w.D), k(dev, w.dt, T, w.Hkv, w.D), v(dev, w.dt, T, w.Hkv, w.D),
        out(dev, w.dt, T, w.H, w.D);
    auto lse = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, w.H);
    load_mixed_step(w, q, k, v);
    pagedattn_batch_desc desc = mixed_desc(w);
    pagedattn_batch* batch = nullptr;
    ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &desc), PAGEDATTN_OK)
        << pagedattn_last_error();
    pagedattn_attention_options opts;
    ASSERT_EQ(pagedattn_attention_options_init_sized(&opts, sizeof opts), PAGEDATTN_OK);
    opts.num_heads = w.H;
    opts.num_kv_heads = w.Hkv;
    opts.head_size = w.D;
    opts.k_head_scales = kst->t();
    opts.v_head_scales = vst->t();
    out.poison_all();
    out.upload();
    lse->poison_all();
    lse->upload();
    ASSERT_EQ(pagedattn_forward(be, batch, cache, 0, &opts, q.t(), k.t(), v.t(), out.t(), lse->t(),
                                nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    ASSERT_EQ(pagedattn_backend_synchronize(be, nullptr), PAGEDATTN_OK) << pagedattn_last_error();
    out.download();
    lse->download();

    // Attention: NaN rows for the bad heads; the good ones against the float64 reference over K/V
    // as the cache holds them (fp8 of x / scale, times the scale).
    std::vector<double> ref, ref_lse;
    std::vector<float> got, got_lse;
    int not_nan = 0;
    int64_t row = 0;
    for (size_t s = 0; s < w.qlen.size(); ++s) {
      const int nq = w.qlen[s];
      std::vector<float> kc = w.k[s], vc = w.v[s];
      for (size_t i = 0; i < kc.size(); ++i) {
        const int h = static_cast<int>(i / w.D % w.Hkv);
        kc[i] = good(ks[h]) ? pat::round_to(w.cache_dt, kc[i] / ks[h]) * ks[h] : 0.f;
        vc[i] = good(vs[h]) ? pat::round_to(w.cache_dt, vc[i] / vs[h]) * vs[h] : 0.f;
      }
      std::vector<double> o, l;
      ref_step_seq(w, s, kc, vc, &o, &l);
      for (int j = 0; j < nq; ++j, ++row)
        for (int h = 0; h < w.H; ++h) {
          const int kvh = h / group;
          if (good(ks[kvh]) && good(vs[kvh])) {
            for (int d = 0; d < w.D; ++d) {
              ref.push_back(o[(static_cast<size_t>(j) * w.H + h) * w.D + d]);
              got.push_back(out.get(row, h, d));
            }
            ref_lse.push_back(l[static_cast<size_t>(j) * w.H + h]);
            got_lse.push_back(lse->get(row, h, 0));
          } else {
            for (int d = 0; d < w.D; ++d) not_nan += !std::isnan(out.get(row, h, d));
            not_nan += !std::isnan(lse->get(row, h, 0));
          }
        }
    }
    EXPECT_EQ(not_nan, 0) << "out or lse elements of bad heads' rows that are not NaN";
    const double tol = pat::tolerance(w.dt, w.cache_dt);
    EXPECT_TRUE(pat::check_close("out (good heads)", ref, got, tol));
    EXPECT_TRUE(pat::check_close("lse (good heads)", ref_lse, got_lse, tol));

    // The cache: every position of every sequence (context from the caller's writes, new tokens
    // from the forward's) holds fp8(x / scale), or NaN for a bad scale.
    std::vector<int32_t> ids(w.nb);
    std::iota(ids.begin(), ids.end(), 0);
    const size_t blk = static_cast<size_t>(w.bs) * w.Hkv * w.D;
    std::vector<uint8_t> buf(blk * 2 * w.nb);
    ASSERT_EQ(pagedattn_kv_cache_read_blocks(cache, ids.data(), w.nb, buf.data(), buf.size(),
                                             nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    int bad_k = 0, bad_v = 0;
    for (size_t s = 0; s < w.qlen.size(); ++s)
      for (int p = 0; p < w.ctx[s] + w.qlen[s]; ++p) {
        const int b = w.table[s * w.width + p / w.bs];
        for (int h = 0; h < w.Hkv; ++h)
          for (int d = 0; d < w.D; ++d) {
            const size_t src = (static_cast<size_t>(p) * w.Hkv + h) * w.D + d;
            for (int kv = 0; kv < 2; ++kv) {
              const float sc = kv ? vs[h] : ks[h];
              const float x = kv ? w.v[s][src] : w.k[s][src];
              const float stored = pat::load(
                  w.cache_dt, buf.data() + packed_index(1, w.bs, w.Hkv, w.D, PAGEDATTN_LAYOUT_NHD,
                                                        b, 0, kv, p % w.bs, h, d));
              const bool ok = good(sc) ? stored == pat::round_to(w.cache_dt, x / sc)
                                       : std::isnan(stored);
              if (!ok) ++(kv ? bad_v : bad_k);
            }
          }
      }
    EXPECT_EQ(bad_k, 0) << "K elements not fp8(x / scale), or not NaN for a bad scale";
    EXPECT_EQ(bad_v, 0) << "V elements not fp8(x / scale), or not NaN for a bad scale";
    pagedattn_batch_destroy(batch);
    pagedattn_kv_cache_destroy(cache);
  }
}

}  // namespace

// MLA under a captured graph: forward_mla over a latent cache (16 heads, 576/512, bf16) captured
// with 3 decodes, the batch updated in place to 5 sequences of other lengths and tables, the graph
// replayed: its output equals, bit for bit, an uncaptured forward_mla of the new step, and the
// float64 reference within the bf16 tolerance.
TEST_F(Gpu, GraphCaptureMlaReplayAfterUpdate) {
  if (!(caps.features & PAGEDATTN_FEATURE_GRAPH_CAPTURE)) GTEST_SKIP() << "no graph capture";
  if (!(caps.features & PAGEDATTN_FEATURE_MLA)) GTEST_SKIP() << "no MLA";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int H = 16, D = 576, R = 512, bs = 64, nb = 48, width = 8, cap = 8;
  const pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  pagedattn_kv_cache* cache =
      make_cache(be, 1, nb, bs, 1, D, dt, PAGEDATTN_LAYOUT_NHD, PAGEDATTN_KV_CACHE_LATENT);
  ASSERT_NE(cache, nullptr);
  // A step: per sequence a context length, a table of distinct blocks, every row written, and the
  // new token's query.
  struct Step {
    std::vector<int32_t> ctx, qlens, table;
    std::vector<std::vector<float>> rows;  // per seq: [(ctx+1)][D]
    std::vector<float> q;                  // [seqs][H][D]
  };
  std::vector<int32_t> ids(nb);
  std::iota(ids.begin(), ids.end(), 0);
  auto make_step = [&](int seqs) {
    Step s;
    std::shuffle(ids.begin(), ids.end(), rng);
    s.table.assign(static_cast<size_t>(cap) * width, 0);
    for (int i = 0; i < seqs; ++i) {
      s.ctx.push_back(static_cast<int32_t>(rng() % 300));
      s.qlens.push_back(1);
      for (int b = 0; b < width; ++b) s.table[static_cast<size_t>(i) * width + b] = ids[i * width + b];
      s.rows.emplace_back(static_cast<size_t>(s.ctx[i] + 1) * D);
      for (auto& x : s.rows.back()) x = pat::round_to(dt, nd(rng));
    }
    s.q.resize(static_cast<size_t>(seqs) * H * D);
    for (auto& x : s.q) x = pat::round_to(dt, nd(rng));
    return s;
  };
  auto write_rows = [&](const Step& s) {
    int64_t n = 0;
    for (const auto& r : s.rows) n += static_cast<int64_t>(r.size() / D);
    pat::Tensor kw(dev, dt, n, 1, D);
    std::vector<int64_t> slots;
    int64_t at = 0;
    for (size_t i = 0; i < s.rows.size(); ++i)
      for (int64_t p = 0; p <= s.ctx[i]; ++p, ++at) {
        for (int e = 0; e < D; ++e) kw.set(at, 0, e, s.rows[i][static_cast<size_t>(p) * D + e]);
        slots.push_back(static_cast<int64_t>(s.table[i * width + p / bs]) * bs + p % bs);
      }
    kw.upload();
    int64_t shape[1] = {n};
    pagedattn_tensor st{};
    st.data = slots.data();
    st.device = {PAGEDATTN_DEVICE_CPU, 0};
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
    st.shape = shape;
    ASSERT_EQ(pagedattn_kv_cache_write_latent(cache, 0, kw.t(), nullptr, &st, 1.f, nullptr),
              PAGEDATTN_OK) << pagedattn_last_error();
    CUDA_OK(cudaDeviceSynchronize());
  };
  pat::Tensor q(dev, dt, cap, H, D), out(dev, dt, cap, H, R), out2(dev, dt, cap, H, R);
  auto load_q = [&](const Step& s) {
    q.poison_all();
    for (size_t i = 0; i < s.ctx.size(); ++i)
      for (int h = 0; h < H; ++h)
        for (int e = 0; e < D; ++e)
          q.set(static_cast<int64_t>(i), h, e, s.q[(i * H + h) * D + e]);
    q.upload();
  };
  auto desc_of = [&](Step& s) {
    pagedattn_batch_desc d;
    pagedattn_batch_desc_init(&d);
    d.num_seqs = static_cast<int32_t>(s.ctx.size());
    d.query_lens = s.qlens.data();
    d.context_lens = s.ctx.data();
    d.block_tables = s.table.data();
    d.block_table_stride = width;
    return d;
  };
  auto rows_of = [](pat::Tensor& t, int64_t n) {
    pagedattn_tensor x = *t.t();
    t.shape[0] = n;
    x.shape = t.shape.data();
    return x;
  };
  Step s1 = make_step(3);
  write_rows(s1);
  load_q(s1);
  pagedattn_batch_desc d1 = desc_of(s1);
  d1.max_num_seqs = cap;
  d1.max_num_tokens = cap;
  d1.max_blocks_per_seq = width;
  d1.max_seq_len = width * bs;
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &d1), PAGEDATTN_OK)
      << pagedattn_last_error();
  pagedattn_attention_options o;
  pagedattn_attention_options_init_sized(&o, sizeof o);
  o.num_heads = H;
  o.num_kv_heads = 1;
  o.head_size = D;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pagedattn_tensor tq = rows_of(q, 3), to = rows_of(out, 3);
  ASSERT_EQ(pagedattn_forward_mla(be, batch, cache, 0, &o, &tq, nullptr, &to, nullptr, stream),
            PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const pagedattn_status fst =
      pagedattn_forward_mla(be, batch, cache, 0, &o, &tq, nullptr, &to, nullptr, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(fst, PAGEDATTN_OK) << pagedattn_last_error();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  Step s2 = make_step(5);
  write_rows(s2);
  load_q(s2);
  pagedattn_batch_desc d2 = desc_of(s2);
  ASSERT_EQ(pagedattn_batch_update(batch, &d2), PAGEDATTN_OK) << pagedattn_last_error();
  out.poison_all();
  out.upload();
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  out.download();
  pagedattn_tensor tq5 = rows_of(q, 5), to5 = rows_of(out2, 5);
  out2.poison_all();
  out2.upload();
  ASSERT_EQ(pagedattn_forward_mla(be, batch, cache, 0, &o, &tq5, nullptr, &to5, nullptr, stream),
            PAGEDATTN_OK) << pagedattn_last_error();
  CUDA_OK(cudaStreamSynchronize(stream));
  out2.download();
  std::vector<double> ref;
  std::vector<float> got;
  bool same = true;
  pat::RefParams rp;
  rp.H = H;
  rp.Hkv = 1;
  rp.D = D;
  rp.scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int i = 0; i < 5; ++i) {
    std::vector<double> o64(static_cast<size_t>(H) * D), l64(H);
    const int64_t qpos = s2.ctx[i];
    const float* kr = s2.rows[i].data();
    pat::ref_attend(rp, 1, s2.q.data() + static_cast<size_t>(i) * H * D, &qpos, s2.ctx[i] + 1,
                    kr, kr, o64.data(), l64.data());
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < R; ++e) {
        ref.push_back(o64[static_cast<size_t>(h) * D + e]);
        got.push_back(out.get(i, h, e));
        same = same && out.get(i, h, e) == out2.get(i, h, e);
      }
  }
  EXPECT_TRUE(pat::check_close("replayed out", ref, got, pat::tolerance(dt, dt)));
  EXPECT_TRUE(same) << "graph replay differs from a direct forward_mla";
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
}
