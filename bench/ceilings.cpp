#include "ceilings.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "bench_util.h"

namespace bench {

size_t llc_bytes() {
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream type(dir + "type"), size(dir + "size");
    if (!type || !size) continue;
    std::string t, s;
    type >> t;
    size >> s;
    if (t == "Instruction" || s.empty()) continue;
    size_t v = std::strtoull(s.c_str(), nullptr, 10);
    char unit = s.back();
    if (unit == 'K') v <<= 10;
    else if (unit == 'M') v <<= 20;
    else if (unit == 'G') v <<= 30;
    if (v > best) best = v;
  }
  return best;
}

// 8 independent 256-bit accumulators so the sum never stalls on the add latency; the loop is
// bound by the loads (wide clone: see PA_BENCH_WIDE_LOADS).
PA_BENCH_WIDE_LOADS static float sum_slice(const float* p, size_t n) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};
  const v8f* v = (const v8f*)p;
  size_t nv = n / 8, i = 0;
  for (; i + 8 <= nv; i += 8) {
    a0 += v[i];
    a1 += v[i + 1];
    a2 += v[i + 2];
    a3 += v[i + 3];
    a4 += v[i + 4];
    a5 += v[i + 5];
    a6 += v[i + 6];
    a7 += v[i + 7];
  }
  for (; i < nv; ++i) a0 += v[i];
  v8f s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  float r = 0;
  for (int k = 0; k < 8; ++k) r += s[k];
  for (size_t j = nv * 8; j < n; ++j) r += p[j];
  return r;
}

StreamBuffer::~StreamBuffer() { std::free(p); }

bool stream_buffer_init(StreamBuffer* b, size_t bytes, int threads) {
  std::free(b->p);
  b->p = nullptr;
  size_t n = bytes / sizeof(float);
  n -= n % (64 * (size_t)threads);
  float* buf = static_cast<float*>(alloc_huge(n * sizeof(float)));
  if (!buf) return false;
  // First touch by the thread that later reads the slice (pages local to it); random non-zero data.
  parallel(threads, [&](int t) {
    size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    Rng r(77 + t);
    for (size_t i = lo; i < hi; ++i) buf[i] = r.uniform();
  });
  b->p = buf;
  b->n = n;
  return true;
}

double stream_pass(const StreamBuffer& b, int threads) {
  static volatile float sink = 0;
  std::vector<float> part(threads);
  const size_t n = b.n;
  double t0 = now_s();
  parallel(threads, [&](int t) {
    size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    part[t] = sum_slice(b.p + lo, hi - lo);
  });
  double dt = now_s() - t0;
  for (float x : part) sink = sink + x;
  return (double)(n * sizeof(float)) / dt;
}

BandwidthResult measure_read_bandwidth(size_t bytes, int threads, int passes) {
  BandwidthResult res;
  StreamBuffer buf;
  if (!stream_buffer_init(&buf, bytes, threads)) return res;
  std::vector<double> rates;
  for (int p = 0; p < passes; ++p) rates.push_back(stream_pass(buf, threads));
  Stats s = stats_of(rates);
  res.bytes_per_s = s.max;
  res.median_bytes_per_s = s.median;
  res.buffer_bytes = buf.n * sizeof(float);
  res.passes = passes;
  return res;
}

// 12 independent chains of x = x * m + c on 8-float vectors: bound by the arithmetic pipes and
// their latency, never by memory. Returns a sum so nothing is optimised away.
PA_BENCH_WIDE_LOADS static float core_chains(long iters) {
  v8f a[12];
  for (int j = 0; j < 12; ++j)
    for (int l = 0; l < 8; ++l) a[j][l] = 0.01f * (float)(j * 8 + l);
  v8f m, c;
  for (int l = 0; l < 8; ++l) {
    m[l] = 0.999f;
    c[l] = 1e-3f;
  }
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) a[j] = a[j] * m + c;
  v8f s = a[0];
  for (int j = 1; j < 12; ++j) s += a[j];
  float r = 0;
  for (int l = 0; l < 8; ++l) r += s[l];
  return r;
}

double measure_core_rate(int threads, long iters) {
  static volatile float sink = 0;
  std::vector<float> part(threads);
  double t0 = now_s();
  parallel(threads, [&](int t) { part[t] = core_chains(iters); });
  double dt = now_s() - t0;
  for (float x : part) sink = sink + x;
  return 2.0 * 12 * 8 * (double)iters * threads / dt;
}

long core_iters_for(double seconds) {
  const long probe = 1 << 20;
  measure_core_rate(1, probe);  // warm-up
  double rate = measure_core_rate(1, probe);  // FLOP/s
  return std::max(probe, (long)(seconds * rate / (2.0 * 12 * 8)));
}

