// kernels/cpu/decode_rows-inl.h — building blocks of the dot-product decode: K/V row addresses,
// pair loads, horizontal sums, scores and P.V of up to four rows with K and V converted in
// registers, and the online softmax and output pass every dot-product path shares.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_DECODE_ROWS_INL_H_
#undef PA_CPU_DECODE_ROWS_INL_H_
#else
#define PA_CPU_DECODE_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include "convert-inl.h"
#include "tile-inl.h"
#include "wide_rows-inl.h"
#include "prefetch-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Addresses of the K and V rows of keys [kt0, kt0 + nk), prefetching kPrefetchKeys ahead.
HWY_INLINE void key_ptrs(const AttnItem& it, int64_t kt0, int nk, const void** kp,
                         const void** vp, int64_t pf_end) {
  const KVSource& s = it.kv;
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  for (int k = 0; k < nk; ++k) {
    const int64_t pos = kt0 + k;
    int64_t koff, voff;
    key_offsets(it, pos, &koff, &voff);
    kp[k] = static_cast<const char*>(s.k) + koff * esz;
    vp[k] = static_cast<const char*>(s.v) + voff * esz;
    if (pos + kPrefetchKeys < pf_end) prefetch_key(it, pos + kPrefetchKeys);
  }
}

// bf16 decode reads K/V rows as full-width 32-bit words: the low halves are the even elements,
// the high halves the odd ones, so bf16 -> f32 is one shift or one mask, no widening shuffle. q
// and the accumulators hold each 2N-element chunk as [even elements, odd elements] (permute_pairs).

template <int DT>
HWY_INLINE void load_pair(const void* p, int i, hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
  const DF d;
  if constexpr (DT == kBF16Pairs) {
    const hn::RebindToUnsigned<DF> du;
    const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p) + i));
    lo = hn::BitCast(d, hn::ShiftLeft<16>(w));
    hi = hn::BitCast(d, hn::And(w, hn::Set(du, 0xFFFF0000u)));
#if PA_FP8_PAIRS
  } else if constexpr (is_fp8_pairs(DT)) {
    // 2N bytes widened at once, so the bit ops run once per 2N values (8 ops per 16 values
    // against 14 through load_vec), then the two halves go through f16 -> f32. In order.
    const hn::Repartition<int16_t, DF> d16;
    const hn::Half<decltype(d16)> d16h;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto h = fp8_f16_bits<base_dtype(DT)>(d16, static_cast<const int8_t*>(p) + i);
    lo = hn::PromoteTo(d, hn::BitCast(dh, hn::LowerHalf(d16h, h)));
    hi = hn::PromoteTo(d, hn::BitCast(dh, hn::UpperHalf(d16h, h)));
#endif
  } else {
    lo = load_vec<DT>(p, i);
    hi = load_vec<DT>(p, i + static_cast<int>(hn::Lanes(d)));
  }
}

// Reorders each 2N-chunk of x (n floats, a multiple of 2N) between natural order and
// [even elements, odd elements] (to_pairs false: back).
HWY_INLINE void permute_pairs(float* x, int n, bool to_pairs) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  float tmp[2 * hn::MaxLanes(DF())];
  for (int c = 0; c < n; c += 2 * N) {
    for (int j = 0; j < N; ++j) {
      if (to_pairs) {
        tmp[j] = x[c + 2 * j];
        tmp[N + j] = x[c + 2 * j + 1];
      } else {
        tmp[2 * j] = x[c + j];
        tmp[2 * j + 1] = x[c + N + j];
      }
    }
    memcpy(x + c, tmp, sizeof(float) * 2 * static_cast<size_t>(N));
  }
}

