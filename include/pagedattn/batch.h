/* pagedattn/batch.h — the batch metadata, validated and planned once per step.
 *
 * A batch lists sequences. Sequence i has query_lens[i] new tokens this step (>= 1, or 0 for an
 * idle padded entry) and context_lens[i] tokens already in the cache before this step; its block
 * table row holds at least ceil((context_lens[i] + query_lens[i]) / block_size) block ids.
 * Decode is query_len == 1; a prefill chunk is query_len > 1 with any context_len (0: plain
 * prefill; > 0: chunked prefill or a prefix-cache hit). Any mix, in any order. The tokens of
 * sequence i are rows query_start[i] .. query_start[i+1]-1 of q/k/v/out.
 *
 * The lengths come in one of two forms (desc->lens_form): PAGEDATTN_BATCH_LENS_CONTEXT, the
 * query_lens and context_lens above; or PAGEDATTN_BATCH_LENS_SEQ, as vLLM v1 and FlashInfer hold
 * them: seq_lens[i] (context + this step's tokens) with query_start_loc[num_seqs + 1] (the row
 * offsets: query_start_loc[0] == 0, query_len[i] = query_start_loc[i+1] - query_start_loc[i]),
 * from which context_len[i] = seq_lens[i] - query_len[i]. Both plan the same batch.
 *
 * Token j of sequence i sits at position p = context_lens[i] + j, in slot
 * table[i][p / block_size] * block_size + p % block_size. The library computes this slot mapping
 * (pagedattn_batch_get_slot_mapping) unless the caller passes its own. Two tokens of a batch may
 * share a slot (sequences whose tables share a block they both reach), but a forward that writes
 * k/v (write_kv) refuses such a batch: a call writes each slot at most once.
 *
 * Cross attention (encoder-decoder): encoder_lens[i] encoder tokens of sequence i live in a cross
 * cache at positions 0..encoder_lens[i]-1 through cross_block_tables. Their K/V are written once,
 * at the sequence's first step (context_lens[i] == 0): the k/v rows of a cross forward are the
 * encoder tokens of those sequences, in sequence order (pagedattn_batch_get_cross_slot_mapping).
 *
 * Planning (create/update) validates every length, id and width and computes the work split
 * (e.g. split-KV partitions). A forward with a planned batch does no validation pass over the
 * tables, no allocation and no host synchronisation, so it can be captured in a CUDA/HIP graph;
 * pagedattn_batch_update then refreshes the same memory in place for replay.
 *
 * Thread safety: a batch may be used by any number of concurrent forwards only if none of them
 * updates it; update and destroy need exclusive access. Forwards that share a batch share its
 * workspace, so on CPU backends concurrent forwards must use distinct batches (a forward on a
 * batch already in use on another thread waits for it).
 */
#ifndef PAGEDATTN_BATCH_H
#define PAGEDATTN_BATCH_H

#include "pagedattn/backend.h"
#include "pagedattn/common.h"
#include "pagedattn/kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pagedattn_batch pagedattn_batch;

/* Which length arrays a pagedattn_batch_desc carries (see the file comment). */
typedef enum pagedattn_batch_lens_form {
  /* query_lens + context_lens (tokens cached before this step); the 0.1 form and the default. */
  PAGEDATTN_BATCH_LENS_CONTEXT = 0,
  /* seq_lens (context + new tokens) + query_start_loc (row offsets, num_seqs + 1 entries), as
   * vLLM v1's attention metadata and FlashInfer's qo_indptr / kv lengths hold them. */
  PAGEDATTN_BATCH_LENS_SEQ = 1
} pagedattn_batch_lens_form;

