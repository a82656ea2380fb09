// kernels/cpu/prefetch-inl.h — the decode's prefetch engine: PfStream spreads the next tile's cache
// lines over this tile's compute steps; TileSpans chooses the spans (key rows or whole blocks) and
// when each is asked for (Target::prefetch_twice).
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <algorithm>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_PREFETCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_PREFETCH_INL_H_
#undef PA_CPU_PREFETCH_INL_H_
#else
#define PA_CPU_PREFETCH_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// The next tile's memory, prefetched into L2 a few lines per compute step so the requests stream
// evenly behind the work, each span in address order: one span per key row (a multi-head item's
// row of an NHD cache is one contiguous run), or, where an item reads (nearly) all of each
// block, one span per block. The spans take turns, four lines each: two blocks streamed side by
// side read faster than one after the other.
struct PfStream {
  const char* ptr[2 * kKeyTile];  // next line of each span (a tile's K and V rows at most)
  const char* end[2 * kKeyTile];
  int n = 0, k = 0, live = 0, quota = 0;  // live: spans not done; quota: turns per step()
  // Adds spans of row_bytes at rows[0, nrows).
  void rows(const void* const* r, int nrows, int64_t row_bytes) {
    for (int i = 0; i < nrows; ++i, ++n) {
      ptr[n] = static_cast<const char*>(r[i]);
      end[n] = ptr[n] + (row_bytes + 63) / 64 * 64;
    }
  }
  // Adds one span per block for keys [pos0, pos0 + nrows) (rows r of the item's first head):
  // from a block's first row to its last row's end, span_extra bytes past the last row's start.
  void blocks(const void* const* r, int nrows, int64_t pos0, int bs, int64_t slot_bytes,
              int64_t span_extra) {
    for (int i = 0; i < nrows;) {
      const int s0 = static_cast<int>((pos0 + i) & (bs - 1));
      const int cnt = std::min(bs - s0, nrows - i);
      ptr[n] = static_cast<const char*>(r[i]);
      end[n] = ptr[n] + ((cnt - 1) * slot_bytes + span_extra + 63) / 64 * 64;
      ++n;
      i += cnt;
    }
  }
  // Spreads the spans' lines left (part of them: the quota is set by that share) over `steps`
  // calls of step(). Planning again moves the rest to the next phase's steps.
  void plan(int64_t steps, int64_t part = 1, int64_t of = 1) {
    k = 0;
    live = 0;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      total += (end[i] - ptr[i]) / 64;
      live += ptr[i] != end[i];
    }
    total = total * part / of;
    const int64_t per = steps > 0 ? (total + steps - 1) / steps : total;
    quota = static_cast<int>((per + 3) / 4);
  }
  // A second stream taking its turns with this one: lines asked for again (TileSpans, twice).
  PfStream* again = nullptr;
  HWY_INLINE void step() {
    if (again != nullptr) again->turn();
    turn();
  }
  // Four lines per turn: a loop trip per line costs an in-cache decode too much.
  // A span's last turn may issue fewer. Span lengths are whole lines, so ptr meets end exactly.
  HWY_INLINE void turn() {
    for (int m = quota; m > 0 && live > 0; --m) {
      while (ptr[k] == end[k]) k = k + 1 == n ? 0 : k + 1;
      // prefetcht2 (locality 1): faster than prefetcht1 on Zen 4. Every line: the hardware
      // does not stream the rest of a page in behind its first line.
      const char* p = ptr[k];
      const char* e = end[k];
      if (e - p >= 256) {
        __builtin_prefetch(p, 0, 1);
        __builtin_prefetch(p + 64, 0, 1);
        __builtin_prefetch(p + 128, 0, 1);
        __builtin_prefetch(p + 192, 0, 1);
        p += 256;
      } else {
        for (; p < e; p += 64) __builtin_prefetch(p, 0, 1);
      }
      ptr[k] = p;
      if (p == e) --live;
      k = k + 1 == n ? 0 : k + 1;
    }
  }
  void flush() {  // this stream's lines left; again takes one more turn
    quota = 1 << 30;
    step();
  }
};

