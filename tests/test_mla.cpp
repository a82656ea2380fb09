// Multi-head latent attention (docs/semantics.md section 8): latent caches written with
// pagedattn_kv_cache_write_latent, pagedattn_forward_mla against the float64 reference (every
// head reads each key's one row over all D values; the output weighs the rows' leading R), with
// shuffled block tables, poisoned outputs and padding, an unchanged cache, and the refusals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

struct MlaCase {
  pagedattn_dtype dtype = PAGEDATTN_DTYPE_BFLOAT16;
  pagedattn_dtype cache_dtype = PAGEDATTN_DTYPE_INVALID;  // INVALID: the query's
  pagedattn_layout layout = PAGEDATTN_LAYOUT_NHD;
  int32_t block_size = 16;
  int32_t H = 16, D = 576, R = 512;
  float scale = 0, soft_cap = 0, k_scale = 1;
  int32_t window = 0, chunk = 0;
  bool alibi = false, sinks = false, tree = false, lse = true;
  bool split_q = true;       // q_nope + q_pe (else whole query rows)
  bool split_write = true;   // kv_c + k_pe (else whole rows)
  bool rank2_write = false;  // [T, W] write tensors (else [T, 1, W])
  int32_t pad_rows = 0;      // extra trailing rows of q/out/lse
  std::vector<pat::SeqSpec> seqs;
  std::string describe() const {
    std::string s = std::string(pat::dtype_str(dtype)) + " cache " +
                    pat::dtype_str(cache_dtype == PAGEDATTN_DTYPE_INVALID ? dtype : cache_dtype) +
                    " bs=" + std::to_string(block_size) + " H=" + std::to_string(H) +
                    " D=" + std::to_string(D) + " R=" + std::to_string(R);
    if (layout == PAGEDATTN_LAYOUT_HND) s += " HND";
    if (soft_cap > 0) s += " cap=" + std::to_string(soft_cap);
    if (window > 0) s += " window=" + std::to_string(window);
    if (chunk > 0) s += " chunk=" + std::to_string(chunk);
    if (alibi) s += " alibi";
    if (sinks) s += " sinks";
    if (tree) s += " tree";
    if (!split_q) s += " whole-q";
    if (!split_write) s += " whole-write";
    if (rank2_write) s += " rank2";
    s += " seqs=";
    for (const auto& q : seqs) s += "(" + std::to_string(q.qlen) + "," + std::to_string(q.ctx) + ")";
    return s;
  }
};

class Mla : public pat::BackendTest {
 protected:
  void SetUp() override {
    pat::BackendTest::SetUp();
    if (IsSkipped()) return;
    if (!(caps.features & PAGEDATTN_FEATURE_MLA))
      GTEST_SKIP() << "skipped: backend " << caps.name << " lacks PAGEDATTN_FEATURE_MLA";
  }

  pagedattn_kv_cache* make_cache(const MlaCase& c, int32_t blocks, uint32_t extra_flags = 0) {
    pagedattn_kv_cache_desc d;
    pagedattn_kv_cache_desc_init(&d);
    d.num_layers = 2;
    d.num_blocks = blocks;
    d.block_size = c.block_size;
    d.num_kv_heads = 1;
    d.head_size = c.D;
    d.dtype = c.cache_dtype == PAGEDATTN_DTYPE_INVALID ? c.dtype : c.cache_dtype;
    d.layout = c.layout;
    d.flags = PAGEDATTN_KV_CACHE_LATENT | extra_flags;
    pagedattn_kv_cache* cache = nullptr;
    const pagedattn_status st = pagedattn_kv_cache_create(&cache, be, &d);
    EXPECT_EQ(st, PAGEDATTN_OK) << pat::last_error();
    return cache;
  }

  std::vector<uint8_t> image(pagedattn_kv_cache* cache, int32_t blocks) {
    uint64_t bpb = 0;
    pagedattn_kv_cache_desc d;
    d.struct_size = sizeof d;
    pagedattn_kv_cache_get_desc(&d, cache);
    pagedattn_kv_cache_bytes_per_block(&bpb, &d);
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<uint8_t> buf(static_cast<size_t>(bpb) * ids.size());
    EXPECT_EQ(pagedattn_kv_cache_read_blocks(cache, ids.data(), ids.size(), buf.data(),
                                             buf.size(), nullptr),
              PAGEDATTN_OK)
        << pat::last_error();
    return buf;
  }