#if HWY_TARGET != HWY_SCALAR
// Four vectors -> one whose every 128-bit block holds [block sum of a0, of a1, of a2, of a3]:
// two interleave rounds, all within blocks.
HWY_INLINE hn::Vec<DF> block_sums4(hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2,
                                   hn::Vec<DF> a3) {
  const DF d;
  const hn::Repartition<uint64_t, DF> d64;
  // Each block: a0's lanes 0+2, a1's 0+2, a0's 1+3, a1's 1+3 (b0); the same of a2, a3 (b1).
  const auto b0 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const auto b1 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto c0 = hn::BitCast(d64, b0), c1 = hn::BitCast(d64, b1);
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, c0, c1)),
                 hn::BitCast(d, hn::InterleaveUpper(d64, c0, c1)));
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Sixteen accumulators -> one vector: lane i = the sum of a[i]'s lanes. The rounds within
// 128-bit blocks come first (block_sums4, on 16 and 8 vectors); the two across blocks last, on 4
// and 2: 6 cross-block shuffles, not 24: Zen 4 runs block-internal shuffles beside vdpbf16ps for
// free, cross-block ones only up to about one per two dot products.
HWY_INLINE __m512 reduce16(const __m512* a) {
  using V = hn::Vec<DF>;
  __m512 w[4];
  for (int j = 0; j < 4; ++j)
    w[j] = block_sums4(V{a[4 * j]}, V{a[4 * j + 1]}, V{a[4 * j + 2]}, V{a[4 * j + 3]}).raw;
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x44),
                                   _mm512_shuffle_f32x4(w[0], w[1], 0xEE));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x44),
                                   _mm512_shuffle_f32x4(w[2], w[3], 0xEE));
  // Block j: w[j]'s four blocks summed.
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}
#endif

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// Eight accumulators -> one vector: lane i = the sum of a[i]'s lanes. The rounds within 128-bit
// halves (block_sums4) first, one across them last.
HWY_INLINE __m256 reduce8(const __m256* a) {
  using V = hn::Vec<DF>;
  const __m256 w0 = block_sums4(V{a[0]}, V{a[1]}, V{a[2]}, V{a[3]}).raw;
  const __m256 w1 = block_sums4(V{a[4]}, V{a[5]}, V{a[6]}, V{a[7]}).raw;
  return _mm256_add_ps(_mm256_permute2f128_ps(w0, w1, 0x20), _mm256_permute2f128_ps(w0, w1, 0x31));
}
#endif

// Horizontal sums of R accumulators into out[j * kKeyTile]. For four rows, block_sums4 leaves
// [sum a0, sum a1, sum a2, sum a3] in every 128-bit block, then the blocks are added.
template <int R>
HWY_INLINE void reduce_rows(const hn::Vec<DF>* a, float* out) {
  const DF d;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (R == 4) {
    const auto c = block_sums4(a[0], a[1], a[2], a[3]);
    HWY_ALIGN float tmp[hn::MaxLanes(d)];
    hn::Store(c, d, tmp);
    const int N = static_cast<int>(hn::Lanes(d));
    for (int j = 0; j < 4; ++j) {
      float x = tmp[j];
      for (int b = 4; b < N; b += 4) x += tmp[b + j];
      out[j * kKeyTile] = x;
    }
    return;
  }
#endif
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) out[j * kKeyTile] = hn::GetLane(hn::SumOfLanes(d, a[j]));
}

// Row p of a tile as T elements, off bytes on (a later head's part of an NHD slot row).
template <class T>
HWY_INLINE const T* row_at(const void* p, int64_t off) {
  return reinterpret_cast<const T*>(static_cast<const char*>(p) + off);
}

