// The paged KV cache: sizing, create/wrap, write and their refusals (copy, swap, read/load:
// test_cache_blocks.cpp).
#include "cache_fixture.h"

using namespace cache_test;  // NOLINT(google-build-using-namespace): the suite's own fixture

TEST(CacheSizing, BytesPerBlock) {
  uint64_t b = 0;
  auto g = geom(3, 10, 16, 4, 64, PAGEDATTN_DTYPE_FLOAT16);
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&b, &g), PAGEDATTN_OK) << pat::last_error();
  EXPECT_EQ(b, 3u * 2 * 16 * 4 * 64 * 2);
  g.dtype = PAGEDATTN_DTYPE_FLOAT32;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&b, &g), PAGEDATTN_OK);
  EXPECT_EQ(b, 3u * 2 * 16 * 4 * 64 * 4);
  g.dtype = PAGEDATTN_DTYPE_FP8_E5M2;
  g.layout = PAGEDATTN_LAYOUT_HND;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&b, &g), PAGEDATTN_OK);
  EXPECT_EQ(b, 3u * 2 * 16 * 4 * 64);
}

TEST(CacheSizing, Refusals) {
  uint64_t b = 12345;
  auto g = geom(1, 1, 16, 1, 64, PAGEDATTN_DTYPE_FLOAT32);
  EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(nullptr, &g), PAGEDATTN_ERROR_NULL_POINTER,
                        "out is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(&b, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "desc is NULL"));
  auto bad = g;
  bad.struct_size = 4;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(&b, &bad), PAGEDATTN_ERROR_STRUCT_SIZE,
                        "desc->struct_size = 4"));
  struct {
    const char* field;
    void (*mut)(pagedattn_kv_cache_desc*);
  } const cases[] = {
      {"desc->num_layers = 0", [](pagedattn_kv_cache_desc* d) { d->num_layers = 0; }},
      {"desc->num_blocks = -1", [](pagedattn_kv_cache_desc* d) { d->num_blocks = -1; }},
      {"desc->block_size = 0", [](pagedattn_kv_cache_desc* d) { d->block_size = 0; }},
      {"desc->block_size = 24", [](pagedattn_kv_cache_desc* d) { d->block_size = 24; }},
      {"desc->num_kv_heads = 0", [](pagedattn_kv_cache_desc* d) { d->num_kv_heads = 0; }},
      {"desc->head_size = -8", [](pagedattn_kv_cache_desc* d) { d->head_size = -8; }},
      {"desc->dtype = 0", [](pagedattn_kv_cache_desc* d) { d->dtype = PAGEDATTN_DTYPE_INVALID; }},
      {"desc->dtype = 42", [](pagedattn_kv_cache_desc* d) { d->dtype = static_cast<pagedattn_dtype>(42); }},
      {"desc->layout = 9", [](pagedattn_kv_cache_desc* d) { d->layout = static_cast<pagedattn_layout>(9); }},
  };
  for (const auto& c : cases) {
    auto d = g;
    c.mut(&d);
    EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(&b, &d),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT, c.field));
  }
  auto huge = geom(INT32_MAX, 1, 256, INT32_MAX, 256, PAGEDATTN_DTYPE_FLOAT32);
  EXPECT_TRUE(status_is(pagedattn_kv_cache_bytes_per_block(&b, &huge), PAGEDATTN_ERROR_OVERFLOW,
                        "cache size overflows: 2147483647 layers"));
  EXPECT_EQ(b, 12345u) << "out written on failure";
}

