// attention_mma.cuh — decode and prefill tiles of 16-bit queries on tensor cores,
// FlashAttention-2 style: mma.sync m16n8k16 with S, P and O in registers. A CTA's rows (tile
// tokens x the query heads of one GQA group, as in attention_kernel) are WARPS warps of 16 rows:
// 4 for prefill tiles (64 rows), 1 for decode (one token's heads of the group, up to 8, padded
// to 16). Each warp keeps its rows' scores, weights, output accumulators and online-softmax
// state in registers, so shared memory holds only Q and two stages of K/V (cp.async brings chunk
// n+1 while chunk n is computed on). K and V arrive as the query type: a cache of that type is
// copied as it is, an fp8 cache is converted on the way in, once per element for the whole
// group. Split-KV decode items write float32 partials for split_merge_kernel.
//
// Only where PA_HAS_MMA_SYNC is defined (CUDA sm_80+ and the emulator's CUDA configuration);
// attention.cuh's launch_attention_one sends those tiles here.
#ifndef PAGEDATTN_GPU_ATTENTION_MMA_CUH
#define PAGEDATTN_GPU_ATTENTION_MMA_CUH

#include <stdint.h>
#include <string.h>

#include <atomic>
#include <type_traits>

#include "gpu_kernels.h"
#include "mma.cuh"
#include "staging.cuh"
#include "types.cuh"
#include "variant.cuh"
#include "vendor.cuh"

#if defined(PA_HAS_MMA_SYNC)

namespace pagedattn_gpu {

template <int DMAX, int WARPS>
struct MmaLayout {
  static constexpr int kR = WARPS * 16;                  // rows, 16 per warp
  static constexpr int kNT = WARPS * 32;
  // Keys per stage: a decode CTA (one warp) stages half as many, so that twice as many CTAs fit
  // an SM and more chunks are in flight.
  static constexpr int kChunk = (DMAX <= 128 ? 64 : 32) / (WARPS == 1 ? 2 : 1);
  static constexpr int kDP = ((DMAX + 15) / 16) * 16;    // staged head size (zero padded)
  // Elements per staged row: 16 bytes of padding put the 8 rows an ldmatrix reads in distinct
  // bank groups (and keep every row 16-byte aligned, as ldmatrix needs).
  static constexpr int kLd = kDP + 8;
  static constexpr size_t kQ = 0;
  static constexpr size_t kStage0 = kQ + 2u * kR * kLd;         // then K, V of stage 0, 1
  static constexpr size_t kStageBytes = 2u * 2u * kChunk * kLd;  // K and V of one stage
  static constexpr size_t kBytes = kStage0 + 2u * kStageBytes;
};

__device__ __forceinline__ uint32_t bits16(bf16_t x) { return x.bits; }
__device__ __forceinline__ uint32_t bits16(f16_t x) { return __half_as_ushort(x); }

// Two floats as one register of an mma operand: the lower-numbered element in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return bits16(from_float<T>(lo)) | (bits16(from_float<T>(hi)) << 16);
}

// d += a * b (16x8 float32 += 16x16 by 16x8, in the query type).
template <typename T>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    mma_m16n8k16_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_f16(d, a, b, d);
  }
}

