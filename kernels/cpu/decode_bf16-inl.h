// kernels/cpu/decode_bf16-inl.h — building blocks of the bf16 dot-product decode (AVX3_DL CPUs with
// AVX512_BF16: Zen 4, Sapphire Rapids). Defines PA_DP on AVX3_DL; the files after it hold code only
// where it is defined.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_DECODE_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_DECODE_BF16_INL_H_
#undef PA_CPU_DECODE_BF16_INL_H_
#else
#define PA_CPU_DECODE_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include "convert-inl.h"
#include "store-inl.h"
#include "prefetch-inl.h"
#include "decode_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// vdpbf16ps multiplies bf16 pairs into float32 accumulators: 32 products per instruction against
// 16 for an FMA, and bf16 K/V need no conversion. Scores: q is rounded to bf16 (exact for a bf16
// model; fp8 caches only otherwise: its error is far below fp8's), dot products over pairs of
// dims, the scale applied to the scores. P.V: the weights are rounded to bf16 (as flash-attention
// kernels do) and paired over two keys, so each instruction adds two keys' V rows. fp8 K/V become
// bf16 through two VBMI byte lookups (exact: every fp8 value is a bf16 value). Accumulators keep
// the dims in the order the unpacks leave them; the output pass puts them back.
#undef PA_DP
#undef PA_DP_ATTR
#if HWY_TARGET == HWY_AVX3_DL
#define PA_DP 1
#define PA_DP_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// bf16 bits of the fp8 magnitude m7 (7 bits), exact; the sign is added separately.
constexpr uint16_t fp8_bf16_mag(bool e4m3, int m7) {
  const int mbits = e4m3 ? 3 : 2;
  const int e = m7 >> mbits, m = m7 & ((1 << mbits) - 1);
  if (e4m3 && m7 == 0x7F) return 0x7FC0;                                     // e4m3fn's NaN
  if (!e4m3 && e == 31) return static_cast<uint16_t>(0x7F80 | (m << 5));     // inf, NaN
  const int bias = e4m3 ? 7 : 15;
  if (e > 0) return static_cast<uint16_t>(((e - bias + 127) << 7) | (m << (7 - mbits)));
  if (m == 0) return 0;
  const int lead = m >= 4 ? 2 : (m >= 2 ? 1 : 0);  // subnormal: m * 2^(1 - bias - mbits)
  return static_cast<uint16_t>(((lead + 1 - bias - mbits + 127) << 7) |
                               ((m - (1 << lead)) << (7 - lead)));
}

struct Bf16Tables {
  alignas(64) uint8_t lo[128];  // low byte of the magnitude's bf16 bits
  alignas(64) uint8_t hi[128];  // high byte
};

constexpr Bf16Tables make_bf16_tables(bool e4m3) {
  Bf16Tables t{};
  for (int m7 = 0; m7 < 128; ++m7) {
    t.lo[m7] = static_cast<uint8_t>(fp8_bf16_mag(e4m3, m7) & 0xFF);
    t.hi[m7] = static_cast<uint8_t>(fp8_bf16_mag(e4m3, m7) >> 8);
  }
  return t;
}

constexpr Bf16Tables kE4M3Bf16 = make_bf16_tables(true);
constexpr Bf16Tables kE5M2Bf16 = make_bf16_tables(false);

// The lookup tables in registers.
struct Fp8Lut {
  __m512i lo0, lo1, hi0, hi1, sign;
};

template <int DT>
PA_DP_ATTR HWY_INLINE Fp8Lut fp8_lut() {
  const Bf16Tables& t = DT == PAGEDATTN_DTYPE_FP8_E4M3 ? kE4M3Bf16 : kE5M2Bf16;
  return Fp8Lut{_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64), _mm512_load_si512(t.hi),
                _mm512_load_si512(t.hi + 64), _mm512_set1_epi8(static_cast<char>(0x80))};
}

