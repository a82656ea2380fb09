// The cache suite's fixture and helpers (test_cache.cpp, test_cache_blocks.cpp): geometries,
// the read_blocks record layout, random contents and a backend with its caches.
#ifndef PAGEDATTN_TESTS_CACHE_FIXTURE_H
#define PAGEDATTN_TESTS_CACHE_FIXTURE_H

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "pagedattn_test_support.h"

namespace cache_test {

using pat::status_is;

inline pagedattn_kv_cache_desc geom(int L, int nb, int bs, int hkv, int d, pagedattn_dtype dt,
                             pagedattn_layout lay = PAGEDATTN_LAYOUT_NHD) {
  pagedattn_kv_cache_desc g;
  pagedattn_kv_cache_desc_init(&g);
  g.num_layers = L;
  g.num_blocks = nb;
  g.block_size = bs;
  g.num_kv_heads = hkv;
  g.head_size = d;
  g.dtype = dt;
  g.layout = lay;
  return g;
}

// Offset in elements of (layer, kv, slot, head, d) inside one block record of read_blocks.
inline size_t rec_elem(const pagedattn_kv_cache_desc& g, int layer, int kv, int slot, int head,
                       int d) {
  const size_t be = static_cast<size_t>(g.block_size) * g.num_kv_heads * g.head_size;
  const size_t inner = g.layout == PAGEDATTN_LAYOUT_NHD
                           ? (static_cast<size_t>(slot) * g.num_kv_heads + head) * g.head_size + d
                           : (static_cast<size_t>(head) * g.block_size + slot) * g.head_size + d;
  return (static_cast<size_t>(layer) * 2 + kv) * be + inner;
}

class Cache : public pat::BackendTest {
 protected:
  void TearDown() override {
    for (auto* c : caches_) pagedattn_kv_cache_destroy(c);
    caches_.clear();
    pat::BackendTest::TearDown();
  }
  pagedattn_kv_cache* make(const pagedattn_kv_cache_desc& g) {
    pagedattn_kv_cache* c = nullptr;
    const pagedattn_status st = pagedattn_kv_cache_create(&c, be, &g);
    EXPECT_EQ(st, PAGEDATTN_OK) << pat::last_error();
    if (c) caches_.push_back(c);
    return c;
  }
  size_t bpb(const pagedattn_kv_cache_desc& g) {
    uint64_t b = 0;
    EXPECT_EQ(pagedattn_kv_cache_bytes_per_block(&b, &g), PAGEDATTN_OK) << pat::last_error();
    return static_cast<size_t>(b);
  }
  std::vector<uint8_t> read_all(pagedattn_kv_cache* c) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    EXPECT_EQ(pagedattn_kv_cache_get_desc(&g, c), PAGEDATTN_OK);
    std::vector<int32_t> ids(g.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<uint8_t> buf(bpb(g) * g.num_blocks);
    EXPECT_EQ(pagedattn_kv_cache_read_blocks(c, ids.data(), ids.size(), buf.data(), buf.size(),
                                             nullptr),
              PAGEDATTN_OK)
        << pat::last_error();
    return buf;
  }
  // Fills every block with random values of the cache dtype; returns the image.
  std::vector<uint8_t> fill_random(pagedattn_kv_cache* c, std::mt19937_64& rng) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    EXPECT_EQ(pagedattn_kv_cache_get_desc(&g, c), PAGEDATTN_OK);
    std::vector<int32_t> ids(g.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<uint8_t> buf(bpb(g) * g.num_blocks);
    const size_t es = pat::dtype_bytes(g.dtype);
    std::normal_distribution<float> n(0.f, 1.f);
    for (size_t o = 0; o < buf.size(); o += es) pat::store(g.dtype, &buf[o], n(rng));
    EXPECT_EQ(pagedattn_kv_cache_load_blocks(c, ids.data(), ids.size(), buf.data(), buf.size(),
                                             nullptr),
              PAGEDATTN_OK)
        << pat::last_error();
    return buf;
  }
  std::vector<pagedattn_kv_cache*> caches_;
};

}  // namespace cache_test

#endif  // PAGEDATTN_TESTS_CACHE_FIXTURE_H
