// kernels/cpu/tile-inl.h — key addressing and float32 tiles: where a key's K and V rows are, per-
// key prefetches, K/V tiles converted to float32 and the scores and P.V over them, exp of a score
// row, and output rows in the model dtype.
//
// Included by attention.cpp alone, once per Highway target: hence the toggled include guard, as in
// Highway's own -inl.h files.

#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

#if defined(PA_CPU_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PA_CPU_TILE_INL_H_
#undef PA_CPU_TILE_INL_H_
#else
#define PA_CPU_TILE_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "convert-inl.h"
#include "store-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pa_cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Element offsets of key `pos`'s K and V rows of the item's KV head: through the block table
// (both at one offset), or rows of contiguous K/V (encoder, cross attention without a cache).
HWY_INLINE void key_offsets(const AttnItem& it, int64_t pos, int64_t* koff, int64_t* voff) {
  const KVSource& s = it.kv;
  if (s.table != nullptr) {  // block sizes are powers of two: shift and mask, no division
    const int shift = __builtin_ctz(static_cast<unsigned>(s.block_size));
    *koff = *voff = s.table[pos >> shift] * s.block_stride +
                    (pos & (s.block_size - 1)) * s.slot_stride + it.kv_head * s.head_stride;
  } else {
    *koff = (s.row0 + pos) * s.block_stride + it.kv_head * s.head_stride;
    *voff = (s.row0 + pos) * s.v_block_stride + it.kv_head * s.v_head_stride;
  }
}

// Prefetches the K and V rows of key `pos`: paged rows are scattered (shuffled blocks, strided
// heads), which the hardware prefetchers do not follow.
HWY_INLINE void prefetch_key(const AttnItem& it, int64_t pos) {
#ifdef PA_NO_PREFETCH
  return;
#endif
  const KVSource& s = it.kv;
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  const int64_t bytes = static_cast<int64_t>(it.head_size) * esz;
  int64_t koff, voff;
  key_offsets(it, pos, &koff, &voff);
  const char* kp = static_cast<const char*>(s.k) + koff * esz;
  const char* vp = static_cast<const char*>(s.v) + voff * esz;
  for (int64_t b = 0; b < bytes; b += 64) {
    __builtin_prefetch(kp + b);
    __builtin_prefetch(vp + b);
  }
}

// Keys prefetched ahead of the one being converted (two tiles), spread over the K loads so the
// requests interleave with compute.
constexpr int kPrefetchKeys = 2 * kKeyTile;

HWY_INLINE void prefetch_first(const AttnItem& it, int64_t kbeg, int64_t kend) {
  const int64_t n = std::min<int64_t>(kPrefetchKeys, kend - kbeg);
  for (int64_t k = 0; k < n; ++k) prefetch_key(it, kbeg + k);
}

// Converts keys (or values) [kt0, kt0 + nk) of the item's KV head into rows of dst (stride Dp).
// Also prefetches keys kPrefetchKeys ahead while they are below pf_end (0: none).
HWY_INLINE void load_tile(const AttnItem& it, bool value, int64_t kt0, int nk, float* dst,
                          int Dp, int64_t pf_end) {
  const KVSource& s = it.kv;
  const char* base = static_cast<const char*>(value ? s.v : s.k);
  const int64_t esz = static_cast<int64_t>(elem_size(s.dtype));
  const float scale = value ? s.v_scale : s.k_scale;
  for (int k = 0; k < nk; ++k) {
    const int64_t pos = kt0 + k;
    int64_t koff, voff;
    key_offsets(it, pos, &koff, &voff);
    load_row(base + (value ? voff : koff) * esz, s.dtype, scale, dst + static_cast<size_t>(k) * Dp,
             it.head_size);
    if (pos + kPrefetchKeys < pf_end) prefetch_key(it, pos + kPrefetchKeys);
  }
}

// s[r * kKeyTile + k] = q_r . k_k for rows [0, rows) and keys [0, nk); Dp is a multiple of the
// vector length (zero padded).
HWY_INLINE void scores(const float* HWY_RESTRICT q, const float* HWY_RESTRICT kt, int rows, int nk,
                       int Dp, float* HWY_RESTRICT s) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* q0 = q + static_cast<size_t>(r) * Dp;
    const float* q1 = q0 + Dp;
    const float* q2 = q1 + Dp;
    const float* q3 = q2 + Dp;
    for (int k = 0; k < nk; ++k) {
      const float* kp = kt + static_cast<size_t>(k) * Dp;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      for (int i = 0; i < Dp; i += N) {
        const auto kv = hn::Load(d, kp + i);
        a0 = hn::MulAdd(hn::Load(d, q0 + i), kv, a0);
        a1 = hn::MulAdd(hn::Load(d, q1 + i), kv, a1);
        a2 = hn::MulAdd(hn::Load(d, q2 + i), kv, a2);
        a3 = hn::MulAdd(hn::Load(d, q3 + i), kv, a3);
      }
      s[(r + 0) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a0));
      s[(r + 1) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a1));
      s[(r + 2) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a2));
      s[(r + 3) * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, a3));
    }
  }
  for (; r < rows; ++r) {
    const float* q0 = q + static_cast<size_t>(r) * Dp;
    for (int k = 0; k < nk; ++k) {
      const float* kp = kt + static_cast<size_t>(k) * Dp;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d);
      int i = 0;
      for (; i + 2 * N <= Dp; i += 2 * N) {
        a0 = hn::MulAdd(hn::Load(d, q0 + i), hn::Load(d, kp + i), a0);
        a1 = hn::MulAdd(hn::Load(d, q0 + i + N), hn::Load(d, kp + i + N), a1);
      }
      if (i < Dp) a0 = hn::MulAdd(hn::Load(d, q0 + i), hn::Load(d, kp + i), a0);
      s[r * kKeyTile + k] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
    }
  }
}

