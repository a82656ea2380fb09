// kernels/cpu/attention.cpp — paged attention work items (decode, prefill, chunked prefill,
// encoder, cross), one Highway instantiation per SIMD target.
//
// A work item is (sequence, KV head, some of its query heads, a query-token tile, a key range):
// its rows are every (token, head) pair, so each K/V tile is loaded and converted to float32 ONCE
// for the whole GQA group and tile. Flash-style loop over key tiles with an online softmax; no
// T x T score matrix. Keys outside the causal/window range of every row are never visited.
//
// This file is the dispatch hub: foreach_target compiles it once per SIMD target, and each time
// it includes the kernels' -inl.h files (one concern each, in the order each builds on the
// last), then defines the per-target entry points (AttentionItem, MultiHeadDecodeOk,
// ConvertForTest). Once, under HWY_ONCE, it holds the HWY_EXPORT tables and the functions
// kernels.h declares for attention.cpp.
#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "convert-inl.h"
#include "store-inl.h"
#include "tile-inl.h"
#include "wide_rows-inl.h"
#include "prefetch-inl.h"
#include "decode_rows-inl.h"
#include "decode_dot-inl.h"
#include "decode_bf16-inl.h"
#include "decode_amx-inl.h"
#include "decode_dp-inl.h"
#include "wide_bf16-inl.h"
#include "wide_amx-inl.h"
#include "wide_dp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#ifdef PA_DP
// fp8 -> bf16 as the dot-product decode reads K, back in natural order and widened to float32
// (exact, unscaled), for the exhaustive conversion test. n a multiple of 64.
template <int DT>
PA_DP_ATTR HWY_NOINLINE void ConvertDpForTest(const void* src, float* dst, int n) {
  const Fp8Lut L = fp8_lut<DT>();
  for (int i = 0; i < n; i += 64) {
    __m512i w[2];
    fp8_bf16(L, _mm512_loadu_si512(static_cast<const uint8_t*>(src) + i), w[0], w[1]);
    alignas(64) uint16_t words[64];
    _mm512_store_si512(words, w[0]);
    _mm512_store_si512(words + 32, w[1]);
    for (int x = 0; x < 64; ++x) dst[i + dp_q_dim_fp8(x)] = bf16_to_f32(words[x]);
  }
}
#endif  // PA_DP

// Whether AttentionItemDot runs the item in registers (DT >= 0): a cache dtype it converts
// there, a head size of whole vectors.
HWY_INLINE bool dot_in_registers(const AttnItem& it) {
  switch (it.kv.dtype) {
    case PAGEDATTN_DTYPE_FLOAT32:
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16:
    case PAGEDATTN_DTYPE_FP8_E4M3:
    case PAGEDATTN_DTYPE_FP8_E5M2: break;
    default: return false;
  }
  return it.head_size % static_cast<int>(hn::Lanes(DF())) == 0;
}

// An item of several KV heads (one token) runs whole: on the bf16 dot-product decode where dp is
// on and it takes the dtypes, else in AttentionItemDot's registers (any dtype it converts there,
// over a paged cache: a later head's rows are the first head's plus a fixed offset).
bool MultiHeadDecodeOk(const AttnItem& it, bool dp) {
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.tok1 - it.tok0 != 1 || rows > kMaxRows) return false;
#ifdef PA_DP
  if (dp && dp_eligible(it)) return true;
#endif
  (void)dp;
  return it.kv.table != nullptr && dot_in_registers(it);
}

// An fp8 cache row in the widest chunks this target reads it in: 4 vectors (AVX3 byte lookups),
// 2 (AVX2 widening 16 bytes at once), else one at a time.
template <int DT>
void AttentionItemFp8(const AttnItem& it, Scratch* sc) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  constexpr bool kE4M3 = DT == PAGEDATTN_DTYPE_FP8_E4M3;
  if (PA_FP8_QUADS && it.head_size % (4 * N) == 0) {
    AttentionItemDot<kE4M3 ? kE4M3Quads : kE5M2Quads>(it, sc);
  } else if (PA_FP8_PAIRS && it.head_size % (2 * N) == 0) {
    AttentionItemDot<kE4M3 ? kE4M3Pairs : kE5M2Pairs>(it, sc);
  } else {
    AttentionItemDot<DT>(it, sc);
  }
}

