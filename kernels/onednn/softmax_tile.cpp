// kernels/onednn/softmax_tile.cpp — the plugin's own code between the two oneDNN matmuls: masked
// online softmax over a score tile, and the final normalisation. Highway, one instantiation per
// SIMD target, indexed like the CPU kernels' tables (pa_cpu::TargetChoice::index).
#include <math.h>
#include <string.h>

#include <algorithm>
#include <limits>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/variant.h"
#include "kernels/runtime/softmax_rules.h"
#include "onednn_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax_tile.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pa_onednn {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

HWY_INLINE void scale_row(float* HWY_RESTRICT x, float f, int n) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vf), d, x + i);
  for (; i < n; ++i) x[i] *= f;
}

bool SoftmaxTile(const SoftmaxTileArgs& a) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const int N = static_cast<int>(hn::Lanes(d));
  const float kNegInf = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (int t = 0; t < a.ntok; ++t) {
    const int64_t pos = a.pos0 + t;
    // Visible keys of this token: [lo, hi] absolute, contiguous; clipped to the tile's [0, nk).
    const int64_t lo = pa_cpu::visible_lo(a.causal, a.window, a.chunk, pos);
    const int64_t hi = pa_cpu::visible_hi(a.causal, pos, a.kt0 + a.nk);
    // A token whose window or attention chunk starts past the tile sees none of it: kb = nk.
    const int kb = static_cast<int>(std::clamp<int64_t>(lo - a.kt0, 0, a.nk));
    const int ke = static_cast<int>(std::max<int64_t>(kb, std::min<int64_t>(a.nk, hi - a.kt0 + 1)));
    for (int g = 0; g < a.nh; ++g) {
      const int r = t * a.nh + g;
      float* s = a.S + static_cast<size_t>(r) * a.ldS;
      uint16_t* pb = static_cast<uint16_t*>(a.P) + static_cast<size_t>(r) * a.ldP;
      float* pf = static_cast<float*>(a.P) + static_cast<size_t>(r) * a.ldP;
      // Zero the invisible part of the P row (the tile's padding included).
      if (a.p_bf16) {
        memset(pb, 0, sizeof(uint16_t) * static_cast<size_t>(kb));
        memset(pb + ke, 0, sizeof(uint16_t) * static_cast<size_t>(a.ldP - ke));
      } else {
        memset(pf, 0, sizeof(float) * static_cast<size_t>(kb));
        memset(pf + ke, 0, sizeof(float) * static_cast<size_t>(a.ldP - ke));
      }
      if (kb >= ke) continue;
      any = true;
      // Plain rows fold the scale into the exponent (one pass fewer); soft cap and ALiBi rows
      // (rare features) are transformed first, in scalar code.
      const bool plain = a.soft_cap <= 0.0f && a.alibi == nullptr;
      float sc = a.scale;
      if (!plain) {
        scale_row(s + kb, a.scale, ke - kb);
        const bool alibi = a.alibi != nullptr;
        const float slope = alibi ? a.alibi[g] : 0.0f;
        for (int k = kb; k < ke; ++k)
          s[k] = pa_cpu::logit(s[k], a.soft_cap, alibi, slope, a.kt0 + k, pos);
        sc = 1.0f;
      }
      // A tree mask hides some new-token keys inside [kb, ke): -inf weighs 0 (sc > 0).
      if (a.tree != nullptr)
        for (int k = std::max<int64_t>(kb, a.tree_ctx - a.kt0); k < ke; ++k)
          if (!pa_cpu::tree_sees(a.tree, a.tree_q, a.tok0 + t, a.kt0 + k - a.tree_ctx))
            s[k] = kNegInf;
      // Row maximum (scale > 0, so max(scale * s) = scale * max(s)); NaN if a score is.
      int k = kb;
      auto vmax = hn::Set(d, kNegInf);
      auto nan = hn::IsNaN(vmax);
      for (; k + N <= ke; k += N) {
        const auto x = hn::LoadU(d, s + k);
        vmax = hn::Max(vmax, x);
        nan = hn::Or(nan, hn::IsNaN(x));
      }
      float mt = hn::AllFalse(d, nan) ? hn::GetLane(hn::MaxOfLanes(d, vmax))
                                      : std::numeric_limits<float>::quiet_NaN();
      for (; k < ke; ++k) mt = pa_runtime::max_keep_nan(mt, s[k]);
      mt *= sc;
      const float mold = a.m[r];
      const float mnew = pa_runtime::max_keep_nan(mold, mt);
      // NaN or +inf: weights 0 and FinishRows writes NaN; -inf (every score so far -inf):
      // weights 0, as for keys the row does not see.
      if (pa_runtime::max_poisoned(mnew) || mnew == kNegInf) {
        a.m[r] = mnew;
        if (a.p_bf16)
          memset(pb + kb, 0, sizeof(uint16_t) * static_cast<size_t>(ke - kb));
        else
          memset(pf + kb, 0, sizeof(float) * static_cast<size_t>(ke - kb));
        continue;
      }
      if (mold != mnew) {
        const float alpha = mold == kNegInf ? 0.0f : expf(mold - mnew);
        a.l[r] *= alpha;
        scale_row(a.acc + static_cast<size_t>(r) * a.ldA, alpha, a.D);
        a.m[r] = mnew;
      }
      const auto vsc = hn::Set(d, sc);
      // p = exp(s - m); the sum is taken over the values as the matmul will see them (bf16
      // rounded), so the normalisation matches the weights actually applied.
      const auto vm = hn::Set(d, mnew);
      auto vsum = hn::Zero(d);
      k = kb;
      if (a.p_bf16) {
        const auto round = hn::Set(di, 0x7FFF);
        const auto one = hn::Set(di, 1);
        for (; k + N <= ke; k += N) {
          const auto p = hn::Exp(d, hn::MulSub(hn::LoadU(d, s + k), vsc, vm));
          auto bits = hn::BitCast(di, p);
          bits = hn::Add(bits, hn::Add(round, hn::And(hn::ShiftRight<16>(bits), one)));
          bits = hn::ShiftRight<16>(bits);  // p >= 0: arithmetic shift is fine
          hn::StoreU(hn::DemoteTo(du16, bits), du16, pb + k);
          vsum = hn::Add(vsum, hn::BitCast(d, hn::ShiftLeft<16>(bits)));
        }
        float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
        for (; k < ke; ++k) {
          const uint16_t h = pa_cpu::f32_to_bf16(expf(s[k] * sc - mnew));
          pb[k] = h;
          sum += pa_cpu::bf16_to_f32(h);
        }
        a.l[r] += sum;
      } else {
        for (; k + N <= ke; k += N) {
          const auto p = hn::Exp(d, hn::MulSub(hn::LoadU(d, s + k), vsc, vm));
          hn::StoreU(p, d, pf + k);
          vsum = hn::Add(vsum, p);
        }
        float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
        for (; k < ke; ++k) {
          pf[k] = expf(s[k] * sc - mnew);
          sum += pf[k];
        }
        a.l[r] += sum;
      }
    }
  }
  return any;
}

