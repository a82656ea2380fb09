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
  // bank groups (and keep every row 16-byte aligned, as ldmatrix needs). A staged K row's
  // padding holds the byte offsets of the key a later chunk stages there (KeyOffsets).
  static constexpr int kLd = kDP + 8;
  // Q's A fragments stay in registers up to head size 64; larger heads re-read them from
  // shared memory for every chunk (registers would spill).
  static constexpr bool kQInRegs = kDP <= 64;
  static constexpr size_t kQ = 0;
  static constexpr size_t kStage0 = kQ + 2u * kR * kLd;         // then K, V of stage 0, 1
  static constexpr size_t kStageBytes = 2u * 2u * kChunk * kLd;  // K and V of one stage
  static constexpr size_t kBytes = kStage0 + 2u * kStageBytes;
};

// Where a staged key's K and V rows are in the cache (bytes from p.kv.k / p.kv.v; -1: nothing
// to stage).
struct __align__(16) KeyOffsets {
  int64_t k, v;
};

// The float32 arithmetic of the softmax, one instruction each on sm_80+ (the emulator computes
// the same values with the host's libm).
// max.NaN: the larger of a and b, NaN when either is (a NaN score poisons its row).
__device__ __forceinline__ float fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && !defined(PA_SIM)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? NAN : fmaxf(a, b);
#endif
}

// 2^x: ex2.approx.ftz (relative error below 2^-22; 0 for -inf; subnormal results flush to 0).
__device__ __forceinline__ float exp2_fast(float x) {
#if defined(__CUDA_ARCH__) && !defined(PA_SIM)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return exp2f(x);
#endif
}

// Two floats rounded to nearest even to T, as one register of an mma operand (lo in the low
// half): one cvt.rn.{bf16x2,f16x2}.f32 for the pair.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && !defined(PA_SIM)
  uint32_t r;
  if constexpr (std::is_same<T, bf16_t>::value)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack_half2<T>(lo, hi);
#endif
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
// beyond the head size and beyond nk, for caches whose 8-element groups are not all aligned for
// one vector access: each piece finds its key's rows itself and copies in units of p.kv.vec
// bytes (an fp8 cache: 8 bytes through memcpy). The caller commits and waits.
template <typename T, typename KT, int DMAX, int WARPS>
__device__ __forceinline__ void stage_kv_unaligned(const AttnParams& p, const CtaWork& w, T* ks, T* vs,
                                               int c0, int nk) {
  using L = MmaLayout<DMAX, WARPS>;
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
        for (int b = 0; b < 16; b += p.kv.vec) {
          copy_unit_async(reinterpret_cast<char*>(kd) + b, reinterpret_cast<const char*>(kp) + b,
                          p.kv.vec);
          copy_unit_async(reinterpret_cast<char*>(vd) + b, reinterpret_cast<const char*>(vp) + b,
                          p.kv.vec);
        }
      } else {
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

// Converts 8 fp8 elements (the bytes of r) to T and stores them at dst (16-byte aligned): to
// float as load_floats does, then one packed conversion per pair.
template <typename T, typename KT>
__device__ __forceinline__ void stage8_fp8(T* dst, uint2 r) {
  float f[8];
  load_floats<KT, 8>(reinterpret_cast<const KT*>(&r), f);
  st_shared(reinterpret_cast<uint4*>(dst), make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]),
                                                      pack2<T>(f[4], f[5]), pack2<T>(f[6], f[7])));
}

// A thread's key in the paged cache, chunk after chunk: its block's index in the table and its
// slot, advanced by a chunk's keys without a division (step: the chunk's whole blocks and
// remaining slots, divided once).
struct KeyCursor {
  int block, slot, step_blocks, step_slots;
  __device__ __forceinline__ void advance(int block_size) {
    block += step_blocks;
    slot += step_slots;
    if (slot >= block_size) {
      slot -= block_size;
      ++block;
    }
  }
};

