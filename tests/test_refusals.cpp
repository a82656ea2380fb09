// Every refusal of pagedattn_forward listed in attention.h: status, a message naming the problem,
// and nothing written (out and lse poisoned and compared bitwise, the cache read back).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

constexpr int T = 4, H = 4, HKV = 2, D = 64, BS = 16, NB = 8, L = 2;

class ForwardRefusal : public pat::BackendTest {
 protected:
  void SetUp() override {
    pat::BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cache = make_cache(PAGEDATTN_DTYPE_FLOAT16, NB, BS);
    ASSERT_NE(cache, nullptr);
    // Decoder batch: (q 3, ctx 5) and (q 1, ctx 20).
    dec = plan({3, 1}, {5, 20}, {6, 0, 2, 4}, 2, cache, nullptr, nullptr);
    // Encoder batch (all contexts 0).
    enc = plan({3, 1}, {0, 0}, {6, 0, 2, 4}, 2, cache, nullptr, nullptr);
    // Cross batch: both sequences at their first step with 2 and 3 encoder tokens.
    const std::vector<int32_t> el = {2, 3};
    crs = plan({3, 1}, {0, 0}, {6, 0, 2, 4}, 2, cache, cache, &el);
    ASSERT_TRUE(dec && enc && crs);
    q.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, T, H, D));
    k.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, T, HKV, D));
    v.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, T, HKV, D));
    out.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, T, H, D));
    lse = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (pat::Tensor* t : {q.get(), k.get(), v.get()}) {
      for (int64_t r = 0; r < t->rows(); ++r)
        for (int64_t h = 0; h < t->heads(); ++h)
          for (int64_t d = 0; d < D; ++d) t->set(r, h, d, nd(rng));
      t->upload();
    }
    slopes = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, H);
    for (int h = 0; h < H; ++h) slopes->set(h, 0, 0, -0.5f / (h + 1));
    slopes->upload();
    pagedattn_attention_options_init(&opts);
    opts.num_heads = H;
    opts.num_kv_heads = HKV;
    opts.head_size = D;
    // Sanity: the unmodified call works.
    ASSERT_EQ(call(), PAGEDATTN_OK) << pat::last_error();
  }
  void TearDown() override {
    for (auto* b : batches_) pagedattn_batch_destroy(b);
    for (auto* c : caches_) pagedattn_kv_cache_destroy(c);
    pat::BackendTest::TearDown();
  }
  pagedattn_kv_cache* make_cache(pagedattn_dtype dt, int nb, int bs, pagedattn_backend* on = nullptr) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    g.num_layers = L;
    g.num_blocks = nb;
    g.block_size = bs;
    g.num_kv_heads = HKV;
    g.head_size = D;
    g.dtype = dt;
    pagedattn_kv_cache* c = nullptr;
    EXPECT_EQ(pagedattn_kv_cache_create(&c, on ? on : be, &g), PAGEDATTN_OK) << pat::last_error();
    if (c) caches_.push_back(c);
    return c;
  }
  pagedattn_batch* plan(std::vector<int32_t> ql, std::vector<int32_t> cl, std::vector<int32_t> tab,
                        int32_t stride, pagedattn_kv_cache* c, pagedattn_kv_cache* xc,
                        const std::vector<int32_t>* enc_lens, pagedattn_backend* on = nullptr) {
    pagedattn_batch_desc bd;
    pagedattn_batch_desc_init(&bd);
    bd.num_seqs = static_cast<int32_t>(ql.size());
    bd.query_lens = ql.data();
    bd.context_lens = cl.data();
    bd.block_tables = tab.data();
    bd.block_table_stride = stride;
    std::vector<int32_t> xt = {1, 3, 5, 7};
    if (enc_lens) {
      bd.encoder_lens = enc_lens->data();
      bd.cross_block_tables = xt.data();
      bd.cross_block_table_stride = 2;
    }
    pagedattn_batch* b = nullptr;
    EXPECT_EQ(pagedattn_batch_create(&b, on ? on : be, c, xc, &bd), PAGEDATTN_OK) << pat::last_error();
    if (b) batches_.push_back(b);
    return b;
  }
  pagedattn_status call() {
    return pagedattn_forward(be, dec, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(),
                             nullptr);
  }
  std::vector<uint8_t> read_cache(pagedattn_kv_cache* c) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    EXPECT_EQ(pagedattn_kv_cache_get_desc(&g, c), PAGEDATTN_OK);
    uint64_t bpb = 0;
    EXPECT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &g), PAGEDATTN_OK);
    std::vector<int32_t> ids(g.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<uint8_t> buf(bpb * g.num_blocks);
    EXPECT_EQ(pagedattn_kv_cache_read_blocks(c, ids.data(), ids.size(), buf.data(), buf.size(), nullptr),
              PAGEDATTN_OK);
    return buf;
  }
  // Poisons out/lse, snapshots the cache, runs fn, and checks the refusal wrote nothing.
  void refused(const char* what, pagedattn_status want, const std::string& needle,
               const std::function<pagedattn_status()>& fn) {
    SCOPED_TRACE(what);
    out->poison_all();
    lse->poison_all();
    out->upload();
    lse->upload();
    const auto o0 = out->buf().host(), l0 = lse->buf().host();
    const auto c0 = read_cache(cache);
    EXPECT_TRUE(status_is(fn(), want, needle));
    out->download();
    lse->download();
    EXPECT_TRUE(out->buf().host() == o0) << "out written by a refused forward";
    EXPECT_TRUE(lse->buf().host() == l0) << "lse written by a refused forward";
    EXPECT_TRUE(read_cache(cache) == c0) << "cache written by a refused forward";
  }
  pagedattn_kv_cache* cache = nullptr;
  pagedattn_batch *dec = nullptr, *enc = nullptr, *crs = nullptr;
  std::unique_ptr<pat::Tensor> q, k, v, out, lse, slopes;
  pagedattn_attention_options opts;
  std::vector<pagedattn_batch*> batches_;
  std::vector<pagedattn_kv_cache*> caches_;
};

