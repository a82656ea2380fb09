// The machine's ceilings, measured in the same run as the cases they judge.
#ifndef PAGEDATTN_BENCH_CEILINGS_H
#define PAGEDATTN_BENCH_CEILINGS_H

#include <cstddef>
#include <string>

namespace bench {

// Size in bytes of the largest data/unified cache level (the LLC), 0 if unknown.
size_t llc_bytes();

struct BandwidthResult {
  double bytes_per_s = 0;  // best pass
  double median_bytes_per_s = 0;
  size_t buffer_bytes = 0;
  int passes = 0;
};
// Streaming read (vectorised sum) over a buffer of `bytes`, split over `threads` threads, each
// reading its own first-touched slice. Best of `passes` passes.
BandwidthResult measure_read_bandwidth(size_t bytes, int threads, int passes);

struct GemmResult {
  double flops_per_s = 0;  // best run
  double median_flops_per_s = 0;
  long m = 0, n = 0, k = 0;
  int runs = 0;
  std::string error;  // non-empty if oneDNN failed
};
// oneDNN's dnnl_sgemm on an m x n x k problem with `threads` OpenMP threads.
GemmResult measure_sgemm(long m, long n, long k, int threads, int runs);

// Same problem through a oneDNN bf16 matmul (f32 accumulate), for reference; error set where the
// CPU has no bf16 path.
GemmResult measure_bf16_matmul(long m, long n, long k, int threads, int runs);

// oneDNN's name for the ISA it dispatches to ("avx512_core_amx", ...).
std::string onednn_isa();

}  // namespace bench

#endif  // PAGEDATTN_BENCH_CEILINGS_H
