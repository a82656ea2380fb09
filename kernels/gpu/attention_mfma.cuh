// attention_mfma.cuh — decode and prefill tiles of 16-bit queries on AMD's matrix cores (CDNA,
// wave 64), the sibling of attention_mma.cuh: v_mfma_f32_16x16x16 (f16, bf16_1k) with S, P and
// O in registers and the online softmax of FlashAttention-2. A CTA's rows (tile tokens x the
// query heads of one GQA group, as in attention_kernel) are WAVES waves of 16 rows: 4 for
// prefill tiles (64 rows), 1 for decode (one token's heads of the group, up to 8, padded to 16),
// so each K/V byte is read once per group. Each wave computes the transposed products,
// S^T = K.Q^T and O^T = V^T.P^T: the 16x16x16 accumulator layout (row 4 (l / 16) + i, column
// l % 16) then gives lane l one query row (l % 16) in both, and S^T's accumulators are, rounded
// to T, exactly P^T's B fragments, with no exchange between lanes. A row's softmax reduces over
// the four lanes l % 16 + 16 j (two xor shuffles). Q's B fragments stay in registers; shared
// memory holds one chunk of K and V as T (an fp8 cache is converted on the way in), 64 KiB LDS
// or less at every head size. Split-KV decode items write float32 partials for
// split_merge_kernel.
//
// Built where PA_MFMA_TILES is (every HIP pass); attention.cuh's launch_attention_one sends
// 16-bit tiles here on a device with matrix cores (gfx90a, gfx94x and the emulator's wave-64
// HIP configuration). Other device passes compile the kernel to an empty body.
#ifndef PAGEDATTN_GPU_ATTENTION_MFMA_CUH
#define PAGEDATTN_GPU_ATTENTION_MFMA_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "gpu_kernels.h"
#include "mfma.cuh"
#include "staging.cuh"
#include "types.cuh"
#include "variant.cuh"
#include "vendor.cuh"

#if defined(PA_MFMA_TILES)

namespace pagedattn_gpu {

template <int DMAX, int WAVES>
struct MfmaLayout {
  static constexpr int kR = WAVES * 16;  // rows, 16 per wave
  static constexpr int kNT = WAVES * 64;
  static constexpr int kChunk = 32;                    // keys per chunk: two 16-key k-tiles
  static constexpr int kDP = ((DMAX + 15) / 16) * 16;  // staged head size (zero padded)
  // Elements per staged row: 16 bytes of padding shift consecutive rows by four banks, and
  // keep the 16-byte stores of staging aligned.
  static constexpr int kLd = kDP + 8;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + 2u * kChunk * kLd;
  static constexpr size_t kBytes = kV + 2u * kChunk * kLd;
};

// d += a * b (16x16 float32 += 16x16 by 16x16 in the query type).
template <typename T>
__device__ __forceinline__ void mfma16(float d[4], const uint32_t a[2], const uint32_t b[2]) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    mfma_16x16x16_bf16(d, a, b, d);
  } else {
    mfma_16x16x16_f16(d, a, b, d);
  }
}

// Stages keys [c0, c0 + nk) of the CTA's KV head into ks/vs as T (rows of kLd elements), zero
// beyond the head size and beyond nk: a cache of type T in units of p.kv.vec bytes, an fp8 one
// 8 elements at a time through stage8's conversion.
template <typename T, typename KT, int DMAX, int WAVES>
__device__ __forceinline__ void mfma_stage_kv(const AttnParams& p, const CtaWork& w, T* ks,
                                              T* vs, int c0, int nk) {
  using L = MfmaLayout<DMAX, WAVES>;
  constexpr int G = L::kDP / 8;  // 8-element groups of a staged row
  const int D = p.head_size;
  for (int i = threadIdx.x; i < L::kChunk * G; i += L::kNT) {
    const int key = i / G, d0 = (i % G) * 8;
    T* kd = ks + key * L::kLd + d0;
    T* vd = vs + key * L::kLd + d0;
    if (key < nk && d0 < D) {
      int64_t koff, voff;
      key_offsets(p, w.seq, w.kvh, c0 + key, &koff, &voff);
      const KT* kp = static_cast<const KT*>(p.kv.k) + koff + d0;
      const KT* vp = static_cast<const KT*>(p.kv.v) + voff + d0;
      if constexpr (std::is_same<KT, T>::value) {
        const int vec = p.kv.vec < 16 ? p.kv.vec : 16;
        for (int b = 0; b < 16; b += vec) {
          copy_unit(reinterpret_cast<char*>(kd) + b, reinterpret_cast<const char*>(kp) + b, vec);
          copy_unit(reinterpret_cast<char*>(vd) + b, reinterpret_cast<const char*>(vp) + b, vec);
        }
      } else {
        static_assert(sizeof(KT) == 1, "caches of another type than the queries' are fp8");
        uint2 kr, vr;
        memcpy(&kr, kp, 8);
        memcpy(&vr, vp, 8);
        stage8<T, KT>(kd, reinterpret_cast<const KT*>(&kr));
        stage8<T, KT>(vd, reinterpret_cast<const KT*>(&vr));
      }
    } else {
      st_shared(reinterpret_cast<uint4*>(kd), make_uint4(0, 0, 0, 0));
      st_shared(reinterpret_cast<uint4*>(vd), make_uint4(0, 0, 0, 0));
    }
  }
}

