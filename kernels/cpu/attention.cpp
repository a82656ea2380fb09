// kernels/cpu/attention.cpp — paged attention work items (decode, prefill, chunked prefill,
// encoder, cross), one Highway instantiation per SIMD target.
//
// A work item is (sequence, KV head, some of its query heads, a query-token tile, a key range):
// its rows are every (token, head) pair, so each K/V tile is loaded and converted to float32 ONCE
// for the whole GQA group and tile. Flash-style loop over key tiles with an online softmax; no
// T x T score matrix. Keys outside the causal/window range of every row are never visited.
//
// This file is the dispatch hub: foreach_target compiles it once per SIMD target, each time
// including entry-inl.h (the kernels' -inl.h files and the per-target entry points). Once, under
// HWY_ONCE, it holds the HWY_EXPORT tables and the functions kernels.h declares for it. Where the
// build gives each target a unit of its own (attention_unit.cpp, so the targets compile in
// parallel), it is built with PA_CPU_UNIT=0 and compiles no target's bodies itself.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"
#include "variant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

// Unless the build splits the targets over units, this file compiles every target's bodies.
#ifndef PA_CPU_UNIT
#define PA_CPU_UNIT HWY_TARGET
#endif

#include "entry-inl.h"

#if HWY_ONCE
#ifdef PA_CPU_UNIT_TARGETS
static_assert((HWY_TARGETS & ~static_cast<int64_t>(PA_CPU_UNIT_TARGETS)) == 0,
              "a Highway target this build compiles has no unit in kernels/cpu/meson.build");
#endif

namespace pa_cpu {

HWY_EXPORT(AttentionItem);
HWY_EXPORT(MultiHeadDecodeOk);
HWY_EXPORT(ConvertForTest);
HWY_EXPORT(StoreCacheRow);
HWY_EXPORT(MlaItemRun);

void mla_item(const Target& target, const MlaItem& item, float* scratch) {
  HWY_DISPATCH_TABLE(MlaItemRun)[target.index](item, scratch);
}

void store_cache_row(uint32_t target_index, void* dst, pagedattn_dtype ddt, const void* src,
                     pagedattn_dtype sdt, int n, float scale) {
  HWY_DISPATCH_TABLE(StoreCacheRow)[target_index](dst, ddt, src, sdt, n, scale);
}

void convert_for_test(uint32_t target_index, pagedattn_dtype dt, int mode, const void* src,
                      float* dst, int n) {
  HWY_DISPATCH_TABLE(ConvertForTest)[target_index](dt, mode, src, dst, n);
}

bool multi_head_decode_ok(const Target& target, const AttnItem& item) {
  return HWY_DISPATCH_TABLE(MultiHeadDecodeOk)[target.index](item, target.bf16_dp);
}

void attention_item(const Target& target, const AttnItem& item, Scratch* scratch) {
  scratch->prefetch_twice = target.prefetch_twice;
  HWY_DISPATCH_TABLE(AttentionItem)[target.index](item, scratch,
                                                   target.amx ? 2 : (target.bf16_dp ? 1 : 0));
}

void attention_merge_parts(uint32_t /*target_index*/, const AttnItem& it, int n, const float* acc,
                           int64_t part_stride, const float* m, const float* l,
                           int64_t ml_stride) {
  // Runs once per split item group over rows x D floats: scalar is plenty next to the key loop.
  const int D = it.head_size;
  const int nh = it.h1 - it.h0;
  const int ntok = it.tok1 - it.tok0;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      float mx = kNegInf;
      for (int p = 0; p < n; ++p) mx = max_keep_nan(mx, m[p * ml_stride + r]);
      const bool poisoned = max_poisoned(mx);  // a part read a NaN or +inf score
      float w[kMaxSplits];
      float total = 0.0f;
      for (int p = 0; p < n; ++p) {
        const float mp = m[p * ml_stride + r];
        w[p] = mp == kNegInf || poisoned ? 0.0f : expf(mp - mx);
        total += w[p] * l[p * ml_stride + r];
      }
      const RowNorm nr =
          row_norm(mx, total, it.sinks != nullptr ? it.sinks + it.h0 + g : nullptr);
      char* op = item_out(it, t, g);
      for (int i = 0; i < D; ++i) {
        float x = 0.0f;
        for (int p = 0; p < n; ++p) {
          if (w[p] != 0.0f) x += w[p] * acc[p * part_stride + static_cast<int64_t>(r) * D + i];
        }
        store_elem(op, i, it.dtype, x * nr.inv, 1.0f);
      }
      if (it.lse != nullptr)
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] = nr.lse;
    }
  }
}

}  // namespace pa_cpu
#endif  // HWY_ONCE
