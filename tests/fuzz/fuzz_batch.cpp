/* Fuzz target (a): batch building and planning (pagedattn_batch_create / _update) from arbitrary
 * lengths, block tables, slot mappings, cross tables, draft-tree masks and capacities. Every input array is a
 * guarded buffer of exactly the size the call may read; on failure nothing may change (the out
 * handle, the inputs, an updated batch's contents); on success the plan must only point inside
 * the cache (every used block id < num_blocks, every slot in [-1, num_blocks*block_size)) and
 * agree with the lengths. Capacities (max_num_seqs, max_blocks_per_seq, ...) range up to the
 * type's maximum: the host metadata they size is charged to the backend's memory_limit, so a
 * large one must come back as OUT_OF_MEMORY, and under ASan a successful create may not take
 * more host memory than the limit allows (kCreateBound). */
#include <algorithm>
#include <climits>
#include <memory>

#include "fuzz_common.h"

#ifdef PAF_ASAN
/* From <sanitizer/allocator_interface.h>, which gcc does not ship; both runtimes define it. */
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#endif

namespace {

using paf::Guarded;
using paf::Input;

constexpr int64_t kMaxEntries = 1 << 15; /* largest array the fuzzer hands over */
/* The batch target's memory_limit: far above any batch the arrays above can describe, far below
 * libFuzzer's malloc and RSS limits, so an over-large capacity is refused cheaply. */
constexpr uint64_t kMemoryLimit = 16ull << 20;
/* What a successful create may take: the core charges the host metadata against memory_limit
 * and the backend charges its batch workspace (per-sequence split bookkeeping, scratch) against
 * its own count of the same limit, so each is bounded by the limit but together they may reach
 * twice it; plus the handle and the plan's bookkeeping. */
constexpr size_t kCreateBound = 2 * kMemoryLimit + (256u << 10);

pagedattn_backend* batch_backend() {
  static pagedattn_backend* be = [] {
    pagedattn_backend_options o;
    pagedattn_backend_options_init(&o);
    o.num_threads = 1;
    o.memory_limit = kMemoryLimit;
    pagedattn_backend* b = nullptr;
    if (pagedattn_backend_create(&b, "cpu", &o) != PAGEDATTN_OK) paf::die("cpu backend unavailable");
    return b;
  }();
  return be;
}

/* Heap bytes in use (ASan's allocator); 0 without ASan, which turns the check off. */
size_t heap_in_use() {
#ifdef PAF_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  return 0;
#endif
}

/* A capacity: mostly near `good`, sometimes a power of two up to 2^(bits-1), or the maximum. */
int64_t capacity(Input& in, int64_t good, int bits) {
  const uint8_t m = in.u8();
  const int64_t top = bits == 32 ? INT32_MAX : INT64_MAX;
  if (m < 160) return in.near_i64(good);
  if (m < 240) return std::min<int64_t>(top, int64_t{1} << in.range(8, bits - 2));
  return top - in.range(0, 1);
}

struct Geo {
  int32_t num_blocks, block_size;
};

/* A caller's batch description with its arrays, built from fuzzer bytes. */
struct Desc {
  std::unique_ptr<Guarded> desc_mem, qlens, clens, tables, slots, elens, ctables, tree, tree_ip;
  std::vector<std::vector<uint8_t>> snaps;
  pagedattn_batch_desc* d = nullptr;
  bool skip = false; /* the description claims more memory than the fuzzer hands over */

