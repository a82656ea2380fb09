// The float64 reference attention, the tolerances and the comparison against it, and random
// sequence shapes for the suites (the case runner is case_runner.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>

#include "pagedattn_test_support.h"

namespace pat {

void ref_attend(const RefParams& p, int64_t nq, const float* q, const int64_t* qpos, int64_t nk,
                const float* k, const float* v, double* out, double* lse) {
  const int G = p.H / p.Hkv;
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(nk, 1)));
  std::vector<double> acc(static_cast<size_t>(p.D));
  for (int64_t i = 0; i < nq; ++i) {
    for (int h = 0; h < p.H; ++h) {
      const float* qv = q + (i * p.H + h) * p.D;
      const int kh = h / G;
      double m = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        bool visible = true;
        if (p.causal) {
          visible = j <= qpos[i] && (p.window <= 0 || qpos[i] - j < p.window) &&
                    (p.chunk <= 0 || j / p.chunk == qpos[i] / p.chunk);
          if (visible && p.tree && j >= p.tree_ctx)
            visible = p.tree[(qpos[i] - p.tree_ctx) * p.tree_q + (j - p.tree_ctx)] != 0;
        }
        if (!visible) {
          s[j] = -INFINITY;
          continue;
        }
        const float* kv = k + (j * p.Hkv + kh) * p.D;
        double dot = 0;
        for (int d = 0; d < p.D; ++d) dot += static_cast<double>(qv[d]) * kv[d];
        double sc = p.scale * dot;
        if (p.soft_cap > 0) sc = p.soft_cap * std::tanh(sc / p.soft_cap);
        if (p.alibi) sc += static_cast<double>(p.alibi[h]) * static_cast<double>(j - qpos[i]);
        s[j] = sc;
        // A NaN score makes the row's max NaN (as a float64 max over the row gives), and so
        // its every weight, output and log-sum-exp.
        if (std::isnan(sc) || sc > m) m = std::isnan(m) ? m : sc;
      }
      // The sink joins the softmax as one more logit without a value.
      const double sink = p.sinks ? static_cast<double>(p.sinks[h]) : -INFINITY;
      if (std::isnan(sink) || sink > m) m = std::isnan(m) ? m : sink;
      double* o = out + (i * p.H + h) * p.D;
      if (m == -INFINITY) {
        std::fill(o, o + p.D, 0.0);
        lse[i * p.H + h] = -INFINITY;
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = sink == -INFINITY ? 0.0 : std::exp(sink - m);
      for (int64_t j = 0; j < nk; ++j) {
        if (s[j] == -INFINITY) continue;
        const double w = std::exp(s[j] - m);
        sum += w;
        const float* vv = v + (j * p.Hkv + kh) * p.D;
        for (int d = 0; d < p.D; ++d) acc[d] += w * vv[d];
      }
      for (int d = 0; d < p.D; ++d) o[d] = acc[d] / sum;
      lse[i * p.H + h] = m + std::log(sum);
    }
  }
}

double tolerance(pagedattn_dtype dtype, pagedattn_dtype cache_dtype) {
  if (is_fp8(cache_dtype)) return 6e-2;
  switch (dtype) {
    case PAGEDATTN_DTYPE_FLOAT32: return 1e-5;
    case PAGEDATTN_DTYPE_FLOAT16: return 2e-3;
    default: return 2e-2;
  }
}

::testing::AssertionResult check_close(const char* what, const std::vector<double>& ref,
                                       const std::vector<float>& got, double tol,
                                       double* err_out) {
  if (ref.size() != got.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs reference "
                                         << ref.size();
  }
  double maxref = 0;
  for (double r : ref)
    if (std::isfinite(r)) maxref = std::max(maxref, std::fabs(r));
  if (maxref == 0) maxref = 1;
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) {
      const bool same = std::isnan(ref[i]) ? std::isnan(got[i]) : got[i] == ref[i];
      if (!same) {
        return ::testing::AssertionFailure() << what << ": flat index " << i << " is " << got[i]
                                             << ", reference " << ref[i]
                                             << " (a non-finite input must propagate)";
      }
      continue;
    }
    if (!std::isfinite(got[i])) {
      return ::testing::AssertionFailure() << what << ": " << got[i] << " at flat index " << i
                                           << " (reference " << ref[i] << ")";
    }
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(e <= worst)) {
      worst = e;
      wi = i;
    }
  }
  const double rel = worst / maxref;
  if (err_out) *err_out = rel;
  if (!(rel <= tol)) {
    return ::testing::AssertionFailure()
           << what << ": max|got-ref|/max|ref| = " << rel << " > " << tol << " (flat index "
           << wi << ": got " << got[wi] << ", reference " << ref[wi] << ", max|ref| " << maxref
           << ")";
  }
  return ::testing::AssertionSuccess();
}

std::vector<SeqSpec> random_decode_seqs(std::mt19937_64& rng, int n, int max_ctx) {
  std::vector<SeqSpec> v(n);
  for (int i = 0; i < n; ++i) {
    v[i].qlen = 1;
    const int r = static_cast<int>(rng() % 8);
    v[i].ctx = r == 0 ? 0 : r == 1 ? 1 : static_cast<int>(rng() % (max_ctx + 1));
  }
  return v;
}

std::vector<SeqSpec> random_prefill_seqs(std::mt19937_64& rng, int n, int max_q) {
  std::vector<SeqSpec> v(n);
  for (int i = 0; i < n; ++i) {
    v[i].qlen = (rng() % 6 == 0) ? 1 : 1 + static_cast<int>(rng() % max_q);
    v[i].ctx = 0;
  }
  return v;
}

std::vector<SeqSpec> random_chunked_seqs(std::mt19937_64& rng, int n, int min_len, int max_len) {
  std::vector<SeqSpec> v(n);
  for (int i = 0; i < n; ++i) {
    v[i].qlen = min_len + static_cast<int>(rng() % (max_len - min_len + 1));
    v[i].ctx = min_len + static_cast<int>(rng() % (max_len - min_len + 1));
  }
  return v;
}

std::vector<SeqSpec> random_mixed_seqs(std::mt19937_64& rng, int n, int max_q, int max_ctx,
                                       bool idle_entries) {
  std::vector<SeqSpec> v(n);
  for (int i = 0; i < n; ++i) {
    switch (rng() % (idle_entries ? 5 : 4)) {
      case 0: v[i].qlen = 1; v[i].ctx = static_cast<int>(rng() % (max_ctx + 1)); break;
      case 1: v[i].qlen = 1 + static_cast<int>(rng() % max_q); v[i].ctx = 0; break;
      case 2:
        v[i].qlen = 1 + static_cast<int>(rng() % max_q);
        v[i].ctx = static_cast<int>(rng() % (max_ctx + 1));
        break;
      case 3: v[i].qlen = 1; v[i].ctx = 1 + static_cast<int>(rng() % (max_ctx)); break;
      default: v[i].qlen = 0; v[i].ctx = static_cast<int>(rng() % (max_ctx + 1)); break;
    }
  }
  if (idle_entries && n > 1) {
    bool any_active = false;
    for (auto& s : v) any_active |= s.qlen > 0;
    if (!any_active) v[0].qlen = 1;
  }
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

}  // namespace pat