// Every score goes through variant_logit (soft cap, ALiBi, causal order, window, chunk and tree
// masks), in the log2 domain for exp2.
template <typename T, typename KT, int DMAX, int WAVES>
__global__ void __launch_bounds__(WAVES * 64)  // MfmaLayout::kNT (no comma: a macro)
    attention_mfma_kernel(const AttnParams p) {
#if !defined(PA_HAS_MFMA)
  // A pass without matrix cores (the host's, RDNA's, gfx908's): never launched there.
  (void)p;
#else
  using L = MfmaLayout<DMAX, WAVES>;
  constexpr int CHUNK = L::kChunk, DP = L::kDP, LD = L::kLd;
  constexpr int KT16 = DP / 16;    // 16-wide slices of the head size (Q fragments, O tiles)
  constexpr int MT = CHUNK / 16;   // 16-key tiles of a chunk
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  static_assert(PA_WARP_SIZE == 64, "MFMA tiles need a 64-lane wave");

  if (static_cast<int32_t>(blockIdx.x) >= *p.num_items) return;
  const WorkItem it = p.items[blockIdx.x];

  PA_DYNAMIC_SHARED(16, mfma_smem);
  T* ks = reinterpret_cast<T*>(mfma_smem + L::kK);
  T* vs = reinterpret_cast<T*>(mfma_smem + L::kV);

  const int tid = threadIdx.x;
  const int wave = tid / 64, lane = tid % 64;
  const int col = lane & 15, quad = lane >> 4;  // accumulator column (the row) and k quarter
  const int D = p.head_size;
  const int hpc = p.heads_per_cta;
  const CtaWork w = cta_work(p, it);
  const int lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;

  // This lane's query row: wave * 16 + col.
  const int r = wave * 16 + col;
  const int ti = r / hpc, gi = r % hpc;
  const bool valid = r < rows_used && gi < w.gh;
  const int head = w.h0 + gi, qpos = w.pos_first + ti, qrow = w.row0 + ti;
  const bool active = wave * 16 < rows_used;  // wave-uniform: waves past the rows only stage

  // Q^T's B fragments: head dims kk * 16 + 4 quad .. + 3 of the lane's row, zero where unused.
  uint32_t qb[KT16][2];
#pragma unroll
  for (int kk = 0; kk < KT16; ++kk) {
    uint16_t e[4] = {0, 0, 0, 0};
    const int d0 = kk * 16 + 4 * quad;
    if (valid && d0 < D) {
      const T* src = static_cast<const T*>(p.q) + static_cast<int64_t>(qrow) * p.q_row +
                     static_cast<int64_t>(head) * p.q_head + d0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (d0 + i < D) e[i] = static_cast<uint16_t>(bits16(ld_global(src + i, kUseQ)));
    }
    qb[kk][0] = e[0] | static_cast<uint32_t>(e[1]) << 16;
    qb[kk][1] = e[2] | static_cast<uint32_t>(e[3]) << 16;
  }

  float o[KT16][4];  // O^T: head dims kk * 16 + 4 quad + i of the lane's row
#pragma unroll
  for (int n = 0; n < KT16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m = -INFINITY, l = 0.f;  // m: log2 domain; l: this lane's part of the row's sum

  for (int c0 = lo; c0 < hi; c0 += CHUNK) {
    const int nk = min(CHUNK, hi - c0);
    mfma_stage_kv<T, KT, DMAX, WAVES>(p, w, ks, vs, c0, nk);
    __syncthreads();
    if (active) {
      // S^T = K.Q^T per 16-key tile: A fragments of K (key col, dims 4 quad .. + 3: 8 bytes).
      float s[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        s[mt][0] = s[mt][1] = s[mt][2] = s[mt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KT16; ++kk) {
          const uint2 kf =
              ld_shared(reinterpret_cast<const uint2*>(ks + (mt * 16 + col) * LD + kk * 16 +
                                                       4 * quad));
          const uint32_t ka[2] = {kf.x, kf.y};
          mfma16<T>(s[mt], ka, qb[kk]);
        }
      }
      // Logits of keys c0 + mt * 16 + 4 quad + i for the lane's row, then the online softmax
      // over the row's four lanes (xor 16, 32).
      float mx = -INFINITY;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = c0 + mt * 16 + 4 * quad + i;
          const float x = (valid && key < hi)
                              ? variant_logit(p, w, s[mt][i] * w.qk_scale, head, key, qpos) * kLog2e
                              : -INFINITY;
          s[mt][i] = x;
          mx = max_keep_nan(mx, x);
        }
      }
      mx = max_keep_nan(mx, PA_SHFL_XOR(mx, 16));
      mx = max_keep_nan(mx, PA_SHFL_XOR(mx, 32));
      const float m_new = max_keep_nan(m, mx);
      // A row without a finite logit yet subtracts 0; a poisoned row's output is NaN by
      // row_norm whatever its weights.
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m - m_ref);
      float sum = 0.f;
      uint32_t pb[MT][2];  // P^T's B fragments: keys 4 quad + i of tile mt, the lane's row
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float pe = exp2f(s[mt][i] - m_ref);
          s[mt][i] = pe;
          sum += pe;
        }
        pb[mt][0] = pack_half2<T>(s[mt][0], s[mt][1]);
        pb[mt][1] = pack_half2<T>(s[mt][2], s[mt][3]);
      }
      l = l * alpha + sum;
      m = m_new;
      if (alpha != 1.f) {
#pragma unroll
        for (int n = 0; n < KT16; ++n) {
          o[n][0] *= alpha;
          o[n][1] *= alpha;
          o[n][2] *= alpha;
          o[n][3] *= alpha;
        }
      }
      // O^T += V^T.P^T: A fragments of V^T (head dim jd * 16 + col, keys 4 quad .. + 3).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const T* vrow = vs + (mt * 16 + 4 * quad) * LD + col;
