// attention.cuh — one kernel template for decode and prefill tiles over a paged cache.
//
// A CTA owns R rows = (tile tokens) x (query heads of one GQA group) of one sequence, so each
// K/V chunk it stages in shared memory is read from memory once for the whole group. Keys are
// processed in chunks of CHUNK with an online softmax; scores, probabilities and the output
// accumulators stay in float32.
#ifndef PAGEDATTN_GPU_ATTENTION_CUH
#define PAGEDATTN_GPU_ATTENTION_CUH

#include <math.h>

#include <algorithm>

#include <atomic>

#include "gpu_kernels.h"
#include "instantiations.h"
#include "types.cuh"
#include "variant.cuh"

#if defined(PA_CUDA)
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#endif

namespace pagedattn_gpu {

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device. The attribute
// belongs to the kernel in one device's context, so it is set once per device (bit d of `done`;
// devices past 63 set it on every launch). No host sync and no allocation: legal inside a graph
// capture, though the first call for a device is best made outside one (a warm-up forward).
template <typename K>
gpuError_t raise_smem_limit(K kernel, int bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  gpuError_t e = gpuGetDevice(&dev);
  if (e != gpuSuccess) return e;
  const uint64_t bit = (dev >= 0 && dev < 64) ? (uint64_t{1} << dev) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return gpuSuccess;
  e = gpuFuncSetMaxDynamicSmem(kernel, bytes);
  if (e == gpuSuccess && bit) done.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

// Loads 8 consecutive elements at p (aligned to 8 * sizeof(T)) as floats.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* f) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
    f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
  } else if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    load_floats<T, 8>(reinterpret_cast<const T*>(&u), f);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    load_floats<T, 8>(reinterpret_cast<const T*>(&u), f);
  }
}

// Copies `bytes` (a multiple of vec) from src to dst with accesses of vec bytes.
__device__ __forceinline__ void copy_unit(char* dst, const char* src, int vec) {
  switch (vec) {
    case 16: *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src); break;
    case 8: *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src); break;
    case 4: *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src); break;
    case 2: *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src); break;
    default: *dst = *src; break;
  }
}