TEST_F(Cache, CreateStartsZeroAndDescribesItself) {
  for (auto lay : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND}) {
    auto g = geom(3, 5, 8, 2, 40, PAGEDATTN_DTYPE_BFLOAT16, lay);
    pagedattn_kv_cache* c = make(g);
    ASSERT_NE(c, nullptr);
    auto img = read_all(c);
    EXPECT_TRUE(std::all_of(img.begin(), img.end(), [](uint8_t x) { return x == 0; }));
    pagedattn_kv_cache_desc got;
    pagedattn_kv_cache_desc_init(&got);
    ASSERT_EQ(pagedattn_kv_cache_get_desc(&got, c), PAGEDATTN_OK);
    EXPECT_EQ(got.num_layers, 3);
    EXPECT_EQ(got.num_blocks, 5);
    EXPECT_EQ(got.block_size, 8);
    EXPECT_EQ(got.num_kv_heads, 2);
    EXPECT_EQ(got.head_size, 40);
    EXPECT_EQ(got.dtype, PAGEDATTN_DTYPE_BFLOAT16);
    EXPECT_EQ(got.layout, lay);
    // Compact strides of the layout; layers contiguous: K blocks of layer l, then its V blocks.
    const int64_t blk = 8 * 2 * 40;
    const int64_t want[3] = {blk, lay == PAGEDATTN_LAYOUT_NHD ? 2 * 40 : 40,
                             lay == PAGEDATTN_LAYOUT_NHD ? 40 : 8 * 40};
    char* prev_v = nullptr;
    for (int l = 0; l < 3; ++l) {
      void *k = nullptr, *v = nullptr;
      int64_t s[3] = {0, 0, 0};
      ASSERT_EQ(pagedattn_kv_cache_get_layer(&k, &v, s, c, l), PAGEDATTN_OK) << pat::last_error();
      EXPECT_EQ(s[0], want[0]);
      EXPECT_EQ(s[1], want[1]);
      EXPECT_EQ(s[2], want[2]);
      EXPECT_EQ(static_cast<char*>(v) - static_cast<char*>(k), 5 * blk * 2);
      if (prev_v) {
        EXPECT_EQ(static_cast<char*>(k) - prev_v, 5 * blk * 2);
      }
      prev_v = static_cast<char*>(v);
    }
    void* k = nullptr;
    EXPECT_EQ(pagedattn_kv_cache_get_layer(&k, nullptr, nullptr, c, 0), PAGEDATTN_OK);
    void* const k0 = k;
    EXPECT_TRUE(status_is(pagedattn_kv_cache_get_layer(&k, nullptr, nullptr, c, 3),
                          PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = 3 is not in [0, 3)"));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_get_layer(&k, nullptr, nullptr, c, -1),
                          PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = -1 is not in [0, 3)"));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_get_layer(&k, nullptr, nullptr, nullptr, 0),
                          PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL"));
    EXPECT_EQ(k, k0) << "a refused get_layer wrote its output";
    EXPECT_TRUE(status_is(pagedattn_kv_cache_get_desc(nullptr, c), PAGEDATTN_ERROR_NULL_POINTER,
                          "out is NULL"));
    got.struct_size = 1;
    EXPECT_TRUE(status_is(pagedattn_kv_cache_get_desc(&got, c), PAGEDATTN_ERROR_STRUCT_SIZE,
                          "out->struct_size = 1"));
  }
}

// Resident set size of this process in bytes, or -1 where /proc/self/statm is not readable.
static int64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, resident = -1;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * 4096 : -1;
}

TEST_F(Cache, LargeCacheIsZeroWithoutBeingWrittenUpFront) {
  // A cache's memory reads zero, but a large host cache is not memset at creation: its pages are
  // committed as the engine writes them, so creating one near the memory size is quick and
  // touches nothing. The resident set must not grow by the cache's 1 GiB.
  if (dev.device_type != PAGEDATTN_DEVICE_CPU) GTEST_SKIP() << "skipped: host caches only";
  const int64_t before = resident_bytes();
  if (before < 0) GTEST_SKIP() << "skipped: /proc/self/statm is not readable here";
  auto g = geom(4, 2048, 16, 8, 128, PAGEDATTN_DTYPE_BFLOAT16);  // 1 GiB
  pagedattn_kv_cache* c = make(g);
  ASSERT_NE(c, nullptr);
  const int64_t grown = resident_bytes() - before;
  EXPECT_LT(grown, int64_t{64} << 20) << "creating a 1 GiB cache made " << grown
                                      << " bytes resident";
  std::vector<int32_t> ids = {0, 1023, 2047};
  uint64_t bpb = 0;
  ASSERT_EQ(pagedattn_kv_cache_bytes_per_block(&bpb, &g), PAGEDATTN_OK);
  std::vector<uint8_t> buf(bpb * ids.size(), 0xAB);
  ASSERT_EQ(pagedattn_kv_cache_read_blocks(c, ids.data(), ids.size(), buf.data(), buf.size(),
                                           nullptr),
            PAGEDATTN_OK)
      << pat::last_error();
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t x) { return x == 0; }));
}

TEST_F(Cache, CreateRefusals) {
  pagedattn_kv_cache* const sentinel = reinterpret_cast<pagedattn_kv_cache*>(0x10);
  pagedattn_kv_cache* c = sentinel;
  auto g = geom(1, 4, 16, 2, 64, PAGEDATTN_DTYPE_FLOAT32);
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(nullptr, be, &g), PAGEDATTN_ERROR_NULL_POINTER,
                        "out is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, nullptr, &g), PAGEDATTN_ERROR_NULL_POINTER,
                        "backend is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "desc is NULL"));
  auto d = g;
  d.struct_size = 0;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_STRUCT_SIZE,
                        "desc->struct_size = 0"));
  d = g;
  d.num_blocks = 0;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "desc->num_blocks = 0"));
  d = g;
  d.layout = static_cast<pagedattn_layout>(2);
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "desc->layout = 2"));
  d = g;
  d.flags = 0x100;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "desc->flags = 0x100"));
  {
    d = g;
    d.head_size = 12;  // not a multiple of 8
    const pagedattn_status st = pagedattn_kv_cache_create(&c, be, &d);
    EXPECT_TRUE(st == PAGEDATTN_ERROR_UNSUPPORTED || st == PAGEDATTN_ERROR_INVALID_ARGUMENT)
        << pagedattn_status_string(st);
    EXPECT_NE(pat::last_error().find("head_size 12"), std::string::npos) << pat::last_error();
    d.head_size = 264;
    EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &d), PAGEDATTN_ERROR_UNSUPPORTED,
                          "head_size 264 is not supported"));
  }
  d = g;
  d.block_size = 512;  // a power of two no backend offers: refused either way, naming the field
  {
    const pagedattn_status s512 = pagedattn_kv_cache_create(&c, be, &d);
    EXPECT_TRUE(s512 == PAGEDATTN_ERROR_UNSUPPORTED || s512 == PAGEDATTN_ERROR_INVALID_ARGUMENT)
        << pagedattn_status_string(s512);
    EXPECT_NE(pat::last_error().find("block_size"), std::string::npos) << pat::last_error();
    EXPECT_NE(pat::last_error().find("512"), std::string::npos) << pat::last_error();
  }
  d = g;
  d.num_blocks = INT32_MAX;
  d.block_size = 256;
  d.num_kv_heads = 256;
  d.head_size = 256;
  d.num_layers = 64;  // ~2^61 bytes: must fail cleanly
  const pagedattn_status st = pagedattn_kv_cache_create(&c, be, &d);
  EXPECT_TRUE(st == PAGEDATTN_ERROR_OUT_OF_MEMORY || st == PAGEDATTN_ERROR_OVERFLOW)
      << pagedattn_status_string(st) << ": " << pat::last_error();
  EXPECT_EQ(c, sentinel) << "out written on failure";
}

