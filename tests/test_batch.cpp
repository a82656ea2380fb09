// Batch planning: slot mapping, query_start, info, caller and cross slot mappings, in-place
// update within capacity, and every refusal.
#include <climits>
#include <cstddef>
#include <cstring>
#include <numeric>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

class Batch : public pat::BackendTest {
 protected:
  void SetUp() override {
    pat::BackendTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cache = make_cache(nb, bs);
    ASSERT_NE(cache, nullptr);
  }
  void TearDown() override {
    pagedattn_batch_destroy(batch);
    for (auto* c : caches_) pagedattn_kv_cache_destroy(c);
    pat::BackendTest::TearDown();
  }
  // A one-layer f32 cache the fixture destroys in TearDown (nullptr, with a failure, if refused).
  pagedattn_kv_cache* make_cache(int nblocks, int bsize) {
    pagedattn_kv_cache_desc g;
    pagedattn_kv_cache_desc_init(&g);
    g.num_layers = 1;
    g.num_blocks = nblocks;
    g.block_size = bsize;
    g.num_kv_heads = 1;
    g.head_size = 8;
    g.dtype = PAGEDATTN_DTYPE_FLOAT32;
    pagedattn_kv_cache* c = nullptr;
    EXPECT_EQ(pagedattn_kv_cache_create(&c, be, &g), PAGEDATTN_OK) << pat::last_error();
    if (c != nullptr) caches_.push_back(c);
    return c;
  }
  // A batch description over vectors the fixture owns.
  void describe(std::vector<int32_t> q, std::vector<int32_t> ctx, std::vector<int32_t> tab,
                int32_t stride) {
    ql = std::move(q);
    cl = std::move(ctx);
    tables = std::move(tab);
    pagedattn_batch_desc_init(&bd);
    bd.num_seqs = static_cast<int32_t>(ql.size());
    bd.query_lens = ql.data();
    bd.context_lens = cl.data();
    bd.block_tables = tables.data();
    bd.block_table_stride = stride;
  }
  ::testing::AssertionResult info_is(int32_t seqs, int64_t tokens) {
    pagedattn_batch_info info{};
    info.struct_size = sizeof info;
    if (pagedattn_batch_get_info(&info, batch) != PAGEDATTN_OK)
      return ::testing::AssertionFailure() << pat::last_error();
    if (info.num_seqs != seqs || info.num_tokens != tokens)
      return ::testing::AssertionFailure() << "info: " << info.num_seqs << " seqs, "
                                           << info.num_tokens << " tokens; want " << seqs << ", "
                                           << tokens;
    return ::testing::AssertionSuccess();
  }
  std::vector<int64_t> slots() {
    const int64_t* s = nullptr;
    int64_t n = -1;
    EXPECT_EQ(pagedattn_batch_get_slot_mapping(&s, &n, batch), PAGEDATTN_OK);
    return std::vector<int64_t>(s, s + n);
  }
  const int nb = 64, bs = 4;
  pagedattn_kv_cache* cache = nullptr;
  pagedattn_batch* batch = nullptr;
  pagedattn_batch_desc bd;
  std::vector<int32_t> ql, cl, tables;
  std::vector<pagedattn_kv_cache*> caches_;  // every make_cache result, `cache` included
};

}  // namespace

TEST_F(Batch, SlotMappingQueryStartAndInfo) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 20; ++rep) {
    auto seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 9), 9, 20, true);
    const int n = static_cast<int>(seqs.size());
    int32_t width = 0;
    for (auto& s : seqs) width = std::max(width, (s.ctx + s.qlen + bs - 1) / bs);
    width += 1;
    std::vector<int32_t> ids(nb);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> q(n), c(n), tab(static_cast<size_t>(n) * width);
    for (size_t i = 0; i < tab.size(); ++i) tab[i] = ids[i % nb];
    int64_t tokens = 0;
    int32_t dec = 0, pre = 0, maxq = 0;
    int64_t maxlen = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = seqs[i].qlen;
      c[i] = seqs[i].ctx;
      tokens += q[i];
      dec += q[i] == 1;
      pre += q[i] > 1;
      maxq = std::max(maxq, q[i]);
      maxlen = std::max<int64_t>(maxlen, q[i] + c[i]);
    }
    describe(q, c, tab, width);
    pagedattn_batch_destroy(batch);
    batch = nullptr;
    ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK)
        << pat::last_error();
    EXPECT_STREQ(pagedattn_last_error(), "");
    pagedattn_batch_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
    EXPECT_EQ(info.num_seqs, n);
    EXPECT_EQ(info.num_tokens, tokens);
    EXPECT_EQ(info.num_encoder_tokens, 0);
    EXPECT_EQ(info.num_decode_seqs, dec);
    EXPECT_EQ(info.num_prefill_seqs, pre);
    EXPECT_EQ(info.max_query_len, maxq);
    EXPECT_EQ(info.max_seq_len, maxlen);
    EXPECT_EQ(info.max_num_seqs, n) << "capacity 0 = this batch's size";
    EXPECT_EQ(info.max_num_tokens, tokens);
    EXPECT_EQ(info.block_size, bs);
    const int32_t* qs = nullptr;
    int32_t qn = 0;
    ASSERT_EQ(pagedattn_batch_get_query_start(&qs, &qn, batch), PAGEDATTN_OK);
    ASSERT_EQ(qn, n + 1);
    int32_t acc = 0;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(qs[i], acc);
      acc += q[i];
    }
    EXPECT_EQ(qs[n], acc);
    auto sm = slots();
    ASSERT_EQ(static_cast<int64_t>(sm.size()), tokens);
    size_t t = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < q[i]; ++j, ++t) {
        const int p = c[i] + j;
        EXPECT_EQ(sm[t], static_cast<int64_t>(tab[i * width + p / bs]) * bs + p % bs)
            << "seq " << i << " token " << j;
      }
    const int64_t* cs = nullptr;
    int64_t cn = -1;
    ASSERT_EQ(pagedattn_batch_get_cross_slot_mapping(&cs, &cn, batch), PAGEDATTN_OK);
    EXPECT_EQ(cn, 0);
  }
}