// Stages keys [c0, c0 + nk) of the CTA's KV head into ks/vs as T (rows of kLd elements), zero
// beyond the head size and beyond nk. A cache of type T is copied asynchronously (the caller
// commits and waits); an fp8 one is loaded into registers 8 groups at a time, then converted, so
// those loads are in flight at once rather than each waiting for the one before.
template <typename T, typename KT, int DMAX, int WARPS>
__device__ __forceinline__ void stage_kv(const AttnParams& p, const CtaWork& w, T* ks, T* vs,
                                         int c0, int nk, bool aligned) {
  using L = MmaLayout<DMAX, WARPS>;
  constexpr int G = L::kDP / 8;  // 8-element groups of a staged row
  constexpr int kIters = (L::kChunk * G + L::kNT - 1) / L::kNT;
  const int D = p.head_size;
  if constexpr (std::is_same<KT, T>::value) {
    // Where each group's rows are first (the block-table reads all in flight together), then
    // the copies: a copy waiting on its own table read would serialise their latencies.
    int64_t koff[kIters];
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      const int i = threadIdx.x + n * L::kNT;
      const int key = i / G, d0 = (i % G) * 8;
      koff[n] = -1;
      if (i < L::kChunk * G && key < nk && d0 < D) {
        int64_t voff;
        key_offsets(p, w.seq, w.kvh, c0 + key, &koff[n], &voff);
      }
    }
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      const int i = threadIdx.x + n * L::kNT;
      if (i >= L::kChunk * G) break;
      const int key = i / G, d0 = (i % G) * 8;
      T* kd = ks + key * L::kLd + d0;
      T* vd = vs + key * L::kLd + d0;
      if (koff[n] >= 0) {
        int64_t voff = koff[n];  // paged: V's row is at K's offset in its own buffer
        if (!p.kv.paged) {
          int64_t k_unused;
          key_offsets(p, w.seq, w.kvh, c0 + key, &k_unused, &voff);
        }
        const char* kp =
            reinterpret_cast<const char*>(static_cast<const KT*>(p.kv.k) + koff[n] + d0);
        const char* vp = reinterpret_cast<const char*>(static_cast<const KT*>(p.kv.v) + voff + d0);
        for (int b = 0; b < 16; b += p.kv.vec) {
          copy_unit_async(reinterpret_cast<char*>(kd) + b, kp + b, p.kv.vec);
          copy_unit_async(reinterpret_cast<char*>(vd) + b, vp + b, p.kv.vec);
        }
      } else {
        st_shared(reinterpret_cast<uint4*>(kd), make_uint4(0, 0, 0, 0));
        st_shared(reinterpret_cast<uint4*>(vd), make_uint4(0, 0, 0, 0));
      }
    }
  } else {
    static_assert(sizeof(KT) == 1, "caches of another type than the queries' are fp8");
    constexpr int kBatch = kIters < 8 ? kIters : 8;  // groups in registers at once
#pragma unroll 1
    for (int n0 = 0; n0 < kIters; n0 += kBatch) {
      uint2 kr[kBatch], vr[kBatch];  // 8 fp8 elements each; zero where nothing is staged
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        const int i = threadIdx.x + (n0 + n) * L::kNT;
        const int key = i / G, d0 = (i % G) * 8;
        kr[n] = vr[n] = make_uint2(0, 0);
        if (i < L::kChunk * G && key < nk && d0 < D) {
          int64_t koff, voff;
          key_offsets(p, w.seq, w.kvh, c0 + key, &koff, &voff);
          const KT* kp = static_cast<const KT*>(p.kv.k) + koff + d0;
          const KT* vp = static_cast<const KT*>(p.kv.v) + voff + d0;
          if (aligned) {
            kr[n] = ld_global(reinterpret_cast<const uint2*>(kp), kUseKV);
            vr[n] = ld_global(reinterpret_cast<const uint2*>(vp), kUseKV);
          } else {
            memcpy(&kr[n], kp, 8);
            memcpy(&vr[n], vp, 8);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        const int i = threadIdx.x + (n0 + n) * L::kNT;
        if (i >= L::kChunk * G) break;
        const int key = i / G, d0 = (i % G) * 8;
        stage8<T, KT>(ks + key * L::kLd + d0, reinterpret_cast<const KT*>(&kr[n]));
        stage8<T, KT>(vs + key * L::kLd + d0, reinterpret_cast<const KT*>(&vr[n]));
      }
    }
  }
}

