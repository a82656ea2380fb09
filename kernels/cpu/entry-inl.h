// kernels/cpu/entry-inl.h — the per-target entry points of the CPU attention kernels
// (AttentionItem, MultiHeadDecodeOk, ConvertForTest, StoreCacheRow, MlaItemRun) over the -inl.h
// files, one concern each, included in the order each builds on the last.
//
// PA_CPU_UNIT names the Highway target whose bodies the including translation unit compiles:
// attention.cpp compiles every target's (PA_CPU_UNIT is HWY_TARGET) or, where the build splits
// the targets over units (kernels/cpu/meson.build), none; attention_unit.cpp compiles one. Every
// other target gets declarations, which attention.cpp's HWY_EXPORT tables need.

#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_ENTRY_INL_H_
#undef PA_CPU_ENTRY_INL_H_
#else
#define PA_CPU_ENTRY_INL_H_
#endif

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
#include "mla-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#if HWY_TARGET == PA_CPU_UNIT

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
      dp_wide_eligible(it) && !dp_eligible(it)) {
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

void StoreCacheRow(void* dst, pagedattn_dtype ddt, const void* src, pagedattn_dtype sdt, int n,
                   float scale) {
  store_cache_row(dst, ddt, src, sdt, n, scale);
}

void MlaItemRun(const MlaItem& item, float* scratch) { mla_run(item, scratch); }

#else  // another unit compiles this target: the entry points HWY_EXPORT names

bool MultiHeadDecodeOk(const AttnItem& it, bool dp);
void AttentionItem(const AttnItem& it, Scratch* sc, int dp);
void ConvertForTest(pagedattn_dtype dt, int mode, const void* src, float* dst, int n);
void StoreCacheRow(void* dst, pagedattn_dtype ddt, const void* src, pagedattn_dtype sdt, int n,
                   float scale);
void MlaItemRun(const MlaItem& item, float* scratch);

#endif  // HWY_TARGET == PA_CPU_UNIT

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();


#endif  // PA_CPU_ENTRY_INL_H_
