// kernels/cpu/merge.cpp — merge two attention states over disjoint key sets.
#include <math.h>

#include <algorithm>
#include <limits>

#include "convert.h"
#include "kernels.h"

namespace pa_cpu {

void merge_rows(uint32_t /*target_index*/, const pa_merge_args& a, int64_t r0, int64_t r1) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int H = a.out.heads, D = a.out.dim;
  const int64_t esz = static_cast<int64_t>(elem_size(a.out.dtype));
  float tmp[kMaxHeadSize];
  for (int64_t r = r0; r < r1; ++r) {
    for (int h = 0; h < H; ++h) {
      const float l1 = a.lse1.data[r * a.lse1.row_stride + h * a.lse1.head_stride];
      const float l2 = a.lse2.data[r * a.lse2.row_stride + h * a.lse2.head_stride];
      const float mx = max_keep_nan(l1, l2);
      float w1 = 0.0f, w2 = 0.0f, lse = kNegInf;
      if (max_poisoned(mx)) {  // a NaN or +inf lse: NaN, as float64 gives
        w1 = w2 = lse = std::numeric_limits<float>::quiet_NaN();
      } else if (mx != kNegInf) {
        const float e1 = l1 == kNegInf ? 0.0f : expf(l1 - mx);
        const float e2 = l2 == kNegInf ? 0.0f : expf(l2 - mx);
        const float sum = e1 + e2;
        w1 = e1 / sum;
        w2 = e2 / sum;
        lse = mx + logf(sum);
      }
      const char* p1 = static_cast<const char*>(a.o1.data) +
                       (r * a.o1.row_stride + h * a.o1.head_stride) * esz;
      const char* p2 = static_cast<const char*>(a.o2.data) +
                       (r * a.o2.row_stride + h * a.o2.head_stride) * esz;
      // Read both inputs fully before writing: out may alias o1 or o2.
      for (int i = 0; i < D; ++i) {
        const float x1 = w1 != 0.0f ? load_elem(p1, i, a.o1.dtype, 1.0f) * w1 : 0.0f;
        const float x2 = w2 != 0.0f ? load_elem(p2, i, a.o2.dtype, 1.0f) * w2 : 0.0f;
        tmp[i] = x1 + x2;
      }
      char* po = static_cast<char*>(a.out.data) + (r * a.out.row_stride + h * a.out.head_stride) * esz;
      for (int i = 0; i < D; ++i) store_elem(po, i, a.out.dtype, tmp[i], 1.0f);
      if (a.lse_out.data != nullptr)
        a.lse_out.data[r * a.lse_out.row_stride + h * a.lse_out.head_stride] = lse;
    }
  }
}

}  // namespace pa_cpu
