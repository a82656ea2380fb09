// kernels/cpu/write.cpp — reshape-and-cache: new K/V rows into their cache slots.
#include <string.h>

#include "convert.h"
#include "kernels.h"

namespace pa_cpu {

namespace {

void store_head(void* dst, pagedattn_dtype ddt, const void* src, pagedattn_dtype sdt, int D,
                float scale) {
  if (ddt == sdt) {
    memcpy(dst, src, static_cast<size_t>(D) * elem_size(sdt));
    return;
  }
  // Different dtypes: convert through float32 (fp8: x / scale, saturating, nearest-even).
  float tmp[kMaxHeadSize];
  for (int i = 0; i < D; ++i) tmp[i] = load_elem(src, i, sdt, 1.0f);
  for (int i = 0; i < D; ++i) store_elem(dst, i, ddt, tmp[i], scale);
}

}  // namespace

void cache_write_rows(uint32_t /*target_index*/, const pa_write_args& a, int64_t r0, int64_t r1) {
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
      store_head(kbase + dst * esz, c.dtype,
                 static_cast<const char*>(a.k.data) + (r * a.k.row_stride + h * a.k.head_stride) * ksz,
                 a.k.dtype, c.head_size, a.k_scale);
      store_head(vbase + dst * esz, c.dtype,
                 static_cast<const char*>(a.v.data) + (r * a.v.row_stride + h * a.v.head_stride) * vsz,
                 a.v.dtype, c.head_size, a.v_scale);
    }
  }
}

}  // namespace pa_cpu
