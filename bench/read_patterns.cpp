// pagedattn-read-patterns: how fast can this machine read a paged KV cache at all? No attention,
// only reads, in the orders and with the prefetching a decode kernel could use. It answers
// whether a decode shortfall is the kernel's or the access pattern's (docs/perf.md).
//
// K and V pools of 32 KiB blocks (one NHD block: 16 slots x 8 KV heads x 128 bf16), block ids
// shuffled within each thread's share; tiles of two blocks, K then V, as the decode reads them.
// Patterns:
//   stream          one sequential pass over the pool (the read ceiling)
//   linear          each block front to back, hardware prefetch only
//   linear+pf       the same, software prefetch of the next tile spread over this one
//   head-major      NHD head by head (16 rows of 256 B, 2 KiB apart), hardware prefetch only
//   head-major+pf   the same with the next tile's software prefetch (the decode's scheme)
//   side by side N  N blocks front to back at once, 256 B of each in turn (hardware prefetch)
//   runs of 8       linear, but the shuffled unit is 8 adjacent blocks (256 KiB of 32 KiB
//                   blocks), not one
//   linear+pf, ...  linear+pf with another prefetch: prefetcht0 or prefetchnta instead of t2;
//                   two tiles ahead instead of one; every other line only; or 4 lines per
//                   4 KiB page, the hardware streamer left to follow
//   tile ...        a decode tile's two blocks read in turn: head by head (NHD, each head's
//                   rows of both blocks alternating) or slot row by slot row; +pf as linear+pf
//   linear+pf, in turn  the next tile's lines asked for 256 B of each block in turn: its two K
//                   blocks (during K), or its K and V blocks, four, over this tile's K and V
// With a `work` argument W > 0, every pattern runs with W units of arithmetic per 256 B read (a
// unit: one add on each of 8 independent 8-float chains, nothing waiting on the loads; ~3
// cycles), and the two prefetched orders also over a pool that stays in cache (the work's own
// rate). With W chosen so the in-cache rate matches a decode's in-cache rate, a whole-pool
// figure is what a decode reading in that order could reach here if memory and work overlapped
// perfectly (bench/overlap-bound.sh does the choosing).
//
// A last argument of 16 makes the blocks 16 KiB (an fp8 cache's NHD block: 16 slots x 8 heads x
// 128 bytes; heads 128 B apart), for the read-only patterns (work 0).
//
// usage: pagedattn-read-patterns [threads (0 = all)] [MiB per pool (512)] [passes (3)] [work (0)]
//                                [block KiB: 32 or 16 (32)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"