// 64 fp8 bytes x as bf16: w0 word 8b + t is byte 16b + t, w1 word 8b + t byte 16b + 8 + t
// (b the 128-bit block, t < 8).
PA_DP_ATTR HWY_INLINE void fp8_bf16(const Fp8Lut& L, __m512i x, __m512i& w0, __m512i& w1) {
  const __m512i lo = _mm512_permutex2var_epi8(L.lo0, x, L.lo1);  // index bit 7 ignored
  __m512i hi = _mm512_permutex2var_epi8(L.hi0, x, L.hi1);
  hi = _mm512_ternarylogic_epi32(hi, x, L.sign, 0xF8);  // hi | (x & 0x80)
  w0 = _mm512_unpacklo_epi8(lo, hi);
  w1 = _mm512_unpackhi_epi8(lo, hi);
}

constexpr bool dp_fp8(int DT) { return DT != PAGEDATTN_DTYPE_BFLOAT16; }

// Dims per group of the P.V accumulators (bf16: 64, or 32 for a last half group; fp8: 64) and the
// natural dim of accumulator position x of a group (x = 16v + 4b + t: vector v, block b, lane t).
template <int DT>
HWY_INLINE int dp_dim(int x) {
  const int v = x >> 4, b = (x >> 2) & 3, t = x & 3;
  if constexpr (dp_fp8(DT)) return 16 * b + 4 * v + t;
  return 32 * (v >> 1) + 8 * b + 4 * (v & 1) + t;
}

// A row of D accumulators from accumulator order back to natural dim order, times f (dp_dim as
// 128-bit block shuffles).
template <int DT>
PA_DP_ATTR HWY_INLINE void dp_unpermute(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst,
                                        int D, float f) {
  const __m512 vf = _mm512_set1_ps(f);
  if constexpr (dp_fp8(DT)) {
    for (int x = 0; x < D; x += 64) {
      const __m512 v0 = _mm512_loadu_ps(src + x), v1 = _mm512_loadu_ps(src + x + 16);
      const __m512 v2 = _mm512_loadu_ps(src + x + 32), v3 = _mm512_loadu_ps(src + x + 48);
      const __m512 lo01 = _mm512_shuffle_f32x4(v0, v1, 0x44), lo23 = _mm512_shuffle_f32x4(v2, v3, 0x44);
      const __m512 hi01 = _mm512_shuffle_f32x4(v0, v1, 0xEE), hi23 = _mm512_shuffle_f32x4(v2, v3, 0xEE);
      _mm512_storeu_ps(dst + x, _mm512_mul_ps(_mm512_shuffle_f32x4(lo01, lo23, 0x88), vf));
      _mm512_storeu_ps(dst + x + 16, _mm512_mul_ps(_mm512_shuffle_f32x4(lo01, lo23, 0xDD), vf));
      _mm512_storeu_ps(dst + x + 32, _mm512_mul_ps(_mm512_shuffle_f32x4(hi01, hi23, 0x88), vf));
      _mm512_storeu_ps(dst + x + 48, _mm512_mul_ps(_mm512_shuffle_f32x4(hi01, hi23, 0xDD), vf));
    }
  } else {
    for (int x = 0; x < D; x += 32) {
      const __m512 v0 = _mm512_loadu_ps(src + x), v1 = _mm512_loadu_ps(src + x + 16);
      const __m512 lo = _mm512_shuffle_f32x4(v0, v1, 0x44), hi = _mm512_shuffle_f32x4(v0, v1, 0xEE);
      _mm512_storeu_ps(dst + x, _mm512_mul_ps(_mm512_shuffle_f32x4(lo, lo, 0xD8), vf));
      _mm512_storeu_ps(dst + x + 16, _mm512_mul_ps(_mm512_shuffle_f32x4(hi, hi, 0xD8), vf));
    }
  }
}

// The natural dim of q16 position x as the fp8 scores read it: K's fp8_bf16 order, which
// permutes dims within each group of 64.
HWY_INLINE int dp_q_dim_fp8(int x) {
  const int v = (x >> 5) & 1, w = x & 31;
  return (x & ~63) + 16 * (w >> 3) + 8 * v + (w & 7);
}

