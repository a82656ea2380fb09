// wmma.h — nvcuda::wmma 16x16x16 as warp-collective whole-tile operations: every call is a warp
// rendezvous (all lanes, one site), then each lane's fragment holds the whole tile. Loads and
// stores end with a second rendezvous: the warp's access completes before any lane goes on, so
// a lane's later writes cannot reach another lane's load of the same call. The kernels use
// fragments only whole (load, fill, mma, store), never their per-lane elements, so the lane layout
// of the hardware does not show; products accumulate in float32 in k order. A product's rows are
// split across the lanes (one computation per warp, not one per lane).
#ifndef PAGEDATTN_GPUSIM_WMMA_H
#define PAGEDATTN_GPUSIM_WMMA_H

#include <type_traits>

#include "halfs.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float elem_to_float(float x) { return x; }
inline float elem_to_float(__half x) { return __half2float(x); }
inline float elem_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the kernels use 16x16x16 only");
  float v[16 * 16];  // row-major, converted exactly from T
};

#define PA_WMMA_SYNC() \
  ::pa_sim::sync_warp(0xffffffffu, __FILE__, __LINE__, "nvcuda::wmma (warp-collective)")

template <typename Use, typename T, typename Layout>
inline void load_frag(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ld,
                      bool col) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.v[r * 16 + c] = elem_to_float(col ? p[c * ld + r] : p[r * ld + c]);
}

// A or B from memory: row_major or col_major as the fragment's layout says.
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ld) {
  static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value,
                "an accumulator load names its memory layout");
  PA_WMMA_SYNC();
  load_frag(f, p, ld, std::is_same<Layout, col_major>::value);
  PA_WMMA_SYNC();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ld, layout_t l) {
  PA_WMMA_SYNC();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.v[r * 16 + c] = l == mem_row_major ? p[r * ld + c] : p[c * ld + r];
  PA_WMMA_SYNC();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ld, layout_t l) {
  PA_WMMA_SYNC();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (l == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.v[r * 16 + c];
  PA_WMMA_SYNC();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float x) {
  PA_WMMA_SYNC();
  for (float& e : f.v) e = x;
}
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  // The lanes share the rows (through the warp's scratch tile), then each takes the whole tile.
  PA_WMMA_SYNC();
  float* out = ::pa_sim::warp_scratch();
  const int ws = ::pa_sim::warp_size();
  for (int i = ::pa_sim::lane_id(); i < 16; i += ws)
    for (int j = 0; j < 16; ++j) {
      float s = c.v[i * 16 + j];
      for (int k = 0; k < 16; ++k) s = fmaf(a.v[i * 16 + k], b.v[k * 16 + j], s);
      out[i * 16 + j] = s;
    }
  PA_WMMA_SYNC();
  memcpy(d.v, out, sizeof d.v);
}

#undef PA_WMMA_SYNC

}  // namespace wmma
}  // namespace nvcuda

#endif  // PAGEDATTN_GPUSIM_WMMA_H
