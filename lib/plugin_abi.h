/* lib/plugin_abi.h — the internal contract between the core and every backend (built-in CPU and
 * the plugins libpagedattn-{onednn,cuda,hip}.so). Not installed, not public API.
 *
 * Data flows one way: C shim -> validation/planning (core) -> backend ops -> kernels. The core has
 * already validated everything below (shapes, dtypes, devices, ranges, capability support) when
 * an op is called; a backend only computes. Backends never see public handles and never call the
 * public API. Everything here is plain C so a plugin built by another compiler (nvcc, hipcc) works.
 *
 * A plugin exports exactly two C symbols:
 *   uint32_t pagedattn_plugin_abi_version(void);            returns PA_PLUGIN_ABI_VERSION
 *   const pa_backend_ops* pagedattn_plugin_ops(void);       the backend's op table
 * The core calls the first, refuses a mismatch (naming the file), then the second.
 *
 * Errors: every fallible op returns a pagedattn_status and, on failure, writes a NUL-terminated
 * message of at most PA_MSG_LEN bytes (including the NUL) into `msg`.
 */
#ifndef PAGEDATTN_LIB_PLUGIN_ABI_H
#define PAGEDATTN_LIB_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn/pagedattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump on any change to the structs or ops below. */
#define PA_PLUGIN_ABI_VERSION 5u
#define PA_MSG_LEN 512

/* A resolved [rows, heads, dim] tensor (dim stride 1). data already includes byte_offset. */
typedef struct pa_tensor3 {
  void* data;            /* NULL when absent */
  pagedattn_dtype dtype; /* float32/float16/bfloat16 */
  int64_t rows;
  int32_t heads;
  int32_t dim;
  int64_t row_stride;    /* elements */
  int64_t head_stride;   /* elements */
} pa_tensor3;

/* A resolved float32 [rows, heads] tensor (log-sum-exp). */
typedef struct pa_lse {
  float* data;           /* NULL when absent */
  int64_t row_stride;    /* elements */
  int64_t head_stride;   /* elements */
} pa_lse;

/* A cache, resolved. Element (layer, block, slot, head, d) of K is at
 * k_layers[layer] + block*block_stride + slot*slot_stride + head*head_stride + d (elements of
 * dtype). All pointers are on `device`. */
typedef struct pa_cache {
  int32_t num_layers;
  int32_t num_blocks;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_size;
  pagedattn_dtype dtype;
  pagedattn_layout layout;
  int64_t block_stride;
  int64_t slot_stride;
  int64_t head_stride;
  void* const* k_layers;   /* host array [num_layers] */
  void* const* v_layers;   /* host array [num_layers] */
  pagedattn_device device; /* where the blocks live */
  int32_t host;            /* 1 if the blocks are in host memory (a GPU backend's host cache) */
  int32_t owned;           /* 1 if allocated through the backend's alloc op */
  void* backend_data;      /* the backend's own per-cache state (cache_attach), or NULL */
  /* 1 for a latent (MLA) cache: num_kv_heads 1, one row of head_size values per slot and no V
   * (v_layers aliases k_layers); copies, swaps, reads and loads move the rows once. */
  int32_t latent;
} pa_cache;

/* A planned batch: host arrays computed and validated by the core. A GPU backend's plan_batch
 * copies what its kernels need to device memory it keeps in backend_data. */
typedef struct pa_batch {
  int32_t num_seqs;
  int64_t num_tokens;             /* sum(query_lens) */
  const int32_t* query_lens;      /* [num_seqs] */
  const int32_t* context_lens;    /* [num_seqs] */
  const int32_t* query_start;     /* [num_seqs + 1] */
  const int32_t* block_tables;    /* [num_seqs][table_stride], NULL for encoder-only batches */
  int32_t table_stride;
  const int64_t* slot_mapping;    /* [num_tokens], -1 = padding (skip) */
  int32_t block_size;             /* of the self cache (0 without one) */
  int32_t num_blocks;
  /* Cross attention (encoder_lens == NULL without it). */
  const int32_t* encoder_lens;    /* [num_seqs] keys per sequence in the cross cache */
  const int32_t* cross_tables;    /* [num_seqs][cross_table_stride] */
  int32_t cross_table_stride;
  int32_t cross_block_size;
  int32_t cross_num_blocks;
  int64_t num_encoder_tokens;     /* rows of k/v in a writing cross forward */
  const int64_t* cross_slot_mapping; /* [num_encoder_tokens] */
  /* Speculative-decoding tree masks (both NULL when no sequence of this step has one; a GPU
   * backend plans device room for cap_tree_mask_bytes): sequence i's bits are bytes
   * [tree_indptr[i], tree_indptr[i+1]) of tree_mask, a q x q row-major matrix (LSB first; bit
   * r*q + j: new token r sees new token j), or empty for the causal rule. Validated. */
  const uint8_t* tree_mask;
  const int64_t* tree_indptr;     /* [num_seqs + 1] */
  /* Summary. */
  int32_t max_query_len;
  int64_t max_seq_len;            /* max(context+query, encoder_len) */
  int32_t all_context_zero;       /* 1 if every context_len == 0 (encoder types allowed) */
  /* Capacities planned for (update may not exceed them). */
  int32_t cap_num_seqs;
  int64_t cap_num_tokens;
  int32_t cap_blocks_per_seq;
  int64_t cap_num_encoder_tokens;
  int64_t cap_seq_len;
  int64_t cap_tree_mask_bytes;    /* 0: no masks in any step */
  void* backend_data;             /* the backend's plan/workspace (plan_batch), or NULL */
  uint64_t backend_bytes;         /* set by the first plan_batch: the bytes backend_data holds
                                     (device or host), for pagedattn_batch_info */
} pa_batch;

