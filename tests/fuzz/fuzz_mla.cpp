/* Fuzz target (d): the MLA calls, pagedattn_kv_cache_write_latent and pagedattn_forward_mla,
 * with arbitrary tensor descriptors (rank, shapes, strides, dtypes, devices, NULL data, byte
 * offsets), option structs and slot mappings, over a small latent cache (or, sometimes, a plain
 * one) and a valid decoder batch. Every tensor lives in guarded memory. After each call: canaries
 * intact and inputs unchanged; a refused call wrote nothing (out, lse, cache); an accepted write
 * changed only the rows of its slots in its layer, an accepted forward only out/lse's elements
 * and never the cache. */
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

/* Fills a float tensor's memory with small finite values (fp8/bf16 of random bytes are mostly
 * NaN or huge). */
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

  /* A latent cache: rows of D = 32 * k values, value size R a multiple of 16 below D. */
  const int32_t D = 32 * in.range(1, 4), R = 16 * in.range(1, D / 16 - 1);
  const auto mdt = static_cast<pagedattn_dtype>(in.range(1, 3));
  pagedattn_kv_cache_desc cd;
  pagedattn_kv_cache_desc_init(&cd);
  cd.num_layers = in.range(1, 2);
  cd.num_blocks = in.range(2, 8);
  cd.block_size = 1 << in.range(0, 4);
  cd.num_kv_heads = 1;
  cd.head_size = D;
  cd.dtype = in.u8() < 200 ? mdt : static_cast<pagedattn_dtype>(in.range(4, 5));
  cd.layout = static_cast<pagedattn_layout>(in.range(0, 1));
  const bool latent = in.u8() < 224;
  cd.flags = latent ? PAGEDATTN_KV_CACHE_LATENT : 0u;
  pagedattn_kv_cache* cache = nullptr;
  if (pagedattn_kv_cache_create(&cache, be, &cd) != PAGEDATTN_OK) return 0;
  std::unique_ptr<pagedattn_kv_cache, void (*)(pagedattn_kv_cache*)> cache_owner(
      cache, pagedattn_kv_cache_destroy);
  const size_t esize = pagedattn_dtype_size(cd.dtype);
  const size_t region = static_cast<size_t>(cd.num_blocks) * cd.block_size * D * esize;
  std::vector<uint8_t*> base;
  for (int32_t l = 0; l < cd.num_layers; ++l) {
    void *k = nullptr, *v = nullptr;
    paf::check_status(pagedattn_kv_cache_get_layer(&k, &v, nullptr, cache, l), "get_layer");
    base.push_back(static_cast<uint8_t*>(k));
    if (!latent) base.push_back(static_cast<uint8_t*>(v));
  }
  for (uint8_t* b : base)
    for (size_t j = 0; j < region; ++j) b[j] = in.u8() & 0x3b;
  auto snapshot = [&] {
    std::vector<std::vector<uint8_t>> s;
    for (uint8_t* b : base) s.emplace_back(b, b + region);
    return s;
  };
  auto same = [&](const std::vector<std::vector<uint8_t>>& s) {
    for (size_t i = 0; i < base.size(); ++i)
      if (std::memcmp(base[i], s[i].data(), region) != 0) return false;
    return true;
  };
  const auto dl = paf::dl_of(mdt);
  const bool fp8 = cd.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || cd.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
  const pagedattn_dlpack_dtype cache_dl = paf::dl_of(cd.dtype);

  /* 1. A latent write: kv_c [n, R] + k_pe [n, D - R] (2-D or [n, 1, W]), or whole rows. */
  {
    const int64_t n = in.range(0, 6);
    const bool whole = in.flag(), three = in.flag();
    FTensor kvc, kpe, sm;
    const int64_t w0 = whole ? D : R;
    if (three) {
      paf::make_tensor(kvc, in, {n, 1, w0}, dl, false);
      if (!whole) paf::make_tensor(kpe, in, {n, 1, D - R}, dl, false);
    } else {
      paf::make_tensor(kvc, in, {n, w0}, dl, false);
      if (!whole) paf::make_tensor(kpe, in, {n, D - R}, dl, false);
    }
    fill_small(kvc, in);
    fill_small(kpe, in);
    std::vector<FTensor*> rest;
    if (!whole) rest.push_back(&kpe);
    paf::shared_dtype(kvc, rest, fp8 ? nullptr : &cache_dl);
    const int64_t limit = static_cast<int64_t>(cd.num_blocks) * cd.block_size;
    const pagedattn_dlpack_dtype i64 = {PAGEDATTN_DLPACK_INT, 64, 1};
    paf::make_tensor(sm, in, {n}, i64, false);
    std::set<int64_t> slots;
    if (sm.mem && sm.backed && sm.esize == 8) {
      sm.for_each_elem([&](size_t b) {
        const uint8_t m = in.u8();
        const int64_t s = m < 230 ? in.range(0, static_cast<int32_t>(limit - 1))
                                  : m < 245 ? -1 : in.near_i64(limit);
        if (b + 8 <= sm.mem->size()) std::memcpy(sm.mem->data() + b, &s, 8);
        slots.insert(s);
      });
    }
    const int32_t layer = in.near_i32(in.range(0, cd.num_layers - 1));
    const float scale = in.u8() < 220 ? 0.5f : -1.0f;
    bool must_fail = !latent || layer < 0 || layer >= cd.num_layers;
    const bool skip = kvc.skip || kpe.skip || sm.skip;
    for (FTensor* t : {&kvc, &kpe})
      must_fail = must_fail || (t->mem && (t->malformed || t->bad_dtype || t->overflow));
    if (!skip || must_fail) {
      for (FTensor* t : {&kvc, &kpe, &sm}) t->snapshot();
      const auto before = snapshot();
      const pagedattn_status st = pagedattn_kv_cache_write_latent(
          cache, layer, &kvc.t, whole ? nullptr : &kpe.t, &sm.t, scale, nullptr);
      paf::check_status(st, "write_latent");
      for (FTensor* t : {&kvc, &kpe, &sm}) {
        t->check("write_latent");
        PAF_CHECK(t->unchanged(), "write_latent changed an input tensor");
      }
      if (st != PAGEDATTN_OK) {
        PAF_CHECK(same(before), "refused write_latent (%s) changed the cache",
                  pagedattn_status_string(st));
      } else {
        PAF_CHECK(!must_fail, "write_latent accepted a bad call (latent %d, layer %d)",
                  static_cast<int>(latent), layer);
        /* Only the rows of the slots, in that layer. */
        for (size_t i = 0; i < base.size(); ++i) {
          for (size_t j = 0; j < region; ++j) {
            if (base[i][j] == before[i][j]) continue;
            const int64_t slot = static_cast<int64_t>(j / (D * esize));
            PAF_CHECK(static_cast<int32_t>(i) == layer && slots.count(slot) > 0,
                      "write_latent changed byte %zu of layer %zu outside its slots", j, i);
          }
        }
      }
    }
  }

  /* 2. A forward over a valid decoder batch. */
  const int32_t nseq = in.range(0, 3);
  const int32_t cap_tokens = cd.num_blocks * cd.block_size;
  const int32_t width = cd.num_blocks;
  std::vector<int32_t> ql(nseq), cl(nseq), tables(static_cast<size_t>(std::max(nseq, 1)) * width);
  for (int32_t i = 0; i < nseq; ++i) {
    ql[i] = in.range(0, 4);
    cl[i] = in.range(0, std::max(0, cap_tokens / 2 - ql[i]));
  }
  for (auto& id : tables) id = in.range(0, cd.num_blocks - 1);
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init(&bd);
  bd.num_seqs = nseq;
  bd.query_lens = ql.data();
  bd.context_lens = cl.data();
  bd.block_tables = tables.data();
  bd.block_table_stride = width;
  pagedattn_batch* batch = nullptr;
  if (pagedattn_batch_create(&batch, be, cache, nullptr, &bd) != PAGEDATTN_OK) return 0;
  std::unique_ptr<pagedattn_batch, void (*)(pagedattn_batch*)> batch_owner(
      batch, pagedattn_batch_destroy);
  pagedattn_batch_info info;
  info.struct_size = sizeof info;
  paf::check_status(pagedattn_batch_get_info(&info, batch), "batch_get_info");
  const int64_t T = info.num_tokens;
  const int32_t H = in.range(1, 5);

  Guarded opt_mem(sizeof(pagedattn_attention_options));
  auto* o = reinterpret_cast<pagedattn_attention_options*>(opt_mem.data());
  pagedattn_attention_options_init_sized(o, sizeof *o);
  o->num_heads = in.near_i32(H);
  o->num_kv_heads = in.near_i32(1);
  o->head_size = in.near_i32(D);
  o->scale = in.u8() < 230 ? 0.0f : -1.0f;
  o->soft_cap = in.u8() < 200 ? 0.0f : 25.0f;
  o->sliding_window = in.u8() < 200 ? 0 : in.near_i32(in.range(1, 20));
  o->attention_chunk = in.u8() < 220 ? 0 : in.near_i32(in.range(1, 20));
  o->attention_type = static_cast<pagedattn_attention_type>(in.near_i32(0));
  o->k_scale = in.u8() < 230 ? 1.0f : 0.0f;
  o->flags = static_cast<uint32_t>(in.near_i32(0));
  const bool split = in.flag();
  FTensor qn, qp, out, lse;
  paf::make_tensor(qn, in, {T, H, split ? R : D}, dl, false, size_t(1) << 20, nullptr, true);
  fill_small(qn, in);
  if (split) {
    paf::make_tensor(qp, in, {T, H, D - R}, dl, false, size_t(1) << 20, nullptr, true);
    fill_small(qp, in);
  }
  paf::make_tensor(out, in, {T, H, R}, dl, false, size_t(1) << 20, nullptr, true);
  const bool want_lse = in.flag();
  if (want_lse)
    paf::make_tensor(lse, in, {T, H}, paf::dl_of(PAGEDATTN_DTYPE_FLOAT32), false,
                     size_t(1) << 20, nullptr, true);
  for (FTensor* t : {&out, &lse})
    if (t->mem) std::memset(t->mem->data(), 0xFF, t->mem->size());
  std::vector<FTensor*> rest = {&out};
  if (split) rest.push_back(&qp);
  paf::shared_dtype(qn, rest, fp8 ? nullptr : &cache_dl);
  const int32_t layer = in.near_i32(in.range(0, cd.num_layers - 1));
  /* Surely refused whatever the tensors say (their extents decide the value size, so a
   * consistent set of odd extents may be a valid call). */
  int32_t raw_type;
  std::memcpy(&raw_type, &o->attention_type, sizeof raw_type);
  const bool must_fail = !latent || layer < 0 || layer >= cd.num_layers ||
                         o->num_kv_heads != 1 || o->head_size != D || o->flags != 0 ||
                         raw_type != PAGEDATTN_ATTENTION_DECODER || o->num_heads <= 0 ||
                         o->k_scale <= 0.0f;
  bool skip = false;
  for (FTensor* t : {&qn, &qp, &out, &lse}) skip = skip || t->skip;
  if (skip && !must_fail) return 0;
  for (FTensor* t : {&qn, &qp, &out, &lse}) t->snapshot();
  const auto osnap = opt_mem.snapshot();
  const auto before = snapshot();
  const pagedattn_status st =
      pagedattn_forward_mla(be, batch, cache, layer, o, &qn.t, split ? &qp.t : nullptr, &out.t,
                            want_lse ? &lse.t : nullptr, nullptr);
  paf::check_status(st, "forward_mla");
  for (FTensor* t : {&qn, &qp, &out, &lse}) t->check("forward_mla");
  PAF_CHECK(opt_mem.same(osnap), "forward_mla changed the options");
  PAF_CHECK(qn.unchanged() && qp.unchanged(), "forward_mla changed a query tensor");
  PAF_CHECK(same(before), "forward_mla changed the cache");
  if (st != PAGEDATTN_OK) {
    PAF_CHECK(out.unchanged() && lse.unchanged(), "refused forward_mla (%s) wrote out/lse",
              pagedattn_status_string(st));
    return 0;
  }
  PAF_CHECK(!must_fail, "forward_mla accepted a bad call (latent %d, layer %d, type %d)",
            static_cast<int>(latent), layer, raw_type);
  out.check_writes_inside("forward_mla out");
  if (want_lse) lse.check_writes_inside("forward_mla lse");
  return 0;
}
