// Attention against the float64 reference (docs/semantics.md section 7). Every test draws fresh
// random cases (PAGEDATTN_TEST_SEED reproduces a run); tests named Fast* are the subset run once
// per SIMD target.
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <thread>

#include "pagedattn_test_support.h"

namespace {

using pat::AttnCase;
using pat::SeqSpec;

const pagedattn_dtype kModel[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                  PAGEDATTN_DTYPE_BFLOAT16};
const int kHeadSizes[] = {64, 80, 96, 112, 128, 256, 8, 40, 72, 200, 32, 120, 160, 192, 224, 16};
const int kBlockSizes[] = {16, 8, 32, 1, 256, 2, 4, 64, 128};
const std::pair<int, int> kHeads[] = {{4, 4}, {8, 1}, {8, 2}, {6, 2}, {16, 2}, {5, 5}, {8, 4}, {12, 2},
                                      {12, 4}, {10, 2}, {7, 1}, {3, 3}};

template <class T, size_t N>
const T& pick(const T (&a)[N], std::mt19937_64& rng) {
  return a[rng() % N];
}

class Attention : public pat::BackendTest {
 protected:
  // PAGEDATTN_TEST_VERBOSE=1 prints every case's error against the reference.
  const bool verbose_ = getenv("PAGEDATTN_TEST_VERBOSE") != nullptr;
  // Runs `count` cases drawn by gen from a master seed; reports each failing case with its seed.
  void run(int count, const std::function<AttnCase(std::mt19937_64&, int)>& gen) {
    const uint64_t master = pat::test_seed();
    SCOPED_TRACE(pat::seed_note(master));
    std::mt19937_64 rng(master);
    int failures = 0;
    for (int i = 0; i < count && failures < 5; ++i) {
      AttnCase c = gen(rng, i);
      if (!supported(c)) continue;
      const uint64_t seed = rng();
      if (!pat::case_sampled(master, static_cast<size_t>(i), static_cast<size_t>(count))) continue;
      pat::CaseResult res;
      auto r = pat::run_attention_case(be, c, seed, &res);
      if (verbose_)
        printf("  case %2d err %.2e lse %.2e  %s\n", i, res.err, res.lse_err, c.describe().c_str());
      if (!r) ++failures;
      EXPECT_TRUE(r) << "case " << i << ": " << c.describe() << " (case seed " << seed << ")";
    }
  }
  // Skips combinations a (GPU) backend declares it lacks; on CPU everything is required.
  bool supported(const AttnCase& c) const {
    if (caps.device.device_type == PAGEDATTN_DEVICE_CPU) return true;
    const unsigned bslog = __builtin_ctz(static_cast<unsigned>(c.block_size));
    if (!(caps.block_sizes & (1u << bslog))) return false;
    if (!(caps.head_sizes & (1u << (c.D / 8 - 1)))) return false;
    return true;
  }
  AttnCase base(std::mt19937_64& rng) const {
    AttnCase c;
    c.dtype = pick(kModel, rng);
    const auto hh = pick(kHeads, rng);
    c.H = hh.first;
    c.Hkv = hh.second;
    c.D = pick(kHeadSizes, rng);
    c.block_size = pick(kBlockSizes, rng);
    c.layout = rng() % 2 ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    c.lse = rng() % 2;
    return c;
  }
  // Keeps a case cheap enough for 2 cores: small block sizes with long sequences are fine, but
  // very wide heads with long prefills are not.
  static void limit_cost(AttnCase& c, int64_t budget) {
    for (int guard = 0; guard < 40; ++guard) {
      int64_t cost = 0;
      for (auto& s : c.seqs) cost += static_cast<int64_t>(s.qlen) * (s.ctx + s.qlen + s.enc);
      cost *= static_cast<int64_t>(c.H) * c.D;
      if (cost <= budget) return;
      for (auto& s : c.seqs) {
        s.qlen = std::max(s.qlen > 0 ? 1 : 0, s.qlen / 2);
        s.ctx /= 2;
        s.enc = std::max(s.enc > 0 ? 1 : 0, s.enc / 2);
      }
    }
  }
};

}  // namespace

// ---- the fast subset (also run per SIMD target) ----

TEST_F(Attention, FastDecode) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.D = kHeadSizes[i % 16];
    c.seqs = pat::random_decode_seqs(rng, 1 + static_cast<int>(rng() % 6), 200);
    return c;
  });
}