// The PfStream spans of a tile for an item of kvn KV heads (decode paths): per key, its rows of
// all the item's heads (one contiguous run when kvn > 1 on an NHD cache); or, where a block's
// span of the item's heads is nearly all data the item reads (all heads of any layout, one head
// of HND), whole blocks.
struct TileSpans {
  int64_t row_bytes, head_bytes, slot_bytes, span_extra;
  int bs;
  bool blocks;
  bool twice;  // the backend's plan (Target::prefetch_twice)
  TileSpans(const AttnItem& it, int kvn, bool twice_) : twice(twice_) {
    const int64_t esz = static_cast<int64_t>(elem_size(it.kv.dtype));
    const int D = it.head_size;
    row_bytes = (it.kv.head_stride == D ? kvn : 1) * D * esz;
    head_bytes = it.kv.head_stride * esz;
    slot_bytes = it.kv.slot_stride * esz;
    span_extra = (kvn - 1) * head_bytes + D * esz;
    bs = it.kv.table != nullptr ? it.kv.block_size : 1;
    blocks = it.kv.table != nullptr &&
             4 * ((bs - 1) * slot_bytes + span_extra) <= 5 * static_cast<int64_t>(bs) * kvn * D * esz;
  }
  // The spans of keys [pos0, pos0 + n), whose first head's rows are at r[0, n).
  void add(PfStream* pf, const void* const* r, int n, int64_t pos0) const {
    if (blocks)
      pf->blocks(r, n, pos0, bs, slot_bytes, span_extra);
    else
      pf->rows(r, n, row_bytes);
  }
  // Sets up pf for a tile's scores, which step() it `steps` times: the next tile's lines, K
  // rows nk_rows and V rows nv_rows of keys [next_pos, next_pos + next_n); and (twice) this
  // tile's V rows v_rows of keys [pos, pos + n) again, through `again`.
  // - twice (all CPUs but Intel's): each tile's lines are asked for twice, half a tile apart.
  //   During the scores the next tile's K streams in and this tile's V is asked for again;
  //   during P.V the next tile's V streams in and its K is asked for again. Zen 4 appears to
  //   drop some prefetcht1/t2 requests, and the second request makes up for them (the fp8
  //   decode's P.V loads stall far less).
  // - Intel: once, K and V of the next tile together, their blocks in turn (four streams side by
  //   side, not two), half of the lines during the scores and the rest during P.V. There a
  //   second request costs more than it saves, and four streams come closer to the stream rate
  //   than two.
  void before_scores(PfStream* pf, PfStream* again, const void* const* nk_rows,
                     const void* const* nv_rows, int next_n, int64_t next_pos,
                     const void* const* v_rows, int n, int64_t pos, int64_t steps) const {
    pf->n = 0;
    add(pf, nk_rows, next_n, next_pos);
    if (!twice) {
      add(pf, nv_rows, next_n, next_pos);
      pf->plan(steps, 1, 2);
      return;
    }
    pf->plan(steps);
    again->n = 0;
    add(again, v_rows, n, pos);
    again->plan(steps);
    pf->again = again;
  }
  // Sets up pf for the tile's P.V (after before_scores), which step()s it `steps` times.
  void before_pv(PfStream* pf, PfStream* again, const void* const* nk_rows,
                 const void* const* nv_rows, int next_n, int64_t next_pos, int64_t steps) const {
    if (!twice) {
      pf->plan(steps);
      return;
    }
    pf->flush();
    pf->n = 0;
    add(pf, nv_rows, next_n, next_pos);
    pf->plan(steps);
    again->n = 0;
    add(again, nk_rows, next_n, next_pos);
    again->plan(steps);
    pf->again = again;
  }
  // Prefetches the first tile (K rows kr, V rows vr of keys [pos0, pos0 + n)) at once.
  void first(const void* const* kr, const void* const* vr, int n, int64_t pos0) const {
    PfStream pf;
    for (const void* const* r : {kr, vr}) {
      pf.n = 0;
      add(&pf, r, n, pos0);
      pf.plan(1);
      pf.flush();
    }
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_PREFETCH_INL_H_
