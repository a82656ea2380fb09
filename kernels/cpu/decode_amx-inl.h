// kernels/cpu/decode_amx-inl.h — the decode's scores and P.V on AMX-BF16 tiles (AVX3_AMX).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_DECODE_AMX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_DECODE_AMX_INL_H_
#undef PA_CPU_DECODE_AMX_INL_H_
#else
#define PA_CPU_DECODE_AMX_INL_H_
#endif

#include <hwy/highway.h>

#include "decode_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP  // AVX3_DL (decode_bf16-inl.h)

// A tile multiply adds 16 keys x 32 dims (K rows as A) times 32 dims x n query rows (B) into a
// 16 x n block of float32 scores: the whole GQA group of a key block in D / 32 instructions, with
// no lane sums, where the AVX512_BF16 loop spends G * D / 32 dot products and a 16-to-1 sum per
// key and row. fp8 caches only: K rows are converted by the same lookups into a bf16 scratch
// that the tile loads. The products are the same bf16 pairs summed in float32, so the scores
// match the AVX512_BF16 path to its rounding. P.V likewise (dp_amx_pv).
#undef PA_AMX_ATTR
#define PA_AMX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))

// LDTILECFG's 64-byte operand (palette 1).
struct AmxTileCfg {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: 0 the scores (16 keys x G float32), 1 K (16 keys x 32 dims) or V (16 key pairs x 16
// dims), 2 q (16 dim pairs x G), 3 P (G rows x 32 keys), 4-7 accumulators (G rows x 16 dims).
PA_AMX_ATTR HWY_INLINE void dp_amx_configure(int G) {
  AmxTileCfg cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  cfg.rows[0] = 16;
  cfg.colsb[0] = static_cast<uint16_t>(4 * G);
  cfg.rows[1] = 16;
  cfg.colsb[1] = 64;
  cfg.rows[2] = 16;
  cfg.colsb[2] = static_cast<uint16_t>(4 * G);
  for (int t = 3; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(G);
    cfg.colsb[t] = 64;
  }
  // GCC 12 treats the ldtilecfg builtin as not reading its operand and drops the stores above
  // (SIGILL at the first tile instruction); the barrier keeps them.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// q of a head's G rows as tile B, chunk by chunk: qt[(c * 16 + p) * G + n] is the 32-bit pair p
// of chunk c (dims 32c + 2p, + 1 in q16's order) of row n.
HWY_INLINE void dp_amx_q(const uint16_t* q16, int Dq, int G, uint32_t* qt) {
  for (int n = 0; n < G; ++n) {
    const uint16_t* qr = q16 + static_cast<size_t>(n) * Dq;
    for (int w = 0; w < Dq / 2; ++w) {
      uint32_t pair;
      memcpy(&pair, qr + 2 * w, 4);
      qt[w * G + n] = pair;
    }
  }
}

// Scores of a head's G rows against keys [0, nk16) of kh (16 at a time; zero rows past the
// tile's keys): s[n][k] at row stride kKeyTile. kb: 16 rows of Dq bf16; cbuf: 256 floats. One
// PfStream turn per key block.
template <int DT>
PA_AMX_ATTR HWY_INLINE void dp_amx_scores(int G, const uint32_t* qt, int Dq, int D,
                                          const void* const* kh, int nk16, float* s, uint16_t* kb,
                                          float* cbuf, PfStream* pf, const Fp8Lut& L,
                                          int64_t off) {
  static_assert(dp_fp8(DT), "bf16 caches keep the AVX512_BF16 scores");
  const __m512i col = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (int k0 = 0; k0 < nk16; k0 += 16) {
    for (int j = 0; j < 16; ++j)
      fp8_row_bf16(L, row_at<uint8_t>(kh[k0 + j], off), D, Dq, kb + j * Dq);
    pf->step();
    _tile_zero(0);
    for (int c = 0; c < Dq / 32; ++c) {
      _tile_loadd(1, kb + 32 * c, 2 * Dq);
      _tile_loadd(2, qt + c * 16 * G, 4 * G);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, cbuf, 64);
    for (int n = 0; n < G; ++n)
      _mm512_storeu_ps(s + n * kKeyTile + k0,
                       _mm512_i32gather_ps(_mm512_add_epi32(col, _mm512_set1_epi32(n)), cbuf, 4));
  }
}

// P.V of a head's G rows over a whole tile of 32 keys (weights of missing keys are 0, their V
// rows the zero row) on tiles: the tile's V rows converted by key pairs into a bf16 scratch in
// the pair order of tile B (vs: per 64-dim group, four 16 x 16-pair blocks, each as dp_acc_group
// leaves its vector v), P (p16 rows, 64 bytes each) as A, the accumulators (accumulator order,
// as dp_acc_group keeps them) loaded, added to and stored back as four G x 16 tiles. One
// PfStream turn per key pair.
template <int DT>
PA_AMX_ATTR HWY_INLINE void dp_amx_pv(int G, float* acc, int Dq, int D, const uint16_t* p16,
                                      const void* const* vh, uint16_t* vs, PfStream* pf,
                                      const Fp8Lut& L, int64_t off) {
  static_assert(dp_fp8(DT), "bf16 caches keep the AVX512_BF16 P.V");
  (void)G;  // the tile configuration (dp_amx_configure) holds the row count
  for (int k = 0; k < kKeyTile; k += 2) {
    const uint8_t* v0 = row_at<uint8_t>(vh[k], off);
    const uint8_t* v1 = row_at<uint8_t>(vh[k + 1], off);
    pf->step();
    for (int g = 0; g < Dq; g += 64) {
      __m512i w[4];
      fp8_pairs_bf16(L, v0, v1, g, D, w);
      uint16_t* b = vs + static_cast<size_t>(g / 64) * 4 * 16 * 32 + (k / 2) * 32;
      for (int v = 0; v < 4; ++v) _mm512_storeu_si512(b + v * 16 * 32, w[v]);
    }
  }
  const int64_t as = 4 * static_cast<int64_t>(Dq);
  _tile_loadd(3, p16, 2 * kKeyTile);
  for (int g = 0; g < Dq; g += 64) {
    const uint16_t* b = vs + static_cast<size_t>(g / 64) * 4 * 16 * 32;
    float* a = acc + g;
    _tile_loadd(4, a, as);
    _tile_loadd(5, a + 16, as);
    _tile_loadd(6, a + 32, as);
    _tile_loadd(7, a + 48, as);
    _tile_loadd(1, b, 64);
    _tile_dpbf16ps(4, 3, 1);
    _tile_loadd(1, b + 16 * 32, 64);
    _tile_dpbf16ps(5, 3, 1);
    _tile_loadd(1, b + 2 * 16 * 32, 64);
    _tile_dpbf16ps(6, 3, 1);
    _tile_loadd(1, b + 3 * 16 * 32, 64);
    _tile_dpbf16ps(7, 3, 1);
    _tile_stored(4, a, as);
    _tile_stored(5, a + 16, as);
    _tile_stored(6, a + 32, as);
    _tile_stored(7, a + 48, as);
  }
}

#endif  // PA_DP

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_DECODE_AMX_INL_H_