TEST_F(Batch, CallerSlotMapping) {
  describe({2, 1}, {0, 5}, {3, 4, 9, 8}, 2);
  const std::vector<int64_t> mine = {17, -1, 200};
  bd.slot_mapping = mine.data();
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
  EXPECT_EQ(slots(), mine);
  pagedattn_batch_destroy(batch);
  batch = nullptr;
  const std::vector<int64_t> oob = {17, -1, nb * bs};
  bd.slot_mapping = oob.data();
  EXPECT_TRUE(status_is(pagedattn_batch_create(&batch, be, cache, nullptr, &bd),
                        PAGEDATTN_ERROR_OUT_OF_RANGE,
                        "desc->slot_mapping[2] = " + std::to_string(nb * bs) + " >= num_blocks*block_size"));
  const std::vector<int64_t> neg = {17, -2, 3};
  bd.slot_mapping = neg.data();
  EXPECT_TRUE(status_is(pagedattn_batch_create(&batch, be, cache, nullptr, &bd),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->slot_mapping[1] = -2"));
  EXPECT_EQ(batch, nullptr);
}

TEST_F(Batch, CrossSlotMapping) {
  // Seq 0 at its first step (writes 5 encoder tokens), seq 1 decoding (encoder already cached),
  // seq 2 first step with 2 encoder tokens.
  describe({3, 1, 1}, {0, 7, 0}, {1, 2, 3, 4, 5, 6}, 2);
  const std::vector<int32_t> enc = {5, 6, 2};
  const std::vector<int32_t> ctab = {10, 11, 20, 21, 30, 31};
  bd.encoder_lens = enc.data();
  bd.cross_block_tables = ctab.data();
  bd.cross_block_table_stride = 2;
  pagedattn_kv_cache* xc = make_cache(40, bs);
  ASSERT_NE(xc, nullptr);
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, xc, &bd), PAGEDATTN_OK) << pat::last_error();
  const int64_t* cs = nullptr;
  int64_t cn = 0;
  ASSERT_EQ(pagedattn_batch_get_cross_slot_mapping(&cs, &cn, batch), PAGEDATTN_OK);
  const std::vector<int64_t> want = {40, 41, 42, 43, 44, 120, 121};
  ASSERT_EQ(cn, static_cast<int64_t>(want.size()));
  EXPECT_EQ(std::vector<int64_t>(cs, cs + cn), want);
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
  EXPECT_EQ(info.num_encoder_tokens, 7);
  EXPECT_EQ(info.max_num_encoder_tokens, 13) << "0 = this batch's sum(encoder_lens)";
  // Self tables reach 2 blocks of 4, cross tables 2 blocks of 4: the larger, 8.
  EXPECT_EQ(info.max_seq_len_capacity, 8);
  // Same cache for self and cross is allowed.
  pagedattn_batch* b2 = nullptr;
  EXPECT_EQ(pagedattn_batch_create(&b2, be, cache, cache, &bd), PAGEDATTN_OK) << pat::last_error();
  pagedattn_batch_destroy(b2);
  // A cross block id outside the cross cache.
  const std::vector<int32_t> bad = {10, 11, 20, 40, 30, 31};
  bd.cross_block_tables = bad.data();
  b2 = nullptr;
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b2, be, cache, xc, &bd),
                        PAGEDATTN_ERROR_OUT_OF_RANGE, "cross_block_tables[1][1] = 40 >= num_blocks 40"));
  bd.cross_block_tables = nullptr;
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b2, be, cache, xc, &bd), PAGEDATTN_ERROR_NULL_POINTER,
                        "desc->cross_block_tables is NULL"));
  bd.cross_block_tables = ctab.data();
  const std::vector<int32_t> negenc = {5, -1, 2};
  bd.encoder_lens = negenc.data();
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b2, be, cache, xc, &bd),
                        PAGEDATTN_ERROR_INVALID_ARGUMENT, "encoder_lens[1] = -1 < 0"));
  EXPECT_EQ(b2, nullptr);
}

TEST_F(Batch, EncoderOnlyBatchNeedsNoCache) {
  describe({4, 2}, {0, 0}, {}, 0);
  bd.block_tables = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, nullptr, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  EXPECT_TRUE(info_is(2, 6));
  // A table without a cache has nothing to be checked against.
  pagedattn_batch* b2 = nullptr;
  const std::vector<int32_t> tab = {0, 1};
  bd.block_tables = tab.data();
  bd.block_table_stride = 1;
  const pagedattn_status st = pagedattn_batch_create(&b2, be, nullptr, nullptr, &bd);
  EXPECT_TRUE(st == PAGEDATTN_ERROR_NULL_POINTER || st == PAGEDATTN_ERROR_INVALID_ARGUMENT)
      << pagedattn_status_string(st);
  EXPECT_EQ(b2, nullptr);
}