// Resident CTAs per SM the shared memory allows (2 prefill, 4+ decode), told to ptxas so that it
// sizes registers for them rather than for more.
template <typename T, typename KT, int DMAX, int WARPS>
__global__ void __launch_bounds__(MmaLayout<DMAX, WARPS>::kNT, WARPS == 1 ? 4 : 2)
    attention_mma_kernel(const AttnParams p) {
  using L = MmaLayout<DMAX, WARPS>;
  constexpr int R = L::kR, NT = L::kNT, CHUNK = L::kChunk, DP = L::kDP, LD = L::kLd;
  constexpr int NS = CHUNK / 8;  // score n-tiles of a warp's 16 rows
  constexpr int NO = DP / 8;     // output n-tiles
  static_assert(NS % 2 == 0 && DP % 16 == 0, "pairs of n-tiles per ldmatrix_x4");

  if (static_cast<int32_t>(blockIdx.x) >= *p.num_items) return;
  const WorkItem it = p.items[blockIdx.x];

  PA_DYNAMIC_SHARED(128, mma_smem);
  T* qs = reinterpret_cast<T*>(mma_smem + L::kQ);
  // Stage s: K at stage_k(s), V CHUNK rows after it (computed, not indexed: no local memory).
  auto stage_k = [&](int s) {
    return reinterpret_cast<T*>(mma_smem + L::kStage0 + s * L::kStageBytes);
  };

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment row group and thread in group
  const int D = p.head_size;
  const int hpc = p.heads_per_cta;
  const CtaWork w = cta_work(p, it);
  const int lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;

  // Q as T, zero beyond the rows, heads and head size used.
  for (int i = tid; i < R * (DP / 8); i += NT) {
    const int r = i / (DP / 8), d0 = (i % (DP / 8)) * 8;
    const int ti = r / hpc, gi = r % hpc;
    T* dst = qs + r * LD + d0;
    if (r < rows_used && gi < w.gh && d0 < D) {
      const T* src = static_cast<const T*>(p.q) + static_cast<int64_t>(w.row0 + ti) * p.q_row +
                     static_cast<int64_t>(w.h0 + gi) * p.q_head + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) st_shared(dst + e, ld_global(src + e, kUseQ));
    } else {
      st_shared(reinterpret_cast<uint4*>(dst), make_uint4(0, 0, 0, 0));
    }
  }

  // This lane's two rows of its warp's 16: g and g + 8.
  bool valid[2];
  int head[2], qpos[2], qrow[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = warp * 16 + g + 8 * hr;
    const int ti = r / hpc, gi = r % hpc;
    valid[hr] = r < rows_used && gi < w.gh;
    head[hr] = w.h0 + gi;
    qpos[hr] = w.pos_first + ti;
    qrow[hr] = w.row0 + ti;
  }
  const bool active = warp * 16 < rows_used;  // warp-uniform: warps past the rows only stage
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const bool aligned = p.kv.vec >= static_cast<int>(8 * sizeof(KT)) || p.kv.vec == 16;
  const int nchunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
  if (nchunks > 0) {
    stage_kv<T, KT, DMAX, WARPS>(p, w, stage_k(0), stage_k(0) + CHUNK * LD, lo, min(CHUNK, hi - lo),
                          aligned);
    async_commit();
  }
  for (int c = 0; c < nchunks; ++c) {
    const int c0 = lo + c * CHUNK;
    if (c + 1 < nchunks) {  // the next chunk streams in while this one is computed on
      const int n0 = c0 + CHUNK;
      T* kn = stage_k((c + 1) & 1);
      stage_kv<T, KT, DMAX, WARPS>(p, w, kn, kn + CHUNK * LD, n0, min(CHUNK, hi - n0), aligned);
      async_commit();
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    if (active) {
      const T* ks = stage_k(c & 1);
      const T* vs = ks + CHUNK * LD;
      // S = Q.K^T: A fragments of Q, B fragments of two key n-tiles per ldmatrix_x4.
      float s[NS][4];
#pragma unroll
      for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk) {
        uint32_t qa[4];
        ldmatrix_x4(qa, qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int jj = 0; jj < NS / 2; ++jj) {
          // Matrix lane / 8: keys 8 (m / 2) .. + 7 of the pair, dims 8 (m % 2) .. + 7.
          const int mi = lane >> 3;
          uint32_t kb[4];
          ldmatrix_x4(kb, ks + (jj * 16 + (mi >> 1) * 8 + (lane & 7)) * LD + kk * 16 +
                              (mi & 1) * 8);
          mma16816<T>(s[2 * jj], qa, kb);
          mma16816<T>(s[2 * jj + 1], qa, kb + 2);
        }
      }
      // Logits (scale, soft cap, ALiBi, masks; -inf for keys past the chunk and unused rows),
      // then the online softmax of each row over the 4 lanes that hold it.
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = c0 + j * 8 + 2 * t4 + e;
            float x = -INFINITY;
            if (valid[hr] && key < hi)
              x = variant_logit(p, w, s[j][2 * hr + e] * w.qk_scale, head[hr], key, qpos[hr]);
            s[j][2 * hr + e] = x;
            mx = max_keep_nan(mx, x);
          }
        }
        mx = max_keep_nan(mx, PA_SHFL_XOR(mx, 1));
        mx = max_keep_nan(mx, PA_SHFL_XOR(mx, 2));
        const float m_new = max_keep_nan(m[hr], mx);
        const bool poisoned = max_poisoned(m_new);
        const float alpha = (m[hr] == -INFINITY || poisoned) ? 0.f : __expf(m[hr] - m_new);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = s[j][2 * hr + e];
            const float pe = (x == -INFINITY || poisoned) ? 0.f : __expf(x - m_new);
            s[j][2 * hr + e] = pe;
            sum += pe;
          }
        }
        l[hr] = l[hr] * alpha + sum;  // this lane's part; the quad's are added at the end
        m[hr] = m_new;
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          o[n][2 * hr] *= alpha;
          o[n][2 * hr + 1] *= alpha;
        }
      }
      // O += P.V: the weights, rounded to T, are the A fragments as they lie in s; V's B
      // fragments of two dim n-tiles per transposed ldmatrix_x4.
