/* Fuzz target (b): cache operations — write (reshape-and-cache) from arbitrary slot mappings and
 * tensor descriptors, copy_blocks and swap_blocks from arbitrary pairs, read_blocks and
 * load_blocks from arbitrary ids and buffer sizes — on library-owned caches and on caches
 * wrapped over guarded caller memory (padded strides). After every call: canaries intact, inputs
 * unchanged; a refused call changed nothing; an accepted one changed only the slots/blocks it
 * names (and read/load move exactly the bytes of the documented record format). */
#include <algorithm>
#include <memory>
#include <set>

#include "fuzz_common.h"

namespace {

using paf::FTensor;
using paf::Guarded;
using paf::Input;

/* A cache with a view of its memory: per layer K and V base pointers and element strides. */
struct Cache {
  pagedattn_kv_cache* h = nullptr;
  pagedattn_kv_cache_desc d{};
  int64_t bst = 0, sst = 0, hst = 0;
  size_t esize = 0;
  uint64_t bpb = 0;
  std::vector<std::unique_ptr<Guarded>> wrapped; /* caller memory of a wrapped cache */
  std::vector<uint8_t*> base;                     /* [layer*2 + kv] */
  size_t region = 0;                              /* bytes of one layer's K (or V) */
  std::vector<std::vector<uint8_t>> snap;