// Scores of R rows (q at stride D) against KB keys from k, converting K in registers; each q
// load serves KB keys. Key rows are read at kp[k + b] + off bytes (off: the head's offset in a
// slot row, for items of several KV heads).
template <int DT, int R, int KB>
HWY_INLINE void score_keys(const float* HWY_RESTRICT q, int D, const void* const* kp, int k,
                           float* HWY_RESTRICT s, int64_t off) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> a[KB][R];
  HWY_UNROLL(4)
  for (int b = 0; b < KB; ++b) {
    HWY_UNROLL(4)
    for (int j = 0; j < R; ++j) a[b][j] = hn::Zero(d);
  }
  if constexpr (is_pairs(DT) && hn::MaxLanes(DF()) == 8) {
    // AVX2's 16 registers hold the KB x R accumulators and the KB keys' halves, converted first,
    // not 2R q vectors as well: q comes row by row (GCC makes it the FMAs' memory operand).
    for (int i = 0; i < D; i += 2 * N) {
      hn::Vec<DF> k0[KB], k1[KB];
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) load_pair<DT>(row_at<char>(kp[k + b], off), i, k0[b], k1[b]);
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) {
        const auto q0 = hn::Load(d, q + j * D + i);
        HWY_UNROLL(4)
        for (int b = 0; b < KB; ++b) a[b][j] = hn::MulAdd(q0, k0[b], a[b][j]);
        const auto q1 = hn::Load(d, q + j * D + i + N);
        HWY_UNROLL(4)
        for (int b = 0; b < KB; ++b) a[b][j] = hn::MulAdd(q1, k1[b], a[b][j]);
      }
    }
  } else if constexpr (is_pairs(DT)) {
    for (int i = 0; i < D; i += 2 * N) {
      hn::Vec<DF> q0[R], q1[R];
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) {
        q0[j] = hn::Load(d, q + j * D + i);
        q1[j] = hn::Load(d, q + j * D + i + N);
      }
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        hn::Vec<DF> k0, k1;
        load_pair<DT>(row_at<char>(kp[k + b], off), i, k0, k1);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[b][j] = hn::MulAdd(q1[j], k1, hn::MulAdd(q0[j], k0, a[b][j]));
      }
    }
  } else if constexpr (is_fp8_quads(DT)) {
#if PA_FP8_QUADS
    // q is read straight from L1 as the FMAs' memory operand: 4 x R accumulators, four converted
    // K vectors and the lookup tables fill the 32 registers.
    for (int i = 0; i < D; i += 4 * N) {
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        hn::Vec<DF> kv[4];
        load_fp8_quad<base_dtype(DT)>(row_at<char>(kp[k + b], off), i, kv);
        HWY_UNROLL(4)
        for (int c = 0; c < 4; ++c) {
          HWY_UNROLL(4)
          for (int j = 0; j < R; ++j)
            a[b][j] = hn::MulAdd(hn::Load(d, q + j * D + i + c * N), kv[c], a[b][j]);
        }
      }
    }
#endif
  } else {
    for (int i = 0; i < D; i += N) {
      hn::Vec<DF> qv[R];
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) qv[j] = hn::Load(d, q + j * D + i);
      HWY_UNROLL(4)
      for (int b = 0; b < KB; ++b) {
        const auto kv = load_vec<DT>(row_at<char>(kp[k + b], off), i);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[b][j] = hn::MulAdd(qv[j], kv, a[b][j]);
      }
    }
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (R == 4 && KB == 4) {
    // All 16 sums in one reduction: lane 4j + b is row j's score of key k + b.
    __m512 v[16];
    HWY_UNROLL(4)
    for (int b = 0; b < 4; ++b) {
      HWY_UNROLL(4)
      for (int j = 0; j < 4; ++j) v[4 * j + b] = a[b][j].raw;
    }
    alignas(64) float t[16];
    _mm512_store_ps(t, reduce16(v));
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) memcpy(s + j * kKeyTile + k, t + 4 * j, sizeof(float) * 4);
    return;
  }
#endif
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if constexpr (R == 4 && KB == 2) {
    // All 8 sums in one reduction: lanes 2j, 2j + 1 are row j's scores of keys k, k + 1.
    __m256 v[8];
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = a[0][j].raw;
      v[2 * j + 1] = a[1][j].raw;
    }
    alignas(32) float t[8];
    _mm256_store_ps(t, reduce8(v));
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) memcpy(s + j * kKeyTile + k, t + 2 * j, sizeof(float) * 2);
    return;
  }
#endif
  HWY_UNROLL(4)
  for (int b = 0; b < KB; ++b) reduce_rows<R>(a[b], s + k + b);
}

// Registers: KB x R accumulators + R q + one k; 4 x 4 fits AVX-512's 32, 2 x 4 AVX2's 16.
constexpr int kScoreKeys = hn::MaxLanes(DF()) >= 16 ? 4 : 2;
// 32 vector registers (AVX-512) hold 4 rows x 4 chunks plus p and v; 16 only half of that.
constexpr int kAccChunks = hn::MaxLanes(DF()) >= 16 ? 4 : 2;

