// The attention case runner: builds a random case (cache contents, shuffled block tables,
// strided tensors, poisoned outputs), runs pagedattn_forward and checks out, lse and the whole
// cache image against the float64 reference (reference.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>

#include "pagedattn_test_support.h"

namespace pat {

std::string AttnCase::describe() const {
  static const char* types[] = {"decoder", "encoder", "encoder_only", "cross"};
  std::ostringstream o;
  o << types[type] << " " << dtype_str(dtype) << " cache="
    << (cache_dtype == PAGEDATTN_DTYPE_INVALID ? "auto" : dtype_str(cache_dtype))
    << (layout == PAGEDATTN_LAYOUT_NHD ? " NHD" : " HND") << " bs=" << block_size
    << " H=" << H << " Hkv=" << Hkv << " D=" << D << " layers=" << num_layers
    << " layer=" << layer;
  if (scale != 0) o << " scale=" << scale;
  if (soft_cap != 0) o << " cap=" << soft_cap;
  if (window) o << " window=" << window;
  if (alibi) o << " alibi";
  if (sinks) o << " sinks";
  if (chunk) o << " chunk=" << chunk;
  if (head_scales) o << " head_scales";
  if (!sized_opts) o << " opts0.1";
  if (tree) o << " tree";
  if (!write_kv) o << " write_kv=0";
  if (is_fp8(cache_dtype)) o << " kscale=" << k_scale << " vscale=" << v_scale;
  if (lse) o << " lse";
  if (strided_io) o << " strided";
  if (wrap_cache) o << " wrapped";
  if (caller_slots) o << " caller_slots";
  if (via_update) o << " via_update";
  if (seq_lens_form) o << " seq_lens";
  if (pad_rows) o << " pad_rows=" << pad_rows;
  o << " seqs(q/ctx" << (type == PAGEDATTN_ATTENTION_CROSS ? "/enc" : "") << ")=";
  for (size_t i = 0; i < seqs.size() && i < 24; ++i) {
    o << (i ? "," : "") << seqs[i].qlen << "/" << seqs[i].ctx;
    if (type == PAGEDATTN_ATTENTION_CROSS) o << "/" << seqs[i].enc;
  }
  if (seqs.size() > 24) o << ",...(" << seqs.size() << " seqs)";
  return o.str();
}

namespace {

// Stride padding of a wrapped cache (c.wrap_cache).
constexpr uint8_t kPadByte = 0xFF;

// Host image of the whole cache in read_blocks' format (ids 0..nb-1).
struct Image {
  pagedattn_dtype dt;
  pagedattn_layout layout;
  int L, nb, bs, Hkv, D;
  size_t es, block_elems, bpb;
  std::vector<uint8_t> bytes;

