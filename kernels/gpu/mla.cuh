// mla.cuh — multi-head latent attention over a latent cache (docs/semantics.md section 8): every
// query head scores each key's one row of kMlaRow values and weighs the row's leading kMlaValue.
//
// A CTA owns kMlaRows rows: the query heads of one token (16 of them, or all when fewer), or for
// fewer heads several tokens of one sequence, so each key's row is read from memory once for all
// of them. Scores are a [rows x keys] GEMM over the row, the output a [rows x kMlaValue] GEMM
// over the keys, an online softmax between them; the variant rules (masks, logits, sinks) are
// variant.cuh's. Two kernels:
//  - mla_mma_kernel (PA_HAS_MMA_SYNC, 16-bit queries): 4 warps, one 16-row m-tile. Shared memory
//    holds Q and two stages of 32 keys (cp.async brings chunk n+1 while chunk n is computed on).
//    Warp w scores keys 8w..8w+7 of a chunk over the whole row (mma.sync on ldmatrix fragments),
//    the chunk's row maxima meet in shared memory, the weights go there as the query type, and
//    warp w accumulates output columns 128w..128w+127 of all 16 rows from them.
//  - mla_scalar_kernel (float32 queries, and every tile without mma.sync: HIP): 256 threads,
//    Q in float32 and one stage of keys in shared memory, a thread per (key, row) dot product,
//    a warp per row's softmax, 4 output units of 8 values per thread.
// Split-KV decode items write float32 partials that split_merge_kernel combines.
#ifndef PAGEDATTN_GPU_MLA_CUH
#define PAGEDATTN_GPU_MLA_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <type_traits>

#include "gpu_kernels.h"
#include "instantiations.h"
#include "mma.cuh"
#include "staging.cuh"
#include "types.cuh"
#include "variant.cuh"
#include "vendor.cuh"

namespace pagedattn_gpu {

// The CTA's work item, narrowed to its sub-tile (blockIdx.z) of tile_tokens tokens; false when
// the item has no token there (or there is no item).
__device__ __forceinline__ bool mla_item(const MlaParams& p, WorkItem* it) {
  if (static_cast<int32_t>(blockIdx.x) >= *p.a.num_items) return false;
  *it = p.a.items[blockIdx.x];
  const int first = static_cast<int>(blockIdx.z) * p.a.tile_tokens;
  if (first >= it->tlen) return false;
  it->t0 += first;
  it->tlen = min(p.a.tile_tokens, it->tlen - first);
  return true;
}

// Element e of row r's query (r = token * heads_per_cta + head in the CTA): q's leading q_lead
// values, then q_pe's.
template <typename T>
__device__ __forceinline__ const T* mla_q_row(const MlaParams& p, const CtaWork& w, int r,
                                              int e) {
  const int ti = r / p.a.heads_per_cta, gi = r % p.a.heads_per_cta;
  const int64_t row = w.row0 + ti, h = w.h0 + gi;
  if (e < p.q_lead) return static_cast<const T*>(p.a.q) + row * p.a.q_row + h * p.a.q_head + e;
  return static_cast<const T*>(p.q_pe) + row * p.qpe_row + h * p.qpe_head + (e - p.q_lead);
}

// Stores 8 values as T at o: 16-byte stores where o is aligned for them, else one at a time.
template <typename T>
__device__ __forceinline__ void mla_store8(T* o, const float* x) {
  __align__(16) T v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = from_float<T>(x[e]);
  if ((reinterpret_cast<uintptr_t>(o) & 15) == 0) {
#pragma unroll
    for (int b = 0; b < static_cast<int>(sizeof(v)); b += 16)
      st_global(reinterpret_cast<uint4*>(reinterpret_cast<char*>(o) + b),
                *reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(v) + b), kUseOut);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) st_global(o + e, v[e], kUseOut);
  }
}

// ---------------------------------------------------------------------------------------------
// The scalar kernel.