// The two halves of finding a chunk's key rows, one key per thread (thread k: key c0 + k, for
// k < kChunk; kc its KeyCursor): key_row_begin issues the block-table read, so that its latency
// passes while the CTA computes on the current chunk; key_row_end computes the rows' byte
// offsets (-1 past nk) and stores them in the padding of staged K row k of the stage the chunk
// will occupy, where stage_kv's pieces of that key read them.
__device__ __forceinline__ int key_row_begin(const AttnParams& p, const CtaWork& w,
                                             const KeyCursor& kc, int nk, int k) {
  if (!p.kv.paged || k >= nk) return 0;
  return ld_global(p.kv.tables + static_cast<int64_t>(w.seq) * p.kv.table_stride + kc.block,
                   kUseOther);
}
template <typename T, typename KT, int LD, int DP>
__device__ __forceinline__ void key_row_end(const AttnParams& p, const CtaWork& w, T* ks, int c0,
                                            const KeyCursor& kc, int nk, int k, int blk) {
  KeyOffsets o{-1, -1};
  if (k < nk) {
    if (p.kv.paged) {
      o.k = static_cast<int64_t>(blk) * p.kv.block_stride +
            static_cast<int64_t>(kc.slot) * p.kv.slot_stride +
            static_cast<int64_t>(w.kvh) * p.kv.head_stride;
      o.v = o.k;
    } else {
      key_offsets(p, w.seq, w.kvh, c0 + k, &o.k, &o.v);
    }
    o.k *= static_cast<int64_t>(sizeof(KT));
    o.v *= static_cast<int64_t>(sizeof(KT));
  }
  st_shared(reinterpret_cast<KeyOffsets*>(ks + k * LD + DP), o);
}

// Stages the chunk whose key rows key_row_end placed in ks's padding into ks/vs as T (rows of
// kLd elements), zero beyond the head size and the chunk's keys. A cache of type T is copied
// asynchronously, 16 bytes a piece (the caller commits and waits); an fp8 one is loaded into
// registers 8 pieces at a time, then converted, so those loads are in flight together.
template <typename T, typename KT, int DMAX, int WARPS>
__device__ __forceinline__ void stage_kv(const AttnParams& p, T* ks, T* vs) {
  using L = MmaLayout<DMAX, WARPS>;
  constexpr int G = L::kDP / 8;  // 8-element groups of a staged row
  constexpr int kIters = (L::kChunk * G + L::kNT - 1) / L::kNT;
  const int D = p.head_size;
  const char* kc = static_cast<const char*>(p.kv.k);
  const char* vc = static_cast<const char*>(p.kv.v);
  constexpr bool kWhole = L::kChunk * G % L::kNT == 0;  // every thread has kIters pieces
  // Piece n of a thread: key and 8-element column. Where NT is a multiple of G a thread keeps
  // its column and its keys step by NT / G, so its addresses are a base plus constants.
  auto piece = [&](int n, int* key, int* d0) {
    if constexpr (L::kNT % G == 0) {
      *key = static_cast<int>(threadIdx.x) / G + n * (L::kNT / G);
      *d0 = static_cast<int>(threadIdx.x) % G * 8;
    } else {
      const int i = threadIdx.x + n * L::kNT;
      *key = i / G;
      *d0 = i % G * 8;
    }
  };
  // A row offset is -1 (nothing to stage) or far below 2^63: its high word's sign says which.
  auto staged = [](int64_t off) { return static_cast<int32_t>(off >> 32) >= 0; };
  if constexpr (std::is_same<KT, T>::value) {
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      if (!kWhole && threadIdx.x + n * L::kNT >= L::kChunk * G) break;
      int key, d0;
      piece(n, &key, &d0);
      const KeyOffsets o = ld_shared(reinterpret_cast<const KeyOffsets*>(ks + key * L::kLd + L::kDP));
      const bool valid = staged(o.k) && d0 < D;
      const int64_t col = static_cast<int64_t>(d0) * static_cast<int64_t>(sizeof(KT));
      copy16_async_or_zero(reinterpret_cast<char*>(ks + key * L::kLd + d0), kc + col + o.k, valid);
      copy16_async_or_zero(reinterpret_cast<char*>(vs + key * L::kLd + d0), vc + col + o.v, valid);
    }
  } else {
    static_assert(sizeof(KT) == 1, "caches of another type than the queries' are fp8");
    constexpr int kBatch = kIters < 8 ? kIters : 8;  // pieces in registers at once
#pragma unroll 1
    for (int n0 = 0; n0 < kIters; n0 += kBatch) {
      uint2 kr[kBatch], vr[kBatch];  // 8 fp8 elements each; zero where nothing is staged
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        kr[n] = vr[n] = make_uint2(0, 0);
        if (kWhole || threadIdx.x + (n0 + n) * L::kNT < L::kChunk * G) {
          int key, d0;
          piece(n0 + n, &key, &d0);
          const KeyOffsets o =
              ld_shared(reinterpret_cast<const KeyOffsets*>(ks + key * L::kLd + L::kDP));
          if (staged(o.k) && d0 < D) {
            kr[n] = ld_global(reinterpret_cast<const uint2*>(kc + o.k + d0), kUseKV);
            vr[n] = ld_global(reinterpret_cast<const uint2*>(vc + o.v + d0), kUseKV);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < kBatch; ++n) {
        if (!kWhole && threadIdx.x + (n0 + n) * L::kNT >= L::kChunk * G) break;
        int key, d0;
        piece(n0 + n, &key, &d0);
        stage8_fp8<T, KT>(ks + key * L::kLd + d0, kr[n]);
        stage8_fp8<T, KT>(vs + key * L::kLd + d0, vr[n]);
      }
    }
  }
}

