// kernels/onednn/backend.cpp — libpagedattn-onednn.so, the "onednn" backend.
//
// Prefill and chunked prefill (query_len >= a threshold) run as tiled flash attention whose two
// products are oneDNN matmul primitives: S = Q K^T on a (query tile x GQA group) x key tile, the
// masked online softmax in our own Highway code (softmax_tile.cpp), then O += P V with a sum
// post-op, with bf16 operands (f32 accumulate): where the CPU has native bf16 and the inputs are
// bf16. Float32 tiles (no native bf16, or float32 and float16 inputs) run only when asked for
// (PAGEDATTN_ONEDNN_MIN_QUERY set, or PAGEDATTN_ONEDNN_BF16=0): the cpu kernels are as fast or
// faster than them (docs/perf.md). Rows of shorter sequences (decode, short chunks), such steps,
// and whole steps over an fp8 cache where the CPU kernels have bf16 dot products, go to an
// embedded CPU backend
// (kernels/cpu/backend.h), so they are planned and split exactly as on `cpu`; caches, cache
// writes, copies and merges are that backend's ops. Which rows go where, and the tile items, are
// in schedule.cpp. Threads: our own pool (pool.h), each worker running primitives
// single-threaded, and the embedded backend's pool (both sleep when idle).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/cpu/backend.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/variant.h"
#include "kernels/runtime/env.h"
#include "kernels/runtime/host_alloc.h"
#include "kernels/runtime/spin.h"
#include "onednn_internal.h"
#include "plugin_abi.h"
#include "pool.h"
#include "schedule.h"

#define PA_ONEDNN_EXPORT extern "C" __attribute__((visibility("default")))

namespace pa_onednn {
namespace {

void set_msg(char* msg, const char* fmt, const char* a = "", const char* b = "") {
  if (msg != nullptr) snprintf(msg, PA_MSG_LEN, fmt, a, b);
}

// The two matmuls of one tile shape (M query rows, TK keys, head size D, operand type).
struct TileKernel {
  int M = 0, TK = 0, D = 0;
  bool bf16 = false;
  dnnl::memory::desc q_md, kt_md, s_md, p_md, v_md, acc_md;
  dnnl::memory::desc qk_pad_md, pv_pad_md;  // scratchpads (user mode, see make_kernel)
  dnnl::matmul qk, pv;
};

// Per-thread memory objects bound to that thread's buffers for one TileKernel.
struct TileMems {
  const TileKernel* kernel = nullptr;
  dnnl::memory q, kt, s, p, v, acc, qk_pad, pv_pad;
};

// One worker's buffers (64-byte aligned), owned by a batch workspace.
struct Worker {
  void* q = nullptr;               // [kMaxM][kMaxD] operand type
  void* kt = nullptr;              // [kTK][kMaxD]
  void* v = nullptr;               // [kTK][kMaxD]
  float* s = nullptr;              // [kMaxM][kTK]
  void* p = nullptr;               // [kMaxM][kTK]
  float* acc = nullptr;            // [kMaxM][kMaxD]
  float m[kMaxM];
  float l[kMaxM];
  dnnl::stream strm;
  std::vector<TileMems> mems;
};

struct Backend {
  pa_cpu::TargetChoice target;  // the embedded backend's, whose tables softmax_tile shares
  int threads = 1;
  Pool* pool = nullptr;
  TileRule tiles;          // which steps get oneDNN tiles
  std::string settings;    // pagedattn_capabilities.settings
  uint64_t memory_limit = 0;
  std::atomic<uint64_t> used{0};   // also counts the embedded CPU backend's allocations
  void* cpu = nullptr;             // the embedded CPU backend (pa_cpu_backend_ops())
  dnnl::engine eng;
  std::mutex mu;                   // guards kernels
  std::vector<TileKernel*> kernels;
};

struct BatchWork {
  std::mutex mu;                   // forwards on one batch share its workers
  std::vector<Worker> workers;
  std::vector<int64_t> prefix;     // [cap_num_seqs + 1] items before each sequence
  std::vector<int32_t> short_lens; // [cap_num_seqs] query_lens with the oneDNN rows zeroed
  void* cpu_plan = nullptr;        // the embedded CPU backend's plan of the same batch
  std::vector<void*> blocks;       // aligned allocations to free
  uint64_t bytes = 0;              // the cpu plan's and the blocks' (pa_batch.backend_bytes)
};

// ---- oneDNN tile kernels ----

TileKernel* make_kernel(Backend* be, int M, int TK, int D, bool bf16) {
  using dnnl::memory;
  auto* k = new TileKernel;
  k->M = M;
  k->TK = TK;
  k->D = D;
  k->bf16 = bf16;
  const auto op = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const auto f32 = memory::data_type::f32;
  k->q_md = memory::desc({M, D}, op, memory::format_tag::ab);
  k->kt_md = memory::desc({D, TK}, op, memory::format_tag::ba);  // K tile stored [TK][D]
  k->s_md = memory::desc({M, TK}, f32, memory::format_tag::ab);
  k->p_md = memory::desc({M, TK}, op, memory::format_tag::ab);
  k->v_md = memory::desc({TK, D}, op, memory::format_tag::ab);
  k->acc_md = memory::desc({M, D}, f32, memory::format_tag::ab);
  // User scratchpads: in library mode a primitive uses the scratchpad of the thread that created
  // it, so two workers running primitives made by one thread would share (and corrupt) it.
  dnnl::primitive_attr qk_attr;
  qk_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(k->q_md, k->kt_md, k->s_md), qk_attr,
                                     be->eng);
  dnnl::post_ops po;
  po.append_sum(1.0f);  // acc += P V (acc already rescaled by the softmax step)
  dnnl::primitive_attr pv_attr;
  pv_attr.set_post_ops(po);
  pv_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(k->p_md, k->v_md, k->acc_md), pv_attr,
                                     be->eng);
  k->qk_pad_md = qk_pd.scratchpad_desc();
  k->pv_pad_md = pv_pd.scratchpad_desc();
  k->qk = dnnl::matmul(qk_pd);
  k->pv = dnnl::matmul(pv_pd);
  return k;
}

