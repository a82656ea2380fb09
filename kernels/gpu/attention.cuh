// attention.cuh — one kernel template for decode and prefill tiles over a paged cache.
//
// A CTA owns R rows = (tile tokens) x (query heads of one GQA group) of one sequence, so each
// K/V chunk it stages in shared memory is read from memory once for the whole group. Keys are
// processed in chunks of CHUNK with an online softmax; scores, probabilities and the output
// accumulators stay in float32.
#ifndef PAGEDATTN_GPU_ATTENTION_CUH
#define PAGEDATTN_GPU_ATTENTION_CUH

#include <math.h>

#include "gpu_kernels.h"
#include "types.cuh"

namespace pagedattn_gpu {

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

template <typename KT, int DMAX>
struct AttnLayout {
  static constexpr int kES = sizeof(KT);
  // Shared-memory row of one key: padded by 16 bytes so 8 consecutive keys read with 16-byte
  // accesses land in distinct bank groups.
  static constexpr int kRowBytes = ((DMAX * kES + 15) / 16) * 16 + 16;
  static constexpr int kQRow = ((DMAX + 15) / 16) * 16;  // floats per staged query row
#if defined(PA_HIP)
  // 64 KiB of LDS per workgroup on AMD: shorter chunks for the widest rows.
  static constexpr int kChunk = (DMAX * kES <= 256) ? 64 : (DMAX * kES <= 512 ? 32 : 16);
#else
  static constexpr int kChunk = (DMAX * kES <= 256) ? 64 : 32;
#endif
};

template <int R, int NT, int CHUNK, typename KT, int DMAX>
constexpr size_t attn_smem_bytes() {
  using L = AttnLayout<KT, DMAX>;
  return sizeof(float) * R * L::kQRow + 2u * CHUNK * L::kRowBytes +
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

  extern __shared__ __align__(16) char smem_raw[];
  float* qs = reinterpret_cast<float*>(smem_raw);
  char* ks = smem_raw + sizeof(float) * R * QROW;
  char* vs = ks + CHUNK * ROWB;
  float* ss = reinterpret_cast<float*>(vs + CHUNK * ROWB);
  float* m_s = ss + R * SS;
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const int tid = threadIdx.x;
  const int D = p.head_size;
  const int hpc = p.heads_per_cta;
  const int nhg = (p.group + hpc - 1) / hpc;
  const int kvh = blockIdx.y / nhg;
  const int g0 = (blockIdx.y % nhg) * hpc;
  const int gh = min(hpc, p.group - g0);
  const int h0 = kvh * p.group + g0;
  const int seq = it.seq;
  const int qlen = p.query_lens[seq];
  const int ctx = (p.kind == kDecoder) ? p.context_lens[seq] : 0;
  const int row0 = p.query_start[seq] + it.t0;
  const int rows_used = it.tlen * hpc;

  int kv_len;
  if (p.kind == kDecoder) kv_len = ctx + qlen;
  else if (p.kind == kEncoder) kv_len = qlen;
  else kv_len = p.encoder_lens[seq];
  int lo = max(it.kv_begin, 0);
  int hi = min(it.kv_end, kv_len);
  const int pos_first = ctx + it.t0;
  if (p.kind == kDecoder) {
    hi = min(hi, pos_first + it.tlen);
    if (p.window > 0) lo = max(lo, pos_first - p.window + 1);
  }

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

  for (int c0 = lo; c0 < hi; c0 += CHUNK) {
    const int nk = min(CHUNK, hi - c0);
    __syncthreads();  // previous chunk fully consumed
    // Stage K and V rows of this chunk.
#pragma unroll 4
    for (int i = tid; i < nk * units; i += NT) {
      const int key = i / units, u = i % units;
      const int pos = c0 + key;
      int64_t koff, voff;
      if (p.kv.paged) {
        const int blk = p.kv.tables[static_cast<int64_t>(seq) * p.kv.table_stride + pos / p.kv.block_size];
        koff = static_cast<int64_t>(blk) * p.kv.block_stride +
               static_cast<int64_t>(pos % p.kv.block_size) * p.kv.slot_stride +
               static_cast<int64_t>(kvh) * p.kv.head_stride;
        voff = koff;
      } else {
        const int64_t row = p.query_start[seq] + pos;
        koff = row * p.kv.slot_stride + static_cast<int64_t>(kvh) * p.kv.head_stride;
        voff = row * p.kv.v_slot_stride + static_cast<int64_t>(kvh) * p.kv.v_head_stride;
      }
      const int64_t ub = static_cast<int64_t>(u) * vec;
      copy_unit(ks + key * ROWB + u * vec, static_cast<const char*>(p.kv.k) + koff * ES + ub, vec);
      copy_unit(vs + key * ROWB + u * vec, static_cast<const char*>(p.kv.v) + voff * ES + ub, vec);
    }
    if (row_bytes16 != row_bytes) {  // fp8 rows not a multiple of 16 bytes: zero the tail
      const int tail = row_bytes16 - row_bytes;
      for (int i = tid; i < nk * tail; i += NT) {
        const int key = i / tail, b = row_bytes + i % tail;
        ks[key * ROWB + b] = 0;
        vs[key * ROWB + b] = 0;
      }
    }
    __syncthreads();

    // Scores: thread = (key, row group); the K row is read once per 16 bytes for RPT rows.
    {
      const int key = tid % CHUNK;
      const int rg = tid / CHUNK;
      float dots[RPT];
#pragma unroll
      for (int j = 0; j < RPT; ++j) dots[j] = 0.f;
      if (key < nk) {
        const char* krow = ks + key * ROWB;
        for (int vi = 0; vi < nvec; ++vi) {
          const uint4 raw = *reinterpret_cast<const uint4*>(krow + vi * 16);
          float kf[NV];
          load_floats<KT, NV>(reinterpret_cast<const KT*>(&raw), kf);
#pragma unroll
          for (int j = 0; j < RPT; ++j) {
            const int r = rg + j * RG;
            if (r < R) {
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
          s = dots[j] * p.scale;
          if (p.soft_cap > 0.f) s = p.soft_cap * tanhf(s / p.soft_cap);
          const int qpos = pos_first + ti;
          if (p.alibi) s += p.alibi[h0 + gi] * static_cast<float>(kpos - qpos);
          if (p.kind == kDecoder) {
            if (kpos > qpos || (p.window > 0 && qpos - kpos >= p.window)) s = kNegInf;
          }
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
        float mx = kNegInf;
        for (int k = lane; k < CHUNK; k += PA_WARP_SIZE) mx = fmaxf(mx, ss[r * SS + k]);
#pragma unroll
        for (int o = PA_WARP_SIZE / 2; o > 0; o >>= 1) mx = fmaxf(mx, PA_SHFL_XOR(mx, o));
        const float m_old = m_s[r];
        const float m_new = fmaxf(m_old, mx);
        float sum = 0.f;
        for (int k = lane; k < CHUNK; k += PA_WARP_SIZE) {
          const float s = ss[r * SS + k];
          const float e = (s == kNegInf) ? 0.f : __expf(s - m_new);
          ss[r * SS + k] = e;
          sum += e;
        }
#pragma unroll
        for (int o = PA_WARP_SIZE / 2; o > 0; o >>= 1) sum += PA_SHFL_XOR(sum, o);
        if (lane == 0) {
          const float alpha = (m_old == kNegInf) ? 0.f : __expf(m_old - m_new);
          l_s[r] = l_s[r] * alpha + sum;
          m_s[r] = m_new;
          a_s[r] = alpha;
        }
      }
    }
    __syncthreads();

    // P.V: thread owns 8-wide output units (row, d0..d0+7).
#pragma unroll
    for (int u = 0; u < UPT; ++u) {
      const int unit = tid + u * NT;
      const int r = unit / dunits;
      if (r >= rows_used) continue;
      const int d0 = (unit % dunits) * 8;
      const float a = a_s[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[u][e] *= a;
      const float* pr = ss + r * SS;
      const char* vcol = vs + d0 * ES;
      for (int k = 0; k < nk; ++k) {
        float vf[8];
        load8<KT>(reinterpret_cast<const KT*>(vcol + k * ROWB), vf);
        const float pk = pr[k];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = fmaf(pk, vf[e], acc[u][e]);
      }
    }
  }
  __syncthreads();

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
    const float inv = (l > 0.f) ? p.v_scale / l : 0.f;
    const float lse = (l > 0.f) ? m_s[r] + logf(l) : kNegInf;
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

template <typename T, typename KT, int DMAX, bool DECODE>
gpuError_t launch_attention_one(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  constexpr int R = DECODE ? kDecodeRows : kPrefillRows;
  constexpr int NT = DECODE ? 128 : 256;
  constexpr int CHUNK = AttnLayout<KT, DMAX>::kChunk;
  constexpr size_t smem = attn_smem_bytes<R, NT, CHUNK, KT, DMAX>();
  auto kernel = attention_kernel<T, KT, DMAX, R, NT>;
  if (smem > 48 * 1024) {
    // Needed once per kernel; repeating it is harmless and keeps no host state.
    static const gpuError_t attr = gpuFuncSetMaxDynamicSmem(kernel, static_cast<int>(smem));
    if (attr != gpuSuccess) return attr;
  }
  const int nhg = (p.group + p.heads_per_cta - 1) / p.heads_per_cta;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_kv_heads * nhg));
  kernel<<<grid, NT, smem, stream>>>(p);
  return gpuGetLastError();
}

// Picks the smallest instantiated DMAX >= head_size for cache type KT.
template <typename T, typename KT>
gpuError_t launch_attention_kt(bool decode, int32_t max_items, const AttnParams& p,
                               gpuStream_t stream, int* unsupported) {
#define PA_TRY_HEAD(DM, _)                                                      \
  if (p.head_size <= DM) {                                                      \
    return decode ? launch_attention_one<T, KT, DM, true>(max_items, p, stream) \
                  : launch_attention_one<T, KT, DM, false>(max_items, p, stream); \
  }
  PA_GPU_HEAD_SIZES(PA_TRY_HEAD, 0)
#undef PA_TRY_HEAD
  *unsupported = 1;
  return gpuSuccess;
}

template <typename T>
gpuError_t launch_attention_t(int32_t kt, bool decode, int32_t max_items, const AttnParams& p,
                              gpuStream_t stream, int* unsupported) {
  switch (kt) {
    case kE4M3: return launch_attention_kt<T, e4m3_t>(decode, max_items, p, stream, unsupported);
    case kE5M2: return launch_attention_kt<T, e5m2_t>(decode, max_items, p, stream, unsupported);
    default: return launch_attention_kt<T, T>(decode, max_items, p, stream, unsupported);
  }
}

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_ATTENTION_CUH
