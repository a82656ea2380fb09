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
#include "attention_mfma.cuh"
#include "attention_mma.cuh"
#include "instantiations.h"
#include "staging.cuh"
#include "types.cuh"
#include "variant.cuh"

namespace pagedattn_gpu {

// The default tile's kStages buffers of kChunk keys (K and V) each: one is computed on while the
// next loads.
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

template <int R, int CHUNK, int STAGES, typename KT, int DMAX>
constexpr size_t attn_smem_bytes() {
  using L = AttnLayout<KT, DMAX>;
  return sizeof(float) * R * L::kQRow + 2u * STAGES * CHUNK * L::kRowBytes +
         sizeof(float) * R * (CHUNK + 1) + sizeof(float) * 3 * R;
}

template <typename T, typename KT, int DMAX, int R, int NT, int CHUNK, int STAGES>
__global__ void __launch_bounds__(NT) attention_kernel(const AttnParams p) {
  using L = AttnLayout<KT, DMAX>;
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
  float* ss = reinterpret_cast<float*>(kv_bufs + STAGES * 2 * CHUNK * ROWB);
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
      x = to_float(ld_global(q + d, kUseQ));
    }
    st_shared(qs + i, x);
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
        st_shared(kb + key * ROWB + b, static_cast<char>(0));
        st_shared(vb + key * ROWB + b, static_cast<char>(0));
      }
    }
  };

  if (lo < hi) stage(lo, 0);
  async_commit();
  int buf = 0;
  for (int c0 = lo; c0 < hi; c0 += CHUNK, buf = (buf + 1) % STAGES) {
    const int nk = min(CHUNK, hi - c0);
    __syncthreads();  // the previous chunk is fully consumed: its buffer may be refilled
    if (STAGES == 1) {
      if (c0 != lo) stage(c0, 0);
    } else if (c0 + CHUNK < hi) {
      stage(c0 + CHUNK, (buf + 1) % STAGES);
    }
    async_commit();
    async_wait<STAGES - 1>();  // this thread's copies of chunk c0 have landed...
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
          const uint4 raw = ld_shared(reinterpret_cast<const uint4*>(krow + vi * 16));
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
          s = variant_logit(p, w, dots[j] * w.qk_scale, h0 + gi, kpos, pos_first + ti);
        }
        st_shared(ss + r * SS + key, s);
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
        load8_shared<KT>(reinterpret_cast<const KT*>(vcol + k * ROWB), vf);
        const float pk = ld_shared(pr + k);
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
    const int h = h0 + gi;
    const RowNorm n = row_norm(m_s[r], l_s[r], row_sink(p.sinks, h, it.part >= 0), w.v_scale);
    if (it.part < 0) {
      T* o = static_cast<T*>(p.out) + static_cast<int64_t>(row0 + ti) * p.o_row + h * p.o_head + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) st_global(o + e, from_float<T>(acc[u][e] * n.inv), kUseOut);
      if (d0 == 0 && p.lse)
        st_global(p.lse + static_cast<int64_t>(row0 + ti) * p.lse_row + h * p.lse_head, n.lse,
                  kUseOut);
    } else {
      float* o = p.part_o + (static_cast<int64_t>(it.part) * p.num_heads + h) * D + d0;
#pragma unroll
      for (int e = 0; e < 8; ++e) st_global(o + e, acc[u][e] * n.inv, kUseOut);
      if (d0 == 0)
        st_global(p.part_lse + static_cast<int64_t>(it.part) * p.num_heads + h, n.lse, kUseOut);
    }
  }
}



// The scalar kernel's tile: rows, threads, K/V chunk and stages, and dynamic shared memory.
template <typename KT, int DMAX, bool DECODE>
struct ScalarTile {
  static constexpr int kR = DECODE ? kDecodeRows : kPrefillRows;
  static constexpr int kNT = DECODE ? 128 : 256;
  static constexpr int kChunk = AttnLayout<KT, DMAX>::kChunk;
  static constexpr int kStages = pagedattn_gpu::kStages;
  static constexpr size_t kBytes = attn_smem_bytes<kR, kChunk, kStages, KT, DMAX>();
};

// The chunk of a one-stage tile that fits kSmallSmem: the default's, halved until it fits.
template <typename KT, int DMAX, bool DECODE>
constexpr int lean_chunk() {
  using Full = ScalarTile<KT, DMAX, DECODE>;
  int c = Full::kChunk;
  while (c > 8 && attn_smem_bytes<Full::kR, 0, 1, KT, DMAX>() +
                          static_cast<size_t>(c) * (2u * AttnLayout<KT, DMAX>::kRowBytes +
                                                    sizeof(float) * Full::kR) >
                      static_cast<size_t>(kSmallSmem))
    c /= 2;
  return c;
}

