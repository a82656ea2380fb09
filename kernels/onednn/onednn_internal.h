/* kernels/onednn/onednn_internal.h — pieces of the oneDNN plugin shared between its files. */
#ifndef PAGEDATTN_KERNELS_ONEDNN_INTERNAL_H
#define PAGEDATTN_KERNELS_ONEDNN_INTERNAL_H

#include <stdint.h>

#include "plugin_abi.h"

namespace pa_onednn {

/* Online-softmax step for one query tile x key tile, in place of the score matrix.
 * S: [rows_pad][ldS] raw scores q.k (float32). For each real row r = t * nh + g (t < ntok) the
 * visible keys of the tile are the contiguous range allowed by the causal/window/chunk rule; the row's
 * probabilities p = exp(scale*s' - m_new) (s' after soft cap/ALiBi) go to P (bf16 bits when
 * p_bf16, else float32; zeros outside the range, row length ldP), l and m are updated and the
 * row of acc ([rows][D] float32, row stride ldA) is rescaled by exp(m_old - m_new).
 * Returns true if any row saw a key (otherwise the P.V product may be skipped). */
struct SoftmaxTileArgs {
  float* S;
  int ldS;
  void* P;
  int ldP;
  int p_bf16;
  float* acc;
  int ldA;
  int D;
  float* m;
  float* l;
  int ntok, nh;
  int nk;          /* valid keys in the tile */
  int64_t kt0;     /* absolute index of the tile's first key */
  int64_t pos0;    /* absolute position of token 0 of the item */
  int causal;
  int window;
  int chunk;
  /* The sequence's tree mask (kernels/cpu/variant.h tree_sees), or NULL: token t of the item is
   * new token tok0 + t of a sequence with tree_ctx context keys and tree_q new tokens. */
  const uint8_t* tree;
  int tree_q;
  int tok0;
  int64_t tree_ctx;
  float scale, soft_cap;
  const float* alibi; /* slopes of the item's heads (index g), or NULL */
};

bool softmax_tile(uint32_t target_index, const SoftmaxTileArgs& a);

/* Final normalisation of rows [0, ntok*nh) (pa_cpu::row_norm, with the sinks of the item's
 * heads, index g, or NULL): out = acc / l in the output dtype; lse if asked. */
void finish_rows(uint32_t target_index, const float* acc, int ldA, const float* m, const float* l,
                 int ntok, int nh, int D, void* out, pagedattn_dtype dt, int64_t out_row_stride,
                 int64_t out_head_stride, int64_t row0, int h0, const float* sinks, float* lse,
                 int64_t lse_row_stride, int64_t lse_head_stride);

}  // namespace pa_onednn

#endif /* PAGEDATTN_KERNELS_ONEDNN_INTERNAL_H */