  void snapshot() {
    snaps.clear();
    for (auto* g : all()) snaps.push_back(g ? g->snapshot() : std::vector<uint8_t>());
  }
  void check_unchanged(const char* when) {
    size_t i = 0;
    for (auto* g : all()) {
      if (g) {
        g->check(when);
        PAF_CHECK(g->same(snaps[i]), "%s: an input array (#%zu) changed", when, i);
      }
      ++i;
    }
  }
  std::vector<Guarded*> all() {
    return {qlens.get(), clens.get(), tables.get(), slots.get(), elens.get(), ctables.get(),
            tree.get(), tree_ip.get()};
  }
};

int32_t length(Input& in) {
  const uint8_t m = in.u8();
  if (m < 200) return m % 40;
  if (m < 230) return in.range(0, 3000);
  return in.i32();
}

std::unique_ptr<Guarded> int_array(Input& in, int64_t n, bool lengths, int32_t nb) {
  auto g = std::make_unique<Guarded>(static_cast<size_t>(n) * 4);
  auto* a = reinterpret_cast<int32_t*>(g->data());
  for (int64_t i = 0; i < n; ++i) a[i] = lengths ? length(in) : in.near_i32(in.range(0, nb - 1));
  return g;
}

/* Table entries the planner may read for rows of `lens` (its own plus context lens). */
int64_t table_extent(int32_t rows, int32_t stride, const int32_t* a, const int32_t* b,
                     int32_t bs) {
  if (rows <= 0 || stride <= 0) return 0;
  int64_t need = 0;
  for (int32_t i = 0; i < rows; ++i) {
    int64_t len = static_cast<int64_t>(a ? std::max(a[i], 0) : 0) + (b ? std::max(b[i], 0) : 0);
    need = std::max(need, (len + bs - 1) / bs);
  }
  return static_cast<int64_t>(rows - 1) * stride + std::min<int64_t>(stride, need);
}

void build(Desc& out, Input& in, const Geo& g, bool cross_cache) {
  out.desc_mem = std::make_unique<Guarded>(sizeof(pagedattn_batch_desc));
  auto* d = reinterpret_cast<pagedattn_batch_desc*>(out.desc_mem->data());
  pagedattn_batch_desc_init(d);
  out.d = d;
  d->struct_size = static_cast<uint32_t>(in.near_i32(static_cast<int32_t>(sizeof *d)));
  const uint8_t m = in.u8();
  d->num_seqs = m < 240 ? m % 9 : in.i32();
  const int32_t n = d->num_seqs;
  if (n > 4096) {
    out.skip = true; /* would need more memory than the fuzzer hands over */
    return;
  }
  if (n < 0) {
    /* Hostile count: hand over small arrays; the call must refuse before reading them. */
    out.qlens = int_array(in, 1, true, 1);
    out.clens = int_array(in, 1, true, 1);
    d->query_lens = reinterpret_cast<int32_t*>(out.qlens->data());
    d->context_lens = reinterpret_cast<int32_t*>(out.clens->data());
    return;
  }
  const uint8_t nulls = in.u8();
  out.qlens = int_array(in, n, true, 1);
  out.clens = int_array(in, n, true, 1);
  auto* q = reinterpret_cast<int32_t*>(out.qlens->data());
  auto* c = reinterpret_cast<int32_t*>(out.clens->data());
  if (in.u8() < 128)
    for (int32_t i = 0; i < n; ++i) c[i] = in.range(0, 300);
  d->query_lens = (nulls & 1) && nulls > 240 ? nullptr : q;
  d->context_lens = (nulls & 2) && nulls > 240 ? nullptr : c;

  const int32_t want_stride = static_cast<int32_t>(
      (static_cast<int64_t>(g.block_size) > 0 ? (340 + g.block_size - 1) / g.block_size : 1));
  d->block_table_stride = in.near_i32(std::min(want_stride, 24));
  const int64_t text = table_extent(n, d->block_table_stride, q, c, g.block_size);
  if (text > kMaxEntries) {
    out.skip = true;
    return;
  }
  if (!((nulls & 4) && nulls > 240)) {
    out.tables = int_array(in, text, false, g.num_blocks);
    d->block_tables = reinterpret_cast<int32_t*>(out.tables->data());
  }
  if (in.u8() < 64) {
    int64_t sum = 0;
    bool ok = true;
    for (int32_t i = 0; i < n; ++i) {
      if (q[i] < 0) ok = false;
      sum += std::max(q[i], 0);
    }
    if (ok && sum > kMaxEntries) {
      out.skip = true;
      return;
    }
    const int64_t cnt = ok ? sum : 1;
    out.slots = std::make_unique<Guarded>(static_cast<size_t>(cnt) * 8);
    auto* s = reinterpret_cast<int64_t*>(out.slots->data());
    const int64_t nslots = static_cast<int64_t>(g.num_blocks) * g.block_size;
    for (int64_t i = 0; i < cnt; ++i) s[i] = in.near_i64(in.range(-1, 0) + (in.u16() % nslots));
    d->slot_mapping = s;
  }
  if (cross_cache && in.u8() < 96) {
    out.elens = int_array(in, n, true, 1);
    auto* e = reinterpret_cast<int32_t*>(out.elens->data());
    d->encoder_lens = e;
    d->cross_block_table_stride = in.near_i32(std::min(want_stride, 24));
    const int64_t cext = table_extent(n, d->cross_block_table_stride, e, nullptr, g.block_size);
    if (cext > kMaxEntries) {
      out.skip = true;
      return;
    }
    out.ctables = int_array(in, cext, false, g.num_blocks);
    d->cross_block_tables = reinterpret_cast<int32_t*>(out.ctables->data());
  }
  if (in.u8() < 64) {
    /* Draft-tree masks: mostly well-formed trees (every row sees itself and its ancestors) with
     * empty segments among them, then bytes and offsets as the fuzzer leaves them. The bits
     * buffer holds exactly the largest offset: what a caller's indptr promises. */
    out.tree_ip = std::make_unique<Guarded>(static_cast<size_t>(n + 1) * 8);
    auto* ip = reinterpret_cast<int64_t*>(out.tree_ip->data());
    ip[0] = 0;
    std::vector<std::vector<uint8_t>> segs(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      const int32_t qi = std::max(q[i], 0);
      if (qi <= 64 && in.u8() < 192) {
        std::vector<uint8_t>& b = segs[static_cast<size_t>(i)];
        b.assign(static_cast<size_t>((qi * qi + 7) / 8), 0);
        std::vector<int32_t> parent(static_cast<size_t>(qi), -1);
        for (int32_t r = 0; r < qi; ++r) {
          parent[static_cast<size_t>(r)] = r == 0 || in.u8() < 64 ? -1 : in.range(0, r - 1);
          for (int32_t a = r; a >= 0; a = parent[static_cast<size_t>(a)])
            b[static_cast<size_t>((r * qi + a) / 8)] |= static_cast<uint8_t>(1u << ((r * qi + a) % 8));
        }
      }
      ip[i + 1] = ip[i] + static_cast<int64_t>(segs[static_cast<size_t>(i)].size());
    }
    const uint8_t how = in.u8();
    if (how >= 224 && n > 0) ip[in.range(0, n)] = in.near_i64(ip[in.range(0, n)]);
    int64_t extent = 0;
    for (int32_t i = 0; i <= n; ++i) extent = std::max(extent, ip[i]);
    if (extent > kMaxEntries) {
      out.skip = true;
      return;
    }
    out.tree = std::make_unique<Guarded>(static_cast<size_t>(extent));
    uint8_t* bits = out.tree->data();
    for (int32_t i = 0; i < n; ++i)
      for (size_t j = 0; j < segs[static_cast<size_t>(i)].size() && ip[i] + static_cast<int64_t>(j) < extent; ++j)
        if (ip[i] >= 0) bits[ip[i] + static_cast<int64_t>(j)] = segs[static_cast<size_t>(i)][j];
    if (how >= 192 && how < 224 && extent > 0) bits[in.range(0, static_cast<int32_t>(extent) - 1)] ^= in.u8();
    d->tree_mask = how == 191 ? nullptr : bits;
    d->tree_mask_indptr = how == 190 ? nullptr : ip;
    d->max_tree_mask_bytes = in.u8() < 200 ? 0 : capacity(in, extent, 64);
  }
  if (in.u8() < 96) {
    /* Any size: the host tables, slots and lengths they size are charged to memory_limit
     * (d319673; reproducer FailureModes.BatchHostTablesOverMemoryLimit), so large ones must be
     * refused with OUT_OF_MEMORY before anything is allocated. */
    d->max_num_seqs = static_cast<int32_t>(capacity(in, n + 2, 32));
    d->max_num_tokens = capacity(in, 200, 64);
    d->max_blocks_per_seq = static_cast<int32_t>(capacity(in, d->block_table_stride, 32));
    d->max_num_encoder_tokens = capacity(in, 0, 64);
    d->max_seq_len = capacity(in, 0, 64);
  }
}

/* A copy of what a planned batch exposes. */
struct Seen {
  pagedattn_batch_info info{};
  std::vector<int64_t> slots, cross_slots;
  std::vector<int32_t> qstart;
  bool operator==(const Seen& o) const {
    return std::memcmp(&info, &o.info, sizeof info) == 0 && slots == o.slots &&
           cross_slots == o.cross_slots && qstart == o.qstart;
  }
};

Seen observe(const pagedattn_batch* b) {
  Seen s;
  s.info.struct_size = sizeof s.info;
  paf::check_status(pagedattn_batch_get_info(&s.info, b), "batch_get_info");
  const int64_t* sl = nullptr;
  int64_t n = -1;
  paf::check_status(pagedattn_batch_get_slot_mapping(&sl, &n, b), "get_slot_mapping");
  PAF_CHECK(n == s.info.num_tokens, "slot mapping count %lld != num_tokens %lld",
            static_cast<long long>(n), static_cast<long long>(s.info.num_tokens));
  s.slots.assign(sl, sl + n);
  const int32_t* qs = nullptr;
  int32_t qn = -1;
  paf::check_status(pagedattn_batch_get_query_start(&qs, &qn, b), "get_query_start");
  PAF_CHECK(qn == s.info.num_seqs + 1, "query_start count %d != num_seqs+1 (%d)", qn,
            s.info.num_seqs + 1);
  s.qstart.assign(qs, qs + qn);
  paf::check_status(pagedattn_batch_get_cross_slot_mapping(&sl, &n, b), "get_cross_slots");
  PAF_CHECK(n == s.info.num_encoder_tokens, "cross slot count %lld != num_encoder_tokens %lld",
            static_cast<long long>(n), static_cast<long long>(s.info.num_encoder_tokens));
  s.cross_slots.assign(sl, sl + n);
  return s;
}

/* What a successful plan must satisfy, checked against the caller's description. */
void check_plan(const Seen& s, const pagedattn_batch_desc& d, const Geo& g) {
  PAF_CHECK(s.info.num_seqs == d.num_seqs, "num_seqs %d != %d", s.info.num_seqs, d.num_seqs);
  const int64_t nslots = static_cast<int64_t>(g.num_blocks) * g.block_size;
  PAF_CHECK(s.qstart[0] == 0, "query_start[0] = %d", s.qstart[0]);
  int64_t tok = 0;
  for (int32_t i = 0; i < d.num_seqs; ++i) {
    const int32_t q = d.query_lens[i], c = d.context_lens[i];
    PAF_CHECK(q >= 0 && c >= 0, "accepted negative length at %d (%d, %d)", i, q, c);
    PAF_CHECK(s.qstart[i + 1] - s.qstart[i] == q, "query_start step %d != query_lens[%d] %d",
              s.qstart[i + 1] - s.qstart[i], i, q);
    if (d.block_tables) {
      const int64_t need = (static_cast<int64_t>(q) + c + g.block_size - 1) / g.block_size;
      PAF_CHECK(need <= d.block_table_stride, "row %d needs %lld blocks, stride %d accepted", i,
                static_cast<long long>(need), d.block_table_stride);
      for (int64_t j = 0; j < need; ++j) {
        const int32_t id = d.block_tables[static_cast<int64_t>(i) * d.block_table_stride + j];
        PAF_CHECK(id >= 0 && id < g.num_blocks, "accepted block_tables[%d][%lld] = %d (nb %d)", i,
                  static_cast<long long>(j), id, g.num_blocks);
      }
      for (int32_t j = 0; j < q; ++j) {
        const int64_t p = static_cast<int64_t>(c) + j;
        const int64_t want =
            d.slot_mapping
                ? d.slot_mapping[tok + j]
                : static_cast<int64_t>(
                      d.block_tables[static_cast<int64_t>(i) * d.block_table_stride +
                                     p / g.block_size]) * g.block_size + p % g.block_size;
        PAF_CHECK(s.slots[tok + j] == want, "slot[%lld] = %lld, expected %lld",
                  static_cast<long long>(tok + j), static_cast<long long>(s.slots[tok + j]),
                  static_cast<long long>(want));
      }
    }
    tok += q;
  }
  PAF_CHECK(s.info.num_tokens == tok, "num_tokens %lld != sum %lld",
            static_cast<long long>(s.info.num_tokens), static_cast<long long>(tok));
  for (int64_t v : s.slots)
    PAF_CHECK(v >= -1 && v < nslots, "planned slot %lld outside [-1, %lld)",
              static_cast<long long>(v), static_cast<long long>(nslots));
  for (int64_t v : s.cross_slots)
    PAF_CHECK(v >= -1 && v < nslots, "planned cross slot %lld outside [-1, %lld)",
              static_cast<long long>(v), static_cast<long long>(nslots));
  PAF_CHECK(s.info.max_num_seqs >= s.info.num_seqs && s.info.max_num_tokens >= s.info.num_tokens,
            "capacities below the batch");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  pagedattn_backend* be = batch_backend();
  Geo g{in.range(1, 64), 1 << in.range(0, 8)};
  pagedattn_kv_cache_desc cd;
  pagedattn_kv_cache_desc_init(&cd);
  cd.num_layers = 1;
  cd.num_blocks = g.num_blocks;
  cd.block_size = g.block_size;
  cd.num_kv_heads = 1;
  cd.head_size = 8;
  cd.dtype = PAGEDATTN_DTYPE_FLOAT32;
  pagedattn_kv_cache* cache = nullptr;
  paf::check_status(pagedattn_kv_cache_create(&cache, be, &cd), "kv_cache_create");
  PAF_CHECK(cache != nullptr, "no cache");

  const uint8_t which = in.u8();
  const pagedattn_kv_cache* self = (which & 3) == 3 ? nullptr : cache;
  const pagedattn_kv_cache* cross = (which & 4) ? cache : nullptr;

  Desc d1;
  build(d1, in, g, cross != nullptr);
  if (d1.skip) {
    pagedattn_kv_cache_destroy(cache);
    return 0;
  }
  d1.snapshot();
  auto* const sentinel = reinterpret_cast<pagedattn_batch*>(static_cast<uintptr_t>(0x5a5a5a50));
  pagedattn_batch* batch = sentinel;
  const size_t heap_before = heap_in_use();
  pagedattn_status st = pagedattn_batch_create(&batch, be, self, cross, d1.d);
  const size_t heap_after = heap_in_use();
  paf::check_status(st, "batch_create");
  PAF_CHECK(heap_after <= heap_before + kCreateBound,
            "batch_create (%s) took %zu bytes of host memory, memory_limit %llu (num_seqs %d, "
            "capacities: seqs %d, tokens %lld, blocks/seq %d, encoder tokens %lld, seq_len %lld)",
            pagedattn_status_string(st), heap_after - heap_before,
            static_cast<unsigned long long>(kMemoryLimit), d1.d->num_seqs, d1.d->max_num_seqs,
            static_cast<long long>(d1.d->max_num_tokens), d1.d->max_blocks_per_seq,
            static_cast<long long>(d1.d->max_num_encoder_tokens),
            static_cast<long long>(d1.d->max_seq_len));
  d1.check_unchanged("batch_create");
  d1.desc_mem->check("batch_create");
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(batch == sentinel, "batch_create failed but wrote *out");
    pagedattn_kv_cache_destroy(cache);
    return 0;
  }
  PAF_CHECK(batch != sentinel && batch != nullptr, "batch_create succeeded without a handle");
  const Seen before = observe(batch);
  check_plan(before, *d1.d, g);

