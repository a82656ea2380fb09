// pagedattn-conformance: runs tests/conformance/cases.txt through the C API, checks each result
// against a float64 reference and writes inputs and outputs for the bindings (see FORMAT.md).
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "pagedattn/pagedattn.h"
#include "pagedattn_test_support.h"

namespace {

using Keys = std::map<std::string, std::vector<std::string>>;

struct RawCase {
  std::string name;
  Keys keys;
};

// ---------------------------------------------------------------------------------------------

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0; }
  uint64_t below(uint64_t n) { return next() % n; }
};

pagedattn_dtype parse_dtype(const std::string& s) {
  if (s == "f32") return PAGEDATTN_DTYPE_FLOAT32;
  if (s == "f16") return PAGEDATTN_DTYPE_FLOAT16;
  if (s == "bf16") return PAGEDATTN_DTYPE_BFLOAT16;
  if (s == "fp8_e4m3") return PAGEDATTN_DTYPE_FP8_E4M3;
  if (s == "fp8_e5m2") return PAGEDATTN_DTYPE_FP8_E5M2;
  return PAGEDATTN_DTYPE_INVALID;
}
size_t dsize(pagedattn_dtype d) {
  return d == PAGEDATTN_DTYPE_FLOAT32 ? 4 : (d == PAGEDATTN_DTYPE_FP8_E4M3 || d == PAGEDATTN_DTYPE_FP8_E5M2) ? 1 : 2;
}
bool is_fp8(pagedattn_dtype d) { return d == PAGEDATTN_DTYPE_FP8_E4M3 || d == PAGEDATTN_DTYPE_FP8_E5M2; }

// A host array of one model dtype, with its exact values as doubles (after rounding).
struct Arr {
  pagedattn_dtype dt = PAGEDATTN_DTYPE_FLOAT32;
  std::vector<unsigned char> bytes;
  std::vector<double> val;
  void init(pagedattn_dtype d, size_t n) {
    dt = d;
    bytes.assign(n * dsize(d), 0);
    val.assign(n, 0.0);
  }
  // Stores f rounded to the dtype (the tests' own conversions) and keeps the exact value.
  void set(size_t i, float f) {
    unsigned char* p = &bytes[i * dsize(dt)];
    pat::store(dt, p, f);
    val[i] = pat::load(dt, p);
  }
  void random(Rng& r) {
    for (size_t i = 0; i < val.size(); ++i) set(i, static_cast<float>(r.uniform()));
  }
  size_t n() const { return val.size(); }
};

// A compact pagedattn_tensor over host memory.
struct Tensor {
  std::vector<int64_t> shape, strides;
  pagedattn_tensor t{};
  Tensor(void* data, pagedattn_dtype dt, std::vector<int64_t> shp) : shape(std::move(shp)) {
    strides.assign(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    t.data = data;
    t.device.device_type = PAGEDATTN_DEVICE_CPU;
    t.device.device_id = 0;
    t.ndim = static_cast<int32_t>(shape.size());
    pagedattn_dtype_to_dlpack(&t.dtype, dt);
    t.shape = shape.data();
    t.strides = strides.data();
    t.byte_offset = 0;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
};

// ---------------------------------------------------------------------------------------------

struct Case {
  std::string name, op = "forward", backend = "cpu", attention = "decoder", expect = "PAGEDATTN_OK";
  uint64_t seed = 1;
  pagedattn_dtype dtype = PAGEDATTN_DTYPE_FLOAT32, cache_dtype = PAGEDATTN_DTYPE_INVALID,
                  out_dtype = PAGEDATTN_DTYPE_INVALID;
  std::string layout = "nhd", dst_layout;
  int num_layers = 1, layer = 0, num_blocks = 64, block_size = 16, num_heads = 4, num_kv_heads = 2,
      head_size = 64, opt_num_kv_heads = -1, write_kv = -1, sliding_window = 0, alibi = 0, lse = 0,
      null_batch = 0, bad_table_entry = 0, table_stride = -1, bad_slot = 0, dst_num_blocks = -1,
      sinks = 0, sinks_len = -1, attention_chunk = 0, head_scales = 0, bad_head_scale = 0, tree = 0,
      bad_tree_mask = 0;
  float scale = 0, soft_cap = 0, k_scale = 1, v_scale = 1;
  std::vector<int32_t> query_lens, context_lens, encoder_lens, pairs;
};

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "pagedattn-conformance: %s\n", m.c_str());
  std::exit(2);
}

std::vector<RawCase> parse_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) die("cannot open " + path);
  std::vector<RawCase> out;
  std::string line;
  bool in_block = false;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      in_block = false;
      continue;
    }
    if (line[0] == '#') continue;
    std::istringstream ss(line);
    std::string key, w;
    ss >> key;
    std::vector<std::string> vals;
    while (ss >> w) vals.push_back(w);
    if (key == "case") {
      if (vals.size() != 1) die(path + ":" + std::to_string(lineno) + ": case needs one name");
      out.push_back({vals[0], {}});
      in_block = true;
      continue;
    }
    if (!in_block) die(path + ":" + std::to_string(lineno) + ": key outside a case block");
    out.back().keys[key] = vals;
  }
  return out;
}