// Global -> shared copies that do not wait for the data: on CUDA (cp.async, sm_80+) the next
// K/V chunk streams in while the current one is computed on; elsewhere a plain copy.
#if defined(PA_HAS_CP_ASYNC)
constexpr int kStages = 2;
__device__ __forceinline__ void copy_unit_async(char* dst, const char* src, int vec) {
  switch (vec) {
    case 16: __pipeline_memcpy_async(dst, src, 16); break;
    case 8: __pipeline_memcpy_async(dst, src, 8); break;
    case 4: __pipeline_memcpy_async(dst, src, 4); break;
    default: copy_unit(dst, src, vec); break;
  }
}
__device__ __forceinline__ void async_commit() { __pipeline_commit(); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void async_wait() { __pipeline_wait_prior(pending); }
#else
constexpr int kStages = 1;
__device__ __forceinline__ void copy_unit_async(char* dst, const char* src, int vec) {
  copy_unit(dst, src, vec);
}
__device__ __forceinline__ void async_commit() {}
template <int pending>
__device__ __forceinline__ void async_wait() {}
#endif

// kStages buffers of kChunk keys (K and V) each: one is computed on while the next loads.
template <typename KT, int DMAX>
struct AttnLayout {
  static constexpr int kES = sizeof(KT);
  // Shared-memory row of one key: padded by 16 bytes so 8 consecutive keys read with 16-byte
  // accesses land in distinct bank groups.
  static constexpr int kRowBytes = ((DMAX * kES + 15) / 16) * 16 + 16;
  static constexpr int kQRow = ((DMAX + 15) / 16) * 16;  // floats per staged query row
#if defined(PA_LDS_64K)
  // 64 KiB of LDS per workgroup on AMD: shorter chunks for the widest rows.
  static constexpr int kChunk = (DMAX * kES <= 256) ? 64 : (DMAX * kES <= 512 ? 32 : 16);
#else
  static constexpr int kChunk = ((DMAX * kES <= 256) ? 64 : 32) / kStages;
#endif
};

template <int R, int NT, int CHUNK, typename KT, int DMAX>
constexpr size_t attn_smem_bytes() {
  using L = AttnLayout<KT, DMAX>;
  return sizeof(float) * R * L::kQRow + 2u * kStages * CHUNK * L::kRowBytes +
         sizeof(float) * R * (CHUNK + 1) + sizeof(float) * 3 * R;
}

template <typename T, typename KT, int DMAX, int R, int NT>
__global__ void __launch_bounds__(NT) attention_kernel(const AttnParams p) {
  using L = AttnLayout<KT, DMAX>;
  constexpr int CHUNK = L::kChunk;
  constexpr int ROWB = L::kRowBytes;
  constexpr int QROW = L::kQRow;
  constexpr int ES = sizeof(KT);
  constexpr int NV = 16 / ES;           // elements per 16-byte shared-memory read
  constexpr int RG = NT / CHUNK;        // row groups in the score phase
  constexpr int RPT = (R + RG - 1) / RG;
  constexpr int UPT = (R * (DMAX / 8) + NT - 1) / NT;  // 8-wide output units per thread
  constexpr int SS = CHUNK + 1;
  const float kNegInf = -INFINITY;

  if (static_cast<int32_t>(blockIdx.x) >= *p.num_items) return;
  const WorkItem it = p.items[blockIdx.x];

  PA_DYNAMIC_SHARED(16, smem_raw);
  float* qs = reinterpret_cast<float*>(smem_raw);
  char* kv_bufs = smem_raw + sizeof(float) * R * QROW;  // per stage: K chunk, then V chunk
  float* ss = reinterpret_cast<float*>(kv_bufs + kStages * 2 * CHUNK * ROWB);
  float* m_s = ss + R * SS;
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const int tid = threadIdx.x;
  const int D = p.head_size;
  const int hpc = p.heads_per_cta;
  const CtaWork w = cta_work(p, it);
  const int kvh = w.kvh, gh = w.gh, h0 = w.h0, seq = w.seq, row0 = w.row0;
  const int pos_first = w.pos_first, lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;

  // Stage the queries (zero rows and tails so padded lanes contribute nothing).
  for (int i = tid; i < R * QROW; i += NT) {
    const int r = i / QROW, d = i % QROW;
    const int ti = r / hpc, gi = r % hpc;
    float x = 0.f;
    if (r < rows_used && gi < gh && d < D) {
      const T* q = static_cast<const T*>(p.q) + (row0 + ti) * p.q_row + (h0 + gi) * p.q_head;
      x = to_float(q[d]);
    }
    qs[i] = x;
  }
  for (int r = tid; r < R; r += NT) {
    m_s[r] = kNegInf;
    l_s[r] = 0.f;
  }

  float acc[UPT][8];
#pragma unroll
  for (int u = 0; u < UPT; ++u)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[u][e] = 0.f;

  const int row_bytes = D * ES;
  const int row_bytes16 = (row_bytes + 15) & ~15;
  const int nvec = row_bytes16 / 16;
  const int vec = p.kv.vec;
  const int units = row_bytes / vec;
  const int dunits = D / 8;
  // P.V with one 8-wide unit per thread and at most half the units in use (decode rows of a
  // group of 4 heads or fewer): the idle half takes the odd keys, the halves are added at the end.
  const int units_used = rows_used * dunits;
  const bool kpair = (UPT == 1) && (2 * units_used <= NT);
  const int half = (kpair && tid >= units_used) ? 1 : 0;
  const int my_unit = tid - half * units_used;
  const int kstep = kpair ? 2 : 1;

  // Issues the copies of the chunk at c0 into stage buffer `buf` (not waited for).
  auto stage = [&](int c0, int buf) {
    const int nk = min(CHUNK, hi - c0);
    char* kb = kv_bufs + buf * (2 * CHUNK * ROWB);
    char* vb = kb + CHUNK * ROWB;
    for (int i = tid; i < nk * units; i += NT) {
      const int key = i / units, u = i % units;
      int64_t koff, voff;
      key_offsets(p, seq, kvh, c0 + key, &koff, &voff);
      const int64_t ub = static_cast<int64_t>(u) * vec;
      copy_unit_async(kb + key * ROWB + u * vec, static_cast<const char*>(p.kv.k) + koff * ES + ub, vec);
      copy_unit_async(vb + key * ROWB + u * vec, static_cast<const char*>(p.kv.v) + voff * ES + ub, vec);
    }
    if (row_bytes16 != row_bytes) {  // fp8 rows not a multiple of 16 bytes: zero the tail
      const int tail = row_bytes16 - row_bytes;
      for (int i = tid; i < nk * tail; i += NT) {
        const int key = i / tail, b = row_bytes + i % tail;
        kb[key * ROWB + b] = 0;
        vb[key * ROWB + b] = 0;
      }
    }
  };

  if (lo < hi) stage(lo, 0);
  async_commit();
  int buf = 0;
  for (int c0 = lo; c0 < hi; c0 += CHUNK, buf = (buf + 1) % kStages) {
    const int nk = min(CHUNK, hi - c0);
    __syncthreads();  // the previous chunk is fully consumed: its buffer may be refilled
    if (kStages == 1) {
      if (c0 != lo) stage(c0, 0);
    } else if (c0 + CHUNK < hi) {
      stage(c0 + CHUNK, (buf + 1) % kStages);
    }
    async_commit();
    async_wait<kStages - 1>();  // this thread's copies of chunk c0 have landed...
    __syncthreads();            // ...and every thread's
    const char* ks = kv_bufs + buf * (2 * CHUNK * ROWB);
    const char* vs = ks + CHUNK * ROWB;

    // Scores: thread = (key, row group); the K row is read once per 16 bytes for RPT rows.
    {
      const int key = tid % CHUNK;
      const int rg = tid / CHUNK;
      float dots[RPT];
#pragma unroll
      for (int j = 0; j < RPT; ++j) dots[j] = 0.f;
      if (key < nk) {
        const char* krow = ks + key * ROWB;
        constexpr int NVEC = (DMAX * ES + 15) / 16;  // unrolled: the loads overlap
#pragma unroll
        for (int vi = 0; vi < NVEC; ++vi) {
          if (vi >= nvec) continue;  // (not break: a second loop exit blocks the unrolling)
          const uint4 raw = *reinterpret_cast<const uint4*>(krow + vi * 16);
          float kf[NV];
          load_floats<KT, NV>(reinterpret_cast<const KT*>(&raw), kf);
#pragma unroll
          for (int j = 0; j < RPT; ++j) {
            const int r = rg + j * RG;
            if (r < rows_used) {  // rows past the used ones score -inf below; skip their dots
              const float* qr = qs + r * QROW + vi * NV;
#pragma unroll
              for (int e = 0; e < NV; ++e) dots[j] = fmaf(qr[e], kf[e], dots[j]);
            }
          }
        }
      }
      const int kpos = c0 + key;
#pragma unroll
      for (int j = 0; j < RPT; ++j) {
        const int r = rg + j * RG;
        if (r >= R) continue;
        const int ti = r / hpc, gi = r % hpc;
        float s = kNegInf;
        if (key < nk && r < rows_used && gi < gh) {
          s = variant_logit(p, dots[j] * p.scale, h0 + gi, kpos, pos_first + ti);
        }
        ss[r * SS + key] = s;
      }
    }
    __syncthreads();

    // Online softmax, one warp (wave) per row.
    {
      const int lane = tid % PA_WARP_SIZE;
      const int wid = tid / PA_WARP_SIZE;
      constexpr int NW = NT / PA_WARP_SIZE;
      for (int r = wid; r < R; r += NW) {
        if (r >= rows_used) continue;
        softmax_row<PA_WARP_SIZE>(ss + r * SS, ss + r * SS, CHUNK, lane, m_s + r, l_s + r,
                                  a_s + r);
      }
    }
    __syncthreads();

    // P.V: thread owns 8-wide output units (row, d0..d0+7).
#pragma unroll
    for (int u = 0; u < UPT; ++u) {
      const int unit = my_unit + u * NT;
      const int r = unit / dunits;
      if (r >= rows_used) continue;
      const int d0 = (unit % dunits) * 8;
      const float a = a_s[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[u][e] *= a;
      const float* pr = ss + r * SS;
      const char* vcol = vs + d0 * ES;
#pragma unroll 8
      for (int k = half; k < nk; k += kstep) {
        float vf[8];
        load8<KT>(reinterpret_cast<const KT*>(vcol + k * ROWB), vf);
        const float pk = pr[k];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = fmaf(pk, vf[e], acc[u][e]);
      }
    }
  }
  __syncthreads();
  if (kpair) {  // add the odd keys' half (the stage buffers are idle: no copy is in flight)
    float* red = reinterpret_cast<float*>(kv_bufs);
    if (half == 1 && my_unit < units_used) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[my_unit * 8 + e] = acc[0][e];
    }
    __syncthreads();
    if (half == 0 && tid < units_used) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[0][e] += red[tid * 8 + e];
    }
  }

  // Write the normalised rows (or the split partials) and the log-sum-exp.
#pragma unroll
  for (int u = 0; u < UPT; ++u) {
    const int unit = tid + u * NT;
    const int r = unit / dunits;
    if (r >= rows_used) continue;
    const int ti = r / hpc, gi = r % hpc;
    if (gi >= gh) continue;
    const int d0 = (unit % dunits) * 8;
    const float l = l_s[r];
    const bool poisoned = max_poisoned(m_s[r]);
    const float inv = poisoned ? NAN : (l > 0.f) ? p.v_scale / l : 0.f;
    const float lse = poisoned ? NAN : (l > 0.f) ? m_s[r] + logf(l) : kNegInf;
    const int h = h0 + gi;
    if (it.part < 0) {
      T* o = static_cast<T*>(p.out) + static_cast<int64_t>(row0 + ti) * p.o_row + h * p.o_head + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = from_float<T>(acc[u][e] * inv);
      if (d0 == 0 && p.lse) p.lse[static_cast<int64_t>(row0 + ti) * p.lse_row + h * p.lse_head] = lse;
    } else {
      float* o = p.part_o + (static_cast<int64_t>(it.part) * p.num_heads + h) * D + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = acc[u][e] * inv;
      if (d0 == 0) p.part_lse[static_cast<int64_t>(it.part) * p.num_heads + h] = lse;
    }
  }
}