void FinishRows(const float* acc, int ldA, const float* m, const float* l, int ntok, int nh, int D,
                void* out, pagedattn_dtype dt, int64_t out_row_stride, int64_t out_head_stride,
                int64_t row0, int h0, const float* sinks, float* lse, int64_t lse_row_stride,
                int64_t lse_head_stride) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int64_t esz = static_cast<int64_t>(pa_cpu::elem_size(dt));
  for (int t = 0; t < ntok; ++t) {
    for (int g = 0; g < nh; ++g) {
      const int r = t * nh + g;
      const float* x = acc + static_cast<size_t>(r) * ldA;
      const pa_cpu::RowNorm nr = pa_cpu::row_norm(m[r], l[r], sinks ? sinks + g : nullptr);
      const float inv = nr.inv;
      char* op = static_cast<char*>(out) +
                 ((row0 + t) * out_row_stride + (h0 + g) * out_head_stride) * esz;
      int i = 0;
      if (dt == PAGEDATTN_DTYPE_FLOAT32) {
        const auto vi = hn::Set(d, inv);
        float* o = reinterpret_cast<float*>(op);
        for (; i + N <= D; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vi), d, o + i);
      }
      for (; i < D; ++i) pa_cpu::store_elem(op, i, dt, x[i] * inv, 1.0f);
      if (lse != nullptr)
        lse[(row0 + t) * lse_row_stride + (h0 + g) * lse_head_stride] = nr.lse;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pa_onednn
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pa_onednn {

HWY_EXPORT(SoftmaxTile);
HWY_EXPORT(FinishRows);

bool softmax_tile(uint32_t target_index, const SoftmaxTileArgs& a) {
  return HWY_DISPATCH_TABLE(SoftmaxTile)[target_index](a);
}

void finish_rows(uint32_t target_index, const float* acc, int ldA, const float* m, const float* l,
                 int ntok, int nh, int D, void* out, pagedattn_dtype dt, int64_t out_row_stride,
                 int64_t out_head_stride, int64_t row0, int h0, const float* sinks, float* lse,
                 int64_t lse_row_stride, int64_t lse_head_stride) {
  HWY_DISPATCH_TABLE(FinishRows)[target_index](acc, ldA, m, l, ntok, nh, D, out, dt,
                                                out_row_stride, out_head_stride, row0, h0, sinks,
                                                lse, lse_row_stride, lse_head_stride);
}

}  // namespace pa_onednn
#endif  // HWY_ONCE