  Image(pagedattn_dtype dt_, pagedattn_layout lay, int L_, int nb_, int bs_, int Hkv_, int D_)
      : dt(dt_), layout(lay), L(L_), nb(nb_), bs(bs_), Hkv(Hkv_), D(D_), es(dtype_bytes(dt_)),
        block_elems(static_cast<size_t>(bs_) * Hkv_ * D_), bpb(2 * L_ * block_elems * es),
        bytes(bpb * nb_) {}
  size_t off(int block, int layer, int kv, int slot, int head, int d) const {
    const size_t inner = layout == PAGEDATTN_LAYOUT_NHD
                             ? (static_cast<size_t>(slot) * Hkv + head) * D + d
                             : (static_cast<size_t>(head) * bs + slot) * D + d;
    return block * bpb + ((static_cast<size_t>(layer) * 2 + kv) * block_elems + inner) * es;
  }
  float get(int block, int layer, int kv, int slot, int head, int d) const {
    return load(dt, &bytes[off(block, layer, kv, slot, head, d)]);
  }
  void set(int block, int layer, int kv, int slot, int head, int d, float x) {
    store(dt, &bytes[off(block, layer, kv, slot, head, d)], x);
  }
};

// fp8 codes one step apart (a different rounding of x/scale, e.g. x*(1/scale)) are accepted
// for written elements; everything else must be bit-identical.
bool fp8_adjacent(uint8_t a, uint8_t b) {
  if (a == b) return true;
  if ((a & 0x7F) == 0 && (b & 0x7F) == 0) return true;
  if ((a & 0x80) != (b & 0x80)) return false;
  const int da = a & 0x7F, db = b & 0x7F;
  return std::abs(da - db) <= 1;
}

::testing::AssertionResult compare_images(const char* when, const Image& want, const Image& got,
                                          const std::vector<uint8_t>& written, int layer) {
  const char* kvname[] = {"K", "V"};
  for (int b = 0; b < want.nb; ++b)
    for (int l = 0; l < want.L; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int s = 0; s < want.bs; ++s)
          for (int h = 0; h < want.Hkv; ++h) {
            const size_t o = want.off(b, l, kv, s, h, 0);
            if (std::memcmp(&want.bytes[o], &got.bytes[o], want.D * want.es) == 0) continue;
            for (int d = 0; d < want.D; ++d) {
              const size_t od = want.off(b, l, kv, s, h, d);
              if (std::memcmp(&want.bytes[od], &got.bytes[od], want.es) == 0) continue;
              const bool wr = l == layer && written[static_cast<size_t>(b) * want.bs + s];
              if (wr && is_fp8(want.dt) && fp8_adjacent(want.bytes[od], got.bytes[od])) continue;
              return ::testing::AssertionFailure()
                     << when << ": cache " << kvname[kv] << " block " << b << " layer " << l
                     << " slot " << s << " head " << h << " dim " << d << " is "
                     << got.get(b, l, kv, s, h, d) << ", expected "
                     << want.get(b, l, kv, s, h, d)
                     << (wr ? " (a slot written this step)" : " (must be untouched)");
            }
          }
  return ::testing::AssertionSuccess();
}

// Cheap random values (splitmix64 -> uniform on [-sqrt 3, sqrt 3], unit variance): filling
// large caches with std::normal_distribution dominated the suite's run time.
struct FastRandom {
  uint64_t s;
  explicit FastRandom(uint64_t seed) : s(seed) {}
  float operator()() {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>((z >> 40) * (1.0 / 16777216.0) * 3.4641016 - 1.7320508);
  }
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Picks strides for a [rows, heads, dim] tensor: compact, padded rows, padded heads, or
// head-major; plus a byte offset.
void pick_strides(std::mt19937_64& rng, bool strided, int64_t rows, int64_t heads, int64_t dim,
                  size_t es, int64_t* rs, int64_t* hs, uint64_t* off) {
  *rs = 0;
  *hs = 0;
  *off = 0;
  if (!strided) return;
  switch (rng() % 3) {
    case 0: *rs = heads * dim + 8 * (1 + static_cast<int64_t>(rng() % 3)); *hs = dim; break;
    case 1: *hs = dim + 8; *rs = heads * (dim + 8) + 4; break;
    default: *rs = dim; *hs = std::max<int64_t>(rows, 1) * dim + 16; break;
  }
  *off = es * 8 * (rng() % 3);
}

}  // namespace

::testing::AssertionResult run_attention_case(pagedattn_backend* be, const AttnCase& c,
                                              uint64_t seed, CaseResult* res) {
  std::mt19937_64 rng(seed);
  FastRandom gauss(rng());
  pagedattn_capabilities caps{};
  caps.struct_size = sizeof(caps);
  if (pagedattn_backend_get_capabilities(&caps, be) != PAGEDATTN_OK) {
    return ::testing::AssertionFailure() << "get_capabilities: " << last_error();
  }
  const pagedattn_device dev = caps.device;
  const pagedattn_dtype cdt = c.cache_dtype == PAGEDATTN_DTYPE_INVALID ? c.dtype : c.cache_dtype;
  const bool enc_only = c.type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
  const bool cross = c.type == PAGEDATTN_ATTENTION_CROSS;
  const bool decoder = c.type == PAGEDATTN_ATTENTION_DECODER;
  const bool has_cache = !enc_only;
  const int nseq = static_cast<int>(c.seqs.size());
  const int bs = c.block_size;
  const int H = c.H, Hkv = c.Hkv, D = c.D;
  // Sinks and per-head scales come from a stream of their own, so adding them to a case leaves
  // the rest of its draws as they were.
  std::mt19937_64 frng(seed ^ 0x51ced5ca1e5ull);
  std::vector<float> sink_vals(H), khs(Hkv), vhs(Hkv);
  for (int h = 0; h < H; ++h) {
    const int r = static_cast<int>(frng() % 8);
    sink_vals[h] = r == 0 ? -INFINITY : r == 1 ? 12.0f : -2.0f + 0.75f * static_cast<float>(r);
  }
  const float kScales[] = {1.0f, 0.5f, 2.0f, 0.125f, 4.0f, 0.3f};
  for (int h = 0; h < Hkv; ++h) {
    khs[h] = kScales[frng() % 6];
    vhs[h] = kScales[frng() % 6];
  }
  // The scale of KV head h as stored and loaded: per head, the scalar, or 1 (not fp8).
  auto ks_of = [&](int h) { return !is_fp8(cdt) ? 1.0f : c.head_scales ? khs[h] : c.k_scale; };
  auto vs_of = [&](int h) { return !is_fp8(cdt) ? 1.0f : c.head_scales ? vhs[h] : c.v_scale; };
  auto khs_t = Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, Hkv);
  auto vhs_t = Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, Hkv);
  for (int h = 0; h < Hkv; ++h) {
    khs_t->set(h, 0, 0, khs[h]);
    vhs_t->set(h, 0, 0, vhs[h]);
  }
  khs_t->upload();
  vhs_t->upload();
  const size_t es_m = dtype_bytes(c.dtype);

  // Block tables over shuffled ids; unused entries point at blocks outside the batch.
  std::vector<int32_t> self_need(nseq, 0), cross_need(nseq, 0);
  int64_t total = 0;
  int32_t self_w = 1, cross_w = 1;
  for (int i = 0; i < nseq; ++i) {
    if (has_cache) self_need[i] = static_cast<int32_t>(ceil_div(c.seqs[i].ctx + c.seqs[i].qlen, bs));
    if (cross) cross_need[i] = static_cast<int32_t>(ceil_div(c.seqs[i].enc, bs));
    total += self_need[i] + cross_need[i];
    self_w = std::max(self_w, self_need[i]);
    cross_w = std::max(cross_w, cross_need[i]);
  }
  self_w += static_cast<int32_t>(rng() % 2);
  cross_w += static_cast<int32_t>(rng() % 2);
  const int nb = static_cast<int>(std::max<int64_t>(1, total + c.extra_blocks));
  std::vector<int32_t> perm(nb);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  auto spare = [&]() -> int32_t {
    if (nb > total) return perm[total + rng() % (nb - total)];
    return perm[0];
  };
  std::vector<int32_t> self_tab(static_cast<size_t>(nseq) * self_w), cross_tab;
  if (cross) cross_tab.resize(static_cast<size_t>(nseq) * cross_w);
  {
    int64_t next = 0;
    for (int i = 0; i < nseq; ++i) {
      for (int j = 0; j < self_w; ++j)
        self_tab[static_cast<size_t>(i) * self_w + j] = j < self_need[i] ? perm[next++] : spare();
      if (cross)
        for (int j = 0; j < cross_w; ++j)
          cross_tab[static_cast<size_t>(i) * cross_w + j] =
              j < cross_need[i] ? perm[next++] : spare();
    }
  }
  auto self_slot = [&](int i, int64_t pos) -> int64_t {
    return static_cast<int64_t>(self_tab[static_cast<size_t>(i) * self_w + pos / bs]) * bs +
           pos % bs;
  };
  auto cross_slot = [&](int i, int64_t pos) -> int64_t {
    return static_cast<int64_t>(cross_tab[static_cast<size_t>(i) * cross_w + pos / bs]) * bs +
           pos % bs;
  };