#if defined(PA_HAS_WMMA)
// ---------------------------------------------------------------------------------------------
// Prefill on tensor cores (sm_80+, WMMA 16x16x16): the same tiles and online softmax as above,
// with S = Q.K^T and O += P.V as bf16/f16 matrix products accumulating in float32. Q, K, V and P
// are staged in shared memory as the query type; O lives in shared memory (float32) so the
// softmax can rescale its rows between chunks.
template <typename T> struct WmmaType;
template <> struct WmmaType<f16_t> { using type = __half; };
template <> struct WmmaType<bf16_t> { using type = __nv_bfloat16; };

template <int DMAX>
struct MmaLayout {
  static constexpr int kR = 64;                          // rows per CTA
  static constexpr int kNT = 256;                        // 8 warps
  static constexpr int kChunk = DMAX <= 128 ? 64 : 32;
  static constexpr int kDP = ((DMAX + 15) / 16) * 16;    // staged head size (zero padded)
  static constexpr int kLdT = kDP + 8;                   // Q/K/V row, elements (16-byte pad)
  static constexpr int kLdS = kChunk + 4;                // score row, floats
  static constexpr int kLdP = kChunk + 8;                // probability row, elements
  static constexpr int kLdO = kDP + 4;                   // output row, floats
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + 2u * kR * kLdT;
  static constexpr size_t kV = kK + 2u * kChunk * kLdT;
  static constexpr size_t kS = kV + 2u * kChunk * kLdT;
  static constexpr size_t kP = kS + 4u * kR * kLdS;
  static constexpr size_t kO = kP + 2u * kR * kLdP;
  static constexpr size_t kM = kO + 4u * kR * kLdO;
  static constexpr size_t kBytes = kM + 4u * 3 * kR;
};