TEST(CacheMemoryLimit, OutOfMemoryIsAnError) {
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.memory_limit = 64 * 1024;
  pagedattn_backend* be = nullptr;
  const std::string name = pat::backend_name();
  if (pagedattn_backend_create(&be, name.c_str(), &o) != PAGEDATTN_OK) {
    GTEST_SKIP() << "skipped: backend " << name << " not available: " << pat::last_error();
  }
  auto g = geom(1, 64, 16, 4, 64, PAGEDATTN_DTYPE_FLOAT32);  // 64 * 32 KiB = 2 MiB
  pagedattn_kv_cache* c = nullptr;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_create(&c, be, &g), PAGEDATTN_ERROR_OUT_OF_MEMORY,
                        "allocating 2097152 bytes exceeds memory_limit 65536"));
  EXPECT_EQ(c, nullptr);
  g.num_blocks = 1;  // 32 KiB fits
  EXPECT_EQ(pagedattn_kv_cache_create(&c, be, &g), PAGEDATTN_OK) << pat::last_error();
  pagedattn_kv_cache_destroy(c);
  pagedattn_backend_destroy(be);
}

TEST_F(Cache, WriteEveryDtypeLayoutAndSlotType) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  const pagedattn_dtype models[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                    PAGEDATTN_DTYPE_BFLOAT16};
  for (pagedattn_dtype mdt : models)
    for (pagedattn_dtype cdt : {mdt, PAGEDATTN_DTYPE_FP8_E4M3, PAGEDATTN_DTYPE_FP8_E5M2})
      for (auto lay : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND})
        for (int s64 = 0; s64 < 2; ++s64) {
          SCOPED_TRACE(std::string(pat::dtype_str(mdt)) + " -> " + pat::dtype_str(cdt) +
                       (lay ? " HND" : " NHD") + (s64 ? " int64" : " int32"));
          const int L = 2, nb = 6, bs = 4, hkv = 3, D = 24;
          auto g = geom(L, nb, bs, hkv, D, cdt, lay);
          pagedattn_kv_cache* c = make(g);
          ASSERT_NE(c, nullptr);
          auto before = read_all(c);
          const int layer = static_cast<int>(rng() % L);
          std::vector<int64_t> slots(nb * bs);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          slots.resize(9);
          slots[3] = -1;
          slots[7] = -1;
          const int64_t n = static_cast<int64_t>(slots.size());
          const float ksc = pat::is_fp8(cdt) ? 0.5f : 1.0f, vsc = pat::is_fp8(cdt) ? 3.0f : 1.0f;
          pat::Tensor k(dev, mdt, n, hkv, D), v(dev, mdt, n, hkv, D);
          std::normal_distribution<float> nd(0.f, 2.f);
          for (int64_t r = 0; r < n; ++r)
            for (int h = 0; h < hkv; ++h)
              for (int d = 0; d < D; ++d) {
                k.set(r, h, d, nd(rng));
                v.set(r, h, d, nd(rng));
              }
          pat::DevBuf sb(dev, n * (s64 ? 8 : 4));
          for (int64_t r = 0; r < n; ++r) {
            if (s64) std::memcpy(&sb.host()[r * 8], &slots[r], 8);
            else {
              int32_t x = static_cast<int32_t>(slots[r]);
              std::memcpy(&sb.host()[r * 4], &x, 4);
            }
          }
          sb.upload();
          k.upload();
          v.upload();
          int64_t shp[1] = {n};
          pagedattn_tensor st{};
          st.data = sb.ptr();
          st.device = dev;
          st.ndim = 1;
          st.dtype = {PAGEDATTN_DLPACK_INT, static_cast<uint8_t>(s64 ? 64 : 32), 1};
          st.shape = shp;
          ASSERT_EQ(pagedattn_kv_cache_write(c, layer, k.t(), v.t(), &st, ksc, vsc, nullptr),
                    PAGEDATTN_OK)
              << pat::last_error();
          auto after = read_all(c);
          const size_t es = pat::dtype_bytes(cdt), rec = bpb(g);
          std::vector<uint8_t> want = before;
          for (int64_t r = 0; r < n; ++r) {
            if (slots[r] < 0) continue;
            const int b = static_cast<int>(slots[r] / bs), so = static_cast<int>(slots[r] % bs);
            for (int h = 0; h < hkv; ++h)
              for (int d = 0; d < D; ++d) {
                pat::store(cdt, &want[b * rec + rec_elem(g, layer, 0, so, h, d) * es],
                           k.get(r, h, d) / ksc);
                pat::store(cdt, &want[b * rec + rec_elem(g, layer, 1, so, h, d) * es],
                           v.get(r, h, d) / vsc);
              }
          }
          for (size_t i = 0; i < want.size(); i += es) {
            if (std::memcmp(&want[i], &after[i], es) == 0) continue;
            const bool fp8 = pat::is_fp8(cdt);
            const bool near = fp8 && (want[i] & 0x80) == (after[i] & 0x80) &&
                              std::abs((want[i] & 0x7F) - (after[i] & 0x7F)) <= 1;
            ASSERT_TRUE(near) << "byte " << i << " (block " << i / rec << "): got "
                              << pat::load(cdt, &after[i]) << ", want " << pat::load(cdt, &want[i]);
          }
        }
}