// A q row of Dq floats (zero past D) as bf16 in the fp8 scores' dim order (dp_q_dim_fp8): in
// each group of 64, the 8-dim chunks 0, 2, 4, 6, then 1, 3, 5, 7. Vectorised: as a scalar loop
// it is a large part of a short decode item.
PA_DP_ATTR HWY_INLINE void dp_q_row_fp8(const float* HWY_RESTRICT qf, int Dq,
                                        uint16_t* HWY_RESTRICT qr) {
  for (int c = 0; c < Dq; c += 64) {
    HWY_UNROLL(4)
    for (int j = 0; j < 4; ++j) {  // chunks 2j and 2j + 1
      // bf16_codes: f32_to_bf16's rounding (vcvtneps2bf16 would flush subnormals).
      const __m256i w = _mm512_cvtepi32_epi16(bf16_codes(hn::LoadU(DF(), qf + c + 16 * j)).raw);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + c + 8 * j), _mm256_castsi256_si128(w));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + c + 32 + 8 * j),
                       _mm256_extracti128_si256(w, 1));
    }
  }
}

// Load masks of a group's first n elements (the whole group when n reaches its size).
HWY_INLINE __mmask32 first_words(int n) {
  return n >= 32 ? ~0u : static_cast<__mmask32>((1u << n) - 1u);
}
HWY_INLINE __mmask64 first_bytes(int n) {
  return n >= 64 ? ~0ull : static_cast<__mmask64>((1ull << n) - 1ull);
}

// An fp8 row of D dims as Dw bf16 (Dw a multiple of 64) in fp8_bf16's order, the order q16 pairs
// K in; zeros past D. The last part is read masked: no load leaves the row. (Whole chunks are
// read unmasked: masked loads slow the AMX scores, which convert every K row.)
PA_DP_ATTR HWY_INLINE void fp8_row_bf16(const Fp8Lut& L, const uint8_t* src, int D, int Dw,
                                        uint16_t* dst) {
  for (int x = 0; x < Dw; x += 64) {
    __m512i w0, w1;
    fp8_bf16(L, D - x >= 64 ? _mm512_loadu_si512(src + x)
                            : _mm512_maskz_loadu_epi8(first_bytes(D - x), src + x),
             w0, w1);
    _mm512_storeu_si512(dst + x, w0);
    _mm512_storeu_si512(dst + x + 32, w1);
  }
}

// Dims [x, x + 64) of two fp8 V rows as bf16 key pairs: w[v] as dp_acc_group's vector v (dp_dim
// order); zeros past D, read masked.
PA_DP_ATTR HWY_INLINE void fp8_pairs_bf16(const Fp8Lut& L, const uint8_t* v0, const uint8_t* v1,
                                          int x, int D, __m512i* w) {
  const __mmask64 m = first_bytes(D - x);
  const __m512i x0 = _mm512_maskz_loadu_epi8(m, v0 + x);
  const __m512i x1 = _mm512_maskz_loadu_epi8(m, v1 + x);
  fp8_bf16(L, _mm512_unpacklo_epi8(x0, x1), w[0], w[1]);
  fp8_bf16(L, _mm512_unpackhi_epi8(x0, x1), w[2], w[3]);
}

// Accumulator slot of (row r, key b) in a block of R rows x 16/R keys: reduce16 leaves row r's
// keys in lanes [r * 16/R, (r + 1) * 16/R).
constexpr int dp_slot(int R, int r, int b) { return r * (16 / R) + b; }