TEST_F(Attention, FastPrefillAndMixed) {
  run(20, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.seqs = i % 2 ? pat::random_prefill_seqs(rng, 1 + static_cast<int>(rng() % 4), 40)
                   : pat::random_mixed_seqs(rng, 2 + static_cast<int>(rng() % 6), 24, 80, true);
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, FastFeatures) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 5), 20, 60, false);
    switch (i % 8) {
      case 0: c.alibi = true; break;
      case 1: c.soft_cap = 5.0f + static_cast<float>(rng() % 30); break;
      case 2: c.window = 1 + static_cast<int>(rng() % 40); break;
      case 3: c.cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3; c.k_scale = 0.25f; c.v_scale = 2.0f; break;
      case 4: c.cache_dtype = PAGEDATTN_DTYPE_FP8_E5M2; c.k_scale = 3.0f; c.v_scale = 0.5f; break;
      case 5: c.type = PAGEDATTN_ATTENTION_ENCODER; for (auto& s : c.seqs) { s.ctx = 0; s.qlen = std::max(1, s.qlen); } break;
      case 6: c.type = PAGEDATTN_ATTENTION_CROSS; for (auto& s : c.seqs) s.enc = 1 + static_cast<int>(rng() % 50); break;
      default: c.strided_io = true; c.wrap_cache = true; break;
    }
    limit_cost(c, 30'000'000);
    return c;
  });
}

// The 2026 variants (docs/semantics.md 5.14-5.16): sinks, attention chunks, per-head fp8 scales,
// each alone and over decode, prefill and chunked-prefill rows.
TEST_F(Attention, FastSinksChunksHeadScales) {
  if (!(caps.features & PAGEDATTN_FEATURE_SINKS) ||
      !(caps.features & PAGEDATTN_FEATURE_CHUNKED_LOCAL) ||
      !(caps.features & PAGEDATTN_FEATURE_HEAD_SCALES))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks sinks, chunks or per-head scales";
  run(18, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 5), 24, 90, i % 4 == 0);
    switch (i % 3) {
      case 0: c.sinks = true; break;
      case 1: c.chunk = 1 + static_cast<int>(rng() % 40); break;
      default:
        c.cache_dtype = i % 2 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
        c.head_scales = true;
        c.k_scale = 8.0f;  // the scalars must be ignored
        c.v_scale = 0.0625f;
        break;
    }
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, FastNonFiniteInputsPropagate) {
  // docs/semantics.md section 5: a NaN or infinity in q, k or v that a row reads gives what
  // float64 gives (a NaN score: NaN output and log-sum-exp; an infinite V: an infinite or NaN
  // column), never a row that sees no key, and rows that do not read it stay exact. One kind of
  // poke per sequence, on a context token or one of the step's own, in decode, prefill and
  // mixed batches, with and without soft cap, window, ALiBi and fp8 caches.
  const float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  run(18, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    const auto hh = (i / 3) % 2 ? std::make_pair(8, 2) : std::make_pair(4, 4);
    c.H = hh.first;
    c.Hkv = hh.second;
    c.D = i % 4 < 2 ? 64 : 128;
    c.lse = true;
    const int kind = (i / 2) % 3;  // decode, prefill, mixed
    c.seqs.resize(7);
    for (auto& sq : c.seqs) {
      if (kind == 0) sq = {1, rng() % 3 ? 1 + static_cast<int>(rng() % (i % 5 == 0 ? 400 : 120)) : 0, 0};
      if (kind == 1) sq = {2 + static_cast<int>(rng() % 30), 0, 0};
      if (kind == 2) sq = {1 + static_cast<int>(rng() % 20), static_cast<int>(rng() % 60), 0};
    }
    switch (i % 6) {
      case 1: c.soft_cap = 10.0f; break;
      case 2: c.window = 8 + static_cast<int>(rng() % 40); break;
      case 3: c.alibi = true; break;
      case 4: c.cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3; c.k_scale = 0.5f; c.v_scale = 2.0f; break;
      default: break;
    }
    const struct { char what; float value; } kinds[] = {
        {'q', kNaN}, {'k', kNaN}, {'k', kInf}, {'k', -kInf}, {'v', kNaN}, {'v', kInf}};
    int order[7] = {0, 1, 2, 3, 4, 5, 6};
    std::shuffle(order, order + 7, rng);
    for (int j = 0; j < 6; ++j) {  // one sequence stays finite
      const int sidx = order[j];
      const SeqSpec& sq = c.seqs[sidx];
      pat::Poke pk;
      pk.what = kinds[j].what;
      pk.value = kinds[j].value;
      pk.seq = sidx;
      const int64_t n = pk.what == 'q' ? sq.qlen : sq.ctx + sq.qlen;
      pk.pos = static_cast<int64_t>(rng() % n);
      if (pk.what == 'v') {
        // A V every row of the sequence sees: one a row does not see may still reach it times a
        // zero weight (docs/semantics.md section 5).
        const int64_t lo = c.window ? std::max<int64_t>(0, sq.ctx + sq.qlen - c.window) : 0;
        if (lo > sq.ctx)
          pk.what = 'k';
        else
          pk.pos = lo + static_cast<int64_t>(rng() % (sq.ctx - lo + 1));
      }
      pk.h = static_cast<int>(rng() % (pk.what == 'q' ? c.H : c.Hkv));
      pk.d = static_cast<int>(rng() % c.D);
      c.pokes.push_back(pk);
    }
    for (int sidx = 0; sidx < 7; ++sidx) {  // NaN K and V in stale slots past each sequence
      const SeqSpec& sq = c.seqs[sidx];
      if ((sq.ctx + sq.qlen) % c.block_size == 0) continue;
      for (char what : {'k', 'v'}) {
        pat::Poke pk;
        pk.what = what;
        pk.seq = sidx;
        pk.pos = sq.ctx + sq.qlen + static_cast<int64_t>(rng() % (c.block_size - (sq.ctx + sq.qlen) % c.block_size));
        pk.h = static_cast<int>(rng() % c.Hkv);
        pk.d = static_cast<int>(rng() % c.D);
        pk.value = kNaN;
        c.pokes.push_back(pk);
      }
    }
    return c;
  });
}