/* One forward call, resolved. */
typedef struct pa_forward_args {
  const pa_batch* batch;
  const pa_cache* cache;          /* NULL only for ENCODER_ONLY */
  int32_t layer;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_size;
  float scale;                    /* already defaulted to 1/sqrt(D) */
  float soft_cap;                 /* 0 = off */
  int32_t sliding_window;         /* 0 = off */
  pagedattn_attention_type attention_type;
  int32_t write_kv;
  float k_scale;
  float v_scale;
  const float* alibi_slopes;      /* [num_heads] on the device, contiguous, or NULL */
  const float* sinks;             /* [num_heads] on the device, contiguous, or NULL */
  int32_t attention_chunk;        /* 0 = off (decoder only) */
  /* [num_kv_heads] on the device, contiguous, or NULL (then k_scale / v_scale); set only for fp8
   * caches. Host-memory values are already checked finite and > 0; a backend maps a bad value in
   * device memory to NaN. */
  const float* k_head_scales;
  const float* v_head_scales;
  pa_tensor3 q;                   /* [num_tokens, H, D] */
  pa_tensor3 k;                   /* [rows, Hkv, D] or data NULL */
  pa_tensor3 v;
  pa_tensor3 out;                 /* [num_tokens, H, D] */
  pa_lse lse;                     /* data NULL when not requested */
  void* stream;
  /* forward_mla only (latent cache, num_kv_heads 1, decoder): q holds the query's leading
   * q.dim values of the row (value_size with q_pe, else head_size), q_pe the rest
   * ([num_tokens, H, head_size - value_size], data NULL when q holds whole rows); out is
   * [num_tokens, H, value_size]. k and v are absent. */
  pa_tensor3 q_pe;
  int32_t value_size;
} pa_forward_args;

/* One merge call, resolved: out = merge((o1, lse1), (o2, lse2)). */
typedef struct pa_merge_args {
  pa_tensor3 o1;
  pa_tensor3 o2;
  pa_tensor3 out;
  pa_lse lse1;
  pa_lse lse2;
  pa_lse lse_out;                 /* data NULL when not requested */
  void* stream;
} pa_merge_args;

/* A cache write, resolved. */
typedef struct pa_write_args {
  const pa_cache* cache;
  int32_t layer;
  /* [n, Hkv, D] each; for a latent cache, k holds each row's leading k.dim values ([n, 1, R])
   * and v the remaining head_size - k.dim ([n, 1, D - R]), or v.data is NULL and k holds whole
   * rows; both use k_scale (and no per-head scales). */
  pa_tensor3 k;
  pa_tensor3 v;
  const void* slots;              /* n slots, int32 or int64 */
  int32_t slots_int64;
  int32_t slots_on_device;        /* 0: host memory, already range-checked by the core */
  int64_t n;
  float k_scale;                  /* > 0 */
  float v_scale;
  const float* k_head_scales;     /* [num_kv_heads] on the device, or NULL (as pa_forward_args) */
  const float* v_head_scales;
  void* stream;
} pa_write_args;

