// kernels/cpu/decode_dp-inl.h — AttentionItemDp, the bf16 dot-product decode: vdpbf16ps
// (decode_bf16-inl.h), and on AVX3_AMX an fp8 cache's scores and P.V on tiles (decode_amx-inl.h).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_DECODE_DP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_DECODE_DP_INL_H_
#undef PA_CPU_DECODE_DP_INL_H_
#else
#define PA_CPU_DECODE_DP_INL_H_
#endif

#include <hwy/highway.h>

#include "tile-inl.h"
#include "prefetch-inl.h"
#include "decode_rows-inl.h"
#include "decode_bf16-inl.h"
#include "decode_amx-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP  // AVX3_DL (decode_bf16-inl.h)

// How AttentionItemDp runs a KV head's G rows (of `rows`, kvn heads). Scores: passes of 4 rows,
// then 2, then 1, except that a last group of 3 is scored as 4 in one-head items (no slower than
// 2 and 1) and on fp8 caches, which convert K once per pass, so one pass of 4 converts half what
// passes of 2 and 1 do; passes of 8 rows are slower. A padded pass runs into the next head's
// rows, whose own pass comes later and overwrites those scores, or into zero rows after the
// item's last (q16 and the scores have kMaxRows rows; no padding where it would not fit): rows_s
// rows are staged. P.V: 4 rows at a time, but a last 5 in one pass, so their V rows are read
// (and converted) once.
struct DpPasses {
  int pass_rows[kMaxRows], pv_rows[kMaxRows];
  int npass, npv, rows_s;
};
HWY_INLINE DpPasses dp_passes(int G, int rows, int kvn, bool fp8) {
  DpPasses p;
  p.npass = 0;
  int G_s = 0;
  for (int left = G; left > 0;) {
    const int exact = left >= 4 ? 4 : (left >= 2 ? 2 : 1);
    int R = left == 3 && (kvn == 1 || fp8) ? 4 : exact;
    if (rows - G + G_s + R > kMaxRows) R = exact;  // padding past the last head would not fit
    p.pass_rows[p.npass++] = R;
    G_s += R;
    left -= std::min(R, left);
  }
  p.rows_s = rows - G + G_s;
  p.npv = 0;
  for (int left = G; left > 0; left -= p.pv_rows[p.npv++])
    p.pv_rows[p.npv] = left == 5 ? 5 : std::min(left, 4);
  return p;
}

// Stages AttentionItemDp's rows: q as bf16 in K's element order (fp8: dp_q_row_fp8's), rows at
// stride Dq words in q16 and zero past D; rows [rows, rows_s) of padding all zero; the
// accumulators, m, l and the lane sums lv cleared. qf: float staging of one q row.
PA_DP_ATTR HWY_INLINE void dp_stage_rows(const AttnItem& it, Scratch* sc, uint16_t* q16,
                                         float* qf, int rows, int rows_s, int Dq, bool fp8) {
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  for (int r = 0; r < rows_s; ++r) {
    uint16_t* qr = q16 + static_cast<size_t>(r) * Dq;
    if (r >= rows) {
      memset(qr, 0, sizeof(uint16_t) * static_cast<size_t>(Dq));
      continue;
    }
    const int t = r / nh, g = r % nh;
    const char* qp = item_q(it, t, g);
    if (it.dtype == PAGEDATTN_DTYPE_BFLOAT16 && !fp8) {
      memcpy(qr, qp, sizeof(uint16_t) * static_cast<size_t>(D));
      memset(qr + D, 0, sizeof(uint16_t) * static_cast<size_t>(Dq - D));
    } else {
      load_row(qp, it.dtype, 1.0f, qf, D);
      memset(qf + D, 0, sizeof(float) * static_cast<size_t>(Dq - D));
      dp_q_row_fp8(qf, Dq, qr);
    }
    memset(sc->acc + static_cast<size_t>(r) * Dq, 0, sizeof(float) * static_cast<size_t>(Dq));
    sc->m[r] = -std::numeric_limits<float>::infinity();
    sc->l[r] = 0.0f;
    _mm512_store_ps(sc->lv + 16 * r, _mm512_setzero_ps());
  }
}