namespace {

size_t kBlock = 32768;
size_t kRow = 2048;  // one slot row of all heads: kBlock / 16
size_t kHead = 256;  // one head's part of a row: kRow / 8

using bench::v8f;

// Sum of 128 bytes into four independent accumulators (bound by the loads, not the adds).
inline void sum128(const char* p, v8f* a) {
  const v8f* v = reinterpret_cast<const v8f*>(p);
  a[0] += v[0];
  a[1] += v[1];
  a[2] += v[2];
  a[3] += v[3];
}

inline void sum256(const char* p, v8f* a) {
  sum128(p, a);
  sum128(p + 128, a);
}

// The next tile's lines, a few per 256 bytes read (as the decode spreads them). Variants for
// other cores: the hint (0: prefetcht0, 1: t1, 2: t2 as the decode, 3: nta) and which lines are
// asked for (line i when i % period < count: every line, every other line for a core whose L2
// fetches a line's 128 B buddy, or a few lines per 4 KiB page for one whose streamer follows).
struct Spread {
  const char* blk[4];
  int n = 0;
  size_t off = 0;
  int hint = 2;
  size_t period = 1, count = 1;
  void start(const char* const* b, int nb) {
    n = nb;
    for (int i = 0; i < nb; ++i) blk[i] = b[i];
    off = 0;
  }
  // As many bytes of the next tile as were just read (256 or 128): a line per 64 B.
  bool turns = false;  // the blocks in turn, 256 B each (as the decode's PfStream), not in order
  void step(size_t bytes) {
    if (n == 0 || off >= kBlock * n) return;
    const char* p = turns ? blk[off / 256 % n] + off / 256 / n * 256 : blk[off / kBlock] + off % kBlock;
    for (size_t b = 0; b < bytes; b += 64) {
      if ((off + b) / 64 % period >= count) continue;
      switch (hint) {
        case 0: __builtin_prefetch(p + b, 0, 3); break;
        case 1: __builtin_prefetch(p + b, 0, 2); break;
        case 3: __builtin_prefetch(p + b, 0, 0); break;
        default: __builtin_prefetch(p + b, 0, 1); break;
      }
    }
    off += bytes;
  }
};

// Arithmetic standing in for a decode's: `units` dependent adds on eight independent chains,
// so its time is set by the add latency, not by how wide the target's vectors are.
inline void work(v8f* w, int units) {
  const v8f c = {1e-3f, 1e-3f, 1e-3f, 1e-3f, 1e-3f, 1e-3f, 1e-3f, 1e-3f};
  for (int u = 0; u < units; ++u)
    for (int j = 0; j < 8; ++j) w[j] += c;
}

enum Pattern {
  kStream, kLinear, kLinearPf, kHeadMajor, kHeadMajorPf, kSide2, kSide4, kSide8, kRuns8,
  kLinearPfT0, kLinearPfNta, kLinearPfFar, kLinearPfAlt, kLinearPfPage, kTileHeads, kTileHeadsPf,
  kTileRows, kTileRowsPf, kLinearPfTurns2, kLinearPfTurns4, kPatterns
};
const char* const kNames[kPatterns] = {"stream", "linear", "linear+pf", "head-major",
                                       "head-major+pf", "side by side 2", "side by side 4",
                                       "side by side 8", "runs of 8 blocks",
                                       "linear+pf, prefetcht0", "linear+pf, prefetchnta",
                                       "linear+pf, two tiles ahead", "linear+pf, every 2nd line",
                                       "linear+pf, 4 lines per 4 KiB",
                                       "tile head-major", "tile head-major+pf",
                                       "tile row-major", "tile row-major+pf",
                                       "linear+pf, 2 blocks in turn",
                                       "linear+pf, K and V in turn"};
constexpr size_t kCachedBlocks = 16;  // per thread and pool: 2 x 512 KiB, held in L2/L3

// Reads nb blocks of K and V: the blocks ids[0, nb) (stream: the nb blocks from block lo on);
// in-cache patterns cycle through the first kCachedBlocks of ids instead.
// units > 0: that much work per 256 B read (busy); cached: over kCachedBlocks blocks only.
PA_BENCH_WIDE_LOADS float read_share(const char* K, const char* V, const int* ids, size_t lo,
                                     size_t nb, int pat, int units, bool cached) {
  const bool busy = units > 0;
  auto id = [&](size_t i) { return cached ? ids[i % std::min(nb, kCachedBlocks)] : ids[i]; };
  v8f a[4] = {};
  v8f w[8] = {};
  if (pat == kStream) {
    for (const char* base : {K, V})
      for (size_t o = lo * kBlock; o < (lo + nb) * kBlock; o += 256) {
        sum256(base + o, a);
        if (busy) work(w, units);
      }
  } else if (pat >= kSide2 && pat <= kSide8) {
    const size_t width = size_t(2) << (pat - kSide2);
    for (const char* base : {K, V})
      for (size_t t = 0; t < nb; t += width) {
        const size_t m = std::min(width, nb - t);  // a last group may be short
        const char* blk[8];
        for (size_t b = 0; b < m; ++b) blk[b] = base + (size_t)id(t + b) * kBlock;
        for (size_t o = 0; o < kBlock; o += 256)
          for (size_t b = 0; b < m; ++b) {
            sum256(blk[b] + o, a);
            if (busy) work(w, units);
          }
      }
  } else if (pat == kRuns8) {
    // ids[i] / 8 names a run; each run is read once, at the place of its first block in ids.
    for (const char* base : {K, V})
      for (size_t i = 0; i < nb; ++i) {
        const size_t run = static_cast<size_t>(ids[i]) / 8 * 8;
        if (static_cast<size_t>(ids[i]) != std::max(run, lo)) continue;
        const size_t end = std::min(run + 8, lo + nb);
        for (size_t o = std::max(run, lo) * kBlock; o < end * kBlock; o += 256) {
          sum256(base + o, a);
          if (busy) work(w, units);
        }
      }
  } else {
    const bool pf = pat == kLinearPf || pat == kHeadMajorPf ||
                    (pat >= kLinearPfT0 && pat <= kLinearPfPage) || pat == kTileHeadsPf ||
                    pat == kTileRowsPf || pat == kLinearPfTurns2 || pat == kLinearPfTurns4;
    const bool tile_heads = pat == kTileHeads || pat == kTileHeadsPf;
    const bool tile_rows = pat == kTileRows || pat == kTileRowsPf;
    const bool heads = pat == kHeadMajor || pat == kHeadMajorPf;
    Spread s;
    s.hint = pat == kLinearPfT0 ? 0 : pat == kLinearPfNta ? 3 : 2;
    s.period = pat == kLinearPfAlt ? 2 : pat == kLinearPfPage ? 64 : 1;
    s.count = pat == kLinearPfPage ? 4 : 1;
    s.turns = pat == kLinearPfTurns2 || pat == kLinearPfTurns4;
    const bool kv_turns = pat == kLinearPfTurns4;
    const size_t ahead = pat == kLinearPfFar ? 4 : 2;  // blocks: the next tile, or the one after
    for (size_t t = 0; t + 1 < nb; t += 2) {
      const bool more = t + ahead + 1 < nb;
      for (int kv = 0; kv < 2; ++kv) {
        const char* base = kv ? V : K;
        if (kv_turns) {  // the next tile's K and V, four blocks in turn over this tile's K and V
          if (kv == 0 && more) {
            const char* nxt[4] = {K + (size_t)id(t + ahead) * kBlock, K + (size_t)id(t + ahead + 1) * kBlock,
                                  V + (size_t)id(t + ahead) * kBlock, V + (size_t)id(t + ahead + 1) * kBlock};
            s.start(nxt, 4);
          } else if (kv == 0) {
            s.n = 0;  // the last tile: no next tile's ids to read
          }
        } else if (pf && more) {
          const char* nxt[2] = {base + (size_t)id(t + ahead) * kBlock,
                                base + (size_t)id(t + ahead + 1) * kBlock};
          s.start(nxt, 2);
        } else {
          s.n = 0;
        }
        const char* pair[2] = {base + (size_t)id(t) * kBlock, base + (size_t)id(t + 1) * kBlock};
        if (tile_heads) {  // head by head over both blocks, their rows in turn
          for (size_t h = 0; h < kRow / kHead; ++h)
            for (size_t r = 0; r < kBlock / kRow; ++r)
              for (int b = 0; b < 2; ++b) {
                sum256(pair[b] + r * kRow + h * kHead, a);
                if (pf) s.step(256);
                if (busy) work(w, units);
              }
          continue;
        }
        if (tile_rows) {  // slot row by slot row (all heads), the two blocks' rows in turn
          for (size_t r = 0; r < kBlock / kRow; ++r)
            for (int b = 0; b < 2; ++b)
              for (size_t o = 0; o < kRow; o += 256) {
                sum256(pair[b] + r * kRow + o, a);
                if (pf) s.step(256);
                if (busy) work(w, units);
              }
          continue;
        }
        for (int b = 0; b < 2; ++b) {
          const char* blk = pair[b];
          if (heads) {
            for (size_t h = 0; h < kRow / kHead; ++h)
              for (size_t r = 0; r < kBlock / kRow; ++r) {
                const char* hp = blk + r * kRow + h * kHead;
                if (kHead == 256)
                  sum256(hp, a);
                else
                  sum128(hp, a);
                if (pf) s.step(kHead);
                if (busy) work(w, units);
              }
          } else {
            for (size_t o = 0; o < kBlock; o += 256) {
              sum256(blk + o, a);
              if (pf) s.step(256);
              if (busy) work(w, units);
            }
          }
        }
      }
    }
  }
  v8f z = (a[0] + a[1]) + (a[2] + a[3]);
  for (int j = 0; j < 8; ++j) z += w[j];
  float r = 0;
  for (int i = 0; i < 8; ++i) r += z[i];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 0;
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 512;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 3;
  const int units = argc > 4 ? std::atoi(argv[4]) : 0;
  const int block_kib = argc > 5 ? std::atoi(argv[5]) : 32;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (mib < 8 || passes < 1 || units < 0 || units > 4096 ||
      (block_kib != 32 && (block_kib != 16 || units > 0))) {
    std::fprintf(stderr, "usage: pagedattn-read-patterns [threads] [MiB per pool >= 8] [passes]"
                         " [work 0..4096] [block KiB: 32, or 16 with work 0]\n");
    return 2;
  }
  kBlock = static_cast<size_t>(block_kib) << 10;
  kRow = kBlock / 16;
  kHead = kRow / 8;
  const size_t kHuge = size_t(2) << 20;
  const size_t bytes = (mib << 20) / kHuge * kHuge;
  const size_t nblocks = bytes / kBlock;
  // Huge pages, as the library's CPU caches get; first touch by the thread that reads.
  char* K = static_cast<char*>(bench::alloc_huge(bytes));
  char* V = static_cast<char*>(bench::alloc_huge(bytes));
  if (!K || !V) {
    std::fprintf(stderr, "pagedattn-read-patterns: out of memory\n");
    std::free(K);
    std::free(V);
    return 1;
  }
  bench::parallel(threads, [&](int t) {
    const size_t lo = nblocks * t / threads * kBlock, hi = nblocks * (t + 1) / threads * kBlock;
    bench::Rng r(11 + t);
    for (size_t i = lo; i < hi; i += 4) {
      const float x = r.uniform();
      std::memcpy(K + i, &x, 4);
      std::memcpy(V + i, &x, 4);
    }
  });
  // Each thread's blocks: its own share of the pool, in shuffled order.
  std::vector<int> ids(nblocks);
  for (size_t i = 0; i < nblocks; ++i) ids[i] = static_cast<int>(i);
  bench::Rng rng(5);
  for (int t = 0; t < threads; ++t) {
    const size_t lo = nblocks * t / threads, hi = nblocks * (t + 1) / threads;
    for (size_t i = hi - lo; i > 1; --i) std::swap(ids[lo + i - 1], ids[lo + rng.next() % i]);
  }
  std::printf("pagedattn-read-patterns: %d threads, K and V pools of %zu MiB, %zu blocks of %zu KiB,"
              " best of %d passes%s\n", threads, bytes >> 20, nblocks, kBlock >> 10, passes,
              units > 0 ? ", work per 256 B read as given" : "");
  volatile float sink = 0;
  std::vector<float> part(threads);
  // The host's bandwidth can change within minutes: the stream pass runs first and last, and
  // every figure is also given as a share of the faster of the two.
  // With work: every pattern with it over the pool, then the two prefetched orders in cache.
  struct Run {
    int pat;
    bool cached;
  };
  std::vector<Run> runs;
  for (int i = 0; i < kPatterns; ++i) runs.push_back({i, false});
  if (units > 0) {
    runs.push_back({kLinearPf, true});
    runs.push_back({kHeadMajorPf, true});
  }
  runs.push_back({kStream, false});
  const int npat = static_cast<int>(runs.size()) - 1;
  std::vector<double> rate(npat + 1);
  for (int i = 0; i <= npat; ++i) {
    double best = 0;
    for (int p = 0; p < passes; ++p) {
      const double t0 = bench::now_s();
      bench::parallel(threads, [&](int t) {
        const size_t lo = nblocks * t / threads, hi = nblocks * (t + 1) / threads;
        part[t] = read_share(K, V, ids.data() + lo, lo, hi - lo, runs[i].pat, units,
                             runs[i].cached);
      });
      const double dt = bench::now_s() - t0;
      for (float x : part) sink = sink + x;
      best = std::max(best, 2.0 * static_cast<double>(bytes) / dt);
    }
    rate[i] = best;
  }
  const double stream = std::max(rate[0], rate[npat]);
  const char* with = units > 0 ? "+work" : "";
  for (int i = 0; i <= npat; ++i) {
    char name[80];
    std::snprintf(name, sizeof name, "%s%s%s", kNames[runs[i].pat], with,
                  i == npat ? " (again, last)" : runs[i].cached ? " (in cache)" : "");
    std::printf("  %-36s %6.2f GB/s  %4.0f%% of stream\n", name, rate[i] / 1e9,
                100.0 * rate[i] / stream);
  }
  if (std::min(rate[0], rate[npat]) < 0.9 * stream)
    std::printf("  note: the stream rate changed by over 10%% during the run; the host's bandwidth"
                " moved, so compare these figures with care\n");
  std::free(K);
  std::free(V);
  return 0;
}