pagedattn_device other_device(pagedattn_device d) {
  d.device_type = d.device_type == PAGEDATTN_DEVICE_CPU ? PAGEDATTN_DEVICE_CUDA : PAGEDATTN_DEVICE_CPU;
  return d;
}

// How messages name a device other_device() returns ("cpu:0", "cuda:1").
std::string device_str(pagedattn_device d) {
  return std::string(d.device_type == PAGEDATTN_DEVICE_CPU ? "cpu:" : "cuda:") +
         std::to_string(d.device_id);
}

// A float as the messages print it (printf %g: "0", "-2", "nan", "inf").
std::string g_str(float x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(x));
  return b;
}

}  // namespace

TEST_F(ForwardRefusal, NullsAndStructSize) {
  refused("NULL backend", PAGEDATTN_ERROR_NULL_POINTER, "backend is NULL", [&] {
    return pagedattn_forward(nullptr, dec, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL batch", PAGEDATTN_ERROR_NULL_POINTER, "batch is NULL", [&] {
    return pagedattn_forward(be, nullptr, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL cache (decoder)", PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL", [&] {
    return pagedattn_forward(be, dec, nullptr, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL opts", PAGEDATTN_ERROR_NULL_POINTER, "opts is NULL", [&] {
    return pagedattn_forward(be, dec, cache, 1, nullptr, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL q", PAGEDATTN_ERROR_NULL_POINTER, "q is NULL", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, nullptr, k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL out", PAGEDATTN_ERROR_NULL_POINTER, "out is NULL", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q->t(), k->t(), v->t(), nullptr, lse->t(), nullptr);
  });
  refused("NULL k with write_kv", PAGEDATTN_ERROR_NULL_POINTER, "k is NULL (needed by write_kv)", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q->t(), nullptr, v->t(), out->t(), lse->t(), nullptr);
  });
  refused("NULL v with write_kv", PAGEDATTN_ERROR_NULL_POINTER, "v is NULL (needed by write_kv)", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q->t(), k->t(), nullptr, out->t(), lse->t(), nullptr);
  });
  const auto saved = opts;
  opts.struct_size = 4;
  refused("struct_size", PAGEDATTN_ERROR_STRUCT_SIZE, "opts->struct_size = 4", [&] { return call(); });
  opts = saved;
  refused("NULL data pointer", PAGEDATTN_ERROR_NULL_POINTER, "q->data is NULL", [&] {
    pagedattn_tensor t = *q->t();
    t.data = nullptr;
    return pagedattn_forward(be, dec, cache, 1, &opts, &t, k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
}

TEST_F(ForwardRefusal, InvalidOptions) {
  const auto saved = opts;
  struct Case {
    const char* what;
    std::function<void(pagedattn_attention_options&)> mut;
    const char* needle;
  };
  const Case cases[] = {
      {"num_heads 0", [](auto& o) { o.num_heads = 0; }, "opts->num_heads = 0"},
      {"num_kv_heads 0", [](auto& o) { o.num_kv_heads = 0; }, "opts->num_kv_heads = 0"},
      {"head_size != cache's", [](auto& o) { o.head_size = 32; }, "opts->head_size 32 != cache head_size 64"},
      {"negative window", [](auto& o) { o.sliding_window = -4; }, "opts->sliding_window = -4"},
      {"negative soft cap", [](auto& o) { o.soft_cap = -1.0f; }, "opts->soft_cap = -1"},
      {"NaN soft cap", [](auto& o) { o.soft_cap = NAN; }, "opts->soft_cap = nan"},
      {"NaN scale", [](auto& o) { o.scale = NAN; }, "opts->scale = nan"},
      {"infinite scale", [](auto& o) { o.scale = INFINITY; }, "opts->scale = inf"},
      {"flags", [](auto& o) { o.flags = 1; }, "opts->flags = 0x1"},
      {"attention_type", [](auto& o) { o.attention_type = static_cast<pagedattn_attention_type>(9); }, "opts->attention_type = 9"},
      {"write_kv 2", [](auto& o) { o.write_kv = 2; }, "opts->write_kv = 2"},
  };
  for (const Case& c : cases) {
    opts = saved;
    c.mut(opts);
    refused(c.what, PAGEDATTN_ERROR_INVALID_ARGUMENT, c.needle, [&] { return call(); });
  }
  opts = saved;
}

TEST_F(ForwardRefusal, HeadsNotDivisible) {
  // H = 3 query heads over Hkv = 2: tensors shaped consistently so only H % Hkv is wrong.
  pat::Tensor q3(dev, PAGEDATTN_DTYPE_FLOAT16, T, 3, D), o3(dev, PAGEDATTN_DTYPE_FLOAT16, T, 3, D);
  auto l3 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, 3);
  q3.upload();
  opts.num_heads = 3;
  refused("H % Hkv != 0", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->num_heads 3 is not a multiple of opts->num_kv_heads 2", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q3.t(), k->t(), v->t(), o3.t(), l3->t(), nullptr);
  });
  // Hkv = 1 while the cache has 2 KV heads.
  pat::Tensor k1(dev, PAGEDATTN_DTYPE_FLOAT16, T, 1, D), v1(dev, PAGEDATTN_DTYPE_FLOAT16, T, 1, D);
  opts.num_heads = H;
  opts.num_kv_heads = 1;
  refused("num_kv_heads != cache's", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->num_kv_heads 1 != cache num_kv_heads 2", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q->t(), k1.t(), v1.t(), out->t(), lse->t(), nullptr);
  });
}

