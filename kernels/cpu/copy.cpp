// kernels/cpu/copy.cpp — whole-block copies (copy_blocks, swap_blocks) and packing for
// read_blocks / load_blocks. Same dtype on both sides: plain memcpy, per block when the block is
// compact on both sides, else per (slot, head) row of head_size elements. A latent cache's rows
// move once (its V is its K).
#include <string.h>

#include "convert.h"
#include "kernels.h"

namespace pa_cpu {

namespace {

int64_t compact_slot_stride(const pa_cache& c) {
  return c.layout == PAGEDATTN_LAYOUT_NHD ? static_cast<int64_t>(c.num_kv_heads) * c.head_size
                                          : c.head_size;
}
int64_t compact_head_stride(const pa_cache& c) {
  return c.layout == PAGEDATTN_LAYOUT_NHD ? c.head_size
                                          : static_cast<int64_t>(c.block_size) * c.head_size;
}
bool compact(const pa_cache& c) {
  return c.slot_stride == compact_slot_stride(c) && c.head_stride == compact_head_stride(c);
}

char* addr(const pa_cache& c, bool value, int32_t layer, int64_t block, int64_t slot, int64_t h) {
  char* base = static_cast<char*>(value ? c.v_layers[layer] : c.k_layers[layer]);
  return base + (block * c.block_stride + slot * c.slot_stride + h * c.head_stride) *
                    static_cast<int64_t>(elem_size(c.dtype));
}

}  // namespace

void copy_block(const pa_cache& to, int32_t dst, const pa_cache& from, int32_t src,
                int32_t layer) {
  const size_t esz = elem_size(from.dtype);
  const size_t row = static_cast<size_t>(from.head_size) * esz;
  const bool whole = to.layout == from.layout && compact(to) && compact(from);
  for (int kv = 0; kv < (from.latent ? 1 : 2); ++kv) {
    if (whole) {
      memcpy(addr(to, kv, layer, dst, 0, 0), addr(from, kv, layer, src, 0, 0),
             row * static_cast<size_t>(from.block_size) * static_cast<size_t>(from.num_kv_heads));
      continue;
    }
    for (int32_t s = 0; s < from.block_size; ++s) {
      for (int32_t h = 0; h < from.num_kv_heads; ++h)
        memcpy(addr(to, kv, layer, dst, s, h), addr(from, kv, layer, src, s, h), row);
    }
  }
}

void pack_block(const pa_cache& c, int32_t block, int32_t layer, void* buf, bool unpack) {
  const size_t esz = elem_size(c.dtype);
  const size_t row = static_cast<size_t>(c.head_size) * esz;
  const size_t half = row * static_cast<size_t>(c.block_size) * static_cast<size_t>(c.num_kv_heads);
  for (int kv = 0; kv < (c.latent ? 1 : 2); ++kv) {
    char* b = static_cast<char*>(buf) + static_cast<size_t>(kv) * half;
    if (compact(c)) {
      char* p = addr(c, kv, layer, block, 0, 0);
      if (unpack) memcpy(p, b, half); else memcpy(b, p, half);
      continue;
    }
    for (int32_t s = 0; s < c.block_size; ++s) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        // Packed order follows the layout: NHD (slot, head), HND (head, slot).
        const size_t idx = c.layout == PAGEDATTN_LAYOUT_NHD
                               ? static_cast<size_t>(s) * c.num_kv_heads + h
                               : static_cast<size_t>(h) * c.block_size + s;
        char* p = addr(c, kv, layer, block, s, h);
        if (unpack) memcpy(p, b + idx * row, row); else memcpy(b + idx * row, p, row);
      }
    }
  }
}

}  // namespace pa_cpu