  // Runs one case; *err gets max|out - ref| / max|ref|.
  ::testing::AssertionResult run(const MlaCase& c, uint64_t seed, double* err = nullptr);
};

::testing::AssertionResult Mla::run(const MlaCase& c, uint64_t seed, double* err_out) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const pagedattn_dtype dt = c.dtype;
  const pagedattn_dtype cdt = c.cache_dtype == PAGEDATTN_DTYPE_INVALID ? dt : c.cache_dtype;
  const int nseq = static_cast<int>(c.seqs.size());
  const int H = c.H, D = c.D, R = c.R, bs = c.block_size;
  const int32_t layer = 1;
  // Block tables over shuffled ids, each row padded with spare entries.
  std::vector<int> nblk(nseq);
  int total_blocks = 0, width = 1;
  for (int i = 0; i < nseq; ++i) {
    const int len = c.seqs[i].ctx + c.seqs[i].qlen;
    nblk[i] = (len + bs - 1) / bs;
    total_blocks += nblk[i];
    width = std::max(width, nblk[i] + 2);
  }
  const int32_t blocks = total_blocks + 3;
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(nseq) * width, 0);
  int next = 0;
  for (int i = 0; i < nseq; ++i)
    for (int b = 0; b < nblk[i]; ++b) tables[static_cast<size_t>(i) * width + b] = ids[next++];
  pagedattn_kv_cache* cache = make_cache(c, blocks);
  if (!cache) return ::testing::AssertionFailure() << "cache: " << pat::last_error();
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> cache_guard(
      cache, pagedattn_kv_cache_destroy);

  // Every token's latent row (context and this step's), rounded through the model dtype, written
  // in one shuffled call; the reference keeps what the cache then holds.
  int64_t ntok_all = 0;
  std::vector<int64_t> seq_base(nseq + 1, 0);
  for (int i = 0; i < nseq; ++i) {
    seq_base[i + 1] = seq_base[i] + c.seqs[i].ctx + c.seqs[i].qlen;
  }
  ntok_all = seq_base[nseq];
  std::vector<float> rows(static_cast<size_t>(ntok_all) * D), held(rows.size());
  for (auto& x : rows) x = pat::round_to(dt, nd(rng));
  for (size_t e = 0; e < rows.size(); ++e) {
    if (pat::is_fp8(cdt)) {
      uint8_t b;
      pat::store(cdt, &b, rows[e] / c.k_scale);
      held[e] = pat::load(cdt, &b) * c.k_scale;
    } else {
      held[e] = rows[e];
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(ntok_all));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  {
    const int W0 = c.split_write ? R : D;
    std::unique_ptr<pat::Tensor> kvc =
        c.rank2_write ? pat::Tensor::make2d(dev, dt, ntok_all, W0)
                      : std::make_unique<pat::Tensor>(dev, dt, ntok_all, 1, W0);
    std::unique_ptr<pat::Tensor> kpe;
    if (c.split_write)
      kpe = c.rank2_write ? pat::Tensor::make2d(dev, dt, ntok_all, D - R)
                          : std::make_unique<pat::Tensor>(dev, dt, ntok_all, 1, D - R);
    std::vector<int64_t> slot(static_cast<size_t>(ntok_all));
    for (int64_t r = 0; r < ntok_all; ++r) {
      const int64_t tok = order[static_cast<size_t>(r)];
      const int i = static_cast<int>(std::upper_bound(seq_base.begin(), seq_base.end(), tok) -
                                     seq_base.begin()) - 1;
      const int64_t p = tok - seq_base[i];
      slot[static_cast<size_t>(r)] =
          static_cast<int64_t>(tables[static_cast<size_t>(i) * width + p / bs]) * bs + p % bs;
      for (int e = 0; e < D; ++e) {
        const float x = rows[static_cast<size_t>(tok) * D + e];
        if (e < W0) {
          if (c.rank2_write) kvc->set(r, e, 0, x); else kvc->set(r, 0, e, x);
        } else {
          if (c.rank2_write) kpe->set(r, e - W0, 0, x); else kpe->set(r, 0, e - W0, x);
        }
      }
    }
    pat::DevBuf sbuf(dev, slot.size() * sizeof(int64_t));
    std::memcpy(sbuf.host().data(), slot.data(), slot.size() * sizeof(int64_t));
    sbuf.upload();
    int64_t sshape[1] = {ntok_all};
    pagedattn_tensor st{};
    st.data = sbuf.ptr();
    st.device = dev;
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
    st.shape = sshape;
    kvc->upload();
    if (kpe) kpe->upload();
    const pagedattn_status ws = pagedattn_kv_cache_write_latent(
        cache, layer, kvc->t(), kpe ? kpe->t() : nullptr, &st, c.k_scale, nullptr);
    if (ws != PAGEDATTN_OK)
      return ::testing::AssertionFailure()
             << "write_latent: " << pagedattn_status_string(ws) << ": " << pat::last_error();
  }

  // The batch.
  std::vector<int32_t> qlens(nseq), ctxs(nseq);
  std::vector<int64_t> qstart(nseq + 1, 0);
  for (int i = 0; i < nseq; ++i) {
    qlens[i] = c.seqs[i].qlen;
    ctxs[i] = c.seqs[i].ctx;
    qstart[i + 1] = qstart[i] + qlens[i];
  }
  const int64_t T = qstart[nseq];
  std::vector<std::vector<uint8_t>> tree_rows(nseq);
  std::vector<uint8_t> tree_bytes;
  std::vector<int64_t> tree_indptr(nseq + 1, 0);
  if (c.tree) {
    for (int i = 0; i < nseq; ++i) {
      const int q = qlens[i];
      tree_indptr[i + 1] = tree_indptr[i];
      if (q < 2 || rng() % 4 == 0) continue;
      std::vector<uint8_t>& m = tree_rows[i];
      m.assign(static_cast<size_t>(q) * q, 0);
      for (int r = 0; r < q; ++r) {
        const int parent = (r == 0 || rng() % 4 == 0) ? -1 : static_cast<int>(rng() % r);
        if (parent >= 0)
          for (int j = 0; j < q; ++j)
            m[static_cast<size_t>(r) * q + j] = m[static_cast<size_t>(parent) * q + j];
        m[static_cast<size_t>(r) * q + r] = 1;
      }
      const int64_t nbytes = (static_cast<int64_t>(q) * q + 7) / 8;
      const size_t base = tree_bytes.size();
      tree_bytes.resize(base + static_cast<size_t>(nbytes), 0);
      for (int64_t b = 0; b < static_cast<int64_t>(q) * q; ++b)
        if (m[static_cast<size_t>(b)])
          tree_bytes[base + static_cast<size_t>(b >> 3)] |= static_cast<uint8_t>(1u << (b & 7));
      tree_indptr[i + 1] = tree_indptr[i] + nbytes;
    }
  }
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init_sized(&bd, sizeof bd);
  bd.num_seqs = nseq;
  bd.query_lens = qlens.data();
  bd.context_lens = ctxs.data();
  bd.block_tables = tables.data();
  bd.block_table_stride = width;
  if (c.tree && tree_indptr[nseq] > 0) {
    bd.tree_mask = tree_bytes.data();
    bd.tree_mask_indptr = tree_indptr.data();
  }
  pagedattn_batch* batch = nullptr;
  const pagedattn_status bst = pagedattn_batch_create(&batch, be, cache, nullptr, &bd);
  if (bst != PAGEDATTN_OK)
    return ::testing::AssertionFailure() << "batch: " << pat::last_error();
  std::unique_ptr<pagedattn_batch, void (*)(pagedattn_batch*)> batch_guard(
      batch, pagedattn_batch_destroy);

  // Queries, output and lse (poisoned, padded).
  const int64_t rows_io = T + c.pad_rows;
  std::vector<float> q(static_cast<size_t>(T) * H * D);
  for (auto& x : q) x = pat::round_to(dt, nd(rng));
  pat::Tensor qn(dev, dt, rows_io, H, c.split_q ? R : D);
  std::unique_ptr<pat::Tensor> qp;
  if (c.split_q) qp = std::make_unique<pat::Tensor>(dev, dt, rows_io, H, D - R);
  qn.poison_all();
  if (qp) qp->poison_all();
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < D; ++e) {
        const float x = q[(static_cast<size_t>(t) * H + h) * D + e];
        if (!c.split_q || e < R) qn.set(t, h, e, x); else qp->set(t, h, e - R, x);
      }
  pat::Tensor out(dev, dt, rows_io, H, R);
  out.poison_all();
  auto lse = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, rows_io, H);
  lse->poison_all();
  qn.upload();
  if (qp) qp->upload();
  out.upload();
  lse->upload();
  std::vector<float> slopes(H), sinks(H);
  for (int h = 0; h < H; ++h) {
    slopes[h] = std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / H);
    sinks[h] = h % 5 == 0 ? -std::numeric_limits<float>::infinity() : nd(rng) * 2.0f;
  }
  auto slope_t = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, H);
  auto sink_t = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, H);
  for (int h = 0; h < H; ++h) {
    slope_t->set(h, 0, 0, slopes[h]);
    sink_t->set(h, 0, 0, sinks[h]);
  }
  slope_t->upload();
  sink_t->upload();

  pagedattn_attention_options o;
  pagedattn_attention_options_init_sized(&o, sizeof o);
  o.num_heads = H;
  o.num_kv_heads = 1;
  o.head_size = D;
  o.scale = c.scale;
  o.soft_cap = c.soft_cap;
  o.sliding_window = c.window;
  o.attention_chunk = c.chunk;
  o.k_scale = c.k_scale;
  o.alibi_slopes = c.alibi ? slope_t->t() : nullptr;
  o.sinks = c.sinks ? sink_t->t() : nullptr;
  const std::vector<uint8_t> before = image(cache, blocks);
  const pagedattn_status fs = pagedattn_forward_mla(be, batch, cache, layer, &o, qn.t(),
                                                    qp ? qp->t() : nullptr, out.t(),
                                                    c.lse ? lse->t() : nullptr, nullptr);
  if (fs != PAGEDATTN_OK)
    return ::testing::AssertionFailure()
           << "forward_mla: " << pagedattn_status_string(fs) << ": " << pat::last_error();
  pagedattn_backend_synchronize(be, nullptr);
  out.download();
  lse->download();
  if (image(cache, blocks) != before)
    return ::testing::AssertionFailure() << "forward_mla changed the cache";
  std::string why;
  if (!out.padding_untouched(&why)) return ::testing::AssertionFailure() << "out: " << why;
  if (!lse->padding_untouched(&why)) return ::testing::AssertionFailure() << "lse: " << why;

  // The float64 reference, one sequence at a time: V is the rows themselves (only the leading R
  // outputs are compared).
  std::vector<double> ref, ref_lse;
  std::vector<float> got, got_lse;
  for (int i = 0; i < nseq; ++i) {
    const int qlen = qlens[i];
    if (qlen == 0) continue;
    const int64_t nk = ctxs[i] + qlen;
    pat::RefParams p;
    p.H = H;
    p.Hkv = 1;
    p.D = D;
    p.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(D));
    p.soft_cap = c.soft_cap;
    p.window = c.window;
    p.chunk = c.chunk;
    p.alibi = c.alibi ? slopes.data() : nullptr;
    p.sinks = c.sinks ? sinks.data() : nullptr;
    if (!tree_rows[i].empty()) {
      p.tree = tree_rows[i].data();
      p.tree_ctx = ctxs[i];
      p.tree_q = qlen;
    }
    std::vector<int64_t> qpos(qlen);
    for (int j = 0; j < qlen; ++j) qpos[j] = ctxs[i] + j;
    const float* kr = held.data() + static_cast<size_t>(seq_base[i]) * D;
    std::vector<double> o_ref(static_cast<size_t>(qlen) * H * D), l_ref(static_cast<size_t>(qlen) * H);
    pat::ref_attend(p, qlen, q.data() + static_cast<size_t>(qstart[i]) * H * D, qpos.data(), nk,
                    kr, kr, o_ref.data(), l_ref.data());
    for (int j = 0; j < qlen; ++j)
      for (int h = 0; h < H; ++h) {
        const int64_t t = qstart[i] + j;
        for (int e = 0; e < R; ++e) {
          ref.push_back(o_ref[(static_cast<size_t>(j) * H + h) * D + e]);
          got.push_back(out.get(t, h, e));
        }
        ref_lse.push_back(l_ref[static_cast<size_t>(j) * H + h]);
        got_lse.push_back(lse->get(t, h, 0));
      }
  }
  double err = 0;
  auto r = pat::check_close("out", ref, got, pat::tolerance(dt, cdt), &err);
  if (err_out) *err_out = err;
  if (!r) return r;
  if (c.lse) {
    for (size_t k = 0; k < ref_lse.size(); ++k) {
      const double a = ref_lse[k], b = got_lse[k];
      if (std::isinf(a) ? b != a : std::fabs(a - b) > 1e-3 * std::max(1.0, std::fabs(a)))
        return ::testing::AssertionFailure() << "lse[" << k << "] = " << b << ", reference " << a;
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<pat::SeqSpec> seqs_of(std::initializer_list<std::pair<int, int>> l) {
  std::vector<pat::SeqSpec> v;
  for (const auto& p : l) {
    pat::SeqSpec s;
    s.qlen = p.first;
    s.ctx = p.second;
    v.push_back(s);
  }
  return v;
}

}  // namespace

// Decode over the head counts engines run (tensor-parallel slices of 128), the block sizes of
// vLLM and FlashMLA, and every model dtype.
TEST_F(Mla, FastDecode) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  const pagedattn_dtype dts[] = {PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FLOAT16,
                                 PAGEDATTN_DTYPE_FLOAT32};
  const int heads[] = {16, 8, 128};
  const int bss[] = {64, 16, 1};
  for (int k = 0; k < 6; ++k) {
    MlaCase c;
    c.dtype = dts[k % 3];
    c.H = heads[k % 3];
    c.block_size = bss[(k / 2) % 3];
    c.layout = k % 2 ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    c.split_q = k != 4;
    c.pad_rows = k % 3;
    c.seqs = seqs_of({{1, static_cast<int>(rng() % 200)}, {1, 0}, {1, 63},
                      {1, static_cast<int>(rng() % 300) + 1}});
    std::shuffle(c.seqs.begin(), c.seqs.end(), rng);
    SCOPED_TRACE(c.describe());
    if (!pat::case_sampled(seed, static_cast<size_t>(k), 6)) continue;
    ASSERT_TRUE(run(c, seed + static_cast<uint64_t>(k)));
  }
}