// One chunk of dims [i, i + C) (C = 32 bf16, 64 fp8) of the scores of R rows (q16 at stride Dq
// words) against 16/R keys from kp[k], into the 16 accumulators a (lanes as dp_slot). Each key
// row is read at kp[k + b] + off bytes (off: the head's offset in a slot row). Masked: the head
// ends inside the chunk; only its first n dims are loaded (q16 is zero past the head).
template <int DT, int R, bool Masked>
PA_DP_ATTR HWY_INLINE void dp_score_chunk(const uint16_t* HWY_RESTRICT q16, int Dq,
                                          const void* const* kp, int k, int i, int n,
                                          const Fp8Lut& L, int64_t off, __m512* a) {
  constexpr int KB = 16 / R;
  if constexpr (!dp_fp8(DT)) {
    const __mmask32 mask = Masked ? first_words(n) : 0;
    __m512i qv[R];
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) qv[r] = _mm512_load_si512(q16 + r * Dq + i);
    HWY_UNROLL(16)
    for (int b = 0; b < KB; ++b) {
      const uint16_t* kr = row_at<uint16_t>(kp[k + b], off) + i;
      const __m512i kv = Masked ? _mm512_maskz_loadu_epi16(mask, kr) : _mm512_loadu_si512(kr);
      HWY_UNROLL(4)
      for (int r = 0; r < R; ++r) {
        __m512& acc = a[dp_slot(R, r, b)];
        acc = _mm512_dpbf16_ps(acc, (__m512bh)qv[r], (__m512bh)kv);
      }
    }
  } else {
    // Two keys per load of q (KB is even), half the q loads; the same sums in the same order.
    const __mmask64 mask = Masked ? first_bytes(n) : 0;
    HWY_UNROLL(8)
    for (int b = 0; b < KB; b += 2) {
      const uint8_t* k0 = row_at<uint8_t>(kp[k + b], off) + i;
      const uint8_t* k1 = row_at<uint8_t>(kp[k + b + 1], off) + i;
      __m512i w0, w1, w2, w3;
      fp8_bf16(L, Masked ? _mm512_maskz_loadu_epi8(mask, k0) : _mm512_loadu_si512(k0), w0, w1);
      fp8_bf16(L, Masked ? _mm512_maskz_loadu_epi8(mask, k1) : _mm512_loadu_si512(k1), w2, w3);
      HWY_UNROLL(4)
      for (int r = 0; r < R; ++r) {
        const __m512i q0 = _mm512_load_si512(q16 + r * Dq + i);
        const __m512i q1 = _mm512_load_si512(q16 + r * Dq + i + 32);
        __m512& a0 = a[dp_slot(R, r, b)];
        __m512& a1 = a[dp_slot(R, r, b + 1)];
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)w0, (__m512bh)q0);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)w2, (__m512bh)q0);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)w1, (__m512bh)q1);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)w3, (__m512bh)q1);
      }
    }
  }
}

// Scores of R rows (q16 at stride Dq words) against 16/R keys from kp[k]: s[r][k + b] = q . k
// over the head's D dims, whole chunks first, then a masked last one where D is not a multiple.
template <int DT, int R>
PA_DP_ATTR HWY_INLINE void dp_score_block(const uint16_t* HWY_RESTRICT q16, int Dq, int D,
                                          const void* const* kp, int k, float* HWY_RESTRICT s,
                                          const Fp8Lut& L, int64_t off) {
  constexpr int KB = 16 / R;
  constexpr int C = dp_fp8(DT) ? 64 : 32;
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
  int i = 0;
  for (; i + C <= D; i += C) dp_score_chunk<DT, R, false>(q16, Dq, kp, k, i, C, L, off, a);
  if (i < D) dp_score_chunk<DT, R, true>(q16, Dq, kp, k, i, D - i, L, off, a);
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, reduce16(a));
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) memcpy(s + r * kKeyTile + k, tmp + r * KB, sizeof(float) * KB);
}

