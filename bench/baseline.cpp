#include "baseline.h"

#include <atomic>
#include <cmath>

#include "bench_util.h"

namespace bench {

Baseline::Baseline(const BaselineProblem& p, int threads) : p_(p), threads_(threads) {
  int64_t max_keys = 0;
  int max_q = 0;
  for (size_t i = 0; i < p_.query_lens.size(); ++i) {
    max_keys = std::max<int64_t>(max_keys, (int64_t)p_.context_lens[i] + p_.query_lens[i]);
    max_q = std::max(max_q, p_.query_lens[i]);
  }
  size_t kv = (size_t)max_keys * p_.num_kv_heads * p_.head_size;
  // Scratch is allocated once here, not per call, so the baseline is not charged for malloc.
  k_.assign(threads, std::vector<float>(kv));
  v_.assign(threads, std::vector<float>(kv));
  scores_.assign(threads, std::vector<float>((size_t)max_keys));
  qf_.assign(threads, std::vector<float>((size_t)p_.head_size));
  acc_.assign(threads, std::vector<float>((size_t)p_.head_size));
  (void)max_q;
}

// Dot product with 8 partial sums: plain C++ the compiler can vectorise without fast-math.
static inline float dot(const float* a, const float* b, int n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void Baseline::run_seq(int tid, int s, const void* k_base, const void* v_base, const void* q,
                       void* out) {
  const int H = p_.num_heads, Hkv = p_.num_kv_heads, D = p_.head_size, bs = p_.block_size;
  const int G = H / Hkv;
  const int ql = p_.query_lens[s], ctx = p_.context_lens[s];
  const int total = ctx + ql;
  if (ql == 0) return;
  float* K = k_[tid].data();
  float* V = v_[tid].data();
  const size_t csz = dtype_size(p_.cache_dtype);
  // 1. Gather the sequence's blocks into contiguous [total][Hkv][D] float32.
  for (int pos = 0; pos < total; ++pos) {
    int64_t blk = p_.tables[(size_t)s * p_.table_stride + pos / bs];
    int slot = pos % bs;
    for (int h = 0; h < Hkv; ++h) {
      int64_t off = blk * p_.strides[0] + slot * p_.strides[1] + h * p_.strides[2];
      const char* kp = (const char*)k_base + off * csz;
      const char* vp = (const char*)v_base + off * csz;
      float* kd = K + ((size_t)pos * Hkv + h) * D;
      float* vd = V + ((size_t)pos * Hkv + h) * D;
      for (int d = 0; d < D; ++d) {
        kd[d] = load_elem(kp, d, p_.cache_dtype) * p_.k_scale;
        vd[d] = load_elem(vp, d, p_.cache_dtype) * p_.v_scale;
      }
    }
  }
  // 2. Plain causal attention per query token and query head.
  float* sc = scores_[tid].data();
  float* qf = qf_[tid].data();
  float* acc = acc_[tid].data();
  for (int j = 0; j < ql; ++j) {
    const int64_t row = p_.query_start[s] + j;
    const int nk = ctx + j + 1;  // keys at positions <= p
    for (int h = 0; h < H; ++h) {
      const int kvh = h / G;
      size_t qoff = ((size_t)row * H + h) * D;
      for (int d = 0; d < D; ++d) qf[d] = load_elem(q, qoff + d, p_.dtype);
      float m = -INFINITY;
      for (int t = 0; t < nk; ++t) {
        sc[t] = p_.scale * dot(qf, K + ((size_t)t * Hkv + kvh) * D, D);
        m = std::max(m, sc[t]);
      }
      float l = 0;
      for (int t = 0; t < nk; ++t) {
        sc[t] = std::exp(sc[t] - m);
        l += sc[t];
      }
      for (int d = 0; d < D; ++d) acc[d] = 0;
      for (int t = 0; t < nk; ++t) {
        const float* vr = V + ((size_t)t * Hkv + kvh) * D;
        const float w = sc[t];
        for (int d = 0; d < D; ++d) acc[d] += w * vr[d];
      }
      const float inv = 1.0f / l;
      for (int d = 0; d < D; ++d) store_elem(out, qoff + d, p_.dtype, acc[d] * inv);
    }
  }
}

void Baseline::run(const void* k_base, const void* v_base, const void* q, void* out) {
  std::atomic<int> next{0};
  const int n = (int)p_.query_lens.size();
  parallel(threads_, [&](int t) {
    for (int s; (s = next.fetch_add(1)) < n;) run_seq(t, s, k_base, v_base, q, out);
  });
}

MlaBaseline::MlaBaseline(const BaselineProblem& p, int threads) : p_(p), threads_(threads) {
  int64_t max_keys = 0;
  for (size_t i = 0; i < p_.query_lens.size(); ++i)
    max_keys = std::max<int64_t>(max_keys, (int64_t)p_.context_lens[i] + p_.query_lens[i]);
  k_.assign(threads, std::vector<float>((size_t)max_keys * p_.head_size));
  scores_.assign(threads, std::vector<float>((size_t)max_keys));
  qf_.assign(threads, std::vector<float>((size_t)p_.head_size));
  acc_.assign(threads, std::vector<float>((size_t)p_.value_size));
}

void MlaBaseline::run_seq(int tid, int s, const void* rows, const void* q_nope, const void* q_pe,
                          void* out) {
  const int H = p_.num_heads, D = p_.head_size, R = p_.value_size, bs = p_.block_size;
  const int ql = p_.query_lens[s], ctx = p_.context_lens[s];
  const int total = ctx + ql;
  if (ql == 0) return;
  float* K = k_[tid].data();
  const size_t csz = dtype_size(p_.cache_dtype);
  // 1. Gather the sequence's latent rows into contiguous [total][D] float32.
  for (int pos = 0; pos < total; ++pos) {
    int64_t blk = p_.tables[(size_t)s * p_.table_stride + pos / bs];
    int64_t off = blk * p_.strides[0] + (pos % bs) * p_.strides[1];
    const char* src = (const char*)rows + off * csz;
    float* dst = K + (size_t)pos * D;
    for (int d = 0; d < D; ++d) dst[d] = load_elem(src, d, p_.cache_dtype) * p_.k_scale;
  }
  // 2. Per query token and head: scores over all D values, softmax, weights x the leading R.
  float* sc = scores_[tid].data();
  float* qf = qf_[tid].data();
  float* acc = acc_[tid].data();
  for (int j = 0; j < ql; ++j) {
    const int64_t row = p_.query_start[s] + j;
    const int nk = ctx + j + 1;
    for (int h = 0; h < H; ++h) {
      const size_t qn = ((size_t)row * H + h) * R, qp = ((size_t)row * H + h) * (D - R);
      for (int d = 0; d < R; ++d) qf[d] = load_elem(q_nope, qn + d, p_.dtype);
      for (int d = R; d < D; ++d) qf[d] = load_elem(q_pe, qp + d - R, p_.dtype);
      float m = -INFINITY;
      for (int t = 0; t < nk; ++t) {
        sc[t] = p_.scale * dot(qf, K + (size_t)t * D, D);
        m = std::max(m, sc[t]);
      }
      float l = 0;
      for (int t = 0; t < nk; ++t) {
        sc[t] = std::exp(sc[t] - m);
        l += sc[t];
      }
      for (int d = 0; d < R; ++d) acc[d] = 0;
      for (int t = 0; t < nk; ++t) {
        const float* vr = K + (size_t)t * D;
        const float w = sc[t];
        for (int d = 0; d < R; ++d) acc[d] += w * vr[d];
      }
      const float inv = 1.0f / l;
      for (int d = 0; d < R; ++d) store_elem(out, qn + d, p_.dtype, acc[d] * inv);
    }
  }
}

void MlaBaseline::run(const void* rows, const void* q_nope, const void* q_pe, void* out) {
  std::atomic<int> next{0};
  const int n = (int)p_.query_lens.size();
  parallel(threads_, [&](int t) {
    for (int s; (s = next.fetch_add(1)) < n;) run_seq(t, s, rows, q_nope, q_pe, out);
  });
}

}  // namespace bench
