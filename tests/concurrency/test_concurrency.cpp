// Concurrency: what backend.h, kv_cache.h, batch.h and attention.h promise may run at once does
// run at once, with results identical to a single-threaded run. Meant to run under
// ThreadSanitizer too (scripts/sanitize --thread), so every test keeps its work small.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagedattn_test_support.h"

namespace {

constexpr int kThreads = 4;
constexpr int32_t kHkv = 2, kH = 4, kD = 32, kBs = 8, kBlocks = 64;

// A compact float32 tensor [d0, d1, d2] (or [d0, d1] / [d0]) over a std::vector.
struct F32 {
  std::vector<float> v;
  std::vector<int64_t> shape;
  pagedattn_tensor t{};
  explicit F32(std::vector<int64_t> s, float fill = 0.0f) : shape(std::move(s)) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    v.assign(n, fill);
    t.data = v.data();
    t.device = {PAGEDATTN_DEVICE_CPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = {PAGEDATTN_DLPACK_FLOAT, 32, 1};
    t.shape = shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  F32(const F32&) = delete;
  void randomize(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : v) x = u(rng);
  }
};

struct I64 {
  std::vector<int64_t> v, shape;
  pagedattn_tensor t{};
  explicit I64(std::vector<int64_t> vals) : v(std::move(vals)), shape{static_cast<int64_t>(v.size())} {
    t.data = v.data();
    t.device = {PAGEDATTN_DEVICE_CPU, 0};
    t.ndim = 1;
    t.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
    t.shape = shape.data();
  }
};

pagedattn_backend* make_backend(int32_t threads) {
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.num_threads = threads;
  pagedattn_backend* be = nullptr;
  EXPECT_EQ(pagedattn_backend_create(&be, pat::backend_name().c_str(), &o), PAGEDATTN_OK)
      << pagedattn_last_error();
  return be;
}

pagedattn_kv_cache* make_cache(pagedattn_backend* be, int32_t layers = 1) {
  pagedattn_kv_cache_desc d;
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = layers;
  d.num_blocks = kBlocks;
  d.block_size = kBs;
  d.num_kv_heads = kHkv;
  d.head_size = kD;
  d.dtype = PAGEDATTN_DTYPE_FLOAT32;
  pagedattn_kv_cache* c = nullptr;
  EXPECT_EQ(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
  return c;
}

// Fills every slot of every block of layer 0 with random keys/values.
void fill_cache(pagedattn_kv_cache* c, std::mt19937& rng) {
  const int64_t n = static_cast<int64_t>(kBlocks) * kBs;
  F32 k({n, kHkv, kD}), v({n, kHkv, kD});
  k.randomize(rng);
  v.randomize(rng);
  std::vector<int64_t> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) s[static_cast<size_t>(i)] = i;
  I64 slots(s);
  ASSERT_EQ(pagedattn_kv_cache_write(c, 0, &k.t, &v.t, &slots.t, 1.0f, 1.0f, nullptr),
            PAGEDATTN_OK)
      << pagedattn_last_error();
}

std::vector<uint8_t> read_all(const pagedattn_kv_cache* c) {
  uint64_t bpb = 0;
  pagedattn_kv_cache_desc d;
  d.struct_size = sizeof d;
  EXPECT_EQ(pagedattn_kv_cache_get_desc(&d, c), PAGEDATTN_OK);
  EXPECT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &d), PAGEDATTN_OK);
  std::vector<int32_t> ids(static_cast<size_t>(d.num_blocks));
  for (int32_t i = 0; i < d.num_blocks; ++i) ids[static_cast<size_t>(i)] = i;
  std::vector<uint8_t> buf(bpb * ids.size());
  EXPECT_EQ(pagedattn_kv_cache_read_blocks(c, ids.data(), ids.size(), buf.data(), buf.size(),
                                           nullptr),
            PAGEDATTN_OK)
      << pagedattn_last_error();
  return buf;
}

// One thread's step: its own sequences (ragged, decode and prefill), table, q and out.
struct Step {
  std::vector<int32_t> qlens, clens, table;
  int32_t width = 0;
  int64_t tokens = 0;
  pagedattn_batch* batch = nullptr;
  std::unique_ptr<F32> q, k, v, out, lse;