// What a decode phase asks the cache for while it computes: for each key k it reads, the head's
// part (poff bytes into the row, `lines` lines of it) of two other rows, at pb[k] and
// pb[kKeyTile + k]: during a tile's scores the next tile's K (first request) and this tile's V
// (second), during its P.V the next tile's V and K. Each line is asked for twice, half a tile
// apart (see TileSpans::before_scores for why), and the requests are spread over the phase by the
// keys the phase reads.
struct DpPf {
  const void* const* pb;
  int64_t poff;
  int lines;
  // Asks for `n` lines from byte `at` of key k's two rows.
  HWY_INLINE void ask(int k, int64_t at, int n) const {
    const char* x = row_at<char>(pb[k], at);
    const char* y = row_at<char>(pb[kKeyTile + k], at);
    for (int l = 0; l < n; ++l) {
      __builtin_prefetch(x + 64 * l, 0, 1);
      __builtin_prefetch(y + 64 * l, 0, 1);
    }
  }
};

// Scores of R rows against keys [0, nk) of kp (nk a multiple of 16 / R; zero rows past the keys).
// Pf: the head's first pass, which asks for the lines of P (DpPf).
template <int DT, int R, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_score_rows(const uint16_t* q16, int Dq, int D, const void* const* kp,
                                         int nk, float* s, PfStream* pf, const DpPf& P,
                                         const Fp8Lut& L, int64_t off) {
  constexpr int KB = 16 / R;
  for (int k = 0; k < nk; k += KB) {
    dp_score_block<DT, R>(q16, Dq, D, kp, k, s, L, off);
    if constexpr (!dp_fp8(DT)) {
      pf->step();
    } else if constexpr (Pf) {
      for (int b = 0; b < KB; ++b) P.ask(k + b, P.poff, P.lines);
    }
  }
}

// Keys ahead of P.V's loads that fp8 V lines are pulled into L1 (even: one key pair).
constexpr int kPvL1Ahead = 8;

// acc rows (stride Dq, accumulator order) += sum_k p[r][k] v_k over the group of 16 * NV dims
// at g, keys [0, nk) in pairs (nk even, padded with a zero row and weight 0). p16 holds the
// weights as bf16, row stride kKeyTile: the 32-bit word at key k is the pair (p_k, p_k+1). V rows
// are read at vp[k] + off bytes, as the scores read K. Masked: the head ends n dims into the
// group; the dims past it accumulate zeros, and no load leaves the row (the pool's last row may
// end a mapping).
template <int DT, int R, int NV, bool Pf, bool Masked = false>
PA_DP_ATTR HWY_INLINE void dp_acc_group(float* HWY_RESTRICT acc, int Dq, int g,
                                        const uint16_t* HWY_RESTRICT p16, const void* const* vp,
                                        int nk, PfStream* pf, const DpPf& P, const Fp8Lut& L,
                                        int64_t off, int n = 0) {
  static_assert(!Masked || NV == (dp_fp8(DT) ? 4 : 2), "a masked group is one load per row");
  const __mmask32 m16 = Masked && !dp_fp8(DT) ? first_words(n) : 0;
  const __mmask64 m8 = Masked && dp_fp8(DT) ? first_bytes(n) : 0;
  __m512 a[R][NV];
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) a[r][v] = _mm512_load_ps(acc + r * Dq + g + 16 * v);
  }
  // The group's lines (64 bytes each) of the two keys' rows in P.
  constexpr int kGroupLines = NV * 16 * (dp_fp8(DT) ? 1 : 2) / 64;
  const int64_t pg = P.poff + g * (dp_fp8(DT) ? 1 : 2);
  for (int k = 0; k < nk; k += 2) {
    if constexpr (!dp_fp8(DT)) {
      pf->step();
    } else if constexpr (Pf) {
      P.ask(k, pg, kGroupLines);
      P.ask(k + 1, pg, kGroupLines);
    }
    // fp8: the V lines of the pair kPvL1Ahead keys on, from L2 (where pf put them) into L1. With
    // NHD's 1 KiB slot rows a group's lines are 1 KiB apart, which the hardware does not fetch
    // ahead, so the loads would stall. bf16 reads two lines per group and gains nothing.
    if constexpr (dp_fp8(DT)) {
      if (k + kPvL1Ahead < nk) {
        _mm_prefetch(row_at<char>(vp[k + kPvL1Ahead], off) + g, _MM_HINT_T0);
        _mm_prefetch(row_at<char>(vp[k + kPvL1Ahead + 1], off) + g, _MM_HINT_T0);
      }
    }
    __m512i w[NV];
    if constexpr (!dp_fp8(DT)) {
      const uint16_t* v0 = row_at<uint16_t>(vp[k], off) + g;
      const uint16_t* v1 = row_at<uint16_t>(vp[k + 1], off) + g;
      HWY_UNROLL(2)
      for (int c = 0; c < NV / 2; ++c) {
        const __m512i x0 = Masked ? _mm512_maskz_loadu_epi16(m16, v0) : _mm512_loadu_si512(v0 + 32 * c);
        const __m512i x1 = Masked ? _mm512_maskz_loadu_epi16(m16, v1) : _mm512_loadu_si512(v1 + 32 * c);
        w[2 * c] = _mm512_unpacklo_epi16(x0, x1);
        w[2 * c + 1] = _mm512_unpackhi_epi16(x0, x1);
      }
    } else {
      static_assert(!dp_fp8(DT) || NV == 4, "fp8 groups are 64 dims");
      const uint8_t* v0 = row_at<uint8_t>(vp[k], off) + g;
      const uint8_t* v1 = row_at<uint8_t>(vp[k + 1], off) + g;
      const __m512i x0 = Masked ? _mm512_maskz_loadu_epi8(m8, v0) : _mm512_loadu_si512(v0);
      const __m512i x1 = Masked ? _mm512_maskz_loadu_epi8(m8, v1) : _mm512_loadu_si512(v1);
      fp8_bf16(L, _mm512_unpacklo_epi8(x0, x1), w[0], w[1]);
      fp8_bf16(L, _mm512_unpackhi_epi8(x0, x1), w[2], w[3]);
    }
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      memcpy(&pair, p16 + r * kKeyTile + k, 4);
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      HWY_UNROLL(4)
      for (int v = 0; v < NV; ++v) a[r][v] = _mm512_dpbf16_ps(a[r][v], (__m512bh)w[v], pb);
    }
  }
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(acc + r * Dq + g + 16 * v, a[r][v]);
  }
}