  ~Cache() {
    pagedattn_kv_cache_destroy(h);
    for (auto& g : wrapped) g->check("after destroy");
  }
  size_t row_off(int32_t blk, int32_t slot, int32_t head) const {
    return static_cast<size_t>(blk * bst + slot * sst + head * hst) * esize;
  }
  void snapshot() {
    snap.clear();
    for (uint8_t* b : base) snap.emplace_back(b, b + region);
  }
  void check_canaries(const char* when) const {
    for (auto& g : wrapped) g->check(when);
  }
  bool unchanged() const {
    for (size_t i = 0; i < base.size(); ++i)
      if (std::memcmp(base[i], snap[i].data(), region) != 0) return false;
    return true;
  }
  /* Every changed byte must be in a row allowed(layer, kv, block, slot). */
  template <class Allowed>
  void check_changes(Allowed allowed, const char* when) const {
    std::vector<uint8_t> ok(region);
    for (size_t i = 0; i < base.size(); ++i) {
      if (std::memcmp(base[i], snap[i].data(), region) == 0) continue;
      std::fill(ok.begin(), ok.end(), 0);
      const int32_t layer = static_cast<int32_t>(i / 2);
      for (int32_t b = 0; b < d.num_blocks; ++b)
        for (int32_t s = 0; s < d.block_size; ++s) {
          if (!allowed(layer, static_cast<int>(i % 2), b, s)) continue;
          for (int32_t hh = 0; hh < d.num_kv_heads; ++hh)
            std::fill_n(ok.begin() + row_off(b, s, hh), d.head_size * esize, 1);
        }
      for (size_t j = 0; j < region; ++j)
        if (!ok[j] && base[i][j] != snap[i][j]) {
          char m[160];
          std::snprintf(m, sizeof m, "%s: layer %d %s byte %zu changed outside its target", when,
                        layer, i % 2 ? "V" : "K", j);
          paf::die("out-of-target write", m);
        }
    }
  }
  /* One block's record of read_blocks (each layer: K block then V block, layout order). */
  void record(int32_t blk, uint8_t* out) const {
    const size_t row = d.head_size * esize;
    for (size_t i = 0; i < base.size(); ++i) {
      const bool nhd = d.layout == PAGEDATTN_LAYOUT_NHD;
      const int32_t outer = nhd ? d.block_size : d.num_kv_heads;
      const int32_t inner = nhd ? d.num_kv_heads : d.block_size;
      for (int32_t a = 0; a < outer; ++a)
        for (int32_t b = 0; b < inner; ++b) {
          const int32_t slot = nhd ? a : b, head = nhd ? b : a;
          std::memcpy(out, base[i] + row_off(blk, slot, head), row);
          out += row;
        }
    }
  }
};

bool make_cache(Cache& c, pagedattn_backend* be, Input& in, const pagedattn_kv_cache_desc& d,
                bool wrap) {
  c.d = d;
  uint64_t bpb = 0;
  if (pagedattn_kv_cache_bytes_per_block(&bpb, &d) != PAGEDATTN_OK) return false;
  c.bpb = bpb;
  c.esize = pagedattn_dtype_size(d.dtype);
  if (!wrap) {
    if (pagedattn_kv_cache_create(&c.h, be, &d) != PAGEDATTN_OK) return false;
  } else {
    /* Padded strides: heads, slots and blocks each maybe a little apart. */
    const int64_t D = d.head_size, H = d.num_kv_heads, bs = d.block_size;
    const int64_t ph = in.u8() % 2 ? 8 : 0, ps = in.u8() % 2 ? 8 : 0, pb = in.u8() % 2 ? 16 : 0;
    int64_t bst, sst, hst;
    if (d.layout == PAGEDATTN_LAYOUT_NHD) {
      hst = D + ph;
      sst = H * hst + ps;
      bst = bs * sst + pb;
    } else {
      sst = D + ps;
      hst = bs * sst + ph;
      bst = H * hst + pb;
    }
    const size_t bytes = static_cast<size_t>(d.num_blocks * bst) * c.esize;
    std::vector<void*> k, v;
    for (int32_t l = 0; l < d.num_layers; ++l) {
      c.wrapped.push_back(std::make_unique<Guarded>(bytes, 0x11));
      k.push_back(c.wrapped.back()->data());
      c.wrapped.push_back(std::make_unique<Guarded>(bytes, 0x22));
      v.push_back(c.wrapped.back()->data());
    }
    pagedattn_kv_cache_memory mem{};
    mem.struct_size = sizeof mem;
    mem.k_layers = k.data();
    mem.v_layers = v.data();
    mem.block_stride = bst;
    mem.slot_stride = sst;
    mem.head_stride = hst;
    mem.device = {PAGEDATTN_DEVICE_CPU, 0};
    if (pagedattn_kv_cache_wrap(&c.h, be, &d, &mem) != PAGEDATTN_OK) return false;
  }
  int64_t strides[3];
  for (int32_t l = 0; l < d.num_layers; ++l) {
    void *k = nullptr, *v = nullptr;
    paf::check_status(pagedattn_kv_cache_get_layer(&k, &v, strides, c.h, l), "get_layer");
    c.base.push_back(static_cast<uint8_t*>(k));
    c.base.push_back(static_cast<uint8_t*>(v));
  }
  c.bst = strides[0];
  c.sst = strides[1];
  c.hst = strides[2];
  c.region = static_cast<size_t>(d.num_blocks * c.bst) * c.esize;
  /* Non-zero contents, so copies and swaps are visible. */
  for (uint8_t* b : c.base)
    for (size_t j = 0; j < c.region; ++j) b[j] = in.u8();
  return true;
}

pagedattn_dtype model_dtype(pagedattn_dtype cache_dt, Input& in) {
  if (cache_dt == PAGEDATTN_DTYPE_FP8_E4M3 || cache_dt == PAGEDATTN_DTYPE_FP8_E5M2)
    return static_cast<pagedattn_dtype>(1 + in.u8() % 3);
  return cache_dt;
}

/* Pairs or ids: n int32 values mostly in [0, nb). Returned buffer holds exactly them. */
std::unique_ptr<Guarded> ids(Input& in, size_t n, int32_t nb, bool* bad) {
  auto g = std::make_unique<Guarded>(n * 4);
  auto* a = reinterpret_cast<int32_t*>(g->data());
  for (size_t i = 0; i < n; ++i) {
    a[i] = in.near_i32(in.range(0, nb - 1));
    if (a[i] < 0 || a[i] >= nb) *bad = true;
  }
  return g;
}

void op_write(Cache& c, Input& in) {
  const int32_t layer = in.near_i32(in.range(0, c.d.num_layers - 1));
  const int32_t T = in.range(0, 12);
  const pagedattn_dtype mdt = model_dtype(c.d.dtype, in);
  const std::vector<int64_t> shp = {T, c.d.num_kv_heads, c.d.head_size};
  FTensor k, v, s;
  paf::make_tensor(k, in, shp, paf::dl_of(mdt), true);
  paf::make_tensor(v, in, shp, paf::dl_of(mdt), true);
  const bool i64 = in.flag();
  const pagedattn_dlpack_dtype sdt{PAGEDATTN_DLPACK_INT, static_cast<uint8_t>(i64 ? 64 : 32), 1};
  const pagedattn_dlpack_dtype other{PAGEDATTN_DLPACK_INT, static_cast<uint8_t>(i64 ? 32 : 64), 1};
  paf::make_tensor(s, in, {T}, sdt, false, size_t(1) << 20, &other); /* int32 or int64 */
  const int64_t nslots = static_cast<int64_t>(c.d.num_blocks) * c.d.block_size;
  bool bad_slot = false;
  std::vector<int64_t> slots;
  s.for_each_elem([&](size_t off) {
    const int64_t val = in.near_i64(in.range(-1, static_cast<int32_t>(nslots - 1)));
    if (s.esize == 8) std::memcpy(s.mem->data() + off, &val, 8);
    else {
      const int32_t v32 = static_cast<int32_t>(val);
      std::memcpy(s.mem->data() + off, &v32, std::min<size_t>(s.esize, 4));
    }
    const int64_t got = s.esize == 8 ? val : static_cast<int32_t>(val);
    if (got < -1 || got >= nslots) bad_slot = true;
    slots.push_back(got);
  });
  float ks = 1.0f, vs = 1.0f;
  if (in.u8() >= 224) {
    const float odd[] = {0.0f, -1.0f, 1e-30f, 1e30f, __builtin_inff(), __builtin_nanf(""), 0.5f};
    ks = odd[in.u8() % 7];
    vs = odd[in.u8() % 7];
  }
  const bool fp8 = c.d.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || c.d.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
  const bool bad_scale = fp8 && !(ks > 0 && vs > 0 && ks < __builtin_inff() && vs < __builtin_inff());
  /* The key picks the model dtype: any float with an fp8 cache, the cache's dtype otherwise. */
  const pagedattn_dlpack_dtype cache_dl = paf::dl_of(c.d.dtype);
  paf::shared_dtype(k, {&v}, fp8 ? nullptr : &cache_dl);
  const bool skip = k.skip || v.skip || s.skip;
  bool bad_tensor = false;
  for (const FTensor* t : {&k, &v, &s})
    bad_tensor = bad_tensor || t->malformed || t->bad_dtype || t->overflow;
  const bool must_fail = bad_slot || bad_scale || layer < 0 || layer >= c.d.num_layers || bad_tensor;
  if (skip && !must_fail) return;
  const bool null_k = in.u8() == 255, null_v = in.u8() == 255;
  k.snapshot();
  v.snapshot();
  s.snapshot();
  c.snapshot();
  const pagedattn_status st = pagedattn_kv_cache_write(
      c.h, layer, null_k ? nullptr : &k.t, null_v ? nullptr : &v.t, &s.t, ks, vs, nullptr);
  paf::check_status(st, "kv_cache_write");
  for (FTensor* t : {&k, &v, &s}) {
    t->check("kv_cache_write");
    PAF_CHECK(t->unchanged(), "kv_cache_write changed an input tensor");
  }
  c.check_canaries("kv_cache_write");
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(c.unchanged(), "refused kv_cache_write (%s) changed the cache",
              pagedattn_status_string(st));
    return;
  }
  PAF_CHECK(!must_fail && !null_k && !null_v,
            "kv_cache_write accepted a bad call: slot %d scale %d layer %d key %d/%d/%d value "
            "%d/%d/%d slots %d/%d/%d (ndim %d, dtype %u/%u/%u, shape0 %lld, stride0 %lld, T %d) "
            "null %d%d",
            bad_slot, bad_scale, layer, k.malformed, k.bad_dtype, k.overflow, v.malformed,
            v.bad_dtype, v.overflow, s.malformed, s.bad_dtype, s.overflow, s.t.ndim,
            s.t.dtype.code, s.t.dtype.bits, s.t.dtype.lanes,
            s.t.ndim > 0 && s.t.shape ? static_cast<long long>(s.t.shape[0]) : -1LL,
            s.t.ndim > 0 && s.t.strides ? static_cast<long long>(s.t.strides[0]) : -1LL, T,
            null_k, null_v);
  std::set<int64_t> target(slots.begin(), slots.end());
  c.check_changes(
      [&](int32_t l, int, int32_t b, int32_t sl) {
        return l == layer && target.count(static_cast<int64_t>(b) * c.d.block_size + sl) != 0;
      },
      "kv_cache_write");
}