  // blocks: the ids this step may use (shared read-only, or its own for writes).
  // max_q: the longest query of a prefill sequence.
  void plan(pagedattn_backend* be, pagedattn_kv_cache* c, std::mt19937& rng,
            const std::vector<int32_t>& blocks, int32_t max_q = 9) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 3);
    width = static_cast<int32_t>(blocks.size()) / n;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t q = rng() % 2 ? 1 : 1 + static_cast<int32_t>(rng() % max_q);
      const int32_t maxctx = width * kBs - q;
      qlens.push_back(q);
      clens.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(maxctx + 1)));
      for (int32_t j = 0; j < width; ++j) table.push_back(blocks[static_cast<size_t>(i * width + j)]);
      tokens += q;
    }
    pagedattn_batch_desc d;
    pagedattn_batch_desc_init(&d);
    d.num_seqs = n;
    d.query_lens = qlens.data();
    d.context_lens = clens.data();
    d.block_tables = table.data();
    d.block_table_stride = width;
    ASSERT_EQ(pagedattn_batch_create(&batch, be, c, nullptr, &d), PAGEDATTN_OK)
        << pagedattn_last_error();
    q = std::make_unique<F32>(std::vector<int64_t>{tokens, kH, kD});
    k = std::make_unique<F32>(std::vector<int64_t>{tokens, kHkv, kD});
    v = std::make_unique<F32>(std::vector<int64_t>{tokens, kHkv, kD});
    q->randomize(rng);
    k->randomize(rng);
    v->randomize(rng);
    out = std::make_unique<F32>(std::vector<int64_t>{tokens, kH, kD}, std::nanf(""));
    lse = std::make_unique<F32>(std::vector<int64_t>{tokens, kH}, std::nanf(""));
  }
  pagedattn_status run(pagedattn_backend* be, pagedattn_kv_cache* c, bool write_kv) {
    pagedattn_attention_options o;
    pagedattn_attention_options_init(&o);
    o.num_heads = kH;
    o.num_kv_heads = kHkv;
    o.head_size = kD;
    o.write_kv = write_kv ? 1 : 0;
    return pagedattn_forward(be, batch, c, 0, &o, &q->t, &k->t, &v->t, &out->t, &lse->t, nullptr);
  }
  ~Step() { pagedattn_batch_destroy(batch); }
};

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Starts n threads on fn(thread index) together and joins them.
template <class F>
void together(int n, F fn) {
  std::atomic<int> ready{0};
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      fn(t);
    });
  for (auto& x : th) x.join();
}

}  // namespace

// First in the file: the first pagedattn calls of the process, so plugin probing races here.
TEST(Concurrency, BackendInfoFromManyThreads) {
  const int32_t n = pagedattn_backend_count();
  ASSERT_GT(n, 0);
  std::vector<std::vector<std::string>> seen(kThreads);
  together(kThreads, [&](int t) {
    for (int rep = 0; rep < 3; ++rep)
      for (int32_t i = 0; i < n; ++i) {
        pagedattn_backend_info info{};
        info.struct_size = sizeof info;
        if (pagedattn_backend_get_info(&info, i) != PAGEDATTN_OK) {
          seen[t].push_back("error");
          continue;
        }
        if (rep == 0)
          seen[t].push_back(std::string(info.name) + ":" + std::to_string(info.available) + ":" +
                            info.reason);
      }
  });
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(seen[t], seen[0]) << "thread " << t;
  // And creating every available backend at once.
  together(kThreads, [&](int) {
    for (int32_t i = 0; i < n; ++i) {
      pagedattn_backend_info info{};
      info.struct_size = sizeof info;
      ASSERT_EQ(pagedattn_backend_get_info(&info, i), PAGEDATTN_OK);
      if (!info.available) continue;
      pagedattn_backend* be = nullptr;
      EXPECT_EQ(pagedattn_backend_create(&be, info.name, nullptr), PAGEDATTN_OK)
          << info.name << ": " << pagedattn_last_error();
      pagedattn_backend_destroy(be);
    }
  });
}

