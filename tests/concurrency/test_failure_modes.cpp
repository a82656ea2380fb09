// Failure modes: out of memory on cache and batch creation (the backend's memory_limit, and
// absurd sizes) is a status, never a crash, and leaves nothing behind: the limit's accounting is
// intact afterwards and (under scripts/sanitize) LeakSanitizer sees no leak. Plugin files that
// are missing/truncated/not ELF/wrong ABI/failing init are covered per process in tests/plugins.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "pagedattn_test_support.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAT_HAS_ASAN 1
#endif
#endif
#ifndef PAT_HAS_ASAN
#define PAT_HAS_ASAN 0
#endif

namespace {

pagedattn_backend* limited_backend(uint64_t limit) {
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.num_threads = 1;
  o.memory_limit = limit;
  pagedattn_backend* be = nullptr;
  EXPECT_EQ(pagedattn_backend_create(&be, pat::backend_name().c_str(), &o), PAGEDATTN_OK)
      << pagedattn_last_error();
  return be;
}

pagedattn_kv_cache_desc geometry(int32_t blocks) {
  pagedattn_kv_cache_desc d;
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = 2;
  d.num_blocks = blocks;
  d.block_size = 16;
  d.num_kv_heads = 2;
  d.head_size = 64;
  d.dtype = PAGEDATTN_DTYPE_FLOAT32;
  return d;
}

// One layer of `blocks` blocks of 4 slots, one KV head of 8 dims: small enough to check whole.
pagedattn_kv_cache_desc one_head_geometry(int32_t blocks) {
  pagedattn_kv_cache_desc d = geometry(blocks);
  d.num_layers = 1;
  d.num_kv_heads = 1;
  d.head_size = 8;
  d.block_size = 4;
  return d;
}

// A compact CPU tensor over p (set .strides for another layout).
pagedattn_tensor tensor(void* p, int64_t* shape, int32_t nd, uint8_t code = PAGEDATTN_DLPACK_FLOAT,
                        uint8_t bits = 32) {
  pagedattn_tensor t{};
  t.data = p;
  t.device = {PAGEDATTN_DEVICE_CPU, 0};
  t.ndim = nd;
  t.dtype = {code, bits, 1};
  t.shape = shape;
  return t;
}

bool message_has(const char* needle) {
  return std::string(pagedattn_last_error()).find(needle) != std::string::npos;
}

}  // namespace

