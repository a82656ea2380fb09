// The paged KV cache's block operations: fp8 scale refusals, copy, swap, read/load and their
// refusals (sizing, create/wrap, write: test_cache.cpp).
#include "cache_fixture.h"

using namespace cache_test;  // NOLINT(google-build-using-namespace): the suite's own fixture

TEST_F(Cache, Fp8ScaleRefusals) {
  auto g = geom(1, 2, 4, 1, 8, PAGEDATTN_DTYPE_FP8_E4M3);
  pagedattn_kv_cache* c = make(g);
  ASSERT_NE(c, nullptr);
  std::mt19937_64 rng(3);
  auto before = fill_random(c, rng);
  pat::Tensor k(dev, PAGEDATTN_DTYPE_FLOAT16, 1, 1, 8), v(dev, PAGEDATTN_DTYPE_FLOAT16, 1, 1, 8);
  k.upload();
  v.upload();
  pat::DevBuf sb(dev, 8);
  int64_t one = 1;
  std::memcpy(sb.host().data(), &one, 8);
  sb.upload();
  int64_t shp[1] = {1};
  pagedattn_tensor st{};
  st.data = sb.ptr();
  st.device = dev;
  st.ndim = 1;
  st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
  st.shape = shp;
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", static_cast<double>(bad));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k.t(), v.t(), &st, bad, 1.0f, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, std::string("k_scale = ") + shown))
        << bad;
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k.t(), v.t(), &st, 1.0f, bad, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, std::string("v_scale = ") + shown))
        << bad;
  }
  EXPECT_EQ(read_all(c), before);
  // On a non-fp8 cache the scales are ignored.
  auto g2 = geom(1, 2, 4, 1, 8, PAGEDATTN_DTYPE_FLOAT16);
  pagedattn_kv_cache* c2 = make(g2);
  EXPECT_EQ(pagedattn_kv_cache_write(c2, 0, k.t(), v.t(), &st, 0.0f, -3.0f, nullptr), PAGEDATTN_OK)
      << pat::last_error();
}

TEST_F(Cache, CopyBlocks) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (auto lay : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND}) {
    auto g = geom(3, 12, 8, 2, 32, PAGEDATTN_DTYPE_BFLOAT16, lay);
    pagedattn_kv_cache* c = make(g);
    ASSERT_NE(c, nullptr);
    auto before = fill_random(c, rng);
    const size_t rec = bpb(g);
    // src {0..5} -> dst {6..11} shuffled, plus a src == dst no-op.
    std::vector<int32_t> ids(12);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> pairs = {ids[0], ids[6], ids[1], ids[7], ids[2], ids[8], ids[3], ids[3]};
    ASSERT_EQ(pagedattn_kv_cache_copy_blocks(c, pairs.data(), pairs.size() / 2, nullptr), PAGEDATTN_OK)
        << pat::last_error();
    auto want = before;
    for (size_t i = 0; i + 1 < pairs.size(); i += 2)
      std::memcpy(&want[pairs[i + 1] * rec], &before[pairs[i] * rec], rec);
    EXPECT_TRUE(read_all(c) == want);
    EXPECT_EQ(pagedattn_kv_cache_copy_blocks(c, nullptr, 0, nullptr), PAGEDATTN_OK);
  }
}