// Forwards from many threads on one backend and one (read-only) cache, each with its own batch
// and outputs, match a single-threaded run byte for byte.
TEST(Concurrency, ForwardsSeparateBatches) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  pagedattn_backend* be = make_backend(2);
  pagedattn_kv_cache* c = make_cache(be);
  fill_cache(c, rng);
  std::vector<int32_t> shared(24);
  for (auto& b : shared) b = static_cast<int32_t>(rng() % kBlocks);
  std::vector<std::unique_ptr<Step>> steps;
  std::vector<std::vector<float>> ref_out, ref_lse;
  for (int t = 0; t < kThreads; ++t) {
    steps.push_back(std::make_unique<Step>());
    steps.back()->plan(be, c, rng, shared);
    ASSERT_EQ(steps.back()->run(be, c, false), PAGEDATTN_OK) << pagedattn_last_error();
    ref_out.push_back(steps.back()->out->v);
    ref_lse.push_back(steps.back()->lse->v);
  }
  const auto cache_before = read_all(c);
  std::vector<int> bad(kThreads, 0);
  together(kThreads, [&](int t) {
    for (int rep = 0; rep < 3; ++rep) {
      std::fill(steps[t]->out->v.begin(), steps[t]->out->v.end(), std::nanf(""));
      if (steps[t]->run(be, c, false) != PAGEDATTN_OK) bad[t] |= 1;
      if (!same_bytes(steps[t]->out->v, ref_out[t])) bad[t] |= 2;
      if (!same_bytes(steps[t]->lse->v, ref_lse[t])) bad[t] |= 4;
    }
  });
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(bad[t], 0) << "thread " << t << ": 1 = error, 2 = out differs, 4 = lse differs";
  EXPECT_EQ(read_all(c), cache_before) << "forwards with write_kv = 0 changed the cache";
  steps.clear();
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Forwards that also write their step's keys (write_kv = 1) into disjoint blocks of one cache,
// from many threads: outputs and the final cache equal a sequential run on an identical cache.
TEST(Concurrency, ForwardsWritingDisjointBlocks) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  pagedattn_backend* be = make_backend(2);
  pagedattn_kv_cache* seq = make_cache(be);
  pagedattn_kv_cache* par = make_cache(be);
  std::mt19937 fill_rng(static_cast<uint32_t>(seed + 1));
  fill_cache(seq, fill_rng);
  fill_rng.seed(static_cast<uint32_t>(seed + 1));
  fill_cache(par, fill_rng);
  ASSERT_EQ(read_all(seq), read_all(par));
  std::vector<std::unique_ptr<Step>> steps;
  std::vector<std::vector<float>> ref_out;
  for (int t = 0; t < kThreads; ++t) {
    std::vector<int32_t> own;  // thread t owns blocks t, t + kThreads, ...
    for (int32_t b = t; b < kBlocks; b += kThreads) own.push_back(b);
    steps.push_back(std::make_unique<Step>());
    steps.back()->plan(be, seq, rng, own);
    ASSERT_EQ(steps.back()->run(be, seq, true), PAGEDATTN_OK) << pagedattn_last_error();
    ref_out.push_back(steps.back()->out->v);
  }
  std::vector<int> bad(kThreads, 0);
  together(kThreads, [&](int t) {
    if (steps[t]->run(be, par, true) != PAGEDATTN_OK) bad[t] |= 1;
    if (!same_bytes(steps[t]->out->v, ref_out[t])) bad[t] |= 2;
  });
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(bad[t], 0) << "thread " << t << ": 1 = error, 2 = out differs";
  EXPECT_EQ(read_all(par), read_all(seq)) << "the cache differs from the sequential run";
  steps.clear();
  pagedattn_kv_cache_destroy(seq);
  pagedattn_kv_cache_destroy(par);
  pagedattn_backend_destroy(be);
}

