/* pagedattn/attention.h — one layer of attention over a planned batch, and merging states.
 *
 * Scores s = scale * (q . k); soft cap (if > 0): s = cap * tanh(s / cap); ALiBi (if given):
 * s += slope[h] * (key_pos - query_pos); masks; softmax in float32 with max subtraction; output
 * in the query dtype. Query head h uses KV head h / (num_heads / num_kv_heads).
 *
 * Thread safety: forwards may run concurrently on one backend with distinct batches and outputs;
 * see batch.h and kv_cache.h for what they share.
 */
#ifndef PAGEDATTN_ATTENTION_H
#define PAGEDATTN_ATTENTION_H

#include "pagedattn/backend.h"
#include "pagedattn/batch.h"
#include "pagedattn/common.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pagedattn_attention_type {
  /* Causal self-attention over the paged cache: token at position p sees keys at positions <= p
   * (and, with a sliding window W, only p - key_pos < W). */
  PAGEDATTN_ATTENTION_DECODER = 0,
  /* Bidirectional self-attention among each sequence's own tokens (context_len must be 0);
   * K/V come from the k/v tensors; with write_kv they are also stored in the cache. */
  PAGEDATTN_ATTENTION_ENCODER = 1,
  /* As ENCODER, without a cache (cache may be NULL; write_kv must be 0). */
  PAGEDATTN_ATTENTION_ENCODER_ONLY = 2,
  /* Decoder queries over the encoder's K/V in the cross cache (batch's encoder_lens and
   * cross_block_tables); no causal mask. With write_kv, k/v hold the encoder tokens of the
   * sequences at their first step and are stored first (see batch.h). */
  PAGEDATTN_ATTENTION_CROSS = 3
} pagedattn_attention_type;

/* Per-call options. Initialise with pagedattn_attention_options_init, then set the shape. */
typedef struct pagedattn_attention_options {
  uint32_t struct_size;   /* sizeof(pagedattn_attention_options) */
  int32_t num_heads;      /* H: query heads */
  int32_t num_kv_heads;   /* Hkv: H % Hkv == 0 */
  int32_t head_size;      /* D: must equal the cache's head size */
  float scale;            /* score scale; 0 = 1/sqrt(head_size) */
  float soft_cap;         /* > 0 enables s = cap * tanh(s / cap); 0 = off */
  int32_t sliding_window; /* W > 0: only keys with p - key_pos < W; 0 = off (decoder only) */
  pagedattn_attention_type attention_type;
  int32_t write_kv;       /* 1: write the step's k/v into the cache first; 0: the caller did */
  float k_scale;          /* fp8 caches: dequantisation scales (> 0, finite); default 1 */
  float v_scale;
  /* Optional ALiBi slopes: float32 [num_heads] tensor on the backend's device, or NULL
   * (decoder only). Read during the call (GPU: when the work runs on the stream). */
  const pagedattn_tensor* alibi_slopes;
  uint32_t flags;         /* reserved, must be 0 */
  /* Since 0.2, read only when struct_size covers them (pagedattn_attention_options_init_sized);
   * a 0.1-sized struct (pagedattn_attention_options_init) reads as all of them off. */
  /* Attention sinks (gpt-oss): float32 [num_heads] on the backend's device, or NULL. sinks[h] is
   * a logit that joins the softmax of every row of head h and carries no value; the row's lse
   * includes it (docs/semantics.md section 5.14). Any attention type. */
  const pagedattn_tensor* sinks;
  /* Chunked local attention (Llama 4), decoder only: C > 0 lets the token at position p see only
   * keys at positions k <= p with k / C == p / C; 0 = off. With a sliding window both apply. */
  int32_t attention_chunk;
  /* Per-KV-head fp8 scales: float32 [num_kv_heads] on the backend's device, or NULL (then
   * k_scale / v_scale). On an fp8 cache, head h loads float(fp8) * scales[h] and a write with
   * write_kv stores fp8(x / scales[h]); other caches ignore them. */
  const pagedattn_tensor* k_head_scales;
  const pagedattn_tensor* v_head_scales;
} pagedattn_attention_options;

/* Fills the 0.1 fields of *opts with defaults: zero shape, scale 0 (= 1/sqrt(D)), no soft cap, no
 * window, decoder, write_kv 1, k/v scales 1, no ALiBi; sets struct_size to the 0.1 size, so a
 * binary or an FFI mirror of the 0.1 struct is never written past its end. The fields added since
 * then are neither written nor read: to use them, initialise with
 * pagedattn_attention_options_init_sized(opts, sizeof *opts). Returns
 * PAGEDATTN_ERROR_NULL_POINTER. */
PAGEDATTN_API pagedattn_status pagedattn_attention_options_init(pagedattn_attention_options* opts);