// Loads 8 key/value elements (aligned when vec allows) and stores them as 8 T.
template <typename T, typename KT>
__device__ __forceinline__ void stage8(T* dst, const KT* src, bool aligned) {
  float f[8];
  if (aligned) {
    load8<KT>(src, f);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = to_float(src[e]);
  }
  __align__(16) T o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = from_float<T>(f[e]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(o);
}

template <typename T, typename KT, int DMAX>
__global__ void __launch_bounds__(256) attention_mma_kernel(const AttnParams p) {
  using namespace nvcuda;
  using L = MmaLayout<DMAX>;
  using W = typename WmmaType<T>::type;
  constexpr int R = L::kR, NT = L::kNT, CHUNK = L::kChunk, DP = L::kDP;
  constexpr int LDT = L::kLdT, LDS = L::kLdS, LDP = L::kLdP, LDO = L::kLdO;
  const float kNegInf = -INFINITY;

  if (static_cast<int32_t>(blockIdx.x) >= *p.num_items) return;
  const WorkItem it = p.items[blockIdx.x];

  PA_DYNAMIC_SHARED(128, mma_smem);
  char* smem_raw = mma_smem;
  T* qs = reinterpret_cast<T*>(smem_raw + L::kQ);
  T* ks = reinterpret_cast<T*>(smem_raw + L::kK);
  T* vs = reinterpret_cast<T*>(smem_raw + L::kV);
  float* ss = reinterpret_cast<float*>(smem_raw + L::kS);
  T* ps = reinterpret_cast<T*>(smem_raw + L::kP);
  float* os = reinterpret_cast<float*>(smem_raw + L::kO);
  float* m_s = reinterpret_cast<float*>(smem_raw + L::kM);
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int D = p.head_size;
  const int hpc = p.heads_per_cta;
  const CtaWork w = cta_work(p, it);
  const int kvh = w.kvh, gh = w.gh, h0 = w.h0, seq = w.seq, row0 = w.row0;
  const int pos_first = w.pos_first, lo = w.keys.lo, hi = w.keys.hi;
  const int rows_used = it.tlen * hpc;
  const int row_tiles = (rows_used + 15) / 16;
  const int dtiles = (D + 15) / 16;

  for (int i = tid; i < R * DP; i += NT) {
    const int r = i / DP, d = i % DP;
    const int ti = r / hpc, gi = r % hpc;
    float x = 0.f;
    if (r < rows_used && gi < gh && d < D)
      x = to_float(static_cast<const T*>(p.q)[static_cast<int64_t>(row0 + ti) * p.q_row +
                                               static_cast<int64_t>(h0 + gi) * p.q_head + d]);
    qs[r * LDT + d] = from_float<T>(x);
    os[r * LDO + d] = 0.f;
  }
  for (int r = tid; r < R; r += NT) {
    m_s[r] = kNegInf;
    l_s[r] = 0.f;
  }
  const bool aligned = p.kv.vec >= static_cast<int>(8 * sizeof(KT)) || p.kv.vec == 16;
  const int groups = DP / 8;

  for (int c0 = lo; c0 < hi; c0 += CHUNK) {
    const int nk = min(CHUNK, hi - c0);
    __syncthreads();
    // Stage K and V (as T), zero beyond the head size and beyond the last key.
    for (int i = tid; i < CHUNK * groups; i += NT) {
      const int key = i / groups, d0 = (i % groups) * 8;
      T* kd = ks + key * LDT + d0;
      T* vd = vs + key * LDT + d0;
      if (key < nk && d0 < D) {
        int64_t koff, voff;
        key_offsets(p, seq, kvh, c0 + key, &koff, &voff);
        stage8<T, KT>(kd, static_cast<const KT*>(p.kv.k) + koff + d0, aligned);
        stage8<T, KT>(vd, static_cast<const KT*>(p.kv.v) + voff + d0, aligned);
      } else {
        *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();

    // S = Q.K^T, one 16x16 tile per warp step.
    for (int t = warp; t < row_tiles * (CHUNK / 16); t += NT / 32) {
      const int ti = t / (CHUNK / 16), tj = t % (CHUNK / 16);
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < dtiles; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> b;
        wmma::load_matrix_sync(a, reinterpret_cast<const W*>(qs + ti * 16 * LDT + kk * 16), LDT);
        wmma::load_matrix_sync(b, reinterpret_cast<const W*>(ks + tj * 16 * LDT + kk * 16), LDT);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ss + ti * 16 * LDS + tj * 16, acc, LDS, wmma::mem_row_major);
    }
    __syncthreads();

    // Scale, soft cap, ALiBi, masks; then the online softmax, one warp per row.
    for (int i = tid; i < rows_used * CHUNK; i += NT) {
      const int r = i / CHUNK, key = i % CHUNK;
      const int ti = r / hpc, gi = r % hpc;
      float s = kNegInf;
      if (key < nk && gi < gh) {
        s = variant_logit(p, ss[r * LDS + key] * p.scale, h0 + gi, c0 + key, pos_first + ti);
      }
      ss[r * LDS + key] = s;
    }
    __syncthreads();
    for (int r = warp; r < row_tiles * 16; r += NT / 32) {
      if (r >= rows_used) {  // rows of the last tile past the used ones: zero probabilities
        for (int k = lane; k < CHUNK; k += 32) ps[r * LDP + k] = from_float<T>(0.f);
        if (lane == 0) a_s[r] = 0.f;
        continue;
      }
      softmax_row<32>(ss + r * LDS, ps + r * LDP, CHUNK, lane, m_s + r, l_s + r, a_s + r);
    }
    __syncthreads();
    for (int i = tid; i < row_tiles * 16 * DP; i += NT) {
      const int r = i / DP, d = i % DP;
      os[r * LDO + d] *= a_s[r];
    }
    __syncthreads();

    // O += P.V
    for (int t = warp; t < row_tiles * dtiles; t += NT / 32) {
      const int ti = t / dtiles, tj = t % dtiles;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* o = os + ti * 16 * LDO + tj * 16;
      wmma::load_matrix_sync(acc, o, LDO, wmma::mem_row_major);
      for (int kk = 0; kk < CHUNK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> b;
        wmma::load_matrix_sync(a, reinterpret_cast<const W*>(ps + ti * 16 * LDP + kk * 16), LDP);
        wmma::load_matrix_sync(b, reinterpret_cast<const W*>(vs + kk * 16 * LDT + tj * 16), LDT);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(o, acc, LDO, wmma::mem_row_major);
    }
  }
  __syncthreads();

  for (int i = tid; i < rows_used * D; i += NT) {
    const int r = i / D, d = i % D;
    const int ti = r / hpc, gi = r % hpc;
    if (gi >= gh) continue;
    const float l = l_s[r];
    const bool poisoned = max_poisoned(m_s[r]);
    const int h = h0 + gi;
    T* out = static_cast<T*>(p.out) + static_cast<int64_t>(row0 + ti) * p.o_row + h * p.o_head;
    out[d] = from_float<T>(poisoned ? NAN : l > 0.f ? os[r * LDO + d] * (p.v_scale / l) : 0.f);
    if (d == 0 && p.lse)
      p.lse[static_cast<int64_t>(row0 + ti) * p.lse_row + h * p.lse_head] =
          poisoned ? NAN : (l > 0.f) ? m_s[r] + logf(l) : kNegInf;
  }
}

template <typename T, typename KT, int DMAX>
gpuError_t launch_attention_mma(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  using L = MmaLayout<DMAX>;
  static_assert(L::kBytes <= 163 * 1024, "tile exceeds the shared memory of sm_80");
  auto kernel = attention_mma_kernel<T, KT, DMAX>;
  static std::atomic<uint64_t> smem_set{0};
  const gpuError_t attr = raise_smem_limit(kernel, static_cast<int>(L::kBytes), smem_set);
  if (attr != gpuSuccess) return attr;
  const int nhg = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_kv_heads * nhg));
  PA_LAUNCH(kernel, grid, L::kNT, L::kBytes, stream)(p);
  return gpuGetLastError();
}
#endif  // PA_HAS_WMMA

// The scalar kernel's tile: rows, threads, chunk and dynamic shared memory.
template <typename KT, int DMAX, bool DECODE>
struct ScalarTile {
  static constexpr int kR = DECODE ? kDecodeRows : kPrefillRows;
  static constexpr int kNT = DECODE ? 128 : 256;
  static constexpr int kChunk = AttnLayout<KT, DMAX>::kChunk;
  static constexpr size_t kBytes = attn_smem_bytes<kR, kNT, kChunk, KT, DMAX>();
};

// The scalar kernel (decode tiles; prefill tiles of f32 queries, and of every type without WMMA).
template <typename T, typename KT, int DMAX, bool DECODE>
gpuError_t launch_attention_scalar(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  using Tile = ScalarTile<KT, DMAX, DECODE>;
  constexpr int R = Tile::kR;
  constexpr int NT = Tile::kNT;
  constexpr size_t smem = Tile::kBytes;
#if defined(PA_LDS_64K)
  static_assert(smem <= 64 * 1024, "tile exceeds the 64 KiB LDS of AMD GPUs");
#else
  static_assert(smem <= 163 * 1024, "tile exceeds the shared memory of sm_80");
#endif
  auto kernel = attention_kernel<T, KT, DMAX, R, NT>;
  if (smem > 48 * 1024) {
    static std::atomic<uint64_t> smem_set{0};
    const gpuError_t attr = raise_smem_limit(kernel, static_cast<int>(smem), smem_set);
    if (attr != gpuSuccess) return attr;
  }
  const int nhg = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_kv_heads * nhg));
  PA_LAUNCH(kernel, grid, NT, smem, stream)(p);
  return gpuGetLastError();
}