TileMems& mems_for(Backend* be, Worker& w, int M, int TK, int D, bool bf16) {
  for (auto& m : w.mems)
    if (m.kernel->M == M && m.kernel->TK == TK && m.kernel->D == D && m.kernel->bf16 == bf16)
      return m;
  const TileKernel* kern = nullptr;
  {
    std::lock_guard<std::mutex> lock(be->mu);
    for (auto* k : be->kernels)
      if (k->M == M && k->TK == TK && k->D == D && k->bf16 == bf16) kern = k;
    if (kern == nullptr) {
      be->kernels.push_back(make_kernel(be, M, TK, D, bf16));
      kern = be->kernels.back();
    }
  }
  TileMems m;
  m.kernel = kern;
  m.q = dnnl::memory(kern->q_md, be->eng, w.q);
  m.kt = dnnl::memory(kern->kt_md, be->eng, w.kt);
  m.s = dnnl::memory(kern->s_md, be->eng, w.s);
  m.p = dnnl::memory(kern->p_md, be->eng, w.p);
  m.v = dnnl::memory(kern->v_md, be->eng, w.v);
  m.acc = dnnl::memory(kern->acc_md, be->eng, w.acc);
  m.qk_pad = dnnl::memory(kern->qk_pad_md, be->eng);  // allocated once per worker and shape
  m.pv_pad = dnnl::memory(kern->pv_pad_md, be->eng);
  w.mems.push_back(m);
  return w.mems.back();
}

