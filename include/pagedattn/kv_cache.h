/* pagedattn/kv_cache.h — the paged KV cache.
 *
 * One cache holds the pool of a whole model: num_layers x {K, V} x num_blocks x block_size slots x
 * num_kv_heads x head_size. Block ids are shared by all layers. Element (layer, block, slot, head,
 * dim) of K lives at k_layer_base[layer] + block*block_stride + slot*slot_stride +
 * head*head_stride + dim (element strides), and likewise for V.
 *
 * fp8 caches store fp8(x / scale), saturating to the finite range, and load float(fp8) * scale,
 * with one scale for K and one for V given at each call.
 *
 * Thread safety: calls that write a cache (write, copy, swap into it, load) may run concurrently
 * with each other and with forwards only if they touch disjoint blocks/slots; reads of a block
 * (forward, read_blocks, swap out of it) may run concurrently with each other. get_desc,
 * get_layer and bytes_per_block are always thread-safe. On GPU backends "runs" means "is queued":
 * ordering across streams is the caller's business.
 */
#ifndef PAGEDATTN_KV_CACHE_H
#define PAGEDATTN_KV_CACHE_H

#include "pagedattn/backend.h"
#include "pagedattn/common.h"
#include "pagedattn/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pagedattn_kv_cache pagedattn_kv_cache;

typedef enum pagedattn_layout {
  PAGEDATTN_LAYOUT_NHD = 0, /* [block][slot][head][dim] (FlashAttention's) */
  PAGEDATTN_LAYOUT_HND = 1  /* [block][head][slot][dim] (per-head streaming) */
} pagedattn_layout;

/* Cache flags. */
/* Place the cache in host memory owned by this backend (pinned on GPU backends), as the host
 * side of swaps. Ignored (already host) on CPU backends. */
#define PAGEDATTN_KV_CACHE_HOST (1u << 0)
/* Since 0.2: a latent cache for multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2),
 * on backends with PAGEDATTN_FEATURE_MLA. Each token stores one row of head_size values per layer
 * (kv_lora_rank compressed values, then the rotary key: 512 + 64 = 576 for DeepSeek V3) shared by
 * every query head; there is no separate V: the values are the leading entries of the same row.
 * num_kv_heads must be 1 and head_size a latent row size the backend lists in
 * pagedattn_capabilities.latent_sizes. Rows are written with pagedattn_kv_cache_write_latent and
 * read by pagedattn_forward_mla (docs/semantics.md section 8). */
#define PAGEDATTN_KV_CACHE_LATENT (1u << 1)

/* Geometry of a cache. Initialise with pagedattn_kv_cache_desc_init. */
typedef struct pagedattn_kv_cache_desc {
  uint32_t struct_size; /* sizeof(pagedattn_kv_cache_desc) */
  int32_t num_layers;   /* >= 1 */
  int32_t num_blocks;   /* >= 1 */
  int32_t block_size;   /* tokens per block: a power of two the backend supports */
  int32_t num_kv_heads; /* >= 1 */
  int32_t head_size;    /* a head size the backend supports */
  pagedattn_dtype dtype;   /* float32/float16/bfloat16 (= the model's) or fp8_e4m3/fp8_e5m2 */
  pagedattn_layout layout; /* NHD or HND */
  uint32_t flags;          /* PAGEDATTN_KV_CACHE_* */
} pagedattn_kv_cache_desc;