template <typename T, typename KT, int DMAX, bool DECODE>
gpuError_t launch_attention_one(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
#if defined(PA_HAS_WMMA)
  // Prefill tiles of 16-bit queries go to the tensor cores; the discarded branch keeps the scalar
  // kernel of those tiles, which would never launch, out of the build.
  if constexpr (!DECODE && sizeof(T) == 2) {
    return launch_attention_mma<T, KT, DMAX>(max_items, p, stream);
  } else {
    return launch_attention_scalar<T, KT, DMAX, DECODE>(max_items, p, stream);
  }
#else
  return launch_attention_scalar<T, KT, DMAX, DECODE>(max_items, p, stream);
#endif
}

// The dynamic shared memory of the tile launch_attention_one<T, KT, DMAX, DECODE> launches.
template <typename T, typename KT, int DMAX, bool DECODE>
constexpr size_t attention_tile_bytes() {
#if defined(PA_HAS_WMMA)
  if constexpr (!DECODE && sizeof(T) == 2) return MmaLayout<DMAX>::kBytes;
#endif
  return ScalarTile<KT, DMAX, DECODE>::kBytes;
}

// The most dynamic shared memory any attention tile of queries T asks for.
template <typename T>
size_t attention_smem_need_t() {
  size_t need = 0;
#define PA_NEED_HEAD(DM, KT)                                                         \
  need = std::max(need, std::max(attention_tile_bytes<T, KT, DM, true>(),           \
                                 attention_tile_bytes<T, KT, DM, false>()));
#define PA_NEED_CACHE(CODE, KT, ...) PA_GPU_HEAD_SIZES(PA_NEED_HEAD, KT)
  PA_GPU_CACHE_DTYPES(PA_NEED_CACHE, 0, T, )
#undef PA_NEED_CACHE
#undef PA_NEED_HEAD
  return need;
}