template <typename KT>
struct MlaScalarTile {
  static constexpr int kNT = 256;
  static constexpr int kES = sizeof(KT);
  // One stage of keys; 64 KiB of LDS hold it beside Q as float32.
  static constexpr int kChunk = kES == 4 ? 8 : (kES == 2 ? 16 : 32);
  // A staged row, padded by 16 bytes so consecutive keys start in different banks.
  static constexpr int kRowBytes = kMlaRow * kES + 16;
  static constexpr int kSS = kChunk + 1;  // score row stride (floats)
  static constexpr size_t kQ = 0;         // float [kMlaRows][kMlaRow]
  static constexpr size_t kK = kQ + sizeof(float) * kMlaRows * kMlaRow;
  static constexpr size_t kS = kK + static_cast<size_t>(kChunk) * kRowBytes;
  static constexpr size_t kM = kS + sizeof(float) * kMlaRows * kSS;  // m, l, alpha per row
  static constexpr size_t kBytes = kM + sizeof(float) * 3 * kMlaRows;
  static_assert(kBytes <= 64 * 1024, "the scalar MLA tile must fit 64 KiB of LDS");
  static_assert((kMlaRow * kES) % 16 == 0, "staged rows are whole 16-byte units");
};

template <typename T, typename KT>
__global__ void __launch_bounds__(MlaScalarTile<KT>::kNT) mla_scalar_kernel(const MlaParams p) {
  using L = MlaScalarTile<KT>;
  constexpr int NT = L::kNT, CH = L::kChunk, ES = L::kES, ROWB = L::kRowBytes, SS = L::kSS;
  constexpr int R = kMlaRows, D = kMlaRow, DV = kMlaValue;
  constexpr int NV = 16 / ES;                  // elements per 16-byte read of a K row
  constexpr int RG = NT / CH;                  // row groups of the score phase
  constexpr int RPT = (R + RG - 1) / RG;       // rows per thread there
  constexpr int UPT = (R * DV / 8) / NT;       // 8-wide output units per thread
  static_assert((R * DV / 8) % NT == 0, "output units divide among the threads");

  WorkItem it;
  if (!mla_item(p, &it)) return;
  const AttnParams& a = p.a;
  PA_DYNAMIC_SHARED(16, mla_scalar_smem);
  char* const smem = mla_scalar_smem;
  float* qs = reinterpret_cast<float*>(smem + L::kQ);
  char* kb = smem + L::kK;
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  float* m_s = reinterpret_cast<float*>(smem + L::kM);
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const int tid = threadIdx.x;
  const int hpc = a.heads_per_cta;
  const CtaWork w = cta_work(a, it);
  const int lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;

  // The queries as float32, zero in rows not used (their scores are -inf anyway).
  for (int i = tid; i < R * D; i += NT) {
    const int r = i / D, e = i % D;
    float x = 0.f;
    if (r < rows_used && r % hpc < w.gh) x = to_float(ld_global(mla_q_row<T>(p, w, r, e), kUseQ));
    st_shared(qs + i, x);
  }
  for (int r = tid; r < R; r += NT) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
    a_s[r] = 1.f;
  }

  float acc[UPT][8];