TEST_F(Cache, Fp8SaturatesAndScales) {
  for (pagedattn_dtype cdt : {PAGEDATTN_DTYPE_FP8_E4M3, PAGEDATTN_DTYPE_FP8_E5M2}) {
    auto g = geom(1, 1, 1, 1, 8, cdt);
    pagedattn_kv_cache* c = make(g);
    ASSERT_NE(c, nullptr);
    pat::Tensor k(dev, PAGEDATTN_DTYPE_FLOAT32, 1, 1, 8), v(dev, PAGEDATTN_DTYPE_FLOAT32, 1, 1, 8);
    const float kin[8] = {1e6f, -1e6f, 448.f, 500.f, 1.0f, -3.0f, 0.0f, 57344.f * 4};
    for (int d = 0; d < 8; ++d) {
      k.set(0, 0, d, kin[d]);
      v.set(0, 0, d, kin[d]);
    }
    k.upload();
    v.upload();
    pat::DevBuf sb(dev, 8);
    int64_t zero = 0;
    std::memcpy(sb.host().data(), &zero, 8);
    sb.upload();
    int64_t shp[1] = {1};
    pagedattn_tensor st{};
    st.data = sb.ptr();
    st.device = dev;
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
    st.shape = shp;
    const float vscale = 2.0f;
    ASSERT_EQ(pagedattn_kv_cache_write(c, 0, k.t(), v.t(), &st, 1.0f, vscale, nullptr), PAGEDATTN_OK)
        << pat::last_error();
    auto img = read_all(c);
    for (int d = 0; d < 8; ++d) {
      const float gk = pat::load(cdt, &img[d]);
      const float gv = pat::load(cdt, &img[8 + d]);
      EXPECT_TRUE(std::isfinite(gk)) << pat::dtype_str(cdt) << " K[" << d << "] not saturated";
      EXPECT_EQ(gk, pat::round_to(cdt, kin[d])) << pat::dtype_str(cdt) << " K[" << d << "]";
      EXPECT_EQ(gv, pat::round_to(cdt, kin[d] / vscale)) << pat::dtype_str(cdt) << " V[" << d << "]";
    }
  }
}