TEST_F(Batch, UpdateInPlaceWithinCapacity) {
  describe({3, 1}, {0, 9}, {5, 6, 7, 1, 2, 3}, 3);
  bd.max_num_seqs = 4;
  bd.max_num_tokens = 12;
  bd.max_blocks_per_seq = 4;
  bd.max_seq_len = 16;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
  EXPECT_EQ(info.max_num_seqs, 4);
  EXPECT_EQ(info.max_num_tokens, 12);
  EXPECT_EQ(info.max_blocks_per_seq, 4);
  const int64_t* before_ptr = nullptr;
  int64_t n0 = 0;
  ASSERT_EQ(pagedattn_batch_get_slot_mapping(&before_ptr, &n0, batch), PAGEDATTN_OK);
  EXPECT_EQ(n0, 4);

  // New step: 4 sequences, 12 tokens, 4 blocks wide, longest 16.
  pagedattn_batch_desc u;
  pagedattn_batch_desc_init(&u);
  const std::vector<int32_t> q = {1, 1, 8, 2}, c = {15, 3, 0, 6};
  const std::vector<int32_t> tab = {9, 8, 7, 6, 1, 0, 0, 0, 10, 11, 0, 0, 20, 21, 0, 0};
  u.num_seqs = 4;
  u.query_lens = q.data();
  u.context_lens = c.data();
  u.block_tables = tab.data();
  u.block_table_stride = 4;
  u.max_num_seqs = 1;  // capacity fields are ignored by update
  ASSERT_EQ(pagedattn_batch_update(batch, &u), PAGEDATTN_OK) << pat::last_error();
  EXPECT_TRUE(info_is(4, 12));
  const std::vector<int64_t> want = {6 * 4 + 3, 1 * 4 + 3, 40, 41, 42, 43, 44, 45, 46, 47,
                                     21 * 4 + 2, 21 * 4 + 3};
  EXPECT_EQ(slots(), want);
  const int32_t* qs = nullptr;
  int32_t qn = 0;
  ASSERT_EQ(pagedattn_batch_get_query_start(&qs, &qn, batch), PAGEDATTN_OK);
  ASSERT_EQ(qn, 5);
  EXPECT_EQ(std::vector<int32_t>(qs, qs + 5), (std::vector<int32_t>{0, 1, 2, 10, 12}));
}

TEST_F(Batch, DefaultCapacitiesCoverTheTablesPassed) {
  // A prefill step planned from a table sized for the sequence's final length (3 blocks): the
  // decode steps that follow fit without hand-set capacities, up to what the table addresses.
  describe({5}, {0}, {4, 9, 2}, 3);
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
  EXPECT_EQ(info.max_blocks_per_seq, 3) << "0 = block_table_stride";
  EXPECT_EQ(info.max_seq_len_capacity, 3 * bs) << "0 = what the table addresses";
  EXPECT_EQ(info.max_seq_len, 5);
  EXPECT_EQ(info.max_num_seqs, 1);
  EXPECT_EQ(info.max_num_tokens, 5);
  // A one-token step of the sequence at context `ctx` over `table`.
  const std::vector<int32_t> q = {1}, tab = {4, 9, 2}, wide = {4, 9, 2, 7};
  int32_t ctx = 0;
  auto step = [&](const std::vector<int32_t>& table) {
    pagedattn_batch_desc u;
    pagedattn_batch_desc_init(&u);
    u.num_seqs = 1;
    u.query_lens = q.data();
    u.context_lens = &ctx;
    u.block_tables = table.data();
    u.block_table_stride = static_cast<int32_t>(table.size());
    return pagedattn_batch_update(batch, &u);
  };
  for (ctx = 5; ctx < 3 * bs; ++ctx) {
    ASSERT_EQ(step(tab), PAGEDATTN_OK) << ctx << ": " << pat::last_error();
    EXPECT_EQ(slots(), (std::vector<int64_t>{tab[ctx / bs] * int64_t{bs} + ctx % bs}));
  }
  // One token past the table's reach is refused, and the batch keeps its last step.
  const auto before = slots();
  ctx = 3 * bs;
  EXPECT_TRUE(status_is(step(wide), PAGEDATTN_ERROR_CAPACITY,
                        "table width needed 4 > max_blocks_per_seq 3"));
  EXPECT_EQ(slots(), before);
  // Explicit capacities still mean exactly what they say.
  pagedattn_batch_destroy(batch);
  batch = nullptr;
  describe({5}, {0}, {4, 9, 2}, 3);
  bd.max_blocks_per_seq = 2;  // 5 tokens of block size 4
  bd.max_seq_len = 5;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  ctx = 5;
  EXPECT_TRUE(status_is(step(tab), PAGEDATTN_ERROR_CAPACITY,
                        "max sequence length 6 > max_seq_len 5"));
}