TEST_F(Cache, CopyBlocksRefusals) {
  auto g = geom(2, 6, 4, 1, 8, PAGEDATTN_DTYPE_FLOAT32);
  pagedattn_kv_cache* c = make(g);
  ASSERT_NE(c, nullptr);
  std::mt19937_64 rng(11);
  auto before = fill_random(c, rng);
  struct {
    std::vector<int32_t> pairs;
    pagedattn_status st;
    const char* needle;
  } const cases[] = {
      {{0, 1, 2, 6}, PAGEDATTN_ERROR_OUT_OF_RANGE, "pairs[3] = 6 >= num_blocks 6"},
      {{0, 1, -1, 3}, PAGEDATTN_ERROR_OUT_OF_RANGE, "pairs[2] = -1 < 0"},
      {{7, 1}, PAGEDATTN_ERROR_OUT_OF_RANGE, "pairs[0] = 7 >= num_blocks 6"},
      {{0, 1, 2, 1}, PAGEDATTN_ERROR_INVALID_ARGUMENT, "pairs[3] = 1 repeats pairs[1]"},
      {{0, 1, 1, 2}, PAGEDATTN_ERROR_INVALID_ARGUMENT,  // dst 1 also a source
       "pairs[2] = 1 is a source but also the destination pairs[1]"},
  };
  for (const auto& cs : cases) {
    EXPECT_TRUE(status_is(pagedattn_kv_cache_copy_blocks(c, cs.pairs.data(), cs.pairs.size() / 2,
                                                         nullptr),
                          cs.st, cs.needle));
    EXPECT_TRUE(read_all(c) == before) << "copy_blocks changed the cache on failure";
  }
  EXPECT_TRUE(status_is(pagedattn_kv_cache_copy_blocks(c, nullptr, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "pairs is NULL (num_pairs = 1)"));
  const int32_t p[2] = {0, 1};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_copy_blocks(nullptr, p, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL"));
  EXPECT_TRUE(read_all(c) == before);
}

TEST_F(Cache, SwapBlocksAcrossLayoutsAndHostCaches) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  auto gs = geom(2, 7, 4, 2, 16, PAGEDATTN_DTYPE_FLOAT16, PAGEDATTN_LAYOUT_NHD);
  auto gd = geom(2, 5, 4, 2, 16, PAGEDATTN_DTYPE_FLOAT16, PAGEDATTN_LAYOUT_HND);
  gd.flags = PAGEDATTN_KV_CACHE_HOST;
  pagedattn_kv_cache* src = make(gs);
  pagedattn_kv_cache* dst = make(gd);
  ASSERT_TRUE(src && dst);
  auto simg = fill_random(src, rng);
  auto dimg = fill_random(dst, rng);
  const std::vector<int32_t> pairs = {6, 0, 2, 4, 3, 1};
  ASSERT_EQ(pagedattn_kv_cache_swap_blocks(dst, src, pairs.data(), 3, nullptr), PAGEDATTN_OK)
      << pat::last_error();
  auto after = read_all(dst);
  const size_t rec = bpb(gd);
  std::vector<int> from(5, -1);
  for (size_t i = 0; i < pairs.size(); i += 2) from[pairs[i + 1]] = pairs[i];
  for (int b = 0; b < 5; ++b)
    for (int l = 0; l < 2; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int s = 0; s < 4; ++s)
          for (int h = 0; h < 2; ++h)
            for (int d = 0; d < 16; ++d) {
              const uint8_t* got = &after[b * rec + rec_elem(gd, l, kv, s, h, d) * 2];
              const uint8_t* want = from[b] < 0 ? &dimg[b * rec + rec_elem(gd, l, kv, s, h, d) * 2]
                                                : &simg[from[b] * rec + rec_elem(gs, l, kv, s, h, d) * 2];
              ASSERT_EQ(std::memcmp(got, want, 2), 0) << "dst block " << b << " layer " << l;
            }
  EXPECT_TRUE(read_all(src) == simg) << "swap changed its source";
  // And back.
  const std::vector<int32_t> back = {0, 5};
  ASSERT_EQ(pagedattn_kv_cache_swap_blocks(src, dst, back.data(), 1, nullptr), PAGEDATTN_OK)
      << pat::last_error();
}

TEST_F(Cache, SwapBlocksRefusals) {
  auto g = geom(2, 4, 4, 2, 16, PAGEDATTN_DTYPE_FLOAT16);
  pagedattn_kv_cache* a = make(g);
  pagedattn_kv_cache* b = make(g);
  ASSERT_TRUE(a && b);
  std::mt19937_64 rng(5);
  auto bimg = fill_random(b, rng);
  fill_random(a, rng);
  const int32_t p_oob[4] = {0, 1, 2, 4};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, a, p_oob, 2, nullptr),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "pairs[3] = 4 >= dst num_blocks 4"));
  const int32_t p_oob_src[2] = {9, 1};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, a, p_oob_src, 1, nullptr),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "pairs[0] = 9 >= src num_blocks 4"));
  const int32_t p_dup[4] = {0, 1, 2, 1};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, a, p_dup, 2, nullptr),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "pairs[3] = 1 repeats pairs[1]"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(nullptr, a, p_dup, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "dst is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, nullptr, p_dup, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "src is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, a, nullptr, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "pairs is NULL (num_pairs = 1)"));
  for (int which = 0; which < 5; ++which) {
    auto g2 = g;
    const char* what = "";
    switch (which) {
      case 0: g2.head_size = 32; what = "src head_size 32 != dst head_size 16"; break;
      case 1: g2.num_kv_heads = 1; what = "src num_kv_heads 1 != dst num_kv_heads 2"; break;
      case 2: g2.dtype = PAGEDATTN_DTYPE_BFLOAT16; what = "src dtype bfloat16 != dst dtype float16"; break;
      case 3: g2.block_size = 8; what = "src block_size 8 != dst block_size 4"; break;
      default: g2.num_layers = 3; what = "src num_layers 3 != dst num_layers 2"; break;
    }
    pagedattn_kv_cache* other = make(g2);
    ASSERT_NE(other, nullptr);
    const int32_t p[2] = {0, 0};
    EXPECT_TRUE(status_is(pagedattn_kv_cache_swap_blocks(b, other, p, 1, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, what));
  }
  EXPECT_TRUE(read_all(b) == bimg) << "failed swaps changed the destination";
}