TEST_F(Cache, Fp8PerHeadScales) {
  // pagedattn_kv_cache_write_scaled: head h stores fp8(x / scale[h]); NULL is scale 1; a cache
  // that is not fp8 ignores the scales.
  for (pagedattn_dtype cdt : {PAGEDATTN_DTYPE_FP8_E4M3, PAGEDATTN_DTYPE_FP8_E5M2,
                              PAGEDATTN_DTYPE_FLOAT32}) {
    auto g = geom(1, 1, 2, 3, 8, cdt);
    pagedattn_kv_cache* c = make(g);
    ASSERT_NE(c, nullptr);
    pat::Tensor k(dev, PAGEDATTN_DTYPE_FLOAT32, 1, 3, 8), v(dev, PAGEDATTN_DTYPE_FLOAT32, 1, 3, 8);
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 8; ++d) {
        k.set(0, h, d, 0.37f * static_cast<float>(d - 3) + static_cast<float>(h));
        v.set(0, h, d, -1.9f * static_cast<float>(d) + 0.5f);
      }
    k.upload();
    v.upload();
    const float ks[3] = {0.5f, 4.0f, 0.125f}, vs[3] = {2.0f, 0.25f, 3.0f};
    auto kst = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, 3);
    auto vst = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, 3);
    for (int h = 0; h < 3; ++h) {
      kst->set(h, 0, 0, ks[h]);
      vst->set(h, 0, 0, vs[h]);
    }
    kst->upload();
    vst->upload();
    pat::DevBuf sb(dev, 8);
    const int64_t slot = 1;
    std::memcpy(sb.host().data(), &slot, 8);
    sb.upload();
    int64_t shp[1] = {1};
    pagedattn_tensor st{};
    st.data = sb.ptr();
    st.device = dev;
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
    st.shape = shp;
    for (bool k_null : {false, true}) {
      ASSERT_EQ(pagedattn_kv_cache_write_scaled(c, 0, k.t(), v.t(), &st, k_null ? nullptr : kst->t(),
                                                vst->t(), nullptr),
                PAGEDATTN_OK)
          << pat::last_error();
      auto img = read_all(c);
      const size_t es = pat::dtype_bytes(cdt);
      for (int h = 0; h < 3; ++h)
        for (int d = 0; d < 8; ++d) {
          // NHD block: K then V, each [slot][head][dim]; slot 1.
          const size_t ko = ((1 * 3 + h) * 8 + d) * es, vo = ((2 * 3 + 1 * 3 + h) * 8 + d) * es;
          const bool fp8 = pat::is_fp8(cdt);
          const float kscale = !fp8 || k_null ? 1.0f : ks[h], vscale = fp8 ? vs[h] : 1.0f;
          EXPECT_EQ(pat::load(cdt, &img[ko]), pat::round_to(cdt, k.get(0, h, d) / kscale))
              << pat::dtype_str(cdt) << " K head " << h << " dim " << d << " k_null " << k_null;
          EXPECT_EQ(pat::load(cdt, &img[vo]), pat::round_to(cdt, v.get(0, h, d) / vscale))
              << pat::dtype_str(cdt) << " V head " << h << " dim " << d;
        }
    }
  }
}

TEST_F(Cache, WrapCustomStrides) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (auto lay : {PAGEDATTN_LAYOUT_NHD, PAGEDATTN_LAYOUT_HND}) {
    const int L = 2, nb = 3, bs = 4, hkv = 2, D = 16;
    auto g = geom(L, nb, bs, hkv, D, PAGEDATTN_DTYPE_FLOAT32, lay);
    int64_t hs, ss, bst;
    if (lay == PAGEDATTN_LAYOUT_NHD) {
      hs = D + 8; ss = hkv * hs + 3; bst = bs * ss + 5;
    } else {
      ss = D + 8; hs = bs * ss + 3; bst = hkv * hs + 5;
    }
    std::vector<std::unique_ptr<pat::DevBuf>> bufs;
    std::vector<void*> kp, vp;
    for (int i = 0; i < 2 * L; ++i) {
      bufs.emplace_back(new pat::DevBuf(dev, bst * nb * 4));
      std::fill(bufs.back()->host().begin(), bufs.back()->host().end(), 0x5A);
      bufs.back()->upload();
      (i % 2 ? vp : kp).push_back(bufs.back()->ptr());
    }
    pagedattn_kv_cache_memory m{};
    m.struct_size = sizeof m;
    m.k_layers = kp.data();
    m.v_layers = vp.data();
    m.block_stride = bst;
    m.slot_stride = ss;
    m.head_stride = hs;
    m.device = dev;
    pagedattn_kv_cache* c = nullptr;
    ASSERT_EQ(pagedattn_kv_cache_wrap(&c, be, &g, &m), PAGEDATTN_OK) << pat::last_error();
    caches_.push_back(c);
    void *k0 = nullptr, *v1 = nullptr;
    int64_t s[3];
    ASSERT_EQ(pagedattn_kv_cache_get_layer(&k0, nullptr, s, c, 0), PAGEDATTN_OK);
    ASSERT_EQ(pagedattn_kv_cache_get_layer(nullptr, &v1, nullptr, c, 1), PAGEDATTN_OK);
    EXPECT_EQ(k0, kp[0]);
    EXPECT_EQ(v1, vp[1]);
    EXPECT_EQ(s[0], bst);
    EXPECT_EQ(s[1], ss);
    EXPECT_EQ(s[2], hs);
    auto img = fill_random(c, rng);
    // Every element landed at its strided address; padding untouched.
    for (int l = 0; l < L; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        pat::DevBuf& b = *bufs[2 * l + kv];
        b.download();
        std::vector<uint8_t> logical(b.bytes(), 0);
        for (int blk = 0; blk < nb; ++blk)
          for (int sl = 0; sl < bs; ++sl)
            for (int h = 0; h < hkv; ++h)
              for (int d = 0; d < D; ++d) {
                const size_t e = (blk * bst + sl * ss + h * hs + d) * 4;
                const size_t r = blk * bpb(g) + rec_elem(g, l, kv, sl, h, d) * 4;
                ASSERT_EQ(std::memcmp(&b.host()[e], &img[r], 4), 0)
                    << "layer " << l << " kv " << kv << " block " << blk << " slot " << sl;
                std::fill(&logical[e], &logical[e] + 4, 1);
              }
        for (size_t i = 0; i < b.bytes(); ++i)
          if (!logical[i]) {
            ASSERT_EQ(b.host()[i], 0x5A) << "padding byte " << i << " written";
          }
      }
    // Compact strides (0,0,0) are accepted too.
    m.block_stride = m.slot_stride = m.head_stride = 0;
    pagedattn_kv_cache* c2 = nullptr;
    ASSERT_EQ(pagedattn_kv_cache_wrap(&c2, be, &g, &m), PAGEDATTN_OK) << pat::last_error();
    caches_.push_back(c2);
  }
}