// Scores of R rows against keys [0, nk) of kp; pf->step() after each score_keys.
template <int DT, int R>
HWY_INLINE void score_group(const float* HWY_RESTRICT q, int D, const void* const* kp, int nk,
                            float* HWY_RESTRICT s, PfStream* pf, int64_t off) {
  constexpr int KB = kScoreKeys;
  int k = 0;
  for (; k + KB <= nk; k += KB) {
    score_keys<DT, R, KB>(q, D, kp, k, s, off);
    pf->step();
  }
  for (; k < nk; ++k) {
    score_keys<DT, R, 1>(q, D, kp, k, s, off);
    pf->step();
  }
}

// Keys per pf->step() in P.V: 4 on AVX2, where a pass covers 2 vectors of 8 lanes and a step per
// key costs as many instructions as the key's FMAs; one elsewhere.
constexpr int kPvStepKeys = hn::MaxLanes(DF()) == 8 ? 4 : 1;

// acc rows (stride D) += sum_k p[j][k] * v_k for R rows, converting V in registers (rows read at
// vp[k] + off bytes). Keys outer, CH vectors of every row held in registers, so each p is
// broadcast once per CH chunks; pf->step() once per kPvStepKeys keys.
template <int DT, int R, int CH>
HWY_INLINE void acc_chunks(float* HWY_RESTRICT acc, int D, int i0, const float* HWY_RESTRICT p,
                           const void* const* vp, int nk, PfStream* pf, int64_t off) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  hn::Vec<DF> a[R][CH];
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) {
    HWY_UNROLL(4)
    for (int c = 0; c < CH; ++c) a[j][c] = hn::Load(d, acc + j * D + i0 + c * N);
  }
  auto key = [&](int k) HWY_ATTR {
    hn::Vec<DF> pj[R];
    HWY_UNROLL(4)
    for (int j = 0; j < R; ++j) pj[j] = hn::Set(d, p[j * kKeyTile + k]);
    if constexpr (is_pairs(DT)) {
      static_assert(CH % 2 == 0, "pairs come two chunks at a time");
      HWY_UNROLL(4)
      for (int c = 0; c < CH; c += 2) {
        hn::Vec<DF> v0, v1;
        load_pair<DT>(row_at<char>(vp[k], off), i0 + c * N, v0, v1);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) {
          a[j][c] = hn::MulAdd(pj[j], v0, a[j][c]);
          a[j][c + 1] = hn::MulAdd(pj[j], v1, a[j][c + 1]);
        }
      }
    } else if constexpr (is_fp8_quads(DT)) {
#if PA_FP8_QUADS
      static_assert(CH == 4, "fp8 quads come four chunks at a time");
      hn::Vec<DF> v[4];
      load_fp8_quad<base_dtype(DT)>(row_at<char>(vp[k], off), i0, v);
      HWY_UNROLL(4)
      for (int j = 0; j < R; ++j) {
        HWY_UNROLL(4)
        for (int c = 0; c < 4; ++c) a[j][c] = hn::MulAdd(pj[j], v[c], a[j][c]);
      }
#endif
    } else {
      HWY_UNROLL(4)
      for (int c = 0; c < CH; ++c) {
        const auto v = load_vec<DT>(row_at<char>(vp[k], off), i0 + c * N);
        HWY_UNROLL(4)
        for (int j = 0; j < R; ++j) a[j][c] = hn::MulAdd(pj[j], v, a[j][c]);
      }
    }
  };
  constexpr int S = kPvStepKeys;
  int k = 0;
  for (; k + S <= nk; k += S) {
    pf->step();
    HWY_UNROLL(4)
    for (int b = 0; b < S; ++b) key(k + b);
  }
  if (k < nk) {
    pf->step();
    for (; k < nk; ++k) key(k);
  }
  HWY_UNROLL(4)
  for (int j = 0; j < R; ++j) {
    HWY_UNROLL(4)
    for (int c = 0; c < CH; ++c) hn::Store(a[j][c], d, acc + j * D + i0 + c * N);
  }
}