#pragma unroll
  for (int u = 0; u < UPT; ++u)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = 0.f;

  const int vec = a.kv.vec;
  const int units = D * ES / vec;
  for (int c0 = lo; c0 < hi; c0 += CH) {
    const int nk = min(CH, hi - c0);
    __syncthreads();  // the previous chunk is consumed
    for (int i = tid; i < nk * units; i += NT) {
      const int key = i / units, u = i % units;
      int64_t koff, voff;
      key_offsets(a, w.seq, 0, c0 + key, &koff, &voff);
      copy_unit_async(kb + key * ROWB + u * vec,
                      static_cast<const char*>(a.kv.k) + koff * ES + static_cast<int64_t>(u) * vec,
                      vec);
    }
    async_commit();
    async_wait<0>();
    __syncthreads();

    // Scores: thread = (key, row group); each 16 bytes of the K row serve RPT rows.
    {
      const int key = tid % CH, rg = tid / CH;
      float dots[RPT];
#pragma unroll
      for (int j = 0; j < RPT; ++j) dots[j] = 0.f;
      if (key < nk && rg < R) {
        const char* krow = kb + key * ROWB;
#pragma unroll 4
        for (int vi = 0; vi < D / NV; ++vi) {
          const uint4 raw = ld_shared(reinterpret_cast<const uint4*>(krow + vi * 16));
          float kf[NV];
          load_floats<KT, NV>(reinterpret_cast<const KT*>(&raw), kf);
#pragma unroll
          for (int j = 0; j < RPT; ++j) {
            const int r = rg + j * RG;
            if (r < rows_used) {
              const float* qr = qs + r * D + vi * NV;
#pragma unroll
              for (int e = 0; e < NV; ++e) dots[j] = fmaf(qr[e], kf[e], dots[j]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < RPT; ++j) {
        const int r = rg + j * RG;
        if (r >= R) continue;
        const int ti = r / hpc, gi = r % hpc;
        float s = -INFINITY;
        if (key < nk && r < rows_used && gi < w.gh)
          s = variant_logit(a, w, dots[j] * w.qk_scale, w.h0 + gi, c0 + key, w.pos_first + ti);
        st_shared(ss + r * SS + key, s);
      }
    }
    __syncthreads();

    // Online softmax, a warp (wave) per row.
    {
      const int lane = tid % PA_WARP_SIZE, wid = tid / PA_WARP_SIZE;
      constexpr int NW = NT / PA_WARP_SIZE;
      for (int r = wid; r < R; r += NW) {
        if (r >= rows_used) continue;
        softmax_row<PA_WARP_SIZE>(ss + r * SS, ss + r * SS, CH, lane, m_s + r, l_s + r, a_s + r);
      }
    }
    __syncthreads();

    // P.V over the rows' leading DV values.
#pragma unroll
    for (int u = 0; u < UPT; ++u) {
      const int unit = tid + u * NT;
      const int r = unit / (DV / 8), d0 = (unit % (DV / 8)) * 8;
      if (r >= rows_used) continue;
      const float al = a_s[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[u][e] *= al;
      const float* pr = ss + r * SS;
      const char* vcol = kb + d0 * ES;
#pragma unroll 4
      for (int k = 0; k < nk; ++k) {
        float vf[8];
        load8_shared<KT>(reinterpret_cast<const KT*>(vcol + k * ROWB), vf);
        const float pk = ld_shared(pr + k);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = fmaf(pk, vf[e], acc[u][e]);
      }
    }
  }

  // The normalised rows (or the split partials) and the log-sum-exp.
#pragma unroll
  for (int u = 0; u < UPT; ++u) {
    const int unit = tid + u * NT;
    const int r = unit / (DV / 8), d0 = (unit % (DV / 8)) * 8;
    if (r >= rows_used) continue;
    const int ti = r / hpc, gi = r % hpc;
    if (gi >= w.gh) continue;
    const int h = w.h0 + gi;
    const float l = l_s[r];
    const RowNorm n = row_norm(m_s[r], l, row_sink(a.sinks, h, it.part >= 0), w.v_scale);
    float x[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = l > 0.f ? acc[u][e] * n.inv : 0.f * n.inv;
    if (it.part < 0) {
      mla_store8<T>(static_cast<T*>(a.out) + static_cast<int64_t>(w.row0 + ti) * a.o_row +
                        static_cast<int64_t>(h) * a.o_head + d0,
                    x);
      if (d0 == 0 && a.lse)
        st_global(a.lse + static_cast<int64_t>(w.row0 + ti) * a.lse_row + h * a.lse_head, n.lse,
                  kUseOut);
    } else {
      mla_store8<float>(a.part_o + (static_cast<int64_t>(it.part) * a.num_heads + h) * DV + d0, x);
      if (d0 == 0)
        st_global(a.part_lse + static_cast<int64_t>(it.part) * a.num_heads + h, n.lse, kUseOut);
    }
  }
}

template <typename T, typename KT>
gpuError_t launch_mla_scalar(int32_t max_items, int32_t subtiles, const MlaParams& p,
                             gpuStream_t stream) {
  using L = MlaScalarTile<KT>;
  auto kernel = mla_scalar_kernel<T, KT>;
  if (L::kBytes > 48 * 1024) {
    static std::atomic<uint64_t> smem_set{0};
    const gpuError_t attr = raise_smem_limit(kernel, static_cast<int>(L::kBytes), smem_set);
    if (attr != gpuSuccess) return attr;
  }
  const int nhg = (p.a.group + p.a.heads_per_cta - 1) / p.a.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(nhg),
            static_cast<unsigned>(subtiles));
  PA_LAUNCH(kernel, grid, L::kNT, L::kBytes, stream)(p);
  return gpuGetLastError();
}

// ---------------------------------------------------------------------------------------------
// The tensor-core kernel.

#if defined(PA_HAS_MMA_SYNC)

struct MlaMmaTile {
  static constexpr int kWarps = 4;
  static constexpr int kNT = kWarps * 32;
  static constexpr int kChunk = kWarps * 8;     // keys per stage: 8 per warp in the score phase
  static constexpr int kCols = kMlaValue / kWarps;  // output columns per warp
  // Staged rows (Q, K) of kLd elements: 16 bytes of padding put the 8 rows an ldmatrix reads in
  // distinct bank groups and keep each row 16-byte aligned.
  static constexpr int kLd = kMlaRow + 8;
  static constexpr int kPLd = kChunk + 8;       // weight rows
  static constexpr size_t kQ = 0;
  static constexpr size_t kStage0 = kQ + 2u * kMlaRows * kLd;
  static constexpr size_t kStageBytes = 2u * kChunk * kLd;
  static constexpr size_t kP = kStage0 + 2u * kStageBytes;
  static constexpr size_t kRed = kP + 2u * kMlaRows * kPLd;  // float [kWarps][kMlaRows]
  static constexpr size_t kBytes = kRed + sizeof(float) * kWarps * kMlaRows;
  static_assert(kBytes <= static_cast<size_t>(kSmallSmem),
                "the MLA tile must fit the shared memory of the smallest devices served");
  static_assert(kMlaRow % 32 == 0 && kCols % 16 == 0, "whole ldmatrix_x4 tiles");
};

template <typename T>
__device__ __forceinline__ void mla_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    mma_m16n8k16_bf16(d, a, b, d);
  } else {
    mma_m16n8k16_f16(d, a, b, d);
  }
}

// Stages the rows of keys [c0, c0 + nk) into ks as T (kChunk rows of kLd elements), zero rows
// past nk (their weights are 0, and 0 times a stale NaN would not be). A cache of type T is
// copied asynchronously (the caller commits); an fp8 one is loaded 8 groups at a time into
// registers, then converted.
template <typename T, typename KT>
__device__ __forceinline__ void mla_stage(const MlaParams& p, const CtaWork& w, T* ks, int c0,
                                          int nk, bool aligned) {
  using L = MlaMmaTile;
  constexpr int G = kMlaRow / 8;  // 8-element groups of a row
  constexpr int kIters = (L::kChunk * G + L::kNT - 1) / L::kNT;
  const AttnParams& a = p.a;
  if constexpr (std::is_same<KT, T>::value) {
#pragma unroll 6
    for (int n = 0; n < kIters; ++n) {
      const int i = threadIdx.x + n * L::kNT;
      if (i >= L::kChunk * G) break;
      const int key = i / G, d0 = (i % G) * 8;
      T* dst = ks + key * L::kLd + d0;
      if (key < nk) {
        int64_t koff, voff;
        key_offsets(a, w.seq, 0, c0 + key, &koff, &voff);
        const char* src = reinterpret_cast<const char*>(static_cast<const KT*>(a.kv.k) + koff + d0);
        for (int b = 0; b < 16; b += a.kv.vec)
          copy_unit_async(reinterpret_cast<char*>(dst) + b, src + b, a.kv.vec);
      } else {
        st_shared(reinterpret_cast<uint4*>(dst), make_uint4(0, 0, 0, 0));
      }
    }
  } else {
    static_assert(sizeof(KT) == 1, "caches of another type than the queries' are fp8");
    constexpr int kBatch = 8;
#pragma unroll 1
    for (int n0 = 0; n0 < kIters; n0 += kBatch) {
      uint2 raw[kBatch];
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        const int i = threadIdx.x + (n0 + n) * L::kNT;
        const int key = i / G, d0 = (i % G) * 8;
        raw[n] = make_uint2(0, 0);
        if (n0 + n < kIters && i < L::kChunk * G && key < nk) {
          int64_t koff, voff;
          key_offsets(a, w.seq, 0, c0 + key, &koff, &voff);
          const KT* src = static_cast<const KT*>(a.kv.k) + koff + d0;
          if (aligned) raw[n] = ld_global(reinterpret_cast<const uint2*>(src), kUseKV);
          else memcpy(&raw[n], src, 8);
        }
      }
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        const int i = threadIdx.x + (n0 + n) * L::kNT;
        if (n0 + n >= kIters || i >= L::kChunk * G) break;
        const int key = i / G, d0 = (i % G) * 8;
        stage8<T, KT>(ks + key * L::kLd + d0, reinterpret_cast<const KT*>(&raw[n]));
      }
    }
  }
}