// Resident CTAs per SM the shared memory allows (2 prefill, 4+ decode), told to ptxas so that it
// sizes registers for them rather than for more.
//
// The main loop runs each chunk through one of two bodies: chunks every row sees whole (no soft
// cap, ALiBi, mask or tail, a positive scale) take the plain one, whose softmax costs five
// instructions per score (max, scale-and-subtract, exp2, sum, half a pack); the chunks at the
// diagonal, window or chunk edge, tree or tail take the masked one, which applies variant.h's
// rules per score. The running maxima live in the log2 domain (scaled by log2(e)).
template <typename T, typename KT, int DMAX, int WARPS>
__global__ void __launch_bounds__(MmaLayout<DMAX, WARPS>::kNT, WARPS == 1 ? 4 : 2)
    attention_mma_kernel(const AttnParams p) {
  using L = MmaLayout<DMAX, WARPS>;
  constexpr int R = L::kR, NT = L::kNT, CHUNK = L::kChunk, DP = L::kDP, LD = L::kLd;
  constexpr int NS = CHUNK / 8;  // score n-tiles of a warp's 16 rows
  constexpr int NO = DP / 8;     // output n-tiles
  constexpr int KQ = L::kQInRegs ? DP / 16 : 1;  // Q fragments kept in registers
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  static_assert(NS % 2 == 0 && DP % 16 == 0, "pairs of n-tiles per ldmatrix_x4");
  static_assert(CHUNK <= NT, "one thread finds each key's rows");

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
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // m: log2 domain

  const int nchunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
  // The plain chunks [plain_lo, plain_hi): keys every row of the tile sees (at or before the
  // first token, from the last token's visible_lo on, before a tree's new tokens).
  const float sl2 = w.qk_scale * kLog2e;
  const bool simple = !(p.soft_cap > 0.f) && !p.alibi && sl2 > 0.f && sl2 < INFINITY;
  int plain_lo = 0, plain_hi = 0;
  if (simple) {
    int klo = lo, khi = hi;
    if (p.kind == kDecoder) {
      khi = min(khi, w.pos_first + 1);
      if (w.tree) khi = min(khi, w.ctx);
      klo = max(klo, visible_lo(p, w.pos_first + it.tlen - 1));
    }
    plain_lo = (klo - lo + CHUNK - 1) / CHUNK;
    plain_hi = khi > lo ? (khi - lo) / CHUNK : 0;
  }

  // The keys [row_lo, row_hi) each of the lane's rows sees where no tree mask applies (none for
  // an unused row): the bounds body's masks.
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    row_lo[hr] = lo;
    row_hi[hr] = hi;
    if (p.kind == kDecoder) {
      row_lo[hr] = max(lo, visible_lo(p, qpos[hr]));
      row_hi[hr] = min(hi, qpos[hr] + 1);
    }
    if (!valid[hr]) row_lo[hr] = row_hi[hr] = 0;
  }
  const bool bounds = simple && !w.tree;  // masked chunks take the bounds body

  // Key rows: the vector path finds each chunk's two chunks ahead (key_row_begin/_end); a cache
  // not aligned for 16-byte pieces (8 for fp8) stages through stage_kv_unaligned.
  const bool vector = p.kv.vec >= static_cast<int>(8 * sizeof(KT));
  const int nk0 = min(CHUNK, hi - lo);
  KeyCursor kcur{0, 0, 0, 0};
  if (vector && tid < CHUNK) {
    if (p.kv.paged) {
      const int bs = p.kv.block_size;
      kcur = KeyCursor{(lo + tid) / bs, (lo + tid) % bs, CHUNK / bs, CHUNK % bs};
    }
    const int b0 = key_row_begin(p, w, kcur, nk0, tid);
    KeyCursor k1 = kcur;
    k1.advance(p.kv.block_size);
    const int nk1 = min(CHUNK, hi - lo - CHUNK);
    const int b1 = nchunks > 1 ? key_row_begin(p, w, k1, nk1, tid) : 0;
    key_row_end<T, KT, LD, DP>(p, w, stage_k(0), lo, kcur, nk0, tid, b0);
    if (nchunks > 1) key_row_end<T, KT, LD, DP>(p, w, stage_k(1), lo + CHUNK, k1, nk1, tid, b1);
    kcur = k1;
    kcur.advance(p.kv.block_size);  // chunk 2's, which step 0 finds
  }
  __syncthreads();  // Q and the first key rows are in place
  uint32_t qa[KQ][4];
  if constexpr (L::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
      ldmatrix_x4(qa[kk], qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
  }
  if (nchunks > 0) {
    if (vector)
      stage_kv<T, KT, DMAX, WARPS>(p, stage_k(0), stage_k(0) + CHUNK * LD);
    else
      stage_kv_unaligned<T, KT, DMAX, WARPS>(p, w, stage_k(0), stage_k(0) + CHUNK * LD, lo, nk0);
    async_commit();
  }

  // One chunk: stage the next, compute on this one, find the keys of the one after the next
  // (VECTOR: the vector path, else stage_kv_unaligned). MASK: 0 the plain body (every score
  // counts), 1 the bounds body (each row's key range, the scale folded into exp2 as in the
  // plain one), 2 the full body (variant_logit per score).
  auto step = [&](int c, auto mask_tag, auto vector_tag) {
    constexpr int MASK = decltype(mask_tag)::value;
    constexpr bool VECTOR = decltype(vector_tag)::value;
    const int c0 = lo + c * CHUNK;
    if (c + 1 < nchunks) {  // the next chunk streams in while this one is computed on
      T* kn = stage_k((c + 1) & 1);
      if constexpr (VECTOR)
        stage_kv<T, KT, DMAX, WARPS>(p, kn, kn + CHUNK * LD);
      else
        stage_kv_unaligned<T, KT, DMAX, WARPS>(p, w, kn, kn + CHUNK * LD, c0 + CHUNK,
                                               min(CHUNK, hi - c0 - CHUNK));
      async_commit();
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    const int c2 = c0 + 2 * CHUNK, nk2 = min(CHUNK, hi - c2);
    const bool ahead = VECTOR && c + 2 < nchunks && tid < CHUNK;
    const int blk2 = ahead ? key_row_begin(p, w, kcur, nk2, tid) : 0;
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
        uint32_t qf[4];
        if constexpr (!L::kQInRegs)
          ldmatrix_x4(qf, qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
        const uint32_t* qk = L::kQInRegs ? qa[kk % KQ] : qf;
#pragma unroll
        for (int jj = 0; jj < NS / 2; ++jj) {
          // Matrix lane / 8: keys 8 (m / 2) .. + 7 of the pair, dims 8 (m % 2) .. + 7.
          const int mi = lane >> 3;
          uint32_t kb[4];
          ldmatrix_x4(kb, ks + (jj * 16 + (mi >> 1) * 8 + (lane & 7)) * LD + kk * 16 +
                              (mi & 1) * 8);
          mma16816<T>(s[2 * jj], qk, kb);
          mma16816<T>(s[2 * jj + 1], qk, kb + 2);
        }
      }
      // The full body turns scores into logits (scale, soft cap, ALiBi, masks; -inf for keys
      // past the chunk and unused rows) in the log2 domain; the others scale in the exp2.
      // Then the online softmax of each row over the 4 lanes that hold it.
      const float sc = MASK == 2 ? 1.f : sl2;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float x = s[j][2 * hr + e];
            if constexpr (MASK == 1) {
              const int key = c0 + j * 8 + 2 * t4 + e;
              x = (key >= row_lo[hr] && key < row_hi[hr]) ? x : -INFINITY;
              s[j][2 * hr + e] = x;
            } else if constexpr (MASK == 2) {
              const int key = c0 + j * 8 + 2 * t4 + e;
              x = (valid[hr] && key < hi)
                      ? variant_logit(p, w, x * w.qk_scale, head[hr], key, qpos[hr]) * kLog2e
                      : -INFINITY;
              s[j][2 * hr + e] = x;
            }
            mx = fmax_nan(mx, x);
          }
        }
        mx = fmax_nan(mx, PA_SHFL_XOR(mx, 1));
        mx = fmax_nan(mx, PA_SHFL_XOR(mx, 2));
        const float m_new = fmax_nan(m[hr], mx * sc);
        // exp2(-inf - m_ref) is 0 for a masked score; a row without a finite logit yet subtracts
        // 0. A poisoned row's weights may turn NaN: row_norm makes its output NaN regardless.
        const float m_ref = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2_fast(m[hr] - m_ref);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = exp2_fast(fmaf(s[j][2 * hr + e], sc, -m_ref));
            s[j][2 * hr + e] = pe;
            sum += pe;
          }
        }
        l[hr] = l[hr] * alpha + sum;  // this lane's part; the quad's are added at the end
        m[hr] = m_new;
        // Once a row's maximum settles its factor is 1: the warp skips the rescale unless a
        // lane's row moved.
        if (alpha != 1.f) {
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            o[n][2 * hr] *= alpha;
            o[n][2 * hr + 1] *= alpha;
          }
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
    // The rows of the chunk after the next go where this chunk lies: into K rows' padding,
    // which the reads above leave alone.
    if (ahead) {
      key_row_end<T, KT, LD, DP>(p, w, stage_k(c & 1), c2, kcur, nk2, tid, blk2);
      kcur.advance(p.kv.block_size);
    }
    __syncthreads();  // the stage just read is the one the next iteration refills
  };
  // The vector path's runs of plain and of masked chunks are loops of their own; a cache not
  // aligned for it takes the full body throughout.
  using Plain = std::integral_constant<int, 0>;
  using Bounds = std::integral_constant<int, 1>;
  using Full = std::integral_constant<int, 2>;
  if (vector) {
    for (int c = 0; c < nchunks;) {
      const int plain_end = (c >= plain_lo && c < plain_hi) ? plain_hi : c;
      for (; c < plain_end; ++c) step(c, Plain(), std::true_type());
      const int masked_end = c < plain_lo ? min(plain_lo, nchunks) : nchunks;
      if (DP <= 128 && bounds) {  // at 256 a third body's registers would spill
        for (; c < masked_end; ++c) step(c, Bounds(), std::true_type());
      } else {
        for (; c < masked_end; ++c) step(c, Full(), std::true_type());
      }
    }
  } else {
    for (int c = 0; c < nchunks; ++c) step(c, Full(), std::false_type());
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
    const RowNorm nr =
        row_norm(m[hr] * kLn2, l[hr], row_sink(p.sinks, head[hr], !whole), w.v_scale);
    // A row whose keys all weighed nothing gives 0 (NaN when poisoned), whatever 0 * inf its
    // accumulators took from an infinite V.
    auto value = [&](int n, int e) { return l[hr] > 0.f ? o[n][2 * hr + e] * nr.inv : 0.f * nr.inv; };
    if (whole) {
      T* out = static_cast<T*>(p.out) + static_cast<int64_t>(qrow[hr]) * p.o_row +
               static_cast<int64_t>(head[hr]) * p.o_head;
      // Pairs of elements as one 32-bit store where the row allows it.
      const bool pairs = (reinterpret_cast<uintptr_t>(out) & 3) == 0;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const int d = n * 8 + 2 * t4;
        if (d >= D) continue;
        if (pairs) {
          st_global(reinterpret_cast<uint32_t*>(out + d), pack2<T>(value(n, 0), value(n, 1)),
                    kUseOut);
        } else {
          st_global(out + d, from_float<T>(value(n, 0)), kUseOut);
          st_global(out + d + 1, from_float<T>(value(n, 1)), kUseOut);
        }
      }
    } else {
      float* part = p.part_o + (static_cast<int64_t>(it.part) * p.num_heads + head[hr]) * D;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const int d = n * 8 + 2 * t4;
        if (d < D) st_global(reinterpret_cast<float2*>(part + d), make_float2(value(n, 0), value(n, 1)), kUseOut);
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