#pragma unroll
      for (int kk = 0; kk < CHUNK / 16; ++kk) {
        const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                                pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int jd = 0; jd < DP / 16; ++jd) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, vs + (kk * 16 + (lane & 15)) * LD + jd * 16 + (lane >> 4) * 8);
          mma16816<T>(o[2 * jd], pa, vb);
          mma16816<T>(o[2 * jd + 1], pa, vb + 2);
        }
      }
    }
    __syncthreads();  // the stage just read is the one the next iteration refills
  }

  if (!active) return;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += PA_SHFL_XOR(l[hr], 1);
    l[hr] += PA_SHFL_XOR(l[hr], 2);
  }
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (!valid[hr]) continue;
    // The output row, or for a split-KV part its float32 partial (normalised, merged later).
    const bool whole = it.part < 0;
    const RowNorm nr = row_norm(m[hr], l[hr], row_sink(p.sinks, head[hr], !whole), w.v_scale);
    T* out = nullptr;
    float* part = nullptr;
    if (whole)
      out = static_cast<T*>(p.out) + static_cast<int64_t>(qrow[hr]) * p.o_row +
            static_cast<int64_t>(head[hr]) * p.o_head;
    else
      part = p.part_o + (static_cast<int64_t>(it.part) * p.num_heads + head[hr]) * D;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t4 + e;
        if (d >= D) continue;
        // A row whose keys all weighed nothing gives 0 (NaN when poisoned), whatever 0 * inf
        // its accumulators took from an infinite V.
        const float x = l[hr] > 0.f ? o[n][2 * hr + e] * nr.inv : 0.f * nr.inv;
        if (whole)
          st_global(out + d, from_float<T>(x), kUseOut);
        else
          st_global(part + d, x, kUseOut);
      }
    }
    if (t4 != 0) continue;
    if (!whole)
      st_global(p.part_lse + static_cast<int64_t>(it.part) * p.num_heads + head[hr], nr.lse,
                kUseOut);
    else if (p.lse)
      st_global(p.lse + static_cast<int64_t>(qrow[hr]) * p.lse_row + head[hr] * p.lse_head,
                nr.lse, kUseOut);
  }
}

template <typename T, typename KT, int DMAX, int WARPS>
gpuError_t launch_attention_mma(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  using L = MmaLayout<DMAX, WARPS>;
  static_assert(L::kBytes <= static_cast<size_t>(kSmallSmem),
                "a tensor-core tile exceeds the shared memory of the smallest devices served");
  static_assert((WARPS == 1 ? kDecodeRows : kPrefillRows) <= L::kR, "a tile's rows must fit");
  auto kernel = attention_mma_kernel<T, KT, DMAX, WARPS>;
  if (L::kBytes > 48 * 1024) {
    static std::atomic<uint64_t> smem_set{0};
    const gpuError_t attr = raise_smem_limit(kernel, static_cast<int>(L::kBytes), smem_set);
    if (attr != gpuSuccess) return attr;
  }
  const int nhg = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_kv_heads * nhg));
  PA_LAUNCH(kernel, grid, L::kNT, L::kBytes, stream)(p);
  return gpuGetLastError();
}

}  // namespace pagedattn_gpu

#endif  // PA_HAS_MMA_SYNC

#endif  // PAGEDATTN_GPU_ATTENTION_MMA_CUH
