// examples/cpp/decode.cpp — the decode step of examples/c/decode.c from C++.
//
// The C API needs no C++ wrapper, but owning handles with std::unique_ptr and turning statuses
// into exceptions at the call site is how a C++ engine would usually hold it. Prefill-then-decode:
// a first batch prefills 3 prompts, a second decodes one token each, and the decode output is
// checked against a float64 reference computed from the same numbers.
#include <pagedattn/pagedattn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Throws with the status name and the library's message when a call fails.
void check(pagedattn_status st, const char* what) {
  if (st != PAGEDATTN_OK) {
    throw std::runtime_error(std::string(what) + ": " + pagedattn_status_string(st) + ": " +
                             pagedattn_last_error());
  }
}

struct BackendDeleter {
  void operator()(pagedattn_backend* p) const { pagedattn_backend_destroy(p); }
};
struct CacheDeleter {
  void operator()(pagedattn_kv_cache* p) const { pagedattn_kv_cache_destroy(p); }
};
struct BatchDeleter {
  void operator()(pagedattn_batch* p) const { pagedattn_batch_destroy(p); }
};
using Backend = std::unique_ptr<pagedattn_backend, BackendDeleter>;
using Cache = std::unique_ptr<pagedattn_kv_cache, CacheDeleter>;
using Batch = std::unique_ptr<pagedattn_batch, BatchDeleter>;

constexpr int kHeads = 8, kKvHeads = 2, kHeadSize = 64, kBlockSize = 16;

pagedattn_tensor host_f32(std::vector<float>& data, int64_t* shape) {
  pagedattn_tensor t{};
  t.data = data.data();
  t.device = {PAGEDATTN_DEVICE_CPU, 0};
  t.ndim = 3;
  t.dtype = {PAGEDATTN_DLPACK_FLOAT, 32, 1};
  t.shape = shape;
  return t;
}

// One layer's forward for a batch; q/k/v hold the batch's rows.
std::vector<float> forward(pagedattn_backend* be, pagedattn_kv_cache* kv,
                           const std::vector<int32_t>& qlens, const std::vector<int32_t>& ctx,
                           const std::vector<int32_t>& tables, int32_t stride,
                           std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  pagedattn_batch_desc bd;
  check(pagedattn_batch_desc_init(&bd), "batch_desc_init");
  bd.num_seqs = static_cast<int32_t>(qlens.size());
  bd.query_lens = qlens.data();
  bd.context_lens = ctx.data();
  bd.block_tables = tables.data();
  bd.block_table_stride = stride;
  pagedattn_batch* raw = nullptr;
  check(pagedattn_batch_create(&raw, be, kv, nullptr, &bd), "batch_create");
  Batch batch(raw);

  const int64_t rows = static_cast<int64_t>(q.size()) / (kHeads * kHeadSize);
  std::vector<float> out(q.size());
  int64_t q_shape[3] = {rows, kHeads, kHeadSize};
  int64_t kv_shape[3] = {rows, kKvHeads, kHeadSize};
  pagedattn_tensor tq = host_f32(q, q_shape), tk = host_f32(k, kv_shape),
                   tv = host_f32(v, kv_shape), tout = host_f32(out, q_shape);
  pagedattn_attention_options opts;
  check(pagedattn_attention_options_init(&opts), "attention_options_init");
  opts.num_heads = kHeads;
  opts.num_kv_heads = kKvHeads;
  opts.head_size = kHeadSize;
  check(pagedattn_forward(be, batch.get(), kv, 0, &opts, &tq, &tk, &tv, &tout, nullptr, nullptr),
        "forward");
  return out;
}

}  // namespace