TEST_F(Attention, FastDecodeMultiHead) {
  // GQA decode on every SIMD target: one item takes several KV heads of a sequence (the bf16
  // dot products where the CPU has them and the dtypes fit, else the in-register loops over any
  // cache dtype) and reads whole slot rows (NHD) or whole blocks (HND, all heads in one item).
  // Group sizes 1-8 and 12, 2-8 KV heads, every cache dtype, head sizes of whole and partial
  // vectors (the latter run one head at a time), masks, ALiBi, soft cap, window, and few long
  // sequences, whose items split the keys (several heads' partial states merged).
  const int groups[] = {1, 2, 3, 4, 5, 6, 7, 8, 12};
  const int head_sizes[] = {64, 128, 32, 80, 256, 40, 16};
  const int block_sizes[] = {16, 8, 32, 1, 64};
  run(30, [&](std::mt19937_64& rng, int i) {
    AttnCase c;
    c.dtype = kModel[(i / 5) % 3];
    if (i % 5 == 3) c.cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3;
    if (i % 5 == 4) c.cache_dtype = PAGEDATTN_DTYPE_FP8_E5M2;
    if (i % 5 >= 3) {
      c.k_scale = 0.5f + static_cast<float>(rng() % 4);
      c.v_scale = 0.25f * static_cast<float>(1 + rng() % 8);
    }
    c.Hkv = 2 + i % 7;
    c.H = c.Hkv * groups[i % 9];
    c.D = head_sizes[i % 7];
    c.block_size = block_sizes[i % 5];
    c.layout = i % 2 ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    c.lse = i % 4 < 2;
    c.wrap_cache = i % 7 == 3;
    switch (i % 6) {
      case 1: c.alibi = true; break;
      case 3: c.soft_cap = 5.0f + static_cast<float>(rng() % 30); break;
      case 5: c.window = 1 + static_cast<int>(rng() % 300); break;
      default: break;
    }
    if (i % 3 == 0) {
      c.seqs.resize(1 + rng() % 2);
      for (auto& s : c.seqs) {
        s.qlen = 1;
        s.ctx = 520 + static_cast<int>(rng() % 700);
      }
    } else {
      c.seqs = pat::random_decode_seqs(rng, 1 + static_cast<int>(rng() % 6), 300);
    }
    limit_cost(c, 20'000'000);
    return c;
  });
}

// ---- grids ----