TEST_F(Cache, WrapRefusals) {
  auto g = geom(2, 2, 4, 2, 16, PAGEDATTN_DTYPE_FLOAT32);
  pat::DevBuf b0(dev, 4096), b1(dev, 4096), b2(dev, 4096), b3(dev, 4096);
  void* kp[2] = {b0.ptr(), b1.ptr()};
  void* vp[2] = {b2.ptr(), b3.ptr()};
  void* kbad[2] = {b0.ptr(), nullptr};
  pagedattn_kv_cache_memory m{};
  m.struct_size = sizeof m;
  m.k_layers = kp;
  m.v_layers = vp;
  m.device = dev;
  pagedattn_kv_cache* const sentinel = reinterpret_cast<pagedattn_kv_cache*>(0x20);
  pagedattn_kv_cache* c = sentinel;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "memory is NULL"));
  auto mm = m;
  mm.struct_size = 0;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_STRUCT_SIZE,
                        "memory->struct_size = 0"));
  mm = m;
  mm.k_layers = kbad;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "memory->k_layers[1] is NULL"));
  mm = m;
  mm.k_layers = nullptr;
  const pagedattn_status s1 = pagedattn_kv_cache_wrap(&c, be, &g, &mm);
  EXPECT_TRUE(s1 == PAGEDATTN_ERROR_NULL_POINTER || s1 == PAGEDATTN_ERROR_INVALID_ARGUMENT)
      << pagedattn_status_string(s1);
  EXPECT_NE(pat::last_error().find("memory->k_layers"), std::string::npos) << pat::last_error();
  mm = m;  // heads overlap: head stride smaller than the head size
  mm.head_stride = 8;
  mm.slot_stride = 2 * 16;
  mm.block_stride = 4 * 2 * 16;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "memory strides (block 128, slot 32, head 8) make blocks, slots or heads overlap"));
  mm = m;  // slots overlap
  mm.head_stride = 16;
  mm.slot_stride = 16;
  mm.block_stride = 4 * 2 * 16;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "memory strides (block 128, slot 16, head 16)"));
  mm = m;  // blocks overlap
  mm.head_stride = 16;
  mm.slot_stride = 32;
  mm.block_stride = 64;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_INVALID_ARGUMENT,
                        "memory strides (block 64, slot 32, head 16)"));
  mm = m;
  mm.device.device_type = dev.device_type == PAGEDATTN_DEVICE_CPU ? PAGEDATTN_DEVICE_CUDA
                                                                   : PAGEDATTN_DEVICE_ROCM;
  mm.device.device_id = 3;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_wrap(&c, be, &g, &mm), PAGEDATTN_ERROR_WRONG_DEVICE,
                        dev.device_type == PAGEDATTN_DEVICE_CPU ? "memory->device is cuda:3"
                                                                : "memory->device is rocm:3"));
  EXPECT_EQ(c, sentinel);
}

class CacheWrite : public Cache {
 protected:
  void SetUp() override {
    Cache::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    g = geom(2, 4, 4, 2, 16, PAGEDATTN_DTYPE_FLOAT16);
    c = make(g);
    ASSERT_NE(c, nullptr);
    std::mt19937_64 rng(7);
    before = fill_random(c, rng);
    k.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, 3, 2, 16));
    v.reset(new pat::Tensor(dev, PAGEDATTN_DTYPE_FLOAT16, 3, 2, 16));
    for (int r = 0; r < 3; ++r)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 16; ++d) {
          k->set(r, h, d, 1.5f);
          v->set(r, h, d, -1.5f);
        }
    k->upload();
    v->upload();
    slots.reset(new pat::DevBuf(dev, 3 * 8));
  }
  // The mapping lives on the backend's device, or in host memory with on_host (the only place
  // a GPU backend can check it before writing: see pagedattn_kv_cache_write).
  pagedattn_tensor* slot_tensor(std::vector<int64_t> s, int bits = 64, bool on_host = false) {
    slots.reset(new pat::DevBuf(on_host ? host_dev : dev, std::max<size_t>(s.size(), 1) * 8));
    for (size_t i = 0; i < s.size(); ++i) {
      if (bits == 64) std::memcpy(&slots->host()[i * 8], &s[i], 8);
      else {
        int32_t x = static_cast<int32_t>(s[i]);
        std::memcpy(&slots->host()[i * 4], &x, 4);
      }
    }
    slots->upload();
    shp[0] = static_cast<int64_t>(s.size());
    st = pagedattn_tensor{};
    st.data = slots->ptr();
    st.device = slots->device();
    st.ndim = 1;
    st.dtype = {PAGEDATTN_DLPACK_INT, static_cast<uint8_t>(bits), 1};
    st.shape = shp;
    return &st;
  }
  ::testing::AssertionResult unchanged() {
    if (read_all(c) != before) return ::testing::AssertionFailure() << "cache was modified";
    return ::testing::AssertionSuccess();
  }
  pagedattn_kv_cache_desc g;
  pagedattn_kv_cache* c = nullptr;
  std::vector<uint8_t> before;
  std::unique_ptr<pat::Tensor> k, v;
  std::unique_ptr<pat::DevBuf> slots;
  const pagedattn_device host_dev{PAGEDATTN_DEVICE_CPU, 0};
  int64_t shp[2];
  pagedattn_tensor st;
};