/* Host arrays describing one step. The library copies what it needs; nothing is kept. */
typedef struct pagedattn_batch_desc {
  uint32_t struct_size;         /* sizeof(pagedattn_batch_desc), or the 0.1 size that
                                   pagedattn_batch_desc_init sets (see the fields since 0.2) */
  int32_t num_seqs;             /* >= 0 */
  /* The CONTEXT form (lens_form 0); both NULL in the SEQ form. */
  const int32_t* query_lens;    /* [num_seqs], each >= 0 */
  const int32_t* context_lens;  /* [num_seqs], each >= 0: tokens cached BEFORE this step (vLLM's
                                   seq_lens minus query_lens, or pass those two in the SEQ form;
                                   see docs/porting.md) */
  const int32_t* block_tables;  /* [num_seqs][block_table_stride], row-major; NULL only for a
                                   batch used solely for encoder-only attention */
  int32_t block_table_stride;   /* entries per row */
  /* Optional caller slot mapping: [sum(query_lens)] slots, -1 for a row that writes nothing
   * (e.g. a dummy sequence padding the batch). NULL = computed from the block tables. */
  const int64_t* slot_mapping;
  /* Cross attention only (NULL / 0 otherwise). */
  const int32_t* encoder_lens;        /* [num_seqs], each >= 0 */
  const int32_t* cross_block_tables;  /* [num_seqs][cross_block_table_stride] */
  int32_t cross_block_table_stride;
  /* Capacity for later pagedattn_batch_update calls. 0 = this batch's size for the counts, and
   * what the tables passed can address for the table width and sequence length, so a batch
   * planned at a prefill step takes the decode steps that follow without hand-set capacities. */
  int32_t max_num_seqs;
  int64_t max_num_tokens;       /* upper bound on sum(query_lens) */
  int32_t max_blocks_per_seq;   /* upper bound on the table width used; 0 = block_table_stride */
  int64_t max_num_encoder_tokens; /* upper bound on sum(encoder_lens) */
  int64_t max_seq_len;          /* upper bound on context_len + query_len (and encoder_len);
                                   sizes split-KV workspace on GPUs; 0 = max_blocks_per_seq *
                                   block_size, or cross_block_table_stride * the cross cache's
                                   block size if larger (at most INT32_MAX; without block tables
                                   this batch's maximum) */
  /* Since 0.2, read only when struct_size covers them (pagedattn_batch_desc_init_sized); a
   * shorter struct_size (0.1 callers, pagedattn_batch_desc_init) is the CONTEXT form. */
  pagedattn_batch_lens_form lens_form; /* PAGEDATTN_BATCH_LENS_CONTEXT (0) or _SEQ */
  /* The SEQ form (NULL in the CONTEXT form): */
  const int32_t* seq_lens;        /* [num_seqs], each >= its query length: context + new tokens */
  const int32_t* query_start_loc; /* [num_seqs + 1]: 0, then non-decreasing row offsets; the
                                     last is the batch's token count */
  /* Speculative-decoding verification (docs/semantics.md section 4.7): tree masks over each
   * sequence's new tokens, or both NULL (causal among them, the default). Sequence i's mask is
   * bytes tree_mask[tree_mask_indptr[i] .. tree_mask_indptr[i+1]): empty, the causal rule; else
   * at least ceil(q*q / 8) bytes (q its query length) holding a q x q bit matrix, row-major,
   * least significant bit first: bit r*q + j set = new token r sees new token j. Every diagonal
   * bit is set and none above it (drafts come in topological order); the context is always
   * visible. Decoder attention only, without ALiBi, a window or an attention chunk. */
  const uint8_t* tree_mask;
  const int64_t* tree_mask_indptr; /* [num_seqs + 1]: 0, then non-decreasing byte offsets */
  int64_t max_tree_mask_bytes;     /* capacity for updates: 0 = tree_mask_indptr[num_seqs]
                                      (0 without masks, so a batch that updates to masked steps
                                      is created with this set) */
} pagedattn_batch_desc;

/* Fills the 0.1 fields of *desc with zeros and sets struct_size to the 0.1 size, so a binary or
 * an FFI mirror of the 0.1 struct is never written past its end; the fields added since then
 * are neither written nor read (the CONTEXT form). To use them, initialise with
 * pagedattn_batch_desc_init_sized(desc, sizeof *desc) instead (or set struct_size yourself).
 * Returns PAGEDATTN_ERROR_NULL_POINTER if NULL. */