  /* Updates: a refused one keeps the batch as it was; an accepted one is checked like a plan. */
  for (int round = 0; round < 2 && in.left() > 0; ++round) {
    Desc d2;
    build(d2, in, g, cross != nullptr);
    if (d2.skip) break;
    d2.snapshot();
    const Seen prev = observe(batch);
    st = pagedattn_batch_update(batch, d2.d);
    paf::check_status(st, "batch_update");
    d2.check_unchanged("batch_update");
    d2.desc_mem->check("batch_update");
    const Seen now = observe(batch);
    if (st != PAGEDATTN_OK) {
      PAF_CHECK(now == prev, "a refused batch_update (%s) changed the batch",
                pagedattn_status_string(st));
    } else {
      check_plan(now, *d2.d, g);
      PAF_CHECK(now.info.max_num_seqs == prev.info.max_num_seqs &&
                    now.info.max_num_tokens == prev.info.max_num_tokens &&
                    now.info.max_blocks_per_seq == prev.info.max_blocks_per_seq,
                "batch_update changed the capacities");
      PAF_CHECK(now.info.num_seqs <= now.info.max_num_seqs &&
                    now.info.num_tokens <= now.info.max_num_tokens,
                "batch_update exceeded the capacities");
    }
  }
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
  return 0;
}
