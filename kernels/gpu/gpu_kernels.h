// gpu_kernels.h — plain parameter structs and launchers shared by the plugin glue and the kernel
// translation units. Kernels see no handles and no statuses; launchers return the runtime error.
#ifndef PAGEDATTN_GPU_KERNELS_H
#define PAGEDATTN_GPU_KERNELS_H

#include <stdint.h>

#include "vendor.cuh"

namespace pagedattn_gpu {

// Element type codes: the values of pagedattn_dtype.
enum Elem : int32_t { kF32 = 1, kF16 = 2, kBF16 = 3, kE4M3 = 4, kE5M2 = 5 };

enum Kind : int32_t { kDecoder = 0, kEncoder = 1, kCross = 2 };

// One CTA's work: tokens t0..t0+tlen-1 of sequence `seq` against keys [kv_begin, kv_end)
// (clipped in the kernel to what the attention type lets them see). part >= 0: write a partial
// result (split-KV) to the workspace slot `part` instead of the output.
struct WorkItem {
  int32_t seq, t0, tlen, kv_begin, kv_end, part;
};
// Combines `count` partial slots starting at `first` into sequence `seq`'s (single) output row.
struct MergeItem {
  int32_t seq, first, count, pad;
};

// Where a CTA reads keys and values: the paged cache (through block tables) or, for encoder
// attention, the k/v tensors (rows query_start[seq] + pos).
struct KvSource {
  const void* k;
  const void* v;
  int64_t block_stride;  // paged only
  int64_t slot_stride;   // paged: per slot; contiguous: per token row
  int64_t head_stride;
  int64_t v_slot_stride;  // V's strides (equal to K's for caches; k/v tensors may differ)
  int64_t v_head_stride;
  const int32_t* tables; // paged: [num_seqs][table_stride]
  int32_t table_stride;
  int32_t block_size;
  int32_t paged;
  int32_t vec;           // widest aligned load in bytes: 16, 8, 4, 2 or 1
};

struct AttnParams {
  const void* q;
  void* out;
  int64_t q_row, q_head, o_row, o_head;
  float* lse;
  int64_t lse_row, lse_head;
  int32_t num_heads, num_kv_heads, head_size, group;
  int32_t heads_per_cta, tile_tokens;
  float scale;    // the softmax scale (cta_work multiplies K's fp8 scale in)
  // fp8 dequantisation scales: per KV head (device [num_kv_heads], or NULL), else the scalars;
  // 1 and NULL unless the cache is fp8.
  float k_scale, v_scale;
  const float* k_head_scales;
  const float* v_head_scales;
  float soft_cap;
  int32_t window;
  int32_t chunk;        // attention chunk (decoder), 0 = off
  const float* alibi;
  const float* sinks;   // [num_heads] sink logits, or NULL
  // Speculative-decoding tree masks (the batch's device copy): tree_ip [seqs + 1] byte offsets
  // into tree (an empty segment is causal), or NULL for a batch planned without masks.
  const int64_t* tree_ip;
  const uint8_t* tree;
  int32_t kind;
  KvSource kv;
  const int32_t* query_lens;
  const int32_t* context_lens;
  const int32_t* query_start;
  const int32_t* encoder_lens;
  const WorkItem* items;
  const int32_t* num_items;  // device count (graph replay reads the updated value)
  float* part_o;             // [part][num_heads][head_size]
  float* part_lse;           // [part][num_heads]
  // Host side only: the shared memory the device gives a block, from which the launchers pick
  // each tile's variant, and whether it has matrix cores for the MFMA tiles (kernels read
  // neither).
  int64_t smem_per_block;
  int32_t matrix_cores;
};

// Rows per CTA: decode tiles (one token, up to 8 query heads of a group) and prefill tiles.
constexpr int kDecodeRows = 8;
#if defined(PA_LDS_64K)
constexpr int kPrefillRows = 16;  // AMD GPUs have 64 KiB of LDS per workgroup
#else
constexpr int kPrefillRows = 64;
#endif

// Launches the attention kernel for q dtype `qt` and key/value element type `kt` over `max_items`
// work items (grid x) and num_kv_heads * ceil(group / heads_per_cta) head groups (grid y).
// Sets *unsupported = 1 (and launches nothing) when instantiations.h lists no such kernel.
gpuError_t launch_attention(int32_t qt, int32_t kt, bool decode, int32_t max_items,
                            const AttnParams& p, gpuStream_t stream, int* unsupported);
// The same for queries of device type T (code qt): defined in attention.cuh and instantiated
// for each entry of PA_GPU_DTYPES in its own translation unit, attention_<name>.cu.
template <typename T>
gpuError_t launch_attention_t(int32_t qt, int32_t kt, bool decode, int32_t max_items,
                              const AttnParams& p, gpuStream_t stream, int* unsupported);

// The attributes of one of the plugin's kernels on the current device: an error when the plugin
// carries no code object the device can run.
gpuError_t kernel_attributes(gpuFuncAttributes* attr);

// The shared memory per block of the smallest devices served (sm_86, sm_89, sm_120: 99 KiB): a
// tile larger than this has a lean variant that fits it, launched where the device gives less.
constexpr int64_t kSmallSmem = 99 * 1024;

// The dynamic shared memory per block a device must give so that every attention launch has a
// tile that fits (the plugin refuses a device that cannot give it), and the same for queries of
// device type T (attention.cuh).
size_t attention_smem_need();
template <typename T>
size_t attention_smem_need_t();

struct SplitMergeParams {
  const MergeItem* items;
  const int32_t* num_items;
  const int32_t* query_start;
  const float* part_o;
  const float* part_lse;
  void* out;
  int64_t o_row, o_head;
  float* lse;
  int64_t lse_row, lse_head;
  int32_t num_heads, head_size;
  const float* sinks;  // [num_heads] or NULL: the partials leave the sink out, the merge adds it
};
gpuError_t launch_split_merge(int32_t qt, int32_t max_items, const SplitMergeParams& p,
                              gpuStream_t stream);

struct MergeStatesParams {
  const void* o1;
  const void* o2;
  void* out;
  int64_t o1_row, o1_head, o2_row, o2_head, out_row, out_head;
  const float* lse1;
  const float* lse2;
  float* lse_out;
  int64_t l1_row, l1_head, l2_row, l2_head, lo_row, lo_head;
  int64_t rows;
  int32_t heads, dim;
};
gpuError_t launch_merge_states(int32_t qt, const MergeStatesParams& p, gpuStream_t stream);

// Host slot mappings travel inside the kernel parameters (kept under 4 KiB for HIP), so a
// write from host slots needs neither a device buffer nor a host sync.
constexpr int kInlineSlots = 400;
struct WriteParams {
  const void* k;
  const void* v;
  int64_t k_row, k_head, v_row, v_head;
  void* ck;  // the layer's K and V base pointers
  void* cv;
  int64_t block_stride, slot_stride, head_stride;
  int64_t num_slots;       // num_blocks * block_size: slots outside are skipped
  int32_t block_size, heads, dim;
  const void* slots;        // device slots, or NULL: use inline_slots (from host memory)
  int32_t slots_int64;
  int64_t n;               // rows, or
  const int32_t* n_dev;    // non-NULL: the row count lives on the device (planned batches)
  float k_scale, v_scale;  // divide before fp8 rounding
  const float* k_head_scales;  // [heads] on the device (fp8), or NULL: the scalars
  const float* v_head_scales;
  int32_t vec8;            // 1: every 8-element group is aligned for a vector access
  // A latent cache's write: each row's leading latent_k values come from k, the rest from v
  // (latent_k = dim when k holds whole rows); 0 for a K/V cache.
  int32_t latent_k;
  int64_t inline_slots[kInlineSlots];
};
gpuError_t launch_cache_write(int32_t qt, int32_t ct, int64_t max_rows, const WriteParams& p,
                              gpuStream_t stream);

// Copy of whole blocks within one cache, every layer, K and V, in one launch per 256 pairs.
constexpr int kCopyPairsPerLaunch = 256;
struct CopyParams {
  void* const* k_layers;  // device arrays [num_layers]
  void* const* v_layers;
  int64_t block_stride, slot_stride, head_stride;
  int32_t num_layers, block_size, heads, row_bytes, elem_bytes, vec;
  int32_t planes;  // 2: K and V blocks; 1: a latent cache's rows
  int32_t num_pairs;
  int32_t pairs[2 * kCopyPairsPerLaunch];
};
gpuError_t launch_copy_blocks(const CopyParams& p, gpuStream_t stream);

// Multi-head latent attention (mla.cuh): latent rows of kMlaRow values, of which the leading
// kMlaValue are the values; a CTA owns kMlaRows rows (tokens x query heads) and reads each key's
// row once for all of them.
constexpr int kMlaRow = 576;
constexpr int kMlaValue = 512;
constexpr int kMlaRows = 16;
struct MlaParams {
  // q (each row's leading q_lead values), out ([tokens, H, kMlaValue]), lse, the semantics, the
  // latent cache (kv.k == kv.v) and the work list; group = num_heads (one KV head),
  // heads_per_cta = min(H, kMlaRows), tile_tokens = the tokens of one CTA. Split partials are
  // [part][num_heads][kMlaValue].
  AttnParams a;
  const void* q_pe;  // the rest of each query row, [tokens, H, kMlaRow - q_lead], or NULL
  int64_t qpe_row, qpe_head;
  int32_t q_lead;    // kMlaValue with q_pe, else kMlaRow
};
// Launches the MLA kernel for query code qt and cache code kt over max_items work items (grid
// x), ceil(H / heads_per_cta) head groups (y) and `subtiles` tiles of tile_tokens tokens per item
// (z). *unsupported = 1 (nothing launched) for a pair instantiations.h does not list.
gpuError_t launch_mla(int32_t qt, int32_t kt, int32_t max_items, int32_t subtiles,
                      const MlaParams& p, gpuStream_t stream, int* unsupported);
// The dynamic shared memory the MLA tiles of query code qt ask for (the most over cache types).
size_t mla_smem_need(int32_t qt);

}  // namespace pagedattn_gpu

#endif  // PAGEDATTN_GPU_KERNELS_H