int main() try {
  const std::vector<int32_t> prompt = {5, 17, 40};
  const std::vector<int32_t> tables = {7, 0, 0, 2, 11, 0, 9, 4, 13};  // 3 rows of 3 block ids
  const int32_t stride = 3;
  const int nseq = static_cast<int>(prompt.size());
  const int kv_row = kKvHeads * kHeadSize, q_row = kHeads * kHeadSize;

  pagedattn_backend* be_raw = nullptr;
  check(pagedattn_backend_create(&be_raw, "cpu", nullptr), "backend_create");
  Backend be(be_raw);
  pagedattn_kv_cache_desc cd;
  check(pagedattn_kv_cache_desc_init(&cd), "kv_cache_desc_init");
  cd.num_layers = 1;
  cd.num_blocks = 16;
  cd.block_size = kBlockSize;
  cd.num_kv_heads = kKvHeads;
  cd.head_size = kHeadSize;
  cd.dtype = PAGEDATTN_DTYPE_FLOAT32;
  pagedattn_kv_cache* kv_raw = nullptr;
  check(pagedattn_kv_cache_create(&kv_raw, be.get(), &cd), "kv_cache_create");
  Cache kv(kv_raw);

  // Keys/values of every token (prompt plus one decoded token) per sequence.
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> keys(nseq), values(nseq);
  for (int s = 0; s < nseq; ++s) {
    keys[s].resize(static_cast<size_t>(prompt[s] + 1) * kv_row);
    values[s].resize(keys[s].size());
    for (auto& x : keys[s]) x = dist(gen);
    for (auto& x : values[s]) x = dist(gen);
  }

  // Step 1: prefill the prompts (their q is irrelevant here; the step stores their k/v).
  std::vector<float> q, k, v;
  for (int s = 0; s < nseq; ++s) {
    k.insert(k.end(), keys[s].begin(), keys[s].begin() + static_cast<long>(prompt[s]) * kv_row);
    v.insert(v.end(), values[s].begin(), values[s].begin() + static_cast<long>(prompt[s]) * kv_row);
  }
  q.resize(k.size() / kv_row * q_row);
  for (auto& x : q) x = dist(gen);
  forward(be.get(), kv.get(), prompt, std::vector<int32_t>(nseq, 0), tables, stride, q, k, v);

  // Step 2: decode one token per sequence over the cached prompts.
  q.assign(static_cast<size_t>(nseq) * q_row, 0.0f);
  for (auto& x : q) x = dist(gen);
  k.clear();
  v.clear();
  for (int s = 0; s < nseq; ++s) {
    k.insert(k.end(), keys[s].end() - kv_row, keys[s].end());
    v.insert(v.end(), values[s].end() - kv_row, values[s].end());
  }
  std::vector<float> out = forward(be.get(), kv.get(), std::vector<int32_t>(nseq, 1), prompt,
                                   tables, stride, q, k, v);

  double max_err = 0.0, max_ref = 0.0;
  for (int s = 0; s < nseq; ++s) {
    const int n = prompt[s] + 1;
    for (int h = 0; h < kHeads; ++h) {
      const int kvh = h / (kHeads / kKvHeads);
      std::vector<double> w(n);
      double mx = -INFINITY, sum = 0.0;
      for (int t = 0; t < n; ++t) {
        double dot = 0.0;
        for (int d = 0; d < kHeadSize; ++d)
          dot += static_cast<double>(q[s * q_row + h * kHeadSize + d]) *
                 keys[s][static_cast<size_t>(t) * kv_row + kvh * kHeadSize + d];
        w[t] = dot / std::sqrt(static_cast<double>(kHeadSize));
        mx = std::max(mx, w[t]);
      }
      for (auto& x : w) sum += (x = std::exp(x - mx));
      for (int d = 0; d < kHeadSize; ++d) {
        double ref = 0.0;
        for (int t = 0; t < n; ++t)
          ref += w[t] / sum * values[s][static_cast<size_t>(t) * kv_row + kvh * kHeadSize + d];
        const double err = std::fabs(ref - out[s * q_row + h * kHeadSize + d]);
        if (!(err <= max_err)) max_err = err;
        max_ref = std::max(max_ref, std::fabs(ref));
      }
    }
  }
  const double rel = max_err / max_ref;
  std::printf("prefill then decode of %d sequences: max |out - ref| / max |ref| = %.3g\n", nseq,
              rel);
  if (!(rel <= 1e-5)) {
    std::fprintf(stderr, "FAILED: above the float32 tolerance 1e-5\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pagedattn-example-decode-cpp: %s\n", e.what());
  return 1;
}