Case resolve(const RawCase& rc) {
  Case c;
  c.name = rc.name;
  for (const auto& kv : rc.keys) {
    const std::string& k = kv.first;
    const auto& v = kv.second;
    auto one = [&]() -> const std::string& {
      if (v.size() != 1) die(c.name + ": key " + k + " needs one value");
      return v[0];
    };
    auto ints = [&]() {
      std::vector<int32_t> r;
      for (const auto& s : v) r.push_back(static_cast<int32_t>(std::stol(s)));
      return r;
    };
    auto i1 = [&]() { return static_cast<int>(std::stol(one())); };
    if (k == "op") c.op = one();
    else if (k == "seed") c.seed = std::stoull(one());
    else if (k == "backend") c.backend = one();
    else if (k == "dtype") c.dtype = parse_dtype(one());
    else if (k == "cache_dtype") c.cache_dtype = parse_dtype(one());
    else if (k == "out_dtype") c.out_dtype = parse_dtype(one());
    else if (k == "layout") c.layout = one();
    else if (k == "dst_layout") c.dst_layout = one();
    else if (k == "num_layers") c.num_layers = i1();
    else if (k == "layer") c.layer = i1();
    else if (k == "num_blocks") c.num_blocks = i1();
    else if (k == "block_size") c.block_size = i1();
    else if (k == "num_heads") c.num_heads = i1();
    else if (k == "num_kv_heads") c.num_kv_heads = i1();
    else if (k == "opt_num_kv_heads") c.opt_num_kv_heads = i1();
    else if (k == "head_size") c.head_size = i1();
    else if (k == "query_lens") c.query_lens = ints();
    else if (k == "context_lens") c.context_lens = ints();
    else if (k == "encoder_lens") c.encoder_lens = ints();
    else if (k == "attention") c.attention = one();
    else if (k == "write_kv") c.write_kv = i1();
    else if (k == "scale") c.scale = std::stof(one());
    else if (k == "soft_cap") c.soft_cap = std::stof(one());
    else if (k == "sliding_window") c.sliding_window = i1();
    else if (k == "alibi") c.alibi = i1();
    else if (k == "sinks") c.sinks = i1();
    else if (k == "sinks_len") c.sinks_len = i1();
    else if (k == "attention_chunk") c.attention_chunk = i1();
    else if (k == "head_scales") c.head_scales = i1();
    else if (k == "bad_head_scale") c.bad_head_scale = i1();
    else if (k == "tree") c.tree = i1();
    else if (k == "bad_tree_mask") c.bad_tree_mask = i1();
    else if (k == "lse") c.lse = i1();
    else if (k == "k_scale") c.k_scale = std::stof(one());
    else if (k == "v_scale") c.v_scale = std::stof(one());
    else if (k == "null_batch") c.null_batch = i1();
    else if (k == "bad_table_entry") c.bad_table_entry = i1();
    else if (k == "table_stride") c.table_stride = i1();
    else if (k == "bad_slot") c.bad_slot = i1();
    else if (k == "pairs") c.pairs = ints();
    else if (k == "dst_num_blocks") c.dst_num_blocks = i1();
    else if (k == "expect") c.expect = one();
    else die(c.name + ": unknown key " + k);
  }
  if (c.dtype == PAGEDATTN_DTYPE_INVALID || is_fp8(c.dtype)) die(c.name + ": bad dtype");
  if (c.cache_dtype == PAGEDATTN_DTYPE_INVALID) c.cache_dtype = c.dtype;
  if (c.out_dtype == PAGEDATTN_DTYPE_INVALID) c.out_dtype = c.dtype;
  if (c.opt_num_kv_heads < 0) c.opt_num_kv_heads = c.num_kv_heads;
  if (c.write_kv < 0) c.write_kv = c.attention == "encoder_only" ? 0 : 1;
  if (c.dst_layout.empty()) c.dst_layout = c.layout;
  if (c.dst_num_blocks < 0) c.dst_num_blocks = c.num_blocks;
  if (c.sinks_len < 0) c.sinks_len = c.num_heads;
  if (c.bad_head_scale && !c.head_scales) die(c.name + ": bad_head_scale needs head_scales 1");
  if (c.bad_tree_mask && !c.tree) die(c.name + ": bad_tree_mask needs tree 1");
  if (c.tree && c.op != "forward") die(c.name + ": tree needs op forward");
  if (c.context_lens.empty()) c.context_lens.assign(c.query_lens.size(), 0);
  if (c.context_lens.size() != c.query_lens.size()) die(c.name + ": context_lens size");
  if (!c.encoder_lens.empty() && c.encoder_lens.size() != c.query_lens.size()) die(c.name + ": encoder_lens size");
  if (c.attention == "cross" && c.encoder_lens.empty()) die(c.name + ": cross needs encoder_lens");
  if (c.pairs.size() % 2) die(c.name + ": odd pairs");
  return c;
}