// Converts n elements of src (dtype dt, fp8 times scale) into the operand type.
void load_operand(const void* src, pagedattn_dtype dt, float scale, void* dst, bool bf16, int n) {
  if (bf16 && dt == PAGEDATTN_DTYPE_BFLOAT16) {
    memcpy(dst, src, sizeof(uint16_t) * static_cast<size_t>(n));
  } else if (!bf16 && dt == PAGEDATTN_DTYPE_FLOAT32) {
    memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  } else if (bf16) {
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (int i = 0; i < n; ++i) o[i] = pa_cpu::f32_to_bf16(pa_cpu::load_elem(src, i, dt, scale));
  } else {
    float* o = static_cast<float*>(dst);
    for (int i = 0; i < n; ++i) o[i] = pa_cpu::load_elem(src, i, dt, scale);
  }
}

const void* kv_addr(const KeySource& s, bool value, int64_t pos, int32_t kv_head) {
  const void* base = value ? s.v : s.k;
  int64_t off;
  if (s.table != nullptr) {
    off = static_cast<int64_t>(s.table[pos / s.block_size]) * s.block_stride +
          (pos % s.block_size) * s.slot_stride + kv_head * s.head_stride;
  } else if (!value) {
    off = (s.row0 + pos) * s.block_stride + kv_head * s.head_stride;
  } else {
    off = (s.row0 + pos) * s.v_block_stride + kv_head * s.v_head_stride;
  }
  return static_cast<const char*>(base) + off * static_cast<int64_t>(pa_cpu::elem_size(s.dtype));
}

int pow2_at_least(int64_t n, int lo, int hi) {
  int p = lo;
  while (p < hi && p < n) p *= 2;
  return p;
}