TEST_F(Cache, ReadLoadRoundTripAndRefusals) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (pagedattn_dtype dt : {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FP8_E5M2}) {
    auto g = geom(2, 5, 2, 3, 8, dt, PAGEDATTN_LAYOUT_HND);
    pagedattn_kv_cache* c = make(g);
    ASSERT_NE(c, nullptr);
    auto img = fill_random(c, rng);
    const size_t rec = bpb(g);
    const int32_t ids[3] = {4, 0, 2};
    std::vector<uint8_t> buf(3 * rec + 7, 0xCD);
    ASSERT_EQ(pagedattn_kv_cache_read_blocks(c, ids, 3, buf.data(), buf.size(), nullptr), PAGEDATTN_OK);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(std::memcmp(&buf[i * rec], &img[ids[i] * rec], rec), 0) << "record " << i;
    for (size_t i = 3 * rec; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xCD) << "wrote past the records";
    // load into other ids and read back.
    const int32_t to[3] = {1, 3, 0};
    ASSERT_EQ(pagedattn_kv_cache_load_blocks(c, to, 3, buf.data(), 3 * rec, nullptr), PAGEDATTN_OK);
    auto after = read_all(c);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(std::memcmp(&after[to[i] * rec], &img[ids[i] * rec], rec), 0);
    EXPECT_EQ(std::memcmp(&after[2 * rec], &img[2 * rec], rec), 0);
    EXPECT_EQ(std::memcmp(&after[4 * rec], &img[4 * rec], rec), 0);

    // Refusals leave buffer / cache alone. Every refused read gets a freshly patterned
    // destination and must leave every byte of it as it was.
    const std::string short_by_one = "buffer_bytes = " + std::to_string(3 * rec - 1) +
                                     " < 3 blocks x " + std::to_string(rec) + " bytes per block";
    std::vector<uint8_t> small(3 * rec - 1, 0xAB);
    EXPECT_TRUE(status_is(pagedattn_kv_cache_read_blocks(c, ids, 3, small.data(), small.size(), nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, short_by_one));
    EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](uint8_t x) { return x == 0xAB; }));
    const std::vector<uint8_t> pattern = [&] {
      std::vector<uint8_t> p(buf.size());
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
      return p;
    }();
    auto refused_read = [&](pagedattn_kv_cache* cc, const int32_t* ii, size_t n,
                            pagedattn_status want, const std::string& needle, const char* what) {
      buf = pattern;
      EXPECT_TRUE(status_is(pagedattn_kv_cache_read_blocks(cc, ii, n, buf.data(), buf.size(), nullptr),
                            want, needle)) << what;
      EXPECT_TRUE(buf == pattern) << what << ": a refused read_blocks wrote its destination";
    };
    const int32_t bad[2] = {1, 5};
    refused_read(c, bad, 2, PAGEDATTN_ERROR_OUT_OF_RANGE, "block_ids[1] = 5 >= num_blocks 5",
                 "block id past the cache");
    const int32_t neg[1] = {-1};
    refused_read(c, neg, 1, PAGEDATTN_ERROR_OUT_OF_RANGE, "block_ids[0] = -1 < 0", "negative id");
    refused_read(c, nullptr, 3, PAGEDATTN_ERROR_NULL_POINTER, "block_ids is NULL (num_ids = 3)",
                 "NULL ids");
    refused_read(nullptr, ids, 3, PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL", "NULL cache");
    EXPECT_TRUE(status_is(pagedattn_kv_cache_read_blocks(c, ids, 3, nullptr, 0, nullptr),
                          PAGEDATTN_ERROR_NULL_POINTER, "buffer is NULL (num_ids = 3)"));
    buf = pattern;
    const auto cur = read_all(c);
    const int32_t dup[2] = {1, 1};
    EXPECT_TRUE(status_is(pagedattn_kv_cache_load_blocks(c, dup, 2, buf.data(), buf.size(), nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, "block_ids[1] = 1 repeats block_ids[0]"));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_load_blocks(c, bad, 2, buf.data(), buf.size(), nullptr),
                          PAGEDATTN_ERROR_OUT_OF_RANGE, "block_ids[1] = 5 >= num_blocks 5"));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_load_blocks(c, ids, 3, buf.data(), 3 * rec - 1, nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, short_by_one));
    EXPECT_TRUE(read_all(c) == cur) << "failed loads changed the cache";
    EXPECT_TRUE(buf == pattern) << "a refused load_blocks wrote its source buffer";
  }
}