// AttentionItemDp's output pass: the accumulators back to natural dim order (times the V scale
// of fp8), then each row normalised (write_rows).
template <int DT>
PA_DP_ATTR HWY_INLINE void dp_write_rows(const AttnItem& it, Scratch* sc, int rows, int Dq) {
  const float vf = dp_fp8(DT) ? it.kv.v_scale : 1.0f;
  for (int r = 0; r < rows; ++r) {
    float* a = sc->acc + static_cast<size_t>(r) * Dq;
    dp_unpermute<DT>(a, sc->q, Dq, vf);
    memcpy(a, sc->q, sizeof(float) * static_cast<size_t>(it.head_size));
  }
  write_rows(it, sc->acc, sc->m, sc->l, Dq);
}

// AttentionItemDp's AMX operands, in sc->q (free between the q rows and the output pass): the q
// operands (rows * Dq * 2 bytes <= 32 KiB), K rows as bf16 (<= 8 KiB), one tile of scores, and V
// of a tile as tile B operands for P.V (32 keys x Dq bf16, <= 16 KiB).
struct DpAmxScratch {
  uint32_t* q;
  uint16_t* k;
  float* c;
  uint16_t* v;
  explicit DpAmxScratch(Scratch* sc)
      : q(reinterpret_cast<uint32_t*>(sc->q)),
        k(reinterpret_cast<uint16_t*>(sc->q + kMaxRows * kMaxHeadSize / 2)),
        c(sc->q + kMaxRows * kMaxHeadSize / 2 + 16 * kMaxHeadSize / 2),
        v(reinterpret_cast<uint16_t*>(c + 256)) {}
};
static_assert(kMaxRows * kMaxHeadSize / 2 + 16 * kMaxHeadSize / 2 + 256 +
                      kKeyTile * kMaxHeadSize / 2 <=
                  kMaxRows * kMaxHeadSize,
              "the AMX operands fit in Scratch::q");