template <int DT, int R>
HWY_INLINE void acc_group(float* HWY_RESTRICT acc, int D, const float* HWY_RESTRICT p,
                          const void* const* vp, int nk, PfStream* pf, int64_t off) {
  constexpr int CH = kAccChunks;
  const int N = static_cast<int>(hn::Lanes(DF()));
  int i0 = 0;
  for (; i0 + CH * N <= D; i0 += CH * N)
    acc_chunks<DT, R, CH>(acc, D, i0, p, vp, nk, pf, off);
  if constexpr (is_pairs(DT)) {
    for (; i0 < D; i0 += 2 * N)
      acc_chunks<DT, R, 2>(acc, D, i0, p, vp, nk, pf, off);
  } else if constexpr (is_fp8_quads(DT)) {
    // D is a multiple of 4N here: the loop above did every chunk.
  } else {
    for (; i0 < D; i0 += N) acc_chunks<DT, R, 1>(acc, D, i0, p, vp, nk, pf, off);
  }
}

// pf->step() calls of scores_fast (score) or accumulate_fast (P.V) over `rows` rows and nk
// keys: the loops above, counted.
template <int DT>
HWY_INLINE int64_t in_calls(bool score, int rows, int D, int nk) {
  const int groups = (rows + 3) / 4;
  if (score) return static_cast<int64_t>(groups) * (nk / kScoreKeys + nk % kScoreKeys);
  const int N = static_cast<int>(hn::Lanes(DF()));
  const int whole = D / (kAccChunks * N), rest = D % (kAccChunks * N);
  const int passes = whole + (is_pairs(DT) ? rest / (2 * N) : (is_fp8_quads(DT) ? 0 : rest / N));
  return static_cast<int64_t>(groups) * passes * ((nk + kPvStepKeys - 1) / kPvStepKeys);
}

template <int DT>
HWY_INLINE void scores_fast(const float* q, int rows, int D, const void* const* kp, int nk,
                            float* s, PfStream* pf, int64_t off) {
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    score_group<DT, 4>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off);
  switch (rows - r) {
    case 3: score_group<DT, 3>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    case 2: score_group<DT, 2>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    case 1: score_group<DT, 1>(q + r * D, D, kp, nk, s + r * kKeyTile, pf, off); break;
    default: break;
  }
}

template <int DT>
HWY_INLINE void accumulate_fast(float* acc, int rows, int D, const float* p,
                                const void* const* vp, int nk, PfStream* pf, int64_t off) {
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    acc_group<DT, 4>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off);
  switch (rows - r) {
    case 3: acc_group<DT, 3>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    case 2: acc_group<DT, 2>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    case 1: acc_group<DT, 1>(acc + r * D, D, p + r * kKeyTile, vp, nk, pf, off); break;
    default: break;
  }
}

// Rounds p[0, n) (finite, >= 0; n a multiple of N) to bf16 values, to nearest even, in place;
// returns their sum.
HWY_INLINE float round_bf16_sum(float* HWY_RESTRICT p, int n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const int N = static_cast<int>(hn::Lanes(d));
  auto sum = hn::Zero(d);
  for (int k = 0; k < n; k += N) {
    const auto u = hn::BitCast(du, hn::Load(d, p + k));
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto r = hn::BitCast(d, hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), odd)),
                                          hn::Set(du, 0xFFFF0000u)));
    hn::Store(r, d, p + k);
    sum = hn::Add(sum, r);
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// Row r's running max becomes max(m[r], mt); when it grows, the row's sum and its Dp accumulators
// are rescaled to it (alpha 0 for a row that had seen nothing). A NaN or +inf max poisons the row
// for good (max_poisoned): nothing is rescaled, the output pass writes NaN. Returns the new max.
HWY_INLINE float raise_max(Scratch* sc, int r, float mt, int Dp) {
  const float mold = sc->m[r];
  const float mnew = max_keep_nan(mold, mt);
  if (max_poisoned(mnew)) {
    sc->m[r] = mnew;
    return mnew;
  }
  if (mold != mnew) {
    const float alpha = mold == -std::numeric_limits<float>::infinity() ? 0.0f : expf(mold - mnew);
    sc->l[r] *= alpha;
    scale_row(sc->acc + static_cast<size_t>(r) * Dp, alpha, Dp);
    sc->m[r] = mnew;
  }
  return mnew;
}