#pragma unroll
        for (int jd = 0; jd < KT16; ++jd) {
          uint32_t va[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t e0 = bits16(ld_shared(vrow + (2 * h) * LD + jd * 16));
            const uint32_t e1 = bits16(ld_shared(vrow + (2 * h + 1) * LD + jd * 16));
            va[h] = e0 | e1 << 16;
          }
          mfma16<T>(o[jd], va, pb[mt]);
        }
      }
    }
    __syncthreads();  // the chunk just read is the one the next iteration refills
  }

  if (!active) return;
  l += PA_SHFL_XOR(l, 16);
  l += PA_SHFL_XOR(l, 32);
  if (!valid) return;
  // The output row, or for a split-KV part its float32 partial (normalised, merged later).
  const bool whole = it.part < 0;
  const RowNorm nr = row_norm(m * kLn2, l, row_sink(p.sinks, head, !whole), w.v_scale);
  // A row whose keys all weighed nothing gives 0 (NaN when poisoned), whatever 0 * inf its
  // accumulators took from an infinite V.
  auto value = [&](int n, int i) { return l > 0.f ? o[n][i] * nr.inv : 0.f * nr.inv; };
  if (whole) {
    T* out = static_cast<T*>(p.out) + static_cast<int64_t>(qrow) * p.o_row +
             static_cast<int64_t>(head) * p.o_head;
#pragma unroll
    for (int n = 0; n < KT16; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = n * 16 + 4 * quad + i;
        if (d < D) st_global(out + d, from_float<T>(value(n, i)), kUseOut);
      }
    }
  } else {
    float* part = p.part_o + (static_cast<int64_t>(it.part) * p.num_heads + head) * D;
#pragma unroll
    for (int n = 0; n < KT16; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = n * 16 + 4 * quad + i;
        if (d < D) st_global(part + d, value(n, i), kUseOut);
      }
    }
  }
  if (quad != 0) return;
  if (!whole)
    st_global(p.part_lse + static_cast<int64_t>(it.part) * p.num_heads + head, nr.lse, kUseOut);
  else if (p.lse)
    st_global(p.lse + static_cast<int64_t>(qrow) * p.lse_row + head * p.lse_head, nr.lse,
              kUseOut);
#endif  // PA_HAS_MFMA
}

template <typename T, typename KT, int DMAX, int WAVES>
gpuError_t launch_attention_mfma(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  using L = MfmaLayout<DMAX, WAVES>;
  static_assert(L::kBytes <= 48 * 1024, "an MFMA tile fits the default LDS of a block");
  static_assert((WAVES == 1 ? kDecodeRows : kPrefillRows) <= L::kR, "a tile's rows must fit");
  auto kernel = attention_mfma_kernel<T, KT, DMAX, WAVES>;
  const int nhg = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_kv_heads * nhg));
  PA_LAUNCH(kernel, grid, L::kNT, L::kBytes, stream)(p);
  return gpuGetLastError();
}

}  // namespace pagedattn_gpu

#endif  // PA_MFMA_TILES

#endif  // PAGEDATTN_GPU_ATTENTION_MFMA_CUH