void op_copy(Cache& c, Cache* other, Input& in, bool swap) {
  const size_t n = in.u8() % 7;
  Cache& src = swap && other ? *other : c;
  if (swap && !other) return;
  const bool swap_dir = swap && in.flag(); /* other -> c or c -> other */
  Cache& dstc = swap_dir ? src : c;
  Cache& srcc = swap_dir ? c : src;
  bool bad = false;
  auto pairs = std::make_unique<Guarded>(n * 8);
  auto* p = reinterpret_cast<int32_t*>(pairs->data());
  for (size_t i = 0; i < n; ++i) {
    p[2 * i] = in.near_i32(in.range(0, srcc.d.num_blocks - 1));
    p[2 * i + 1] = in.near_i32(in.range(0, dstc.d.num_blocks - 1));
    if (p[2 * i] < 0 || p[2 * i] >= srcc.d.num_blocks || p[2 * i + 1] < 0 ||
        p[2 * i + 1] >= dstc.d.num_blocks)
      bad = true;
  }
  const auto psnap = pairs->snapshot();
  const bool null_pairs = in.u8() == 255;
  dstc.snapshot();
  srcc.snapshot();
  const pagedattn_status st =
      swap ? pagedattn_kv_cache_swap_blocks(dstc.h, srcc.h, null_pairs ? nullptr : p, n, nullptr)
           : pagedattn_kv_cache_copy_blocks(c.h, null_pairs ? nullptr : p, n, nullptr);
  const char* what = swap ? "kv_cache_swap_blocks" : "kv_cache_copy_blocks";
  paf::check_status(st, what);
  pairs->check(what);
  PAF_CHECK(pairs->same(psnap), "%s changed the pairs", what);
  dstc.check_canaries(what);
  srcc.check_canaries(what);
  if (swap) PAF_CHECK(srcc.unchanged(), "%s changed its source cache", what);
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(dstc.unchanged(), "refused %s (%s) changed the cache", what,
              pagedattn_status_string(st));
    return;
  }
  PAF_CHECK(!bad && !(null_pairs && n > 0), "%s accepted a bad pair", what);
  std::set<int32_t> dsts;
  for (size_t i = 0; i < n; ++i)
    if (swap || p[2 * i] != p[2 * i + 1]) dsts.insert(p[2 * i + 1]);
  dstc.check_changes([&](int32_t, int, int32_t b, int32_t) { return dsts.count(b) != 0; }, what);
  /* Each destination now holds its source's record (same geometry: records compare). */
  if (srcc.d.dtype == dstc.d.dtype && !swap) {
    std::vector<uint8_t> a(c.bpb), b(c.bpb);
    for (size_t i = 0; i < n; ++i) {
      /* The source as it was: the snapshot of a source that is not itself a destination. */
      if (dsts.count(p[2 * i])) continue;
      c.record(p[2 * i], a.data());
      c.record(p[2 * i + 1], b.data());
      PAF_CHECK(a == b, "copy_blocks: block %d is not a copy of block %d", p[2 * i + 1], p[2 * i]);
    }
  }
}

