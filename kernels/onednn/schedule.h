/* kernels/onednn/schedule.h — how the onednn backend splits one forward: which rows its embedded
 * cpu backend runs (whole steps without long enough chunks, whose tiles would be float32 unasked,
 * or over an fp8 cache the cpu kernels read faster; a mixed step's short sequences), and how the
 * other sequences are cut into oneDNN tile items of at most kMaxM (token, head) rows of one KV
 * head's query heads. Arithmetic over the forward's arguments only: no threads, no allocation. */
#ifndef PAGEDATTN_KERNELS_ONEDNN_SCHEDULE_H
#define PAGEDATTN_KERNELS_ONEDNN_SCHEDULE_H

#include <limits.h>
#include <stdint.h>

#include "plugin_abi.h"

namespace pa_onednn {

constexpr int kMaxM = 256;    /* query rows (tokens x heads of a GQA group) per oneDNN tile */
constexpr int kTK = 128;      /* keys per oneDNN tile (at most; short sequences use fewer) */
constexpr int kMinTile = 16;  /* smallest M and TK: tiles are powers of two from here */
/* The largest head size a backend can offer (pagedattn_capabilities.head_sizes: 8..256). */
constexpr int kMaxD = 256;

/* Where one sequence's keys and values are: the paged cache (table != NULL; block, slot and head
 * strides) or rows of the k/v tensors (table == NULL; key j at row row0 + j, row and head
 * strides, v's own). Strides in elements of dtype. */
struct KeySource {
  const void* k;
  const void* v;
  pagedattn_dtype dtype;
  int64_t block_stride;  /* cache: block; tensor: k's row */
  int64_t slot_stride;
  int64_t head_stride;
  int64_t v_block_stride;  /* tensor: v's row and head strides */
  int64_t v_head_stride;
  const int32_t* table;
  int32_t block_size;
  int64_t row0;
  float k_scale;         /* fp8 caches only (1 otherwise) */
  float v_scale;
};

/* One tile item: query tokens [tok0, tok1) of a sequence (rows of q and out from q_row0) and
 * query heads [h0, h1) of KV head kv_head, over every key of the sequence its rows may see. */
struct TileItem {
  const void* q;
  void* out;
  pagedattn_dtype dtype;  /* q and out */
  int64_t q_row_stride, q_head_stride, out_row_stride, out_head_stride;
  float* lse;             /* NULL when not requested */
  int64_t lse_row_stride, lse_head_stride;
  int64_t q_row0;
  int32_t tok0, tok1;
  int32_t h0, h1;
  int32_t kv_head;
  int32_t head_size;
  /* pos(token j) = pos_offset + j; causal: keys <= pos; window W > 0: pos - key < W; chunk
   * C > 0: key / C == pos / C (kernels/cpu/variant.h). */
  int32_t causal;
  int32_t pos_offset;
  int32_t window;
  int32_t chunk;
  const uint8_t* tree;    /* the sequence's tree mask (kernels/cpu/kernels.h AttnItem), or NULL */
  int32_t tree_q;
  int64_t num_keys;       /* keys of the sequence */
  float scale, soft_cap;
  const float* alibi;     /* [num_heads] or NULL */
  const float* sinks;     /* [num_heads] or NULL */
  KeySource kv;
};

/* Which steps get oneDNN tiles (the backend's settings): bf16 tiles for bf16 queries where the
 * CPU has a native bf16 matmul (bf16), float32 tiles for the other steps only where asked for
 * (f32_tiles), in both cases for the sequences of min_query query tokens or more. bf16_dp: the
 * embedded cpu kernels have bf16 dot products, and read fp8 caches faster than the tiles. */
struct TileRule {
  bool bf16 = false;
  bool f32_tiles = false;
  int min_query = 16;
  bool bf16_dp = false;
};

/* The query length from which step a's sequences run on oneDNN tiles (*bf16: bf16 ones), or
 * kNoTiles where the embedded cpu backend runs the whole step, cache write included: its tiles
 * would be float32 and none were asked for, no sequence has min_query tokens, or the cache is
 * fp8 and the cpu kernels have bf16 dot products. */
constexpr int kNoTiles = INT_MAX;
int tile_min_query(const pa_forward_args& a, const TileRule& r, bool* bf16);

/* Sets short_lens[s] to the query_len of each sequence s of bt below min_query (its rows run on
 * the embedded cpu backend) and to 0 for the others (their rows are tile items). Returns whether
 * any short sequence has a row. */
bool short_rows(const pa_batch& bt, int min_query, int32_t* short_lens);

/* Counts the tile items of forward a: prefix[s] (s = 0..num_seqs) is the number of items before
 * sequence s, items of the sequences with min_query tokens or more. Returns prefix[num_seqs]. */
int64_t count_tile_items(const pa_forward_args& a, int min_query, int64_t* prefix);

/* Tile item i (< count_tile_items) of forward a, prefix as count_tile_items filled it. A
 * sequence's items come largest token tile first (the most keys under the causal mask). */
void tile_item_at(const pa_forward_args& a, int min_query, const int64_t* prefix, int64_t i,
                  TileItem* it);

}  // namespace pa_onednn

#endif /* PAGEDATTN_KERNELS_ONEDNN_SCHEDULE_H */
