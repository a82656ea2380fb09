/* Fuzz target (c): pagedattn_forward with arbitrary option structs (every field, struct_size,
 * ALiBi descriptors) and tensor descriptors (rank, shapes, strides, dtypes, devices, NULL data,
 * byte offsets) over a small valid cache and batch (decoder, encoder, encoder-only, cross).
 * Every tensor lives in guarded memory. After each call: canaries intact, q/k/v/slopes and the
 * options unchanged; a refused call wrote nothing (out, lse, cache); an accepted one wrote out/lse
 * only inside their elements and the cache only at the batch's slots of that layer. */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <set>
#include <string>

#include "fuzz_common.h"

namespace {

using paf::FTensor;
using paf::Guarded;
using paf::Input;

struct CacheMem {
  pagedattn_kv_cache* h = nullptr;
  pagedattn_kv_cache_desc d{};
  int64_t st[3] = {0, 0, 0};
  size_t esize = 0, region = 0;
  std::vector<uint8_t*> base; /* [layer*2 + kv] */
  std::vector<std::vector<uint8_t>> snap;

  ~CacheMem() { pagedattn_kv_cache_destroy(h); }
  bool create(pagedattn_backend* be, const pagedattn_kv_cache_desc& desc, Input& in) {
    d = desc;
    if (pagedattn_kv_cache_create(&h, be, &d) != PAGEDATTN_OK) return false;
    esize = pagedattn_dtype_size(d.dtype);
    for (int32_t l = 0; l < d.num_layers; ++l) {
      void *k = nullptr, *v = nullptr;
      paf::check_status(pagedattn_kv_cache_get_layer(&k, &v, st, h, l), "get_layer");
      base.push_back(static_cast<uint8_t*>(k));
      base.push_back(static_cast<uint8_t*>(v));
    }
    region = static_cast<size_t>(d.num_blocks * st[0]) * esize;
    /* Finite small values (random bytes would be mostly NaN/Inf in fp8/bf16). */
    for (uint8_t* b : base)
      for (size_t j = 0; j < region; ++j) b[j] = in.u8() & 0x3b;
    return true;
  }
  void snapshot() {
    snap.clear();
    for (uint8_t* b : base) snap.emplace_back(b, b + region);
  }
  bool unchanged() const {
    for (size_t i = 0; i < base.size(); ++i)
      if (std::memcmp(base[i], snap[i].data(), region) != 0) return false;
    return true;
  }
  /* Changed bytes only in rows of `layer` at `slots`. */
  void check_changes(int32_t layer, const std::set<int64_t>& slots, const char* when) const {
    std::vector<uint8_t> ok(region);
    for (size_t i = 0; i < base.size(); ++i) {
      if (std::memcmp(base[i], snap[i].data(), region) == 0) continue;
      PAF_CHECK(static_cast<int32_t>(i / 2) == layer, "%s wrote layer %zu, not %d", when, i / 2,
                layer);
      std::fill(ok.begin(), ok.end(), 0);
      for (int64_t s : slots) {
        if (s < 0) continue;
        const int64_t b = s / d.block_size, o = s % d.block_size;
        for (int32_t hh = 0; hh < d.num_kv_heads; ++hh)
          std::fill_n(ok.begin() + static_cast<size_t>(b * st[0] + o * st[1] + hh * st[2]) * esize,
                      d.head_size * esize, 1);
      }
      for (size_t j = 0; j < region; ++j)
        PAF_CHECK(ok[j] || base[i][j] == snap[i][j], "%s: cache byte %zu of layer %zu %s changed "
                  "outside the batch's slots", when, j, i / 2, i % 2 ? "V" : "K");
    }
  }
};

float odd_float(Input& in, float good) {
  const uint8_t m = in.u8();
  if (m < 200) return good;
  const float odd[] = {0.0f, -1.0f, 1e-30f, 1e30f, __builtin_inff(), -__builtin_inff(),
                       __builtin_nanf(""), 0.5f, 30.0f, -0.0f};
  return odd[in.u8() % 10];
}

/* Fills a float tensor's memory with small finite values of its dtype. */
void fill_small(FTensor& t, Input& in) {
  if (!t.mem) return;
  uint8_t* p = t.mem->data();
  for (size_t i = 0; i < t.mem->size(); ++i) p[i] = in.u8();
  if (t.t.dtype.code == PAGEDATTN_DLPACK_FLOAT && t.t.dtype.bits == 32)
    for (size_t i = 3; i < t.mem->size(); i += 4) p[i] = (p[i] & 0x80) | 0x3e;
  else if (t.t.dtype.bits == 16)
    for (size_t i = 1; i < t.mem->size(); i += 2) p[i] = (p[i] & 0x80) | 0x3c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  pagedattn_backend* be = paf::cpu_backend();

  /* Geometry, dtypes, attention type. */
  const int32_t Hkv = in.range(1, 2), G = in.range(1, 3), H = Hkv * G, D = 8 * in.range(1, 4);
  const auto mdt = static_cast<pagedattn_dtype>(in.range(1, 3));
  pagedattn_kv_cache_desc cd;
  pagedattn_kv_cache_desc_init(&cd);
  cd.num_layers = in.range(1, 2);
  cd.num_blocks = in.range(4, 16);
  cd.block_size = 1 << in.range(0, 4);
  cd.num_kv_heads = Hkv;
  cd.head_size = D;
  cd.dtype = in.u8() < 200 ? mdt : static_cast<pagedattn_dtype>(in.range(4, 5));
  cd.layout = static_cast<pagedattn_layout>(in.range(0, 1));
  CacheMem cache;
  if (!cache.create(be, cd, in)) return 0;
  const auto type = static_cast<pagedattn_attention_type>(in.range(0, 3));
  const bool enc = type == PAGEDATTN_ATTENTION_ENCODER || type == PAGEDATTN_ATTENTION_ENCODER_ONLY;

  /* A valid batch for that type. */
  const int32_t n = in.range(0, 4);
  std::vector<int32_t> ql(n), cl(n), el(n);
  const int32_t cap_tokens = cd.num_blocks * cd.block_size;
  const int32_t width = (cap_tokens + 0) / cd.block_size;
  std::vector<int32_t> tables(static_cast<size_t>(std::max(n, 1)) * width),
      ctables(static_cast<size_t>(std::max(n, 1)) * width);
  for (int32_t i = 0; i < n; ++i) {
    ql[i] = in.range(0, 6);
    cl[i] = enc ? 0 : in.range(0, std::max(0, cap_tokens / 2 - ql[i]));
    if (ql[i] + cl[i] > cap_tokens) cl[i] = 0;
    el[i] = type == PAGEDATTN_ATTENTION_CROSS ? in.range(0, 8) : 0;
  }
  for (auto& id : tables) id = in.range(0, cd.num_blocks - 1);
  for (auto& id : ctables) id = in.range(0, cd.num_blocks - 1);
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = n;
  bd.query_lens = ql.data();
  bd.context_lens = cl.data();
  const bool enc_only = type == PAGEDATTN_ATTENTION_ENCODER_ONLY && in.flag();
  bd.block_tables = enc_only ? nullptr : tables.data();
  bd.block_table_stride = width;
  if (type == PAGEDATTN_ATTENTION_CROSS) {
    bd.encoder_lens = el.data();
    bd.cross_block_tables = ctables.data();
    bd.cross_block_table_stride = width;
  }
  pagedattn_batch* batch = nullptr;
  if (pagedattn_batch_create(&batch, be, enc_only ? nullptr : cache.h,
                             type == PAGEDATTN_ATTENTION_CROSS ? cache.h : nullptr,
                             &bd) != PAGEDATTN_OK)
    return 0;
  std::unique_ptr<pagedattn_batch, void (*)(pagedattn_batch*)> batch_owner(
      batch, pagedattn_batch_destroy);
  pagedattn_batch_info info;
  info.struct_size = sizeof info;
  paf::check_status(pagedattn_batch_get_info(&info, batch), "batch_get_info");
  const int64_t T = info.num_tokens;
  const int64_t rows = type == PAGEDATTN_ATTENTION_CROSS ? info.num_encoder_tokens : T;

  /* Options in guarded memory: every field mostly right, sometimes hostile. */
  Guarded opt_mem(sizeof(pagedattn_attention_options));
  auto* o = reinterpret_cast<pagedattn_attention_options*>(opt_mem.data());
  pagedattn_attention_options_init(o);
  /* The 0.1 layout or this one (anything else is refused); a 0.1-sized struct's later fields,
   * set below all the same, must not be read. */
  const uint32_t v01 = static_cast<uint32_t>(offsetof(pagedattn_attention_options, sinks));
  o->struct_size = in.u8() < 32 ? v01
                                : static_cast<uint32_t>(in.near_i32(static_cast<int32_t>(sizeof *o)));
  const bool sized = o->struct_size == sizeof *o;
  o->num_heads = in.near_i32(H);
  o->num_kv_heads = in.near_i32(Hkv);
  o->head_size = in.near_i32(D);
  o->scale = odd_float(in, 0.0f);
  o->soft_cap = odd_float(in, in.flag() ? 0.0f : 20.0f);
  o->sliding_window = enc ? in.near_i32(0) : in.near_i32(in.flag() ? 0 : in.range(1, 20));
  o->attention_type = static_cast<pagedattn_attention_type>(in.near_i32(type));
  o->write_kv = in.near_i32(type == PAGEDATTN_ATTENTION_ENCODER_ONLY ? 0 : in.range(0, 1));
  o->k_scale = odd_float(in, 1.0f);
  o->v_scale = odd_float(in, 1.0f);
  o->flags = static_cast<uint32_t>(in.near_i32(0));
  FTensor slopes;
  if (in.u8() >= 192) {
    paf::make_tensor(slopes, in, {H}, paf::dl_of(PAGEDATTN_DTYPE_FLOAT32), false);
    if (slopes.mem)
      for (size_t i = 0; i + 3 < slopes.mem->size(); i += 4) {
        const float s = -0.0625f * static_cast<float>(in.u8() % 16);
        std::memcpy(slopes.mem->data() + i, &s, 4);
      }
    o->alibi_slopes = &slopes.t;
  }
  /* The 0.2 fields: sinks (any float), a chunk, per-head scales (some not finite and > 0). */
  FTensor sinks, khs, vhs;
  bool bad_scale = false;
  if (in.u8() >= 192) {
    paf::make_tensor(sinks, in, {H}, paf::dl_of(PAGEDATTN_DTYPE_FLOAT32), false);
    if (sinks.mem)
      for (size_t i = 0; i + 3 < sinks.mem->size(); i += 4) {
        const float s = odd_float(in, 0.5f * static_cast<float>(in.u8() % 9) - 2.0f);
        std::memcpy(sinks.mem->data() + i, &s, 4);
      }
    o->sinks = &sinks.t;
  }
  o->attention_chunk = in.u8() < 200 ? 0 : in.near_i32(in.range(1, 20));
  for (FTensor* hs : {&khs, &vhs}) {
    if (in.u8() < 208) continue;
    paf::make_tensor(*hs, in, {Hkv}, paf::dl_of(PAGEDATTN_DTYPE_FLOAT32), false);
    if (hs->mem)
      for (size_t i = 0; i + 3 < hs->mem->size(); i += 4) {
        const uint8_t m = in.u8();
        const float s = m < 232 ? 0.25f * static_cast<float>(1 + m % 16) : odd_float(in, 0.0f);
        /* Only the tensor's own elements are read: the padding's values do not matter. */
        if (!hs->malformed && !hs->bad_dtype && i / 4 < static_cast<size_t>(Hkv) &&
            hs->t.strides == nullptr && hs->t.byte_offset == 0)
          bad_scale = bad_scale || !(std::isfinite(s) && s > 0.0f);
        std::memcpy(hs->mem->data() + i, &s, 4);
      }
    (hs == &khs ? o->k_head_scales : o->v_head_scales) = &hs->t;
  }

  /* Tensors. */
  const auto dl = paf::dl_of(mdt);
  FTensor q, k, v, out, lse;
  paf::make_tensor(q, in, {T, H, D}, dl, false, size_t(1) << 20, nullptr, true);
  fill_small(q, in);
  paf::make_tensor(k, in, {rows, Hkv, D}, dl, false, size_t(1) << 20, nullptr, true);
  fill_small(k, in);
  paf::make_tensor(v, in, {rows, Hkv, D}, dl, false, size_t(1) << 20, nullptr, true);
  fill_small(v, in);
  paf::make_tensor(out, in, {T, H, D}, dl, false, size_t(1) << 20, nullptr, true);
  const bool want_lse = in.flag();
  if (want_lse) paf::make_tensor(lse, in, {T, H}, paf::dl_of(PAGEDATTN_DTYPE_FLOAT32), false,
                                 size_t(1) << 20, nullptr, true);
  for (FTensor* t : {&out, &lse})
    if (t->mem) std::memset(t->mem->data(), 0xFF, t->mem->size()); /* NaN poison */
  const bool pass_kv = in.u8() < 240;

  const uint8_t hm = in.u8();
  pagedattn_backend* be_arg = hm == 255 ? nullptr : be;
  pagedattn_kv_cache* cache_arg = hm == 254 ? nullptr : cache.h;
  const int32_t layer = in.near_i32(in.range(0, cd.num_layers - 1));

  /* k/v are only read when there are rows to store, or for the encoder types. */
  int32_t raw_type; /* read as an int: the field may hold any value a C caller wrote */
  std::memcpy(&raw_type, &o->attention_type, sizeof raw_type);
  const bool kv_used = (o->write_kv != 0 && rows > 0) || raw_type == PAGEDATTN_ATTENTION_ENCODER ||
                       raw_type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
  std::vector<FTensor*> all = {&q, &out};
  if (pass_kv && kv_used) {
    all.push_back(&k);
    all.push_back(&v);
  }
  if (want_lse) all.push_back(&lse);
  if (o->alibi_slopes) all.push_back(&slopes);
  if (sized)
    for (FTensor* t : {&sinks, &khs, &vhs})
      if (t->mem || t->malformed || t->bad_dtype || t->overflow || t->skip) all.push_back(t);
  /* q picks the model dtype: any float without a cache or with an fp8 one, else the cache's.
   * out (and k/v when read) must share it; lse and the slopes are float32 (make_tensor judged). */
  {
    const bool fp8 = cd.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || cd.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
    const pagedattn_dlpack_dtype cache_dl = paf::dl_of(cd.dtype);
    std::vector<FTensor*> rest = {&out};
    if (pass_kv && kv_used) rest.insert(rest.end(), {&k, &v});
    const bool free_dt = fp8 || raw_type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
    paf::shared_dtype(q, rest, free_dt ? nullptr : &cache_dl);
  }
  bool skip = false, must_fail = false;
  std::string why; /* the reasons a call must fail, for the report */
  for (FTensor* t : all) {
    skip = skip || t->skip;
    if (t->malformed || t->bad_dtype || t->overflow) {
      must_fail = true;
      why += std::string(t == &q ? "q" : t == &out ? "out" : t == &k ? "k" : t == &v ? "v"
                         : t == &lse ? "lse" : t == &slopes ? "alibi_slopes"
                         : t == &sinks ? "sinks" : "head scales") +
             (t->overflow ? " overflows; " : t->malformed ? " malformed; " : " dtype; ");
    }
  }
  /* ENCODER_ONLY uses no cache (it may be NULL), so there is no layer to check. */
  const bool layer_bad = raw_type != PAGEDATTN_ATTENTION_ENCODER_ONLY &&
                         (layer < 0 || layer >= cd.num_layers);
  auto need = [&](bool bad, const char* what) {
    if (bad) {
      must_fail = true;
      why += what;
    }
  };
  need(layer_bad, "layer; ");
  need(o->num_heads != H, "num_heads; ");
  need(o->num_kv_heads != Hkv, "num_kv_heads; ");
  need(o->head_size != D, "head_size; ");
  need(o->flags != 0, "flags; ");
  need(o->struct_size != sizeof *o && o->struct_size != v01, "struct_size; ");
  need(sized && o->attention_chunk < 0, "attention_chunk < 0; ");
  need(sized && o->attention_chunk > 0 && raw_type != PAGEDATTN_ATTENTION_DECODER,
       "attention_chunk outside decoder; ");
  need(be_arg == nullptr, "backend NULL; ");
  if (skip && !must_fail) return 0;

  /* A bad per-head scale is refused, unless the call fails first for another reason (a tensor
   * checked earlier); it may not succeed. */
  const bool scale_refused = sized && bad_scale;
  for (FTensor* t : {&q, &k, &v, &out, &lse, &slopes, &sinks, &khs, &vhs}) t->snapshot();
  const auto osnap = opt_mem.snapshot();
  cache.snapshot();
  const pagedattn_status st =
      pagedattn_forward(be_arg, batch, cache_arg, layer, o, &q.t, pass_kv ? &k.t : nullptr,
                        pass_kv ? &v.t : nullptr, &out.t, want_lse ? &lse.t : nullptr, nullptr);
  paf::check_status(st, "forward");
  for (FTensor* t : {&q, &k, &v, &out, &lse, &slopes, &sinks, &khs, &vhs}) t->check("forward");
  opt_mem.check("forward");
  PAF_CHECK(opt_mem.same(osnap), "forward changed the options");
  for (FTensor* t : {&q, &k, &v, &slopes, &sinks, &khs, &vhs})
    PAF_CHECK(t->unchanged(), "forward changed an input tensor");
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(out.unchanged() && lse.unchanged(), "refused forward (%s) wrote out/lse",
              pagedattn_status_string(st));
    PAF_CHECK(cache.unchanged(), "refused forward (%s) changed the cache",
              pagedattn_status_string(st));
    return 0;
  }
  PAF_CHECK(!scale_refused, "forward accepted a per-head scale that is not finite and > 0");
  PAF_CHECK(!must_fail, "forward accepted a bad call: %s(type %d, write_kv %d, T %lld, rows %lld)",
            why.c_str(), raw_type, o->write_kv, static_cast<long long>(T),
            static_cast<long long>(rows));
  out.check_writes_inside("forward out");
  if (want_lse) lse.check_writes_inside("forward lse");
  /* The cache changes only where this step's keys go. */
  std::set<int64_t> slots;
  if (o->write_kv) {
    const int64_t* sm = nullptr;
    int64_t cnt = 0;
    if (type == PAGEDATTN_ATTENTION_CROSS)
      paf::check_status(pagedattn_batch_get_cross_slot_mapping(&sm, &cnt, batch), "cross slots");
    else
      paf::check_status(pagedattn_batch_get_slot_mapping(&sm, &cnt, batch), "slots");
    slots.insert(sm, sm + cnt);
  }
  cache.check_changes(layer, slots, "forward");
  return 0;
}