// acc_r += sum_k p[r][k] * v_k for rows [0, rows).
HWY_INLINE void accumulate(float* HWY_RESTRICT acc, const float* HWY_RESTRICT p,
                           const float* HWY_RESTRICT vt, int rows, int nk, int Dp) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* p0 = p + r * kKeyTile;
    for (int i = 0; i < Dp; i += N) {
      float* c0 = acc + static_cast<size_t>(r) * Dp + i;
      auto a0 = hn::Load(d, c0), a1 = hn::Load(d, c0 + Dp), a2 = hn::Load(d, c0 + 2 * Dp),
           a3 = hn::Load(d, c0 + 3 * Dp);
      for (int k = 0; k < nk; ++k) {
        const auto v = hn::Load(d, vt + static_cast<size_t>(k) * Dp + i);
        a0 = hn::MulAdd(hn::Set(d, p0[k]), v, a0);
        a1 = hn::MulAdd(hn::Set(d, p0[kKeyTile + k]), v, a1);
        a2 = hn::MulAdd(hn::Set(d, p0[2 * kKeyTile + k]), v, a2);
        a3 = hn::MulAdd(hn::Set(d, p0[3 * kKeyTile + k]), v, a3);
      }
      hn::Store(a0, d, c0);
      hn::Store(a1, d, c0 + Dp);
      hn::Store(a2, d, c0 + 2 * Dp);
      hn::Store(a3, d, c0 + 3 * Dp);
    }
  }
  for (; r < rows; ++r) {
    const float* p0 = p + r * kKeyTile;
    for (int i = 0; i < Dp; i += N) {
      float* c0 = acc + static_cast<size_t>(r) * Dp + i;
      auto a0 = hn::Load(d, c0);
      for (int k = 0; k < nk; ++k)
        a0 = hn::MulAdd(hn::Set(d, p0[k]), hn::Load(d, vt + static_cast<size_t>(k) * Dp + i), a0);
      hn::Store(a0, d, c0);
    }
  }
}

HWY_INLINE void scale_row(float* HWY_RESTRICT x, float f, int Dp) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  for (int i = 0; i < Dp; i += N) hn::Store(hn::Mul(hn::Load(d, x + i), vf), d, x + i);
}

// exp(x) for softmax weights, x <= 0 (a score minus its row's max; -inf gives 0): 2^n 2^f with
// n = floor(x log2 e), f in [0, 1), 2^f by a degree-5 polynomial fitted for relative error
// (1.6e-7 in float32, about an ulp), 2^n written into the exponent field. Below 2^-126 the weight
// is 0 (Exp gives subnormals there, which no sum of weights >= 1 can see, and which cost microcode
// assists on some cores); a NaN x gives 0 or NaN (only poisoned rows, whose output is NaN, have
// one). About half of Exp's instructions: it runs once per score of a prefill tile.
template <class D>
HWY_INLINE hn::Vec<D> exp_weights(D d, hn::Vec<D> x) {
  const hn::RebindToSigned<D> di;
  const auto t = hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -127.0f));
  const auto n = hn::Floor(t);
  const auto f = hn::Sub(t, n);
  auto p = hn::Set(d, 0.0018775766948238015f);
  p = hn::MulAdd(p, f, hn::Set(d, 0.008989340625703335f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.05582631751894951f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.24015361070632935f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.6931530833244324f));
  p = hn::MulAdd(p, f, hn::Set(d, 0.9999999403953552f));
  // n = -127 gives the exponent field 0: the float 0.
  const auto e = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(d, e));
}

// p = exp(s - m) in place for nk entries (the row is kKeyTile long, padded); returns the sum.
HWY_INLINE float exp_row(float* HWY_RESTRICT s, float m, int nk) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  int k = 0;
  for (; k + N <= nk; k += N) {
    const auto p = exp_weights(d, hn::Sub(hn::LoadU(d, s + k), vm));
    hn::StoreU(p, d, s + k);
    sum = hn::Add(sum, p);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; k < nk; ++k) {
    const float p = s[k] == -std::numeric_limits<float>::infinity() ? 0.0f : expf(s[k] - m);
    s[k] = p;
    total += p;
  }
  return total;
}

// dst[0, n) = x[0, n) * f in the output dtype (float32, float16, bfloat16; bf16 and f16 rounded
// to nearest even as store_elem does).
HWY_INLINE void store_row(void* dst, pagedattn_dtype dt, const float* HWY_RESTRICT x, float f,
                          int n) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int i = 0;
  if (dt == PAGEDATTN_DTYPE_FLOAT32) {
    float* o = static_cast<float*>(dst);
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vf), d, o + i);
    for (; i < n; ++i) o[i] = x[i] * f;
  } else if (dt == PAGEDATTN_DTYPE_BFLOAT16) {
    const hn::Rebind<uint16_t, DF> du16;
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (; i + N <= n; i += N)
      hn::StoreU(hn::DemoteTo(du16, bf16_codes(hn::Mul(hn::LoadU(d, x + i), vf))), du16, o + i);
    for (; i < n; ++i) o[i] = f32_to_bf16(x[i] * f);
  } else {
    uint16_t* o = static_cast<uint16_t*>(dst);
    for (; i < n; ++i) o[i] = f32_to_f16(x[i] * f);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_cpu
HWY_AFTER_NAMESPACE();

#endif  // PA_CPU_TILE_INL_H_