// Prefill, chunked prefill and mixed steps (causal among the new tokens).
TEST_F(Mla, FastPrefillChunkedAndMixed) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  const pagedattn_dtype dts[] = {PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FLOAT32,
                                 PAGEDATTN_DTYPE_FLOAT16};
  for (int k = 0; k < 3; ++k) {
    MlaCase c;
    c.dtype = dts[k];
    c.H = k == 2 ? 8 : 16;
    c.block_size = k == 1 ? 16 : 64;
    c.split_write = k != 1;
    c.rank2_write = k == 2;
    c.seqs = seqs_of({{static_cast<int>(rng() % 40) + 2, 0},
                      {1, static_cast<int>(rng() % 100)},
                      {static_cast<int>(rng() % 20) + 2, static_cast<int>(rng() % 90) + 1},
                      {0, 5}});
    std::shuffle(c.seqs.begin(), c.seqs.end(), rng);
    SCOPED_TRACE(c.describe());
    if (!pat::case_sampled(seed, static_cast<size_t>(k), 3)) continue;
    ASSERT_TRUE(run(c, seed + static_cast<uint64_t>(k)));
  }
}

// fp8 latent caches (DeepSeek's serving setups quantise the latent rows), with a scale.
TEST_F(Mla, Fp8LatentCaches) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  const pagedattn_dtype cdts[] = {PAGEDATTN_DTYPE_FP8_E4M3, PAGEDATTN_DTYPE_FP8_E5M2};
  for (int k = 0; k < 4; ++k) {
    MlaCase c;
    c.dtype = k % 2 ? PAGEDATTN_DTYPE_FLOAT16 : PAGEDATTN_DTYPE_BFLOAT16;
    c.cache_dtype = cdts[k % 2];
    c.k_scale = k < 2 ? 1.0f : 0.05f;
    c.block_size = k < 2 ? 64 : 16;
    c.seqs = seqs_of({{1, 150}, {7, 30}, {1, 1}});
    SCOPED_TRACE(c.describe());
    if (!pat::case_sampled(seed, static_cast<size_t>(k), 4)) continue;
    ASSERT_TRUE(run(c, seed + static_cast<uint64_t>(k)));
  }
}