TEST_F(Attention, DecodeGrid) {
  run(60, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.D = kHeadSizes[i % 16];
    c.block_size = kBlockSizes[i % 9];
    const auto hh = kHeads[i % 12];
    c.H = hh.first;
    c.Hkv = hh.second;
    if (i % 4 == 3) c.cache_dtype = i % 8 == 3 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
    c.k_scale = 0.5f + static_cast<float>(rng() % 4);
    c.v_scale = 0.25f * static_cast<float>(1 + rng() % 8);
    c.seqs = pat::random_decode_seqs(rng, 1 + static_cast<int>(rng() % 8), 700);
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, DecodeEveryGqaGroupSize) {
  // bf16 queries over bf16 or fp8 caches (every 6th case an f16 model and cache): one decode
  // item takes several KV heads of a sequence, each with its group of query heads scored 4, 2
  // and 1 rows at a time (bf16 dot products where the CPU has them; f16 in registers). Group sizes 1..9, 12 and 16; 2, 3 and 8 KV heads (8 x 9 rows are more than
  // one item takes, so those items split the heads unevenly); both layouts; head sizes that end
  // inside a chunk of the dot products (read masked), some over a wrapped cache whose stride
  // padding is NaN.
  const int groups[] = {3, 5, 6, 7, 9, 1, 2, 4, 8, 12, 16, 3, 5, 7};
  const int head_sizes[] = {64, 128, 96, 80, 112, 40, 8, 200, 72, 256, 120};
  run(44, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = PAGEDATTN_DTYPE_BFLOAT16;
    c.Hkv = i % 3 == 0 ? 2 : (i % 3 == 1 ? 3 : 8);
    c.H = c.Hkv * groups[i % 14];
    c.D = head_sizes[i % 11];
    c.layout = (i / 14) % 2 ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    c.wrap_cache = i % 5 == 2;
    if (i % 6 == 4) c.dtype = PAGEDATTN_DTYPE_FLOAT16;
    if (i % 4 == 1) {
      c.cache_dtype = i % 8 == 1 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
      c.k_scale = 0.5f + static_cast<float>(rng() % 4);
      c.v_scale = 0.25f * static_cast<float>(1 + rng() % 8);
    }
    c.seqs = pat::random_decode_seqs(rng, 1 + static_cast<int>(rng() % 6), 500);
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, PrefillGrid) {
  run(40, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.D = kHeadSizes[(i * 7) % 16];
    c.block_size = kBlockSizes[i % 9];
    c.seqs = pat::random_prefill_seqs(rng, 1 + static_cast<int>(rng() % 5), 150);
    limit_cost(c, 60'000'000);
    return c;
  });
}

TEST_F(Attention, ChunkedPrefill) {
  // Query and context lengths drawn from 16..1024 (docs/semantics.md section 7), windows 16..2048.
  run(8, [&](std::mt19937_64& rng, int i) {
    AttnCase c;
    c.dtype = kModel[i % 3];
    c.H = 4;
    c.Hkv = i % 2 ? 1 : 2;
    c.D = i % 4 < 2 ? 64 : 128;
    c.block_size = i % 3 == 0 ? 16 : (i % 3 == 1 ? 32 : 8);
    c.layout = i % 2 ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    c.seqs = pat::random_chunked_seqs(rng, 1 + static_cast<int>(rng() % 2), 16, 1024);
    if (i % 2) c.window = 16 + static_cast<int>(rng() % (2048 - 16 + 1));
    c.lse = true;
    limit_cost(c, 400'000'000);
    return c;
  });
}

TEST_F(Attention, MixedBatchesShuffledWithIdleEntries) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.seqs = pat::random_mixed_seqs(rng, 3 + static_cast<int>(rng() % 10), 70, 300, true);
    c.caller_slots = i % 3 == 0;
    limit_cost(c, 40'000'000);
    return c;
  });
}

TEST_F(Attention, LineageHeads40and64x8) {
  // The lineage's shapes: (H, Hkv) = (40, 40) and (64, 8), 7 sequences, head sizes 64..256,
  // block sizes 8/16/32, contexts up to ~4k for decode.
  run(6, [&](std::mt19937_64& rng, int i) {
    AttnCase c;
    c.dtype = kModel[i % 3];
    c.H = i % 2 ? 64 : 40;
    c.Hkv = i % 2 ? 8 : 40;
    const int ds[] = {64, 128, 256, 80, 96, 112};
    c.D = ds[i % 6];
    c.block_size = 8 << (i % 3);
    c.alibi = i == 1;
    c.cache_dtype = i == 4 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_INVALID;
    c.k_scale = 1.5f;
    c.v_scale = 0.75f;
    c.layout = i % 2 ? PAGEDATTN_LAYOUT_NHD : PAGEDATTN_LAYOUT_HND;
    c.seqs = pat::random_decode_seqs(rng, 7, c.H == 64 ? 4000 : 1200);
    limit_cost(c, 300'000'000);
    return c;
  });
}