// Many threads on ONE batch (allowed: forwards that do not update it; on CPU they take turns on
// its workspace), each with its own outputs.
TEST(Concurrency, ForwardsSharingOneBatch) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  pagedattn_backend* be = make_backend(2);
  pagedattn_kv_cache* c = make_cache(be);
  fill_cache(c, rng);
  std::vector<int32_t> blocks(16);
  for (auto& b : blocks) b = static_cast<int32_t>(rng() % kBlocks);
  Step s;
  s.plan(be, c, rng, blocks);
  ASSERT_EQ(s.run(be, c, false), PAGEDATTN_OK) << pagedattn_last_error();
  const std::vector<float> ref = s.out->v;
  std::vector<std::vector<float>> outs(kThreads);
  std::vector<pagedattn_status> st(kThreads, PAGEDATTN_OK);
  together(kThreads, [&](int t) {
    F32 out({s.tokens, kH, kD}, std::nanf(""));
    pagedattn_attention_options o;
    pagedattn_attention_options_init(&o);
    o.num_heads = kH;
    o.num_kv_heads = kHkv;
    o.head_size = kD;
    o.write_kv = 0;
    for (int rep = 0; rep < 3 && st[t] == PAGEDATTN_OK; ++rep)
      st[t] = pagedattn_forward(be, s.batch, c, 0, &o, &s.q->t, nullptr, nullptr, &out.t,
                                nullptr, nullptr);
    outs[t] = out.v;
  });
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(st[t], PAGEDATTN_OK) << "thread " << t;
    EXPECT_TRUE(same_bytes(outs[t], ref)) << "thread " << t << ": out differs";
  }
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Cache writes to disjoint slots of one layer from several threads equal the same writes done
// one after another.
TEST(Concurrency, CacheWritesDisjointSlots) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  pagedattn_backend* be = make_backend(2);
  pagedattn_kv_cache* seq = make_cache(be, 2);
  pagedattn_kv_cache* par = make_cache(be, 2);
  // Thread t writes slots t, t + kThreads, ... (interleaved inside blocks), padding included.
  const int64_t nslots = static_cast<int64_t>(kBlocks) * kBs;
  std::vector<std::unique_ptr<F32>> ks, vs;
  std::vector<std::unique_ptr<I64>> slots;
  for (int t = 0; t < kThreads; ++t) {
    std::vector<int64_t> s;
    for (int64_t i = t; i < nslots; i += kThreads) s.push_back(rng() % 5 == 0 ? -1 : i);
    const int64_t n = static_cast<int64_t>(s.size());
    ks.push_back(std::make_unique<F32>(std::vector<int64_t>{n, kHkv, kD}));
    vs.push_back(std::make_unique<F32>(std::vector<int64_t>{n, kHkv, kD}));
    ks.back()->randomize(rng);
    vs.back()->randomize(rng);
    slots.push_back(std::make_unique<I64>(s));
  }
  for (int32_t layer = 0; layer < 2; ++layer)
    for (int t = 0; t < kThreads; ++t)
      ASSERT_EQ(pagedattn_kv_cache_write(seq, layer, &ks[t]->t, &vs[t]->t, &slots[t]->t, 1.0f,
                                         1.0f, nullptr),
                PAGEDATTN_OK)
          << pagedattn_last_error();
  std::vector<int> errors(kThreads, 0);
  together(kThreads, [&](int t) {
    for (int32_t layer = 0; layer < 2; ++layer)
      if (pagedattn_kv_cache_write(par, layer, &ks[t]->t, &vs[t]->t, &slots[t]->t, 1.0f, 1.0f,
                                   nullptr) != PAGEDATTN_OK)
        ++errors[t];
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], 0) << "thread " << t;
  EXPECT_EQ(read_all(par), read_all(seq)) << "concurrent writes differ from sequential ones";
  pagedattn_kv_cache_destroy(seq);
  pagedattn_kv_cache_destroy(par);
  pagedattn_backend_destroy(be);
}

// Backends, caches and batches created and destroyed from many threads at once, in every
// order (a backend destroyed before its caches stays alive until the last one goes).
TEST(Concurrency, HandlesCreatedAndDestroyed) {
  std::vector<int> errors(kThreads, 0);
  pagedattn_backend* shared = make_backend(1);
  together(kThreads, [&](int t) {
    for (int rep = 0; rep < 6; ++rep) {
      pagedattn_backend* be = (rep + t) % 2 ? shared : nullptr;
      pagedattn_backend* own = nullptr;
      if (!be) {
        pagedattn_backend_options o;
        pagedattn_backend_options_init(&o);
        o.num_threads = 1 + (rep % 2);
        if (pagedattn_backend_create(&own, pat::backend_name().c_str(), &o) != PAGEDATTN_OK) {
          ++errors[t];
          continue;
        }
        be = own;
      }
      pagedattn_kv_cache_desc d;
      pagedattn_kv_cache_desc_init(&d);
      d.num_layers = 1;
      d.num_blocks = 4;
      d.block_size = 4;
      d.num_kv_heads = 1;
      d.head_size = 8;
      d.dtype = PAGEDATTN_DTYPE_FLOAT32;
      pagedattn_kv_cache* c = nullptr;
      if (pagedattn_kv_cache_create(&c, be, &d) != PAGEDATTN_OK) ++errors[t];
      const int32_t ql[2] = {1, 3}, cl[2] = {2, 0}, tab[2] = {rep % 4, (rep + 1) % 4};
      pagedattn_batch_desc bd;
      pagedattn_batch_desc_init(&bd);
      bd.num_seqs = 2;
      bd.query_lens = ql;
      bd.context_lens = cl;
      bd.block_tables = tab;
      bd.block_table_stride = 1;
      pagedattn_batch* b = nullptr;
      if (pagedattn_batch_create(&b, be, c, nullptr, &bd) != PAGEDATTN_OK) ++errors[t];
      // Destruction order varies: backend first (kept alive by its children), or last.
      if (own && rep % 3 == 0) {
        pagedattn_backend_destroy(own);
        own = nullptr;
      }
      if (rep % 2) {
        pagedattn_kv_cache_destroy(c);
        pagedattn_batch_destroy(b);
      } else {
        pagedattn_batch_destroy(b);
        pagedattn_kv_cache_destroy(c);
      }
      pagedattn_backend_destroy(own);
    }
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], 0) << "thread " << t;
  pagedattn_backend_destroy(shared);
}