template <typename T, typename KT>
__global__ void __launch_bounds__(MlaMmaTile::kNT, 2) mla_mma_kernel(const MlaParams p) {
  using L = MlaMmaTile;
  constexpr int R = kMlaRows, NT = L::kNT, CH = L::kChunk, LD = L::kLd, PLD = L::kPLd;
  constexpr int NO = L::kCols / 8;  // output n-tiles of a warp

  WorkItem it;
  if (!mla_item(p, &it)) return;
  const AttnParams& a = p.a;
  PA_DYNAMIC_SHARED(128, mla_mma_smem);
  char* const smem = mla_mma_smem;
  T* qs = reinterpret_cast<T*>(smem + L::kQ);
  T* ps = reinterpret_cast<T*>(smem + L::kP);
  float* red = reinterpret_cast<float*>(smem + L::kRed);
  auto stage_k = [&](int s) {
    return reinterpret_cast<T*>(smem + L::kStage0 + s * L::kStageBytes);
  };

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int hpc = a.heads_per_cta;
  const CtaWork w = cta_work(a, it);
  const int lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;

  // Q as T, zero in rows not used.
  for (int i = tid; i < R * (kMlaRow / 8); i += NT) {
    const int r = i / (kMlaRow / 8), d0 = (i % (kMlaRow / 8)) * 8;
    T* dst = qs + r * LD + d0;
    if (r < rows_used && r % hpc < w.gh) {
      const T* src = mla_q_row<T>(p, w, r, d0);  // q_lead is a multiple of 8: no group straddles
      if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        st_shared(reinterpret_cast<uint4*>(dst),
                  ld_global(reinterpret_cast<const uint4*>(src), kUseQ));
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) st_shared(dst + e, ld_global(src + e, kUseQ));
      }
    } else {
      st_shared(reinterpret_cast<uint4*>(dst), make_uint4(0, 0, 0, 0));
    }
  }

  // This lane's rows of the tile: g and g + 8.
  bool valid[2];
  int head[2], qpos[2], qrow[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int r = g + 8 * hr;
    const int ti = r / hpc, gi = r % hpc;
    valid[hr] = r < rows_used && gi < w.gh;
    head[hr] = w.h0 + gi;
    qpos[hr] = w.pos_first + ti;
    qrow[hr] = w.row0 + ti;
  }
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const bool aligned = a.kv.vec >= static_cast<int>(8 * sizeof(KT));
  const int nchunks = hi > lo ? (hi - lo + CH - 1) / CH : 0;
  if (nchunks > 0) {
    mla_stage<T, KT>(p, w, stage_k(0), lo, min(CH, hi - lo), aligned);
    async_commit();
  }
  for (int c = 0; c < nchunks; ++c) {
    const int c0 = lo + c * CH;
    if (c + 1 < nchunks) {  // the next chunk streams in while this one is computed on
      const int n0 = c0 + CH;
      mla_stage<T, KT>(p, w, stage_k((c + 1) & 1), n0, min(CH, hi - n0), aligned);
      async_commit();
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const T* ks = stage_k(c & 1);

    // S = Q.K^T for this warp's 8 keys over the whole row: per 32 values one ldmatrix_x4 of K
    // (two k-steps of B) and two of Q.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const T* krow = ks + (warp * 8 + (lane & 7)) * LD + (lane >> 3) * 8;
      const T* qrow_s = qs + (lane & 15) * LD + (lane >> 4) * 8;
#pragma unroll 2
      for (int k0 = 0; k0 < kMlaRow; k0 += 32) {
        uint32_t kb[4], qa[4];
        ldmatrix_x4(kb, krow + k0);
        ldmatrix_x4(qa, qrow_s + k0);
        mla_mma<T>(s, qa, kb);
        ldmatrix_x4(qa, qrow_s + k0 + 16);
        mla_mma<T>(s, qa, kb + 2);
      }
    }
    // Logits, and the warp's maxima of each row over its 8 keys.
    float mx[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      mx[hr] = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = c0 + warp * 8 + 2 * t4 + e;
        float x = -INFINITY;
        if (valid[hr] && key < hi)
          x = variant_logit(a, w, s[2 * hr + e] * w.qk_scale, head[hr], key, qpos[hr]);
        s[2 * hr + e] = x;
        mx[hr] = max_keep_nan(mx[hr], x);
      }
      mx[hr] = max_keep_nan(mx[hr], PA_SHFL_XOR(mx[hr], 1));
      mx[hr] = max_keep_nan(mx[hr], PA_SHFL_XOR(mx[hr], 2));
      if (t4 == 0) st_shared(red + warp * R + g + 8 * hr, mx[hr]);
    }
    __syncthreads();
    // Every warp takes the chunk's maxima of all four, so m (and each row's factor) agree.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = g + 8 * hr;
      float cm = -INFINITY;
