// pagedattn-bench: times one operation of a pagedattn backend and judges it against the machine's
// ceilings measured in the same run (read bandwidth, oneDNN sgemm) and against a naive baseline
// (gather the blocks, then plain attention). The mla-* modes time pagedattn_forward_mla over a
// latent cache the same way. docs/perf.md keeps the current figures.
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "baseline.h"
#include "bench_util.h"
#include "ceilings.h"
#include "pagedattn/pagedattn.h"

using namespace bench;

namespace {

#define CHECK(call)                                                                      \
  do {                                                                                   \
    pagedattn_status st_ = (call);                                                       \
    if (st_ != PAGEDATTN_OK) {                                                           \
      std::fprintf(stderr, "pagedattn-bench: %s failed: %s: %s\n", #call,                 \
                   pagedattn_status_string(st_), pagedattn_last_error());                \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

struct Options {
  std::string mode = "decode";
  std::string backend = "cpu";
  int heads = -1, kv_heads = 8, head_size = -1, block_size = -1;  // -1: the mode's default
  int value_size = -1;      // mla-*: R, the latent rows' leading values (512)
  int batch = -1, context = -1, query = -1;
  std::string dtype = "bf16", cache_dtype = "auto", layout = "nhd";
  int threads = 0, iters = 20, warmup = 3, layers = 0;
  int baseline_iters = -1;  // -1: chosen from the estimated cost
  int scaling = 0;          // rounds of the 1-thread / T-thread comparison (0: none)
  bool json = false, no_ceilings = false, check = true;
  bool sinks = false;       // attention modes: also time the forward with sinks, interleaved
  long gemm_size = 2048;
  uint64_t seed = 1;
};

void usage() {
  std::fprintf(stderr,
      "usage: pagedattn-bench [options]\n"
      "  --mode decode|prefill|mixed|verify|cache-write|copy-blocks|mla-decode|mla-prefill\n"
      "                        (default decode)\n"
      "                        verify: each sequence checks --query draft tokens (5) after\n"
      "                        --context cached ones under a binary draft tree (token j's\n"
      "                        parent is (j-1)/2: depth 3 for 5), then alternates it with the\n"
      "                        same batch's one-token decode and prints the time ratio\n"
      "  --backend NAME        cpu, onednn, cuda, hip, auto (default cpu)\n"
      "  --heads N --kv-heads N --head-size N --block-size N   (32 8 128 16)\n"
      "                        mla-decode, mla-prefill: multi-head latent attention (DeepSeek\n"
      "                        V2/V3, Kimi K2) over a latent cache of one row of --head-size D\n"
      "                        values per token, its rows written with write_latent; H query\n"
      "                        heads read every row; defaults H 16, D 576, block 64\n"
      "  --value-size N        mla-*: R, the rows' leading values that form the output (512)\n"
      "  --batch N             sequences (decode/mixed 16, prefill 4, cache-write 16)\n"
      "  --context N           decode: tokens per sequence incl. the new one (4096);\n"
      "                        prefill, cache-write and the mixed chunk: tokens already\n"
      "                        cached before the new ones (prefill, cache-write 0; mixed 4096)\n"
      "  --query N             new tokens: prefill length (2048), mixed chunk (512),\n"
      "                        cache-write tokens per sequence (256)\n"
      "  --dtype f32|f16|bf16  q/k/v/out (bf16)\n"
      "  --cache-dtype auto|f32|f16|bf16|fp8|fp8_e4m3|fp8_e5m2   (auto = dtype)\n"
      "  --layout nhd|hnd      cache layout (nhd)\n"
      "  --threads N           backend, baseline and ceiling threads (0 = all cores)\n"
      "  --iters N --warmup N  timed and untimed repetitions (20, 3)\n"
      "  --layers N            cache layers rotated through (0 = enough to exceed 2x LLC)\n"
      "  --baseline-iters N    naive baseline repetitions (-1 = by cost, 0 = skip)\n"
      "  --gemm-size N         sgemm ceiling problem N x N x N (2048)\n"
      "  --no-ceilings         skip bandwidth/GEMM measurement (ratios omitted)\n"
      "  --no-check            skip comparing the library's output with the baseline's\n"
      "  --scaling N           attention modes, --threads T >= 2: N rounds alternating 1 and T\n"
      "                        threads of the library call, register-only arithmetic, the\n"
      "                        streaming read and (decode) the plain block read; prints each\n"
      "                        one's T/1 throughput ratio (median over the rounds)\n"
      "  --sinks               attention modes: after the run, N rounds alternating the\n"
      "                        forward without and with attention sinks; prints the\n"
      "                        with/without time ratio (median over the rounds)\n"
      "  --seed N              random seed (1)\n"
      "  --json                one JSON record per case on stdout (text goes to stderr)\n");
}

bool parse_dtype(const std::string& s, pagedattn_dtype* out) {
  if (s == "f32" || s == "float32") *out = PAGEDATTN_DTYPE_FLOAT32;
  else if (s == "f16" || s == "float16") *out = PAGEDATTN_DTYPE_FLOAT16;
  else if (s == "bf16" || s == "bfloat16") *out = PAGEDATTN_DTYPE_BFLOAT16;
  else if (s == "fp8" || s == "fp8_e4m3") *out = PAGEDATTN_DTYPE_FP8_E4M3;
  else if (s == "fp8_e5m2") *out = PAGEDATTN_DTYPE_FP8_E5M2;
  else return false;
  return true;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "pagedattn-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto ival = [&]() { return std::atoi(val().c_str()); };
    if (a == "--mode") o.mode = val();
    else if (a == "--backend") o.backend = val();
    else if (a == "--heads") o.heads = ival();
    else if (a == "--kv-heads") o.kv_heads = ival();
    else if (a == "--head-size") o.head_size = ival();
    else if (a == "--value-size") o.value_size = ival();
    else if (a == "--block-size") o.block_size = ival();
    else if (a == "--batch") o.batch = ival();
    else if (a == "--context") o.context = ival();
    else if (a == "--query") o.query = ival();
    else if (a == "--dtype") o.dtype = val();
    else if (a == "--cache-dtype") o.cache_dtype = val();
    else if (a == "--layout") o.layout = val();
    else if (a == "--threads") o.threads = ival();
    else if (a == "--iters") o.iters = ival();
    else if (a == "--warmup") o.warmup = ival();
    else if (a == "--layers") o.layers = ival();
    else if (a == "--baseline-iters") o.baseline_iters = ival();
    else if (a == "--gemm-size") o.gemm_size = ival();
    else if (a == "--no-ceilings") o.no_ceilings = true;
    else if (a == "--no-check") o.check = false;
    else if (a == "--sinks") o.sinks = true;
    else if (a == "--scaling") o.scaling = ival();
    else if (a == "--seed") o.seed = (uint64_t)std::atoll(val().c_str());
    else if (a == "--json") o.json = true;
    else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "pagedattn-bench: unknown option %s\n", a.c_str());
      usage();
      std::exit(2);
    }
  }
  const bool known = o.mode == "decode" || o.mode == "prefill" || o.mode == "mixed" ||
                     o.mode == "verify" || o.mode == "cache-write" || o.mode == "copy-blocks" ||
                     o.mode == "mla-decode" || o.mode == "mla-prefill";
  if (!known) {
    std::fprintf(stderr, "pagedattn-bench: unknown mode %s\n", o.mode.c_str());
    std::exit(2);
  }
  const bool mla = o.mode == "mla-decode" || o.mode == "mla-prefill";
  const bool prefill = o.mode == "prefill" || o.mode == "mla-prefill";
  if (o.heads < 0) o.heads = mla ? 16 : 32;
  if (o.head_size < 0) o.head_size = mla ? 576 : 128;
  if (o.block_size < 0) o.block_size = mla ? 64 : 16;
  if (o.value_size < 0) o.value_size = mla ? 512 : 0;
  if (mla) o.kv_heads = 1;  // one latent row per token, read by every head
  if (mla && (o.value_size < 1 || o.value_size >= o.head_size)) {
    std::fprintf(stderr, "pagedattn-bench: --value-size must be in [1, --head-size)\n");
    std::exit(2);
  }
  if (mla && (o.sinks || o.layout != "nhd")) {
    std::fprintf(stderr, "pagedattn-bench: --sinks and --layout are not for the mla-* modes\n");
    std::exit(2);
  }
  if (o.batch < 0) o.batch = prefill ? 4 : 16;
  if (o.context < 0) o.context = (prefill || o.mode == "cache-write") ? 0 : 4096;
  if (o.query < 0)
    o.query = prefill ? 2048 : o.mode == "mixed" ? 512 : o.mode == "verify" ? 5 : 256;
  if (o.mode == "verify") {
    // The naive baseline knows no tree masks: the suites judge the masks against float64.
    o.check = false;
    o.baseline_iters = 0;
  }
  if (o.threads <= 0) o.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (o.iters < 1) o.iters = 1;
  if (o.scaling < 0) o.scaling = 0;
  if (o.scaling > 0 && (o.threads < 2 || !(o.mode == "decode" || o.mode == "prefill" ||
                                           o.mode == "mixed"))) {
    std::fprintf(stderr, "pagedattn-bench: --scaling needs an attention mode and --threads >= 2"
                 " (%d here)\n", o.threads);
    std::exit(2);
  }
  if (o.warmup < 0) o.warmup = 0;
  if (o.batch < 1 || o.heads < 1 || o.kv_heads < 1 || o.head_size < 1 || o.block_size < 1 ||
      o.query < 1 || (!prefill && o.mode != "cache-write" && o.context < 1)) {
    std::fprintf(stderr, "pagedattn-bench: sizes must be positive\n");
    std::exit(2);
  }
  return o;
}

