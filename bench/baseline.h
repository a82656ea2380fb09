// The naive baseline: what an engine without a paged kernel does. For each sequence it gathers
// the blocks into contiguous K/V (converted to float32), then runs plain attention per query head
// (scores, softmax, weighted sum), re-reading the KV head once per query head of a GQA group.
// MlaBaseline does the same over a latent (MLA) cache: each sequence's rows gathered into float32,
// then per (token, head) scores over all D values of a row and a weighted sum of its leading R.
#ifndef PAGEDATTN_BENCH_BASELINE_H
#define PAGEDATTN_BENCH_BASELINE_H

#include <cstdint>
#include <vector>

#include "pagedattn/pagedattn.h"

namespace bench {

struct BaselineProblem {
  int num_heads = 0, num_kv_heads = 0, head_size = 0, block_size = 0;
  float scale = 0, k_scale = 1, v_scale = 1;
  pagedattn_dtype dtype = PAGEDATTN_DTYPE_BFLOAT16;        // q / out
  pagedattn_dtype cache_dtype = PAGEDATTN_DTYPE_BFLOAT16;
  int64_t strides[3] = {0, 0, 0};                          // cache block, slot, head (elements)
  std::vector<int32_t> query_lens, context_lens, query_start;
  std::vector<int32_t> tables;                             // [seqs][table_stride]
  int32_t table_stride = 0;
  int value_size = 0;                                      // MLA: R, the rows' leading values
};

class Baseline {
 public:
  Baseline(const BaselineProblem& p, int threads);
  // out = attention(q) over layer (k_base, v_base) of the cache. q/out are [T, H, D] compact.
  void run(const void* k_base, const void* v_base, const void* q, void* out);

 private:
  void run_seq(int tid, int s, const void* k_base, const void* v_base, const void* q, void* out);
  BaselineProblem p_;
  int threads_;
  std::vector<std::vector<float>> k_, v_, scores_, qf_, acc_;  // per-thread scratch
};

// Naive absorbed MLA over layer `rows` of a latent cache (num_kv_heads 1, head_size D,
// value_size R). q_nope [T, H, R] and q_pe [T, H, D - R], out [T, H, R], all compact.
class MlaBaseline {
 public:
  MlaBaseline(const BaselineProblem& p, int threads);
  void run(const void* rows, const void* q_nope, const void* q_pe, void* out);

 private:
  void run_seq(int tid, int s, const void* rows, const void* q_nope, const void* q_pe, void* out);
  BaselineProblem p_;
  int threads_;
  std::vector<std::vector<float>> k_, scores_, qf_, acc_;  // per-thread scratch
};

}  // namespace bench

#endif  // PAGEDATTN_BENCH_BASELINE_H