pagedattn_attention_type attention_type(const std::string& s) {
  if (s == "decoder") return PAGEDATTN_ATTENTION_DECODER;
  if (s == "encoder") return PAGEDATTN_ATTENTION_ENCODER;
  if (s == "encoder_only") return PAGEDATTN_ATTENTION_ENCODER_ONLY;
  if (s == "cross") return PAGEDATTN_ATTENTION_CROSS;
  die("unknown attention type " + s);
}
pagedattn_layout layout_of(const std::string& s) {
  if (s == "nhd") return PAGEDATTN_LAYOUT_NHD;
  if (s == "hnd") return PAGEDATTN_LAYOUT_HND;
  die("unknown layout " + s);
}
const char* dtype_key(pagedattn_dtype d) {
  switch (d) {
    case PAGEDATTN_DTYPE_FLOAT32: return "f32";
    case PAGEDATTN_DTYPE_FLOAT16: return "f16";
    case PAGEDATTN_DTYPE_BFLOAT16: return "bf16";
    case PAGEDATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case PAGEDATTN_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "invalid";
  }
}

void write_file(const std::string& path, const void* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) die("cannot write " + path);
  if (n && std::fwrite(data, 1, n, f) != n) die("short write " + path);
  std::fclose(f);
}

template <typename T>
void write_vec(const std::string& path, const std::vector<T>& v) {
  write_file(path, v.data(), v.size() * sizeof(T));
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += " " + std::to_string(x);
  return s;
}

std::string fmt_float(float f) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(f));
  return b;
}

