// kernels/cpu/test_convert.cpp — the kernels' vectorised cache conversions against the scalar
// ones in convert.h, over every input value (all 256 fp8 bytes, all 65536 f16/bf16 patterns), on
// every SIMD target this CPU can run, in registers and through the K/V tile loader.
//
// Must be bit-exact, except that a NaN only has to stay a NaN of the same sign (its payload is
// not part of any format's meaning, and F16C quiets signalling NaNs).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <hwy/highway.h>

#include "convert.h"
#include "kernels.h"

namespace {

struct Case {
  pagedattn_dtype dt;
  const char* name;
  int count;      // distinct inputs
  float factor;   // in-register fp8 comes back this much too small
};

float reference(pagedattn_dtype dt, uint32_t x) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FP8_E4M3: return pa_cpu::e4m3_to_f32(static_cast<uint8_t>(x));
    case PAGEDATTN_DTYPE_FP8_E5M2: return pa_cpu::e5m2_to_f32(static_cast<uint8_t>(x));
    case PAGEDATTN_DTYPE_FLOAT16: return pa_cpu::f16_to_f32(static_cast<uint16_t>(x));
    default: return pa_cpu::bf16_to_f32(static_cast<uint16_t>(x));
  }
}

bool same(float want, float got) {
  if (isnan(want)) return isnan(got) && signbit(want) == signbit(got);
  return pa_cpu::f32_bits(want) == pa_cpu::f32_bits(got);
}

const char* name_of(pagedattn_dtype dt) {
  switch (dt) {
    case PAGEDATTN_DTYPE_FLOAT32: return "float32";
    case PAGEDATTN_DTYPE_FLOAT16: return "float16";
    case PAGEDATTN_DTYPE_BFLOAT16: return "bfloat16";
    case PAGEDATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
    default: return "fp8_e5m2";
  }
}