// P.V over a head's D dims: groups of 64, then (bf16) one of 32, then a masked last group
// where the head ends inside one. dp_pv_groups counts them (pf->step() calls per key pair).
template <int DT, int R, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_acc_rows(float* acc, int Dq, int D, const uint16_t* p16,
                                       const void* const* vp, int nk, PfStream* pf,
                                       const DpPf& P, const Fp8Lut& L, int64_t off) {
  int g = 0;
  for (; g + 64 <= D; g += 64) dp_acc_group<DT, R, 4, Pf>(acc, Dq, g, p16, vp, nk, pf, P, L, off);
  if constexpr (!dp_fp8(DT)) {
    if (g + 32 <= D) {
      dp_acc_group<DT, R, 2, Pf>(acc, Dq, g, p16, vp, nk, pf, P, L, off);
      g += 32;
    }
    if (g < D) dp_acc_group<DT, R, 2, Pf, true>(acc, Dq, g, p16, vp, nk, pf, P, L, off, D - g);
  } else {
    if (g < D) dp_acc_group<DT, R, 4, Pf, true>(acc, Dq, g, p16, vp, nk, pf, P, L, off, D - g);
  }
}

template <int DT>
constexpr int dp_pv_groups(int D) {
  return dp_fp8(DT) ? (D + 63) / 64 : D / 64 + (D % 64 >= 32) + (D % 32 != 0);
}