// One work item through oneDNN: the item's (token, head) rows padded to M rows (a power of two,
// so short prefills do not pay for a full 256-row tile), keys in tiles of TK.
void tile_item(Backend* be, Worker& w, const TileItem& it, bool bf16) {
  const int D = it.head_size;
  const int nh = it.h1 - it.h0, ntok = it.tok1 - it.tok0, rows = nh * ntok;
  const int M = pow2_at_least(rows, kMinTile, kMaxM);
  const int64_t pos0 = static_cast<int64_t>(it.pos_offset) + it.tok0;
  const int64_t kbeg = pa_cpu::visible_lo(it.causal, it.window, it.chunk, pos0);
  const int64_t kend = pa_cpu::visible_hi(it.causal, pos0 + ntok - 1, it.num_keys) + 1;
  const int TK = pow2_at_least(kend - kbeg, kMinTile, kTK);
  TileMems& tm = mems_for(be, w, M, TK, D, bf16);
  const size_t osz = bf16 ? 2 : 4;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t qsz = static_cast<int64_t>(pa_cpu::elem_size(it.dtype));

  // Q rows (unscaled; the scale is applied to S in float32), zero padding rows.
  for (int t = 0; t < ntok; ++t)
    for (int g = 0; g < nh; ++g) {
      const char* src = static_cast<const char*>(it.q) +
                        ((it.q_row0 + t) * it.q_row_stride + (it.h0 + g) * it.q_head_stride) * qsz;
      load_operand(src, it.dtype, 1.0f, static_cast<char*>(w.q) + (size_t)(t * nh + g) * D * osz,
                   bf16, D);
    }
  if (rows < M) memset(static_cast<char*>(w.q) + (size_t)rows * D * osz, 0, (size_t)(M - rows) * D * osz);
  memset(w.acc, 0, sizeof(float) * (size_t)M * D);
  // Padding rows of P stay zero for the whole item (softmax_tile writes real rows only).
  if (rows < M) memset(static_cast<char*>(w.p) + (size_t)rows * TK * osz, 0, (size_t)(M - rows) * TK * osz);
  for (int r = 0; r < rows; ++r) {
    w.m[r] = kNegInf;
    w.l[r] = 0.0f;
  }

  const float ks = it.kv.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || it.kv.dtype == PAGEDATTN_DTYPE_FP8_E5M2
                       ? it.kv.k_scale : 1.0f;
  const float vs = it.kv.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || it.kv.dtype == PAGEDATTN_DTYPE_FP8_E5M2
                       ? it.kv.v_scale : 1.0f;
  SoftmaxTileArgs sa;
  sa.S = w.s;
  sa.ldS = TK;
  sa.P = w.p;
  sa.ldP = TK;
  sa.p_bf16 = bf16 ? 1 : 0;
  sa.acc = w.acc;
  sa.ldA = D;
  sa.D = D;
  sa.m = w.m;
  sa.l = w.l;
  sa.ntok = ntok;
  sa.nh = nh;
  sa.pos0 = pos0;
  sa.causal = it.causal;
  sa.window = it.window;
  sa.chunk = it.chunk;
  sa.tree = it.tree;
  sa.tree_q = it.tree_q;
  sa.tok0 = it.tok0;
  sa.tree_ctx = it.pos_offset;
  sa.scale = it.scale;
  sa.soft_cap = it.soft_cap;
  sa.alibi = it.alibi != nullptr ? it.alibi + it.h0 : nullptr;

  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += TK) {
    const int nk = static_cast<int>(std::min<int64_t>(TK, kend - kt0));
    for (int k = 0; k < nk; ++k)
      load_operand(kv_addr(it.kv, false, kt0 + k, it.kv_head), it.kv.dtype, ks,
                   static_cast<char*>(w.kt) + (size_t)k * D * osz, bf16, D);
    if (nk < TK) memset(static_cast<char*>(w.kt) + (size_t)nk * D * osz, 0, (size_t)(TK - nk) * D * osz);
    tm.kernel->qk.execute(w.strm, {{DNNL_ARG_SRC, tm.q}, {DNNL_ARG_WEIGHTS, tm.kt},
                                   {DNNL_ARG_DST, tm.s},
                                   {DNNL_ARG_SCRATCHPAD, tm.qk_pad}});
    sa.nk = nk;
    sa.kt0 = kt0;
    if (!softmax_tile(be->target.index, sa)) continue;
    for (int k = 0; k < nk; ++k)
      load_operand(kv_addr(it.kv, true, kt0 + k, it.kv_head), it.kv.dtype, vs,
                   static_cast<char*>(w.v) + (size_t)k * D * osz, bf16, D);
    // P is zero beyond nk, but uninitialised V rows could hold NaN bit patterns: zero them.
    if (nk < TK) memset(static_cast<char*>(w.v) + (size_t)nk * D * osz, 0, (size_t)(TK - nk) * D * osz);
    tm.kernel->pv.execute(w.strm, {{DNNL_ARG_SRC, tm.p}, {DNNL_ARG_WEIGHTS, tm.v},
                                   {DNNL_ARG_DST, tm.acc},
                                   {DNNL_ARG_SCRATCHPAD, tm.pv_pad}});
  }
  finish_rows(be->target.index, w.acc, D, w.m, w.l, ntok, nh, D, it.out, it.dtype,
              it.out_row_stride, it.out_head_stride, it.q_row0, it.h0,
              it.sinks != nullptr ? it.sinks + it.h0 : nullptr, it.lse, it.lse_row_stride,
              it.lse_head_stride);
}

// ---- ops ----