TEST_F(ForwardRefusal, BadTensors) {
  auto with = [&](pat::Tensor* which, const std::function<void(pagedattn_tensor&)>& mut) {
    return [this, which, mut] {
      pagedattn_tensor t = *which->t();
      mut(t);
      pagedattn_tensor* qq = which == q.get() ? &t : q->t();
      pagedattn_tensor* kk = which == k.get() ? &t : k->t();
      pagedattn_tensor* vv = which == v.get() ? &t : v->t();
      pagedattn_tensor* oo = which == out.get() ? &t : out->t();
      pagedattn_tensor* ll = which == lse.get() ? &t : lse->t();
      return pagedattn_forward(be, dec, cache, 1, &opts, qq, kk, vv, oo, ll, nullptr);
    };
  };
  static int64_t rank2[2] = {T, H * D};
  static int64_t rows_minus[3] = {T - 1, H, D};
  static int64_t heads_wrong[3] = {T, H + 4, D};
  static int64_t dim_wrong[3] = {T, H, D / 2};
  static int64_t k_rows[3] = {T - 1, HKV, D};
  static int64_t lse_shape[2] = {T, H + 1};
  static int64_t stride2[3] = {H * D * 2, D * 2, 2};
  static int64_t lse_stride[2] = {H * 2, 2};
  refused("q rank 2", PAGEDATTN_ERROR_BAD_TENSOR, "q: ndim 2 != 3", with(q.get(), [](auto& t) { t.ndim = 2; t.shape = rank2; t.strides = nullptr; }));
  refused("q rows < num_tokens", PAGEDATTN_ERROR_BAD_TENSOR, "q: shape [3, 4, 64] has 3 rows, fewer than the 4 the batch needs", with(q.get(), [](auto& t) { t.shape = rows_minus; }));
  refused("out rows", PAGEDATTN_ERROR_BAD_TENSOR, "out: shape [3, 4, 64]", with(out.get(), [](auto& t) { t.shape = rows_minus; }));
  refused("q heads != num_heads", PAGEDATTN_ERROR_BAD_TENSOR, "q: shape [4, 8, 64]", with(q.get(), [](auto& t) { t.shape = heads_wrong; t.strides = nullptr; }));
  refused("q dim != head_size", PAGEDATTN_ERROR_BAD_TENSOR, "q: shape [4, 4, 32]", with(q.get(), [](auto& t) { t.shape = dim_wrong; }));
  refused("k rows", PAGEDATTN_ERROR_BAD_TENSOR, "k: shape [3, 2, 64] has 3 rows, fewer than the 4", with(k.get(), [](auto& t) { t.shape = k_rows; t.strides = nullptr; }));
  static int64_t lse_rows[2] = {T - 2, H};
  refused("lse rows", PAGEDATTN_ERROR_BAD_TENSOR, "lse: shape [2, 4] has 2 rows, fewer than the 4", with(lse.get(), [](auto& t) { t.shape = lse_rows; }));
  refused("lse shape", PAGEDATTN_ERROR_BAD_TENSOR, "lse: shape [4, 5] != expected [4, 4]", with(lse.get(), [](auto& t) { t.shape = lse_shape; }));
  refused("q non-unit inner stride", PAGEDATTN_ERROR_BAD_TENSOR, "q: innermost stride 2", with(q.get(), [](auto& t) { t.strides = stride2; }));
  refused("out non-unit inner stride", PAGEDATTN_ERROR_BAD_TENSOR, "out: innermost stride 2", with(out.get(), [](auto& t) { t.strides = stride2; }));
  refused("lse non-unit inner stride", PAGEDATTN_ERROR_BAD_TENSOR, "lse: innermost stride 2", with(lse.get(), [](auto& t) { t.strides = lse_stride; }));
  refused("q float64", PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype {code 2, bits 64, lanes 1}", with(q.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_FLOAT, 64, 1}; }));
  refused("q int16", PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype {code 0, bits 16, lanes 1}", with(q.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_INT, 16, 1}; }));
  refused("q lanes 2", PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype {code 2, bits 16, lanes 2}", with(q.get(), [](auto& t) { t.dtype.lanes = 2; }));
  refused("out dtype != q dtype", PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype float16 != out dtype bfloat16", with(out.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_BFLOAT, 16, 1}; }));
  refused("k dtype != q dtype", PAGEDATTN_ERROR_BAD_TENSOR, "k: dtype bfloat16 != q dtype float16", with(k.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_BFLOAT, 16, 1}; }));
  refused("lse float16", PAGEDATTN_ERROR_BAD_TENSOR, "lse: dtype {code 2, bits 16, lanes 1} is not float32", with(lse.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_FLOAT, 16, 1}; }));
  refused("q fp8 (cache-only type)", PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype {code 10, bits 8, lanes 1}", with(q.get(), [](auto& t) { t.dtype = {PAGEDATTN_DLPACK_FLOAT8_E4M3FN, 8, 1}; }));
  const pagedattn_device od = other_device(dev);
  const std::string od_str = device_str(od);
  refused("q on another device", PAGEDATTN_ERROR_WRONG_DEVICE, "q: on " + od_str, with(q.get(), [od](auto& t) { t.device = od; }));
  refused("out on another device", PAGEDATTN_ERROR_WRONG_DEVICE, "out: on " + od_str, with(out.get(), [od](auto& t) { t.device = od; }));
  refused("lse on another device", PAGEDATTN_ERROR_WRONG_DEVICE, "lse: on " + od_str, with(lse.get(), [od](auto& t) { t.device = od; }));
  if (dev.device_type != PAGEDATTN_DEVICE_CPU) {  // another GPU ordinal
    refused("k on another device id", PAGEDATTN_ERROR_WRONG_DEVICE, "k: on ", with(k.get(), [](auto& t) { t.device.device_id = 5; }));
  }
}

TEST_F(ForwardRefusal, AlibiSlopesTensor) {
  pagedattn_tensor s = *slopes->t();
  static int64_t wrong[1] = {H + 1};
  s.shape = wrong;
  opts.alibi_slopes = &s;
  refused("ALiBi slopes shape", PAGEDATTN_ERROR_BAD_TENSOR, "opts->alibi_slopes: shape [5] != expected [4]", [&] { return call(); });
  s = *slopes->t();
  s.dtype = {PAGEDATTN_DLPACK_FLOAT, 16, 1};
  refused("ALiBi slopes dtype", PAGEDATTN_ERROR_BAD_TENSOR, "opts->alibi_slopes: dtype {code 2, bits 16, lanes 1}", [&] { return call(); });
  s = *slopes->t();
  static int64_t stride2[1] = {2};
  s.strides = stride2;
  refused("ALiBi slopes stride", PAGEDATTN_ERROR_BAD_TENSOR, "opts->alibi_slopes: innermost stride 2 != 1",
          [&] { return call(); });
  s = *slopes->t();
  s.device = other_device(dev);
  refused("ALiBi slopes device", PAGEDATTN_ERROR_WRONG_DEVICE, "opts->alibi_slopes: on " + device_str(other_device(dev)), [&] { return call(); });
}

TEST_F(ForwardRefusal, SinksChunkAndHeadScales) {
  // The options since 0.2 (a sized struct), each refusal leaving out, lse and the cache alone.
  ASSERT_EQ(pagedattn_attention_options_init_sized(&opts, sizeof opts), PAGEDATTN_OK);
  opts.num_heads = H;
  opts.num_kv_heads = HKV;
  opts.head_size = D;
  ASSERT_EQ(call(), PAGEDATTN_OK) << pat::last_error();
  pagedattn_tensor s = *slopes->t();
  static int64_t wrong[1] = {H + 1};
  s.shape = wrong;
  opts.sinks = &s;
  refused("sinks shape", PAGEDATTN_ERROR_BAD_TENSOR, "opts->sinks: shape [5] != expected [4] (num_heads)", [&] { return call(); });
  s = *slopes->t();
  s.dtype = {PAGEDATTN_DLPACK_FLOAT, 16, 1};
  refused("sinks dtype", PAGEDATTN_ERROR_BAD_TENSOR, "opts->sinks: dtype {code 2, bits 16, lanes 1} is not float32", [&] { return call(); });
  s = *slopes->t();
  s.device = other_device(dev);
  refused("sinks device", PAGEDATTN_ERROR_WRONG_DEVICE, "opts->sinks: on " + device_str(other_device(dev)), [&] { return call(); });
  s = *slopes->t();
  s.data = nullptr;
  refused("sinks data", PAGEDATTN_ERROR_NULL_POINTER, "opts->sinks->data is NULL", [&] { return call(); });
  opts.sinks = nullptr;

  opts.attention_chunk = -1;
  refused("negative chunk", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->attention_chunk = -1 < 0", [&] { return call(); });
  opts.attention_chunk = 4;
  opts.attention_type = PAGEDATTN_ATTENTION_ENCODER;
  refused("chunk with encoder", PAGEDATTN_ERROR_INVALID_ARGUMENT,
          "opts->attention_chunk = 4 but chunked local attention applies to decoder attention only (type encoder)", [&] {
            return pagedattn_forward(be, enc, cache, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
          });
  opts.attention_type = PAGEDATTN_ATTENTION_DECODER;
  opts.attention_chunk = 0;

  // Per-head scales: [num_kv_heads] float32; in host memory every value finite and > 0.
  auto hs = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, HKV);
  for (int h = 0; h < HKV; ++h) hs->set(h, 0, 0, 0.5f);
  hs->upload();
  pagedattn_tensor t = *hs->t();
  static int64_t heads[1] = {H};
  t.shape = heads;
  opts.k_head_scales = &t;
  refused("k_head_scales shape", PAGEDATTN_ERROR_BAD_TENSOR, "opts->k_head_scales: shape [4] != expected [2] (num_kv_heads)", [&] { return call(); });
  opts.k_head_scales = nullptr;
  opts.v_head_scales = &t;
  refused("v_head_scales shape", PAGEDATTN_ERROR_BAD_TENSOR, "opts->v_head_scales: shape [4] != expected [2] (num_kv_heads)", [&] { return call(); });
  opts.v_head_scales = nullptr;
  if (dev.device_type == PAGEDATTN_DEVICE_CPU) {
    for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
      hs->set(1, 0, 0, bad);
      hs->upload();
      opts.k_head_scales = hs->t();
      refused("bad k head scale", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->k_head_scales[1] = " + g_str(bad) + " must be finite and > 0", [&] { return call(); });
      opts.k_head_scales = nullptr;
      opts.v_head_scales = hs->t();
      refused("bad v head scale", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->v_head_scales[1] = " + g_str(bad) + " must be finite and > 0", [&] { return call(); });
      opts.v_head_scales = nullptr;
    }
  }
  // A struct_size past what this library knows.
  opts.struct_size = sizeof opts + 8;
  refused("struct_size", PAGEDATTN_ERROR_STRUCT_SIZE, "opts->struct_size", [&] { return call(); });
  opts.struct_size = sizeof opts;
  ASSERT_EQ(call(), PAGEDATTN_OK) << pat::last_error();
}

TEST_F(ForwardRefusal, TreeMaskBatchTakesPlainDecoderAttention) {
  // A batch planned with tree masks: its tokens have no positions for ALiBi, a window or a
  // chunk, and the masks order decoder tokens only.
  std::vector<int32_t> ql = {3, 1}, cl = {5, 20}, tab = {6, 0, 2, 4};
  std::vector<uint8_t> bits = {0x59, 0x01};  // rows 0b001, 0b011, 0b101; then the decode's bit
  std::vector<int64_t> ip = {0, 2, 2};
  pagedattn_batch_desc bd;
  ASSERT_EQ(pagedattn_batch_desc_init_sized(&bd, sizeof bd), PAGEDATTN_OK);
  bd.num_seqs = 2;
  bd.query_lens = ql.data();
  bd.context_lens = cl.data();
  bd.block_tables = tab.data();
  bd.block_table_stride = 2;
  bd.tree_mask = bits.data();
  bd.tree_mask_indptr = ip.data();
  pagedattn_batch* tb = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&tb, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
  batches_.push_back(tb);
  ASSERT_EQ(pagedattn_attention_options_init_sized(&opts, sizeof opts), PAGEDATTN_OK);
  opts.num_heads = H;
  opts.num_kv_heads = HKV;
  opts.head_size = D;
  auto fwd = [&] {
    return pagedattn_forward(be, tb, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  };
  if (!(caps.features & PAGEDATTN_FEATURE_TREE_MASK)) {
    refused("no tree masks", PAGEDATTN_ERROR_UNSUPPORTED, "tree masks is not supported", fwd);
    return;
  }
  ASSERT_EQ(fwd(), PAGEDATTN_OK) << pat::last_error();
  opts.alibi_slopes = slopes->t();
  refused("ALiBi", PAGEDATTN_ERROR_INVALID_ARGUMENT, "tree masks (speculative decoding), which take plain decoder attention: ALiBi is not supported", fwd);
  opts.alibi_slopes = nullptr;
  opts.sliding_window = 4;
  refused("window", PAGEDATTN_ERROR_INVALID_ARGUMENT, "a sliding window is not supported", fwd);
  opts.sliding_window = 0;
  opts.attention_chunk = 4;
  refused("chunk", PAGEDATTN_ERROR_INVALID_ARGUMENT, "an attention chunk is not supported", fwd);
  opts.attention_chunk = 0;
  ASSERT_EQ(fwd(), PAGEDATTN_OK) << pat::last_error();
}

TEST_F(ForwardRefusal, LayerOutOfRange) {
  for (int layer : {L, -1, 1000}) {
    refused("layer", PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = " + std::to_string(layer) + " is not in [0, 2)", [&] {
      return pagedattn_forward(be, dec, cache, layer, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
    });
  }
}

TEST_F(ForwardRefusal, AttentionTypeRules) {
  opts.alibi_slopes = slopes->t();
  opts.attention_type = PAGEDATTN_ATTENTION_ENCODER;
  refused("ALiBi with encoder", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->alibi_slopes is set but ALiBi applies to decoder attention only (type encoder)", [&] {
    return pagedattn_forward(be, enc, cache, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  opts.attention_type = PAGEDATTN_ATTENTION_CROSS;
  refused("ALiBi with cross", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->alibi_slopes is set but ALiBi applies to decoder attention only (type cross)", [&] {
    return pagedattn_forward(be, crs, cache, 0, &opts, q->t(), nullptr, nullptr, out->t(), lse->t(), nullptr);
  });
  opts.alibi_slopes = nullptr;
  opts.sliding_window = 8;
  refused("window with cross", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->sliding_window = 8 but a window applies to decoder attention only (type cross)", [&] {
    opts.write_kv = 0;
    return pagedattn_forward(be, crs, cache, 0, &opts, q->t(), nullptr, nullptr, out->t(), lse->t(), nullptr);
  });
  opts.write_kv = 1;
  opts.attention_type = PAGEDATTN_ATTENTION_ENCODER;
  refused("window with encoder", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->sliding_window = 8 but a window applies to decoder attention only (type encoder)", [&] {
    return pagedattn_forward(be, enc, cache, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  opts.sliding_window = 0;
  refused("encoder with context > 0", PAGEDATTN_ERROR_INVALID_ARGUMENT, "encoder attention needs every context_len == 0", [&] {
    return pagedattn_forward(be, dec, cache, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  opts.attention_type = PAGEDATTN_ATTENTION_ENCODER_ONLY;
  refused("encoder-only with context > 0", PAGEDATTN_ERROR_INVALID_ARGUMENT, "encoder-only attention needs every context_len == 0", [&] {
    opts.write_kv = 0;
    return pagedattn_forward(be, dec, nullptr, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  opts.write_kv = 1;
  refused("write_kv with encoder-only", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->write_kv = 1 with encoder-only attention", [&] {
    return pagedattn_forward(be, enc, nullptr, 0, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  opts.write_kv = 0;
  refused("encoder-only without k/v", PAGEDATTN_ERROR_NULL_POINTER, "k is NULL (needed by encoder attention", [&] {
    return pagedattn_forward(be, enc, nullptr, 0, &opts, q->t(), nullptr, nullptr, out->t(), lse->t(), nullptr);
  });
  opts.attention_type = PAGEDATTN_ATTENTION_CROSS;
  opts.write_kv = 0;
  refused("cross on a batch without encoder lengths", PAGEDATTN_ERROR_INVALID_ARGUMENT, "cross attention needs a batch planned with encoder_lens", [&] {
    return pagedattn_forward(be, dec, cache, 0, &opts, q->t(), nullptr, nullptr, out->t(), lse->t(), nullptr);
  });
}

TEST_F(ForwardRefusal, TwoRowsWritingOneSlot) {
  // Tokens 1 and 3 both land in slot 6 * 16 + 6: the tables share block 6, which both sequences
  // reach. Reading such a batch is fine; writing it is refused (which row would land?).
  pagedattn_batch* shared = plan({3, 1}, {5, 6}, {6, 0, 6, 0}, 2, cache, nullptr, nullptr);
  ASSERT_NE(shared, nullptr);
  refused("tables sharing a written block", PAGEDATTN_ERROR_INVALID_ARGUMENT,
          "write_kv: token rows 1 and 3 of this batch both write slot 102 (block 6, offset 6)",
          [&] {
            return pagedattn_forward(be, shared, cache, 0, &opts, q->t(), k->t(), v->t(),
                                     out->t(), lse->t(), nullptr);
          });
  opts.write_kv = 0;
  EXPECT_EQ(pagedattn_forward(be, shared, cache, 0, &opts, q->t(), nullptr, nullptr, out->t(),
                              lse->t(), nullptr),
            PAGEDATTN_OK)
      << "reading a batch whose tokens share a slot: " << pat::last_error();
  opts.write_kv = 1;

  // A caller slot mapping that repeats a slot.
  std::vector<int32_t> ql = {3, 1}, cl = {5, 20}, tab = {6, 0, 2, 4};
  std::vector<int64_t> sm = {101, 102, 103, 101};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 2;
  bd.query_lens = ql.data();
  bd.context_lens = cl.data();
  bd.block_tables = tab.data();
  bd.block_table_stride = 2;
  bd.slot_mapping = sm.data();
  pagedattn_batch* repeated = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&repeated, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  batches_.push_back(repeated);
  refused("a repeated slot_mapping entry", PAGEDATTN_ERROR_INVALID_ARGUMENT,
          "write_kv: token rows 0 and 3 of this batch both write slot 101", [&] {
            return pagedattn_forward(be, repeated, cache, 0, &opts, q->t(), k->t(), v->t(),
                                     out->t(), lse->t(), nullptr);
          });

  // Cross: both sequences at their first step, their cross tables sharing block 1.
  std::vector<int32_t> el = {2, 3}, zero = {0, 0}, xt = {1, 3, 1, 7};
  bd.slot_mapping = nullptr;
  bd.context_lens = zero.data();
  bd.encoder_lens = el.data();
  bd.cross_block_tables = xt.data();
  bd.cross_block_table_stride = 2;
  pagedattn_batch* xshared = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&xshared, be, cache, cache, &bd), PAGEDATTN_OK)
      << pat::last_error();
  batches_.push_back(xshared);
  opts.attention_type = PAGEDATTN_ATTENTION_CROSS;
  pat::Tensor xk(dev, PAGEDATTN_DTYPE_FLOAT16, 5, HKV, D), xv(dev, PAGEDATTN_DTYPE_FLOAT16, 5, HKV, D);
  refused("cross tables sharing a written block", PAGEDATTN_ERROR_INVALID_ARGUMENT,
          "write_kv: encoder k/v rows 0 and 2 of this batch both write slot 16 (block 1, offset "
          "0) of the cross cache",
          [&] {
            return pagedattn_forward(be, xshared, cache, 0, &opts, q->t(), xk.t(), xv.t(),
                                     out->t(), lse->t(), nullptr);
          });
}

TEST_F(ForwardRefusal, Fp8ScalesAndDtypeCombinations) {
  // An fp8 cache planned like the f16 one.
  pagedattn_kv_cache* fp8 = make_cache(PAGEDATTN_DTYPE_FP8_E4M3, NB, BS);
  ASSERT_NE(fp8, nullptr);
  const auto c0 = read_cache(fp8);
  for (float bad : {0.0f, -2.0f, NAN, INFINITY}) {
    opts.k_scale = bad;
    opts.v_scale = 1.0f;
    refused("bad k_scale", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->k_scale = " + g_str(bad), [&] {
      return pagedattn_forward(be, dec, fp8, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
    });
    opts.k_scale = 1.0f;
    opts.v_scale = bad;
    refused("bad v_scale", PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->v_scale = " + g_str(bad), [&] {
      return pagedattn_forward(be, dec, fp8, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
    });
  }
  EXPECT_TRUE(read_cache(fp8) == c0) << "fp8 cache written by a refused forward";
  opts.k_scale = opts.v_scale = 1.0f;
  // f32 tensors over an f16 cache: a dtype combination no backend offers.
  pat::Tensor q32(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D), k32(dev, PAGEDATTN_DTYPE_FLOAT32, T, HKV, D),
      v32(dev, PAGEDATTN_DTYPE_FLOAT32, T, HKV, D), o32(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D);
  refused("f32 tensors, f16 cache", PAGEDATTN_ERROR_UNSUPPORTED, "q dtype float32 with a float16 cache is not supported", [&] {
    return pagedattn_forward(be, dec, cache, 1, &opts, q32.t(), k32.t(), v32.t(), o32.t(), lse->t(), nullptr);
  });
}

TEST_F(ForwardRefusal, HandlesOfAnotherBackendOrDestroyed) {
  pagedattn_backend* be2 = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be2, pat::backend_name().c_str(), nullptr), PAGEDATTN_OK);
  pagedattn_kv_cache* c2 = make_cache(PAGEDATTN_DTYPE_FLOAT16, NB, BS, be2);
  pagedattn_batch* b2 = plan({3, 1}, {5, 20}, {6, 0, 2, 4}, 2, c2, nullptr, nullptr, be2);
  ASSERT_TRUE(c2 && b2);
  refused("cache of another backend", PAGEDATTN_ERROR_INVALID_HANDLE, "cache belongs to another backend", [&] {
    return pagedattn_forward(be, dec, c2, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("batch of another backend", PAGEDATTN_ERROR_INVALID_HANDLE, "batch belongs to another backend", [&] {
    return pagedattn_forward(be, b2, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  // A handle of the wrong kind (the magic check).
  refused("a batch passed as a cache", PAGEDATTN_ERROR_INVALID_HANDLE, "cache was destroyed or is not a pagedattn_kv_cache", [&] {
    return pagedattn_forward(be, dec, reinterpret_cast<pagedattn_kv_cache*>(dec), 1, &opts, q->t(),
                             k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("a cache passed as a batch", PAGEDATTN_ERROR_INVALID_HANDLE, "batch was destroyed or is not a pagedattn_batch", [&] {
    return pagedattn_forward(be, reinterpret_cast<pagedattn_batch*>(cache), cache, 1, &opts, q->t(),
                             k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  refused("a cache passed as a backend", PAGEDATTN_ERROR_INVALID_HANDLE, "backend was destroyed or is not a pagedattn_backend", [&] {
    return pagedattn_forward(reinterpret_cast<pagedattn_backend*>(cache), dec, cache, 1, &opts,
                             q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  // A destroyed cache: its magic is cleared on destroy (the memory is still mapped here, so
  // reading the stale handle is what the library's check is for).
  pagedattn_kv_cache* gone = make_cache(PAGEDATTN_DTYPE_FLOAT16, NB, BS);
  caches_.pop_back();
  pagedattn_kv_cache_destroy(gone);
  refused("destroyed cache", PAGEDATTN_ERROR_INVALID_HANDLE, "cache was destroyed or is not a pagedattn_kv_cache", [&] {
    return pagedattn_forward(be, dec, gone, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  // A cache whose geometry differs from the one planned.
  pagedattn_kv_cache* smaller = make_cache(PAGEDATTN_DTYPE_FLOAT16, NB - 1, BS);
  refused("cache with another block count", PAGEDATTN_ERROR_INVALID_ARGUMENT, "cache num_blocks 7 != 8", [&] {
    return pagedattn_forward(be, dec, smaller, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  pagedattn_kv_cache* other_bs = make_cache(PAGEDATTN_DTYPE_FLOAT16, NB, BS * 2);
  refused("cache with another block size", PAGEDATTN_ERROR_INVALID_ARGUMENT, "cache block_size 32 != 16", [&] {
    return pagedattn_forward(be, dec, other_bs, 1, &opts, q->t(), k->t(), v->t(), out->t(), lse->t(), nullptr);
  });
  // Release be2's objects before be2 (TearDown would do it after).
  for (auto it = batches_.begin(); it != batches_.end();)
    if (*it == b2) { pagedattn_batch_destroy(b2); it = batches_.erase(it); } else ++it;
  for (auto it = caches_.begin(); it != caches_.end();)
    if (*it == c2) { pagedattn_kv_cache_destroy(c2); it = caches_.erase(it); } else ++it;
  pagedattn_backend_destroy(be2);
}

TEST_F(ForwardRefusal, SeqLensPassedAsContextLensIsNamed) {
  // vLLM's seq_lens (cached + new tokens) passed as context_lens: each token sits query_len
  // positions late, in the tables' padding entries (block 0 here), so two sequences' tokens
  // meet in one slot. The refusal says what probably happened; the SEQ form of the same
  // metadata is accepted (with q/k/v/out/lse of 4 rows for 2 tokens: padded rows).
  std::vector<int32_t> seq_lens = {16, 32}, qsl = {0, 1, 2}, ones = {1, 1};
  std::vector<int32_t> tab = {3, 0, 0, 4, 5, 0};
  pagedattn_batch_desc bd;
  ASSERT_EQ(pagedattn_batch_desc_init_sized(&bd, sizeof bd), PAGEDATTN_OK);
  bd.num_seqs = 2;
  bd.query_lens = ones.data();
  bd.context_lens = seq_lens.data();  // the mistake
  bd.block_tables = tab.data();
  bd.block_table_stride = 3;
  pagedattn_batch* wrong = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&wrong, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  batches_.push_back(wrong);
  refused("seq_lens as context_lens", PAGEDATTN_ERROR_INVALID_ARGUMENT,
          "if context_lens holds vLLM's seq_lens (cached + new tokens), pass them as "
          "desc->seq_lens with query_start_loc and lens_form = PAGEDATTN_BATCH_LENS_SEQ",
          [&] {
            return pagedattn_forward(be, wrong, cache, 1, &opts, q->t(), k->t(), v->t(),
                                     out->t(), lse->t(), nullptr);
          });
  bd.query_lens = nullptr;
  bd.context_lens = nullptr;
  bd.lens_form = PAGEDATTN_BATCH_LENS_SEQ;
  bd.seq_lens = seq_lens.data();
  bd.query_start_loc = qsl.data();
  pagedattn_batch* right = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&right, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  batches_.push_back(right);
  EXPECT_EQ(pagedattn_forward(be, right, cache, 1, &opts, q->t(), k->t(), v->t(), out->t(),
                              lse->t(), nullptr),
            PAGEDATTN_OK)
      << pat::last_error();
  // A caller slot mapping repeating a slot is the caller's own: no seq_lens hint.
  std::vector<int64_t> sm = {7, 7};
  bd.slot_mapping = sm.data();
  pagedattn_batch* repeated = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&repeated, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  batches_.push_back(repeated);
  std::string msg;
  refused("a repeated caller slot", PAGEDATTN_ERROR_INVALID_ARGUMENT, "both write slot 7", [&] {
    const pagedattn_status st = pagedattn_forward(be, repeated, cache, 1, &opts, q->t(), k->t(),
                                                  v->t(), out->t(), lse->t(), nullptr);
    msg = pat::last_error();
    return st;
  });
  EXPECT_EQ(msg.find("seq_lens"), std::string::npos) << msg;
}