/* Fills *desc with zeros, layout NHD, dtype bfloat16, and sets struct_size. Returns
 * PAGEDATTN_ERROR_NULL_POINTER if desc is NULL. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_desc_init(pagedattn_kv_cache_desc* desc);

/* Bytes one block takes across all layers, K and V (num_layers * 2 * block_size * num_kv_heads *
 * head_size * element size; a latent cache has one row per slot: num_layers * block_size *
 * head_size * element size), so an engine can size its pool: num_blocks = free / *out. Also the
 * size of one block's record in read_blocks/load_blocks buffers. Validates the geometry as create
 * does but needs no backend. Returns PAGEDATTN_ERROR_NULL_POINTER, PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_INVALID_ARGUMENT, PAGEDATTN_ERROR_OVERFLOW. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_bytes_per_block(
    uint64_t* out, const pagedattn_kv_cache_desc* desc);

/* Creates a cache whose memory the library allocates on the backend's device (or pinned host
 * memory with PAGEDATTN_KV_CACHE_HOST). The contents start as zeros. Layers are contiguous:
 * layer l's K blocks, then its V blocks. Free with pagedattn_kv_cache_destroy.
 * Returns: PAGEDATTN_ERROR_NULL_POINTER (out, backend, desc), PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (non-positive sizes, a block size that is not a power of two
 * in 1..256, bad dtype, layout or flags), PAGEDATTN_ERROR_UNSUPPORTED (head size, block size,
 * dtype or layout the backend lacks; the message lists what it supports),
 * PAGEDATTN_ERROR_OVERFLOW (the cache's byte size overflows), PAGEDATTN_ERROR_OUT_OF_MEMORY (the
 * allocation failed or would exceed the backend's memory_limit), PAGEDATTN_ERROR_INVALID_HANDLE
 * (backend destroyed), PAGEDATTN_ERROR_DEVICE (GPU: preparing the cache on the device failed).
 * Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_create(pagedattn_kv_cache** out,
                                                        pagedattn_backend* backend,
                                                        const pagedattn_kv_cache_desc* desc);

/* Caller memory for pagedattn_kv_cache_wrap. */
typedef struct pagedattn_kv_cache_memory {
  uint32_t struct_size;      /* sizeof(pagedattn_kv_cache_memory) */
  void* const* k_layers;     /* [num_layers] base pointers of each layer's K blocks (of a
                                latent cache: its rows) */
  void* const* v_layers;     /* [num_layers] base pointers of each layer's V blocks; ignored,
                                and may be NULL, for a latent cache */
  /* Element strides (not bytes); 0,0,0 = the compact strides of desc->layout. The innermost (dim)
   * stride is always 1. A dimension of extent 1 (one block, slot or head) ignores its stride. */
  int64_t block_stride;
  int64_t slot_stride;
  int64_t head_stride;
  pagedattn_device device;   /* where the memory lives: the backend's device, or host memory
                                (CPU / CUDA_HOST / ROCM_HOST) for a host cache of a GPU backend */
} pagedattn_kv_cache_memory;

/* Creates a cache over caller memory, used in place (e.g. a framework's tensors). The library
 * copies the pointer arrays but not the memory, which must stay valid and unmoved until the cache
 * is destroyed; the caller keeps ownership. Returns the statuses of create (its
 * OUT_OF_MEMORY then only for the library's own bookkeeping, never for the blocks), plus
 * PAGEDATTN_ERROR_NULL_POINTER (memory, memory->k_layers or memory->v_layers),
 * PAGEDATTN_ERROR_UNSUPPORTED (the backend lacks PAGEDATTN_FEATURE_WRAP_CACHE),
 * PAGEDATTN_ERROR_WRONG_DEVICE (memory on a device the backend cannot use),
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (strides not all > 0 nor all 0, strides that make blocks,
 * slots or heads overlap, a NULL layer pointer), PAGEDATTN_ERROR_OVERFLOW (strides whose element
 * or byte offsets overflow int64). Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_wrap(pagedattn_kv_cache** out,
                                                      pagedattn_backend* backend,
                                                      const pagedattn_kv_cache_desc* desc,
                                                      const pagedattn_kv_cache_memory* memory);

/* Destroys a cache (freeing its memory if the library allocated it). NULL is a no-op. Batches
 * planned against it stay valid. Queued GPU work using it must have finished. Not thread-safe with
 * other calls on the same cache. */
PAGEDATTN_API void pagedattn_kv_cache_destroy(pagedattn_kv_cache* cache);