TEST_F(Cache, SwapBetweenBackends) {
  // Two backends (the oneDNN plugin where it loads, else a second CPU backend): swap needs only
  // identical geometry, not the same backend.
  pagedattn_backend* other = nullptr;
  if (pagedattn_backend_create(&other, "onednn", nullptr) != PAGEDATTN_OK) {
    ASSERT_EQ(pagedattn_backend_create(&other, pat::backend_name().c_str(), nullptr), PAGEDATTN_OK)
        << pat::last_error();
  }
  pagedattn_capabilities oc{};
  oc.struct_size = sizeof oc;
  ASSERT_EQ(pagedattn_backend_get_capabilities(&oc, other), PAGEDATTN_OK);
  auto g = geom(2, 4, 8, 2, 32, PAGEDATTN_DTYPE_BFLOAT16);
  pagedattn_kv_cache* mine = make(g);
  pagedattn_kv_cache* theirs = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&theirs, other, &g), PAGEDATTN_OK) << pat::last_error();
  std::mt19937_64 rng(pat::test_seed());
  auto img = fill_random(mine, rng);
  const int32_t pairs[4] = {3, 0, 1, 2};
  ASSERT_EQ(pagedattn_kv_cache_swap_blocks(theirs, mine, pairs, 2, nullptr), PAGEDATTN_OK)
      << oc.name << ": " << pat::last_error();
  const size_t rec = bpb(g);
  std::vector<uint8_t> got(4 * rec);
  const int32_t ids[4] = {0, 1, 2, 3};
  ASSERT_EQ(pagedattn_kv_cache_read_blocks(theirs, ids, 4, got.data(), got.size(), nullptr), PAGEDATTN_OK);
  EXPECT_EQ(std::memcmp(&got[0], &img[3 * rec], rec), 0) << oc.name;
  EXPECT_EQ(std::memcmp(&got[2 * rec], &img[1 * rec], rec), 0) << oc.name;
  for (size_t i = 1 * rec; i < 2 * rec; ++i) ASSERT_EQ(got[i], 0) << "block 1 should stay zero";
  pagedattn_kv_cache_destroy(theirs);
  pagedattn_backend_destroy(other);
}