TEST_F(Attention, AlibiSoftCapWindowScale) {
  run(30, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 50, 200, false);
    c.alibi = i % 2;
    if (i % 3 == 0) c.soft_cap = 1.0f + static_cast<float>(rng() % 50);
    if (i % 5 < 2) c.window = 1 + static_cast<int>(rng() % 120);
    if (i % 4 == 1) c.scale = 0.02f + 0.01f * static_cast<float>(rng() % 20);
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, SinksChunksHeadScalesWithEveryOption) {
  if (!(caps.features & PAGEDATTN_FEATURE_SINKS) ||
      !(caps.features & PAGEDATTN_FEATURE_CHUNKED_LOCAL) ||
      !(caps.features & PAGEDATTN_FEATURE_HEAD_SCALES))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks sinks, chunks or per-head scales";
  // Combined with each other and with window, soft cap, ALiBi, GQA, fp8, strided tensors and
  // long contexts that split the keys (the sink counts once however they are split).
  run(36, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    const int shape = i % 4;
    if (shape == 0)
      c.seqs = pat::random_decode_seqs(rng, 1 + static_cast<int>(rng() % 3), 3000);
    else if (shape == 1)
      c.seqs = pat::random_chunked_seqs(rng, 1 + static_cast<int>(rng() % 3), 16, 400);
    else
      c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 60, 600, true);
    c.sinks = rng() % 3 != 0;
    if (rng() % 2) c.chunk = 1 + static_cast<int>(rng() % 300);
    if (rng() % 2) {
      c.cache_dtype = rng() % 2 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
      c.head_scales = rng() % 3 != 0;
      c.k_scale = 0.5f;
      c.v_scale = 2.0f;
    }
    if (rng() % 3 == 0) c.window = 1 + static_cast<int>(rng() % 200);
    if (rng() % 3 == 0) c.soft_cap = 5.0f + static_cast<float>(rng() % 30);
    if (rng() % 4 == 0) c.alibi = true;
    if (rng() % 4 == 0) c.strided_io = true;
    if (rng() % 4 == 0) c.write_kv = false;
    limit_cost(c, 40'000'000);
    return c;
  });
}

// Long prefills with short attention chunks and windows: a query tile's later tokens see
// nothing of the first key tiles (their chunk or window starts past them). The onednn backend
// once wrote past a score row there.
TEST_F(Attention, ChunkOrWindowStartsPastAKeyTile) {
  if (!(caps.features & PAGEDATTN_FEATURE_CHUNKED_LOCAL))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks attention chunks";
  run(6, [&](std::mt19937_64&, int i) {
    AttnCase c;
    c.dtype = kModel[1 + i % 2];  // 16-bit queries: the onednn backend's matmul tiles
    c.H = 4;
    c.Hkv = 4;  // one head per group: a query tile spans the most tokens
    c.D = i % 2 ? 224 : 128;
    c.block_size = 16;
    c.lse = true;
    c.seqs = {{99, i % 3 == 2 ? 54 : 0, 0}, {97, 19, 0}};  // {qlen, ctx, enc}
    if (i % 3 == 1)
      c.window = 20;
    else
      c.chunk = 33 + 32 * (i % 2);
    return c;
  });
}

// Speculative-decoding verification (docs/semantics.md 4.7): draft trees over the new tokens of
// decode and chunked-prefill sequences, with chains and causal (empty) segments among them.
TEST_F(Attention, FastTreeMasks) {
  if (!(caps.features & PAGEDATTN_FEATURE_TREE_MASK))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks tree masks";
  run(18, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.dtype = kModel[i % 3];
    c.tree = true;
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 5), 12, 120, i % 4 == 0);
    for (auto& s : c.seqs)
      if (s.qlen > 1 && rng() % 2) s.qlen = 2 + static_cast<int>(rng() % 7);  // draft-sized
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, TreeMasksWithEveryOption) {
  if (!(caps.features & PAGEDATTN_FEATURE_TREE_MASK))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks tree masks";
  // With sinks, soft cap, GQA, fp8 and per-head scales, strided tensors, write_kv off, the SEQ
  // length form, a batch updated in place, and long contexts that split the keys.
  const bool extras = (caps.features & PAGEDATTN_FEATURE_SINKS) &&
                      (caps.features & PAGEDATTN_FEATURE_HEAD_SCALES);
  run(30, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.tree = true;
    const int n = 1 + static_cast<int>(rng() % 4);
    c.seqs.resize(n);
    for (auto& s : c.seqs) {
      s.qlen = 1 + static_cast<int>(rng() % (i % 3 == 0 ? 40 : 9));
      s.ctx = static_cast<int>(rng() % (i % 4 == 0 ? 2500 : 300));
    }
    if (extras && rng() % 2) c.sinks = true;
    if (rng() % 3 == 0) c.soft_cap = 5.0f + static_cast<float>(rng() % 30);
    if (rng() % 2) {
      c.cache_dtype = rng() % 2 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
      c.head_scales = extras && rng() % 2;
    }
    if (rng() % 4 == 0) c.strided_io = true;
    if (rng() % 4 == 0) c.write_kv = false;
    if (rng() % 4 == 0) c.seq_lens_form = true;
    if (rng() % 3 == 0) c.via_update = true;
    limit_cost(c, 40'000'000);
    return c;
  });
}