// dp: 0 none, 1 AVX512_BF16 dot products, 2 those with fp8 caches' decode on AMX tiles.
void AttentionItem(const AttnItem& it, Scratch* sc, int dp) {
  if (it.kv_heads > 1 && !MultiHeadDecodeOk(it, dp != 0)) {
    // Not a path that reads several heads at once: one KV head at a time (rows stay in order).
    const int G = (it.h1 - it.h0) / it.kv_heads;
    for (int h = 0; h < it.kv_heads; ++h) {
      AttnItem one = it;
      one.kv_heads = 1;
      one.kv_head = it.kv_head + h;
      one.h0 = it.h0 + h * G;
      one.h1 = one.h0 + G;
      if (it.out == nullptr) {
        one.part_acc = it.part_acc + static_cast<size_t>(h) * G * it.head_size;
        one.part_m = it.part_m + h * G;
        one.part_l = it.part_l + h * G;
      }
      AttentionItem(one, sc, dp);
    }
    return;
  }
#ifdef PA_DP
  if (dp && it.kv_heads <= 1 && (it.h1 - it.h0) * (it.tok1 - it.tok0) >= 16 &&
      dp_wide_eligible(it)) {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_BFLOAT16: AttentionItemWideDp<PAGEDATTN_DTYPE_BFLOAT16>(it, sc, dp == 2); return;
      case PAGEDATTN_DTYPE_FP8_E4M3: AttentionItemWideDp<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc, dp == 2); return;
      case PAGEDATTN_DTYPE_FP8_E5M2: AttentionItemWideDp<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc, dp == 2); return;
      default: break;
    }
  }
  if (dp && dp_eligible(it)) {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_BFLOAT16:
        AttentionItemDp<PAGEDATTN_DTYPE_BFLOAT16>(it, sc, dp == 2);
        return;
      case PAGEDATTN_DTYPE_FP8_E4M3:
        AttentionItemDp<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc, dp == 2);
        return;
      case PAGEDATTN_DTYPE_FP8_E5M2:
        AttentionItemDp<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc, dp == 2);
        return;
      default: break;
    }
  }
#endif
  (void)dp;
  const int rows = (it.h1 - it.h0) * (it.tok1 - it.tok0);
  if (it.kv_heads <= 1 && rows >= static_cast<int>(hn::Lanes(DF()))) {
    AttentionItemWide(it, sc);
  } else if (it.head_size % static_cast<int>(hn::Lanes(DF())) != 0) {
    AttentionItemDot<-1>(it, sc);
  } else {
    switch (it.kv.dtype) {
      case PAGEDATTN_DTYPE_FLOAT32: AttentionItemDot<PAGEDATTN_DTYPE_FLOAT32>(it, sc); break;
      case PAGEDATTN_DTYPE_FLOAT16: AttentionItemDot<PAGEDATTN_DTYPE_FLOAT16>(it, sc); break;
      case PAGEDATTN_DTYPE_BFLOAT16:
        if (it.head_size % (2 * static_cast<int>(hn::Lanes(DF()))) == 0) {
          AttentionItemDot<kBF16Pairs>(it, sc);
        } else {
          AttentionItemDot<PAGEDATTN_DTYPE_BFLOAT16>(it, sc);
        }
        break;
      case PAGEDATTN_DTYPE_FP8_E4M3: AttentionItemFp8<PAGEDATTN_DTYPE_FP8_E4M3>(it, sc); break;
      case PAGEDATTN_DTYPE_FP8_E5M2: AttentionItemFp8<PAGEDATTN_DTYPE_FP8_E5M2>(it, sc); break;
      default: AttentionItemDot<-1>(it, sc); break;
    }
  }
}