// A long decode that the backends split over the keys (split-KV, then a merge).
TEST_F(Mla, SplitKvLongDecode) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  MlaCase c;
  c.block_size = 64;
  c.seqs = seqs_of({{1, 2900}});
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(run(c, seed));
  c.H = 128;
  c.sinks = true;
  c.seqs = seqs_of({{1, 1500}, {2, 700}});
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(run(c, seed + 1));
}

// The decoder options: soft cap, window, chunk, ALiBi, sinks, a caller's scale; tree masks.
TEST_F(Mla, VariantsAndTreeMasks) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 5; ++k) {
    MlaCase c;
    c.H = 16;
    c.scale = k == 0 ? 1.0f / std::sqrt(192.0f) : 0.0f;  // DeepSeek's softmax scale form
    c.soft_cap = k == 1 ? 30.0f : 0.0f;
    c.window = k == 2 ? 37 : 0;
    c.chunk = k == 3 ? 48 : 0;
    c.alibi = k == 1;
    c.sinks = k != 2;
    c.tree = k == 4;
    c.seqs = seqs_of({{1, static_cast<int>(rng() % 150) + 1},
                      {static_cast<int>(rng() % 6) + 2, static_cast<int>(rng() % 120)},
                      {static_cast<int>(rng() % 30) + 2, 0}});
    SCOPED_TRACE(c.describe());
    if (!pat::case_sampled(seed, static_cast<size_t>(k), 5)) continue;
    ASSERT_TRUE(run(c, seed + static_cast<uint64_t>(k)));
  }
}