BandwidthResult measure_paged_read(const PagedLayout& pl, int threads, int passes) {
  BandwidthResult res;
  const int ns = static_cast<int>(pl.keys.size());
  double bytes = 0;
  for (int64_t k : pl.keys) bytes += static_cast<double>(k) * pl.runs * pl.slot_bytes * 2;
  const int L = static_cast<int>(pl.k_layers.size());
  std::vector<double> rates;
  volatile float sink = 0;
  std::vector<float> part(threads);
  for (int p = 0; p < passes + 1; ++p) {  // one warm-up pass
    const int layer = p % L;
    double t0 = now_s();
    parallel(threads, [&](int t) {
      float acc = 0;
      for (int s = t; s < ns; s += threads) {
        const int64_t keys = pl.keys[s];
        const int nb = static_cast<int>((keys + pl.block_size - 1) / pl.block_size);
        const char* kbase = static_cast<const char*>(pl.k_layers[layer]);
        const char* vbase = static_cast<const char*>(pl.v_layers[layer]);
        auto block_off = [&](int b) {
          return (size_t)pl.tables[(size_t)s * pl.table_stride + b] * pl.block_stride_bytes;
        };
        const size_t run_bytes = (size_t)pl.block_size * pl.slot_bytes;
        for (int b = 0; b < 2 && b < nb; ++b)  // the first two blocks at once
          for (int r = 0; r < pl.runs; ++r)
            for (size_t o = 0; o < run_bytes; o += 64) {
              __builtin_prefetch(kbase + block_off(b) + r * pl.run_stride_bytes + o, 0, 2);
              __builtin_prefetch(vbase + block_off(b) + r * pl.run_stride_bytes + o, 0, 2);
            }
        // Block b's K then its V (as the kernels read them), while block b + 2's stream in, 256
        // bytes per 256 bytes.
        for (int b = 0; b < nb; ++b) {
          const int64_t used = std::min<int64_t>(pl.block_size, keys - (int64_t)b * pl.block_size);
          const size_t used_bytes = (size_t)used * pl.slot_bytes;
          const size_t off = block_off(b);
          const bool more = b + 2 < nb;
          const size_t ahead = more ? block_off(b + 2) : 0;
          for (int half = 0; half < 2; ++half) {
            const char* base = half ? vbase : kbase;
            for (int r = 0; r < pl.runs; ++r) {
              const char* run = base + off + r * pl.run_stride_bytes;
              const char* pre = base + ahead + r * pl.run_stride_bytes;
              for (size_t o = 0; o < used_bytes; o += 256) {
                if (more)
                  for (size_t l = 0; l < 256; l += 64) __builtin_prefetch(pre + o + l, 0, 2);
                acc += sum_slice(reinterpret_cast<const float*>(run + o),
                                 std::min<size_t>(256, used_bytes - o) / sizeof(float));
              }
              if (more)  // the part of block b + 2 beyond this block's used slots
                for (size_t o = used_bytes; o < run_bytes; o += 64) __builtin_prefetch(pre + o, 0, 2);
            }
          }
        }
      }
      part[t] = acc;
    });
    double dt = now_s() - t0;
    for (float x : part) sink = sink + x;
    if (p > 0) rates.push_back(bytes / dt);
  }
  Stats s = stats_of(rates);
  res.bytes_per_s = s.max;
  res.median_bytes_per_s = s.median;
  res.buffer_bytes = (size_t)bytes;
  res.passes = passes;
  return res;
}

GemmResult measure_sgemm(long m, long n, long k, int threads, int runs) {
  GemmResult res;
  res.m = m;
  res.n = n;
  res.k = k;
  omp_set_num_threads(threads);
  std::vector<float> a((size_t)m * k), b((size_t)k * n), c((size_t)m * n);
  Rng r(5);
  for (auto& x : a) x = r.uniform();
  for (auto& x : b) x = r.uniform();
  std::vector<double> rates;
  for (int i = 0; i < runs + 2; ++i) {  // 2 warm-ups (JIT kernels, page faults)
    double t0 = now_s();
    dnnl_status_t st = dnnl_sgemm('N', 'N', m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                                  c.data(), n);
    double dt = now_s() - t0;
    if (st != dnnl_success) {
      res.error = "dnnl_sgemm failed with status " + std::to_string((int)st);
      return res;
    }
    if (i >= 2) rates.push_back(2.0 * m * n * k / dt);
  }
  Stats s = stats_of(rates);
  res.flops_per_s = s.max;
  res.median_flops_per_s = s.median;
  res.runs = runs;
  return res;
}

GemmResult measure_bf16_matmul(long m, long n, long k, int threads, int runs) {
  GemmResult res;
  res.m = m;
  res.n = n;
  res.k = k;
  omp_set_num_threads(threads);
  try {
    using namespace dnnl;
    engine eng(engine::kind::cpu, 0);
    stream strm(eng);
    memory::desc ad({m, k}, memory::data_type::bf16, memory::format_tag::ab);
    memory::desc bd({k, n}, memory::data_type::bf16, memory::format_tag::ab);
    memory::desc cd({m, n}, memory::data_type::f32, memory::format_tag::ab);
    matmul::primitive_desc pd(matmul::desc(ad, bd, cd), eng);
    std::string impl = pd.impl_info_str();
    if (impl.find("ref") != std::string::npos) {
      res.error = "no optimised bf16 matmul here (" + impl + ")";
      return res;
    }
    matmul mm(pd);
    memory am(ad, eng), bm(bd, eng), cm(cd, eng);
    fill_random(am.get_data_handle(), (size_t)m * k, PAGEDATTN_DTYPE_BFLOAT16, 9, 1);
    fill_random(bm.get_data_handle(), (size_t)k * n, PAGEDATTN_DTYPE_BFLOAT16, 10, 1);
    std::vector<double> rates;
    for (int i = 0; i < runs + 2; ++i) {
      double t0 = now_s();
      mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      strm.wait();
      double dt = now_s() - t0;
      if (i >= 2) rates.push_back(2.0 * m * n * k / dt);
    }
    Stats s = stats_of(rates);
    res.flops_per_s = s.max;
    res.median_flops_per_s = s.median;
    res.runs = runs;
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace bench