TEST_F(Batch, UpdateBeyondCapacityKeepsPreviousContents) {
  describe({2, 1}, {0, 4}, {5, 6, 7, 1, 2, 3}, 3);
  bd.max_num_seqs = 3;
  bd.max_num_tokens = 6;
  bd.max_blocks_per_seq = 3;
  bd.max_seq_len = 10;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK) << pat::last_error();
  const auto before = slots();
  struct Case {
    const char* what;
    std::vector<int32_t> q, c;
    int32_t stride;
    pagedattn_status st;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"more sequences", {1, 1, 1, 1}, {0, 0, 0, 0}, 1, PAGEDATTN_ERROR_CAPACITY,
       "num_seqs 4 > max_num_seqs 3"},
      {"more tokens", {4, 3}, {0, 0}, 2, PAGEDATTN_ERROR_CAPACITY,
       "sum(query_lens) 7 > max_num_tokens 6"},
      {"wider table", {1}, {12}, 4, PAGEDATTN_ERROR_CAPACITY,
       "table width needed 4 > max_blocks_per_seq 3"},
      {"longer sequence", {1}, {10}, 3, PAGEDATTN_ERROR_CAPACITY,
       "max sequence length 11 > max_seq_len 10"},
      {"bad block id", {1, 1}, {0, 0}, 1, PAGEDATTN_ERROR_OUT_OF_RANGE,
       "block_tables[1][0] = " + std::to_string(nb) + " >= num_blocks " + std::to_string(nb)},
      {"negative length", {1, -1}, {0, 0}, 1, PAGEDATTN_ERROR_INVALID_ARGUMENT,
       "query_lens[1] = -1 < 0"},
  };
  for (const Case& cs : cases) {
    std::vector<int32_t> tab(cs.q.size() * cs.stride, 2);
    if (std::string(cs.what) == "bad block id") tab[1] = nb;
    pagedattn_batch_desc u;
    pagedattn_batch_desc_init(&u);
    u.num_seqs = static_cast<int32_t>(cs.q.size());
    u.query_lens = cs.q.data();
    u.context_lens = cs.c.data();
    u.block_tables = tab.data();
    u.block_table_stride = cs.stride;
    EXPECT_TRUE(status_is(pagedattn_batch_update(batch, &u), cs.st, cs.needle)) << cs.what;
    EXPECT_TRUE(info_is(2, 3)) << "after failed update: " << cs.what;
    EXPECT_EQ(slots(), before) << "after failed update: " << cs.what;
  }
  EXPECT_TRUE(status_is(pagedattn_batch_update(nullptr, &bd), PAGEDATTN_ERROR_NULL_POINTER,
                        "batch is NULL"));
  EXPECT_TRUE(status_is(pagedattn_batch_update(batch, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "desc is NULL"));
  EXPECT_TRUE(info_is(2, 3)) << "after a NULL desc";
  EXPECT_EQ(slots(), before) << "after a NULL desc";
}

TEST_F(Batch, Refusals) {
  pagedattn_batch* const sentinel = reinterpret_cast<pagedattn_batch*>(0x30);
  pagedattn_batch* b = sentinel;
  auto expect = [&](pagedattn_status st, const char* needle, const char* what) {
    EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, cache, nullptr, &bd), st, needle)) << what;
    EXPECT_EQ(b, sentinel) << what;
  };
  describe({2, -3}, {0, 0}, {0, 1}, 1);
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "query_lens[1] = -3 < 0", "negative query_len");
  describe({2, 1}, {0, -5}, {0, 1}, 1);
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "context_lens[1] = -5 < 0", "negative context_len");
  describe({2, 1}, {0, 0}, {0, 1}, 1);
  bd.num_seqs = -1;
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->num_seqs = -1 < 0", "negative num_seqs");
  // Row too short: seq 1 needs ceil((6+1)/4) = 2 entries, stride 1.
  describe({2, 1}, {0, 6}, {0, 1}, 1);
  expect(PAGEDATTN_ERROR_OUT_OF_RANGE, "block_table_stride 1 < 2 blocks needed by sequence 1",
         "row shorter than needed");
  describe({1, 1}, {0, 5}, {3, 4, 5, 777}, 2);
  expect(PAGEDATTN_ERROR_OUT_OF_RANGE, "block_tables[1][1] = 777 >= num_blocks 64",
         "block id >= num_blocks");
  describe({1, 1}, {0, 5}, {3, 4, 5, -4}, 2);
  expect(PAGEDATTN_ERROR_OUT_OF_RANGE, "block_tables[1][1] = -4 < 0", "negative block id");
  describe({1}, {0}, {0}, 0);
  expect(PAGEDATTN_ERROR_OUT_OF_RANGE, "block_table_stride 0 < 1 blocks needed by sequence 0",
         "table stride 0 with tokens");
  // NULL arrays.
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  bd.query_lens = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->query_lens is NULL", "NULL query_lens");
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  bd.context_lens = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->context_lens is NULL", "NULL context_lens");
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  bd.block_tables = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->block_tables is NULL", "NULL block_tables with a cache");
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  bd.struct_size = 8;
  expect(PAGEDATTN_ERROR_STRUCT_SIZE, "desc->struct_size = 8", "struct_size");
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  bd.max_num_seqs = 1;
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->max_num_seqs = 1 < 2", "capacity below the batch");
  EXPECT_TRUE(status_is(pagedattn_batch_create(nullptr, be, cache, nullptr, &bd),
                        PAGEDATTN_ERROR_NULL_POINTER, "out is NULL"));
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b, nullptr, cache, nullptr, &bd),
                        PAGEDATTN_ERROR_NULL_POINTER, "backend is NULL"));
  EXPECT_EQ(b, sentinel);
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, cache, nullptr, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "desc is NULL"));
  EXPECT_EQ(b, sentinel);
  // A cache of another backend.
  pagedattn_backend* be2 = nullptr;
  ASSERT_EQ(pagedattn_backend_create(&be2, pat::backend_name().c_str(), nullptr), PAGEDATTN_OK);
  pagedattn_kv_cache_desc g;
  pagedattn_kv_cache_desc_init(&g);
  ASSERT_EQ(pagedattn_kv_cache_get_desc(&g, cache), PAGEDATTN_OK);
  pagedattn_kv_cache* other = nullptr;
  ASSERT_EQ(pagedattn_kv_cache_create(&other, be2, &g), PAGEDATTN_OK);
  describe({1, 1}, {0, 0}, {0, 1}, 1);
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, other, nullptr, &bd),
                        PAGEDATTN_ERROR_INVALID_HANDLE, "cache belongs to another backend"));
  EXPECT_EQ(b, sentinel);
  pagedattn_kv_cache_destroy(other);
  pagedattn_backend_destroy(be2);
  // Getters.
  const int64_t* p = nullptr;
  int64_t n = 0;
  EXPECT_TRUE(status_is(pagedattn_batch_get_slot_mapping(&p, &n, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "batch is NULL"));
  EXPECT_TRUE(p == nullptr && n == 0) << "a refused getter wrote its outputs";
  EXPECT_TRUE(status_is(pagedattn_batch_get_slot_mapping(nullptr, &n, nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER, "out is NULL"));
  EXPECT_EQ(n, 0);
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  const pagedattn_batch_info info0 = info;
  EXPECT_TRUE(status_is(pagedattn_batch_get_info(&info, nullptr), PAGEDATTN_ERROR_NULL_POINTER,
                        "batch is NULL"));
  EXPECT_EQ(std::memcmp(&info, &info0, sizeof info), 0) << "a refused get_info wrote its output";
}

TEST_F(Batch, CountsThatOverflow) {
  // 3 x 2^30 tokens exceed the int32 rows of query_start; tables are wide enough to be valid.
  pagedattn_kv_cache* big = make_cache(1, 256);
  ASSERT_NE(big, nullptr);
  const int32_t q = 1 << 30;
  const int32_t width = q / 256;
  std::vector<int32_t> tab(static_cast<size_t>(3) * width, 0);
  describe({q, q, q}, {0, 0, 0}, std::move(tab), width);
  pagedattn_batch* b = nullptr;
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, big, nullptr, &bd), PAGEDATTN_ERROR_OVERFLOW,
                        "sum(query_lens) overflows int32 at sequence 1"));
  EXPECT_EQ(b, nullptr);
  // context_len + query_len beyond int32.
  const int32_t w2 = static_cast<int32_t>((static_cast<int64_t>(INT32_MAX) + 1 + 255) / 256);
  std::vector<int32_t> tab2(static_cast<size_t>(w2), 0);
  describe({1}, {INT32_MAX}, std::move(tab2), w2);
  EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, big, nullptr, &bd), PAGEDATTN_ERROR_OVERFLOW,
                        "context_lens[0] + query_lens[0] = 2147483648 overflows int32"));
  EXPECT_EQ(b, nullptr);
}

