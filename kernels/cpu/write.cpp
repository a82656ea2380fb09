// kernels/cpu/write.cpp — reshape-and-cache: new K/V rows into their cache slots. Each head's
// row is copied or converted by store_cache_row (store-inl.h, on the selected SIMD target).
#include "convert.h"
#include "kernels.h"

namespace pa_cpu {

void cache_write_rows(uint32_t target_index, const pa_write_args& a, int64_t r0, int64_t r1) {
  const pa_cache& c = *a.cache;
  const int64_t esz = static_cast<int64_t>(elem_size(c.dtype));
  const int64_t ksz = static_cast<int64_t>(elem_size(a.k.dtype));
  const int64_t vsz = static_cast<int64_t>(elem_size(a.v.dtype));
  char* kbase = static_cast<char*>(c.k_layers[a.layer]);
  char* vbase = static_cast<char*>(c.v_layers[a.layer]);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t slot = a.slots_int64 ? static_cast<const int64_t*>(a.slots)[r]
                                       : static_cast<const int32_t*>(a.slots)[r];
    if (slot < 0) continue;
    const int64_t block = slot / c.block_size, off = slot % c.block_size;
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t dst = block * c.block_stride + off * c.slot_stride + h * c.head_stride;
      const char* k = static_cast<const char*>(a.k.data) +
                      (r * a.k.row_stride + h * a.k.head_stride) * ksz;
      const char* v = static_cast<const char*>(a.v.data) +
                      (r * a.v.row_stride + h * a.v.head_stride) * vsz;
      store_cache_row(target_index, kbase + dst * esz, c.dtype, k, a.k.dtype, c.head_size,
                      a.k_head_scales != nullptr ? a.k_head_scales[h] : a.k_scale);
      store_cache_row(target_index, vbase + dst * esz, c.dtype, v, a.v.dtype, c.head_size,
                      a.v_head_scales != nullptr ? a.v_head_scales[h] : a.v_scale);
    }
  }
}

}  // namespace pa_cpu