// Online softmax over one key tile of the dot-product paths: rows r = t * nh + g hold raw scores
// s[r][0, nk) (times sfac), which become masked, capped, biased, exponentiated weights; m and l
// are updated and the accumulator rows (Dp floats) rescaled when a row's maximum grows. Entries
// nk..kKeyTile are -inf. bf16_weights: the weights are rounded to bf16 values and l sums the
// rounded ones, so P.V in bf16 divides by exactly the weights it used. A NaN score makes the
// tile's max NaN; a row whose max is poisoned gets weights 0 (its output pass writes NaN).
// Returns false when no row sees any key of the tile.
HWY_INLINE bool softmax_tile(const AttnItem& it, Scratch* sc, int64_t kt0, int nk, bool plain,
                             int Dp, float sfac, bool bf16_weights = false) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  bool any = false;
  for (int t = 0; t < ntok; ++t) {
    const int64_t lo = item_row_lo(it, t), hi = item_row_hi(it, t);
    const int64_t dense_hi = item_row_dense_hi(it, t);
    const int64_t pos = item_pos(it, t);
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      float* s = sc->s + r * kKeyTile;
      if (sfac != 1.0f) scale_row(s, sfac, kKeyTile);
      const bool alibi = it.alibi != nullptr;
      const float slope = alibi ? it.alibi[it.h0 + g] : 0.0f;
      float mt = kNegInf;
      if (plain && lo <= kt0 && kt0 + nk - 1 <= dense_hi) {  // whole tile visible, nothing to add
        int k = 0;
        if (nk == kKeyTile) {
          const DF d;
          const int N = static_cast<int>(hn::Lanes(d));
          auto vmax = hn::Load(d, s);
          auto nan = hn::IsNaN(vmax);
          for (k = N; k < kKeyTile; k += N) {
            const auto x = hn::Load(d, s + k);
            vmax = hn::Max(vmax, x);
            nan = hn::Or(nan, hn::IsNaN(x));
          }
          mt = hn::AllFalse(d, nan) ? hn::GetLane(hn::MaxOfLanes(d, vmax))
                                    : std::numeric_limits<float>::quiet_NaN();
        }
        for (; k < nk; ++k) mt = max_keep_nan(mt, s[k]);
      } else {
        for (int k = 0; k < nk; ++k) {
          const int64_t kp = kt0 + k;
          float x = s[k];
          x = kp < lo || kp > hi || !item_tree_sees(it, t, kp)
                  ? kNegInf
                  : logit(x, it.soft_cap, alibi, slope, kp, pos);
          s[k] = x;
          mt = max_keep_nan(mt, x);
        }
      }
      for (int k = nk; k < kKeyTile; ++k) s[k] = kNegInf;
      if (mt == kNegInf) {  // nothing visible in this tile for this row: weights 0
        for (int k = 0; k < (bf16_weights ? kKeyTile : nk); ++k) s[k] = 0.0f;
        continue;
      }
      const float mnew = raise_max(sc, r, mt, Dp);
      if (max_poisoned(mnew)) {
        for (int k = 0; k < (bf16_weights ? kKeyTile : nk); ++k) s[k] = 0.0f;
        continue;
      }
      any = true;
      const float tile_sum = exp_row(s, mnew, nk);
      if (bf16_weights) {
        for (int k = nk; k < kKeyTile; ++k) s[k] = 0.0f;
        sc->l[r] += round_bf16_sum(s, kKeyTile);
      } else {
        sc->l[r] += tile_sum;
      }
    }
  }
  return any;
}

// The output pass of the dot-product paths: each row's normalised output (and lse), or its
// partial state for a later merge. Accumulator rows have stride Dp, natural dim order.
HWY_INLINE void write_rows(const AttnItem& it, const float* acc, const float* m, const float* l_,
                           int Dp) {
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      const float* a = acc + static_cast<size_t>(r) * Dp;
      if (it.out == nullptr) {
        memcpy(it.part_acc + static_cast<size_t>(r) * D, a, sizeof(float) * static_cast<size_t>(D));
        it.part_m[r] = m[r];
        it.part_l[r] = l_[r];
        continue;
      }
      const RowNorm nr = row_norm(m[r], l_[r], item_sink(it, g));
      store_row(item_out(it, t, g), it.dtype, a, nr.inv, D);
      if (it.lse != nullptr)
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] = nr.lse;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_DECODE_ROWS_INL_H_