TEST_F(Attention, SinksOnEncoderAndCrossRows) {
  if (!(caps.features & PAGEDATTN_FEATURE_SINKS))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks sinks";
  // Every attention type takes sinks; a cross row without encoder tokens outputs zeros and its
  // lse is the sink.
  run(12, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.sinks = true;
    c.lse = true;
    c.seqs = pat::random_prefill_seqs(rng, 1 + static_cast<int>(rng() % 4), 40);
    switch (i % 3) {
      case 0: c.type = PAGEDATTN_ATTENTION_ENCODER; break;
      case 1: c.type = PAGEDATTN_ATTENTION_ENCODER_ONLY; c.write_kv = false; break;
      default:
        c.type = PAGEDATTN_ATTENTION_CROSS;
        for (size_t j = 0; j < c.seqs.size(); ++j)
          c.seqs[j].enc = j % 2 ? 0 : 1 + static_cast<int>(rng() % 60);
        break;
    }
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, Options01SizeIgnoresLaterFields) {
  // A caller built against 0.1 headers: pagedattn_attention_options_init's 0.1 size, and the
  // later fields (here set, as a newer caller's leftovers would be) are not read.
  run(6, [&](std::mt19937_64& rng, int) {
    AttnCase c = base(rng);
    c.sized_opts = false;
    c.sinks = true;
    c.chunk = 3;
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 4), 20, 60, false);
    return c;
  });
}

TEST_F(Attention, Fp8Caches) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.cache_dtype = i % 2 ? PAGEDATTN_DTYPE_FP8_E4M3 : PAGEDATTN_DTYPE_FP8_E5M2;
    const float scales[] = {1.0f, 0.5f, 2.0f, 0.125f, 4.0f, 0.3f};
    c.k_scale = scales[rng() % 6];
    c.v_scale = scales[rng() % 6];
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 40, 300, i % 3 == 0);
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, WriteKvOffCallerWroteTheCache) {
  run(16, [&](std::mt19937_64& rng, int) {
    AttnCase c = base(rng);
    c.write_kv = false;
    if (rng() % 3 == 0) c.cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3;
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 30, 200, true);
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, StridedTensorsAndWrappedCache) {
  run(20, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.strided_io = i % 4 != 1;
    c.wrap_cache = i % 4 != 0;
    c.lse = true;
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 5), 30, 150, true);
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, MultipleLayersOnlyGivenLayerChanges) {
  run(12, [&](std::mt19937_64& rng, int) {
    AttnCase c = base(rng);
    c.num_layers = 2 + static_cast<int>(rng() % 4);
    c.layer = static_cast<int>(rng() % c.num_layers);
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 5), 30, 100, false);
    limit_cost(c, 10'000'000);
    return c;
  });
}

TEST_F(Attention, EncoderAndEncoderOnly) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.type = i % 2 ? PAGEDATTN_ATTENTION_ENCODER : PAGEDATTN_ATTENTION_ENCODER_ONLY;
    c.write_kv = c.type == PAGEDATTN_ATTENTION_ENCODER && i % 4 != 1;
    if (c.type == PAGEDATTN_ATTENTION_ENCODER && i % 6 == 3) c.cache_dtype = PAGEDATTN_DTYPE_FP8_E5M2;
    c.soft_cap = i % 5 == 0 ? 20.0f : 0.0f;
    c.strided_io = i % 7 == 0;
    const int n = 1 + static_cast<int>(rng() % 16);  // batch 1..16
    c.seqs = pat::random_prefill_seqs(rng, n, 96);
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, CrossAttention) {
  run(24, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.type = PAGEDATTN_ATTENTION_CROSS;
    c.write_kv = i % 4 != 3;
    if (i % 5 == 2) c.cache_dtype = PAGEDATTN_DTYPE_FP8_E4M3;
    c.soft_cap = i % 6 == 0 ? 15.0f : 0.0f;
    c.strided_io = i % 7 == 0;
    const int n = 1 + static_cast<int>(rng() % 16);  // batch 1..16
    c.seqs.resize(n);
    for (auto& s : c.seqs) {
      // A first step (decoder prefill, encoder written) or a later decode step.
      const bool first = rng() % 2;
      s.qlen = first ? 1 + static_cast<int>(rng() % 20) : 1;
      s.ctx = first ? 0 : 1 + static_cast<int>(rng() % 50);
      s.enc = 1 + static_cast<int>(rng() % 150);
    }
    limit_cost(c, 30'000'000);
    return c;
  });
}