  // Step inputs, rounded to the model dtype.
  std::vector<int64_t> qstart(nseq + 1, 0), kstart(nseq + 1, 0);
  for (int i = 0; i < nseq; ++i) {
    qstart[i + 1] = qstart[i] + c.seqs[i].qlen;
    const int64_t krows = cross ? (c.seqs[i].ctx == 0 ? c.seqs[i].enc : 0) : c.seqs[i].qlen;
    kstart[i + 1] = kstart[i] + krows;
  }
  const int64_t T = qstart[nseq];
  const int64_t KR = kstart[nseq];
  std::vector<float> qf(static_cast<size_t>(T) * H * D), kf(static_cast<size_t>(KR) * Hkv * D),
      vf(kf.size());
  for (float& x : qf) x = round_to(c.dtype, gauss());
  for (float& x : kf) x = round_to(c.dtype, gauss());
  for (float& x : vf) x = round_to(c.dtype, gauss());
  // Pokes on the step's own rows; those on context tokens are applied where they are written.
  for (const Poke& pk : c.pokes) {
    if (pk.seq < 0 || pk.seq >= nseq) continue;
    const SeqSpec& s = c.seqs[pk.seq];
    if (pk.what == 'q') {
      if (pk.pos < s.qlen)
        qf[(static_cast<size_t>(qstart[pk.seq] + pk.pos) * H + pk.h) * D + pk.d] = pk.value;
      continue;
    }
    const int64_t step_pos = pk.pos - (decoder ? s.ctx : 0);
    if (step_pos < 0 || step_pos >= kstart[pk.seq + 1] - kstart[pk.seq]) continue;
    auto& dst = pk.what == 'k' ? kf : vf;
    dst[(static_cast<size_t>(kstart[pk.seq] + step_pos) * Hkv + pk.h) * D + pk.d] = pk.value;
  }