// A host mapping is checked before anything is written, on every backend (a GPU backend skips
// bad slots of a mapping in device memory instead: tests/gpu DeviceSlotMappingSkipsBadSlots).
TEST_F(CacheWrite, SlotsOutOfRangeWriteNothing) {
  const int64_t nbbs = 4 * 4;
  for (auto bad : std::vector<std::vector<int64_t>>{
           {0, 5, nbbs}, {nbbs + 100, 1, 2}, {3, -2, 4}, {1, 2, INT64_MAX}, {1, 2, INT32_MIN}}) {
    for (int bits : {64, 32}) {
      if (bits == 32 && (bad[2] == INT64_MAX)) continue;
      // The message names the first slot out of [-1, nbbs) and its value.
      size_t i = 0;
      while (bad[i] >= -1 && bad[i] < nbbs) ++i;
      EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(),
                                                     slot_tensor(bad, bits, /*on_host=*/true),
                                                     1.f, 1.f, nullptr),
                            PAGEDATTN_ERROR_OUT_OF_RANGE,
                            "slot_mapping[" + std::to_string(i) + "] = " + std::to_string(bad[i])))
          << bad[0] << "," << bad[1] << "," << bad[2] << " int" << bits;
      EXPECT_TRUE(unchanged());
    }
  }
}

TEST_F(CacheWrite, RepeatedSlotWritesNothing) {
  // A host mapping naming one slot twice is refused before anything is written (which row would
  // land is not defined); -1 padding may repeat.
  for (int bits : {64, 32}) {
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(),
                                                   slot_tensor({7, -1, 7}, bits, true), 1.f, 1.f,
                                                   nullptr),
                          PAGEDATTN_ERROR_INVALID_ARGUMENT,
                          "slot_mapping[0] and slot_mapping[2] are both slot 7"))
        << "int" << bits;
    EXPECT_TRUE(unchanged());
  }
  EXPECT_EQ(pagedattn_kv_cache_write(c, 0, k->t(), v->t(), slot_tensor({-1, 3, -1}, 64, true), 1.f,
                                     1.f, nullptr),
            PAGEDATTN_OK)
      << pat::last_error();
}

TEST_F(CacheWrite, PerHeadScaleRefusals) {
  pagedattn_tensor* good = slot_tensor({0, -1, 5});
  auto hs = pat::Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, 2);
  hs->set(0, 0, 0, 1.0f);
  hs->set(1, 0, 0, 2.0f);
  hs->upload();
  pagedattn_tensor t = *hs->t();
  int64_t three[1] = {3};
  t.shape = three;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write_scaled(c, 0, k->t(), v->t(), good, &t, nullptr, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "k_head_scales: shape [3] != expected [2] (num_kv_heads)"));
  EXPECT_TRUE(unchanged());
  t = *hs->t();
  t.dtype = {PAGEDATTN_DLPACK_FLOAT, 64, 1};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write_scaled(c, 0, k->t(), v->t(), good, nullptr, &t, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "v_head_scales: dtype {code 2, bits 64, lanes 1} is not float32"));
  EXPECT_TRUE(unchanged());
  // Scales in host memory are read: every one finite and > 0, whatever the cache's dtype.
  if (dev.device_type == PAGEDATTN_DEVICE_CPU) {
    for (float bad : {0.0f, -3.0f, NAN, -INFINITY}) {
      hs->set(1, 0, 0, bad);
      hs->upload();
      EXPECT_TRUE(status_is(pagedattn_kv_cache_write_scaled(c, 0, k->t(), v->t(), good, hs->t(), nullptr, nullptr),
                            PAGEDATTN_ERROR_INVALID_ARGUMENT, "k_head_scales[1] = "))
          << bad;
      EXPECT_TRUE(unchanged());
    }
  }
}