// Another latent geometry (MiniCPM3's 256 + 32), on backends that list it.
TEST_F(Mla, SmallerLatentRows) {
  if (!(caps.latent_sizes & (1u << (288 / 32 - 1))))
    GTEST_SKIP() << "skipped: " << caps.name << " does not list latent rows of 288";
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  MlaCase c;
  c.D = 288;
  c.R = 256;
  c.H = 40;
  c.seqs = seqs_of({{1, 90}, {9, 20}});
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(run(c, seed));
}

// Latent blocks move whole: copy, read/load (one row set per layer) and swaps to a host cache.
TEST_F(Mla, BlockCopiesReadsLoadsAndSwaps) {
  MlaCase c;
  c.block_size = 16;
  const int32_t blocks = 6;
  pagedattn_kv_cache* a = make_cache(c, blocks);
  ASSERT_NE(a, nullptr);
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> ga(a,
                                                                       pagedattn_kv_cache_destroy);
  pagedattn_kv_cache_desc d;
  d.struct_size = sizeof d;
  ASSERT_EQ(pagedattn_kv_cache_get_desc(&d, a), PAGEDATTN_OK);
  uint64_t bpb = 0;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &d), PAGEDATTN_OK);
  EXPECT_EQ(bpb, 2ull * 16 * 576 * 2);  // two layers of 16 rows of 576 bf16, no V
  void* k0 = nullptr;
  void* v0 = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_get_layer(&k0, &v0, nullptr, a, 0), PAGEDATTN_OK);
  EXPECT_EQ(k0, v0);
  std::vector<uint8_t> img(static_cast<size_t>(bpb) * blocks);
  std::mt19937_64 rng(pat::test_seed());
  for (auto& b : img) b = static_cast<uint8_t>(rng() & 0x3f);  // finite bf16 patterns
  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  ASSERT_EQ(pagedattn_kv_cache_load_blocks(a, ids.data(), ids.size(), img.data(), img.size(),
                                           nullptr),
            PAGEDATTN_OK)
      << pat::last_error();
  EXPECT_EQ(image(a, blocks), img);
  const int32_t pairs[] = {1, 4, 2, 5};
  ASSERT_EQ(pagedattn_kv_cache_copy_blocks(a, pairs, 2, nullptr), PAGEDATTN_OK)
      << pat::last_error();
  std::vector<uint8_t> want = img;
  std::memcpy(&want[4 * bpb], &img[1 * bpb], bpb);
  std::memcpy(&want[5 * bpb], &img[2 * bpb], bpb);
  EXPECT_EQ(image(a, blocks), want);
  // To a host cache and back into other blocks.
  pagedattn_kv_cache* h = make_cache(c, blocks, PAGEDATTN_KV_CACHE_HOST);
  ASSERT_NE(h, nullptr);
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> gh(h,
                                                                       pagedattn_kv_cache_destroy);
  const int32_t out_pairs[] = {0, 3, 3, 0};
  ASSERT_EQ(pagedattn_kv_cache_swap_blocks(h, a, out_pairs, 2, nullptr), PAGEDATTN_OK)
      << pat::last_error();
  const int32_t in_pairs[] = {3, 1};
  ASSERT_EQ(pagedattn_kv_cache_swap_blocks(a, h, in_pairs, 1, nullptr), PAGEDATTN_OK)
      << pat::last_error();
  pagedattn_backend_synchronize(be, nullptr);
  std::memcpy(&want[1 * bpb], &img[0 * bpb], bpb);
  EXPECT_EQ(image(a, blocks), want);
}