// One pass of R rows (a head's rows, pass_rows / pv_rows in AttentionItemDp): its scores, and
// its P.V. Pf as in dp_score_rows and dp_acc_group.
template <int DT, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_score_pass(int R, const uint16_t* qr, int Dq, int D,
                                         const void* const* kh, int nk, float* sr, PfStream* pf,
                                         const DpPf& P, const Fp8Lut& L, int64_t off) {
  switch (R) {
    case 4: dp_score_rows<DT, 4, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
    case 2: dp_score_rows<DT, 2, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
    default: dp_score_rows<DT, 1, Pf>(qr, Dq, D, kh, nk, sr, pf, P, L, off); break;
  }
}
template <int DT, bool Pf>
PA_DP_ATTR HWY_INLINE void dp_acc_pass(int R, float* acc, int Dq, int D, const uint16_t* pr,
                                       const void* const* vh, int nk, PfStream* pf,
                                       const DpPf& P, const Fp8Lut& L, int64_t off) {
  switch (R) {
    case 5: dp_acc_rows<DT, 5, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 4: dp_acc_rows<DT, 4, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 3: dp_acc_rows<DT, 3, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    case 2: dp_acc_rows<DT, 2, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
    default: dp_acc_rows<DT, 1, Pf>(acc, Dq, D, pr, vh, nk, pf, P, L, off); break;
  }
}

// exp(x) as 2^n 2^f, n = round(x log2 e), f in [-1/2, 1/2]: 2^f by a degree-5 polynomial
// (minimax for relative error, 1.6e-7, about an f32 ulp; x log2 e itself is rounded, which adds
// |x| 1e-7 relative: 2e-6 at x = -20, below which the weight is < 2e-9), 2^n by vscalefps, which
// underflows to 0 as Exp does. 10 instructions against Highway's ~20: the weights are rounded to
// bf16 (2^-9) right after, which is why the last digits of f32 need not be worked for.
PA_DP_ATTR HWY_INLINE __m512 dp_exp(__m512 x) {
  // Clamped below (-inf gives 0, as Exp does; NaN stays NaN: vmaxps returns its second operand).
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(-200.0f),
                                 _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(0.001327647129073739f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009675540961325169f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550713092088699f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022120237350464f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931469440460205f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  return _mm512_scalef_ps(p, n);
}

// Adds rows [r0, r1)' vector partial sums lv into l and clears them (before l is read or
// rescaled by anything but dp_softmax_full's lane adds).
PA_DP_ATTR HWY_INLINE void dp_fold_l(Scratch* sc, int r0, int r1) {
  for (int r = r0; r < r1; ++r) {
    sc->l[r] += _mm512_reduce_add_ps(_mm512_load_ps(sc->lv + 16 * r));
    _mm512_store_ps(sc->lv + 16 * r, _mm512_setzero_ps());
  }
}

// softmax_tile's bf16-weight pass for a tile that every row sees whole, with no soft cap or ALiBi
// (a decode's tiles), in registers: scale, max, online-softmax update, exp, and the weights
// rounded to bf16 straight into p16 (kKeyTile = 32 of them per row: two vectors). l adds up the
// rounded weights, as softmax_tile's does, so P.V divides by exactly the weights it used; it does
// so in the 16 lanes of lv (dp_fold_l sums them), and the tile's maximum reaches every lane by
// shuffles, so a row takes no horizontal sum and no scalar round trip unless its maximum grows.
// Partial: only the first nk keys of the tile exist (a sequence's last tile); the other lanes'
// scores are not read (they may be stale) and their weights are 0, as softmax_tile gives them.
// Short decodes (down to one key a sequence) spend much of their time in this pass.
static_assert(kKeyTile == 32, "dp_softmax_full holds a row's scores in two vectors");
template <bool Partial = false>
PA_DP_ATTR HWY_INLINE void dp_softmax_full(Scratch* sc, uint16_t* p16, int rows, int D,
                                           float sfac, int nk = kKeyTile) {
  const __m512 vf = _mm512_set1_ps(sfac);
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __mmask16 k0 = Partial ? static_cast<__mmask16>(nk >= 16 ? 0xFFFF : (1u << nk) - 1) : 0;
  const __mmask16 k1 = Partial ? static_cast<__mmask16>(nk <= 16 ? 0 : (1u << (nk - 16)) - 1) : 0;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < rows; ++r) {
    const float* s = sc->s + r * kKeyTile;
    // Missing keys score 0 here (never NaN or stale bits into exp; their weights are zeroed
    // after it) and -inf for the maximum.
    const __m512 s0 = _mm512_mul_ps(Partial ? _mm512_maskz_load_ps(k0, s) : _mm512_load_ps(s), vf);
    const __m512 s1 =
        _mm512_mul_ps(Partial ? _mm512_maskz_load_ps(k1, s + 16) : _mm512_load_ps(s + 16), vf);
    __m512 mx = Partial ? _mm512_max_ps(_mm512_mask_blend_ps(k0, ninf, s0),
                                        _mm512_mask_blend_ps(k1, ninf, s1))
                        : _mm512_max_ps(s0, s1);
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0x4E));
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0xB1));
    mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0x4E));
    mx = _mm512_max_ps(mx, _mm512_permute_ps(mx, 0xB1));
    const float mold = sc->m[r];
    // Every lane holds the row's max; -inf (every score so far -inf) subtracts 0 instead, so
    // the weights are exp(-inf) = 0 rather than NaN.
    __m512 vm = _mm512_max_ps(mx, _mm512_set1_ps(mold));
    if (_mm512_cvtss_f32(vm) == -std::numeric_limits<float>::infinity()) vm = _mm512_setzero_ps();
    // The max drops NaN: a NaN score poisons the row's max here (its output pass writes NaN).
    const bool nan = (_mm512_cmp_ps_mask(s0, s0, _CMP_UNORD_Q) |
                      _mm512_cmp_ps_mask(s1, s1, _CMP_UNORD_Q)) != 0;
    const float mt = nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_cvtss_f32(mx);
    if (mt > mold || nan) {  // the row's maximum grows (rare after the first tiles): rescale it
      dp_fold_l(sc, r, r + 1);
      raise_max(sc, r, mt, D);
    }
    float* lv = sc->lv + 16 * r;
    __m512 p0 = dp_exp(_mm512_sub_ps(s0, vm));
    __m512 p1 = dp_exp(_mm512_sub_ps(s1, vm));
    if constexpr (Partial) {
      p0 = _mm512_maskz_mov_ps(k0, p0);
      p1 = _mm512_maskz_mov_ps(k1, p1);
    }
    const __m512i pb = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
    _mm512_store_si512(p16 + r * kKeyTile, pb);
    // Back to float32: each dword holds two weights, the low one (<< 16) and the high one.
    const __m512 w = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pb, 16)),
                                   _mm512_castsi512_ps(_mm512_and_si512(pb, hi_mask)));
    _mm512_store_ps(lv, _mm512_add_ps(_mm512_load_ps(lv), w));
  }
}