TEST_F(CacheWrite, Refusals) {
  pagedattn_tensor* good = slot_tensor({0, -1, 5});
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(nullptr, 0, k->t(), v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, nullptr, v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "key is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), nullptr, good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "value is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(), nullptr, 1, 1, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "slot_mapping is NULL"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 2, k->t(), v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = 2 is not in [0, 2)"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, -1, k->t(), v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = -1 is not in [0, 2)"));
  // Wrong shapes.
  pat::Tensor k_heads(dev, PAGEDATTN_DTYPE_FLOAT16, 3, 4, 16), k_dim(dev, PAGEDATTN_DTYPE_FLOAT16, 3, 2, 8),
      k_rows(dev, PAGEDATTN_DTYPE_FLOAT16, 2, 2, 16), k_f32(dev, PAGEDATTN_DTYPE_FLOAT32, 3, 2, 16),
      k_bf(dev, PAGEDATTN_DTYPE_BFLOAT16, 3, 2, 16);
  for (pat::Tensor* bad : {&k_heads, &k_dim}) {
    const std::string shape = "shape [" + std::to_string(bad->rows()) + ", " +
                              std::to_string(bad->heads()) + ", " + std::to_string(bad->dim()) +
                              "] != expected [3, 2, 16]";
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, bad->t(), v->t(), good, 1, 1, nullptr),
                          PAGEDATTN_ERROR_BAD_TENSOR, "key: " + shape));
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), bad->t(), good, 1, 1, nullptr),
                          PAGEDATTN_ERROR_BAD_TENSOR, "value: " + shape));
  }
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k_rows.t(), v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "key: shape[0] = 2 rows != slot_mapping length 3"));
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), k_rows.t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "value: shape[0] = 2 rows != slot_mapping length 3"));
  for (pat::Tensor* bad : {&k_f32, &k_bf}) {  // dtype differs from the (f16) cache
    const pagedattn_status s = pagedattn_kv_cache_write(c, 0, bad->t(), bad->t(), good, 1, 1, nullptr);
    EXPECT_TRUE(s == PAGEDATTN_ERROR_BAD_TENSOR || s == PAGEDATTN_ERROR_UNSUPPORTED)
        << pagedattn_status_string(s);
    const std::string named = std::string("key dtype ") +
                              (bad == &k_f32 ? "float32" : "bfloat16") + " with a float16 cache";
    EXPECT_NE(pat::last_error().find(named), std::string::npos) << pat::last_error();
  }
  // Rank 2, non-unit innermost stride, non-float dtype.
  pagedattn_tensor t = *k->t();
  int64_t shp2[2] = {3, 32};
  t.ndim = 2;
  t.shape = shp2;
  t.strides = nullptr;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, &t, v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "key: ndim 2 != 3"));
  t = *k->t();
  int64_t str[3] = {64, 16, 2};
  t.strides = str;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, &t, v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "key: innermost stride 2 != 1"));
  t = *k->t();
  t.dtype = {PAGEDATTN_DLPACK_INT, 16, 1};
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, &t, v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "key: dtype {code 0, bits 16, lanes 1}"));
  t = *k->t();
  t.device.device_type = dev.device_type == PAGEDATTN_DEVICE_CPU ? PAGEDATTN_DEVICE_CUDA
                                                                  : PAGEDATTN_DEVICE_CPU;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, &t, v->t(), good, 1, 1, nullptr),
                        PAGEDATTN_ERROR_WRONG_DEVICE,
                        dev.device_type == PAGEDATTN_DEVICE_CPU ? "key: on cuda:0" : "key: on cpu:0"));
  // Bad slot tensors: float, 2-D, length != rows.
  pagedattn_tensor s = *good;
  s.dtype = {PAGEDATTN_DLPACK_FLOAT, 32, 1};
  s.shape = shp;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(), &s, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR,
                        "slot_mapping: dtype {code 2, bits 32, lanes 1} is not int32 or int64"));
  s = *good;
  int64_t s2[2] = {3, 1};
  s.ndim = 2;
  s.shape = s2;
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(), &s, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "slot_mapping: ndim 2 != 1"));
  // A non-unit stride is refused on a one-element slot mapping too (tensor.h: every tensor
  // read has a unit innermost stride; fuzz_cache found one of stride 0 accepted).
  for (int64_t bad_stride : {int64_t{0}, int64_t{3}}) {
    pagedattn_tensor* one = slot_tensor({2});
    int64_t one_stride[1] = {bad_stride};
    pagedattn_tensor k1 = *k->t(), v1 = *v->t();
    int64_t shape1[3] = {1, k->heads(), k->dim()};
    k1.shape = v1.shape = shape1;
    one->strides = one_stride;
    EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, &k1, &v1, one, 1, 1, nullptr),
                          PAGEDATTN_ERROR_BAD_TENSOR,
                          "slot_mapping: innermost stride " + std::to_string(bad_stride) + " != 1"));
  }
  pagedattn_tensor* shorter = slot_tensor({0, 1});
  EXPECT_TRUE(status_is(pagedattn_kv_cache_write(c, 0, k->t(), v->t(), shorter, 1, 1, nullptr),
                        PAGEDATTN_ERROR_BAD_TENSOR, "key: shape[0] = 3 rows != slot_mapping length 2"));
  EXPECT_TRUE(unchanged());
}
