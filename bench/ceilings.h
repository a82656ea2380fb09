// The machine's ceilings, measured in the same run as the cases they judge.
#ifndef PAGEDATTN_BENCH_CEILINGS_H
#define PAGEDATTN_BENCH_CEILINGS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// A buffer for streaming-read passes that outlives one measurement (for alternating thread
// counts): random non-zero floats, huge-page advised, first touched by `threads` threads.
struct StreamBuffer {
  float* p = nullptr;
  size_t n = 0;  // floats
  StreamBuffer() = default;
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer();
};
// Fills `b` with about `bytes`; false when out of memory.
bool stream_buffer_init(StreamBuffer* b, size_t bytes, int threads);
// One streaming read pass over the whole buffer split over `threads` threads: bytes per second.
double stream_pass(const StreamBuffer& b, int threads);

// Register-only arithmetic: independent multiply-add chains with no memory traffic, `iters`
// rounds on each of `threads` threads. FLOP/s summed over the threads. Its ratio between thread
// counts is how much more arithmetic the host gives more threads (clock boost for a lone core,
// shared physical cores), whatever the memory does.
double measure_core_rate(int threads, long iters);
// Rounds of measure_core_rate that take about `seconds` on one thread.
long core_iters_for(double seconds);

// The decode's own memory pattern with no arithmetic (a reference for scattered blocks, not a
// bound): every K and V element of each sequence's
// keys read through its block table (blocks of `block_bytes` at `block_stride_bytes`, the used
// slots of a block as `runs` runs of `run_bytes_per_slot` x slots at `run_stride_bytes`), one
// layer per pass rotated like the library's calls, sequences split over `threads` threads, two
// blocks ahead prefetched. Best of `passes`; bytes counted as the decode's K/V floor.
struct PagedLayout {
  std::vector<void*> k_layers, v_layers;
  const int32_t* tables = nullptr;
  int table_stride = 0;
  std::vector<int64_t> keys;      // keys of each sequence
  int block_size = 0;
  size_t block_stride_bytes = 0;  // between blocks
  int runs = 1;                   // contiguous runs per block (NHD 1, HND one per head)
  size_t run_stride_bytes = 0;    // between runs of a block
  size_t slot_bytes = 0;          // bytes of one slot within a run
};
BandwidthResult measure_paged_read(const PagedLayout& pl, int threads, int passes);

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