typedef struct pa_backend_ops {
  uint32_t abi_version;           /* PA_PLUGIN_ABI_VERSION */
  uint32_t struct_size;           /* sizeof(pa_backend_ops) */
  const char* name;               /* "cpu", "onednn", "cuda", "hip" */

  /* Can device `device_index` be used here? PAGEDATTN_OK, or BACKEND_UNAVAILABLE with why. */
  pagedattn_status (*probe)(int32_t device_index, char* msg);
  /* Creates backend state. opts is complete (all fields valid, defaults applied). */
  pagedattn_status (*create)(void** state, const pagedattn_backend_options* opts, char* msg);
  void (*destroy)(void* state);
  /* Fills every field of caps except struct_size; target and settings stay valid until destroy. */
  void (*get_capabilities)(void* state, pagedattn_capabilities* caps);

  /* Zero-filled memory for caches: on the device, or (host = 1) pinned host memory. */
  pagedattn_status (*alloc)(void* state, size_t bytes, int32_t host, void** ptr, char* msg);
  void (*free)(void* state, void* ptr, int32_t host);
  /* Optional (may be NULL): per-cache state such as device arrays of layer pointers. */
  pagedattn_status (*cache_attach)(void* state, pa_cache* cache, char* msg);
  void (*cache_detach)(void* state, pa_cache* cache);

  pagedattn_status (*cache_write)(void* state, const pa_write_args* args, char* msg);
  /* pairs: host [2 * n], validated. */
  pagedattn_status (*copy_blocks)(void* state, const pa_cache* cache, const int32_t* pairs,
                                  size_t n, void* stream, char* msg);
  /* One side may be host memory (cache->host or a CPU cache); geometry already matched. */
  pagedattn_status (*swap_blocks)(void* state, const pa_cache* dst, const pa_cache* src,
                                  const int32_t* pairs, size_t n, void* stream, char* msg);
  /* Synchronous; host buffer in read_blocks' packed format (see kv_cache.h). */
  pagedattn_status (*read_blocks)(void* state, const pa_cache* cache, const int32_t* ids,
                                  size_t n, void* buffer, void* stream, char* msg);
  pagedattn_status (*load_blocks)(void* state, const pa_cache* cache, const int32_t* ids,
                                  size_t n, const void* buffer, void* stream, char* msg);

  /* Called after the core (re)computes a batch's host arrays. is_update = 0: first plan (allocate
   * backend_data sized for the capacities); 1: refresh in place (no reallocation). */
  pagedattn_status (*plan_batch)(void* state, pa_batch* batch, int32_t is_update, char* msg);
  void (*free_batch)(void* state, pa_batch* batch);

  pagedattn_status (*forward)(void* state, const pa_forward_args* args, char* msg);
  pagedattn_status (*merge_states)(void* state, const pa_merge_args* args, char* msg);
  pagedattn_status (*synchronize)(void* state, void* stream, char* msg);
  /* MLA over a latent cache (see pa_forward_args), or NULL without PAGEDATTN_FEATURE_MLA. May
   * refuse a value size it lacks (UNSUPPORTED) before it writes anything. */
  pagedattn_status (*forward_mla)(void* state, const pa_forward_args* args, char* msg);
} pa_backend_ops;

/* Exported by each plugin (see the file comment). */
typedef uint32_t (*pa_plugin_abi_version_fn)(void);
typedef const pa_backend_ops* (*pa_plugin_ops_fn)(void);

/* The op table of the built-in CPU backend (kernels/cpu/backend.cpp), which the registry links
 * in; an embedding backend (the onednn plugin) calls it too. */
const pa_backend_ops* pa_cpu_backend_ops(void);

/* Write-then-attend: the cache write a forward makes before it attends, built from the forward
 * for every backend alike. The step's k/v rows go to the batch's slots, or for cross attention
 * the encoder rows to its cross slots (host int64 arrays, -1 = skip a row). Fills every field of
 * *w (slots_on_device 0) and returns 1 when the write is due: write_kv is set, there is a cache
 * (every type but ENCODER_ONLY has one), the step has k rows (the core leaves k.data NULL when it
 * has none) and at least one slot. Returns 0 when there is nothing to write. A backend whose
 * launches read the row counts on the device (the GPU plugin, so a captured graph replays after
 * pagedattn_batch_update) guards on write_kv and the cache alone: a step captured with no rows
 * must still replay the write of a later step that has some. */
static inline int pa_forward_write_args(const pa_forward_args* a, pa_write_args* w) {
  const pa_batch* bt = a->batch;
  const int cross = a->attention_type == PAGEDATTN_ATTENTION_CROSS;
  w->cache = a->cache;
  w->layer = a->layer;
  w->k = a->k;
  w->v = a->v;
  w->slots = cross ? bt->cross_slot_mapping : bt->slot_mapping;
  w->slots_int64 = 1;
  w->slots_on_device = 0;
  w->n = cross ? bt->num_encoder_tokens : bt->num_tokens;
  w->k_scale = a->k_scale;
  w->v_scale = a->v_scale;
  w->k_head_scales = a->k_head_scales;
  w->v_head_scales = a->v_head_scales;
  w->stream = a->stream;
  return a->write_kv && a->cache != NULL && a->k.data != NULL && w->n > 0 && w->slots != NULL;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_LIB_PLUGIN_ABI_H */
