/* kernels/cpu/kernels.h — the CPU kernels' interface: plain argument structs, no handles and no
 * statuses, so the built-in CPU backend and the oneDNN plugin can both call them.
 *
 * SIMD code is compiled once per Highway target (see targets.cpp); callers pick the target per
 * call through `target_index` (from pa_cpu_target_select), so two backends forced to different
 * targets in one process do not disturb each other. */
#ifndef PAGEDATTN_KERNELS_CPU_KERNELS_H
#define PAGEDATTN_KERNELS_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "kernels/runtime/softmax_rules.h"
#include "plugin_abi.h"

namespace pa_cpu {

/* ---- targets (targets.cpp) ---- */

/* The SIMD target a backend uses: its Highway bit, its name and its dispatch-table index.
 * bf16_dp: the AVX3_DL code also runs decode through AVX512_BF16 dot products (the pseudo
 * target "AVX3_BF16", chosen first where the CPU has AVX512_BF16).
 * amx: on top of bf16_dp, an fp8 cache's decode and the row-vectorised path of a bf16 or fp8
 * cache (prefill tiles, wide GQA groups) run their scores and P.V on AMX-BF16 tiles (the pseudo
 * target "AVX3_AMX", chosen first where the CPU has AMX-BF16 and the kernel lets this process use
 * it). */
struct Target {
  int64_t bit;
  const char* name;
  uint32_t index;
  bool bf16_dp;
  bool amx;
  /* How the decode prefetches the next tile (TileSpans::before_scores in prefetch-inl.h): true,
   * each tile's lines asked for twice, K during the scores and V during P.V (the faster plan on
   * Zen 4); false, once, K and V in turn over the whole tile (the faster plan on Intel Xeons).
   * Set by target_select, overridden by prefetch_select. */
  bool prefetch_twice;
};

/* Picks the best runnable target, or the one named (hwy::TargetName spelling: "AVX3", "AVX2",
 * "SSE4", "SSSE3", "SCALAR"...). Returns false for a name that is unknown, not compiled in or not
 * runnable on this CPU, and writes into msg (PA_MSG_LEN) which ones are runnable. */
bool target_select(const char* name, Target* out, char* msg);

/* Sets out->prefetch_twice from PAGEDATTN_CPU_PREFETCH ("twice" or "once") where it is set;
 * else leaves target_select's default (true on every CPU but Intel's, by CPUID vendor). Returns
 * false, with msg (PA_MSG_LEN), for another value. Reads the environment only. */
bool prefetch_select(Target* out, char* msg);

/* ---- attention (attention.cpp, the kernels in its -inl.h files) ---- */

/* Where the keys and values of one sequence come from: the paged cache (table != NULL) or
 * contiguous rows of the k/v tensors (table == NULL, key j at row row0 + j). */
struct KVSource {
  const void* k;               /* layer base (cache) or tensor data */
  const void* v;
  pagedattn_dtype dtype;
  int64_t block_stride;        /* cache: block/slot/head strides; tensor: row/head strides */
  int64_t slot_stride;
  int64_t head_stride;
  int64_t v_block_stride;      /* tensor v may have its own strides */
  int64_t v_slot_stride;
  int64_t v_head_stride;
  const int32_t* table;        /* block ids of the sequence, or NULL */
  int32_t block_size;
  int64_t row0;
  float k_scale;               /* fp8 only (1 otherwise) */
  float v_scale;
};

/* Largest number of (token, head) rows one work item handles; sizes the scratch. */
constexpr int kMaxRows = 64;
/* Keys per tile in the flash loop. */
constexpr int kKeyTile = 32;
constexpr int kMaxHeadSize = 256;
/* Most key splits of one sequence (split-KV). */
constexpr int kMaxSplits = 64;

/* Per-thread scratch: q, accumulators, score tile and converted K/V tiles. 64-byte aligned; its
 * size a multiple of 64 too, so every worker's in an array is. */
struct alignas(64) Scratch {
  float q[kMaxRows * kMaxHeadSize];
  float acc[kMaxRows * kMaxHeadSize];
  float kt[kKeyTile * kMaxHeadSize];
  float vt[kKeyTile * kMaxHeadSize];
  float s[kMaxRows * kKeyTile];
  float m[kMaxRows];
  float l[kMaxRows];
  /* Per-row vector partial sums of l (16 lanes) of the dot-product decode's full tiles, added
   * into l before anything else reads or rescales it. */
  float lv[kMaxRows * 16];
  /* Per-row masking data of the row-vectorised path. */
  float alpha[kMaxRows];
  float posf[kMaxRows];
  float slope[kMaxRows];
  int32_t lo[kMaxRows];
  int32_t hi[kMaxRows];
  /* The backend's Target::prefetch_twice, set by attention_item for the kernels. */
  bool prefetch_twice;
};

/* One work item: query tokens [tok0, tok1) of a sequence (rows of q/out from q_row0) and query
 * heads [h0, h1) of one KV head's group, over keys [key0, key1) of the sequence. */
struct AttnItem {
  /* Query / output. */
  const void* q;
  void* out;                  /* NULL: write the partial state into part_* instead */
  pagedattn_dtype dtype;      /* q and out */
  int64_t q_row_stride, q_head_stride, out_row_stride, out_head_stride;
  float* lse;                 /* NULL when not requested */
  int64_t lse_row_stride, lse_head_stride;
  int64_t q_row0;             /* first row of this item's tokens */
  int32_t tok0, tok1;         /* tokens within the sequence */
  int32_t h0, h1;             /* query heads (all mapping to kv_head) */
  int32_t kv_head;
  int32_t kv_heads;           /* KV heads kv_head.. covered (h0..h1 spans all their query heads);
                                 > 1 only for decode items multi_head_decode_ok accepts, 0 = 1 */
  int32_t head_size;
  /* Masking. pos(token j) = pos_offset + j; causal: keys <= pos; window W > 0: pos - key < W;
   * chunk C > 0: key / C == pos / C (variant.h). */
  int32_t causal;
  int32_t pos_offset;
  int32_t window;
  int32_t chunk;
  /* The sequence's tree mask (variant.h tree_sees; pos_offset is its context length), or NULL:
   * set only for a decoder sequence of more than one new token whose mask is not empty. */
  const uint8_t* tree;
  int32_t tree_q;
  int64_t num_keys;           /* keys of the sequence */
  int64_t key0, key1;         /* key range of this item (split-KV) */
  float scale, soft_cap;
  const float* alibi;         /* [num_heads] or NULL */
  const float* sinks;         /* [num_heads] or NULL */
  KVSource kv;
  /* Partial output for split-KV: [rows][head_size] unnormalised accumulators, then m, l. */
  float* part_acc;
  float* part_m;
  float* part_l;
};

using pa_runtime::max_keep_nan;
using pa_runtime::max_poisoned;

/* q and out rows of the item's token t, head h0 + g. */
static inline const char* item_q(const AttnItem& it, int t, int g) {
  return static_cast<const char*>(it.q) +
         ((it.q_row0 + t) * it.q_row_stride + (it.h0 + g) * it.q_head_stride) *
             static_cast<int64_t>(elem_size(it.dtype));
}
static inline char* item_out(const AttnItem& it, int t, int g) {
  return static_cast<char*>(it.out) +
         ((it.q_row0 + t) * it.out_row_stride + (it.h0 + g) * it.out_head_stride) *
             static_cast<int64_t>(elem_size(it.dtype));
}

/* Whether `item` (a decode item, one token, over a paged cache) may cover several KV heads
 * (kv_heads > 1): the AVX3_BF16 dot-product decode, or on any target the in-register loops (head
 * size a whole number of vectors), then read whole slot rows of caches whose heads are
 * contiguous, or whole blocks. Items the kernels cannot run that way are still correct: they run
 * one KV head at a time. */
bool multi_head_decode_ok(const Target& target, const AttnItem& item);

/* Runs one work item with the given target. On AVX3_AMX it configures the calling thread's AMX
 * tiles for the item and releases them before it returns (no tile state is kept between calls). */
void attention_item(const Target& target, const AttnItem& item, Scratch* scratch);

/* Combines `n` partial states (acc [rows][D] with stride part_stride floats between parts, m, l
 * [rows] with stride ml_stride) into the output rows of `item` (its out/lse/heads/tokens). */
void attention_merge_parts(uint32_t target_index, const AttnItem& item, int n,
                           const float* acc, int64_t part_stride, const float* m,
                           const float* l, int64_t ml_stride);

/* Converts n cache elements of dtype dt (n a multiple of 64) to float32 as the attention kernels
 * do: mode 0 in registers one vector at a time (fp8 unscaled, e4m3 times 2^-8), mode 1 into a K/V
 * tile with scale 1, mode 2 in registers as the fp8 decode path reads whole chunks of them
 * (AVX3_DL: 4 vectors by byte lookups; AVX2: 2 vectors widened at once; elsewhere as mode 0),
 * mode 3 (fp8 only, the AVX3_DL target on a CPU with AVX512_BF16) through bf16 as the
 * dot-product decode reads them, exact and unscaled; other targets leave dst alone. For the
 * exhaustive conversion test. */
void convert_for_test(uint32_t target_index, pagedattn_dtype dt, int mode, const void* src,
                      float* dst, int n);

/* ---- multi-head latent attention (the kernel in mla-inl.h, dispatched by attention.cpp) ---- */

/* Most (token, head) rows of one MLA work item: a decode step's 128 heads read each latent row
 * once. */
constexpr int kMlaMaxRows = 128;
/* Keys per tile of the MLA loop. */
constexpr int kMlaKeyTile = 32;

/* One MLA work item: an AttnItem over the latent cache (head_size the row size D, kv.k = kv.v
 * the layer's rows, one KV head, every query head of the item reading it) whose query rows are
 * q_nope's leading values beside q_pe's, and whose output and partial rows are value_size wide
 * (the rows' leading values). */
struct MlaItem {
  AttnItem a;
  const void* q_pe;           /* NULL: a.q holds whole rows */
  int64_t q_pe_row_stride, q_pe_head_stride;
  int32_t value_size;         /* R: out and part_acc rows are R floats */
};

/* Where an MLA item's scratch of `rows` rows, row size D and value size R puts its arrays, in
 * floats from its start (each 64-byte aligned): the scaled query rows, the accumulators, a
 * converted key tile, a score tile and each row's running max and sum; `total` is its size. */
struct MlaLayout {
  size_t q, acc, kt, s, m, l, total;
};
static inline MlaLayout mla_layout(int rows, int D, int R) {
  const auto up = [](size_t n) { return (n + 15) / 16 * 16; };
  MlaLayout L;
  L.q = 0;
  L.acc = L.q + up(static_cast<size_t>(rows) * D);
  L.kt = L.acc + up(static_cast<size_t>(rows) * R);
  L.s = L.kt + up(static_cast<size_t>(kMlaKeyTile) * D);
  L.m = L.s + up(static_cast<size_t>(rows) * kMlaKeyTile);
  L.l = L.m + up(static_cast<size_t>(rows));
  L.total = L.l + up(static_cast<size_t>(rows));
  return L;
}

/* Runs one MLA item with the given target; scratch holds mla_layout(rows, D, R).total floats,
 * 64-byte aligned. */
void mla_item(const Target& target, const MlaItem& item, float* scratch);

/* ---- cache write (write.cpp; store_cache_row per target in store-inl.h, dispatched by
 * attention.cpp) ---- */

/* Stores n (<= kMaxHeadSize) elements of src, dtype sdt, as dtype ddt at dst: exactly what
 * store_elem(load_elem(...)) gives (fp8: x / scale, saturating, nearest even), vectorised on the
 * target where dst is float32, bf16 or fp8. Same dtype: a plain copy. */
void store_cache_row(uint32_t target_index, void* dst, pagedattn_dtype ddt, const void* src,
                     pagedattn_dtype sdt, int n, float scale);

/* Stores rows [r0, r1) of k/v into the cache at the given slots (-1 skipped). */
void cache_write_rows(uint32_t target_index, const pa_write_args& args, int64_t r0, int64_t r1);

/* ---- block copies (copy.cpp) ---- */

/* Copies block src of `from` to block dst of `to` (K and V, layer l), same dtype and geometry;
 * strides/layouts may differ. */
void copy_block(const pa_cache& to, int32_t dst, const pa_cache& from, int32_t src, int32_t layer);
/* Packs (unpack = false) or unpacks one block of one layer, K then V, to/from `buf` in the
 * cache's layout order (read_blocks' format). */
void pack_block(const pa_cache& c, int32_t block, int32_t layer, void* buf, bool unpack);

/* ---- merge states (merge.cpp) ---- */

/* Merges rows [r0, r1) of the merge arguments. */
void merge_rows(uint32_t target_index, const pa_merge_args& args, int64_t r0, int64_t r1);

}  // namespace pa_cpu

#endif  // PAGEDATTN_KERNELS_CPU_KERNELS_H