/* Copies the cache's geometry into *out (up to out->struct_size bytes). Returns
 * PAGEDATTN_ERROR_NULL_POINTER (out, cache), PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_INVALID_HANDLE (cache destroyed). Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_get_desc(pagedattn_kv_cache_desc* out,
                                                          const pagedattn_kv_cache* cache);

/* Returns layer `layer`'s K and V base pointers and the element strides (block, slot, head) of the
 * cache (for a wrapped cache, the ones it was wrapped with; for a latent cache *v is the rows' base
 * too, as its values lead each row), so an engine can hand the memory to
 * other code. Any out pointer may be NULL. Returns
 * PAGEDATTN_ERROR_NULL_POINTER (cache), PAGEDATTN_ERROR_OUT_OF_RANGE (layer),
 * PAGEDATTN_ERROR_INVALID_HANDLE. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_get_layer(void** k, void** v,
                                                           int64_t strides[3],
                                                           const pagedattn_kv_cache* cache,
                                                           int32_t layer);

/* Reshape-and-cache: for each token t with slot_mapping[t] >= 0, stores key[t] and value[t]
 * ([T, num_kv_heads, head_size], dtype of the model: float32/float16/bfloat16, on the cache's
 * device) at block slot/block_size, offset slot%block_size of `layer`. slot_mapping is a 1-D
 * int32 or int64 tensor of T entries; -1 means padding (skipped). On fp8 caches values are
 * divided by k_scale / v_scale (must be finite and > 0) before rounding; otherwise the scales are
 * ignored.
 * A call writes each slot at most once: which of two rows naming one slot would land is not
 * defined.
 * A host slot mapping (CPU or pinned host memory) is checked before anything is written: a slot
 * < -1 or >= num_blocks*block_size gives PAGEDATTN_ERROR_OUT_OF_RANGE, a slot named by two
 * entries PAGEDATTN_ERROR_INVALID_ARGUMENT (naming both), and nothing is written. A slot mapping
 * in GPU memory cannot be read without a host sync: GPU backends then check each slot in the
 * kernel and never write out of range, skipping bad slots; a repeated slot there is not
 * detected, and leaves each element of that slot holding the value of one of its rows.
 * Runs on `stream` (NULL = default; ignored on CPU). Returns PAGEDATTN_ERROR_NULL_POINTER
 * (cache, key, value, slot_mapping, or a tensor's data with elements),
 * PAGEDATTN_ERROR_BAD_TENSOR (rank, shape, dtype, strides; slot_mapping not 1-D int32/int64 with
 * unit stride), PAGEDATTN_ERROR_WRONG_DEVICE, PAGEDATTN_ERROR_OUT_OF_RANGE (layer or slot),
 * PAGEDATTN_ERROR_OVERFLOW (a tensor whose strides or byte_offset make element or byte offsets
 * overflow int64), PAGEDATTN_ERROR_UNSUPPORTED (a key dtype other than the cache's on a non-fp8
 * cache, or one the backend lacks), PAGEDATTN_ERROR_INVALID_ARGUMENT (scales, a repeated slot,
 * a latent cache: see pagedattn_kv_cache_write_latent), PAGEDATTN_ERROR_INVALID_HANDLE (cache
 * destroyed), PAGEDATTN_ERROR_DEVICE. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write(pagedattn_kv_cache* cache, int32_t layer,
                                                       const pagedattn_tensor* key,
                                                       const pagedattn_tensor* value,
                                                       const pagedattn_tensor* slot_mapping,
                                                       float k_scale, float v_scale,
                                                       void* stream);

/* Since 0.2: pagedattn_kv_cache_write with per-KV-head scales (fp8 checkpoints quantised per
 * head): on an fp8 cache, head h of key[t] is stored as fp8(key[t][h] / k_head_scales[h]), and
 * likewise for value; other caches ignore the scales. k_head_scales and v_head_scales are float32
 * [num_kv_heads] tensors on the cache's device, or NULL for scale 1. Read during the call (GPU:
 * when the write runs on the stream). Everything else, the statuses included, is as
 * pagedattn_kv_cache_write, plus PAGEDATTN_ERROR_BAD_TENSOR (a scales tensor not float32
 * [num_kv_heads] with unit stride), PAGEDATTN_ERROR_INVALID_ARGUMENT (a scale in host memory that
 * is not finite and > 0) and PAGEDATTN_ERROR_UNSUPPORTED (a backend without
 * PAGEDATTN_FEATURE_HEAD_SCALES). Scales in GPU memory are not read by the host: a value there
 * that is not finite and > 0 stores NaN for that head. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write_scaled(
    pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* key,
    const pagedattn_tensor* value, const pagedattn_tensor* slot_mapping,
    const pagedattn_tensor* k_head_scales, const pagedattn_tensor* v_head_scales, void* stream);

/* Since 0.2: reshape-and-cache for a latent (MLA) cache (vLLM's concat_and_cache_mla): for each
 * token t with slot_mapping[t] >= 0, stores the row [kv_c[t], k_pe[t]] of head_size values at its
 * slot of `layer`. kv_c is [T, R] (R = kv_lora_rank, the values) and k_pe [T, head_size - R] (the
 * rotary key), each 2-D or 3-D with a middle extent of 1 ([T, 1, R] as vLLM's k_pe); or k_pe is
 * NULL and kv_c holds whole rows, [T, head_size]. Both of the model's dtype (float32/float16/
 * bfloat16; the cache's, or an fp8 cache), on the cache's device. On an fp8 cache values are
 * stored as fp8(x / scale) (scale finite and > 0); other caches ignore scale. Slots follow
 * pagedattn_kv_cache_write's rules (host slot mappings checked first, -1 skipped, each slot at
 * most once). Runs on `stream`. Returns the statuses of pagedattn_kv_cache_write, and
 * PAGEDATTN_ERROR_INVALID_ARGUMENT for a cache that is not latent. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_write_latent(
    pagedattn_kv_cache* cache, int32_t layer, const pagedattn_tensor* kv_c,
    const pagedattn_tensor* k_pe, const pagedattn_tensor* slot_mapping, float scale,
    void* stream);

/* Copies whole blocks, K and V of every layer, within one cache: for i < num_pairs, block
 * pairs[2i] -> block pairs[2i+1] (copy-on-write for beam search and parallel sampling). `pairs`
 * is host memory. Every id must be in [0, num_blocks); a destination may appear once and may not
 * also be a source of another pair (src == dst is a no-op). All pairs are checked before anything
 * is copied. Runs on `stream`. Returns PAGEDATTN_ERROR_NULL_POINTER (cache, or pairs with
 * num_pairs > 0), PAGEDATTN_ERROR_OUT_OF_RANGE (an id), PAGEDATTN_ERROR_INVALID_ARGUMENT
 * (repeated destination, a destination that is also the source of another pair, num_pairs >
 * INT32_MAX), PAGEDATTN_ERROR_INVALID_HANDLE (cache destroyed), PAGEDATTN_ERROR_DEVICE. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_copy_blocks(pagedattn_kv_cache* cache,
                                                             const int32_t* pairs,
                                                             size_t num_pairs, void* stream);

/* Copies whole blocks, K and V of every layer, from cache `src` to cache `dst`: block pairs[2i] of
 * src -> block pairs[2i+1] of dst. The caches must have identical geometry (layers, block size,
 * heads, head size, dtype, both latent or neither; layouts and block counts may differ) and may
 * live on different devices (device <-> host for preemption and offload); the backend of `dst` or
 * of `src`, whichever is a GPU backend, does the copy, asynchronously on `stream` when the host
 * side is pinned. Checks as copy_blocks (destinations unique). Returns
 * PAGEDATTN_ERROR_NULL_POINTER (dst, src, or pairs with num_pairs > 0),
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (geometry or dtype differs; repeated destination; num_pairs >
 * INT32_MAX; with dst == src, a destination that is also a source), PAGEDATTN_ERROR_OUT_OF_RANGE
 * (an id), PAGEDATTN_ERROR_WRONG_DEVICE (two different GPUs), PAGEDATTN_ERROR_INVALID_HANDLE (a
 * cache destroyed), PAGEDATTN_ERROR_DEVICE. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_swap_blocks(pagedattn_kv_cache* dst,
                                                             const pagedattn_kv_cache* src,
                                                             const int32_t* pairs,
                                                             size_t num_pairs, void* stream);

/* Exports blocks to a host buffer, for tests and persistence. For each id in order, for each
 * layer: the K block then the V block, each block_size*num_kv_heads*head_size elements of the
 * cache's dtype in the cache's layout order (NHD: slot, head, dim; HND: head, slot, dim), packed;
 * a latent cache's record holds each layer's block of rows once (no V block).
 * buffer_bytes must be >= num_ids * bytes_per_block. Synchronous: waits for the copy (queued on
 * `stream` after earlier work). Returns PAGEDATTN_ERROR_NULL_POINTER (cache, or block_ids or
 * buffer with num_ids > 0), PAGEDATTN_ERROR_OUT_OF_RANGE (an id), PAGEDATTN_ERROR_INVALID_ARGUMENT
 * (buffer too small, or num_ids * bytes_per_block overflows), PAGEDATTN_ERROR_INVALID_HANDLE
 * (cache destroyed), PAGEDATTN_ERROR_DEVICE. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_read_blocks(const pagedattn_kv_cache* cache,
                                                             const int32_t* block_ids,
                                                             size_t num_ids, void* buffer,
                                                             size_t buffer_bytes, void* stream);

/* The inverse of read_blocks: loads blocks from a host buffer in read_blocks' format (restoring a
 * persisted prefix). Ids must be unique. Synchronous. Same statuses as read_blocks, plus
 * PAGEDATTN_ERROR_INVALID_ARGUMENT for a repeated id. */
PAGEDATTN_API pagedattn_status pagedattn_kv_cache_load_blocks(pagedattn_kv_cache* cache,
                                                             const int32_t* block_ids,
                                                             size_t num_ids, const void* buffer,
                                                             size_t buffer_bytes, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_KV_CACHE_H */