// The head sizes of instantiations.h: ascending, multiples of 8, the last PA_GPU_MAX_HEAD_SIZE.
#define PA_GPU_HEAD_ITEM(DM, ...) DM,
constexpr int kHeadSizes[] = {PA_GPU_HEAD_SIZES(PA_GPU_HEAD_ITEM, )};
#undef PA_GPU_HEAD_ITEM
constexpr bool head_sizes_ok() {
  const int n = static_cast<int>(sizeof(kHeadSizes) / sizeof(kHeadSizes[0]));
  for (int i = 0; i < n; ++i) {
    if (kHeadSizes[i] % 8 != 0 || (i > 0 && kHeadSizes[i] <= kHeadSizes[i - 1])) return false;
  }
  return kHeadSizes[n - 1] == PA_GPU_MAX_HEAD_SIZE;
}
static_assert(head_sizes_ok(), "PA_GPU_HEAD_SIZES must ascend in multiples of 8 and end at "
                               "PA_GPU_MAX_HEAD_SIZE");

// Picks the smallest instantiated DMAX >= head_size for cache type KT.
template <typename T, typename KT>
gpuError_t launch_attention_kt(bool decode, int32_t max_items, const AttnParams& p,
                               gpuStream_t stream, int* unsupported) {
#define PA_TRY_HEAD(DM, ...)                                                    \
  if (p.head_size <= DM) {                                                      \
    return decode ? launch_attention_one<T, KT, DM, true>(max_items, p, stream) \
                  : launch_attention_one<T, KT, DM, false>(max_items, p, stream); \
  }
  PA_GPU_HEAD_SIZES(PA_TRY_HEAD, )
#undef PA_TRY_HEAD
  *unsupported = 1;
  return gpuSuccess;
}

// Every cache type instantiations.h lists for queries of type T (code qt).
template <typename T>
gpuError_t launch_attention_t(int32_t qt, int32_t kt, bool decode, int32_t max_items,
                              const AttnParams& p, gpuStream_t stream, int* unsupported) {
#define PA_TRY_CACHE(CODE, KT, ...) \
  if (kt == (CODE)) return launch_attention_kt<T, KT>(decode, max_items, p, stream, unsupported);
  PA_GPU_CACHE_DTYPES(PA_TRY_CACHE, qt, T, )
#undef PA_TRY_CACHE
  *unsupported = 1;
  return gpuSuccess;
}

// Explicit instantiation of one query type's launchers, in its own translation unit
// (attention_<name>.cu); launch_attention (cache_ops.cu) calls them through gpu_kernels.h.
#define PA_GPU_INSTANTIATE_ATTENTION(T)                                                     \
  namespace pagedattn_gpu {                                                                 \
  template gpuError_t launch_attention_t<T>(int32_t, int32_t, bool, int32_t, const AttnParams&, \
                                            gpuStream_t, int*);                             \
  template size_t attention_smem_need_t<T>();                                               \
  }

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_ATTENTION_CUH