pagedattn_status probe(int32_t device_index, char* msg) {
  if (device_index != 0) {
    if (msg) snprintf(msg, PA_MSG_LEN, "onednn: CPU backend has only device 0 (asked for %d)",
                      device_index);
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
  return PAGEDATTN_OK;
}

// PAGEDATTN_ONEDNN_BF16 ("0": float32 tiles even where bf16 ones would run; "1" or unset: bf16
// tiles where the CPU runs them natively) and PAGEDATTN_ONEDNN_MIN_QUERY (a whole number in
// 1..65536: sequences with query_len >= it use the oneDNN tiles, shorter ones the embedded cpu
// kernels; unset 16). Either one set asks for float32 tiles (r->f32_tiles). Another value
// refuses the backend, as the cpu backend's variables do.
bool env_settings(bool* allow_bf16, TileRule* r, char* msg) {
  *allow_bf16 = true;
  r->f32_tiles = false;
  if (const char* env = getenv("PAGEDATTN_ONEDNN_BF16")) {
    if (strcmp(env, "0") != 0 && strcmp(env, "1") != 0) {
      set_msg(msg, "PAGEDATTN_ONEDNN_BF16=%.64s is not 0 or 1", env);
      return false;
    }
    *allow_bf16 = env[0] == '1';
    r->f32_tiles = !*allow_bf16;
  }
  if (const char* env = getenv("PAGEDATTN_ONEDNN_MIN_QUERY")) {
    long v = 0;
    if (!pa_runtime::parse_whole_number(env, 1, 65536, &v)) {
      set_msg(msg, "PAGEDATTN_ONEDNN_MIN_QUERY=%.64s is not a whole number in 1..65536", env);
      return false;
    }
    r->min_query = static_cast<int>(v);
    r->f32_tiles = true;
  }
  return true;
}

bool native_bf16(const dnnl::engine& eng) {
  const auto isa = dnnl::get_effective_cpu_isa();
  if (isa != dnnl::cpu_isa::avx512_core_bf16 && isa != dnnl::cpu_isa::avx512_core_amx) return false;
  // And a real (non-reference) implementation for our shape.
  using dnnl::memory;
  memory::desc a({kMaxM, 128}, memory::data_type::bf16, memory::format_tag::ab);
  memory::desc b({128, kTK}, memory::data_type::bf16, memory::format_tag::ba);
  memory::desc c({kMaxM, kTK}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
  return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
}

// The settings line: oneDNN's part, then the embedded cpu backend's.
std::string describe(Backend& b) {
  const dnnl_version_t* v = dnnl_version();
  pagedattn_capabilities cpu{};
  pa_cpu_backend_ops()->get_capabilities(b.cpu, &cpu);
  const TileRule& r = b.tiles;
  char head[256];
  int n = snprintf(head, sizeof head, "oneDNN %d.%d.%d: ", v->major, v->minor, v->patch);
  if (r.bf16) {
    snprintf(head + n, sizeof head - n,
             "bf16 chunks of %d or more query tokens on bf16 matmul tiles, other dtypes' on %s (",
             r.min_query, r.f32_tiles ? "float32 tiles" : "the cpu kernels");
  } else if (r.f32_tiles) {
    snprintf(head + n, sizeof head - n,
             "chunks of %d or more query tokens on float32 matmul tiles (", r.min_query);
  } else {
    snprintf(head + n, sizeof head - n, "no bf16 matmul here, every chunk on the cpu kernels (");
  }
  return std::string(head) + pa_runtime::env_note("PAGEDATTN_ONEDNN_BF16") + ", " +
         pa_runtime::env_note("PAGEDATTN_ONEDNN_MIN_QUERY") +
         (r.bf16 || r.f32_tiles ? "); decode and shorter chunks on the cpu kernels: "
                                : "); the cpu kernels: ") +
         cpu.settings;
}

pagedattn_status create(void** state, const pagedattn_backend_options* opts, char* msg) {
  Backend* b = nullptr;
  try {
    b = new Backend;
    const pagedattn_status target_st = pa_cpu::choose_target(&b->target, msg);
    if (target_st != PAGEDATTN_OK) {
      delete b;
      return target_st;
    }
    b->threads = opts->num_threads > 0 ? opts->num_threads : omp_get_num_procs();
    b->memory_limit = opts->memory_limit;
    bool allow_bf16 = true;
    if (!env_settings(&allow_bf16, &b->tiles, msg)) {
      delete b;
      return PAGEDATTN_ERROR_INVALID_ARGUMENT;
    }
    b->eng = dnnl::engine(dnnl::engine::kind::cpu, 0);
    b->tiles.bf16 = allow_bf16 && native_bf16(b->eng);
    b->tiles.bf16_dp = b->target.bf16_dp;
    int spin_us = 0;
    if (!pa_runtime::spin_us_from_env(&spin_us, msg)) {
      delete b;
      return PAGEDATTN_ERROR_INVALID_ARGUMENT;
    }
    b->pool = new Pool(b->threads, spin_us);
    pagedattn_backend_options inner = *opts;
    inner.num_threads = b->threads;
    const pagedattn_status st = pa_cpu::create_embedded(&b->cpu, &inner, &b->used, msg);
    if (st != PAGEDATTN_OK) {
      delete b->pool;
      delete b;
      return st;
    }
    b->settings = describe(*b);
  } catch (const dnnl::error& e) {
    delete b;
    set_msg(msg, "onednn: oneDNN failed to initialise: %s", e.what());
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  } catch (const std::bad_alloc&) {
    delete b;
    set_msg(msg, "onednn: out of host memory");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
  *state = b;
  return PAGEDATTN_OK;
}

void destroy(void* state) {
  auto* b = static_cast<Backend*>(state);
  if (b == nullptr) return;
  for (auto* k : b->kernels) delete k;
  delete b->pool;
  pa_cpu_backend_ops()->destroy(b->cpu);
  delete b;
}

void get_capabilities(void* state, pagedattn_capabilities* caps) {
  auto* b = static_cast<Backend*>(state);
  // Its oneDNN tiles take a subset of the work and hand the rest to the embedded CPU backend,
  // so it claims exactly what that backend claims (the two lists cannot drift apart).
  pa_cpu_backend_ops()->get_capabilities(b->cpu, caps);
  caps->name = "onednn";
  caps->max_num_threads = b->threads;
  caps->settings = b->settings.c_str();
}

// A failure of the embedded CPU backend, reported as this backend's ("cpu: x" -> "onednn: x").
pagedattn_status renamed(pagedattn_status st, char* msg) {
  if (st != PAGEDATTN_OK && msg != nullptr && strncmp(msg, "cpu: ", 5) == 0) {
    std::string rest(msg + 5);
    snprintf(msg, PA_MSG_LEN, "onednn: %s", rest.c_str());
  }
  return st;
}

// Caches and everything on them (writes, copies, swaps, block reads/loads) are the embedded CPU
// backend's: the same huge-page placement, the same memory counter, the same kernels.
void* inner(void* state) { return static_cast<Backend*>(state)->cpu; }

pagedattn_status alloc(void* state, size_t bytes, int32_t host, void** ptr, char* msg) {
  return renamed(pa_cpu_backend_ops()->alloc(inner(state), bytes, host, ptr, msg), msg);
}

void free_op(void* state, void* ptr, int32_t host) {
  pa_cpu_backend_ops()->free(inner(state), ptr, host);
}

pagedattn_status cache_write(void* state, const pa_write_args* a, char* msg) {
  return renamed(pa_cpu_backend_ops()->cache_write(inner(state), a, msg), msg);
}

pagedattn_status copy_blocks(void* state, const pa_cache* c, const int32_t* pairs, size_t n,
                             void* stream, char* msg) {
  return renamed(pa_cpu_backend_ops()->copy_blocks(inner(state), c, pairs, n, stream, msg), msg);
}

pagedattn_status swap_blocks(void* state, const pa_cache* dst, const pa_cache* src,
                             const int32_t* pairs, size_t n, void* stream, char* msg) {
  return renamed(
      pa_cpu_backend_ops()->swap_blocks(inner(state), dst, src, pairs, n, stream, msg), msg);
}

pagedattn_status read_blocks(void* state, const pa_cache* c, const int32_t* ids, size_t n,
                             void* buffer, void* stream, char* msg) {
  return renamed(pa_cpu_backend_ops()->read_blocks(inner(state), c, ids, n, buffer, stream, msg),
                 msg);
}

pagedattn_status load_blocks(void* state, const pa_cache* c, const int32_t* ids, size_t n,
                             const void* buffer, void* stream, char* msg) {
  return renamed(pa_cpu_backend_ops()->load_blocks(inner(state), c, ids, n, buffer, stream, msg),
                 msg);
}

void free_work(Backend* b, BatchWork* w) {
  if (w == nullptr) return;
  if (w->cpu_plan != nullptr) {
    pa_batch view;
    memset(&view, 0, sizeof view);
    view.backend_data = w->cpu_plan;
    pa_cpu_backend_ops()->free_batch(b->cpu, &view);
  }
  for (void* p : w->blocks) pa_runtime::host_free(&b->used, p);
  delete w;
}

pagedattn_status plan_batch(void* state, pa_batch* batch, int32_t is_update, char* msg) {
  auto* b = static_cast<Backend*>(state);
  if (is_update && batch->backend_data != nullptr) return PAGEDATTN_OK;  // sized for capacity
  BatchWork* w = nullptr;
  try {
    w = new BatchWork;
    const size_t cap_seqs = static_cast<size_t>(std::max(batch->cap_num_seqs, batch->num_seqs));
    w->prefix.assign(cap_seqs + 1, 0);
    w->short_lens.assign(cap_seqs, 0);
    {  // The embedded CPU backend plans the same batch (its rows below min_query run there).
      pa_batch view = *batch;
      view.backend_data = nullptr;
      const pagedattn_status st =
          renamed(pa_cpu_backend_ops()->plan_batch(b->cpu, &view, 0, msg), msg);
      if (st != PAGEDATTN_OK) {
        free_work(b, w);
        return st;
      }
      w->cpu_plan = view.backend_data;
      w->bytes = view.backend_bytes;
    }
    w->workers.resize(static_cast<size_t>(b->threads));
    // q, kt, v, s, p, acc (see Worker); float-sized, so either operand type fits.
    const size_t sizes[6] = {sizeof(float) * kMaxM * kMaxD, sizeof(float) * kTK * kMaxD,
                             sizeof(float) * kTK * kMaxD, sizeof(float) * kMaxM * kTK,
                             sizeof(float) * kMaxM * kTK, sizeof(float) * kMaxM * kMaxD};
    for (auto& wk : w->workers) {
      void* p[6];
      for (int i = 0; i < 6; ++i) {
        p[i] = pa_runtime::host_alloc(&b->used, b->memory_limit, sizes[i], msg,
                                      "onednn: batch workspace");
        if (p[i] == nullptr) {
          free_work(b, w);
          return PAGEDATTN_ERROR_OUT_OF_MEMORY;
        }
        w->blocks.push_back(p[i]);
        w->bytes += sizes[i];
      }
      wk.q = p[0];
      wk.kt = p[1];
      wk.v = p[2];
      wk.s = static_cast<float*>(p[3]);
      wk.p = p[4];
      wk.acc = static_cast<float*>(p[5]);
      wk.strm = dnnl::stream(b->eng);
    }
  } catch (const std::bad_alloc&) {
    free_work(b, w);
    set_msg(msg, "onednn: out of host memory for the batch workspace");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  } catch (const dnnl::error& e) {
    free_work(b, w);
    set_msg(msg, "onednn: %s", e.what());
    return PAGEDATTN_ERROR_INTERNAL;
  }
  if (batch->backend_data != nullptr) free_work(b, static_cast<BatchWork*>(batch->backend_data));
  batch->backend_data = w;
  batch->backend_bytes = w->bytes;
  return PAGEDATTN_OK;
}

void free_batch(void* state, pa_batch* batch) {
  free_work(static_cast<Backend*>(state), static_cast<BatchWork*>(batch->backend_data));
  batch->backend_data = nullptr;
}

pagedattn_status forward(void* state, const pa_forward_args* a, char* msg) {
  auto* b = static_cast<Backend*>(state);
  const pa_batch& bt = *a->batch;
  auto* w = static_cast<BatchWork*>(bt.backend_data);
  const pa_backend_ops* cpu = pa_cpu_backend_ops();
  bool bf16 = false;
  const int min_query = tile_min_query(*a, b->tiles, &bf16);
  if (min_query == kNoTiles) {
    // No oneDNN rows (decode, short chunks, float32 tiles not asked for, fp8 caches): the whole
    // step, cache write included, on the embedded CPU backend, which takes its own plan's lock.
    pa_batch view = bt;
    view.backend_data = w->cpu_plan;
    pa_forward_args args = *a;
    args.batch = &view;
    return renamed(cpu->forward(b->cpu, &args, msg), msg);
  }
  std::lock_guard<std::mutex> lock(w->mu);

  // 1. The step's new K/V into the cache (self slots, or the cross slots of the encoder rows).
  pa_write_args wa;
  if (pa_forward_write_args(a, &wa)) {
    const pagedattn_status st = cache_write(state, &wa, msg);
    if (st != PAGEDATTN_OK) return st;
  }

  // 2. The sequences below min_query (a mixed step's decodes) on the embedded CPU backend: the
  // same batch with the oneDNN sequences' query_lens zeroed (they get no items there).
  if (short_rows(bt, min_query, w->short_lens.data())) {
    pa_batch view = bt;
    view.backend_data = w->cpu_plan;
    view.query_lens = w->short_lens.data();
    view.max_query_len = min_query - 1;
    pa_forward_args args = *a;
    args.batch = &view;
    args.write_kv = 0;  // written above
    const pagedattn_status st = renamed(cpu->forward(b->cpu, &args, msg), msg);
    if (st != PAGEDATTN_OK) return st;
  }

  // 3. The oneDNN tile items of the other sequences.
  const int64_t total = count_tile_items(*a, min_query, w->prefix.data());
  std::atomic<int> failed{0};
  std::string err;
  b->pool->run(total, [&](int worker, int64_t i) {
    if (failed.load(std::memory_order_relaxed)) return;
    Worker& wk = w->workers[static_cast<size_t>(worker)];
    TileItem it;
    tile_item_at(*a, min_query, w->prefix.data(), i, &it);
    try {
      tile_item(b, wk, it, bf16);
    } catch (const std::exception& e) {
      if (failed.fetch_add(1) == 0) err = e.what();
    }
  });
  if (failed.load() != 0) {
    set_msg(msg, "onednn: forward failed: %s", err.c_str());
    return PAGEDATTN_ERROR_INTERNAL;
  }
  return PAGEDATTN_OK;
}

pagedattn_status merge_states(void* state, const pa_merge_args* a, char* msg) {
  return renamed(pa_cpu_backend_ops()->merge_states(inner(state), a, msg), msg);
}

// MLA runs on the embedded CPU backend's kernel, whose register-blocked float32 GEMMs over one
// latent tile serve every head; it takes its own plan's lock.
pagedattn_status forward_mla(void* state, const pa_forward_args* a, char* msg) {
  auto* b = static_cast<Backend*>(state);
  auto* w = static_cast<BatchWork*>(a->batch->backend_data);
  pa_batch view = *a->batch;
  view.backend_data = w->cpu_plan;
  pa_forward_args args = *a;
  args.batch = &view;
  return renamed(pa_cpu_backend_ops()->forward_mla(b->cpu, &args, msg), msg);
}

pagedattn_status synchronize(void*, void*, char*) { return PAGEDATTN_OK; }

const pa_backend_ops kOps = {
    PA_PLUGIN_ABI_VERSION,
    static_cast<uint32_t>(sizeof(pa_backend_ops)),
    "onednn",
    probe,
    create,
    destroy,
    get_capabilities,
    alloc,
    free_op,
    nullptr,  // cache_attach
    nullptr,  // cache_detach
    cache_write,
    copy_blocks,
    swap_blocks,
    read_blocks,
    load_blocks,
    plan_batch,
    free_batch,
    forward,
    merge_states,
    synchronize,
    forward_mla,
};

}  // namespace
}  // namespace pa_onednn

PA_ONEDNN_EXPORT uint32_t pagedattn_plugin_abi_version(void) { return PA_PLUGIN_ABI_VERSION; }
PA_ONEDNN_EXPORT const pa_backend_ops* pagedattn_plugin_ops(void) { return &pa_onednn::kOps; }