// The cache write's stores (store_cache_row) against store_elem(load_elem(...)), bit for bit
// but for NaN payloads as above, on one target: from float32 (every upper half with eight
// lower halves, rounding ties among them), float16 and bf16 (every pattern), to each cache dtype
// that differs, fp8 at seven scales. Rows of 200 elements, so a vector's tail runs too.
int check_stores(const char* tname, uint32_t target_index) {
  const pagedattn_dtype srcs[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                  PAGEDATTN_DTYPE_BFLOAT16};
  const pagedattn_dtype dsts[] = {PAGEDATTN_DTYPE_FP8_E4M3, PAGEDATTN_DTYPE_FP8_E5M2,
                                  PAGEDATTN_DTYPE_BFLOAT16, PAGEDATTN_DTYPE_FLOAT16,
                                  PAGEDATTN_DTYPE_FLOAT32};
  const uint16_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC0DE};
  const int kRow = 200;
  int failures = 0;
  for (pagedattn_dtype sdt : srcs) {
    const size_t ssz = pa_cpu::elem_size(sdt);
    std::vector<unsigned char> src;
    if (sdt == PAGEDATTN_DTYPE_FLOAT32) {
      for (uint32_t hi = 0; hi < 65536; ++hi)
        for (uint16_t lo : lows) {
          const uint32_t u = hi << 16 | lo;
          src.insert(src.end(), reinterpret_cast<const unsigned char*>(&u),
                     reinterpret_cast<const unsigned char*>(&u) + 4);
        }
    } else {
      for (uint32_t x = 0; x < 65536; ++x) {
        const uint16_t h = static_cast<uint16_t>(x);
        src.insert(src.end(), reinterpret_cast<const unsigned char*>(&h),
                   reinterpret_cast<const unsigned char*>(&h) + 2);
      }
    }
    const int count = static_cast<int>(src.size() / ssz);
    for (pagedattn_dtype ddt : dsts) {
      if (ddt == sdt) continue;
      const bool fp8 = ddt == PAGEDATTN_DTYPE_FP8_E4M3 || ddt == PAGEDATTN_DTYPE_FP8_E5M2;
      // Powers of two take the multiply by 1 / scale (0x1p-126f's reciprocal is 2^126, 0x1p127f's
      // the subnormal 2^-127, both exact); the others divide.
      const float scales[] = {1.0f, 0.5f, 3.0f, 0.3f, 0x1p-126f, 0x1p127f, 0x1p-20f};
      const int nscales = static_cast<int>(sizeof(scales) / sizeof(scales[0]));
      for (int si = 0; si < (fp8 ? nscales : 1); ++si) {
        const float scale = scales[si];
        const size_t dsz = pa_cpu::elem_size(ddt);
        std::vector<unsigned char> got(static_cast<size_t>(count) * dsz, 0xA5);
        std::vector<unsigned char> want(static_cast<size_t>(count) * dsz, 0x5A);
        for (int r = 0; r < count; r += kRow) {
          const int n = std::min(kRow, count - r);
          pa_cpu::store_cache_row(target_index, &got[static_cast<size_t>(r) * dsz], ddt,
                                  &src[static_cast<size_t>(r) * ssz], sdt, n, scale);
          for (int i = 0; i < n; ++i)
            pa_cpu::store_elem(&want[static_cast<size_t>(r) * dsz], i, ddt,
                               pa_cpu::load_elem(&src[static_cast<size_t>(r) * ssz], i, sdt, 1.0f),
                               scale);
        }
        int bad = 0;
        for (int x = 0; x < count; ++x) {
          const unsigned char* g8 = &got[static_cast<size_t>(x) * dsz];
          const unsigned char* w8 = &want[static_cast<size_t>(x) * dsz];
          if (memcmp(g8, w8, dsz) == 0) continue;
          // A float32 store of a signalling f16 NaN: F16C quiets it (the rule of this test).
          const float wf = pa_cpu::load_elem(w8, 0, ddt, 1.0f);
          if (isnan(wf) && same(wf, pa_cpu::load_elem(g8, 0, ddt, 1.0f))) continue;
          if (bad < 4) {
            uint32_t in = 0, g = 0, w = 0;
            memcpy(&in, &src[static_cast<size_t>(x) * ssz], ssz);
            memcpy(&g, &got[static_cast<size_t>(x) * dsz], dsz);
            memcpy(&w, &want[static_cast<size_t>(x) * dsz], dsz);
            fprintf(stderr, "FAIL %s store %s -> %s scale %g input 0x%X: want 0x%X got 0x%X\n",
                    tname, name_of(sdt), name_of(ddt),
                    static_cast<double>(scale), in, w, g);
          }
          ++bad;
        }
        printf("%-8s store %-9s -> %-9s scale %-4g %7d values: %s (%d wrong)\n", tname,
               name_of(sdt), name_of(ddt), static_cast<double>(scale),
               count, bad ? "FAIL" : "ok", bad);
        failures += bad;
      }
    }
  }
  return failures;
}

}  // namespace