void op_read_load(Cache& c, Input& in, bool load) {
  const size_t n = in.u8() % 5;
  bool bad = false;
  auto idbuf = ids(in, n, c.d.num_blocks, &bad);
  auto* id = reinterpret_cast<int32_t*>(idbuf->data());
  std::set<int32_t> uniq(id, id + n);
  if (load && uniq.size() != n) bad = true;
  const size_t need = n * c.bpb;
  size_t cap = need;
  if (in.u8() >= 200) cap = static_cast<size_t>(std::max<int64_t>(0, in.near_i64(static_cast<int64_t>(need))));
  if (cap > (size_t(1) << 22)) return;
  Guarded buf(cap, 0xEE);
  if (load)
    for (size_t j = 0; j < cap; ++j) buf.data()[j] = in.u8();
  const auto bsnap = buf.snapshot();
  const auto isnap = idbuf->snapshot();
  const bool null_ids = in.u8() == 255, null_buf = in.u8() == 255;
  c.snapshot();
  const char* what = load ? "kv_cache_load_blocks" : "kv_cache_read_blocks";
  const pagedattn_status st =
      load ? pagedattn_kv_cache_load_blocks(c.h, null_ids ? nullptr : id, n,
                                            null_buf ? nullptr : buf.data(), cap, nullptr)
           : pagedattn_kv_cache_read_blocks(c.h, null_ids ? nullptr : id, n,
                                            null_buf ? nullptr : buf.data(), cap, nullptr);
  paf::check_status(st, what);
  buf.check(what);
  idbuf->check(what);
  PAF_CHECK(idbuf->same(isnap), "%s changed the ids", what);
  c.check_canaries(what);
  if (!load) PAF_CHECK(c.unchanged(), "read_blocks changed the cache");
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(buf.same(bsnap), "refused %s (%s) wrote the buffer", what,
              pagedattn_status_string(st));
    PAF_CHECK(c.unchanged(), "refused %s (%s) changed the cache", what,
              pagedattn_status_string(st));
    return;
  }
  PAF_CHECK(!bad && cap >= need, "%s accepted bad ids or a short buffer (%zu < %zu)", what, cap,
            need);
  /* Bytes after the records are untouched; each record matches the block. */
  for (size_t j = need; j < cap; ++j)
    PAF_CHECK(buf.data()[j] == bsnap[j], "%s wrote past its records (byte %zu)", what, j);
  std::vector<uint8_t> rec(c.bpb);
  for (size_t i = 0; i < n; ++i) {
    c.record(id[i], rec.data());
    PAF_CHECK(std::memcmp(rec.data(), buf.data() + i * c.bpb, c.bpb) == 0,
              "%s: record %zu (block %d) does not match the cache", what, i, id[i]);
  }
  if (load)
    c.check_changes([&](int32_t, int, int32_t b, int32_t) { return uniq.count(b) != 0; }, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  pagedattn_backend* be = paf::cpu_backend();
  pagedattn_kv_cache_desc d;
  pagedattn_kv_cache_desc_init(&d);
  d.num_layers = in.range(1, 2);
  d.num_blocks = in.range(1, 12);
  d.block_size = 1 << in.range(0, 4);
  d.num_kv_heads = in.range(1, 3);
  d.head_size = 8 * in.range(1, 4);
  d.dtype = static_cast<pagedattn_dtype>(in.range(1, 5));
  d.layout = static_cast<pagedattn_layout>(in.range(0, 1));
  Cache c;
  if (!make_cache(c, be, in, d, in.flag())) return 0;
  /* A second cache for swaps: usually the same geometry, sometimes another one. */
  std::unique_ptr<Cache> other;
  if (in.flag()) {
    pagedattn_kv_cache_desc d2 = d;
    d2.num_blocks = in.range(1, 12);
    d2.layout = static_cast<pagedattn_layout>(in.range(0, 1));
    if (in.u8() >= 224) d2.head_size = 8 * in.range(1, 4);
    if (in.u8() >= 224) d2.dtype = static_cast<pagedattn_dtype>(in.range(1, 5));
    other = std::make_unique<Cache>();
    if (!make_cache(*other, be, in, d2, in.flag())) other.reset();
  }
  for (int i = 0; i < 8 && in.left() > 0; ++i) {
    switch (in.u8() % 5) {
      case 0: op_write(c, in); break;
      case 1: op_copy(c, nullptr, in, false); break;
      case 2: op_copy(c, other.get(), in, true); break;
      case 3: op_read_load(c, in, false); break;
      default: op_read_load(c, in, true); break;
    }
  }
  return 0;
}