/* Since 0.2: fills the first `size` bytes of *opts with the defaults above (the later fields: no
 * sinks, no attention chunk, no per-head scales) and sets struct_size = size (pass
 * sizeof(pagedattn_attention_options) as compiled). Returns PAGEDATTN_ERROR_NULL_POINTER,
 * PAGEDATTN_ERROR_STRUCT_SIZE (a size this library does not know). */
PAGEDATTN_API pagedattn_status pagedattn_attention_options_init_sized(
    pagedattn_attention_options* opts, uint32_t size);

/* Runs one layer of attention for a planned batch.
 *
 * q: [num_tokens, H, D]; k, v: [rows, Hkv, D] (rows = num_tokens, or num_encoder_tokens for a
 * cross forward), needed when write_kv = 1 and for encoder types, else may be NULL; out:
 * [num_tokens, H, D] with q's dtype; lse: optional float32 [num_tokens, H] (natural log of each
 * softmax denominator, including scale and max; -inf for a row that sees no key). A NaN or +inf
 * score a row reads makes its output and lse NaN (docs/semantics.md section 5). Any strides
 * with a unit innermost stride. All on the backend's device; q/k/v/out of one dtype
 * (float32/float16/bfloat16); the cache's dtype must be that dtype or fp8.
 * `cache` is the self-attention cache (decoder, encoder) or the cross cache (cross); NULL only for
 * ENCODER_ONLY. `layer` indexes the cache's layers. Rows of out (and lse) belonging to sequences
 * with query_len 0 do not exist; every row of out is written.
 * Padded rows: q, k, v, out and lse may have more rows than the batch needs (a token count
 * padded for a captured CUDA/HIP graph, as vLLM pads it); the extra trailing rows of q/k/v are
 * not read, and those of out and lse are left untouched (not zeroed). Fewer rows are refused.
 * Order: the step's k/v are written to the cache first (if write_kv), then attention reads the
 * keys from the cache (decoder, cross), so new tokens see each other through the cache.
 * No allocation, no validation pass over the tables and no host sync: capturable in a CUDA/HIP
 * graph on GPU backends. Runs on `stream` (NULL = default; ignored on CPU).
 * Returns: PAGEDATTN_ERROR_NULL_POINTER (backend, batch, opts, q, out, the cache unless
 * ENCODER_ONLY, k/v when needed, a tensor's data with elements), PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (unknown attention_type, H % Hkv != 0, non-positive shape,
 * head_size != the cache's, num_kv_heads != the cache's, negative window or cap, a scale that is
 * negative or not finite, k/v scales not finite and > 0, write_kv not 0 or 1, flags != 0, ALiBi,
 * a window or an attention chunk with a non-decoder type, a negative attention_chunk, a per-head
 * scale in host memory that is not finite and > 0, a latent cache (pagedattn_forward_mla), ENCODER
 * types with context_len > 0, write_kv with ENCODER_ONLY, CROSS with a batch planned without
 * encoder_lens, a batch planned without the cache, a cache whose block size or count differs from
 * the one planned, write_kv with a batch in which two tokens, or two encoder rows, write one
 * slot: block tables that share a block both write into, or a repeated slot_mapping entry),
 * PAGEDATTN_ERROR_BAD_TENSOR (rank, shape, dtype, stride, fewer rows than the batch needs;
 * ALiBi slopes or sinks not float32 [H], per-head scales not float32 [Hkv]),
 * PAGEDATTN_ERROR_WRONG_DEVICE (a tensor off the backend's device, a host cache),
 * PAGEDATTN_ERROR_OUT_OF_RANGE (layer), PAGEDATTN_ERROR_OVERFLOW (a tensor whose strides or
 * byte_offset make element or byte offsets overflow int64), PAGEDATTN_ERROR_UNSUPPORTED (a
 * feature, head size, layout or dtype combination the backend lacks),
 * PAGEDATTN_ERROR_INVALID_HANDLE (handles from different backends or destroyed),
 * PAGEDATTN_ERROR_DEVICE. On error nothing is written (neither out, lse nor the cache).
 * Per-head scales in GPU memory are not read by the host: a value there that is not finite and
 * > 0 makes the rows reading that KV head NaN, and a write stores NaN for that head. */
PAGEDATTN_API pagedattn_status pagedattn_forward(pagedattn_backend* backend,
                                                const pagedattn_batch* batch,
                                                pagedattn_kv_cache* cache, int32_t layer,
                                                const pagedattn_attention_options* opts,
                                                const pagedattn_tensor* q,
                                                const pagedattn_tensor* k,
                                                const pagedattn_tensor* v,
                                                pagedattn_tensor* out, pagedattn_tensor* lse,
                                                void* stream);