TEST_F(Batch, CrossTableWidthOverflowRefused) {
  // Regression: max_seq_len sizes the cross tables' rows (max_seq_len / block_size entries); a
  // width past int32 was truncated (2^40 / 4 -> 0), the table allocated that narrow and the
  // cross rows copied past it (a heap write, found by fuzz_batch once capacities could take
  // any size; tests/fuzz/corpus/batch/regression-cross-stride-overflow).
  describe({1, 1}, {0, 3}, {0, 1, 2, 3}, 2);
  const std::vector<int32_t> enc = {2, 5};
  const std::vector<int32_t> ctab = {4, 5, 6, 7};
  bd.encoder_lens = enc.data();
  bd.cross_block_tables = ctab.data();
  bd.cross_block_table_stride = 2;
  pagedattn_kv_cache* xc = make_cache(8, bs);
  ASSERT_NE(xc, nullptr);
  pagedattn_batch* const sentinel = reinterpret_cast<pagedattn_batch*>(0x40);
  for (int64_t cap : {int64_t{1} << 40, int64_t{INT32_MAX} * bs + 1, int64_t{INT64_MAX}}) {
    pagedattn_batch* b = sentinel;
    bd.max_seq_len = cap;
    EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, cache, xc, &bd), PAGEDATTN_ERROR_OVERFLOW,
                          "desc->max_seq_len = " + std::to_string(cap)));
    EXPECT_EQ(b, sentinel);
  }
  // A wide capacity that fits int32 is planned, the cross rows copied into it.
  bd.max_seq_len = 4096;
  pagedattn_batch* b = nullptr;
  ASSERT_EQ(pagedattn_batch_create(&b, be, cache, xc, &bd), PAGEDATTN_OK) << pat::last_error();
  const int64_t* cs = nullptr;
  int64_t cn = 0;
  ASSERT_EQ(pagedattn_batch_get_cross_slot_mapping(&cs, &cn, b), PAGEDATTN_OK);
  EXPECT_EQ(std::vector<int64_t>(cs, cs + cn), (std::vector<int64_t>{16, 17}));
  pagedattn_batch_destroy(b);
}