// Over the limit: OUT_OF_MEMORY naming the limit, *out untouched; failures do not eat into the
// limit, and destroying caches gives their bytes back.
TEST(FailureModes, CacheOverMemoryLimit) {
  auto d = geometry(1);
  uint64_t bpb = 0;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &d), PAGEDATTN_OK);
  const int32_t fit = 8;
  // A little slack: a backend may round each allocation up (alignment).
  pagedattn_backend* be = limited_backend(bpb * fit + 4096);
  ASSERT_NE(be, nullptr);
  auto* const sentinel = reinterpret_cast<pagedattn_kv_cache*>(uintptr_t{0x1230});
  for (int rep = 0; rep < 20; ++rep) {
    pagedattn_kv_cache* c = sentinel;
    d = geometry(fit + 1 + rep);
    ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_OUT_OF_MEMORY)
        << pagedattn_last_error();
    EXPECT_EQ(c, sentinel) << "*out written on failure";
    EXPECT_TRUE(message_has("memory_limit")) << pagedattn_last_error();
  }
  // The whole limit is still available, in one cache or in several; and again after destroy.
  for (int rep = 0; rep < 3; ++rep) {
    pagedattn_kv_cache* a = nullptr;
    pagedattn_kv_cache* b = nullptr;
    pagedattn_kv_cache* extra = nullptr;
    d = geometry(fit / 2);
    ASSERT_EQ(pagedattn_kv_cache_create(&a, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
    ASSERT_EQ(pagedattn_kv_cache_create(&b, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
    d = geometry(1);
    EXPECT_EQ(pagedattn_kv_cache_create(&extra, be, &d), PAGEDATTN_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(extra, nullptr);
    pagedattn_kv_cache_destroy(a);
    pagedattn_kv_cache_destroy(b);
    d = geometry(fit);
    ASSERT_EQ(pagedattn_kv_cache_create(&a, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
    pagedattn_kv_cache_destroy(a);
  }
  pagedattn_backend_destroy(be);
}

// A cache far larger than any machine, without a limit: OUT_OF_MEMORY (or OVERFLOW), no crash.
TEST(FailureModes, AbsurdCacheWithoutLimit) {
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc d = geometry(1 << 30);  // 2^30 blocks x 256 KiB = 2^48 bytes
  d.block_size = 256;
  d.num_kv_heads = 4;
  pagedattn_kv_cache* c = nullptr;
  const pagedattn_status st = pagedattn_kv_cache_create(&c, be, &d);
  EXPECT_TRUE(st == PAGEDATTN_ERROR_OUT_OF_MEMORY || st == PAGEDATTN_ERROR_OVERFLOW)
      << pagedattn_status_string(st) << ": " << pagedattn_last_error();
  EXPECT_EQ(c, nullptr);
  // Still fully usable.
  d = geometry(4);
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Batch capacities for graph replay far beyond memory: an error, not a crash or a multi-GB
// allocation, and the backend keeps working.
TEST(FailureModes, AbsurdBatchCapacities) {
#if defined(__SANITIZE_ADDRESS__) || PAT_HAS_ASAN
  GTEST_SKIP() << "skipped under ASan: its throwing operator new aborts on a failed allocation "
                  "instead of throwing std::bad_alloc";
#endif
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc cd = geometry(16);
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &cd), PAGEDATTN_OK) << pagedattn_last_error();
  const int32_t ql[1] = {3}, cl[1] = {5}, table[1] = {2};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 1;
  bd.query_lens = ql;
  bd.context_lens = cl;
  bd.block_tables = table;
  bd.block_table_stride = 1;
  // Tables alone: 2^20 x 2^30 entries. (Capacities that each fit but add up to tens of GB, e.g.
  // max_num_seqs = INT32_MAX, are reserved one by one before failing: slow under ASan.)
  bd.max_num_seqs = 1 << 20;
  bd.max_blocks_per_seq = 1 << 30;
  bd.max_num_tokens = INT32_MAX;
  bd.max_seq_len = INT64_MAX / 2;
  auto* const sentinel = reinterpret_cast<pagedattn_batch*>(uintptr_t{0x4560});
  pagedattn_batch* b = sentinel;
  const pagedattn_status st = pagedattn_batch_create(&b, be, c, nullptr, &bd);
  std::printf("  absurd capacities: %s \"%s\"\n", pagedattn_status_string(st), pagedattn_last_error());
  EXPECT_TRUE(st == PAGEDATTN_ERROR_OUT_OF_MEMORY || st == PAGEDATTN_ERROR_OVERFLOW ||
              st == PAGEDATTN_ERROR_INVALID_ARGUMENT)
      << pagedattn_status_string(st) << ": " << pagedattn_last_error();
  EXPECT_EQ(b, sentinel) << "*out written on failure";
  bd.max_num_seqs = bd.max_blocks_per_seq = 0;
  bd.max_num_tokens = bd.max_seq_len = 0;
  b = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&b, be, c, nullptr, &bd), PAGEDATTN_OK)
      << pagedattn_last_error();
  pagedattn_batch_destroy(b);
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// backend.h: memory_limit bounds "caches and batch workspaces". A batch whose planned capacity
// needs more than the limit must be refused with OUT_OF_MEMORY.
TEST(FailureModes, BatchWorkspaceOverMemoryLimit) {
  pagedattn_backend* be = limited_backend(1 << 20);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc cd = geometry(4);
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &cd), PAGEDATTN_OK) << pagedattn_last_error();
  const int32_t ql[1] = {1}, cl[1] = {0}, table[1] = {0};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 1;
  bd.query_lens = ql;
  bd.context_lens = cl;
  bd.block_tables = table;
  bd.block_table_stride = 1;
  // 65536 sequences x 4096 table entries x 4 bytes = 1 GiB of tables alone.
  bd.max_num_seqs = 1 << 16;
  bd.max_blocks_per_seq = 1 << 12;
  bd.max_num_tokens = 1 << 16;
  pagedattn_batch* b = nullptr;
  const pagedattn_status st = pagedattn_batch_create(&b, be, c, nullptr, &bd);
  std::printf("  workspace over the limit: %s \"%s\"\n", pagedattn_status_string(st), pagedattn_last_error());
  EXPECT_EQ(st, PAGEDATTN_ERROR_OUT_OF_MEMORY)
      << pagedattn_status_string(st) << ": " << pagedattn_last_error();
  pagedattn_batch_destroy(b);
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Errors stay useful: a sample of bad calls across the API, each message naming the offending
// argument and its value. Every message is printed, so the log doubles as a review sample.
namespace {

struct BadCall {
  const char* what;
  pagedattn_status want;
  std::vector<std::string> needles;  // all must appear in the message
  std::function<pagedattn_status()> call;
};

}  // namespace

TEST(ErrorMessages, NameTheArgumentAndValue) {
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc cd = geometry(8);  // Hkv 2, D 64, bs 16, f32, 2 layers
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &cd), PAGEDATTN_OK);
  const int32_t ql[2] = {1, 2}, cl[2] = {3, 0}, table[2] = {1, 2};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 2;
  bd.query_lens = ql;
  bd.context_lens = cl;
  bd.block_tables = table;
  bd.block_table_stride = 1;
  pagedattn_batch* batch = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, c, nullptr, &bd), PAGEDATTN_OK);

  // Tensors for forward/write: 3 tokens, H 4, Hkv 2, D 64, float32.
  std::vector<float> qbuf(3 * 4 * 64), kbuf(3 * 2 * 64), vbuf(3 * 2 * 64), obuf(3 * 4 * 64);
  int64_t qs[3] = {3, 4, 64}, ks[3] = {3, 2, 64}, bad_ks[3] = {3, 2, 32};
  pagedattn_tensor q = tensor(qbuf.data(), qs, 3, PAGEDATTN_DLPACK_FLOAT, 32);
  pagedattn_tensor k = tensor(kbuf.data(), ks, 3, PAGEDATTN_DLPACK_FLOAT, 32);
  pagedattn_tensor v = tensor(vbuf.data(), ks, 3, PAGEDATTN_DLPACK_FLOAT, 32);
  pagedattn_tensor out = tensor(obuf.data(), qs, 3, PAGEDATTN_DLPACK_FLOAT, 32);
  pagedattn_tensor k_bad = tensor(kbuf.data(), bad_ks, 3, PAGEDATTN_DLPACK_FLOAT, 32);
  pagedattn_tensor q_f16 = tensor(qbuf.data(), qs, 3, PAGEDATTN_DLPACK_FLOAT, 16);
  int64_t big_stride[3] = {4 * 64, 64, 2};
  pagedattn_tensor q_strided = q;
  q_strided.strides = big_stride;
  pagedattn_tensor q_gpu = q;
  q_gpu.device = {PAGEDATTN_DEVICE_CUDA, 1};
  int64_t slots_v[3] = {5, 9999, 7}, slots_n[1] = {3};
  pagedattn_tensor slots = tensor(slots_v, slots_n, 1, PAGEDATTN_DLPACK_INT, 64);
  auto opts = [](void (*tweak)(pagedattn_attention_options*)) {
    pagedattn_attention_options o;
    pagedattn_attention_options_init(&o);
    o.num_heads = 4;
    o.num_kv_heads = 2;
    o.head_size = 64;
    if (tweak) tweak(&o);
    return o;
  };
  auto fwd = [&](pagedattn_attention_options o, const pagedattn_tensor* qq,
                 const pagedattn_tensor* kk, int32_t layer) {
    return pagedattn_forward(be, batch, c, layer, &o, qq, kk, &v, &out, nullptr, nullptr);
  };

  std::vector<BadCall> calls = {
      {"unknown backend", PAGEDATTN_ERROR_UNKNOWN_BACKEND, {"nosuchbackend"},
       [] {
         pagedattn_backend* b = nullptr;
         return pagedattn_backend_create(&b, "nosuchbackend", nullptr);
       }},
      {"negative thread count", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"num_threads", "-3"},
       [] {
         pagedattn_backend_options o;
         pagedattn_backend_options_init(&o);
         o.num_threads = -3;
         pagedattn_backend* b = nullptr;
         return pagedattn_backend_create(&b, "cpu", &o);
       }},
      {"backend info index", PAGEDATTN_ERROR_OUT_OF_RANGE, {"index", "99"},
       [] {
         pagedattn_backend_info i{};
         i.struct_size = sizeof i;
         return pagedattn_backend_get_info(&i, 99);
       }},
      {"cache head size", PAGEDATTN_ERROR_UNSUPPORTED, {"head_size", "12"},
       [&] {
         pagedattn_kv_cache_desc d = geometry(4);
         d.head_size = 12;
         pagedattn_kv_cache* x = nullptr;
         return pagedattn_kv_cache_create(&x, be, &d);
       }},
      {"cache block size", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"block_size", "24"},
       [&] {
         pagedattn_kv_cache_desc d = geometry(4);
         d.block_size = 24;
         pagedattn_kv_cache* x = nullptr;
         return pagedattn_kv_cache_create(&x, be, &d);
       }},
      {"cache desc struct_size", PAGEDATTN_ERROR_STRUCT_SIZE, {"struct_size", "3"},
       [&] {
         pagedattn_kv_cache_desc d = geometry(4);
         d.struct_size = 3;
         pagedattn_kv_cache* x = nullptr;
         return pagedattn_kv_cache_create(&x, be, &d);
       }},
      {"write layer", PAGEDATTN_ERROR_OUT_OF_RANGE, {"layer", "7"},
       [&] { return pagedattn_kv_cache_write(c, 7, &k, &v, &slots, 1, 1, nullptr); }},
      {"write slot", PAGEDATTN_ERROR_OUT_OF_RANGE, {"slot_mapping[1]", "9999"},
       [&] { return pagedattn_kv_cache_write(c, 0, &k, &v, &slots, 1, 1, nullptr); }},
      {"write key shape", PAGEDATTN_ERROR_BAD_TENSOR, {"key", "32"},
       [&] { return pagedattn_kv_cache_write(c, 0, &k_bad, &v, &slots, 1, 1, nullptr); }},
      {"copy pair", PAGEDATTN_ERROR_OUT_OF_RANGE, {"pairs[1]", "77"},
       [&] {
         const int32_t pairs[2] = {1, 77};
         return pagedattn_kv_cache_copy_blocks(c, pairs, 1, nullptr);
       }},
      {"read buffer size", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"buffer_bytes", "10"},
       [&] {
         const int32_t ids[1] = {0};
         char buf[16];
         return pagedattn_kv_cache_read_blocks(c, ids, 1, buf, 10, nullptr);
       }},
      {"batch block id", PAGEDATTN_ERROR_OUT_OF_RANGE, {"block_tables[1][0]", "900", "8"},
       [&] {
         const int32_t t2[2] = {1, 900};
         pagedattn_batch_desc d = bd;
         d.block_tables = t2;
         pagedattn_batch* x = nullptr;
         return pagedattn_batch_create(&x, be, c, nullptr, &d);
       }},
      {"batch negative length", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"query_lens[1]", "-2"},
       [&] {
         const int32_t q2[2] = {1, -2};
         pagedattn_batch_desc d = bd;
         d.query_lens = q2;
         pagedattn_batch* x = nullptr;
         return pagedattn_batch_create(&x, be, c, nullptr, &d);
       }},
      {"batch short row", PAGEDATTN_ERROR_OUT_OF_RANGE, {"block_table_stride", "1", "sequence 0"},
       [&] {
         const int32_t c2[2] = {40, 0};
         pagedattn_batch_desc d = bd;
         d.context_lens = c2;
         pagedattn_batch* x = nullptr;
         return pagedattn_batch_create(&x, be, c, nullptr, &d);
       }},
      {"forward heads", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"num_heads", "5"},
       [&] {
         return fwd(opts([](pagedattn_attention_options* o) { o->num_heads = 5; }), &q, &k, 0);
       }},
      {"forward window", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"sliding_window", "-1"},
       [&] {
         return fwd(opts([](pagedattn_attention_options* o) { o->sliding_window = -1; }), &q, &k,
                    0);
       }},
      {"forward scale", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"scale", "nan"},
       [&] {
         return fwd(opts([](pagedattn_attention_options* o) { o->scale = std::nanf(""); }), &q,
                    &k, 0);
       }},
      {"forward flags", PAGEDATTN_ERROR_INVALID_ARGUMENT, {"flags", "0x8"},
       [&] { return fwd(opts([](pagedattn_attention_options* o) { o->flags = 8; }), &q, &k, 0); }},
      {"forward options struct_size", PAGEDATTN_ERROR_STRUCT_SIZE, {"struct_size", "7"},
       [&] {
         return fwd(opts([](pagedattn_attention_options* o) { o->struct_size = 7; }), &q, &k, 0);
       }},
      {"forward layer", PAGEDATTN_ERROR_OUT_OF_RANGE, {"layer", "2"},
       [&] { return fwd(opts(nullptr), &q, &k, 2); }},
      {"forward q dtype", PAGEDATTN_ERROR_BAD_TENSOR, {"q", "float16"},
       [&] { return fwd(opts(nullptr), &q_f16, &k, 0); }},
      {"forward q stride", PAGEDATTN_ERROR_BAD_TENSOR, {"q", "stride", "2"},
       [&] { return fwd(opts(nullptr), &q_strided, &k, 0); }},
      {"forward q device", PAGEDATTN_ERROR_WRONG_DEVICE, {"q", "cuda:1"},
       [&] { return fwd(opts(nullptr), &q_gpu, &k, 0); }},
      {"forward k shape", PAGEDATTN_ERROR_BAD_TENSOR, {"k", "32", "64"},
       [&] { return fwd(opts(nullptr), &q, &k_bad, 0); }},
      {"dlpack dtype", PAGEDATTN_ERROR_UNSUPPORTED, {"code 7", "bits 16"},
       [] {
         pagedattn_dtype dt;
         pagedattn_dlpack_dtype d{7, 16, 1};
         return pagedattn_dtype_from_dlpack(&dt, d);
       }},
  };
  int bad = 0;
  for (const auto& bc : calls) {
    const pagedattn_status st = bc.call();
    const std::string msg = pagedattn_last_error();
    std::printf("  %-28s %-34s \"%s\"\n", bc.what, pagedattn_status_string(st), msg.c_str());
    bool ok = st == bc.want;
    for (const auto& n : bc.needles) ok = ok && msg.find(n) != std::string::npos;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << bc.what << ": got " << pagedattn_status_string(st) << " \"" << msg
                    << "\", want " << pagedattn_status_string(bc.want) << " naming every one of "
                    << ::testing::PrintToString(bc.needles);
    }
  }
  EXPECT_EQ(bad, 0);
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Regression: the core's host copy of the block tables is num_seqs x max_blocks_per_seq int32,
// zero-filled at every plan (lib/planner.cpp plan(), reserved in reserve_plan), and was not
// counted against memory_limit: 64 MiB was allocated under a 4 MiB limit and the batch created.
// Found by tests/fuzz (fuzz_batch: 2.4 GB allocated under a 512 MiB limit). The batch's host
// metadata is now charged like cache memory, before it is allocated.
TEST(FailureModes, BatchHostTablesOverMemoryLimit) {
  pagedattn_backend* be = limited_backend(4 << 20);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc cd = geometry(4);
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &cd), PAGEDATTN_OK) << pagedattn_last_error();
  const int32_t ql[4] = {1, 1, 1, 1}, cl[4] = {0, 0, 0, 0}, table[4] = {0, 1, 2, 3};
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = 4;
  bd.query_lens = ql;
  bd.context_lens = cl;
  bd.block_tables = table;
  bd.block_table_stride = 1;
  bd.max_blocks_per_seq = 1 << 22;  // 4 x 4M entries x 4 bytes = 64 MiB of host tables
  pagedattn_batch* b = nullptr;
  const pagedattn_status st = pagedattn_batch_create(&b, be, c, nullptr, &bd);
  std::printf("  host tables over the limit: %s \"%s\"\n", pagedattn_status_string(st),
              pagedattn_last_error());
  EXPECT_EQ(st, PAGEDATTN_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(message_has("memory_limit")) << pagedattn_last_error();
  pagedattn_batch_destroy(b);
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Regression: tensor strides whose extent overflows int64 byte offsets were accepted (only the
// innermost stride was checked), and the kernel then computed the row address with a signed
// overflow and read a wild address (kernels/cpu/write.cpp cache_write_rows: UBSan "signed
// integer overflow", then SEGV). Found by tests/fuzz (fuzz_cache). lib/validate.cpp
// check_extent now refuses it with PAGEDATTN_ERROR_OVERFLOW naming "value".
TEST(FailureModes, TensorStrideOverflowRefused) {
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc d = one_head_geometry(4);
  pagedattn_kv_cache* c = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_OK) << pagedattn_last_error();
  // A patterned cache and non-zero rows, so that any write the refusal let through would show.
  uint64_t bpb = 0;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &d), PAGEDATTN_OK);
  std::vector<uint8_t> image(bpb * 4);
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(i * 37 + 11);
  const int32_t ids[4] = {0, 1, 2, 3};
  ASSERT_EQ(pagedattn_kv_cache_load_blocks(c, ids, 4, image.data(), image.size(), nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  std::vector<float> k(3 * 8, 1.5f), v(3 * 8, -2.5f);
  int64_t shape[3] = {3, 1, 8};
  int64_t huge[3] = {INT64_MAX / 3, 8, 1};  // row 2 starts at byte 8 * (INT64_MAX / 3)
  pagedattn_tensor kt = tensor(k.data(), shape, 3);
  pagedattn_tensor vt = tensor(v.data(), shape, 3);
  vt.strides = huge;
  int64_t slots[3] = {-1, -1, 5}, sshape[1] = {3};
  pagedattn_tensor st = tensor(slots, sshape, 1, PAGEDATTN_DLPACK_INT, 64);
  const pagedattn_status s = pagedattn_kv_cache_write(c, 0, &kt, &vt, &st, 1, 1, nullptr);
  EXPECT_EQ(s, PAGEDATTN_ERROR_OVERFLOW) << pagedattn_status_string(s) << ": " << pagedattn_last_error();
  // "value: byte_offset 0 + element offsets [0, 6148914691236517212] x 4 bytes overflow int64"
  EXPECT_TRUE(message_has("value: byte_offset 0 + element offsets [0, ")) << pagedattn_last_error();
  EXPECT_TRUE(message_has("overflow int64")) << pagedattn_last_error();
  std::vector<uint8_t> after(image.size());
  ASSERT_EQ(pagedattn_kv_cache_read_blocks(c, ids, 4, after.data(), after.size(), nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  EXPECT_TRUE(after == image) << "a refused write changed the cache";
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

// Regression: a size-1 dimension's stride is never multiplied by a non-zero index, so callers
// (DLPack producers) may leave any value there and validation accepts it; the CPU decode path
// still formed stride x element size (kernels/cpu/prefetch-inl.h TileSpans: UBSan "signed integer
// overflow"). Found by tests/fuzz (fuzz_forward). lib/validate.cpp now gives such dimensions the
// compact stride: the call runs and gives the compact call's bits.
TEST(FailureModes, SizeOneDimensionHugeStride) {
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  const int T = 3, H = 2, D = 8;  // one KV head: k/v dim 1 has size 1
  int32_t qlen[1] = {T}, ctx[1] = {0};
  pagedattn_batch_desc bd;
  ASSERT_EQ(pagedattn_batch_desc_init(&bd), PAGEDATTN_OK);
  bd.num_seqs = 1;
  bd.query_lens = qlen;
  bd.context_lens = ctx;
  pagedattn_batch* b = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&b, be, nullptr, nullptr, &bd), PAGEDATTN_OK)
      << pagedattn_last_error();
  pagedattn_attention_options o;
  ASSERT_EQ(pagedattn_attention_options_init(&o), PAGEDATTN_OK);
  o.num_heads = H;
  o.num_kv_heads = 1;
  o.head_size = D;
  o.attention_type = PAGEDATTN_ATTENTION_ENCODER_ONLY;
  o.write_kv = 0;
  std::vector<float> q(T * H * D), k(T * D), v(T * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>((i * 7) % 11) - 0.5f;
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.2f * static_cast<float>((i * 5) % 13) - 1.0f;
    v[i] = 0.3f * static_cast<float>((i * 3) % 7) - 0.9f;
  }
  int64_t qs[3] = {T, H, D}, ks[3] = {T, 1, D};
  int64_t huge[3] = {D, INT64_MAX - 5, 1};
  std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
  pagedattn_tensor qt = tensor(q.data(), qs, 3), kt = tensor(k.data(), ks, 3),
                   vt = tensor(v.data(), ks, 3), ot = tensor(want.data(), qs, 3);
  ASSERT_EQ(pagedattn_forward(be, b, nullptr, 0, &o, &qt, &kt, &vt, &ot, nullptr, nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  kt.strides = huge;
  vt.strides = huge;
  ot.data = got.data();
  ASSERT_EQ(pagedattn_forward(be, b, nullptr, 0, &o, &qt, &kt, &vt, &ot, nullptr, nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  EXPECT_EQ(memcmp(want.data(), got.data(), sizeof(float) * want.size()), 0);
  EXPECT_FALSE(std::isnan(got[0]));
  pagedattn_batch_destroy(b);
  pagedattn_backend_destroy(be);
}

// The same for a wrapped cache: one KV head, so its head stride is never multiplied by a
// non-zero head index and the wrap accepts any value; the decode formed head stride x element
// size (UBSan "signed integer overflow" in TileSpans). A dimension of extent 1 now keeps the
// compact stride. And strides whose element offsets fit int64 but whose byte offsets do not are
// refused.
TEST(FailureModes, WrappedCacheSizeOneHeadHugeStride) {
  pagedattn_backend* be = limited_backend(0);
  ASSERT_NE(be, nullptr);
  pagedattn_kv_cache_desc d = one_head_geometry(2);
  std::vector<float> kmem(2 * 4 * 8), vmem(2 * 4 * 8);
  for (size_t i = 0; i < kmem.size(); ++i) {
    kmem[i] = 0.25f * static_cast<float>((i * 5) % 9) - 1.0f;
    vmem[i] = 0.5f * static_cast<float>((i * 3) % 7) - 1.5f;
  }
  void* kp[1] = {kmem.data()};
  void* vp[1] = {vmem.data()};
  pagedattn_kv_cache_memory m{};
  m.struct_size = sizeof m;
  m.k_layers = kp;
  m.v_layers = vp;
  m.device = {PAGEDATTN_DEVICE_CPU, 0};
  pagedattn_kv_cache *compact = nullptr, *odd = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_wrap(&compact, be, &d, &m), PAGEDATTN_OK) << pagedattn_last_error();
  m.block_stride = 32;
  m.slot_stride = 8;
  m.head_stride = INT64_MAX - 5;
  ASSERT_EQ(pagedattn_kv_cache_wrap(&odd, be, &d, &m), PAGEDATTN_OK) << pagedattn_last_error();
  int64_t strides[3] = {0, 0, 0};  // get_layer reports the caller's strides, unused one included
  ASSERT_EQ(pagedattn_kv_cache_get_layer(nullptr, nullptr, strides, odd, 0), PAGEDATTN_OK);
  EXPECT_EQ(strides[0], 32);
  EXPECT_EQ(strides[1], 8);
  EXPECT_EQ(strides[2], INT64_MAX - 5);

  const int H = 2, D = 8;
  int32_t qlen[1] = {1}, ctx[1] = {6}, table[2] = {1, 0};
  pagedattn_batch_desc bd;
  ASSERT_EQ(pagedattn_batch_desc_init(&bd), PAGEDATTN_OK);
  bd.num_seqs = 1;
  bd.query_lens = qlen;
  bd.context_lens = ctx;
  bd.block_tables = table;
  bd.block_table_stride = 2;
  pagedattn_batch* b = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&b, be, compact, nullptr, &bd), PAGEDATTN_OK)
      << pagedattn_last_error();
  pagedattn_attention_options o;
  ASSERT_EQ(pagedattn_attention_options_init(&o), PAGEDATTN_OK);
  o.num_heads = H;
  o.num_kv_heads = 1;
  o.head_size = D;
  o.write_kv = 0;
  std::vector<float> q(H * D), want(H * D, NAN), got(H * D, NAN);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  int64_t qs[3] = {1, H, D};
  pagedattn_tensor qt = tensor(q.data(), qs, 3), ot = tensor(want.data(), qs, 3);
  ASSERT_EQ(pagedattn_forward(be, b, compact, 0, &o, &qt, nullptr, nullptr, &ot, nullptr, nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  ot.data = got.data();
  ASSERT_EQ(pagedattn_forward(be, b, odd, 0, &o, &qt, nullptr, nullptr, &ot, nullptr, nullptr),
            PAGEDATTN_OK) << pagedattn_last_error();
  EXPECT_EQ(memcmp(want.data(), got.data(), sizeof(float) * want.size()), 0);
  EXPECT_FALSE(std::isnan(got[0]));

  // Element offsets up to INT64_MAX / 4 + 31 fit; as float32 bytes they do not.
  pagedattn_kv_cache* refused = reinterpret_cast<pagedattn_kv_cache*>(0x20);
  m.head_stride = 8;
  m.block_stride = INT64_MAX / 4;
  EXPECT_EQ(pagedattn_kv_cache_wrap(&refused, be, &d, &m), PAGEDATTN_ERROR_OVERFLOW);
  EXPECT_TRUE(message_has("memory strides overflow int64 byte offsets")) << pagedattn_last_error();
  EXPECT_EQ(refused, reinterpret_cast<pagedattn_kv_cache*>(0x20));
  pagedattn_batch_destroy(b);
  pagedattn_kv_cache_destroy(odd);
  pagedattn_kv_cache_destroy(compact);
  pagedattn_backend_destroy(be);
}