PAGEDATTN_API pagedattn_status pagedattn_batch_desc_init(pagedattn_batch_desc* desc);

/* Since 0.2: fills the first `size` bytes of *desc with zeros and sets struct_size = size (pass
 * sizeof(pagedattn_batch_desc) as compiled). Returns PAGEDATTN_ERROR_NULL_POINTER,
 * PAGEDATTN_ERROR_STRUCT_SIZE (a size this library does not know). */
PAGEDATTN_API pagedattn_status pagedattn_batch_desc_init_sized(pagedattn_batch_desc* desc,
                                                              uint32_t size);

/* Validates and plans a batch for `backend` against `cache` (block ids must be < its num_blocks;
 * block_size is taken from it) and, for cross attention, `cross_cache` (may be NULL otherwise;
 * may be the same cache as `cache`). `cache` may be NULL only if block_tables is NULL
 * (encoder-only use). Forwards must then pass caches of the same block size and block count.
 * On success *out owns the batch (host metadata plus, on GPU, device copies and workspace sized
 * for the capacities). Free with pagedattn_batch_destroy.
 * Returns: PAGEDATTN_ERROR_NULL_POINTER (out, backend, desc, a length array, or a table the batch
 * needs), PAGEDATTN_ERROR_STRUCT_SIZE, PAGEDATTN_ERROR_INVALID_ARGUMENT (negative length or count,
 * capacity below this batch, slot_mapping entry < -1, an unknown lens_form, the arrays of the
 * other form set, query_start_loc[0] != 0 or decreasing, seq_lens[i] below sequence i's query
 * length; a tree mask without its indptr or the reverse, tree_mask_indptr[0] != 0 or
 * decreasing, a sequence's mask shorter than its q x q bits, a diagonal bit clear or a bit
 * above the diagonal set, naming the sequence, row and column), PAGEDATTN_ERROR_OUT_OF_RANGE (a block id
 * outside its cache, a table row shorter than needed, a caller slot outside the cache),
 * PAGEDATTN_ERROR_OVERFLOW (sums that overflow), PAGEDATTN_ERROR_INVALID_HANDLE (a destroyed
 * backend or cache, or a cache of another backend), PAGEDATTN_ERROR_OUT_OF_MEMORY (host metadata
 * or, on GPU, device metadata and workspace; also when they would exceed the backend's
 * memory_limit), PAGEDATTN_ERROR_DEVICE (GPU: copying the metadata to the device failed).
 * Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_batch_create(pagedattn_batch** out,
                                                     pagedattn_backend* backend,
                                                     const pagedattn_kv_cache* cache,
                                                     const pagedattn_kv_cache* cross_cache,
                                                     const pagedattn_batch_desc* desc);

/* Replaces the batch's contents in place with a new step of no larger capacity (for CUDA/HIP
 * graph replay: device buffers keep their addresses). The capacity fields of desc are ignored.
 * Validated exactly as create, against the caches the batch was planned with; on failure the
 * batch keeps its previous contents.
 * On GPU backends (cuda, hip) update rewrites the batch's device metadata in place: it rebuilds
 * the host copy (lengths, query starts, block tables, slot mappings, work lists), then copies it
 * into the same device buffer with a synchronous host-to-device cudaMemcpy / hipMemcpy issued on
 * the device's legacy default (NULL) stream, not on any caller stream, and waits for that stream
 * before returning. Forwards (and graph replays) queued earlier read that buffer when they run.
 * The runtime orders the copy after work already queued on blocking streams of the device, but
 * not after work on streams created with cudaStreamNonBlocking / hipStreamNonBlocking (what
 * engines usually use), and the library waits for none of the caller's streams. So before
 * calling update the caller must make sure that no earlier forward or graph replay using this
 * batch is still pending or running on another stream (for example
 * pagedattn_backend_synchronize on that stream, or an event the update waits for). Work queued
 * after update returns sees the new contents. The split-KV workspace is not touched. On CPU
 * backends update only rewrites host memory, under the batch's lock.
 * Returns the statuses of create (PAGEDATTN_ERROR_INVALID_HANDLE: batch destroyed) plus
 * PAGEDATTN_ERROR_CAPACITY (more sequences, tokens, table width, encoder tokens, sequence length
 * or tree mask bytes than planned) and PAGEDATTN_ERROR_INVALID_ARGUMENT (block tables or encoder_lens for a batch
 * planned without a cache or cross cache). Needs exclusive access to the batch. */