/* Since 0.2: multi-head latent attention (MLA, DeepSeek V2/V3/R1, Kimi K2) in the absorbed form,
 * over a latent cache (PAGEDATTN_KV_CACHE_LATENT) planned with `batch`, on backends with
 * PAGEDATTN_FEATURE_MLA. Every query head reads each key's one latent row of D = head_size values
 * (R leading values, then D - R of rotary key): score = scale * (q . row) over all D values, then
 * soft cap, masks and softmax as pagedattn_forward's decoder attention, and out = the weights
 * times the rows' leading R values (docs/semantics.md section 8).
 * q_nope: [num_tokens, H, R] (the query's no-rope part, already multiplied by W_UK) with q_pe
 * [num_tokens, H, D - R]; or q_pe NULL and q_nope holding whole rows, [num_tokens, H, D]. out:
 * [num_tokens, H, R] of q's dtype: its last extent R is the value size (kv_lora_rank), one the
 * backend supports for D. lse: optional float32 [num_tokens, H]. Padded rows, strides, devices,
 * dtypes and the fp8 rule as pagedattn_forward.
 * opts: num_heads = H (any >= 1), num_kv_heads 1, head_size D (the cache's), scale (0 =
 * 1/sqrt(D); DeepSeek's models pass their own softmax scale), soft_cap, sliding_window,
 * attention_chunk, alibi_slopes and sinks as pagedattn_forward; attention_type must be DECODER;
 * k_scale dequantises an fp8 latent cache (v_scale is not used: values and keys are one row);
 * write_kv is not used (write the step's rows with pagedattn_kv_cache_write_latent first);
 * per-KV-head scales are refused. The batch's tree masks, chunked prefill and mixed steps apply.
 * No allocation, no host sync, capturable on GPU backends; on CPU backends the first MLA forward
 * of a batch sizes its MLA workspace (accounted against memory_limit). Runs on `stream`.
 * Returns the statuses of pagedattn_forward, and PAGEDATTN_ERROR_INVALID_ARGUMENT (a cache that
 * is not latent, num_kv_heads != 1, a type other than DECODER, per-KV-head scales, q_nope/q_pe
 * extents that do not add up to D or a value size R >= D), PAGEDATTN_ERROR_UNSUPPORTED (no
 * PAGEDATTN_FEATURE_MLA, or a value size the backend lacks for D). pagedattn_forward refuses a
 * latent cache with PAGEDATTN_ERROR_INVALID_ARGUMENT. On error nothing is written. */
PAGEDATTN_API pagedattn_status pagedattn_forward_mla(pagedattn_backend* backend,
                                                    const pagedattn_batch* batch,
                                                    pagedattn_kv_cache* cache, int32_t layer,
                                                    const pagedattn_attention_options* opts,
                                                    const pagedattn_tensor* q_nope,
                                                    const pagedattn_tensor* q_pe,
                                                    pagedattn_tensor* out, pagedattn_tensor* lse,
                                                    void* stream);

/* Merges two partial attention results over disjoint key sets into the exact result:
 * lse = log(exp(lse1) + exp(lse2)), out = (exp(lse1 - lse) * o1 + exp(lse2 - lse) * o2).
 * o1, o2, out: [T, H, D] of one dtype (float32/float16/bfloat16); lse1, lse2: float32 [T, H];
 * lse_out: optional float32 [T, H]. A state with lse = -inf is empty (contributes nothing); if
 * both are empty, out is 0 and lse_out -inf; a NaN or +inf lse gives NaN out and lse_out. out may be o1 or o2 (in place), lse_out may be lse1
 * or lse2. All on the backend's device; runs on `stream`. Returns PAGEDATTN_ERROR_NULL_POINTER
 * (backend, a tensor other than lse_out, or a tensor's data with elements),
 * PAGEDATTN_ERROR_BAD_TENSOR (rank, shape, dtype, stride), PAGEDATTN_ERROR_WRONG_DEVICE,
 * PAGEDATTN_ERROR_OVERFLOW (a tensor whose strides or byte_offset make element or byte offsets
 * overflow int64), PAGEDATTN_ERROR_INVALID_HANDLE (backend destroyed),
 * PAGEDATTN_ERROR_UNSUPPORTED (dtype or merge_states not supported by the backend),
 * PAGEDATTN_ERROR_DEVICE. */
PAGEDATTN_API pagedattn_status pagedattn_merge_states(pagedattn_backend* backend,
                                                     pagedattn_tensor* out,
                                                     pagedattn_tensor* lse_out,
                                                     const pagedattn_tensor* o1,
                                                     const pagedattn_tensor* lse1,
                                                     const pagedattn_tensor* o2,
                                                     const pagedattn_tensor* lse2,
                                                     void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_ATTENTION_H */