// Runs one case; returns "" on success or why it failed.
std::string run_case(const Case& c, const std::string& dir, double* max_rel_out) {
  const bool fwd = c.op == "forward";
  const bool cross = c.attention == "cross";
  const bool enc_only = c.attention == "encoder_only";
  const bool encoder = c.attention == "encoder" || enc_only;
  const int S = static_cast<int>(c.query_lens.size());
  const int H = c.num_heads, Hkv = c.num_kv_heads, D = c.head_size, bs = c.block_size, nb = c.num_blocks;
  Rng rng{c.seed};
  std::string fail;

  // Block tables: a shuffled permutation handed out in sequence order.
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) perm[i] = i;
  for (int i = nb - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  size_t next_block = 0;
  auto take = [&](int n, std::vector<int32_t>& row) {
    for (int b = 0; b < n; ++b) {
      if (next_block >= perm.size()) die(c.name + ": num_blocks too small for the tables");
      row.push_back(perm[next_block++]);
    }
  };
  int64_t T = 0, enc_total = 0;
  std::vector<int32_t> qstart(S + 1, 0), estart(S + 1, 0);
  for (int i = 0; i < S; ++i) {
    T += c.query_lens[i];
    qstart[i + 1] = static_cast<int32_t>(T);
    int e = c.encoder_lens.empty() ? 0 : c.encoder_lens[i];
    enc_total += e;
    estart[i + 1] = static_cast<int32_t>(enc_total);
  }
  std::vector<std::vector<int32_t>> rows(S), xrows(S);
  int need_max = 1, xneed_max = 1;
  if (fwd && !enc_only) {
    for (int i = 0; i < S; ++i) {
      int need = (c.context_lens[i] + c.query_lens[i] + bs - 1) / bs;
      take(need, rows[i]);
      need_max = std::max(need_max, need);
    }
    if (cross)
      for (int i = 0; i < S; ++i) {
        int need = (c.encoder_lens[i] + bs - 1) / bs;
        take(need, xrows[i]);
        xneed_max = std::max(xneed_max, need);
      }
  }
  const int stride = c.table_stride > 0 ? c.table_stride : need_max;
  const int xstride = cross ? xneed_max : 0;
  std::vector<int32_t> tables(static_cast<size_t>(S) * stride, 0), xtables(static_cast<size_t>(S) * xstride, 0);
  for (int i = 0; i < S; ++i) {
    for (int b = 0; b < stride && b < static_cast<int>(rows[i].size()); ++b) tables[i * stride + b] = rows[i][b];
    for (int b = 0; b < xstride && b < static_cast<int>(xrows[i].size()); ++b) xtables[i * xstride + b] = xrows[i][b];
  }
  if (c.bad_table_entry && !tables.empty()) tables[0] = nb;
  auto slot_of = [&](const std::vector<int32_t>& row, int64_t pos) -> int64_t {
    return static_cast<int64_t>(row[pos / bs]) * bs + pos % bs;
  };

  // Context rows: positions 0..context_len-1 (0..context_len+query_len-1 for a non-writing
  // decoder forward; the encoder tokens of a non-writing cross forward; every slot for
  // copy/swap). ctx_start[i] = first context row of sequence i.
  std::vector<int64_t> ctx_slots;
  std::vector<int64_t> ctx_start(S + 1, 0);
  if (fwd && !encoder) {
    for (int i = 0; i < S; ++i) {
      ctx_start[i] = static_cast<int64_t>(ctx_slots.size());
      if (cross) {
        if (!c.write_kv)
          for (int p = 0; p < c.encoder_lens[i]; ++p) ctx_slots.push_back(slot_of(xrows[i], p));
      } else {
        // A decoder forward with write_kv 0 reads the step's keys too: the caller wrote them.
        const int upto = c.context_lens[i] + (c.write_kv ? 0 : c.query_lens[i]);
        for (int p = 0; p < upto; ++p) ctx_slots.push_back(slot_of(rows[i], p));
      }
    }
    ctx_start[S] = static_cast<int64_t>(ctx_slots.size());
  } else if (!fwd) {
    for (int64_t s = 0; s < static_cast<int64_t>(nb) * bs; ++s) ctx_slots.push_back(s);
  }
  if (c.bad_slot && !ctx_slots.empty()) ctx_slots.back() = static_cast<int64_t>(nb) * bs;
  const int64_t num_ctx = static_cast<int64_t>(ctx_slots.size());
  const int L = c.num_layers;

  Arr ctx_k, ctx_v, q, k, v;
  ctx_k.init(c.dtype, static_cast<size_t>(L * num_ctx * Hkv * D));
  ctx_v.init(c.dtype, ctx_k.n());
  ctx_k.random(rng);
  ctx_v.random(rng);
  int64_t kv_rows = 0;
  if (fwd) {
    if (encoder) kv_rows = T;
    else if (c.write_kv) kv_rows = cross ? enc_total : T;
  }
  q.init(c.dtype, static_cast<size_t>(T * H * D));
  k.init(c.dtype, static_cast<size_t>(kv_rows * Hkv * D));
  v.init(c.dtype, k.n());
  q.random(rng);
  k.random(rng);
  v.random(rng);
  std::vector<float> slopes(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) slopes[h] = static_cast<float>(std::pow(2.0, -8.0 * (h + 1) / H));
  // Drawn after everything above, so that cases without these keys keep their inputs.
  std::vector<float> sinks, khs, vhs;
  if (c.sinks) {
    sinks.resize(static_cast<size_t>(c.sinks_len));
    for (float& s : sinks) s = static_cast<float>(1.0 + 3.0 * rng.uniform());  // [-2, 4)
  }
  if (c.head_scales) {
    static const float kChoices[4] = {0.5f, 2.0f, 0.25f, 4.0f};
    khs.resize(static_cast<size_t>(Hkv));
    vhs.resize(static_cast<size_t>(Hkv));
    for (float& s : khs) s = kChoices[rng.below(4)];
    for (float& s : vhs) s = kChoices[rng.below(4)];
    if (c.bad_head_scale) khs[0] = 0.0f;
  }
  // Tree masks (docs/semantics.md 4.7): a sequence with new tokens gets a random draft tree
  // (token r > 0 hangs under a parent drawn from 0..r-1 and sees its parent's row plus itself)
  // unless a draw of next() % 4 gives 0 (its segment is then empty: causal). tree_bits keeps
  // the unpacked q x q matrices (empty = causal) for the reference.
  std::vector<uint8_t> tree_mask;
  std::vector<int64_t> tree_indptr;
  std::vector<std::vector<uint8_t>> tree_bits(static_cast<size_t>(S));
  if (c.tree) {
    tree_indptr.push_back(0);
    int64_t first_masked = -1;
    for (int i = 0; i < S; ++i) {
      const int64_t nq = c.query_lens[i];
      if (nq >= 1 && rng.below(4) != 0) {
        std::vector<uint8_t>& m = tree_bits[static_cast<size_t>(i)];
        m.assign(static_cast<size_t>(nq * nq), 0);
        for (int64_t r = 0; r < nq; ++r) {
          if (r > 0) {
            const int64_t parent = static_cast<int64_t>(rng.below(static_cast<uint64_t>(r)));
            std::copy_n(&m[parent * nq], nq, &m[r * nq]);
          }
          m[r * nq + r] = 1;
        }
        if (first_masked < 0) first_masked = i;
        const size_t at = tree_mask.size();
        tree_mask.resize(at + static_cast<size_t>((nq * nq + 7) / 8), 0);
        for (int64_t b = 0; b < nq * nq; ++b)
          if (m[b]) tree_mask[at + b / 8] |= static_cast<uint8_t>(1u << (b % 8));
      }
      tree_indptr.push_back(static_cast<int64_t>(tree_mask.size()));
    }
    if (c.bad_tree_mask) {
      // Clears the diagonal bit of the last row of the first masked sequence.
      if (first_masked < 0) die(c.name + ": bad_tree_mask but no sequence got a mask");
      const int64_t nq = c.query_lens[first_masked], b = nq * nq - 1;
      tree_mask[static_cast<size_t>(tree_indptr[first_masked] + b / 8)] &= static_cast<uint8_t>(~(1u << (b % 8)));
    }
  }
  std::vector<int32_t> pairs = c.pairs;

  // Inputs to disk.
  if (fwd) {
    write_vec(dir + "/q.bin", q.bytes);
    if (kv_rows) {
      write_vec(dir + "/k.bin", k.bytes);
      write_vec(dir + "/v.bin", v.bytes);
    }
    if (!enc_only) write_vec(dir + "/tables.bin", tables);
    if (cross) write_vec(dir + "/cross_tables.bin", xtables);
    if (c.alibi) write_vec(dir + "/alibi.bin", slopes);
    if (c.sinks) write_vec(dir + "/sinks.bin", sinks);
    if (c.tree) {
      write_vec(dir + "/tree_mask.bin", tree_mask);
      write_vec(dir + "/tree_mask_indptr.bin", tree_indptr);
    }
  } else {
    write_vec(dir + "/pairs.bin", pairs);
  }
  if (c.head_scales) {
    write_vec(dir + "/k_head_scales.bin", khs);
    write_vec(dir + "/v_head_scales.bin", vhs);
  }
  if (num_ctx) {
    write_vec(dir + "/ctx_k.bin", ctx_k.bytes);
    write_vec(dir + "/ctx_v.bin", ctx_v.bytes);
    write_vec(dir + "/ctx_slots.bin", ctx_slots);
  }

  // The call sequence of FORMAT.md section 3.
  pagedattn_status st = PAGEDATTN_OK;
  std::string step = "none", message;
  pagedattn_backend* be = nullptr;
  pagedattn_kv_cache* cache = nullptr;
  pagedattn_kv_cache* dst = nullptr;
  pagedattn_batch* batch = nullptr;
  const size_t out_elems = static_cast<size_t>(T * H * D);
  std::vector<unsigned char> out(out_elems * dsize(c.out_dtype), 0xFF);  // poison (NaN)
  std::vector<float> lse(static_cast<size_t>(T * H), NAN);
  std::vector<unsigned char> cache_bytes, before;
  std::vector<int64_t> slots_seen;
  uint64_t bpb = 0;
  auto check = [&](pagedattn_status s, const char* name) {
    if (s != PAGEDATTN_OK) {
      st = s;
      step = name;
      message = pagedattn_last_error();
      for (char& ch : message)
        if (ch == '\n' || ch == '\r') ch = ' ';
    }
    return s == PAGEDATTN_OK;
  };
  auto read_all = [&](pagedattn_kv_cache* kc, int n, std::vector<unsigned char>& buf) {
    pagedattn_kv_cache_desc d;
    pagedattn_kv_cache_desc_init(&d);
    pagedattn_kv_cache_get_desc(&d, kc);
    pagedattn_kv_cache_bytes_per_block(&bpb, &d);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[i] = i;
    buf.assign(static_cast<size_t>(bpb) * n, 0);
    return pagedattn_kv_cache_read_blocks(kc, ids.data(), ids.size(), buf.data(), buf.size(), nullptr);
  };
  const bool refusal = c.expect != "PAGEDATTN_OK";

  do {
    pagedattn_backend_options bo;
    pagedattn_backend_options_init(&bo);
    bo.num_threads = 1;
    if (!check(pagedattn_backend_create(&be, c.backend.c_str(), &bo), "backend_create")) break;
    pagedattn_kv_cache_desc cd;
    pagedattn_kv_cache_desc_init(&cd);
    cd.num_layers = L;
    cd.num_blocks = nb;
    cd.block_size = bs;
    cd.num_kv_heads = Hkv;
    cd.head_size = D;
    cd.dtype = c.cache_dtype;
    cd.layout = layout_of(c.layout);
    cd.flags = 0;
    if (!enc_only && !check(pagedattn_kv_cache_create(&cache, be, &cd), "cache_create")) break;
    if (num_ctx) {
      if (refusal && cache && read_all(cache, nb, before) != PAGEDATTN_OK) {
        fail = "read_blocks failed: " + std::string(pagedattn_last_error());
        break;
      }
      Tensor ts(ctx_slots.data(), PAGEDATTN_DTYPE_FLOAT32, {num_ctx});
      ts.t.dtype = {PAGEDATTN_DLPACK_INT, 64, 1};
      Tensor tks(khs.data(), PAGEDATTN_DTYPE_FLOAT32, {Hkv});
      Tensor tvs(vhs.data(), PAGEDATTN_DTYPE_FLOAT32, {Hkv});
      bool ok = true;
      for (int l = 0; l < L && ok; ++l) {
        size_t off = static_cast<size_t>(l) * num_ctx * Hkv * D * dsize(c.dtype);
        Tensor tk(ctx_k.bytes.data() + off, c.dtype, {num_ctx, Hkv, D});
        Tensor tv(ctx_v.bytes.data() + off, c.dtype, {num_ctx, Hkv, D});
        ok = check(c.head_scales
                       ? pagedattn_kv_cache_write_scaled(cache, l, &tk.t, &tv.t, &ts.t, &tks.t, &tvs.t, nullptr)
                       : pagedattn_kv_cache_write(cache, l, &tk.t, &tv.t, &ts.t, c.k_scale, c.v_scale, nullptr),
                   "kv_cache_write");
      }
      if (!ok) break;
    }
    if (fwd) {
      pagedattn_batch_desc bd;
      pagedattn_batch_desc_init_sized(&bd, sizeof bd);
      bd.num_seqs = S;
      bd.query_lens = c.query_lens.data();
      bd.context_lens = c.context_lens.data();
      bd.block_tables = enc_only ? nullptr : tables.data();
      bd.block_table_stride = enc_only ? 0 : stride;
      if (cross) {
        bd.encoder_lens = c.encoder_lens.data();
        bd.cross_block_tables = xtables.data();
        bd.cross_block_table_stride = xstride;
      }
      if (c.tree) {
        bd.tree_mask = tree_mask.data();
        bd.tree_mask_indptr = tree_indptr.data();
      }
      if (refusal && cache && read_all(cache, nb, before) != PAGEDATTN_OK) {
        fail = "read_blocks failed: " + std::string(pagedattn_last_error());
        break;
      }
      if (!check(pagedattn_batch_create(&batch, be, cache, cross ? cache : nullptr, &bd), "batch_create")) break;
      const int64_t* sm = nullptr;
      int64_t count = 0;
      if (!check(pagedattn_batch_get_slot_mapping(&sm, &count, batch), "batch_get_slot_mapping")) break;
      slots_seen.assign(sm, sm + count);
      pagedattn_attention_options o;
      pagedattn_attention_options_init_sized(&o, sizeof o);
      o.num_heads = H;
      o.num_kv_heads = c.opt_num_kv_heads;
      o.head_size = D;
      o.scale = c.scale;
      o.soft_cap = c.soft_cap;
      o.sliding_window = c.sliding_window;
      o.attention_type = attention_type(c.attention);
      o.write_kv = c.write_kv;
      o.k_scale = c.k_scale;
      o.v_scale = c.v_scale;
      Tensor ta(slopes.data(), PAGEDATTN_DTYPE_FLOAT32, {H});
      o.alibi_slopes = c.alibi ? &ta.t : nullptr;
      Tensor tsk(sinks.data(), PAGEDATTN_DTYPE_FLOAT32, {c.sinks_len});
      o.sinks = c.sinks ? &tsk.t : nullptr;
      o.attention_chunk = c.attention_chunk;
      Tensor tks(khs.data(), PAGEDATTN_DTYPE_FLOAT32, {Hkv});
      Tensor tvs(vhs.data(), PAGEDATTN_DTYPE_FLOAT32, {Hkv});
      o.k_head_scales = c.head_scales ? &tks.t : nullptr;
      o.v_head_scales = c.head_scales ? &tvs.t : nullptr;
      Tensor tq(q.bytes.data(), c.dtype, {T, H, D});
      Tensor tk(k.bytes.data(), c.dtype, {kv_rows, Hkv, D});
      Tensor tv(v.bytes.data(), c.dtype, {kv_rows, Hkv, D});
      Tensor to(out.data(), c.out_dtype, {T, H, D});
      Tensor tl(lse.data(), PAGEDATTN_DTYPE_FLOAT32, {T, H});
      if (refusal && cache && read_all(cache, nb, before) != PAGEDATTN_OK) {
        fail = "read_blocks failed: " + std::string(pagedattn_last_error());
        break;
      }
      if (!check(pagedattn_forward(be, c.null_batch ? nullptr : batch, cache, c.layer, &o, &tq.t,
                                   kv_rows ? &tk.t : nullptr, kv_rows ? &tv.t : nullptr, &to.t,
                                   c.lse ? &tl.t : nullptr, nullptr),
                 "forward"))
        break;
    } else if (c.op == "copy_blocks") {
      if (refusal && read_all(cache, nb, before) != PAGEDATTN_OK) break;
      if (!check(pagedattn_kv_cache_copy_blocks(cache, pairs.data(), pairs.size() / 2, nullptr), "copy_blocks"))
        break;
    } else if (c.op == "swap_blocks") {
      pagedattn_kv_cache_desc dd = cd;
      dd.layout = layout_of(c.dst_layout);
      dd.num_blocks = c.dst_num_blocks;
      if (!check(pagedattn_kv_cache_create(&dst, be, &dd), "dst_cache_create")) break;
      if (refusal && read_all(dst, c.dst_num_blocks, before) != PAGEDATTN_OK) break;
      if (!check(pagedattn_kv_cache_swap_blocks(dst, cache, pairs.data(), pairs.size() / 2, nullptr), "swap_blocks"))
        break;
    } else {
      die(c.name + ": unknown op " + c.op);
    }
  } while (false);

  // Step 6 (also after a refusal, to show nothing was written).
  pagedattn_kv_cache* written = c.op == "swap_blocks" ? dst : cache;
  int written_nb = c.op == "swap_blocks" ? c.dst_num_blocks : nb;
  if (written && fail.empty()) {
    if (read_all(written, written_nb, cache_bytes) != PAGEDATTN_OK)
      fail = "read_blocks failed: " + std::string(pagedattn_last_error());
    else
      write_vec(dir + "/cache.bin", cache_bytes);
  }
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(dst);
  pagedattn_kv_cache_destroy(cache);
  pagedattn_backend_destroy(be);
  if (!fail.empty()) return fail;

  const char* got = pagedattn_status_string(st);
  if (c.expect != got) {
    fail = "expected " + c.expect + ", got " + got + " at " + step + ": " + message;
  } else if (refusal) {
    if (message.empty()) fail = "refusal without a message";
    if (step == "forward" && std::any_of(out.begin(), out.end(), [](unsigned char b) { return b != 0xFF; }))
      fail = "refused forward wrote out";
    if (!before.empty() && before != cache_bytes) fail = "refused call changed the cache";
  }

  // Expected slot mapping, computed independently of the library.
  if (fail.empty() && fwd && !c.null_batch && st == PAGEDATTN_OK) {
    std::vector<int64_t> want;
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < c.query_lens[i]; ++j)
        want.push_back(enc_only ? -1 : slot_of(rows[i], c.context_lens[i] + j));
    if (!enc_only && want != slots_seen) fail = "slot mapping differs from the block tables";
    write_vec(dir + "/slots.bin", slots_seen);
  }

  // Float64 reference (tests/support's pat::ref_attend), per sequence over its keys in position
  // order, dequantised as the cache stores them.
  if (fail.empty() && fwd && st == PAGEDATTN_OK) {
    write_vec(dir + "/out.bin", out);
    if (c.lse) write_vec(dir + "/lse.bin", lse);
    // x / scale in float, as the library must (a double quotient can fall on the other side of
    // an fp8 rounding tie). Per-head scales replace the scalars for head e / D of a row.
    auto deq = [&](double x, float sc) -> float {
      return is_fp8(c.cache_dtype) ? pat::round_to(c.cache_dtype, static_cast<float>(x) / sc) * sc
                                   : static_cast<float>(x);
    };
    auto k_sc = [&](int64_t e) { return c.head_scales ? khs[static_cast<size_t>(e / D)] : c.k_scale; };
    auto v_sc = [&](int64_t e) { return c.head_scales ? vhs[static_cast<size_t>(e / D)] : c.v_scale; };
    pat::RefParams rp;
    rp.H = H;
    rp.Hkv = Hkv;
    rp.D = D;
    rp.scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(D));
    rp.soft_cap = c.soft_cap;
    rp.window = c.sliding_window;
    rp.causal = !cross && !encoder;
    rp.alibi = c.alibi && rp.causal ? slopes.data() : nullptr;
    rp.sinks = c.sinks ? sinks.data() : nullptr;
    rp.chunk = c.attention_chunk;
    std::vector<double> ref(static_cast<size_t>(T * H * D)), ref_lse(static_cast<size_t>(T * H));
    const int64_t row = static_cast<int64_t>(Hkv) * D;
    const int64_t loff = static_cast<int64_t>(c.layer) * num_ctx;
    for (int i = 0; i < S; ++i) {
      const int64_t nq = c.query_lens[i];
      if (nq == 0) continue;
      std::vector<float> kk, vv, qf;
      std::vector<int64_t> qpos;
      // Decoder and cross keys are read back from the cache; encoder types read k/v directly.
      auto push = [&](const Arr& ka, const Arr& va, int64_t r, bool through_cache) {
        for (int64_t e = 0; e < row; ++e) {
          kk.push_back(through_cache ? deq(ka.val[r * row + e], k_sc(e)) : static_cast<float>(ka.val[r * row + e]));
          vv.push_back(through_cache ? deq(va.val[r * row + e], v_sc(e)) : static_cast<float>(va.val[r * row + e]));
        }
      };
      if (cross) {
        for (int e = 0; e < c.encoder_lens[i]; ++e) {
          if (c.write_kv) push(k, v, estart[i] + e, true);
          else push(ctx_k, ctx_v, loff + ctx_start[i] + e, true);
        }
      } else if (encoder) {
        for (int64_t e = 0; e < nq; ++e) push(k, v, qstart[i] + e, false);
      } else if (!c.write_kv) {
        for (int64_t p = 0; p < c.context_lens[i] + nq; ++p) push(ctx_k, ctx_v, loff + ctx_start[i] + p, true);
      } else {
        for (int p = 0; p < c.context_lens[i]; ++p) push(ctx_k, ctx_v, loff + ctx_start[i] + p, true);
        for (int64_t p = 0; p < nq; ++p) push(k, v, qstart[i] + p, true);
      }
      for (int64_t j = 0; j < nq; ++j) qpos.push_back(encoder ? j : c.context_lens[i] + j);
      for (int64_t e = 0; e < nq * H * D; ++e) qf.push_back(static_cast<float>(q.val[qstart[i] * H * D + e]));
      pat::RefParams rs = rp;
      const std::vector<uint8_t>& bits = tree_bits[static_cast<size_t>(i)];
      if (!bits.empty()) {
        rs.tree = bits.data();
        rs.tree_ctx = c.context_lens[i];
        rs.tree_q = nq;
      }
      pat::ref_attend(rs, nq, qf.data(), qpos.data(), static_cast<int64_t>(kk.size() / row), kk.data(),
                      vv.data(), &ref[static_cast<size_t>(qstart[i]) * H * D],
                      &ref_lse[static_cast<size_t>(qstart[i]) * H]);
    }
    double max_err = 0, max_ref = 0, max_lse_err = 0;
    bool nan = false;
    for (size_t e = 0; e < out_elems; ++e) {
      const double got_v = pat::load(c.out_dtype, &out[e * dsize(c.out_dtype)]);
      if (std::isnan(got_v)) nan = true;
      max_err = std::max(max_err, std::fabs(got_v - ref[e]));
      max_ref = std::max(max_ref, std::fabs(ref[e]));
    }
    if (c.lse) {
      for (size_t e = 0; e < lse.size(); ++e) {
        const double got_l = lse[e];
        if (std::isnan(got_l)) nan = true;
        else if (!(std::isinf(ref_lse[e]) && got_l == ref_lse[e]))
          max_lse_err = std::max(max_lse_err, std::fabs(got_l - ref_lse[e]) / std::max(1.0, std::fabs(ref_lse[e])));
      }
    }
    const double tol = pat::tolerance(c.dtype, c.cache_dtype);
    const double rel = max_ref > 0 ? max_err / max_ref : max_err;
    *max_rel_out = rel;
    if (nan) fail = "NaN in the output (or a row left unwritten)";
    else if (!(rel <= tol)) fail = "max rel err " + std::to_string(rel) + " > " + std::to_string(tol);
    else if (!(max_lse_err <= std::max(tol, 1e-5)))
      fail = "lse err " + std::to_string(max_lse_err) + " > " + std::to_string(std::max(tol, 1e-5));
  }

  // meta.txt: every key resolved, plus the derived values and the C run's status.
  std::ofstream meta(dir + "/meta.txt");
  meta << "case " << c.name << "\nop " << c.op << "\nseed " << c.seed << "\nbackend " << c.backend
       << "\ndtype " << dtype_key(c.dtype) << "\ncache_dtype " << dtype_key(c.cache_dtype) << "\nlayout "
       << c.layout << "\nnum_layers " << L << "\nlayer " << c.layer << "\nnum_blocks " << nb
       << "\nblock_size " << bs << "\nnum_heads " << H << "\nnum_kv_heads " << Hkv << "\nopt_num_kv_heads "
       << c.opt_num_kv_heads << "\nhead_size " << D << "\nquery_lens" << join(c.query_lens)
       << "\ncontext_lens" << join(c.context_lens) << "\nencoder_lens" << join(c.encoder_lens)
       << "\nattention " << c.attention << "\nwrite_kv " << c.write_kv << "\nscale " << fmt_float(c.scale)
       << "\nsoft_cap " << fmt_float(c.soft_cap) << "\nsliding_window " << c.sliding_window << "\nalibi "
       << c.alibi << "\nsinks " << c.sinks << "\nsinks_len " << c.sinks_len << "\nattention_chunk "
       << c.attention_chunk << "\nhead_scales " << c.head_scales << "\nbad_head_scale " << c.bad_head_scale
       << "\ntree " << c.tree << "\nbad_tree_mask " << c.bad_tree_mask
       << "\nlse " << c.lse << "\nk_scale " << fmt_float(c.k_scale) << "\nv_scale "
       << fmt_float(c.v_scale) << "\nout_dtype " << dtype_key(c.out_dtype) << "\nnull_batch " << c.null_batch
       << "\nbad_table_entry " << c.bad_table_entry << "\ntable_stride " << (enc_only ? 0 : stride)
       << "\nbad_slot " << c.bad_slot << "\npairs" << join(c.pairs) << "\ndst_layout " << c.dst_layout
       << "\ndst_num_blocks " << c.dst_num_blocks << "\nexpect " << c.expect << "\nnum_seqs " << S
       << "\nnum_tokens " << T << "\nkv_rows " << kv_rows << "\nnum_ctx " << num_ctx
       << "\ncross_table_stride " << xstride << "\nstatus " << got << "\nfail_step " << step;
  if (fwd && st == PAGEDATTN_OK) meta << "\nmax_rel_err " << *max_rel_out;
  meta << "\nmessage " << message << "\n";
  return fail;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <cases.txt> <outdir> [case-name...]\n", argv[0]);
    return 2;
  }
  const std::string outdir = argv[2];
  std::vector<std::string> only(argv + 3, argv + argc);
  if (mkdir(outdir.c_str(), 0755) != 0 && errno != EEXIST) die("cannot create " + outdir);
  std::vector<RawCase> raw = parse_cases(argv[1]);
  std::ofstream index(outdir + "/index.txt");
  int failed = 0, ran = 0;
  for (const RawCase& rc : raw) {
    if (!only.empty() && std::find(only.begin(), only.end(), rc.name) == only.end()) continue;
    Case c = resolve(rc);
    const std::string dir = outdir + "/" + c.name;
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) die("cannot create " + dir);
    double rel = 0;
    std::string why = run_case(c, dir, &rel);
    ++ran;
    index << c.name << "\n";
    if (why.empty()) {
      std::printf("PASS %s (seed %" PRIu64 ", max rel err %.3g)\n", c.name.c_str(), c.seed, rel);
    } else {
      ++failed;
      std::printf("FAIL %s (seed %" PRIu64 "): %s\n", c.name.c_str(), c.seed, why.c_str());
    }
  }
  std::printf("%d of %d cases passed\n", ran - failed, ran);
  return failed || ran == 0 ? 1 : 0;
}