TEST_F(Batch, SeqLensFormPlansTheSameBatch) {
  // seq_lens (context + new tokens) with query_start_loc, as vLLM v1 and FlashInfer hold them,
  // give the batch query_lens + context_lens give: slots, query starts and info, at create and
  // through update (either form updating a batch planned in the other).
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < 20; ++rep) {
    auto seqs = pat::random_mixed_seqs(rng, 1 + static_cast<int>(rng() % 9), 9, 20, true);
    const int n = static_cast<int>(seqs.size());
    int32_t width = 1;
    for (auto& s : seqs) width = std::max(width, (s.ctx + s.qlen + bs - 1) / bs);
    std::vector<int32_t> ids(nb);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> q(n), c(n), sl(n), qsl(n + 1, 0), tab(static_cast<size_t>(n) * width);
    for (size_t i = 0; i < tab.size(); ++i) tab[i] = ids[i % nb];
    for (int i = 0; i < n; ++i) {
      q[i] = seqs[i].qlen;
      c[i] = seqs[i].ctx;
      sl[i] = c[i] + q[i];
      qsl[i + 1] = qsl[i] + q[i];
    }
    describe(q, c, tab, width);
    pagedattn_batch_desc sd;
    ASSERT_EQ(pagedattn_batch_desc_init_sized(&sd, sizeof sd), PAGEDATTN_OK);
    sd.num_seqs = n;
    sd.lens_form = PAGEDATTN_BATCH_LENS_SEQ;
    sd.seq_lens = sl.data();
    sd.query_start_loc = qsl.data();
    sd.block_tables = tab.data();
    sd.block_table_stride = width;
    bd.max_num_tokens = sd.max_num_tokens = 100;  // room for the decode step below
    auto snapshot = [&](pagedattn_batch* b, std::vector<int64_t>* sm, std::vector<int32_t>* qs,
                        pagedattn_batch_info* info) {
      const int64_t* s = nullptr;
      int64_t sn = -1;
      ASSERT_EQ(pagedattn_batch_get_slot_mapping(&s, &sn, b), PAGEDATTN_OK);
      sm->assign(s, s + sn);
      const int32_t* st = nullptr;
      int32_t stn = -1;
      ASSERT_EQ(pagedattn_batch_get_query_start(&st, &stn, b), PAGEDATTN_OK);
      qs->assign(st, st + stn);
      *info = pagedattn_batch_info{};
      info->struct_size = sizeof *info;
      ASSERT_EQ(pagedattn_batch_get_info(info, b), PAGEDATTN_OK);
    };
    pagedattn_batch *bc = nullptr, *bs2 = nullptr;
    ASSERT_EQ(pagedattn_batch_create(&bc, be, cache, nullptr, &bd), PAGEDATTN_OK)
        << pat::last_error();
    ASSERT_EQ(pagedattn_batch_create(&bs2, be, cache, nullptr, &sd), PAGEDATTN_OK)
        << pat::last_error();
    std::vector<int64_t> sm_c, sm_s;
    std::vector<int32_t> qs_c, qs_s;
    pagedattn_batch_info in_c, in_s;
    snapshot(bc, &sm_c, &qs_c, &in_c);
    snapshot(bs2, &sm_s, &qs_s, &in_s);
    EXPECT_EQ(sm_c, sm_s);
    EXPECT_EQ(qs_c, qs_s);
    EXPECT_EQ(qs_s, qsl);
    EXPECT_EQ(std::memcmp(&in_c, &in_s, sizeof in_c), 0) << "batch info differs between forms";
    // Update each batch with the other's form of a decode step of the same sequences.
    std::vector<int32_t> q1(n, 1), c1(n), sl1(n), qsl1(n + 1);
    for (int i = 0; i < n; ++i) {
      c1[i] = std::min(c[i], width * bs - 1);
      sl1[i] = c1[i] + 1;
      qsl1[i + 1] = i + 1;
    }
    qsl1[0] = 0;
    pagedattn_batch_desc ud = bd, us = sd;
    ud.query_lens = q1.data();
    ud.context_lens = c1.data();
    us.seq_lens = sl1.data();
    us.query_start_loc = qsl1.data();
    ASSERT_EQ(pagedattn_batch_update(bc, &us), PAGEDATTN_OK) << pat::last_error();
    ASSERT_EQ(pagedattn_batch_update(bs2, &ud), PAGEDATTN_OK) << pat::last_error();
    snapshot(bc, &sm_c, &qs_c, &in_c);
    snapshot(bs2, &sm_s, &qs_s, &in_s);
    EXPECT_EQ(sm_c, sm_s);
    EXPECT_EQ(qs_c, qsl1);
    EXPECT_EQ(qs_s, qsl1);
    ASSERT_EQ(static_cast<int>(sm_c.size()), n);
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(sm_c[i], static_cast<int64_t>(tab[i * width + c1[i] / bs]) * bs + c1[i] % bs)
          << "seq " << i;
    pagedattn_batch_destroy(bc);
    pagedattn_batch_destroy(bs2);
  }
}