// Every refusal says why and writes nothing.
TEST_F(Mla, Refusals) {
  MlaCase c;
  c.block_size = 16;
  c.H = 8;
  pagedattn_kv_cache* lat = make_cache(c, 4);
  ASSERT_NE(lat, nullptr);
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> gl(lat,
                                                                       pagedattn_kv_cache_destroy);
  // A latent cache has one head.
  pagedattn_kv_cache_desc d;
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = 1;
  d.num_blocks = 4;
  d.block_size = 16;
  d.num_kv_heads = 2;
  d.head_size = 576;
  d.flags = PAGEDATTN_KV_CACHE_LATENT;
  pagedattn_kv_cache* bad = nullptr;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&bad, be, &d), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "num_kv_heads"));
  uint64_t bpb = 0;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(&bpb, &d),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "latent"));
  // A plain cache of the same block geometry.
  d.num_kv_heads = 1;
  d.head_size = 64;
  d.num_layers = 2;
  d.flags = 0;
  pagedattn_kv_cache* plain = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&plain, be, &d), PAGEDATTN_OK) << pat::last_error();
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> gp(
      plain, pagedattn_kv_cache_destroy);

  const int32_t qlens[] = {1}, ctxs[] = {3}, table[] = {2};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init_sized(&bd, sizeof bd);
  bd.num_seqs = 1;
  bd.query_lens = qlens;
  bd.context_lens = ctxs;
  bd.block_tables = table;
  bd.block_table_stride = 1;
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, lat, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  std::unique_ptr<pagedattn_batch, void (*)(pagedattn_batch*)> gb(batch, pagedattn_batch_destroy);

  const pagedattn_dtype dt = PAGEDATTN_DTYPE_BFLOAT16;
  pat::Tensor qn(dev, dt, 1, 8, 512), qp(dev, dt, 1, 8, 64), out(dev, dt, 1, 8, 512);
  pat::Tensor qw(dev, dt, 1, 8, 576), out_w(dev, dt, 1, 8, 576), out_odd(dev, dt, 1, 8, 500);
  pat::Tensor qn_odd(dev, dt, 1, 8, 500), qp_odd(dev, dt, 1, 8, 76);
  for (pat::Tensor* t : {&qn, &qp, &qw, &qn_odd, &qp_odd}) {
    for (int h = 0; h < 8; ++h)
      for (int e = 0; e < t->dim(); ++e) t->set(0, h, e, 0.25f);
    t->upload();
  }
  out.poison_all();
  out.upload();
  out_odd.poison_all();
  out_odd.upload();
  pagedattn_attention_options o;
  pagedattn_attention_options_init_sized(&o, sizeof o);
  o.num_heads = 8;
  o.num_kv_heads = 1;
  o.head_size = 576;
  auto fwd = [&](pagedattn_kv_cache* cache, const pagedattn_attention_options& oo,
                 pat::Tensor* a, pat::Tensor* b, pat::Tensor* y) {
    return pagedattn_forward_mla(be, batch, cache, 0, &oo, a->t(), b ? b->t() : nullptr, y->t(),
                                 nullptr, nullptr);
  };
  ASSERT_EQ(fwd(lat, o, &qn, &qp, &out), PAGEDATTN_OK) << pat::last_error();
  out.poison_all();
  out.upload();
  // The per-head forward refuses a latent cache, forward_mla a plain one.
  {
    pagedattn_attention_options p = o;
    p.write_kv = 0;
    EXPECT_TRUE(status_is(pagedattn_forward(be, batch, lat, 0, &p, qw.t(), nullptr, nullptr,
                                            out_w.t(), nullptr, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, "pagedattn_forward_mla"));
  }
  EXPECT_TRUE(status_is(fwd(plain, o, &qn, &qp, &out), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "not a latent"));
  pagedattn_attention_options o2 = o;
  o2.num_kv_heads = 2;
  o2.num_heads = 8;
  EXPECT_TRUE(status_is(fwd(lat, o2, &qn, &qp, &out), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "num_kv_heads"));
  o2 = o;
  o2.attention_type = PAGEDATTN_ATTENTION_ENCODER;
  EXPECT_TRUE(status_is(fwd(lat, o2, &qn, &qp, &out), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "decoder"));
  o2 = o;
  o2.head_size = 512;
  EXPECT_TRUE(status_is(fwd(lat, o2, &qn, &qp, &out), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "head_size"));
  auto hs = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, 1);
  hs->set(0, 0, 0, 1.0f);
  hs->upload();
  o2 = o;
  o2.k_head_scales = hs->t();
  EXPECT_TRUE(status_is(fwd(lat, o2, &qn, &qp, &out), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "k_head_scales"));
  // Extents: q_pe must complete the row; whole query rows without q_pe; a value size below D.
  EXPECT_TRUE(status_is(fwd(lat, o, &qn, &qn, &out), PAGEDATTN_ERROR_BAD_TENSOR, "q_pe"));
  EXPECT_TRUE(status_is(fwd(lat, o, &qn, nullptr, &out), PAGEDATTN_ERROR_BAD_TENSOR, "q_nope"));
  EXPECT_TRUE(status_is(fwd(lat, o, &qw, nullptr, &out_w), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "value size"));
  out.download();
  std::string why;
  for (int h = 0; h < 8; ++h)
    EXPECT_TRUE(std::isnan(out.get(0, h, 0))) << "a refused forward wrote out";
  // A value size the backend lacks is UNSUPPORTED, and writes nothing either.
  const pagedattn_status odd = fwd(lat, o, &qn_odd, &qp_odd, &out_odd);
  if (odd != PAGEDATTN_OK) {
    EXPECT_EQ(odd, PAGEDATTN_ERROR_UNSUPPORTED) << pat::last_error();
    out_odd.download();
    for (int h = 0; h < 8; ++h)
      EXPECT_TRUE(std::isnan(out_odd.get(0, h, 0))) << "a refused forward wrote out";
  }

  // Writes: the plain write refuses a latent cache, write_latent a plain one; widths add up.
  int64_t slots1[] = {5};
  pat::DevBuf sb(dev, sizeof slots1);
  std::memcpy(sb.host().data(), slots1, sizeof slots1);
  sb.upload();
  int64_t sshape[1] = {1};
  pagedattn_tensor st{};
  st.data = sb.ptr();
  st.device = dev;
  st.ndim = 1;
  st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
  st.shape = sshape;
  pat::Tensor kvc(dev, dt, 1, 1, 512), kpe(dev, dt, 1, 1, 64), kpe_bad(dev, dt, 1, 1, 60);
  pat::Tensor kw(dev, dt, 1, 1, 576);
  for (pat::Tensor* t : {&kvc, &kpe, &kpe_bad, &kw}) t->upload();
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(lat, 0, kw.t(), kw.t(), &st, 1, 1, nullptr),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "write_latent"));
  EXPECT_TRUE(status_is(
      pagedattn_kv_cache_write_latent(plain, 0, kvc.t(), kpe.t(), &st, 1, nullptr),
      PAGEDATTN_ERROR_INVALID_ARGUMENT, "not a latent"));
  EXPECT_TRUE(status_is(
      pagedattn_kv_cache_write_latent(lat, 0, kvc.t(), kpe_bad.t(), &st, 1, nullptr),
      PAGEDATTN_ERROR_BAD_TENSOR, "k_pe"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write_latent(lat, 0, kvc.t(), nullptr, &st, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "kv_c"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write_latent(lat, 0, kw.t(), kpe.t(), &st, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "kv_c"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write_latent(lat, 2, kvc.t(), kpe.t(), &st, 1, nullptr),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "layer"));
  int64_t far[] = {4 * 16};
  std::memcpy(sb.host().data(), far, sizeof far);
  sb.upload();
  if (dev.device_type == PAGEDATTN_DEVICE_CPU) {
    EXPECT_TRUE(status_is(
        pagedattn_kv_cache_write_latent(lat, 0, kvc.t(), kpe.t(), &st, 1, nullptr),
        PAGEDATTN_ERROR_OUT_OF_RANGE, "slot_mapping"));
  }
  // Swaps between a latent and a plain cache of equal geometry otherwise (rows of 64, where the
  // backend lists them).
  if (caps.latent_sizes & (1u << (64 / 32 - 1))) {
    d.head_size = 64;
    d.flags = PAGEDATTN_KV_CACHE_LATENT;
    pagedattn_kv_cache* lat64 = nullptr;
    ASSERT_EQ(pagedattn_kv_cache_create(&lat64, be, &d), PAGEDATTN_OK) << pat::last_error();
    std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> gq(
        lat64, pagedattn_kv_cache_destroy);
    const int32_t pr[] = {0, 1};
    EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(plain, lat64, pr, 1, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, "latent"));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(lat64, plain, pr, 1, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, "latent"));
  }
  // A latent row size the backend does not list.
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = 1;
  d.num_blocks = 2;
  d.block_size = 16;
  d.num_kv_heads = 1;
  d.head_size = 1056;
  d.flags = PAGEDATTN_KV_CACHE_LATENT;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&bad, be, &d), PAGEDATTN_ERROR_UNSUPPORTED,
                        "latent row size"));
}