// The variant of a tile larger than kSmallSmem launched on devices that give a block less than
// the default needs (float32 queries at head sizes 192 and up): the same rows, one K/V stage
// (copies are not overlapped with compute) and a shorter chunk.
template <typename KT, int DMAX, bool DECODE>
struct LeanScalarTile {
  using Full = ScalarTile<KT, DMAX, DECODE>;
  static constexpr int kR = Full::kR;
  static constexpr int kNT = Full::kNT;
  static constexpr int kChunk = lean_chunk<KT, DMAX, DECODE>();
  static constexpr int kStages = 1;
  static constexpr size_t kBytes = attn_smem_bytes<kR, kChunk, kStages, KT, DMAX>();
  static_assert(kBytes <= static_cast<size_t>(kSmallSmem), "lean tile exceeds kSmallSmem");
};

// Whether tile Full has a lean variant: only where it does not fit the smallest devices.
template <typename KT, int DMAX, bool DECODE>
constexpr bool has_lean_tile() {
#if defined(PA_LDS_64K)
  return false;  // every AMD tile fits the 64 KiB of LDS
#else
  return ScalarTile<KT, DMAX, DECODE>::kBytes > static_cast<size_t>(kSmallSmem);
#endif
}

template <typename T, typename KT, int DMAX, typename Tile>
gpuError_t launch_scalar_tile(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  constexpr int NT = Tile::kNT;
  constexpr size_t smem = Tile::kBytes;
#if defined(PA_LDS_64K)
  static_assert(smem <= 64 * 1024, "tile exceeds the 64 KiB LDS of AMD GPUs");
#else
  static_assert(smem <= 163 * 1024, "tile exceeds the shared memory of sm_80");
#endif
  auto kernel = attention_kernel<T, KT, DMAX, Tile::kR, NT, Tile::kChunk, Tile::kStages>;
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

// The scalar kernel: tiles of f32 queries, and every tile where mma.sync is missing (HIP); the
// default tile where the device gives a block enough shared memory, else the lean one.
template <typename T, typename KT, int DMAX, bool DECODE>
gpuError_t launch_attention_scalar(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
  using Full = ScalarTile<KT, DMAX, DECODE>;
  if constexpr (has_lean_tile<KT, DMAX, DECODE>()) {
    if (p.smem_per_block < static_cast<int64_t>(Full::kBytes))
      return launch_scalar_tile<T, KT, DMAX, LeanScalarTile<KT, DMAX, DECODE>>(max_items, p,
                                                                              stream);
  }
  return launch_scalar_tile<T, KT, DMAX, Full>(max_items, p, stream);
}

template <typename T, typename KT, int DMAX, bool DECODE>
gpuError_t launch_attention_one(int32_t max_items, const AttnParams& p, gpuStream_t stream) {
#if defined(PA_HAS_MMA_SYNC)
  // Tiles of 16-bit queries go to the tensor cores (prefill: 4 warps, decode: 1); the discarded
  // branch keeps the scalar kernel of those tiles, which would never launch, out of the build.
  if constexpr (sizeof(T) == 2) {
    return launch_attention_mma<T, KT, DMAX, DECODE ? 1 : 4>(max_items, p, stream);
  } else {
    return launch_attention_scalar<T, KT, DMAX, DECODE>(max_items, p, stream);
  }
#elif defined(PA_MFMA_TILES)
  // The same on AMD's matrix cores (CDNA2+, wave 64) where the device has them: prefill 4
  // waves, decode 1. One HIP plugin serves every architecture, so this is a run-time choice.
  if constexpr (sizeof(T) == 2) {
    if (p.matrix_cores) return launch_attention_mfma<T, KT, DMAX, DECODE ? 1 : 4>(max_items, p, stream);
  }
  return launch_attention_scalar<T, KT, DMAX, DECODE>(max_items, p, stream);
#else
  return launch_attention_scalar<T, KT, DMAX, DECODE>(max_items, p, stream);
#endif
}

// The least dynamic shared memory with which launch_attention_one<T, KT, DMAX, DECODE> has a
// tile to launch: its lean tile's where it has one.
template <typename T, typename KT, int DMAX, bool DECODE>
constexpr size_t attention_tile_bytes() {
#if defined(PA_HAS_MMA_SYNC)
  if constexpr (sizeof(T) == 2) return MmaLayout<DMAX, DECODE ? 1 : 4>::kBytes;
#endif
  if constexpr (has_lean_tile<KT, DMAX, DECODE>()) return LeanScalarTile<KT, DMAX, DECODE>::kBytes;
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
