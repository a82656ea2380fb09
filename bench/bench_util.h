// Shared helpers of pagedattn-bench: element conversions, random fill, timing statistics,
// thread fan-out. Written for the benchmark only (the library has its own kernels).
#ifndef PAGEDATTN_BENCH_UTIL_H
#define PAGEDATTN_BENCH_UTIL_H

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include <cstdlib>

#include "pagedattn/pagedattn.h"

// The bench builds for baseline x86-64, where a read loop is SSE pairs: on one core those read
// memory markedly slower than AVX2 loads do, so a ceiling measured with them is too low. Read
// loops carry this attribute: an AVX2 clone is picked at load time where the CPU has it, so they
// measure the memory, not the loop.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PA_BENCH_WIDE_LOADS __attribute__((target_clones("avx2", "default")))
#else
#define PA_BENCH_WIDE_LOADS
#endif

namespace bench {

// 256-bit float vector (GCC vector extension: AVX2 in a wide clone, SSE pairs otherwise).
typedef float v8f __attribute__((vector_size(32)));

// A buffer of at least `bytes`, 2 MiB-aligned and advised into huge pages, as the library's CPU
// caches are: with 4 KiB pages a read stops at every page for the hardware prefetcher and the TLB,
// and the ceiling would judge the library against a slower read than its own. Free with
// std::free; nullptr when out of memory.
inline void* alloc_huge(size_t bytes) {
  const size_t kHuge = size_t(2) << 20;
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, size);
#ifdef MADV_HUGEPAGE
  if (p != nullptr) madvise(p, size, MADV_HUGEPAGE);  // advice only
#endif
  return p;
}

inline double now_s() {
  using clk = std::chrono::steady_clock;
  return std::chrono::duration<double>(clk::now().time_since_epoch()).count();
}

// Runs fn(t) on n threads (t = 0..n-1); thread 0 is the caller.
inline void parallel(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> th;
  th.reserve(n - 1);
  for (int t = 1; t < n; ++t) th.emplace_back(fn, t);
  fn(0);
  for (auto& x : th) x.join();
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float uniform() { return (float)((int64_t)(next() >> 11) - (1ll << 52)) * (1.0f / (1ll << 52)); }
};

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (uint16_t)(u >> 16);
}
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Benchmark inputs are in [-1, 1]: normal half range, so no overflow/subnormal care beyond zero.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (exp <= 0) return sign;  // tiny values flush to zero (never produced by the bench)
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  uint32_t r = ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (uint16_t)(sign | r);
}
// fp8 decoders (e4m3fn: bias 7, no inf; e5m2: bias 15).
inline float fp8_e4m3_to_f32(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
  float v;
  if (e == 0xf && m == 7) return NAN;
  if (e == 0) v = std::ldexp((float)m, -9);
  else v = std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
inline float fp8_e5m2_to_f32(uint8_t b) {
  uint16_t h = (uint16_t)b << 8;
  return f16_to_f32(h);
}

inline size_t dtype_size(pagedattn_dtype dt) { return pagedattn_dtype_size(dt); }

// Loads element i of a buffer of dtype dt as float.
inline float load_elem(const void* p, size_t i, pagedattn_dtype dt) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return ((const float*)p)[i];
    case PAGEDATTN_DTYPE_FLOAT16: return f16_to_f32(((const uint16_t*)p)[i]);
    case PAGEDATTN_DTYPE_BFLOAT16: return bf16_to_f32(((const uint16_t*)p)[i]);
    case PAGEDATTN_DTYPE_FP8_E4M3: return fp8_e4m3_to_f32(((const uint8_t*)p)[i]);
    case PAGEDATTN_DTYPE_FP8_E5M2: return fp8_e5m2_to_f32(((const uint8_t*)p)[i]);
    default: return NAN;
  }
}
inline void store_elem(void* p, size_t i, pagedattn_dtype dt, float v) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: ((float*)p)[i] = v; break;
    case PAGEDATTN_DTYPE_FLOAT16: ((uint16_t*)p)[i] = f32_to_f16(v); break;
    case PAGEDATTN_DTYPE_BFLOAT16: ((uint16_t*)p)[i] = f32_to_bf16(v); break;
    default: break;
  }
}

// Fills n elements of dtype dt with random non-zero-mean-free values (never all zeros, no NaN).
// fp8 bytes are drawn directly with a bounded exponent so every code is a finite, moderate value.
inline void fill_random(void* p, size_t n, pagedattn_dtype dt, uint64_t seed, int threads) {
  parallel(threads, [&](int t) {
    size_t lo = n * t / threads, hi = n * (t + 1) / threads;
    Rng r(seed * 1000003ull + t);
    for (size_t i = lo; i < hi; ++i) {
      if (dt == PAGEDATTN_DTYPE_FP8_E4M3) {
        uint64_t x = r.next();
        uint8_t e = (uint8_t)(4 + x % 6);  // 2^-3 .. 2^2
        ((uint8_t*)p)[i] = (uint8_t)(((x >> 8) & 0x80) | (e << 3) | ((x >> 16) & 7));
      } else if (dt == PAGEDATTN_DTYPE_FP8_E5M2) {
        uint64_t x = r.next();
        uint8_t e = (uint8_t)(12 + x % 6);
        ((uint8_t*)p)[i] = (uint8_t)(((x >> 8) & 0x80) | (e << 2) | ((x >> 16) & 3));
      } else {
        store_elem(p, i, dt, r.uniform());
      }
    }
  });
}

struct Stats {
  double median = 0, min = 0, max = 0, p25 = 0, p75 = 0;
  int n = 0;
};
inline Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto q = [&](double f) {
    double x = f * (double)(v.size() - 1);
    size_t i = (size_t)x;
    double w = x - (double)i;
    return i + 1 < v.size() ? v[i] * (1 - w) + v[i + 1] * w : v[i];
  };
  s.n = (int)v.size();
  s.median = q(0.5);
  s.p25 = q(0.25);
  s.p75 = q(0.75);
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace bench

#endif  // PAGEDATTN_BENCH_UTIL_H