// The conversions as the kernels run them, for the exhaustive conversion test: in registers one
// vector at a time (mode 0; fp8 unscaled, as load_fp8), through load_row with scale 1 (mode 1),
// or in registers as the fp8 chunk paths read them: 4N at a time (quads) or 2N (pairs), whichever
// this target has (mode 2; one vector at a time where it has neither or n is not a multiple).
template <int DT>
HWY_INLINE void convert_vecs(const void* src, float* dst, int n, bool chunks) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
#if PA_FP8_QUADS
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3 || DT == PAGEDATTN_DTYPE_FP8_E5M2) {
    if (chunks && n % (4 * N) == 0) {
      for (int i = 0; i < n; i += 4 * N) {
        hn::Vec<DF> v[4];
        load_fp8_quad<DT>(src, i, v);
        for (int c = 0; c < 4; ++c) hn::StoreU(v[c], d, dst + i + c * N);
      }
      return;
    }
  }
#endif
#if PA_FP8_PAIRS
  if constexpr (DT == PAGEDATTN_DTYPE_FP8_E4M3 || DT == PAGEDATTN_DTYPE_FP8_E5M2) {
    if (chunks && n % (2 * N) == 0) {
      constexpr int kPairs = DT == PAGEDATTN_DTYPE_FP8_E4M3 ? kE4M3Pairs : kE5M2Pairs;
      for (int i = 0; i < n; i += 2 * N) {
        hn::Vec<DF> lo, hi;
        load_pair<kPairs>(src, i, lo, hi);
        hn::StoreU(lo, d, dst + i);
        hn::StoreU(hi, d, dst + i + N);
      }
      return;
    }
  }
#endif
  (void)chunks;
  for (int i = 0; i + N <= n; i += N) hn::StoreU(load_vec<DT>(src, i), d, dst + i);
}

void ConvertForTest(pagedattn_dtype dt, int mode, const void* src, float* dst, int n) {
  if (mode == 1) {
    load_row(src, dt, 1.0f, dst, n);
    return;
  }
  if (mode == 3) {
#ifdef PA_DP
    if (dt == PAGEDATTN_DTYPE_FP8_E4M3) ConvertDpForTest<PAGEDATTN_DTYPE_FP8_E4M3>(src, dst, n);
    if (dt == PAGEDATTN_DTYPE_FP8_E5M2) ConvertDpForTest<PAGEDATTN_DTYPE_FP8_E5M2>(src, dst, n);
#endif
    return;
  }
  const bool chunks = mode == 2;
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT16: convert_vecs<PAGEDATTN_DTYPE_FLOAT16>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_BFLOAT16: convert_vecs<PAGEDATTN_DTYPE_BFLOAT16>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_FP8_E4M3: convert_vecs<PAGEDATTN_DTYPE_FP8_E4M3>(src, dst, n, chunks); break;
    case PAGEDATTN_DTYPE_FP8_E5M2: convert_vecs<PAGEDATTN_DTYPE_FP8_E5M2>(src, dst, n, chunks); break;
    default: break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pa_cpu {

HWY_EXPORT(AttentionItem);
HWY_EXPORT(MultiHeadDecodeOk);
HWY_EXPORT(ConvertForTest);
HWY_EXPORT(StoreCacheRow);

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
      for (int p = 0; p < n; ++p) mx = std::max(mx, m[p * ml_stride + r]);
      float w[kMaxSplits];
      float total = 0.0f;
      for (int p = 0; p < n; ++p) {
        const float mp = m[p * ml_stride + r];
        w[p] = mp == kNegInf ? 0.0f : expf(mp - mx);
        total += w[p] * l[p * ml_stride + r];
      }
      const float inv = total > 0.0f ? 1.0f / total : 0.0f;
      char* op = item_out(it, t, g);
      for (int i = 0; i < D; ++i) {
        float x = 0.0f;
        for (int p = 0; p < n; ++p) {
          if (w[p] != 0.0f) x += w[p] * acc[p * part_stride + static_cast<int64_t>(r) * D + i];
        }
        store_elem(op, i, it.dtype, x * inv, 1.0f);
      }
      if (it.lse != nullptr) {
        it.lse[(it.q_row0 + t) * it.lse_row_stride + (it.h0 + g) * it.lse_head_stride] =
            total > 0.0f ? mx + logf(total) : kNegInf;
      }
    }
  }
}

}  // namespace pa_cpu
#endif  // HWY_ONCE
