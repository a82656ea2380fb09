// kernels/cpu/write.cpp — reshape-and-cache: new K/V rows into their cache slots. Each head's
// row is copied or converted by store_cache_row (store-inl.h, on the selected SIMD target).
#include "convert.h"
#include "kernels.h"

namespace pa_cpu {

namespace {

// n elements in pieces store_cache_row takes (its rows are at most kMaxHeadSize long).
void store_run(uint32_t ti, char* dst, pagedattn_dtype ddt, const char* src, pagedattn_dtype sdt,
               int n, float scale) {
  const size_t desz = elem_size(ddt), sesz = elem_size(sdt);
  for (int i = 0; i < n; i += kMaxHeadSize) {
    const int m = n - i < kMaxHeadSize ? n - i : kMaxHeadSize;
    store_cache_row(ti, dst + static_cast<size_t>(i) * desz, ddt,
                    src + static_cast<size_t>(i) * sesz, sdt, m, scale);
  }
}

// A latent cache's rows: the leading k.dim values from k, the rest from v (when given).
void latent_rows(uint32_t ti, const pa_write_args& a, int64_t r0, int64_t r1) {
  const pa_cache& c = *a.cache;
  const int64_t esz = static_cast<int64_t>(elem_size(c.dtype));
  const int64_t ksz = static_cast<int64_t>(elem_size(a.k.dtype));
  char* base = static_cast<char*>(c.k_layers[a.layer]);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t slot = a.slots_int64 ? static_cast<const int64_t*>(a.slots)[r]
                                       : static_cast<const int32_t*>(a.slots)[r];
    if (slot < 0) continue;
    char* dst = base + (slot / c.block_size * c.block_stride + slot % c.block_size * c.slot_stride) *
                           esz;
    store_run(ti, dst, c.dtype, static_cast<const char*>(a.k.data) + r * a.k.row_stride * ksz,
              a.k.dtype, a.k.dim, a.k_scale);
    if (a.v.data != nullptr)
      store_run(ti, dst + a.k.dim * esz, c.dtype,
                static_cast<const char*>(a.v.data) + r * a.v.row_stride * ksz, a.v.dtype,
                c.head_size - a.k.dim, a.k_scale);
  }
}

}  // namespace

void cache_write_rows(uint32_t target_index, const pa_write_args& a, int64_t r0, int64_t r1) {
  const pa_cache& c = *a.cache;
  if (c.latent) {
    latent_rows(target_index, a, r0, r1);
    return;
  }
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