TEST_F(Batch, DescInitSizesAndOldStructSize) {
  // pagedattn_batch_desc_init fills the 0.1 layout only (never past an old caller's struct);
  // init_sized fills what it is told. A 0.1-sized desc reads as the CONTEXT form whatever lies
  // past its struct_size.
  const size_t v01 = offsetof(pagedattn_batch_desc, lens_form);
  std::vector<uint8_t> mem(sizeof(pagedattn_batch_desc) + 8, 0xAB);
  auto* d = reinterpret_cast<pagedattn_batch_desc*>(mem.data());
  ASSERT_EQ(pagedattn_batch_desc_init(d), PAGEDATTN_OK);
  EXPECT_EQ(d->struct_size, v01);
  for (size_t i = sizeof(uint32_t); i < v01; ++i) EXPECT_EQ(mem[i], 0) << "byte " << i;
  for (size_t i = v01; i < mem.size(); ++i)
    ASSERT_EQ(mem[i], 0xAB) << "desc_init wrote byte " << i << " past the 0.1 layout";
  std::fill(mem.begin(), mem.end(), 0xAB);
  ASSERT_EQ(pagedattn_batch_desc_init_sized(d, sizeof *d), PAGEDATTN_OK);
  EXPECT_EQ(d->struct_size, sizeof *d);
  EXPECT_EQ(d->lens_form, PAGEDATTN_BATCH_LENS_CONTEXT);
  EXPECT_EQ(d->seq_lens, nullptr);
  EXPECT_EQ(d->query_start_loc, nullptr);
  for (size_t i = sizeof *d; i < mem.size(); ++i) EXPECT_EQ(mem[i], 0xAB) << "byte " << i;
  EXPECT_TRUE(status_is(pagedattn_batch_desc_init_sized(d, 8), PAGEDATTN_ERROR_STRUCT_SIZE,
                        "desc->struct_size = 8"));
  EXPECT_TRUE(status_is(pagedattn_batch_desc_init_sized(d, sizeof *d + 8),
                        PAGEDATTN_ERROR_STRUCT_SIZE, "is not a known size"));
  // Between the two layouts: it would cut a pointer of the SEQ form short.
  EXPECT_TRUE(status_is(pagedattn_batch_desc_init_sized(d, static_cast<uint32_t>(v01 + 12)),
                        PAGEDATTN_ERROR_STRUCT_SIZE, "is not a known size"));
  EXPECT_TRUE(status_is(pagedattn_batch_desc_init_sized(nullptr, sizeof *d),
                        PAGEDATTN_ERROR_NULL_POINTER, "desc is NULL"));

  // A caller built against 0.1: struct_size covers the 0.1 fields, garbage follows.
  describe({2, 1}, {3, 7}, {5, 6, 7, 8}, 2);
  bd.struct_size = static_cast<uint32_t>(v01);
  std::memset(reinterpret_cast<char*>(&bd) + v01, 0x5A, sizeof bd - v01);
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  EXPECT_TRUE(info_is(2, 3));
  const auto sm = slots();
  ASSERT_EQ(sm.size(), 3u);
  EXPECT_EQ(sm[0], 5 * bs + 3);  // sequence 0: positions 3, 4 (blocks 5, 6)
  EXPECT_EQ(sm[1], 6 * bs + 0);
  EXPECT_EQ(sm[2], 8 * bs + 3);  // sequence 1: position 7 (block 8)
  // And updated the same way.
  ASSERT_EQ(pagedattn_batch_update(batch, &bd), PAGEDATTN_OK) << pat::last_error();
  EXPECT_EQ(slots(), sm);
}

TEST_F(Batch, SeqLensFormRefusals) {
  // Each refusal of the SEQ form: its status, a message naming the field, the sequence and the
  // values, and nothing created (create) or changed (update).
  pagedattn_batch* const sentinel = reinterpret_cast<pagedattn_batch*>(0x30);
  std::vector<int32_t> sl, qsl;
  std::vector<int32_t> tab = {0, 1, 2, 3, 4, 5};
  pagedattn_batch_desc sd;
  auto seq_desc = [&](std::vector<int32_t> s, std::vector<int32_t> starts) {
    sl = std::move(s);
    qsl = std::move(starts);
    ASSERT_EQ(pagedattn_batch_desc_init_sized(&sd, sizeof sd), PAGEDATTN_OK);
    sd.num_seqs = static_cast<int32_t>(sl.size());
    sd.lens_form = PAGEDATTN_BATCH_LENS_SEQ;
    sd.seq_lens = sl.data();
    sd.query_start_loc = qsl.data();
    sd.block_tables = tab.data();
    sd.block_table_stride = 3;
  };
  // A batch to update: one decode and one prefill chunk (capacity for 8 tokens).
  seq_desc({6, 5}, {0, 1, 4});
  sd.max_num_tokens = 8;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &sd), PAGEDATTN_OK)
      << pat::last_error();
  const auto sm0 = slots();
  ASSERT_EQ(sm0, (std::vector<int64_t>{1 * bs + 1, 3 * bs + 2, 3 * bs + 3, 4 * bs + 0}));
  auto expect = [&](pagedattn_status st, const char* needle, const char* what) {
    SCOPED_TRACE(what);
    pagedattn_batch* b = sentinel;
    EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, cache, nullptr, &sd), st, needle));
    EXPECT_EQ(b, sentinel);
    EXPECT_TRUE(status_is(pagedattn_batch_update(batch, &sd), st, needle));
    EXPECT_EQ(slots(), sm0) << "a refused update changed the batch";
    EXPECT_TRUE(info_is(2, 4));
  };
  seq_desc({6, 2}, {0, 1, 4});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->seq_lens[1] = 2 < 3, the query length of sequence 1", "seq_len < query_len");
  seq_desc({6, 5}, {1, 2, 4});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->query_start_loc[0] = 1, must be 0",
         "query_start_loc not from 0");
  seq_desc({6, 5}, {0, 3, 2});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->query_start_loc[2] = 2 < query_start_loc[1] = 3: sequence 1", "decreasing");
  seq_desc({6, 5}, {0, 1, 4});
  sd.seq_lens = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->seq_lens is NULL", "NULL seq_lens");
  seq_desc({6, 5}, {0, 1, 4});
  sd.query_start_loc = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->query_start_loc is NULL", "NULL query_start_loc");
  seq_desc({6, 5}, {0, 1, 4});
  std::vector<int32_t> ql = {1, 3};
  sd.query_lens = ql.data();
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->query_lens is set but desc->lens_form is PAGEDATTN_BATCH_LENS_SEQ", "both forms");
  seq_desc({6, 5}, {0, 1, 4});
  sd.lens_form = static_cast<pagedattn_batch_lens_form>(7);
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->lens_form = 7 is not", "unknown form");
  seq_desc({6, 5}, {0, 1, 4});
  sd.lens_form = PAGEDATTN_BATCH_LENS_CONTEXT;
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->seq_lens is set but desc->lens_form is PAGEDATTN_BATCH_LENS_CONTEXT",
         "seq_lens without the form");
  // Past the capacity: the last query_start_loc is the token count.
  seq_desc({6, 9}, {0, 1, 9});
  EXPECT_TRUE(status_is(pagedattn_batch_update(batch, &sd), PAGEDATTN_ERROR_CAPACITY,
                        "sum(query_lens) 9 > max_num_tokens 8"));
  EXPECT_EQ(slots(), sm0);
}