// Can the dot-product decode run this item? bf16 caches read by bf16 queries, fp8 caches with
// any query dtype; any head size (a last partial chunk of dims is read masked).
HWY_INLINE bool dp_eligible(const AttnItem& it) {
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.kv_heads > 1) {  // planned for this path (multi_head_decode_ok)
    if (it.tok1 - it.tok0 != 1 || rows > kMaxRows) return false;
  } else if (rows >= 16 && !(it.tok1 - it.tok0 <= 8 && rows <= 64)) {
    return false;
  }
  if (it.head_size > kMaxHeadSize) return false;
  if (it.kv.dtype == PAGEDATTN_DTYPE_BFLOAT16) return it.dtype == PAGEDATTN_DTYPE_BFLOAT16;
  return it.kv.dtype == PAGEDATTN_DTYPE_FP8_E4M3 || it.kv.dtype == PAGEDATTN_DTYPE_FP8_E5M2;
}

// A zero K/V row: padding keys of a tile point here (fp8 0x00 and bf16 0x0000 are +0).
// kMaxRows rows long, so that a later head's offset from it (by_offset in AttentionItemDp)
// stays inside.
alignas(64) const uint8_t kZeroRow[kMaxRows * kMaxHeadSize * 2] = {};
#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_DECODE_BF16_INL_H_