// The bf16 dot-product decode of one item (dp_eligible): q and the weights as bf16, scores and
// P.V by vdpbf16ps, or, for fp8 caches where amx is set, on AMX tiles. The tile loop stays in
// one function: each of its phases split out into a helper changes the code GCC generates for
// it.
template <int DT>
PA_AMX_ATTR void AttentionItemDp(const AttnItem& it, Scratch* sc, bool amx) {
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const int rows = nh * ntok;
  // Several KV heads (decode, contiguous heads: kv_heads > 1) run tile by tile together, so one
  // item reads whole slot rows of the cache; each head has G rows.
  const int kvn = it.kv_heads > 1 ? it.kv_heads : 1;
  const int G = rows / kvn;
  const DpPasses ps = dp_passes(G, rows, kvn, dp_fp8(DT));
  const int* pass_rows = ps.pass_rows;
  const int* pv_rows = ps.pv_rows;
  const int npass = ps.npass, npv = ps.npv, rows_s = ps.rows_s;
  const size_t esz = elem_size(it.kv.dtype);
  const Fp8Lut L = dp_fp8(DT) ? fp8_lut<DT>() : Fp8Lut{};
  // Row stride of q16 and the accumulators: whole chunks of the dot products (32 bf16 dims, 64
  // fp8 ones), zero past D, where K and V are read masked.
  const int Dq = dp_fp8(DT) ? (D + 63) & ~63 : (D + 31) & ~31;
  // q as bf16 (in K's element order), rows at stride Dq words; the weights of a tile as bf16.
  uint16_t* q16 = reinterpret_cast<uint16_t*>(sc->kt);
  uint16_t* p16 = reinterpret_cast<uint16_t*>(sc->vt);

  dp_stage_rows(it, sc, q16, sc->q, rows, rows_s, Dq, dp_fp8(DT));

  const int64_t kbeg = std::max(it.key0, item_row_lo(it, 0));
  const int64_t kend = std::min(it.key1, item_row_hi(it, ntok - 1) + 1);
  const bool plain = it.soft_cap <= 0.0f && it.alibi == nullptr;
  const float sfac = it.scale * (dp_fp8(DT) ? it.kv.k_scale : 1.0f);
  // AMX scores and P.V: a tile's B operand holds up to 16 rows; short items skip the setup (q as
  // tile operands, the tile configuration).
  // fp8 only: a bf16 decode is memory-bound, and tiles loaded in place from its K rows slow it
  // down from DRAM.
  const bool use_amx = amx && dp_fp8(DT) && G <= 16 && kend - kbeg >= 128;
  const DpAmxScratch amxs(sc);
  uint32_t* amx_q = amxs.q;
  uint16_t *amx_k = amxs.k, *amx_v = amxs.v;
  float* amx_c = amxs.c;
  if (use_amx) {
    for (int h = 0; h < kvn; ++h)
      dp_amx_q(q16 + static_cast<size_t>(h) * G * Dq, Dq, G,
               amx_q + static_cast<size_t>(h) * G * Dq / 2);
    dp_amx_configure(G);
  }
  // This tile's and the next tile's row addresses, padded with the zero row to 16 keys.
  const void* ptrs[2][2][kKeyTile];
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < kKeyTile; ++k) ptrs[b][0][k] = ptrs[b][1][k] = kZeroRow;
  int cur = 0;
  const TileSpans spans(it, kvn, sc->prefetch_twice);
  const int64_t head_bytes = spans.head_bytes;
  const void* hptr[kKeyTile];  // one head's row addresses (kvn > 1)
  // Row addresses of head h (0: the item's first) of keys [0, n); padding keeps the zero row.
  auto head_rows = [&](const void* const* base, int h, int n) -> const void* const* {
    if (h == 0) return base;
    for (int k = 0; k < n; ++k)
      hptr[k] = base[k] == kZeroRow ? base[k] : static_cast<const char*>(base[k]) + h * head_bytes;
    return hptr;
  };

  // Head h's rows as the first head's row addresses plus h * head_bytes, when a padding key's
  // zero row is long enough for that too; else rebuilt per head (head_rows), which costs time
  // in cache.
  const bool by_offset = kvn > 1 && (kvn - 1) * head_bytes + D * static_cast<int64_t>(esz) <=
                                        static_cast<int64_t>(sizeof(kZeroRow));
  if (kbeg < kend) {
    const int n0 = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kbeg));
    key_ptrs(it, kbeg, n0, ptrs[0][0], ptrs[0][1], 0);
    spans.first(ptrs[0][0], ptrs[0][1], n0, kbeg);
  }
  // Row addresses the phases ask the cache for (DpPf), and the lines of a head's row part: one
  // more where rows may start inside a line, so the part's last line is asked for too.
  const void* pf_scores[2 * kKeyTile];
  const void* pf_pv[2 * kKeyTile];
  const int64_t part_bytes = D * static_cast<int64_t>(esz);
  const bool lined = part_bytes % 64 == 0 && head_bytes % 64 == 0 && spans.slot_bytes % 64 == 0;
  const int pf_lines = static_cast<int>((part_bytes + 63) / 64) + (lined ? 0 : 1);
  for (int64_t kt0 = kbeg; kt0 < kend; kt0 += kKeyTile) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0));
    const int nk16 = (nk + 15) & ~15;
    // Keys a pass of R rows scores: nk rounded up to its blocks of 16 / R (zero rows past nk).
    auto score_keys_of = [nk](int R) { return (nk + 16 / R - 1) / (16 / R) * (16 / R); };
    const void** kptr = ptrs[cur][0];
    const void** vptr = ptrs[cur][1];
    int next_n = 0;
    if (kt0 + kKeyTile < kend) {
      next_n = static_cast<int>(std::min<int64_t>(kKeyTile, kend - kt0 - kKeyTile));
      key_ptrs(it, kt0 + kKeyTile, next_n, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], 0);
      for (int k = next_n; k < kKeyTile; ++k) ptrs[cur ^ 1][0][k] = ptrs[cur ^ 1][1][k] = kZeroRow;
    }
    // The next tile streams in during this one (TileSpans::before_scores).
    // bf16 (memory-bound): whole blocks in address order, by PfStream turns. fp8 (core-bound,
    // as fast from DRAM as in cache): the rows of the keys the loops read (DpPf), without the
    // turns' bookkeeping; bf16 needs its lines asked for in address order.
    PfStream pf, pf2;
    // With AMX the fp8 decode waits on memory like bf16, and takes turns too.
    const bool turns = !dp_fp8(DT) || use_amx;
    if (!turns) {
      if (next_n == 0)
        for (int k = 0; k < kKeyTile; ++k) ptrs[cur ^ 1][0][k] = ptrs[cur ^ 1][1][k] = kZeroRow;
      for (int k = 0; k < kKeyTile; ++k) {
        pf_scores[k] = ptrs[cur ^ 1][0][k];
        pf_scores[kKeyTile + k] = vptr[k];
        pf_pv[k] = ptrs[cur ^ 1][1][k];
        pf_pv[kKeyTile + k] = ptrs[cur ^ 1][0][k];
      }
    } else {
      // pf.step() calls of one head's scores: one per score block of 16 / R keys (AMX: of 16).
      int64_t score_steps = use_amx ? nk16 / 16 : 0;
      for (int i = 0; !use_amx && i < npass; ++i)
        score_steps += score_keys_of(pass_rows[i]) * pass_rows[i] / 16;
      spans.before_scores(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                          vptr, nk, kt0, static_cast<int64_t>(kvn) * score_steps);
    }
    for (int h = 0; h < kvn; ++h) {
      const void* const* kh = by_offset ? kptr : head_rows(kptr, h, nk16);
      const int64_t off = by_offset ? h * head_bytes : 0;
      const DpPf P{pf_scores, h * head_bytes, pf_lines};
      if constexpr (dp_fp8(DT)) {
        if (use_amx) {
          dp_amx_scores<DT>(G, amx_q + static_cast<size_t>(h) * G * Dq / 2, Dq, D, kh, nk16,
                            sc->s + h * G * kKeyTile, amx_k, amx_c, &pf, L, off);
          continue;
        }
      }
      int r = h * G;
      for (int i = 0; i < npass; r += pass_rows[i++]) {
        const uint16_t* qr = q16 + r * Dq;
        float* sr = sc->s + r * kKeyTile;
        const int R = pass_rows[i];
        const int nks = score_keys_of(R);
        if (dp_fp8(DT) && i == 0)  // bf16: PfStream turns in every pass
          dp_score_pass<DT, true>(R, qr, Dq, D, kh, nks, sr, &pf, P, L, off);
        else
          dp_score_pass<DT, false>(R, qr, Dq, D, kh, nks, sr, &pf, P, L, off);
      }
    }
    const int nk2 = (nk + 1) & ~1;
    if (turns) {
      spans.before_pv(&pf, &pf2, ptrs[cur ^ 1][0], ptrs[cur ^ 1][1], next_n, kt0 + kKeyTile,
                      static_cast<int64_t>(kvn) *
                          (use_amx ? kKeyTile / 2 : npv * dp_pv_groups<DT>(D) * (nk2 / 2)));
    }
    cur ^= 1;
    // Every row sees all nk keys of the tile (a decode's tiles, its last one included).
    bool whole = plain;
    for (int t = 0; whole && t < ntok; ++t)
      whole = item_row_lo(it, t) <= kt0 && kt0 + nk - 1 <= item_row_dense_hi(it, t);
    if (whole && nk == kKeyTile) {
      dp_softmax_full(sc, p16, rows, Dq, sfac);
    } else if (whole) {
      dp_softmax_full<true>(sc, p16, rows, Dq, sfac, nk);
    } else {
      dp_fold_l(sc, 0, rows);  // softmax_tile reads and rescales l
      if (!softmax_tile(it, sc, kt0, nk, plain, Dq, sfac, true)) {
        pf.flush();
        continue;
      }
      for (int r = 0; r < rows; ++r) {  // bf16 values already (weights of keys >= nk are 0)
        const float* s = sc->s + r * kKeyTile;
        const __m512bh pb = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + 16), _mm512_load_ps(s));
        _mm512_store_si512(p16 + r * kKeyTile, (__m512i)pb);
      }
    }
    for (int h = 0; h < kvn; ++h) {
      const void* const* vh = by_offset ? vptr : head_rows(vptr, h, use_amx ? kKeyTile : nk2);
      const int64_t off = by_offset ? h * head_bytes : 0;
      const DpPf P{pf_pv, h * head_bytes, pf_lines};
      if constexpr (dp_fp8(DT)) {
        if (use_amx) {
          dp_amx_pv<DT>(G, sc->acc + h * G * Dq, Dq, D, p16 + h * G * kKeyTile, vh, amx_v, &pf,
                        L, off);
          continue;
        }
      }
      int r = h * G;
      for (int i = 0; i < npv; r += pv_rows[i++]) {
        float* acc = sc->acc + r * Dq;
        const uint16_t* pr = p16 + r * kKeyTile;
        if (dp_fp8(DT) && i == 0)
          dp_acc_pass<DT, true>(pv_rows[i], acc, Dq, D, pr, vh, nk2, &pf, P, L, off);
        else
          dp_acc_pass<DT, false>(pv_rows[i], acc, Dq, D, pr, vh, nk2, &pf, P, L, off);
      }
    }
    pf.flush();
  }

  if (use_amx) _tile_release();
  dp_fold_l(sc, 0, rows);
  dp_write_rows<DT>(it, sc, rows, Dq);
}

#endif  // PA_DP

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_DECODE_DP_INL_H_