TEST_F(Batch, TreeMaskRefusals) {
  // Each refusal of a malformed tree mask (docs/semantics.md 4.7): its status, a message naming
  // the sequence, row and column, and nothing created (create) or changed (update).
  pagedattn_batch* const sentinel = reinterpret_cast<pagedattn_batch*>(0x40);
  // Sequence 0 decodes one token (its 1-bit mask, or none); sequence 1 verifies 3 drafts:
  // token 0, then tokens 1 and 2 both children of token 0 (rows 0b001, 0b011, 0b101).
  std::vector<uint8_t> bits;
  std::vector<int64_t> indptr;
  auto tree_desc = [&](std::vector<uint8_t> b, std::vector<int64_t> ip) {
    bits = std::move(b);
    indptr = std::move(ip);
    describe({1, 3}, {5, 2}, {0, 1, 2, 3, 4, 5}, 3);
    ASSERT_EQ(pagedattn_batch_desc_init_sized(&bd, sizeof bd), PAGEDATTN_OK);
    bd.num_seqs = 2;
    bd.query_lens = ql.data();
    bd.context_lens = cl.data();
    bd.block_tables = tables.data();
    bd.block_table_stride = 3;
    bd.tree_mask = bits.data();
    bd.tree_mask_indptr = indptr.data();
  };
  // Row r of sequence 1 at bits 3r..3r+2 (LSB first): 0b101'011'001 = 0x159, 2 bytes.
  tree_desc({0x01, 0x59, 0x01}, {0, 1, 3});
  bd.max_tree_mask_bytes = 8;
  ASSERT_EQ(pagedattn_batch_create(&batch, be, cache, nullptr, &bd), PAGEDATTN_OK)
      << pat::last_error();
  pagedattn_batch_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(pagedattn_batch_get_info(&info, batch), PAGEDATTN_OK);
  EXPECT_EQ(info.max_tree_mask_bytes, 8);
  const auto sm0 = slots();
  auto expect = [&](pagedattn_status st, const std::string& needle, const char* what) {
    SCOPED_TRACE(what);
    pagedattn_batch* b = sentinel;
    EXPECT_TRUE(status_is(pagedattn_batch_create(&b, be, cache, nullptr, &bd), st, needle));
    EXPECT_EQ(b, sentinel);
    EXPECT_TRUE(status_is(pagedattn_batch_update(batch, &bd), st, needle));
    EXPECT_EQ(slots(), sm0) << "a refused update changed the batch";
    EXPECT_TRUE(info_is(2, 4));
  };
  tree_desc({0x01, 0x59, 0x01}, {1, 2, 4});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->tree_mask_indptr[0] = 1, must be 0", "indptr[0]");
  tree_desc({0x01, 0x59, 0x01}, {0, 3, 1});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->tree_mask_indptr[2] = 1 < tree_mask_indptr[1] = 3",
         "decreasing indptr");
  tree_desc({0x01, 0x59}, {0, 1, 2});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "sequence 1's tree mask has 1 bytes (tree_mask_indptr[2] - [1]) < 2, the 3 x 3 bits",
         "short segment");
  tree_desc({0x01, 0x58, 0x01}, {0, 1, 3});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "sequence 1's tree mask: row 0 does not see itself (bit 0, the diagonal, is clear)",
         "diagonal clear");
  tree_desc({0x00, 0x59, 0x01}, {0, 1, 3});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT, "sequence 0's tree mask: row 0 does not see itself",
         "a decode's diagonal clear");
  tree_desc({0x01, 0x5B, 0x01}, {0, 1, 3});
  expect(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "sequence 1's tree mask: row 0 sees the later token 1 (bit 1, above the diagonal)",
         "above the diagonal");
  tree_desc({0x01, 0x59, 0x01}, {0, 1, 3});
  bd.tree_mask = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->tree_mask is NULL but tree_mask_indptr gives sequence 0 a mask",
         "NULL bits");
  tree_desc({0x01, 0x59, 0x01}, {0, 1, 3});
  bd.tree_mask_indptr = nullptr;
  expect(PAGEDATTN_ERROR_NULL_POINTER, "desc->tree_mask is set but desc->tree_mask_indptr is NULL",
         "NULL indptr");
  // Past the capacity planned for: 9 bytes > 8.
  tree_desc({0x01, 0x59, 0x01, 0, 0, 0, 0, 0, 0}, {0, 1, 9});
  EXPECT_TRUE(status_is(pagedattn_batch_update(batch, &bd), PAGEDATTN_ERROR_CAPACITY,
                        "tree_mask_indptr[num_seqs] 9 > max_tree_mask_bytes 8"));
  EXPECT_EQ(slots(), sm0);
  // Empty segments are the causal rule; an update to them, and back, is accepted.
  tree_desc({}, {0, 0, 0});
  EXPECT_EQ(pagedattn_batch_update(batch, &bd), PAGEDATTN_OK) << pat::last_error();
  tree_desc({0x01, 0x59, 0x01}, {0, 1, 3});
  EXPECT_EQ(pagedattn_batch_update(batch, &bd), PAGEDATTN_OK) << pat::last_error();
}