TEST_F(Attention, DecodeFirstTokenAndBlockBoundaries) {
  // Lengths exactly at, one before and one after block boundaries, and a lone first token.
  run(18, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.block_size = kBlockSizes[i % 9];
    const int bs = c.block_size;
    c.seqs = {{1, 0, 0}, {1, bs - 1, 0}, {1, bs, 0}, {1, 2 * bs + 1, 0}, {bs, bs, 0}, {1, 1, 0}};
    std::shuffle(c.seqs.begin(), c.seqs.end(), rng);
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, PlannedThenUpdatedInPlace) {
  // The batch is planned for another step with spare capacity and updated (graph replay).
  run(16, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.via_update = true;
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 40, 200, true);
    if (i % 4 == 3) {
      c.type = PAGEDATTN_ATTENTION_CROSS;
      for (auto& s : c.seqs) s.enc = 1 + static_cast<int>(rng() % 60);
    }
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, CrossRowsWithoutEncoderTokens) {
  // A sequence with no encoder tokens sees no key: lse -inf, out 0 (as an empty merge state).
  run(8, [&](std::mt19937_64& rng, int) {
    AttnCase c = base(rng);
    c.type = PAGEDATTN_ATTENTION_CROSS;
    c.lse = true;
    c.seqs = {{1 + static_cast<int>(rng() % 4), 0, 0}, {1, 3, 0}, {2, 0, 1 + static_cast<int>(rng() % 40)}};
    std::shuffle(c.seqs.begin(), c.seqs.end(), rng);
    return c;
  });
}

TEST_F(Attention, AllIdleBatchWritesNothing) {
  run(3, [&](std::mt19937_64& rng, int) {
    AttnCase c = base(rng);
    c.seqs = {{0, 5, 0}, {0, 0, 0}, {0, 17, 0}};
    return c;
  });
}

TEST_F(Attention, ConcurrentForwardsOnOneBackend) {
  // Forwards on one backend from several threads, each with its own batch, cache and outputs.
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  std::vector<AttnCase> cases;
  std::vector<uint64_t> seeds;
  for (int t = 0; t < 4; ++t) {
    AttnCase c = base(rng);
    c.seqs = pat::random_mixed_seqs(rng, 2 + static_cast<int>(rng() % 4), 30, 200, false);
    limit_cost(c, 10'000'000);
    cases.push_back(c);
    seeds.push_back(rng());
  }
  std::vector<::testing::AssertionResult> results(4, ::testing::AssertionSuccess());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3 && results[t]; ++rep)
        results[t] = pat::run_attention_case(be, cases[t], seeds[t] + rep);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t)
    EXPECT_TRUE(results[t]) << "thread " << t << ": " << cases[t].describe() << " (case seed "
                            << seeds[t] << ")";
}

TEST_F(Attention, SeqLensFormGivesTheSameResults) {
  // vLLM v1's metadata (seq_lens = context + new tokens, query_start_loc) plans the same batch as
  // query_lens + context_lens: each random case runs in both forms with one seed, both checked
  // against the float64 reference, and their outputs agree to the bit (same error).
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  const int count = 12;
  for (int i = 0; i < count; ++i) {
    AttnCase c = base(rng);
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 7), 24, 90, true);
    c.via_update = i % 3 == 1;
    c.caller_slots = i % 4 == 2;
    c.lse = true;
    limit_cost(c, 20'000'000);
    const uint64_t seed = rng();
    if (!supported(c) || !pat::case_sampled(master, static_cast<size_t>(i), count)) continue;
    pat::CaseResult ctx_res, seq_res;
    EXPECT_TRUE(pat::run_attention_case(be, c, seed, &ctx_res))
        << "case " << i << " (context form): " << c.describe() << " (case seed " << seed << ")";
    c.seq_lens_form = true;
    EXPECT_TRUE(pat::run_attention_case(be, c, seed, &seq_res))
        << "case " << i << ": " << c.describe() << " (case seed " << seed << ")";
    EXPECT_EQ(ctx_res.err, seq_res.err) << "case " << i << ": the two forms differ";
    EXPECT_EQ(ctx_res.lse_err, seq_res.lse_err) << "case " << i << ": the two forms differ";
  }
}

TEST_F(Attention, PaddedTokenRowsAreUntouched) {
  // A step captured with a padded token count (vLLM pads q/k/v/out for CUDA graphs): q/k/v/out/lse
  // have more rows than the batch's tokens. The rows before are the reference's; the padding rows
  // of out and lse are not written, and those of q/k/v (huge values) are not read or stored.
  run(12, [&](std::mt19937_64& rng, int i) {
    AttnCase c = base(rng);
    c.seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 6), 16, 80, true);
    c.pad_rows = 1 + static_cast<int>(rng() % 9);
    c.lse = true;
    c.seq_lens_form = i % 2 == 1;
    c.via_update = i % 3 == 0;
    c.strided_io = i % 4 == 3;
    if (i % 6 == 5) {
      c.type = PAGEDATTN_ATTENTION_CROSS;
      for (auto& s : c.seqs) s.enc = 1 + static_cast<int>(rng() % 40);
    }
    limit_cost(c, 20'000'000);
    return c;
  });
}