// The last error is per thread: concurrent failures each see their own message.
TEST(Concurrency, LastErrorPerThread) {
  std::vector<int> wrong(kThreads, 0);
  together(kThreads, [&](int t) {
    for (int rep = 0; rep < 50; ++rep) {
      pagedattn_kv_cache_desc d;
      pagedattn_kv_cache_desc_init(&d);
      d.num_layers = -(t * 100 + rep);  // a value naming the thread and round
      d.num_blocks = 1;
      d.block_size = 1;
      d.num_kv_heads = 1;
      d.head_size = 8;
      uint64_t bpb = 0;
      if (pagedattn_kv_cache_bytes_per_block(&bpb, &d) != PAGEDATTN_ERROR_INVALID_ARGUMENT)
        ++wrong[t];
      std::this_thread::yield();
      const std::string want = "num_layers = " + std::to_string(d.num_layers);
      if (std::string(pagedattn_last_error()).find(want) == std::string::npos) ++wrong[t];
    }
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
}

// The log callback replaced while other threads fail calls: each thread's message reaches the
// callback in place whole, and a callback replaced is never called after the setter returns.
TEST(Concurrency, LogCallbackReplacedWhileLogging) {
  struct Sink {
    std::atomic<bool> retired{false};
    std::atomic<int> calls{0}, late{0}, garbled{0};
  };
  Sink sinks[2];
  const pagedattn_log_fn fn = [](void* user, pagedattn_log_level, const char* msg) {
    auto* s = static_cast<Sink*>(user);
    s->calls++;
    if (s->retired.load()) s->late++;
    if (std::strstr(msg, "PAGEDATTN_ERROR_NULL_POINTER: desc is NULL") != msg) s->garbled++;
  };
  std::atomic<bool> stop{false};
  std::vector<std::thread> loggers;
  for (int t = 0; t < kThreads - 1; ++t)
    loggers.emplace_back([&] {
      while (!stop.load()) (void)pagedattn_batch_desc_init(nullptr);
    });
  // Each round waits until a logger has reached the new callback, so every replacement races a
  // logger even where the threads share two cores; the deadline keeps a broken logger from
  // hanging the test (the checks below then fail).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int round = 0; round < 200; ++round) {
    Sink& next = sinks[round % 2];
    next.retired = false;
    const int before = next.calls.load();
    ASSERT_EQ(pagedattn_set_log_callback(fn, &next, PAGEDATTN_LOG_ERROR), PAGEDATTN_OK);
    sinks[(round + 1) % 2].retired = true;  // replaced: must not be called from here on
    while (next.calls.load() == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  ASSERT_EQ(pagedattn_set_log_callback(nullptr, nullptr, PAGEDATTN_LOG_ERROR), PAGEDATTN_OK);
  stop = true;
  for (auto& th : loggers) th.join();
  for (const Sink& s : sinks) {
    EXPECT_GT(s.calls.load(), 0);
    EXPECT_EQ(s.late.load(), 0) << "a replaced callback was called after the setter returned";
    EXPECT_EQ(s.garbled.load(), 0);
  }
}

// merge_states from many threads on one backend, each on its own tensors.
TEST(Concurrency, MergeStatesFromManyThreads) {
  pagedattn_backend* be = make_backend(2);
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::vector<std::vector<float>> ref(kThreads), got(kThreads);
  auto run = [&](int t, std::vector<float>& result) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + static_cast<uint32_t>(t));
    F32 o1({5, kH, kD}), o2({5, kH, kD}), l1({5, kH}), l2({5, kH}), out({5, kH, kD});
    o1.randomize(rng);
    o2.randomize(rng);
    l1.randomize(rng);
    l2.randomize(rng);
    const pagedattn_status st =
        pagedattn_merge_states(be, &out.t, nullptr, &o1.t, &l1.t, &o2.t, &l2.t, nullptr);
    result = out.v;
    return st;
  };
  for (int t = 0; t < kThreads; ++t) ASSERT_EQ(run(t, ref[t]), PAGEDATTN_OK) << pagedattn_last_error();
  std::vector<pagedattn_status> st(kThreads);
  together(kThreads, [&](int t) { st[t] = run(t, got[t]); });
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(st[t], PAGEDATTN_OK);
    EXPECT_TRUE(same_bytes(got[t], ref[t])) << "thread " << t;
  }
  pagedattn_backend_destroy(be);
}