#pragma unroll
      for (int ww = 0; ww < L::kWarps; ++ww) cm = max_keep_nan(cm, ld_shared(red + ww * R + r));
      const float m_new = max_keep_nan(m[hr], cm);
      const bool poisoned = max_poisoned(m_new);
      const float alpha = (m[hr] == -INFINITY || poisoned) ? 0.f : __expf(m[hr] - m_new);
      float pe[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = s[2 * hr + e];
        pe[e] = (x == -INFINITY || poisoned) ? 0.f : __expf(x - m_new);
      }
      l[hr] = l[hr] * alpha + pe[0] + pe[1];  // this lane's part; all parts are added at the end
      m[hr] = m_new;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * hr] *= alpha;
        o[n][2 * hr + 1] *= alpha;
      }
      st_shared(reinterpret_cast<uint32_t*>(ps + r * PLD + warp * 8 + 2 * t4),
                pack_half2<T>(pe[0], pe[1]));
    }
    __syncthreads();
    // O += P.V for this warp's columns: P's A fragments from shared memory, V's B fragments
    // (the keys' leading values) through transposed ldmatrix_x4.
#pragma unroll
    for (int kk = 0; kk < CH / 16; ++kk) {
      uint32_t pa[4];
      ldmatrix_x4(pa, ps + (lane & 15) * PLD + kk * 16 + (lane >> 4) * 8);
      const T* vrow = ks + (kk * 16 + (lane & 15)) * LD + warp * L::kCols + (lane >> 4) * 8;
#pragma unroll
      for (int jd = 0; jd < NO / 2; ++jd) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, vrow + jd * 16);
        mla_mma<T>(o[2 * jd], pa, vb);
        mla_mma<T>(o[2 * jd + 1], pa, vb + 2);
      }
    }
    __syncthreads();  // the stage, weights and maxima just read are refilled next
  }

  // Each row's sum over the quad, then over the warps.
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    l[hr] += PA_SHFL_XOR(l[hr], 1);
    l[hr] += PA_SHFL_XOR(l[hr], 2);
    if (t4 == 0) st_shared(red + warp * R + g + 8 * hr, l[hr]);
  }
  __syncthreads();
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float sum = 0.f;
#pragma unroll
    for (int ww = 0; ww < L::kWarps; ++ww) sum += ld_shared(red + ww * R + g + 8 * hr);
    l[hr] = sum;
  }

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    if (!valid[hr]) continue;
    const bool whole = it.part < 0;
    const RowNorm nr = row_norm(m[hr], l[hr], row_sink(a.sinks, head[hr], !whole), w.v_scale);
    T* out = nullptr;
    float* part = nullptr;
    if (whole)
      out = static_cast<T*>(a.out) + static_cast<int64_t>(qrow[hr]) * a.o_row +
            static_cast<int64_t>(head[hr]) * a.o_head;
    else
      part = a.part_o + (static_cast<int64_t>(it.part) * a.num_heads + head[hr]) * kMlaValue;
    const bool pairs = whole ? (reinterpret_cast<uintptr_t>(out) & 3) == 0 : true;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int d = warp * L::kCols + n * 8 + 2 * t4;  // even: pairs stay aligned
      // A row whose keys all weighed nothing gives 0 (NaN when poisoned).
      float x[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) x[e] = l[hr] > 0.f ? o[n][2 * hr + e] * nr.inv : 0.f * nr.inv;
      if (!whole) {
        st_global(reinterpret_cast<float2*>(part + d), make_float2(x[0], x[1]), kUseOut);
      } else if (pairs) {
        st_global(reinterpret_cast<uint32_t*>(out + d), pack_half2<T>(x[0], x[1]), kUseOut);
      } else {
        st_global(out + d, from_float<T>(x[0]), kUseOut);
        st_global(out + d + 1, from_float<T>(x[1]), kUseOut);
      }
    }
    if (warp != 0 || t4 != 0) continue;
    if (!whole)
      st_global(a.part_lse + static_cast<int64_t>(it.part) * a.num_heads + head[hr], nr.lse,
                kUseOut);
    else if (a.lse)
      st_global(a.lse + static_cast<int64_t>(qrow[hr]) * a.lse_row + head[hr] * a.lse_head,
                nr.lse, kUseOut);
  }
}