PAGEDATTN_API pagedattn_status pagedattn_batch_update(pagedattn_batch* batch,
                                                     const pagedattn_batch_desc* desc);

/* Destroys a batch. NULL is a no-op. Queued GPU work using it must have finished. */
PAGEDATTN_API void pagedattn_batch_destroy(pagedattn_batch* batch);

/* Summary of a planned batch. */
typedef struct pagedattn_batch_info {
  uint32_t struct_size;       /* in: sizeof(pagedattn_batch_info) */
  int32_t num_seqs;
  int64_t num_tokens;         /* sum(query_lens): rows of q/k/v/out */
  int64_t num_encoder_tokens; /* rows of k/v in a cross forward that writes the cross cache */
  int32_t num_decode_seqs;    /* sequences with query_len == 1 */
  int32_t num_prefill_seqs;   /* sequences with query_len > 1 */
  int32_t max_query_len;
  int64_t max_seq_len;        /* max(context_len + query_len) */
  int32_t max_num_seqs;       /* capacities planned for */
  int64_t max_num_tokens;
  int32_t max_blocks_per_seq;
  int32_t block_size;
  /* Since 0.2 (a caller built against 0.1 passes the shorter struct_size). Sized for the
   * capacities, so update does not change them; both count against the backend's memory_limit. */
  uint64_t host_bytes;        /* the planned host metadata: lengths, tables, slot mappings */
  uint64_t workspace_bytes;   /* the backend's own: on CPU backends the workers' scratch and
                                 split-KV partials (host memory); on GPUs the device copy of the
                                 metadata, work lists and split-KV partials (device memory) */
  int64_t max_num_encoder_tokens; /* the remaining capacities planned for */
  int64_t max_seq_len_capacity;   /* what max_seq_len may reach through update */
  int64_t max_tree_mask_bytes;    /* tree mask bytes a step may use (0: none) */
} pagedattn_batch_info;

/* Fills *out (up to out->struct_size bytes). Returns PAGEDATTN_ERROR_NULL_POINTER (out, batch),
 * PAGEDATTN_ERROR_STRUCT_SIZE, PAGEDATTN_ERROR_INVALID_HANDLE (batch destroyed). Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_batch_get_info(pagedattn_batch_info* out,
                                                       const pagedattn_batch* batch);

/* Exposes the planned slot mapping (num_tokens int64 entries, host memory owned by the batch,
 * valid until the next update or destroy). Returns PAGEDATTN_ERROR_NULL_POINTER (out, count,
 * batch), PAGEDATTN_ERROR_INVALID_HANDLE (batch destroyed). */
PAGEDATTN_API pagedattn_status pagedattn_batch_get_slot_mapping(const int64_t** out,
                                                               int64_t* count,
                                                               const pagedattn_batch* batch);

/* Exposes query_start (num_seqs + 1 int32 entries: the first row of each sequence, then
 * num_tokens). Host memory owned by the batch, as above. Same statuses. */
PAGEDATTN_API pagedattn_status pagedattn_batch_get_query_start(const int32_t** out,
                                                              int32_t* count,
                                                              const pagedattn_batch* batch);

/* Exposes the cross slot mapping: num_encoder_tokens int64 slots of the cross cache, for the
 * encoder tokens written by a cross forward (see the file comment). Count 0 without cross
 * attention. Host memory owned by the batch, as above. Same statuses. */
PAGEDATTN_API pagedattn_status pagedattn_batch_get_cross_slot_mapping(
    const int64_t** out, int64_t* count, const pagedattn_batch* batch);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_BATCH_H */