// The worker pool spins PAGEDATTN_CPU_SPIN_US microseconds between calls before it sleeps: with
// no spin (every call wakes sleeping workers), a 1 us spin (calls find them in either state) and
// a long one (always awake), calls in a row, calls after a pause and calls from several threads
// give the bytes of a one-thread backend (no pool). These shapes stay under split-KV's 512 keys,
// so every pool size runs the same items; queries up to 40 tokens also take onednn's own pool
// (chunks of 16 and more).
TEST(Concurrency, PoolSpinSettings) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  const char* old = std::getenv("PAGEDATTN_CPU_SPIN_US");
  const std::string saved = old ? old : "";
  std::vector<int32_t> blocks(24);
  {
    std::mt19937 r(static_cast<uint32_t>(seed) + 7);
    for (auto& b : blocks) b = static_cast<int32_t>(r() % kBlocks);
  }
  // Each backend gets the same cache contents and the same steps (same rng seeds).
  auto outputs = [&](pagedattn_backend* be, bool threaded, std::vector<std::vector<float>>* got) {
    pagedattn_kv_cache* c = make_cache(be);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    fill_cache(c, rng);
    std::vector<std::unique_ptr<Step>> steps;
    for (int t = 0; t < kThreads; ++t) {
      steps.push_back(std::make_unique<Step>());
      steps.back()->plan(be, c, rng, blocks, 40);
    }
    got->assign(2 * kThreads, {});
    std::vector<int> bad(kThreads, 0);
    for (int t = 0; t < kThreads; ++t) {  // in a row, then after a pause longer than a short spin
      for (int rep = 0; rep < 8; ++rep) {
        if (rep == 4) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::fill(steps[t]->out->v.begin(), steps[t]->out->v.end(), std::nanf(""));
        std::fill(steps[t]->lse->v.begin(), steps[t]->lse->v.end(), std::nanf(""));
        if (steps[t]->run(be, c, false) != PAGEDATTN_OK) bad[t] |= 1;
        if (rep > 0 && !same_bytes(steps[t]->out->v, (*got)[t])) bad[t] |= 2;
        (*got)[t] = steps[t]->out->v;
      }
      (*got)[kThreads + t] = steps[t]->lse->v;
    }
    if (threaded)
      together(kThreads, [&](int t) {
        for (int rep = 0; rep < 4; ++rep) {
          std::fill(steps[t]->out->v.begin(), steps[t]->out->v.end(), std::nanf(""));
          if (steps[t]->run(be, c, false) != PAGEDATTN_OK) bad[t] |= 1;
          if (!same_bytes(steps[t]->out->v, (*got)[t])) bad[t] |= 2;
        }
      });
    for (int t = 0; t < kThreads; ++t)
      EXPECT_EQ(bad[t], 0) << "thread " << t << ": 1 = error, 2 = out differs between calls";
    steps.clear();
    pagedattn_kv_cache_destroy(c);
  };
  std::vector<std::vector<float>> ref;
  {
    pagedattn_backend* one = make_backend(1);
    ASSERT_NE(one, nullptr);
    outputs(one, false, &ref);
    pagedattn_backend_destroy(one);
  }
  for (const char* spin : {"0", "1", "20000"}) {
    SCOPED_TRACE(std::string("PAGEDATTN_CPU_SPIN_US=") + spin);
    setenv("PAGEDATTN_CPU_SPIN_US", spin, 1);
    pagedattn_backend* be = make_backend(3);
    if (old) setenv("PAGEDATTN_CPU_SPIN_US", saved.c_str(), 1);
    else unsetenv("PAGEDATTN_CPU_SPIN_US");
    ASSERT_NE(be, nullptr);
    std::vector<std::vector<float>> got;
    outputs(be, true, &got);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_bytes(got[i], ref[i])) << (i < kThreads ? "out" : "lse") << " of step "
                                              << i % kThreads << " differs from one thread";
    pagedattn_backend_destroy(be);
  }
}