template <typename T, typename KT>
gpuError_t launch_mla_mma(int32_t max_items, int32_t subtiles, const MlaParams& p,
                          gpuStream_t stream) {
  using L = MlaMmaTile;
  auto kernel = mla_mma_kernel<T, KT>;
  if (L::kBytes > 48 * 1024) {
    static std::atomic<uint64_t> smem_set{0};
    const gpuError_t attr = raise_smem_limit(kernel, static_cast<int>(L::kBytes), smem_set);
    if (attr != gpuSuccess) return attr;
  }
  const int nhg = (p.a.group + p.a.heads_per_cta - 1) / p.a.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(nhg),
            static_cast<unsigned>(subtiles));
  PA_LAUNCH(kernel, grid, L::kNT, L::kBytes, stream)(p);
  return gpuGetLastError();
}

#endif  // PA_HAS_MMA_SYNC

// The tile for queries T over a cache of KT: tensor cores for 16-bit queries where they are.
template <typename T, typename KT>
gpuError_t launch_mla_one(int32_t max_items, int32_t subtiles, const MlaParams& p,
                          gpuStream_t stream) {
#if defined(PA_HAS_MMA_SYNC)
  if constexpr (sizeof(T) == 2) {
    return launch_mla_mma<T, KT>(max_items, subtiles, p, stream);
  } else {
    return launch_mla_scalar<T, KT>(max_items, subtiles, p, stream);
  }
#else
  return launch_mla_scalar<T, KT>(max_items, subtiles, p, stream);
#endif
}

// Every cache type instantiations.h lists for queries of type T (code qt).
template <typename T>
gpuError_t launch_mla_t(int32_t qt, int32_t kt, int32_t max_items, int32_t subtiles,
                        const MlaParams& p, gpuStream_t stream, int* unsupported) {
#define PA_MLA_CACHE(CODE, KT, ...) \
  if (kt == (CODE)) return launch_mla_one<T, KT>(max_items, subtiles, p, stream);
  PA_GPU_CACHE_DTYPES(PA_MLA_CACHE, qt, T, )
#undef PA_MLA_CACHE
  *unsupported = 1;
  return gpuSuccess;
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_MLA_CUH