  // The cache.
  pagedattn_kv_cache* cache = nullptr;
  std::vector<std::unique_ptr<DevBuf>> wrap_bufs;
  int64_t wb = 0, wsl = 0, wh = 0;
  struct Guard {
    pagedattn_kv_cache** c;
    pagedattn_batch* b = nullptr;
    ~Guard() {
      pagedattn_batch_destroy(b);
      pagedattn_kv_cache_destroy(*c);
    }
  } guard{&cache};
  Image img(cdt, c.layout, c.num_layers, nb, bs, Hkv, D);
  std::vector<uint8_t> written(static_cast<size_t>(nb) * bs, 0);
  if (has_cache) {
    pagedattn_kv_cache_desc cd;
    pagedattn_kv_cache_desc_init(&cd);
    cd.num_layers = c.num_layers;
    cd.num_blocks = nb;
    cd.block_size = bs;
    cd.num_kv_heads = Hkv;
    cd.head_size = D;
    cd.dtype = cdt;
    cd.layout = c.layout;
    pagedattn_status st;
    if (c.wrap_cache) {
      const int64_t pd = 8 * static_cast<int64_t>(rng() % 2), ps = static_cast<int64_t>(rng() % 3),
                    pb = 8 + static_cast<int64_t>(rng() % 5);
      if (c.layout == PAGEDATTN_LAYOUT_NHD) {
        wh = D + pd;
        wsl = Hkv * wh + ps;
        wb = bs * wsl + pb;
      } else {
        wsl = D + pd;
        wh = bs * wsl + ps;
        wb = Hkv * wh + pb;
      }
      std::vector<void*> kp, vp;
      for (int l = 0; l < 2 * c.num_layers; ++l) {
        wrap_bufs.emplace_back(new DevBuf(dev, static_cast<size_t>(wb) * nb * dtype_bytes(cdt)));
        // 0xFF bytes are NaN in every cache dtype: a kernel that reads stride padding into
        // its arithmetic (even times a zero) makes NaN out of it and fails the comparison.
        std::fill(wrap_bufs.back()->host().begin(), wrap_bufs.back()->host().end(), kPadByte);
        wrap_bufs.back()->upload();
        (l % 2 ? vp : kp).push_back(wrap_bufs.back()->ptr());
      }
      pagedattn_kv_cache_memory mem{};
      mem.struct_size = sizeof(mem);
      mem.k_layers = kp.data();
      mem.v_layers = vp.data();
      mem.block_stride = wb;
      mem.slot_stride = wsl;
      mem.head_stride = wh;
      mem.device = dev;
      st = pagedattn_kv_cache_wrap(&cache, be, &cd, &mem);
    } else {
      st = pagedattn_kv_cache_create(&cache, be, &cd);
    }
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "cache create/wrap: " << pagedattn_status_string(st)
                                           << ": " << last_error();
    }
    // Random contents everywhere (other layers, blocks outside the batch, slot tails).
    for (size_t o = 0; o < img.bytes.size(); o += img.es) store(cdt, &img.bytes[o], gauss());
    // Pokes past a sequence's last token, in the tail of its last block: stale slots no
    // attention may read.
    if (decoder)
      for (const Poke& pk : c.pokes) {
        if (pk.what == 'q' || pk.seq < 0 || pk.seq >= nseq) continue;
        const SeqSpec& s = c.seqs[pk.seq];
        if (pk.pos < s.ctx + s.qlen || pk.pos / bs >= self_need[pk.seq]) continue;
        const int64_t slot = self_slot(pk.seq, pk.pos);
        img.set(static_cast<int>(slot / bs), c.layer, pk.what == 'k' ? 0 : 1,
                static_cast<int>(slot % bs), pk.h, pk.d, pk.value);
      }
    std::vector<int32_t> all(nb);
    std::iota(all.begin(), all.end(), 0);
    st = pagedattn_kv_cache_load_blocks(cache, all.data(), all.size(), img.bytes.data(),
                                        img.bytes.size(), nullptr);
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "load_blocks: " << pagedattn_status_string(st)
                                           << ": " << last_error();
    }

    // What the caller writes before the forward: context tokens (decoder), encoder tokens of
    // sequences past their first step (cross), and with write_kv=0 the step's own tokens.
    std::vector<int64_t> pre_slots;
    std::vector<float> pre_k, pre_v;
    auto add_pre = [&](int64_t slot, const float* kr, const float* vr) {
      pre_slots.push_back(slot);
      pre_k.insert(pre_k.end(), kr, kr + Hkv * D);
      pre_v.insert(pre_v.end(), vr, vr + Hkv * D);
    };
    std::vector<float> tk(static_cast<size_t>(Hkv) * D), tv(tk.size());
    for (int i = 0; i < nseq; ++i) {
      const SeqSpec& s = c.seqs[i];
      if (decoder) {
        for (int64_t p = 0; p < s.ctx; ++p) {
          for (auto& x : tk) x = round_to(c.dtype, gauss());
          for (auto& x : tv) x = round_to(c.dtype, gauss());
          for (const Poke& pk : c.pokes)
            if (pk.seq == i && pk.pos == p && pk.what != 'q')
              (pk.what == 'k' ? tk : tv)[static_cast<size_t>(pk.h) * D + pk.d] = pk.value;
          add_pre(self_slot(i, p), tk.data(), tv.data());
        }
      }
      if (cross && s.ctx > 0) {
        for (int64_t p = 0; p < s.enc; ++p) {
          for (auto& x : tk) x = round_to(c.dtype, gauss());
          for (auto& x : tv) x = round_to(c.dtype, gauss());
          add_pre(cross_slot(i, p), tk.data(), tv.data());
        }
      }
      if (!c.write_kv && (decoder || cross)) {
        for (int64_t r = kstart[i]; r < kstart[i + 1]; ++r) {
          const int64_t p = r - kstart[i];
          add_pre(decoder ? self_slot(i, s.ctx + p) : cross_slot(i, p),
                  &kf[static_cast<size_t>(r) * Hkv * D], &vf[static_cast<size_t>(r) * Hkv * D]);
        }
      }
    }
    if (!pre_slots.empty()) {
      // Padding rows (-1) with huge values that must be skipped.
      const size_t npad = 2;
      const int64_t n = static_cast<int64_t>(pre_slots.size() + npad);
      int64_t wrs, whs;
      uint64_t woff;
      pick_strides(rng, c.strided_io, n, Hkv, D, es_m, &wrs, &whs, &woff);
      Tensor kw(dev, c.dtype, n, Hkv, D, wrs, whs, woff), vw(dev, c.dtype, n, Hkv, D, wrs, whs, woff);
      const bool s64 = rng() % 2;
      std::vector<int64_t> rowsrc(pre_slots.size());
      std::iota(rowsrc.begin(), rowsrc.end(), 0);
      for (size_t p = 0; p < npad; ++p) rowsrc.insert(rowsrc.begin() + rng() % (rowsrc.size() + 1), -1);
      std::vector<int64_t> slots;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t src = rowsrc[r];
        slots.push_back(src < 0 ? -1 : pre_slots[src]);
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            kw.set(r, h, d, src < 0 ? 30000.0f : pre_k[(src * Hkv + h) * D + d]);
            vw.set(r, h, d, src < 0 ? -30000.0f : pre_v[(src * Hkv + h) * D + d]);
          }
      }
      // slot mapping tensor: int32 or int64, 1-D
      DevBuf sbuf(dev, slots.size() * (s64 ? 8 : 4));
      for (size_t r = 0; r < slots.size(); ++r) {
        if (s64) {
          std::memcpy(&sbuf.host()[r * 8], &slots[r], 8);
        } else {
          const int32_t v32 = static_cast<int32_t>(slots[r]);
          std::memcpy(&sbuf.host()[r * 4], &v32, 4);
        }
      }
      sbuf.upload();
      int64_t sshape[1] = {n};
      pagedattn_tensor st_slots{};
      st_slots.data = sbuf.ptr();
      st_slots.device = dev;
      st_slots.ndim = 1;
      st_slots.dtype.code = PAGEDATTN_DLPACK_INT;
      st_slots.dtype.bits = s64 ? 64 : 32;
      st_slots.dtype.lanes = 1;
      st_slots.shape = sshape;
      st_slots.strides = nullptr;
      kw.upload();
      vw.upload();
      st = c.head_scales
               ? pagedattn_kv_cache_write_scaled(cache, c.layer, kw.t(), vw.t(), &st_slots,
                                                 khs_t->t(), vhs_t->t(), nullptr)
               : pagedattn_kv_cache_write(cache, c.layer, kw.t(), vw.t(), &st_slots, c.k_scale,
                                          c.v_scale, nullptr);
      if (st != PAGEDATTN_OK) {
        return ::testing::AssertionFailure() << "kv_cache_write (caller's pre-write): "
                                             << pagedattn_status_string(st) << ": "
                                             << last_error();
      }
      for (size_t r = 0; r < pre_slots.size(); ++r) {
        const int b = static_cast<int>(pre_slots[r] / bs), so = static_cast<int>(pre_slots[r] % bs);
        written[pre_slots[r]] = 1;
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            img.set(b, c.layer, 0, so, h, d, pre_k[(r * Hkv + h) * D + d] / ks_of(h));
            img.set(b, c.layer, 1, so, h, d, pre_v[(r * Hkv + h) * D + d] / vs_of(h));
          }
      }
      Image got = img;
      st = pagedattn_kv_cache_read_blocks(cache, all.data(), all.size(), got.bytes.data(),
                                          got.bytes.size(), nullptr);
      if (st != PAGEDATTN_OK) {
        return ::testing::AssertionFailure() << "read_blocks: " << pagedattn_status_string(st)
                                             << ": " << last_error();
      }
      auto r = compare_images("after kv_cache_write", img, got, written, c.layer);
      if (!r) return r;
      img = got;
    }
  }

  // The batch.
  std::vector<int32_t> qlens(nseq), ctxs(nseq), encs(nseq);
  for (int i = 0; i < nseq; ++i) {
    qlens[i] = c.seqs[i].qlen;
    ctxs[i] = c.seqs[i].ctx;
    encs[i] = c.seqs[i].enc;
  }
  std::vector<int64_t> my_slots;
  if (has_cache) {
    for (int i = 0; i < nseq; ++i)
      for (int64_t j = 0; j < qlens[i]; ++j) my_slots.push_back(self_slot(i, ctxs[i] + j));
  }
  std::vector<int64_t> my_cross_slots;
  if (cross) {
    for (int i = 0; i < nseq; ++i)
      if (ctxs[i] == 0)
        for (int64_t p = 0; p < encs[i]; ++p) my_cross_slots.push_back(cross_slot(i, p));
  }
  // Draft trees (docs/semantics.md 4.7): per decoder sequence of 2+ new tokens an empty segment
  // (causal), a chain (the same as causal), or a random tree whose tokens see their ancestors.
  std::vector<std::vector<uint8_t>> tree_rows(nseq);  // unpacked [q][q], empty = causal
  std::vector<uint8_t> tree_bytes;
  std::vector<int64_t> tree_indptr(nseq + 1, 0);
  if (c.tree && decoder) {
    for (int i = 0; i < nseq; ++i) {
      const int q = qlens[i];
      tree_indptr[i + 1] = tree_indptr[i];
      const int kind = static_cast<int>(frng() % 4);
      if (q < 2 || kind == 0) continue;
      std::vector<uint8_t>& m = tree_rows[i];
      m.assign(static_cast<size_t>(q) * q, 0);
      for (int r = 0; r < q; ++r) {
        const int parent = kind == 1 ? r - 1 : (r == 0 || frng() % 4 == 0) ? -1 : static_cast<int>(frng() % r);
        if (parent >= 0)
          for (int j = 0; j < q; ++j) m[static_cast<size_t>(r) * q + j] = m[static_cast<size_t>(parent) * q + j];
        m[static_cast<size_t>(r) * q + r] = 1;
      }
      // Packed, least significant bit first, plus a spare byte the library must not read.
      const int64_t nbytes = (static_cast<int64_t>(q) * q + 7) / 8 + static_cast<int64_t>(frng() % 2);
      const size_t base = tree_bytes.size();
      tree_bytes.resize(base + static_cast<size_t>(nbytes), 0);
      for (int64_t b = 0; b < static_cast<int64_t>(q) * q; ++b)
        if (m[static_cast<size_t>(b)]) tree_bytes[base + static_cast<size_t>(b >> 3)] |= static_cast<uint8_t>(1u << (b & 7));
      tree_indptr[i + 1] = tree_indptr[i] + nbytes;
    }
  }
  pagedattn_batch_desc bd;
  pagedattn_batch_desc_init_sized(&bd, sizeof bd);
  if (c.tree && decoder) {
    bd.tree_mask = tree_bytes.data();
    bd.tree_mask_indptr = tree_indptr.data();
  }
  bd.num_seqs = nseq;
  bd.query_lens = qlens.data();
  bd.context_lens = ctxs.data();
  // vLLM v1's form: seq_lens = context + new tokens, query_start_loc = the row offsets.
  std::vector<int32_t> seq_lens(nseq), qsl(nseq + 1);
  for (int i = 0; i < nseq; ++i) seq_lens[i] = ctxs[i] + qlens[i];
  for (int i = 0; i <= nseq; ++i) qsl[i] = static_cast<int32_t>(qstart[i]);
  if (c.seq_lens_form) {
    bd.lens_form = PAGEDATTN_BATCH_LENS_SEQ;
    bd.query_lens = nullptr;
    bd.context_lens = nullptr;
    bd.seq_lens = seq_lens.data();
    bd.query_start_loc = qsl.data();
  }
  bd.block_tables = has_cache ? self_tab.data() : nullptr;
  bd.block_table_stride = has_cache ? self_w : 0;
  bd.slot_mapping = (c.caller_slots && has_cache) ? my_slots.data() : nullptr;
  if (cross) {
    bd.encoder_lens = encs.data();
    bd.cross_block_tables = cross_tab.data();
    bd.cross_block_table_stride = cross_w;
  }
  pagedattn_status st;
  if (c.via_update) {
    // Plan another step first (every sequence decoding its first token, no caller slots) with
    // spare capacity, then replace it in place, as graph replay does.
    std::vector<int32_t> ones(nseq, 1), zeros(nseq, 0);
    int64_t max_len = 1, enc_total = 0;
    for (int i = 0; i < nseq; ++i) {
      max_len = std::max<int64_t>(max_len, std::max(ctxs[i] + qlens[i], encs[i]));
      enc_total += encs[i];  // the first step has every context at 0: all encoders written
    }
    pagedattn_batch_desc first = bd;
    first.lens_form = PAGEDATTN_BATCH_LENS_CONTEXT;
    first.seq_lens = nullptr;
    first.query_start_loc = nullptr;
    first.query_lens = ones.data();
    first.context_lens = zeros.data();
    first.slot_mapping = nullptr;
    first.max_num_seqs = nseq + c.spare_seqs;
    first.max_num_tokens = std::max<int64_t>(T, nseq) + 5;
    first.max_blocks_per_seq = std::max(self_w, cross ? cross_w : 0);
    first.max_num_encoder_tokens = enc_total + 3;
    first.max_seq_len = max_len + 3;
    first.tree_mask = nullptr;
    first.tree_mask_indptr = nullptr;
    first.max_tree_mask_bytes = (c.tree && decoder) ? tree_indptr[nseq] + 5 : 0;
    st = pagedattn_batch_create(&guard.b, be, has_cache ? cache : nullptr, cross ? cache : nullptr,
                                &first);
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "batch_create (before update): "
                                           << pagedattn_status_string(st) << ": " << last_error();
    }
    st = pagedattn_batch_update(guard.b, &bd);
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "batch_update: " << pagedattn_status_string(st)
                                           << ": " << last_error();
    }
  } else {
    st = pagedattn_batch_create(&guard.b, be, has_cache ? cache : nullptr, cross ? cache : nullptr,
                                &bd);
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "batch_create: " << pagedattn_status_string(st)
                                           << ": " << last_error();
    }
  }
  {
    const int32_t* qs = nullptr;
    int32_t qn = 0;
    st = pagedattn_batch_get_query_start(&qs, &qn, guard.b);
    if (st != PAGEDATTN_OK || qn != nseq + 1) {
      return ::testing::AssertionFailure() << "get_query_start: " << pagedattn_status_string(st)
                                           << " count " << qn << ": " << last_error();
    }
    for (int i = 0; i <= nseq; ++i)
      if (qs[i] != qstart[i])
        return ::testing::AssertionFailure() << "query_start[" << i << "] = " << qs[i]
                                             << ", expected " << qstart[i];
    if (has_cache) {
      const int64_t* sm = nullptr;
      int64_t sn = 0;
      st = pagedattn_batch_get_slot_mapping(&sm, &sn, guard.b);
      if (st != PAGEDATTN_OK || sn != T) {
        return ::testing::AssertionFailure() << "get_slot_mapping: " << pagedattn_status_string(st)
                                             << " count " << sn << " (want " << T << ")";
      }
      for (int64_t t = 0; t < T; ++t)
        if (sm[t] != my_slots[t])
          return ::testing::AssertionFailure() << "slot_mapping[" << t << "] = " << sm[t]
                                               << ", expected " << my_slots[t];
    }
    if (cross) {
      const int64_t* sm = nullptr;
      int64_t sn = -1;
      st = pagedattn_batch_get_cross_slot_mapping(&sm, &sn, guard.b);
      if (st != PAGEDATTN_OK || sn != static_cast<int64_t>(my_cross_slots.size())) {
        return ::testing::AssertionFailure()
               << "get_cross_slot_mapping: " << pagedattn_status_string(st) << " count " << sn
               << " (want " << my_cross_slots.size() << ")";
      }
      for (int64_t t = 0; t < sn; ++t)
        if (sm[t] != my_cross_slots[t])
          return ::testing::AssertionFailure() << "cross_slot_mapping[" << t << "] = " << sm[t]
                                               << ", expected " << my_cross_slots[t];
    }
  }

  // Tensors.
  const int32_t write_kv = (c.write_kv && !enc_only && !(cross && KR == 0)) ? 1 : 0;
  // With write_kv = 0 a decoder may still be handed k/v: they hold other values, so a forward
  // that wrongly writes them shows up in the cache check.
  const bool decoy_kv = decoder && !write_kv && KR > 0 && rng() % 2;
  const bool need_kv = enc_only || c.type == PAGEDATTN_ATTENTION_ENCODER ||
                       (write_kv && (decoder || cross)) || decoy_kv;
  int64_t rs, hs;
  uint64_t off;
  pick_strides(rng, c.strided_io, T + c.pad_rows, H, D, es_m, &rs, &hs, &off);
  // With pad_rows the tensors have that many rows past the batch's (a padded token count).
  const int64_t P = c.pad_rows;
  Tensor q(dev, c.dtype, T + P, H, D, rs, hs, off);
  pick_strides(rng, c.strided_io, T + P, H, D, es_m, &rs, &hs, &off);
  Tensor out(dev, c.dtype, T + P, H, D, rs, hs, off);
  pick_strides(rng, c.strided_io, KR + P, Hkv, D, es_m, &rs, &hs, &off);
  Tensor k(dev, c.dtype, KR + P, Hkv, D, rs, hs, off);
  Tensor v(dev, c.dtype, KR + P, Hkv, D, rs, hs, off);
  auto lse = Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T + P, H,
                            c.strided_io ? H + 3 : 0, 0, c.strided_io ? 4 * 2 : 0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) q.set(t, h, d, qf[(t * H + h) * D + d]);
  // Padding rows of q/k/v: huge values a kernel that read them would spread into real rows.
  for (int64_t t = T; t < T + P; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < D; ++d) q.set(t, h, d, 3.0e4f);
  for (int64_t t = KR; t < KR + P; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        k.set(t, h, d, 3.0e4f);
        v.set(t, h, d, -3.0e4f);
      }
  for (int64_t t = 0; t < KR; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        k.set(t, h, d, decoy_kv ? 3.5f : kf[(t * Hkv + h) * D + d]);
        v.set(t, h, d, decoy_kv ? -3.5f : vf[(t * Hkv + h) * D + d]);
      }
  out.poison_all();
  lse->poison_all();
  q.upload();
  k.upload();
  v.upload();
  out.upload();
  lse->upload();
  std::vector<float> slopes(H);
  for (int h = 0; h < H; ++h) slopes[h] = std::exp2(-8.0f * (h + 1) / H);
  auto alibi = Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, H);
  for (int h = 0; h < H; ++h) alibi->set(h, 0, 0, slopes[h]);
  alibi->upload();

  auto sinks_t = Tensor::make1d(dev, PAGEDATTN_DTYPE_FLOAT32, H);
  for (int h = 0; h < H; ++h) sinks_t->set(h, 0, 0, sink_vals[h]);
  sinks_t->upload();
  pagedattn_attention_options opts;
  if (c.sized_opts)
    pagedattn_attention_options_init_sized(&opts, sizeof opts);
  else
    pagedattn_attention_options_init(&opts);
  opts.num_heads = H;
  opts.num_kv_heads = Hkv;
  opts.head_size = D;
  opts.scale = c.scale;
  opts.soft_cap = c.soft_cap;
  opts.sliding_window = c.window;
  opts.attention_type = c.type;
  opts.write_kv = write_kv;
  opts.k_scale = c.k_scale;
  opts.v_scale = c.v_scale;
  opts.alibi_slopes = c.alibi ? alibi->t() : nullptr;
  // Set whatever the struct_size: a 0.1-sized struct's later fields must not be read.
  opts.sinks = c.sinks ? sinks_t->t() : nullptr;
  opts.attention_chunk = c.chunk;
  opts.k_head_scales = c.head_scales ? khs_t->t() : nullptr;
  opts.v_head_scales = c.head_scales ? vhs_t->t() : nullptr;
  st = pagedattn_forward(be, guard.b, has_cache ? cache : nullptr, c.layer, &opts, q.t(),
                         need_kv ? k.t() : nullptr, need_kv ? v.t() : nullptr, out.t(),
                         c.lse ? lse->t() : nullptr, nullptr);
  if (st != PAGEDATTN_OK) {
    return ::testing::AssertionFailure() << "forward: " << pagedattn_status_string(st) << ": "
                                         << last_error();
  }
  if (pagedattn_backend_synchronize(be, nullptr) != PAGEDATTN_OK) {
    return ::testing::AssertionFailure() << "synchronize: " << last_error();
  }
  out.download();
  lse->download();
  std::string why;
  if (!out.padding_untouched(&why)) return ::testing::AssertionFailure() << "out: " << why;
  if (!lse->padding_untouched(&why)) return ::testing::AssertionFailure() << "lse: " << why;
  // Padding rows of out/lse (docs/semantics.md 4.8): untouched, still the poison.
  if (P > 0) {
    uint8_t poison[4], fpoison[4];
    store_poison(c.dtype, poison);
    store_poison(PAGEDATTN_DTYPE_FLOAT32, fpoison);
    for (int64_t t = T; t < T + P; ++t)
      for (int h = 0; h < H; ++h) {
        for (int d = 0; d < D; ++d)
          if (std::memcmp(&out.buf().host()[out.elem_offset(t, h, d) * es_m], poison, es_m) != 0)
            return ::testing::AssertionFailure() << "out[" << t << "][" << h << "][" << d
                                                 << "] is a padding row (the batch has " << T
                                                 << " tokens) but was written";
        if (c.lse &&
            std::memcmp(&lse->buf().host()[lse->elem_offset(t, h, 0) * 4], fpoison, 4) != 0)
          return ::testing::AssertionFailure() << "lse[" << t << "][" << h
                                               << "] is a padding row but was written";
      }
  }
  if (!c.lse) {
    // lse not requested: its buffer was not passed, nothing to check beyond the above.
  }

  // The cache after the forward.
  if (has_cache) {
    Image want = img;
    if (write_kv) {
      for (int i = 0; i < nseq; ++i)
        for (int64_t r = kstart[i]; r < kstart[i + 1]; ++r) {
          const int64_t p = r - kstart[i];
          const int64_t slot = cross ? cross_slot(i, p) : self_slot(i, ctxs[i] + p);
          const int b = static_cast<int>(slot / bs), so = static_cast<int>(slot % bs);
          written[slot] = 1;
          for (int h = 0; h < Hkv; ++h)
            for (int d = 0; d < D; ++d) {
              want.set(b, c.layer, 0, so, h, d, kf[(r * Hkv + h) * D + d] / ks_of(h));
              want.set(b, c.layer, 1, so, h, d, vf[(r * Hkv + h) * D + d] / vs_of(h));
            }
        }
    }
    Image got = img;
    std::vector<int32_t> all(nb);
    std::iota(all.begin(), all.end(), 0);
    st = pagedattn_kv_cache_read_blocks(cache, all.data(), all.size(), got.bytes.data(),
                                        got.bytes.size(), nullptr);
    if (st != PAGEDATTN_OK) {
      return ::testing::AssertionFailure() << "read_blocks: " << last_error();
    }
    auto r = compare_images("after forward", want, got, written, c.layer);
    if (!r) return r;
    img = got;
    if (c.wrap_cache) {
      // The library must have used our memory in place, and left the stride padding alone.
      for (int l = 0; l < c.num_layers; ++l)
        for (int kvi = 0; kvi < 2; ++kvi) {
          DevBuf& wbuf = *wrap_bufs[2 * l + kvi];
          wbuf.download();
          std::vector<uint8_t> logical(wbuf.bytes(), 0);
          const size_t es = dtype_bytes(cdt);
          for (int b = 0; b < nb; ++b)
            for (int s = 0; s < bs; ++s)
              for (int h = 0; h < Hkv; ++h)
                for (int d = 0; d < D; ++d) {
                  const size_t e = (static_cast<size_t>(b) * wb + s * wsl + h * wh + d) * es;
                  if (std::memcmp(&wbuf.host()[e], &img.bytes[img.off(b, l, kvi, s, h, d)], es))
                    return ::testing::AssertionFailure()
                           << "wrapped memory differs from read_blocks at layer " << l
                           << " block " << b << " slot " << s << " head " << h << " dim " << d;
                  std::fill(&logical[e], &logical[e] + es, 1);
                }
          for (size_t i = 0; i < wbuf.bytes(); ++i)
            if (!logical[i] && wbuf.host()[i] != kPadByte)
              return ::testing::AssertionFailure()
                     << "wrapped cache: padding byte " << i << " of layer " << l
                     << " was overwritten";
        }
    }
  }

  // The reference.
  RefParams rp;
  rp.H = H;
  rp.Hkv = Hkv;
  rp.D = D;
  rp.scale = c.scale != 0 ? c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  rp.soft_cap = c.soft_cap;
  rp.window = decoder ? c.window : 0;
  rp.alibi = (decoder && c.alibi) ? slopes.data() : nullptr;
  rp.sinks = (c.sinks && c.sized_opts) ? sink_vals.data() : nullptr;
  rp.chunk = (decoder && c.sized_opts) ? c.chunk : 0;
  rp.causal = decoder;
  std::vector<double> ref_out(static_cast<size_t>(T) * H * D), ref_lse(static_cast<size_t>(T) * H);
  for (int i = 0; i < nseq; ++i) {
    const SeqSpec& s = c.seqs[i];
    if (s.qlen == 0) continue;
    int64_t nk;
    std::vector<float> kk, vv;
    if (decoder || cross) {
      nk = decoder ? s.ctx + s.qlen : s.enc;
      kk.resize(static_cast<size_t>(nk) * Hkv * D);
      vv.resize(kk.size());
      for (int64_t p = 0; p < nk; ++p) {
        const int64_t slot = decoder ? self_slot(i, p) : cross_slot(i, p);
        const int b = static_cast<int>(slot / bs), so = static_cast<int>(slot % bs);
        for (int h = 0; h < Hkv; ++h)
          for (int d = 0; d < D; ++d) {
            kk[(p * Hkv + h) * D + d] = img.get(b, c.layer, 0, so, h, d) * ks_of(h);
            vv[(p * Hkv + h) * D + d] = img.get(b, c.layer, 1, so, h, d) * vs_of(h);
          }
      }
    } else {
      nk = s.qlen;
      kk.assign(kf.begin() + kstart[i] * Hkv * D, kf.begin() + kstart[i + 1] * Hkv * D);
      vv.assign(vf.begin() + kstart[i] * Hkv * D, vf.begin() + kstart[i + 1] * Hkv * D);
    }
    std::vector<int64_t> qpos(s.qlen);
    for (int64_t j = 0; j < s.qlen; ++j) qpos[j] = (decoder ? s.ctx : 0) + j;
    rp.tree = tree_rows[i].empty() ? nullptr : tree_rows[i].data();
    rp.tree_ctx = s.ctx;
    rp.tree_q = s.qlen;
    ref_attend(rp, s.qlen, &qf[qstart[i] * H * D], qpos.data(), nk, kk.data(), vv.data(),
               &ref_out[qstart[i] * H * D], &ref_lse[qstart[i] * H]);
  }
  std::vector<float> got_out(ref_out.size()), got_lse(ref_lse.size());
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) got_out[(t * H + h) * D + d] = out.get(t, h, d);
      got_lse[t * H + h] = lse->get(t, h, 0);
    }
  if (!c.pokes.empty()) {
    // The poison is a NaN too: a NaN the reference expects must have been written.
    uint8_t poison[4];
    store_poison(c.dtype, poison);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d)
          if (std::memcmp(&out.buf().host()[out.elem_offset(t, h, d) * es_m], poison, es_m) == 0)
            return ::testing::AssertionFailure() << "out[" << t << "][" << h << "][" << d
                                                 << "] still holds the poison: not written";
  }
  CaseResult cr;
  auto r = check_close("out", ref_out, got_out, tolerance(c.dtype, cdt), &cr.err);
  if (!r) return r;
  if (c.lse) {
    const double ltol = tolerance(c.dtype, cdt) * 10;
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      if (std::isnan(ref_lse[i])) {  // a row that reads a non-finite score
        if (!std::isnan(got_lse[i])) {
          return ::testing::AssertionFailure() << "lse[" << i / H << "][" << i % H << "] = "
                                               << got_lse[i] << ", reference NaN (a row that "
                                               << "reads a non-finite score)";
        }
        continue;
      }
      if (std::isinf(ref_lse[i])) {  // a row that sees no key
        if (!(std::isinf(got_lse[i]) && got_lse[i] < 0)) {
          return ::testing::AssertionFailure() << "lse[" << i / H << "][" << i % H << "] = "
                                               << got_lse[i] << " for a row that sees no key "
                                               << "(want -inf)";
        }
        continue;
      }
      const double e = std::fabs(static_cast<double>(got_lse[i]) - ref_lse[i]) /
                       std::max(1.0, std::fabs(ref_lse[i]));
      if (std::isnan(got_lse[i]) || !(e <= ltol)) {
        return ::testing::AssertionFailure()
               << "lse[" << i / H << "][" << i % H << "] = " << got_lse[i] << ", reference "
               << ref_lse[i] << " (tolerance " << ltol << ")";
      }
      cr.lse_err = std::max(cr.lse_err, e);
    }
  }
  if (res) *res = cr;
  return ::testing::AssertionSuccess();
}

}  // namespace pat