int main() {
  const Case cases[] = {
      {PAGEDATTN_DTYPE_FP8_E4M3, "fp8_e4m3", 256, 256.0f},
      {PAGEDATTN_DTYPE_FP8_E5M2, "fp8_e5m2", 256, 1.0f},
      {PAGEDATTN_DTYPE_FLOAT16, "float16", 65536, 1.0f},
      {PAGEDATTN_DTYPE_BFLOAT16, "bfloat16", 65536, 1.0f},
  };
  const int64_t runnable = hwy::SupportedTargets() & HWY_TARGETS;
  int failures = 0, targets = 0;
  for (int64_t t = runnable; t != 0; t &= t - 1) {
    const char* tname = hwy::TargetName(t & -t);
    pa_cpu::Target target;
    char msg[PA_MSG_LEN];
    if (!pa_cpu::target_select(tname, &target, msg)) {
      fprintf(stderr, "FAIL: target %s not selectable: %s\n", tname, msg);
      ++failures;
      continue;
    }
    ++targets;
    failures += check_stores(tname, target.index);
    for (const Case& c : cases) {
      const size_t esz = pa_cpu::elem_size(c.dt);
      std::vector<unsigned char> src(static_cast<size_t>(c.count) * esz);
      for (int x = 0; x < c.count; ++x) {
        if (esz == 1) {
          src[static_cast<size_t>(x)] = static_cast<unsigned char>(x);
        } else {
          const uint16_t h = static_cast<uint16_t>(x);
          memcpy(&src[static_cast<size_t>(x) * 2], &h, 2);
        }
      }
      for (int mode = 0; mode < 3; ++mode) {
        const bool tile = mode == 1;
        static const char* const kModeName[] = {"register", "tile", "chunks"};
        // Poisoned output: a lane the conversion skipped cannot pass.
        std::vector<float> dst(static_cast<size_t>(c.count), pa_cpu::bits_f32(0x7FBADBADu));
        pa_cpu::convert_for_test(target.index, c.dt, mode, src.data(), dst.data(), c.count);
        int bad = 0;
        for (int x = 0; x < c.count; ++x) {
          const float want = reference(c.dt, static_cast<uint32_t>(x));
          // Scaling by a power of two is exact for every finite fp8 value.
          const float got = tile ? dst[static_cast<size_t>(x)] : dst[static_cast<size_t>(x)] * c.factor;
          if (!same(want, got) || (!tile && pa_cpu::f32_bits(dst[static_cast<size_t>(x)]) == 0x7FBADBADu)) {
            if (bad < 4)
              fprintf(stderr, "FAIL %s %s %s input 0x%X: want %a (0x%08X) got %a (0x%08X)\n", tname,
                      c.name, kModeName[mode], x, static_cast<double>(want),
                      pa_cpu::f32_bits(want), static_cast<double>(got), pa_cpu::f32_bits(got));
            ++bad;
          }
        }
        printf("%-8s %-9s %-8s %5d values: %s (%d wrong)\n", tname, c.name,
               kModeName[mode], c.count, bad ? "FAIL" : "ok", bad);
        failures += bad;
      }
    }
  }
  // The bf16 dot-product decode's fp8 -> bf16 lookups (AVX3_BF16: AVX3_DL with AVX512_BF16).
  pa_cpu::Target dp;
  char dp_msg[PA_MSG_LEN];
  if (pa_cpu::target_select("AVX3_BF16", &dp, dp_msg)) {
    for (int ci = 0; ci < 2; ++ci) {
      const Case& c = cases[ci];
      std::vector<unsigned char> src(256);
      for (int x = 0; x < 256; ++x) src[static_cast<size_t>(x)] = static_cast<unsigned char>(x);
      std::vector<float> dst(256, pa_cpu::bits_f32(0x7FBADBADu));
      pa_cpu::convert_for_test(dp.index, c.dt, 3, src.data(), dst.data(), 256);
      int bad = 0;
      for (int x = 0; x < 256; ++x) {
        const float want = reference(c.dt, static_cast<uint32_t>(x));
        const float got = dst[static_cast<size_t>(x)];
        if (!same(want, got) || pa_cpu::f32_bits(got) == 0x7FBADBADu) {
          if (bad < 4)
            fprintf(stderr, "FAIL AVX3_BF16 %s bf16 input 0x%X: want %a got %a\n", c.name, x,
                    static_cast<double>(want), static_cast<double>(got));
          ++bad;
        }
      }
      printf("%-8s %-9s %-8s %5d values: %s (%d wrong)\n", "AVX3_BF16", c.name, "bf16", 256,
             bad ? "FAIL" : "ok", bad);
      failures += bad;
    }
  } else {
    printf("AVX3_BF16: skipped: %s\n", dp_msg);
  }
  if (targets == 0) {
    fprintf(stderr, "FAIL: no runnable target\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