TEST_F(Attention, ChainTreeMaskIsExactlyCausal) {
  // A chain mask (every draft sees all earlier ones) is the causal rule: the same bytes as the
  // batch without masks, on every dtype, with and without a split of the keys.
  if (!(caps.features & PAGEDATTN_FEATURE_TREE_MASK))
    GTEST_SKIP() << "skipped: " << caps.name << " lacks tree masks";
  const uint64_t master = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(master));
  std::mt19937_64 rng(master);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (pagedattn_dtype dt : kModel) {
    const int H = 8, Hkv = 2, D = 64, bs = 16;
    const std::vector<int32_t> ql = {6, 1, 4}, cl = {50, 700, 1500};
    const int T = 11, nb = 160;
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    g.num_layers = 1;
    g.num_blocks = nb;
    g.block_size = bs;
    g.num_kv_heads = Hkv;
    g.head_size = D;
    g.dtype = dt;
    pagedattn_kv_cache* cache = nullptr;
    ASSERT_EQ(pagedattn_kv_cache_create(&cache, be, &g), PAGEDATTN_OK) << pat::last_error();
    std::vector<int32_t> tab(3 * 100);
    std::vector<int32_t> ids(nb);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 100; ++j) tab[i * 100 + j] = ids[(i * 53 + j) % nb];
    // Chains: row r of a q x q matrix sees tokens 0..r.
    std::vector<uint8_t> bits;
    std::vector<int64_t> ip = {0};
    for (int q : ql) {
      const size_t base = bits.size();
      bits.resize(base + static_cast<size_t>((q * q + 7) / 8), 0);
      for (int r = 0; r < q; ++r)
        for (int j = 0; j <= r; ++j) bits[base + (r * q + j) / 8] |= static_cast<uint8_t>(1u << ((r * q + j) % 8));
      ip.push_back(static_cast<int64_t>(bits.size()));
    }
    pagedattn_batch* plain = nullptr;
    pagedattn_batch* chain = nullptr;
    pagedattn_batch_desc bd;
    ASSERT_EQ(pagedattn_batch_desc_init_sized(&bd, sizeof bd), PAGEDATTN_OK);
    bd.num_seqs = 3;
    bd.query_lens = ql.data();
    bd.context_lens = cl.data();
    bd.block_tables = tab.data();
    bd.block_table_stride = 100;
    ASSERT_EQ(pagedattn_batch_create(&plain, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
    bd.tree_mask = bits.data();
    bd.tree_mask_indptr = ip.data();
    ASSERT_EQ(pagedattn_batch_create(&chain, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
    pat::Tensor q(dev, dt, T, H, D), k(dev, dt, T, Hkv, D), v(dev, dt, T, Hkv, D);
    pat::Tensor o1(dev, dt, T, H, D), o2(dev, dt, T, H, D);
    for (pat::Tensor* t : {&q, &k, &v}) {
      for (int64_t r = 0; r < t->rows(); ++r)
        for (int64_t h = 0; h < t->heads(); ++h)
          for (int64_t d = 0; d < D; ++d) t->set(r, h, d, nd(rng));
      t->upload();
    }
    o1.poison_all();
    o2.poison_all();
    o1.upload();
    o2.upload();
    pagedattn_attention_options opts;
    pagedattn_attention_options_init(&opts);
    opts.num_heads = H;
    opts.num_kv_heads = Hkv;
    opts.head_size = D;
    EXPECT_EQ(pagedattn_forward(be, plain, cache, 0, &opts, q.t(), k.t(), v.t(), o1.t(), nullptr, nullptr),
              PAGEDATTN_OK) << pat::last_error();
    EXPECT_EQ(pagedattn_forward(be, chain, cache, 0, &opts, q.t(), k.t(), v.t(), o2.t(), nullptr, nullptr),
              PAGEDATTN_OK) << pat::last_error();
    ASSERT_EQ(pagedattn_backend_synchronize(be, nullptr), PAGEDATTN_OK);
    o1.download();
    o2.download();
    EXPECT_TRUE(o1.buf().host() == o2.buf().host())
        << pat::dtype_str(dt) << ": a chain mask gave other bytes than the causal rule";
    pagedattn_batch_destroy(plain);
    pagedattn_batch_destroy(chain);
    pagedattn_kv_cache_destroy(cache);
  }
}