// A [d0, d1, d2] (or [d0]) compact tensor over owned memory.
struct Tensor {
  std::vector<char> mem;
  int64_t shape[3] = {0, 0, 0};
  pagedattn_tensor t{};
  Tensor(int ndim, int64_t d0, int64_t d1, int64_t d2, pagedattn_dtype dt, uint8_t int_bits = 0) {
    shape[0] = d0;
    shape[1] = d1;
    shape[2] = d2;
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    size_t esz = int_bits ? int_bits / 8 : pagedattn_dtype_size(dt);
    mem.resize((size_t)n * esz + 64);
    t.data = mem.data();
    t.device = {PAGEDATTN_DEVICE_CPU, 0};
    t.ndim = ndim;
    if (int_bits) t.dtype = {PAGEDATTN_DLPACK_INT, int_bits, 1};
    else pagedattn_dtype_to_dlpack(&t.dtype, dt);
    t.shape = shape;
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  void* data() { return mem.data(); }
};

// Process CPU seconds (user + system) so far: with wall time and the thread count it tells how
// much of the machine this run actually had.
double cpu_seconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

struct Case {
  std::vector<int32_t> qlens, ctxs;  // per sequence
  int64_t tokens = 0;
  int table_stride = 0;
  std::vector<int32_t> tables;
  int32_t num_blocks = 0;
};

std::string fmt_bytes(double b) {
  char buf[64];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  return buf;
}

// Progress on stderr for long runs: on a terminal one line a second, overwritten in place;
// otherwise (a log file) a plain line every 10 s.
struct Progress {
  const char* what;
  double start = now_s(), last = 0;
  bool printed = false, tty = isatty(2) != 0;
  explicit Progress(const char* w) : what(w) {}
  void tick(int i, int n) {
    double t = now_s();
    if (t - start < 2.0 || t - last < (tty ? 1.0 : 10.0)) return;
    last = t;
    printed = true;
    std::fprintf(stderr, tty ? "\r  [%s: %d/%d, %.0f s]   " : "  [%s: %d/%d, %.0f s]\n", what, i,
                 n, t - start);
    std::fflush(stderr);
  }
  ~Progress() {
    if (printed && tty) std::fprintf(stderr, "\r%70s\r", "");
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  FILE* txt = o.json ? stderr : stdout;

  pagedattn_dtype dt, cdt;
  if (!parse_dtype(o.dtype, &dt) || dt == PAGEDATTN_DTYPE_FP8_E4M3 ||
      dt == PAGEDATTN_DTYPE_FP8_E5M2) {
    std::fprintf(stderr, "pagedattn-bench: bad --dtype %s\n", o.dtype.c_str());
    return 2;
  }
  if (o.cache_dtype == "auto") cdt = dt;
  else if (!parse_dtype(o.cache_dtype, &cdt)) {
    std::fprintf(stderr, "pagedattn-bench: bad --cache-dtype %s\n", o.cache_dtype.c_str());
    return 2;
  }
  pagedattn_layout layout;
  if (o.layout == "nhd") layout = PAGEDATTN_LAYOUT_NHD;
  else if (o.layout == "hnd") layout = PAGEDATTN_LAYOUT_HND;
  else {
    std::fprintf(stderr, "pagedattn-bench: bad --layout %s\n", o.layout.c_str());
    return 2;
  }
  const int H = o.heads, Hkv = o.kv_heads, D = o.head_size, bs = o.block_size;
  const size_t dsz = pagedattn_dtype_size(dt), csz = pagedattn_dtype_size(cdt);
  const bool attn =
      o.mode == "decode" || o.mode == "prefill" || o.mode == "mixed" || o.mode == "verify";
  const bool mla = o.mode == "mla-decode" || o.mode == "mla-prefill";
  const bool prefill = o.mode == "prefill" || o.mode == "mla-prefill";

  // ---- The case: sequences, block tables over shuffled, non-contiguous block ids. ----
  Case c;
  const int B = o.batch;
  for (int s = 0; s < B; ++s) {
    int ql = 1, ctx = o.context - 1;  // decode: the new token completes `context` tokens
    if (prefill) {
      ql = o.query;
      ctx = o.context;
    } else if ((o.mode == "mixed" && s == 0) || o.mode == "verify") {
      ql = o.query;
      ctx = o.context;
    } else if (o.mode == "cache-write") {
      ql = o.query;
      ctx = o.context;
    } else if (o.mode == "copy-blocks") {
      ql = 0;
      ctx = o.context;
    }
    c.qlens.push_back(ql);
    c.ctxs.push_back(ctx);
    c.tokens += ql;
    c.table_stride = std::max(c.table_stride, (ctx + ql + bs - 1) / bs);
  }
  c.num_blocks = c.table_stride * B;
  {
    std::vector<int32_t> ids(c.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    Rng r(o.seed);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[r.next() % i]);
    c.tables = ids;  // row s = ids[s*stride ..): each sequence owns its blocks
  }
  // A latent cache holds one row per slot (no V); the others K and V.
  const double layer_bytes = (double)c.num_blocks * bs * Hkv * D * csz * (mla ? 1 : 2);
  const size_t llc = llc_bytes();
  int L = o.layers;
  if (L <= 0) {
    L = 2;
    if (!prefill && llc > 0)
      L = std::max(2, (int)std::ceil(2.0 * (double)llc / layer_bytes));
    const double cap = 8e9;  // keep the pool within memory on small machines
    while (L > 1 && L * layer_bytes > cap) --L;
  }

  // ---- Ceilings, measured first with the same thread count. ----
  BandwidthResult bw;
  GemmResult gemm, bgemm;
  size_t bw_bytes = std::max<size_t>(4 * llc, (size_t)1 << 30);
  bw_bytes = std::min<size_t>(bw_bytes, (size_t)8 << 30);
  if (!o.no_ceilings) {
    bw = measure_read_bandwidth(bw_bytes, o.threads, 7);
    gemm = measure_sgemm(o.gemm_size, o.gemm_size, o.gemm_size, o.threads, 5);
    bgemm = measure_bf16_matmul(o.gemm_size, o.gemm_size, o.gemm_size, o.threads, 5);
  }

  // ---- Library objects. ----
  pagedattn_backend_options bopts;
  CHECK(pagedattn_backend_options_init(&bopts));
  bopts.num_threads = o.threads;
  pagedattn_backend* be = nullptr;
  CHECK(pagedattn_backend_create(&be, o.backend.c_str(), &bopts));
  pagedattn_capabilities caps;
  std::memset(&caps, 0, sizeof caps);
  caps.struct_size = sizeof caps;
  CHECK(pagedattn_backend_get_capabilities(&caps, be));
  if (mla && !(caps.features & PAGEDATTN_FEATURE_MLA)) {
    std::fprintf(stderr, "pagedattn-bench: backend %s has no MLA (PAGEDATTN_FEATURE_MLA)\n",
                 o.backend.c_str());
    return 2;
  }

  pagedattn_kv_cache_desc cd;
  CHECK(pagedattn_kv_cache_desc_init(&cd));
  cd.num_layers = L;
  cd.num_blocks = c.num_blocks;
  cd.block_size = bs;
  cd.num_kv_heads = Hkv;
  cd.head_size = D;
  cd.dtype = cdt;
  cd.layout = layout;
  if (mla) cd.flags = PAGEDATTN_KV_CACHE_LATENT;
  pagedattn_kv_cache* cache = nullptr;
  CHECK(pagedattn_kv_cache_create(&cache, be, &cd));
  std::vector<void*> kl(L), vl(L);
  int64_t strides[3];
  for (int l = 0; l < L; ++l) {
    CHECK(pagedattn_kv_cache_get_layer(&kl[l], &vl[l], strides, cache, l));
    if (mla) continue;  // written below, through the library
    size_t n = (size_t)c.num_blocks * strides[0];
    fill_random(kl[l], n, cdt, o.seed * 100 + 2 * l, o.threads);
    fill_random(vl[l], n, cdt, o.seed * 100 + 2 * l + 1, o.threads);
  }
  if (mla) {
    // Every position a sequence attends to (context and new tokens) gets a random latent row
    // through pagedattn_kv_cache_write_latent, as an engine's steps leave them; the timed
    // forwards then only read.
    int64_t rows = 0;
    for (int s = 0; s < B; ++s) rows += (int64_t)c.ctxs[s] + c.qlens[s];
    Tensor src(2, rows, D, 0, dt), slots(1, rows, 0, 0, dt, 64);
    int64_t* sl = (int64_t*)slots.data();
    int64_t r = 0;
    for (int s = 0; s < B; ++s)
      for (int p = 0; p < c.ctxs[s] + c.qlens[s]; ++p)
        sl[r++] = (int64_t)c.tables[(size_t)s * c.table_stride + p / bs] * bs + p % bs;
    for (int l = 0; l < L; ++l) {
      fill_random(src.data(), (size_t)rows * D, dt, o.seed * 100 + 2 * l, o.threads);
      CHECK(pagedattn_kv_cache_write_latent(cache, l, &src.t, nullptr, &slots.t, 1.0f, nullptr));
    }
  }

  // The decode's own blocks read with no arithmetic by a plain prefetching loop: what scattered
  // blocks cost this machine's memory, next to the streaming ceiling (a reference, not a bound:
  // a kernel that overlaps its reads with work can beat it).
  BandwidthResult paged;
  PagedLayout pl;
  const bool paged_ceiling = !o.no_ceilings && o.mode == "decode";
  if (paged_ceiling || (o.scaling > 0 && o.mode == "decode")) {
    pl.k_layers = kl;
    pl.v_layers = vl;
    pl.tables = c.tables.data();
    pl.table_stride = c.table_stride;
    for (int s = 0; s < B; ++s) pl.keys.push_back((int64_t)c.ctxs[s] + c.qlens[s]);
    pl.block_size = bs;
    pl.block_stride_bytes = (size_t)strides[0] * csz;
    if (layout == PAGEDATTN_LAYOUT_NHD) {
      pl.runs = 1;
      pl.slot_bytes = (size_t)Hkv * D * csz;
    } else {
      pl.runs = Hkv;
      pl.run_stride_bytes = (size_t)bs * D * csz;
      pl.slot_bytes = (size_t)D * csz;
    }
    if (paged_ceiling) paged = measure_paged_read(pl, o.threads, 7);
  }

  if (mla)
    std::fprintf(txt, "pagedattn-bench %s | backend %s (%d threads) | H %d, latent rows D %d"
                 " (values R %d) | block %d | dtype %s cache %s\n",
                 o.mode.c_str(), caps.name ? caps.name : o.backend.c_str(), o.threads, H, D,
                 o.value_size, bs, pagedattn_dtype_name(dt), pagedattn_dtype_name(cdt));
  else
    std::fprintf(txt, "pagedattn-bench %s | backend %s (%d threads) | H %d Hkv %d D %d | block %d"
                 " %s | dtype %s cache %s\n",
                 o.mode.c_str(), caps.name ? caps.name : o.backend.c_str(), o.threads, H, Hkv, D,
                 bs, o.layout.c_str(), pagedattn_dtype_name(dt), pagedattn_dtype_name(cdt));
  std::fprintf(txt, "  pool: %d blocks x %d layers = %s (LLC %s; one layer per call, rotated)\n",
               c.num_blocks, L, fmt_bytes(L * layer_bytes).c_str(), fmt_bytes((double)llc).c_str());
  {
    double l1 = 0, l5 = 0;
    FILE* la = std::fopen("/proc/loadavg", "r");
    if (la != nullptr) {
      if (std::fscanf(la, "%lf %lf", &l1, &l5) != 2) l1 = l5 = -1;
      std::fclose(la);
      // Other processes on the cores skew every number; say so next to them.
      std::fprintf(txt, "  load average before the run: %.2f (1 min), %.2f (5 min) on %ld cores\n",
                   l1, l5, sysconf(_SC_NPROCESSORS_ONLN));
    }
  }
  if (!o.no_ceilings) {
    std::fprintf(txt, "  ceiling: read bandwidth %.2f GB/s best of %d (median %.2f), %s buffer\n",
                 bw.bytes_per_s / 1e9, bw.passes, bw.median_bytes_per_s / 1e9,
                 fmt_bytes((double)bw.buffer_bytes).c_str());
    if (gemm.error.empty())
      std::fprintf(txt, "  ceiling: dnnl_sgemm %ldx%ldx%ld %.1f GFLOP/s best of %d (median %.1f)"
                   " [oneDNN isa %s]\n", gemm.m, gemm.n, gemm.k, gemm.flops_per_s / 1e9,
                   gemm.runs, gemm.median_flops_per_s / 1e9, onednn_isa().c_str());
    else std::fprintf(txt, "  ceiling: sgemm failed: %s\n", gemm.error.c_str());
    if (paged_ceiling)
      std::fprintf(txt, "  reference: plain read of this batch's K/V blocks through its tables (no"
                   " arithmetic) %.2f GB/s best of %d (median %.2f)\n", paged.bytes_per_s / 1e9, paged.passes,
                   paged.median_bytes_per_s / 1e9);
    if (bgemm.error.empty())
      std::fprintf(txt, "  (for reference) oneDNN bf16 matmul, f32 out: %.1f GFLOP/s best\n",
                   bgemm.flops_per_s / 1e9);
    else std::fprintf(txt, "  (for reference) bf16 matmul: %s\n", bgemm.error.c_str());
  }
  std::fflush(txt);

  std::vector<double> times;
  double lib_cpu = 0, lib_wall = 0;  // CPU and wall seconds of the library's loop
  double bytes = 0, flops = 0;
  std::string flop_formula;
  std::vector<double> base_times;
  double max_rel_err = -1;
  // The ceilings again right after the library's loop; the best of both is kept, so a ceiling
  // measured while another process held a core does not inflate the ratios.
  auto remeasure = [&]() {
    if (o.no_ceilings) return;
    BandwidthResult b2 = measure_read_bandwidth(bw.buffer_bytes, o.threads, 7);
    GemmResult g2 = measure_sgemm(o.gemm_size, o.gemm_size, o.gemm_size, o.threads, 5);
    std::fprintf(txt, "  ceilings after the run: read bandwidth %.2f GB/s, sgemm %.1f GFLOP/s;"
                 " using the best of before/after\n", b2.bytes_per_s / 1e9, g2.flops_per_s / 1e9);
    if (b2.bytes_per_s > bw.bytes_per_s) bw = b2;
    if (paged_ceiling) {
      BandwidthResult p2 = measure_paged_read(pl, o.threads, 7);
      std::fprintf(txt, "  plain read of the blocks after the run: %.2f GB/s\n", p2.bytes_per_s / 1e9);
      if (p2.bytes_per_s > paged.bytes_per_s) paged = p2;
    }
    if (g2.error.empty() && g2.flops_per_s > gemm.flops_per_s) gemm = g2;
  };
  int64_t tokens_done = c.tokens;
  // --scaling: per round, T-thread throughput over 1-thread throughput of each measure.
  std::vector<double> sc_lib, sc_core, sc_stream, sc_paged, sc_t1, sc_tn;
  // --sinks: per round, the forward's time with sinks over its time without.
  std::vector<double> sink_ratio, sink_on, sink_off;
  // --mode verify: per round, the verify step's time over the same batch's one-token decode.
  std::vector<double> verify_ratio, verify_t, decode_t;

  if (attn) {
    pagedattn_batch_desc bdsc;
    CHECK(pagedattn_batch_desc_init(&bdsc));
    bdsc.num_seqs = B;
    bdsc.query_lens = c.qlens.data();
    bdsc.context_lens = c.ctxs.data();
    bdsc.block_tables = c.tables.data();
    bdsc.block_table_stride = c.table_stride;
    // verify: a binary draft tree per sequence (token j sees itself and its ancestors).
    std::vector<uint8_t> tree_bits;
    std::vector<int64_t> tree_ip(1, 0);
    if (o.mode == "verify") {
      CHECK(pagedattn_batch_desc_init_sized(&bdsc, sizeof bdsc));
      bdsc.num_seqs = B;
      bdsc.query_lens = c.qlens.data();
      bdsc.context_lens = c.ctxs.data();
      bdsc.block_tables = c.tables.data();
      bdsc.block_table_stride = c.table_stride;
      for (int s = 0; s < B; ++s) {
        const int q = c.qlens[s];
        const size_t base = tree_bits.size();
        tree_bits.resize(base + (size_t)(q * q + 7) / 8, 0);
        for (int r = 0; r < q; ++r)
          for (int a = r; a >= 0; a = a == 0 ? -1 : (a - 1) / 2)
            tree_bits[base + (size_t)(r * q + a) / 8] |= (uint8_t)(1u << ((r * q + a) % 8));
        tree_ip.push_back((int64_t)tree_bits.size());
      }
      bdsc.tree_mask = tree_bits.data();
      bdsc.tree_mask_indptr = tree_ip.data();
    }
    pagedattn_batch* batch = nullptr;
    CHECK(pagedattn_batch_create(&batch, be, cache, nullptr, &bdsc));
    const int64_t T = c.tokens;
    Tensor q(3, T, H, D, dt), k(3, T, Hkv, D, dt), v(3, T, Hkv, D, dt), out(3, T, H, D, dt);
    fill_random(q.data(), (size_t)T * H * D, dt, o.seed + 11, o.threads);
    fill_random(k.data(), (size_t)T * Hkv * D, dt, o.seed + 12, o.threads);
    fill_random(v.data(), (size_t)T * Hkv * D, dt, o.seed + 13, o.threads);
    pagedattn_attention_options ao;
    CHECK(pagedattn_attention_options_init_sized(&ao, sizeof ao));
    ao.num_heads = H;
    ao.num_kv_heads = Hkv;
    ao.head_size = D;
    ao.write_kv = 1;

    // Counting: every key of every sequence read once per KV head (the floor), plus q, the new
    // k/v and out; FLOPs are 2*D per (query, key) pair for QK^T and again for PV, causal pairs only.
    double kv_bytes = 0, pairs = 0;
    for (int s = 0; s < B; ++s) {
      double ql = c.qlens[s], ctx = c.ctxs[s];
      kv_bytes += (ctx + ql) * Hkv * D * csz * 2;
      pairs += ql * ctx + ql * (ql + 1) / 2;
    }
    bytes = kv_bytes + (double)T * (2 * H + 2 * Hkv) * D * dsz + (double)T * Hkv * D * csz * 2;
    flops = 4.0 * D * H * pairs;
    flop_formula = "4*D*H*sum_s(q_s*c_s + q_s*(q_s+1)/2)";

    const int n = o.warmup + o.iters;
    {
      Progress pr("library");
      const double c0 = cpu_seconds(), w0 = now_s();
      for (int i = 0; i < n; ++i) {
        double t0 = now_s();
        CHECK(pagedattn_forward(be, batch, cache, i % L, &ao, &q.t, &k.t, &v.t, &out.t, nullptr,
                                nullptr));
        double dt_s = now_s() - t0;
        if (i >= o.warmup) times.push_back(dt_s);
        pr.tick(i + 1, n);
      }
      lib_cpu = cpu_seconds() - c0;
      lib_wall = now_s() - w0;
      remeasure();
    }
    if (o.mode == "verify") {
      // The same sequences' one-token decode (the token after the context), alternating with
      // the verify step: what reading K/V once for every draft costs over reading it for one.
      std::vector<int32_t> ones(B, 1);
      pagedattn_batch_desc dd;
      CHECK(pagedattn_batch_desc_init(&dd));
      dd.num_seqs = B;
      dd.query_lens = ones.data();
      dd.context_lens = c.ctxs.data();
      dd.block_tables = c.tables.data();
      dd.block_table_stride = c.table_stride;
      pagedattn_batch* dec = nullptr;
      CHECK(pagedattn_batch_create(&dec, be, cache, nullptr, &dd));
      Progress pr("verify/decode");
      for (int i = 0; i < n; ++i) {
        double t[2];
        for (int which = 0; which < 2; ++which) {
          const double t0 = now_s();
          CHECK(pagedattn_forward(be, which ? batch : dec, cache, i % L, &ao, &q.t, &k.t, &v.t,
                                  &out.t, nullptr, nullptr));
          t[which] = now_s() - t0;
        }
        if (i >= o.warmup) {
          decode_t.push_back(t[0]);
          verify_t.push_back(t[1]);
          verify_ratio.push_back(t[1] / t[0]);
        }
        pr.tick(i + 1, n);
      }
      pagedattn_batch_destroy(dec);
    }
    if (o.sinks) {
      // The same forward without and with sinks, alternating, so both see the same machine.
      Tensor sinks(1, H, 1, 1, PAGEDATTN_DTYPE_FLOAT32);
      for (int h = 0; h < H; ++h) static_cast<float*>(sinks.data())[h] = 0.5f * (h % 5) - 1.0f;
      Progress pr("sinks on/off");
      for (int i = 0; i < n; ++i) {
        double t[2];
        for (int on = 0; on < 2; ++on) {
          ao.sinks = on ? &sinks.t : nullptr;
          const double t0 = now_s();
          CHECK(pagedattn_forward(be, batch, cache, i % L, &ao, &q.t, &k.t, &v.t, &out.t,
                                  nullptr, nullptr));
          t[on] = now_s() - t0;
        }
        if (i >= o.warmup) {
          sink_off.push_back(t[0]);
          sink_on.push_back(t[1]);
          sink_ratio.push_back(t[1] / t[0]);
        }
        pr.tick(i + 1, n);
      }
      ao.sinks = nullptr;
    }

    // Naive baseline over the same cache contents.
    BaselineProblem bp;
    bp.num_heads = H;
    bp.num_kv_heads = Hkv;
    bp.head_size = D;
    bp.block_size = bs;
    bp.scale = 1.0f / std::sqrt((float)D);
    bp.dtype = dt;
    bp.cache_dtype = cdt;
    std::memcpy(bp.strides, strides, sizeof strides);
    bp.query_lens = c.qlens;
    bp.context_lens = c.ctxs;
    bp.query_start.assign(B + 1, 0);
    for (int s = 0; s < B; ++s) bp.query_start[s + 1] = bp.query_start[s] + c.qlens[s];
    bp.tables = c.tables;
    bp.table_stride = c.table_stride;
    int biters = o.baseline_iters;
    if (biters < 0) {
      // Scalar-ish code at ~1 GFLOP/s per thread: keep the baseline under ~30 s.
      double est = flops / (1e9 * o.threads);
      biters = est > 10 ? 1 : std::min(o.iters, 5);
    }
    if (biters > 0 || o.check) {
      Baseline base(bp, o.threads);
      Tensor bout(3, T, H, D, dt);
      int last = (n - 1) % L;  // the layer the library touched last (its new k/v are written)
      int bn = std::max(biters, 1);
      bool warm = biters > 1;
      Progress pr("baseline");
      for (int i = 0; i < bn + (warm ? 1 : 0); ++i) {
        int l = (last + 1 + i) % L;
        if (i == bn + (warm ? 1 : 0) - 1) l = last;  // final run on the checked layer
        double t0 = now_s();
        base.run(kl[l], vl[l], q.data(), bout.data());
        double dt_s = now_s() - t0;
        if (!(warm && i == 0) && biters > 0) base_times.push_back(dt_s);
        pr.tick(i + 1, bn);
      }
      if (o.check) {
        // Agreement check (not a correctness test: the suites do that against float64).
        double mx = 0, mref = 0;
        for (size_t i = 0; i < (size_t)T * H * D; ++i) {
          double a = load_elem(out.data(), i, dt), b = load_elem(bout.data(), i, dt);
          if (std::isnan(a) || std::isnan(b)) {
            mx = INFINITY;
            break;
          }
          mx = std::max(mx, std::fabs(a - b));
          mref = std::max(mref, std::fabs(b));
        }
        max_rel_err = mref > 0 ? mx / mref : mx;
      }
    }
    if (o.scaling > 0) {
      // A 1-thread twin of the backend, its cache (same contents) and batch: the same call at 1
      // and T threads, in alternation with the machine's own 1/T measures, so each round's
      // ratios come from the same minutes of this host.
      pagedattn_backend_options b1o;
      CHECK(pagedattn_backend_options_init(&b1o));
      b1o.num_threads = 1;
      pagedattn_backend* be1 = nullptr;
      CHECK(pagedattn_backend_create(&be1, o.backend.c_str(), &b1o));
      pagedattn_kv_cache* cache1 = nullptr;
      CHECK(pagedattn_kv_cache_create(&cache1, be1, &cd));
      for (int l = 0; l < L; ++l) {
        void *k1 = nullptr, *v1 = nullptr;
        int64_t s1[3];
        CHECK(pagedattn_kv_cache_get_layer(&k1, &v1, s1, cache1, l));
        const size_t nb = (size_t)c.num_blocks * strides[0] * csz;
        std::memcpy(k1, kl[l], nb);
        std::memcpy(v1, vl[l], nb);
      }
      pagedattn_batch* batch1 = nullptr;
      CHECK(pagedattn_batch_create(&batch1, be1, cache1, nullptr, &bdsc));
      StreamBuffer sb;
      if (!stream_buffer_init(&sb, bw_bytes, o.threads)) {
        std::fprintf(stderr, "pagedattn-bench: no memory for the streaming buffer\n");
        std::exit(1);
      }
      const long citers = core_iters_for(0.05);
      // ~0.3 s of calls per side at the T-thread speed, the first one untimed.
      const int ncalls = 1 + std::max(4, (int)std::ceil(0.3 / stats_of(times).median));
      int layer = 0;
      auto lib_median = [&](pagedattn_backend* b, pagedattn_batch* bt, pagedattn_kv_cache* ca) {
        std::vector<double> ts;
        for (int i = 0; i < ncalls; ++i, ++layer) {
          double t0 = now_s();
          CHECK(pagedattn_forward(b, bt, ca, layer % L, &ao, &q.t, &k.t, &v.t, &out.t, nullptr,
                                  nullptr));
          if (i > 0) ts.push_back(now_s() - t0);
        }
        return stats_of(ts).median;
      };
      Progress pr("scaling");
      for (int r = 0; r < o.scaling; ++r) {
        // Which thread count goes first alternates, so a drift of the host within a round
        // favours neither.
        const int first = r % 2 == 0 ? 1 : o.threads, second = r % 2 == 0 ? o.threads : 1;
        double lib[2], core[2], strm[2], pg[2] = {0, 0};
        for (int w = 0; w < 2; ++w) {
          const int thr = w == 0 ? first : second, i = thr == 1 ? 0 : 1;
          lib[i] = thr == 1 ? lib_median(be1, batch1, cache1) : lib_median(be, batch, cache);
          // Each side's median of three, as the library call's is a median.
          std::vector<double> cr, sr;
          for (int m = 0; m < 3; ++m) {
            cr.push_back(measure_core_rate(thr, citers));
            sr.push_back(stream_pass(sb, thr));
          }
          core[i] = stats_of(cr).median;
          strm[i] = stats_of(sr).median;
          if (o.mode == "decode") pg[i] = measure_paged_read(pl, thr, 3).median_bytes_per_s;
        }
        sc_t1.push_back(lib[0]);
        sc_tn.push_back(lib[1]);
        sc_lib.push_back(lib[0] / lib[1]);
        sc_core.push_back(core[1] / core[0]);
        sc_stream.push_back(strm[1] / strm[0]);
        if (pg[0] > 0) sc_paged.push_back(pg[1] / pg[0]);
        pr.tick(r + 1, o.scaling);
      }
      pagedattn_batch_destroy(batch1);
      pagedattn_kv_cache_destroy(cache1);
      pagedattn_backend_destroy(be1);
    }
    pagedattn_batch_destroy(batch);
  } else if (mla) {
    pagedattn_batch_desc bdsc;
    CHECK(pagedattn_batch_desc_init(&bdsc));
    bdsc.num_seqs = B;
    bdsc.query_lens = c.qlens.data();
    bdsc.context_lens = c.ctxs.data();
    bdsc.block_tables = c.tables.data();
    bdsc.block_table_stride = c.table_stride;
    pagedattn_batch* batch = nullptr;
    CHECK(pagedattn_batch_create(&batch, be, cache, nullptr, &bdsc));
    const int64_t T = c.tokens;
    const int R = o.value_size;
    // DeepSeek's split query: q_nope (R values, W_UK absorbed) and q_pe (the D - R rotary ones).
    Tensor qn(3, T, H, R, dt), qp(3, T, H, D - R, dt), out(3, T, H, R, dt);
    fill_random(qn.data(), (size_t)T * H * R, dt, o.seed + 11, o.threads);
    fill_random(qp.data(), (size_t)T * H * (D - R), dt, o.seed + 12, o.threads);
    pagedattn_attention_options ao;
    CHECK(pagedattn_attention_options_init_sized(&ao, sizeof ao));
    ao.num_heads = H;
    ao.num_kv_heads = 1;
    ao.head_size = D;

    // Counting: every latent row a sequence attends to read once (all heads share it); q and
    // out are reported apart. FLOPs: per (query, key) pair and head, 2*D for the score and 2*R
    // for the weighted sum; causal pairs only.
    double keys = 0, pairs = 0;
    for (int s = 0; s < B; ++s) {
      double ql = c.qlens[s], ctx = c.ctxs[s];
      keys += ctx + ql;
      pairs += ql * ctx + ql * (ql + 1) / 2;
    }
    bytes = keys * D * csz;
    flops = 2.0 * (D + R) * H * pairs;
    flop_formula = "2*(D+R)*H*sum_s(q_s*c_s + q_s*(q_s+1)/2)";
    std::fprintf(txt, "  counting: %.0f latent rows x %d x %zu B read once = %s; q + out add %s;"
                 " %.4g FLOPs\n", keys, D, csz, fmt_bytes(bytes).c_str(),
                 fmt_bytes((double)T * H * (D + R) * dsz).c_str(), flops);

    const int n = o.warmup + o.iters;
    {
      Progress pr("library");
      const double c0 = cpu_seconds(), w0 = now_s();
      for (int i = 0; i < n; ++i) {
        double t0 = now_s();
        CHECK(pagedattn_forward_mla(be, batch, cache, i % L, &ao, &qn.t, &qp.t, &out.t, nullptr,
                                    nullptr));
        double dt_s = now_s() - t0;
        if (i >= o.warmup) times.push_back(dt_s);
        pr.tick(i + 1, n);
      }
      lib_cpu = cpu_seconds() - c0;
      lib_wall = now_s() - w0;
      remeasure();
    }

    // Naive baseline over the same rows.
    BaselineProblem bp;
    bp.num_heads = H;
    bp.num_kv_heads = 1;
    bp.head_size = D;
    bp.value_size = R;
    bp.block_size = bs;
    bp.scale = 1.0f / std::sqrt((float)D);
    bp.dtype = dt;
    bp.cache_dtype = cdt;
    std::memcpy(bp.strides, strides, sizeof strides);
    bp.query_lens = c.qlens;
    bp.context_lens = c.ctxs;
    bp.query_start.assign(B + 1, 0);
    for (int s = 0; s < B; ++s) bp.query_start[s + 1] = bp.query_start[s] + c.qlens[s];
    bp.tables = c.tables;
    bp.table_stride = c.table_stride;
    int biters = o.baseline_iters;
    if (biters < 0) biters = flops / (1e9 * o.threads) > 10 ? 1 : std::min(o.iters, 5);
    if (biters > 0 || o.check) {
      MlaBaseline base(bp, o.threads);
      Tensor bout(3, T, H, R, dt);
      const int bn = std::max(biters, 1);
      const bool warm = biters > 1;
      const int checked = (n - 1) % L;  // the layer of the library's last output
      Progress pr("baseline");
      for (int i = 0; i < bn + (warm ? 1 : 0); ++i) {
        int l = (checked + 1 + i) % L;
        if (i == bn + (warm ? 1 : 0) - 1) l = checked;
        double t0 = now_s();
        base.run(kl[l], qn.data(), qp.data(), bout.data());
        double dt_s = now_s() - t0;
        if (!(warm && i == 0) && biters > 0) base_times.push_back(dt_s);
        pr.tick(i + 1, bn);
      }
      if (o.check) {
        double mx = 0, mref = 0;
        for (size_t i = 0; i < (size_t)T * H * R; ++i) {
          double a = load_elem(out.data(), i, dt), b = load_elem(bout.data(), i, dt);
          if (std::isnan(a) || std::isnan(b)) {
            mx = INFINITY;
            break;
          }
          mx = std::max(mx, std::fabs(a - b));
          mref = std::max(mref, std::fabs(b));
        }
        max_rel_err = mref > 0 ? mx / mref : mx;
      }
    }
    pagedattn_batch_destroy(batch);
  } else if (o.mode == "cache-write") {
    const int64_t T = c.tokens;
    Tensor k(3, T, Hkv, D, dt), v(3, T, Hkv, D, dt), slots(1, T, 0, 0, dt, 64);
    fill_random(k.data(), (size_t)T * Hkv * D, dt, o.seed + 21, o.threads);
    fill_random(v.data(), (size_t)T * Hkv * D, dt, o.seed + 22, o.threads);
    // Distinct slots scattered over the pool, as a batch of sequences writes them.
    int64_t* sl = (int64_t*)slots.data();
    int64_t row = 0;
    for (int s = 0; s < B; ++s)
      for (int j = 0; j < c.qlens[s]; ++j) {
        int p = c.ctxs[s] + j;
        sl[row++] = (int64_t)c.tables[(size_t)s * c.table_stride + p / bs] * bs + p % bs;
      }
    bytes = (double)T * Hkv * D * (2.0 * dsz + 2.0 * csz);
    const int n = o.warmup + o.iters;
    Progress pr("library");
    const double c0 = cpu_seconds(), w0 = now_s();
    for (int i = 0; i < n; ++i) {
      double t0 = now_s();
      CHECK(pagedattn_kv_cache_write(cache, i % L, &k.t, &v.t, &slots.t, 1.0f, 1.0f, nullptr));
      double dt_s = now_s() - t0;
      if (i >= o.warmup) times.push_back(dt_s);
      pr.tick(i + 1, n);
    }
    lib_cpu = cpu_seconds() - c0;
    lib_wall = now_s() - w0;
    remeasure();
    // Baseline: a per-element converting scatter loop.
    int biters = o.baseline_iters < 0 ? std::min(o.iters, 5) : o.baseline_iters;
    const bool fp8 = cdt == PAGEDATTN_DTYPE_FP8_E4M3 || cdt == PAGEDATTN_DTYPE_FP8_E5M2;
    for (int i = 0; i < biters && !fp8; ++i) {
      int l = i % L;
      double t0 = now_s();
      parallel(o.threads, [&](int t) {
        for (int64_t r = t; r < T; r += o.threads) {
          int64_t blk = sl[r] / bs, slot = sl[r] % bs;
          for (int h = 0; h < Hkv; ++h) {
            int64_t off = blk * strides[0] + slot * strides[1] + h * strides[2];
            size_t src = ((size_t)r * Hkv + h) * D;
            for (int d = 0; d < D; ++d) {
              store_elem((char*)kl[l] + off * csz, d, cdt, load_elem(k.data(), src + d, dt));
              store_elem((char*)vl[l] + off * csz, d, cdt, load_elem(v.data(), src + d, dt));
            }
          }
        }
      });
      base_times.push_back(now_s() - t0);
    }
  } else {  // copy-blocks: the first half of the pool onto the second half, all layers
    const int np = c.num_blocks / 2;
    std::vector<int32_t> pairs(2 * (size_t)np);
    for (int i = 0; i < np; ++i) {
      pairs[2 * i] = c.tables[i];
      pairs[2 * i + 1] = c.tables[np + i];
    }
    uint64_t bpb = 0;
    CHECK(pagedattn_kv_cache_bytes_per_block(&bpb, &cd));
    bytes = 2.0 * np * (double)bpb;  // read + write
    tokens_done = (int64_t)np * bs;
    const int n = o.warmup + o.iters;
    Progress pr("library");
    const double c0 = cpu_seconds(), w0 = now_s();
    for (int i = 0; i < n; ++i) {
      double t0 = now_s();
      CHECK(pagedattn_kv_cache_copy_blocks(cache, pairs.data(), (size_t)np, nullptr));
      double dt_s = now_s() - t0;
      if (i >= o.warmup) times.push_back(dt_s);
      pr.tick(i + 1, n);
    }
    lib_cpu = cpu_seconds() - c0;
    lib_wall = now_s() - w0;
    remeasure();
    int biters = o.baseline_iters < 0 ? std::min(o.iters, 5) : o.baseline_iters;
    const size_t blk_bytes = (size_t)strides[0] * csz;  // compact: one block of one layer
    for (int i = 0; i < biters; ++i) {
      double t0 = now_s();
      parallel(o.threads, [&](int t) {
        for (int p = t; p < np; p += o.threads)
          for (int l = 0; l < L; ++l) {
            std::memcpy((char*)kl[l] + pairs[2 * p + 1] * blk_bytes,
                        (char*)kl[l] + pairs[2 * p] * blk_bytes, blk_bytes);
            std::memcpy((char*)vl[l] + pairs[2 * p + 1] * blk_bytes,
                        (char*)vl[l] + pairs[2 * p] * blk_bytes, blk_bytes);
          }
      });
      base_times.push_back(now_s() - t0);
    }
  }

  // ---- Report. ----
  Stats st = stats_of(times), bst = stats_of(base_times);
  const double med = st.median;
  const double bps = bytes / med, fps = flops / med;
  const double bw_ratio = bw.bytes_per_s > 0 ? bps / bw.bytes_per_s : 0;
  const double gemm_ratio = gemm.flops_per_s > 0 ? fps / gemm.flops_per_s : 0;
  const double speedup = bst.n > 0 ? bst.median / med : 0;
  // Fastest iteration against the ceilings' best pass: on a busy machine the closest to what the
  // code can do (both sides are best-of).
  const double bw_ratio_best = bw.bytes_per_s > 0 ? bytes / st.min / bw.bytes_per_s : 0;
  const double gemm_ratio_best = gemm.flops_per_s > 0 ? flops / st.min / gemm.flops_per_s : 0;
  const double cpu_share = lib_wall > 0 ? lib_cpu / (lib_wall * o.threads) : 0;
  const double tps = (double)tokens_done / med;
  // The floors: bytes over the measured bandwidth, FLOPs over the measured sgemm rate.
  const double t_bytes = bw.bytes_per_s > 0 ? bytes / bw.bytes_per_s : 0;
  const double t_flops = gemm.flops_per_s > 0 && flops > 0 ? flops / gemm.flops_per_s : 0;
  // The roofline: the larger floor over the time, so a compute-bound shape (a wide GQA group in
  // float32 FMAs) is judged against its real floor rather than the bandwidth alone.
  const double t_roof = std::max(t_bytes, t_flops);
  const double roof_ratio = t_roof > 0 ? t_roof / med : 0;
  const double roof_ratio_best = t_roof > 0 ? t_roof / st.min : 0;

  std::fprintf(txt, "  time: median %.3f ms  [min %.3f, p25 %.3f, p75 %.3f, max %.3f] over %d"
               " iters (%d warm-up)\n", med * 1e3, st.min * 1e3, st.p25 * 1e3, st.p75 * 1e3,
               st.max * 1e3, st.n, o.warmup);
  const Stats s_verify = stats_of(verify_ratio);
  if (!verify_ratio.empty())
    std::fprintf(txt, "  verify/decode: median %.3f / %.3f ms, ratio %.3fx (median of %d alternating"
                 " rounds) [p25 %.3f, p75 %.3f]\n", stats_of(verify_t).median * 1e3,
                 stats_of(decode_t).median * 1e3, s_verify.median, s_verify.n, s_verify.p25,
                 s_verify.p75);
  const Stats s_sink = stats_of(sink_ratio);
  if (!sink_ratio.empty())
    std::fprintf(txt, "  sinks on/off: median %.3f / %.3f ms, ratio %.3fx (median of %d alternating"
                 " rounds) [p25 %.3f, p75 %.3f]\n", stats_of(sink_on).median * 1e3,
                 stats_of(sink_off).median * 1e3, s_sink.median, s_sink.n, s_sink.p25, s_sink.p75);
  if (o.no_ceilings) {
    std::fprintf(txt, "  floors: not measured (--no-ceilings)\n");
    std::fprintf(txt, "  bytes: %s per call -> %.2f GB/s\n", fmt_bytes(bytes).c_str(), bps / 1e9);
  } else {
    std::fprintf(txt, "  floors: bytes/bandwidth %.3f ms, flops/sgemm %.3f ms -> %s-bound;"
                 " median is %.2fx the larger floor\n", t_bytes * 1e3, t_flops * 1e3,
                 t_bytes >= t_flops ? "memory" : "compute", t_roof > 0 ? med / t_roof : 0.0);
    std::fprintf(txt, "  roofline: %.1f%% (max(bytes/bandwidth, flops/sgemm) / median; fastest"
                 " iteration %.1f%%)\n", 100 * roof_ratio, 100 * roof_ratio_best);
    std::fprintf(txt, "  bytes: %s per call -> %.2f GB/s = %.1f%% of read bandwidth\n",
                 fmt_bytes(bytes).c_str(), bps / 1e9, 100 * bw_ratio);
  }
  const double paged_ratio = paged.bytes_per_s > 0 ? bps / paged.bytes_per_s : 0;
  if (paged.bytes_per_s > 0)
    std::fprintf(txt, "  bytes: %.1f%% of the plain read of the same blocks\n", 100 * paged_ratio);
  if (flops > 0 && o.no_ceilings)
    std::fprintf(txt, "  flops: %.3g per call (%s) -> %.1f GFLOP/s\n", flops,
                 flop_formula.c_str(), fps / 1e9);
  else if (flops > 0)
    std::fprintf(txt, "  flops: %.3g per call (%s) -> %.1f GFLOP/s = %.1f%% of sgemm\n", flops,
                 flop_formula.c_str(), fps / 1e9, 100 * gemm_ratio);
  if (bw.bytes_per_s > 0)
    std::fprintf(txt, "  fastest iteration: %.1f%% of read bandwidth\n", 100 * bw_ratio_best);
  if (gemm.flops_per_s > 0 && flops > 0)
    std::fprintf(txt, "  fastest iteration: %.1f%% of sgemm\n", 100 * gemm_ratio_best);
  std::fprintf(txt, "  cpu share: the library loop got %.0f%% of %d threads x wall time%s\n",
               100 * cpu_share, o.threads,
               cpu_share < 0.9 ? " (the rest went to other processes or to idle waits)" : "");
  std::fprintf(txt, "  tokens/s: %.0f (%lld tokens per call)\n", tps, (long long)tokens_done);
  if (bst.n > 0)
    std::fprintf(txt, "  naive baseline: median %.3f ms [min %.3f, max %.3f] over %d -> speed-up"
                 " %.2fx\n", bst.median * 1e3, bst.min * 1e3, bst.max * 1e3, bst.n, speedup);
  else std::fprintf(txt, "  naive baseline: not run\n");
  // The baseline computes in float32 from the cache's values: the library may differ by the
  // output dtype's rounding (and bf16 weights on AVX3_BF16), never by more than the tolerance of docs/semantics.md.
  const bool fp8_cache = cdt == PAGEDATTN_DTYPE_FP8_E4M3 || cdt == PAGEDATTN_DTYPE_FP8_E5M2;
  const double agree_tol = fp8_cache ? 6e-2
                           : dt == PAGEDATTN_DTYPE_BFLOAT16 ? 2e-2
                           : dt == PAGEDATTN_DTYPE_FLOAT16 ? 2e-3 : 1e-5;
  const bool disagrees = max_rel_err > agree_tol;
  const Stats s_lib = stats_of(sc_lib), s_core = stats_of(sc_core),
              s_stream = stats_of(sc_stream), s_paged = stats_of(sc_paged);
  if (o.scaling > 0) {
    std::fprintf(txt, "  scaling: %d rounds alternating 1 and %d threads, %d/1 throughput ratio"
                 " (median [min, max] over the rounds):\n", o.scaling, o.threads, o.threads);
    std::fprintf(txt, "    library call               %.2fx [%.2f, %.2f]  (%.3f ms at 1 thread,"
                 " %.3f ms at %d; medians)\n", s_lib.median, s_lib.min, s_lib.max,
                 stats_of(sc_t1).median * 1e3, stats_of(sc_tn).median * 1e3, o.threads);
    std::fprintf(txt, "    register-only arithmetic   %.2fx [%.2f, %.2f]  (what the host's cores"
                 " give %d threads with no memory traffic)\n", s_core.median, s_core.min,
                 s_core.max, o.threads);
    std::fprintf(txt, "    streaming read             %.2fx [%.2f, %.2f]\n", s_stream.median,
                 s_stream.min, s_stream.max);
    if (s_paged.n > 0)
      std::fprintf(txt, "    plain read of the blocks   %.2fx [%.2f, %.2f]\n", s_paged.median,
                   s_paged.min, s_paged.max);
  }
  if (max_rel_err >= 0)
    std::fprintf(txt, "  agreement with baseline: max|lib-base|/max|base| = %.2e (tolerance %.0e)%s\n",
                 max_rel_err, agree_tol, disagrees ? "  DISAGREES" : "");

  if (o.json) {
    std::printf(
        "{\"mode\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"heads\":%d,\"kv_heads\":%d,"
        "\"head_size\":%d,\"block_size\":%d,\"batch\":%d,\"context\":%d,\"query\":%d,"
        "\"dtype\":\"%s\",\"cache_dtype\":\"%s\",\"layout\":\"%s\",\"layers\":%d,"
        "\"iters\":%d,\"warmup\":%d,\"median_s\":%.9g,\"min_s\":%.9g,\"p25_s\":%.9g,"
        "\"p75_s\":%.9g,\"max_s\":%.9g,\"bytes\":%.6g,\"bytes_per_s\":%.6g,\"flops\":%.6g,"
        "\"flop_formula\":\"%s\",\"flops_per_s\":%.6g,\"read_bw\":%.6g,\"sgemm_flops\":%.6g,"
        "\"bf16_gemm_flops\":%.6g,\"bw_ratio\":%.4f,\"gemm_ratio\":%.4f,\"roofline_ratio\":%.4f,"
        "\"roofline_ratio_best\":%.4f,"
        "\"floor_bytes_s\":%.6g,\"floor_flops_s\":%.6g,\"tokens_per_s\":%.6g,"
        "\"baseline_median_s\":%.9g,\"baseline_iters\":%d,\"speedup\":%.4f,"
        "\"max_rel_diff_vs_baseline\":%.3g,\"llc_bytes\":%zu,\"bw_ratio_best\":%.4f,"
        "\"gemm_ratio_best\":%.4f,\"cpu_share\":%.3f,\"paged_read_bw\":%.6g,"
        "\"paged_ratio\":%.4f,\"cpu_target\":\"%s\",\"scaling_rounds\":%d,"
        "\"scaling_lib\":%.4f,\"scaling_core\":%.4f,\"scaling_stream\":%.4f,"
        "\"scaling_paged\":%.4f,\"scaling_t1_median_s\":%.9g,\"scaling_tn_median_s\":%.9g,"
        "\"sinks_ratio\":%.4f,\"verify_ratio\":%.4f,\"value_size\":%d}\n",
        o.mode.c_str(), caps.name ? caps.name : o.backend.c_str(), o.threads, H, Hkv, D, bs, B,
        o.context, o.query, pagedattn_dtype_name(dt), pagedattn_dtype_name(cdt), o.layout.c_str(),
        L, o.iters, o.warmup, med, st.min, st.p25, st.p75, st.max, bytes, bps, flops,
        flop_formula.c_str(), fps, bw.bytes_per_s, gemm.flops_per_s, bgemm.flops_per_s,
        bw_ratio, gemm_ratio, roof_ratio, roof_ratio_best, t_bytes, t_flops, tps, bst.median, bst.n, speedup, max_rel_err,
        llc, bw_ratio_best, gemm_ratio_best, cpu_share, paged.bytes_per_s, paged_ratio,
        getenv("PAGEDATTN_CPU_TARGET") ? getenv("PAGEDATTN_CPU_TARGET") : "default", o.scaling,
        s_lib.median, s_core.median, s_stream.median, s_paged.median, stats_of(sc_t1).median,
        stats_of(sc_tn).median, s_sink.median, s_verify.median, o.value_size);
  }

  pagedattn_kv_cache_destroy(cache);
  pagedattn_backend_destroy(be);
  return disagrees ? 1 : 0;
}
