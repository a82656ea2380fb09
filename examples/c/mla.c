/* examples/c/mla.c — one multi-head latent attention (MLA) decode step, DeepSeek-V3-like.
 *
 * 16 query heads (one tensor-parallel shard of 128), latent rows of 576 = 512 (kv_lora_rank) +
 * 64 (rotary key), blocks of 64 tokens, bfloat16. Four sequences already have 300, 17, 1000 and
 * 64 tokens in a latent cache (shuffled block tables); this step writes each one's new row with
 * pagedattn_kv_cache_write_latent (vLLM's concat_and_cache_mla), runs pagedattn_forward_mla in
 * the absorbed form (q_nope already multiplied by W_UK, plus q_pe) and compares the output with
 * a float64 reference, so the example doubles as a test.
 *
 * Usage: pagedattn-example-mla [backend]   (default "cpu"; tensors live in host memory)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagedattn/pagedattn.h>

#define NUM_SEQS 4
#define NUM_HEADS 16
#define RANK 512 /* kv_lora_rank: the values */
#define ROPE 64  /* the rotary key */
#define ROW (RANK + ROPE)
#define BLOCK_SIZE 64
#define TOLERANCE 2e-2 /* bfloat16 */

#define CHECK(call)                                                                   \
  do {                                                                                \
    pagedattn_status st_ = (call);                                                    \
    if (st_ != PAGEDATTN_OK) {                                                        \
      fprintf(stderr, "%s:%d: %s\n  -> %s: %s\n", __FILE__, __LINE__, #call,         \
              pagedattn_status_string(st_), pagedattn_last_error());                  \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

static const pagedattn_dlpack_dtype kBF16 = {PAGEDATTN_DLPACK_BFLOAT, 16, 1};
static const pagedattn_dlpack_dtype kI64 = {PAGEDATTN_DLPACK_INT, 64, 1};

static pagedattn_tensor host_tensor(void* data, int32_t ndim, int64_t* shape,
                                    pagedattn_dlpack_dtype dtype) {
  pagedattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = PAGEDATTN_DEVICE_CPU;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

static uint64_t rng_state = 0x202405179E3779B9ull;
static uint64_t rng_next(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* bfloat16 bits of x, rounded to nearest even (finite x), and back. */
static uint16_t to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float x;
  memcpy(&x, &b, 4);
  return x;
}
static uint16_t rand_bf16(void) { return to_bf16((float)(rng_next() >> 40) / 16777216.0f * 2 - 1); }

int main(int argc, char** argv) {
  const char* backend_name = argc > 1 ? argv[1] : "cpu";
  const int32_t context_lens[NUM_SEQS] = {300, 17, 1000, 64};
  const int32_t query_lens[NUM_SEQS] = {1, 1, 1, 1};
  /* DeepSeek V3's softmax scale: mscale^2 / sqrt(128 + 64), mscale = 0.1 * ln(40) + 1. */
  const double mscale = 0.1 * log(40.0) + 1.0;
  const float scale = (float)(mscale * mscale / sqrt(192.0));
  int rc = 1;
  pagedattn_backend* be = NULL;
  pagedattn_kv_cache* cache = NULL;
  pagedattn_batch* batch = NULL;
  uint16_t* rows[NUM_SEQS] = {NULL};
  uint16_t *kv_c = NULL, *k_pe = NULL, *fresh = NULL, *q = NULL, *q_nope = NULL, *q_pe = NULL,
           *out = NULL;
  int64_t* slots = NULL;
  int32_t* tables = NULL;
  int32_t* ids = NULL;

  CHECK(pagedattn_backend_create(&be, backend_name, NULL));
  pagedattn_capabilities caps;
  memset(&caps, 0, sizeof caps);
  caps.struct_size = sizeof caps;
  CHECK(pagedattn_backend_get_capabilities(&caps, be));
  if (caps.device.device_type != PAGEDATTN_DEVICE_CPU) {
    fprintf(stderr, "backend %s does not compute on the host; this example uses host memory\n",
            caps.name);
    goto done;
  }
  if (!(caps.features & PAGEDATTN_FEATURE_MLA) || !(caps.latent_sizes & (1u << (ROW / 32 - 1)))) {
    fprintf(stderr, "backend %s has no MLA with rows of %d\n", caps.name, ROW);
    goto done;
  }
  printf("pagedattn %s, backend %s\n", pagedattn_version_string(), caps.name);

  /* Shuffled block tables, each sized for the sequence with this step's token. */
  int32_t need[NUM_SEQS], stride = 0, num_blocks = 8, total_ctx = 0;
  for (int s = 0; s < NUM_SEQS; ++s) {
    need[s] = (context_lens[s] + BLOCK_SIZE) / BLOCK_SIZE;
    num_blocks += need[s];
    if (need[s] > stride) stride = need[s];
    total_ctx += context_lens[s];
  }
  ids = malloc(sizeof *ids * (size_t)num_blocks);
  tables = calloc((size_t)(NUM_SEQS * stride), sizeof *tables);
  if (!ids || !tables) goto oom;
  for (int i = 0; i < num_blocks; ++i) ids[i] = i;
  for (int i = num_blocks - 1; i > 0; --i) {
    int j = (int)(rng_next() % (uint64_t)(i + 1)), t = ids[i];
    ids[i] = ids[j];
    ids[j] = t;
  }
  for (int s = 0, at = 0; s < NUM_SEQS; at += need[s], ++s)
    memcpy(&tables[s * stride], &ids[at], sizeof *ids * (size_t)need[s]);
#define SLOT(s, p) \
  ((int64_t)tables[(s) * stride + (p) / BLOCK_SIZE] * BLOCK_SIZE + (p) % BLOCK_SIZE)

  /* Every latent row of every sequence: the context plus the new token. */
  for (int s = 0; s < NUM_SEQS; ++s) {
    size_t n = (size_t)(context_lens[s] + 1) * ROW;
    if (!(rows[s] = malloc(n * 2))) goto oom;
    for (size_t i = 0; i < n; ++i) rows[s][i] = rand_bf16();
  }

  pagedattn_kv_cache_desc cd;
  CHECK(pagedattn_kv_cache_desc_init(&cd));
  cd.num_layers = 1;
  cd.num_blocks = num_blocks;
  cd.block_size = BLOCK_SIZE;
  cd.num_kv_heads = 1;
  cd.head_size = ROW;
  cd.dtype = PAGEDATTN_DTYPE_BFLOAT16;
  cd.flags = PAGEDATTN_KV_CACHE_LATENT;
  CHECK(pagedattn_kv_cache_create(&cache, be, &cd));

  /* Earlier steps stored the context: kv_c [T, 512] and k_pe [T, 1, 64], vLLM's shapes. */
  kv_c = malloc((size_t)total_ctx * RANK * 2);
  k_pe = malloc((size_t)total_ctx * ROPE * 2);
  slots = malloc((size_t)total_ctx * sizeof *slots);
  if (!kv_c || !k_pe || !slots) goto oom;
  for (int s = 0, t = 0; s < NUM_SEQS; ++s) {
    for (int p = 0; p < context_lens[s]; ++p, ++t) {
      memcpy(&kv_c[(size_t)t * RANK], &rows[s][(size_t)p * ROW], RANK * 2);
      memcpy(&k_pe[(size_t)t * ROPE], &rows[s][(size_t)p * ROW + RANK], ROPE * 2);
      slots[t] = SLOT(s, p);
    }
  }
  int64_t c_shape[2] = {total_ctx, RANK}, pe_shape[3] = {total_ctx, 1, ROPE};
  int64_t s_shape[1] = {total_ctx};
  pagedattn_tensor tc = host_tensor(kv_c, 2, c_shape, kBF16);
  pagedattn_tensor tpe = host_tensor(k_pe, 3, pe_shape, kBF16);
  pagedattn_tensor ts = host_tensor(slots, 1, s_shape, kI64);
  CHECK(pagedattn_kv_cache_write_latent(cache, 0, &tc, &tpe, &ts, 1.0f, NULL));

  /* This step: each sequence's new row goes in first (whole rows, k_pe NULL), then the
   * attention reads it with the context. */
  fresh = malloc((size_t)NUM_SEQS * ROW * 2);
  if (!fresh) goto oom;
  int64_t fresh_slots[NUM_SEQS];
  for (int s = 0; s < NUM_SEQS; ++s) {
    memcpy(&fresh[(size_t)s * ROW], &rows[s][(size_t)context_lens[s] * ROW], ROW * 2);
    fresh_slots[s] = SLOT(s, context_lens[s]);
  }
  int64_t f_shape[2] = {NUM_SEQS, ROW}, fs_shape[1] = {NUM_SEQS};
  pagedattn_tensor tf = host_tensor(fresh, 2, f_shape, kBF16);
  pagedattn_tensor tfs = host_tensor(fresh_slots, 1, fs_shape, kI64);
  CHECK(pagedattn_kv_cache_write_latent(cache, 0, &tf, NULL, &tfs, 1.0f, NULL));

  pagedattn_batch_desc bd;
  CHECK(pagedattn_batch_desc_init(&bd));
  bd.num_seqs = NUM_SEQS;
  bd.query_lens = query_lens;
  bd.context_lens = context_lens;
  bd.block_tables = tables;
  bd.block_table_stride = stride;
  CHECK(pagedattn_batch_create(&batch, be, cache, NULL, &bd));

  q = malloc((size_t)NUM_SEQS * NUM_HEADS * ROW * 2);
  q_nope = malloc((size_t)NUM_SEQS * NUM_HEADS * RANK * 2);
  q_pe = malloc((size_t)NUM_SEQS * NUM_HEADS * ROPE * 2);
  out = malloc((size_t)NUM_SEQS * NUM_HEADS * RANK * 2);
  if (!q || !q_nope || !q_pe || !out) goto oom;
  for (int i = 0; i < NUM_SEQS * NUM_HEADS; ++i) {
    for (int e = 0; e < ROW; ++e) q[(size_t)i * ROW + e] = rand_bf16();
    memcpy(&q_nope[(size_t)i * RANK], &q[(size_t)i * ROW], RANK * 2);
    memcpy(&q_pe[(size_t)i * ROPE], &q[(size_t)i * ROW + RANK], ROPE * 2);
  }
  int64_t qn_shape[3] = {NUM_SEQS, NUM_HEADS, RANK}, qp_shape[3] = {NUM_SEQS, NUM_HEADS, ROPE};
  pagedattn_tensor tqn = host_tensor(q_nope, 3, qn_shape, kBF16);
  pagedattn_tensor tqp = host_tensor(q_pe, 3, qp_shape, kBF16);
  pagedattn_tensor tout = host_tensor(out, 3, qn_shape, kBF16);
  pagedattn_attention_options opts;
  CHECK(pagedattn_attention_options_init(&opts));
  opts.num_heads = NUM_HEADS;
  opts.num_kv_heads = 1;
  opts.head_size = ROW;
  opts.scale = scale;
  CHECK(pagedattn_forward_mla(be, batch, cache, 0, &opts, &tqn, &tqp, &tout, NULL, NULL));
  printf("out: %d tokens x %d heads x %d values (bfloat16)\n", NUM_SEQS, NUM_HEADS, RANK);

  /* float64 reference: each key's row is the key (all 576 values) and the value (first 512). */
  double max_err = 0, max_ref = 0;
  for (int s = 0; s < NUM_SEQS; ++s) {
    int n = context_lens[s] + 1;
    double* w = malloc(sizeof *w * (size_t)n);
    if (!w) goto oom;
    for (int h = 0; h < NUM_HEADS; ++h) {
      const uint16_t* qh = &q[((size_t)s * NUM_HEADS + h) * ROW];
      double mx = -INFINITY, sum = 0;
      for (int p = 0; p < n; ++p) {
        double dot = 0;
        for (int e = 0; e < ROW; ++e)
          dot += from_bf16(qh[e]) * from_bf16(rows[s][(size_t)p * ROW + e]);
        w[p] = dot * scale;
        if (w[p] > mx) mx = w[p];
      }
      for (int p = 0; p < n; ++p) sum += (w[p] = exp(w[p] - mx));
      for (int e = 0; e < RANK; ++e) {
        double ref = 0;
        for (int p = 0; p < n; ++p) ref += w[p] * from_bf16(rows[s][(size_t)p * ROW + e]);
        ref /= sum;
        double d = fabs(ref - from_bf16(out[((size_t)s * NUM_HEADS + h) * RANK + e]));
        if (isnan(d) || d > max_err) max_err = d; /* NaN propagates as a failure */
        if (fabs(ref) > max_ref) max_ref = fabs(ref);
      }
    }
    free(w);
  }
  double rel = max_err / max_ref;
  printf("max relative error %.3g (bfloat16 tolerance %g)\n", rel, TOLERANCE);
  if (isnan(rel) || rel > TOLERANCE) {
    fprintf(stderr, "FAILED: output differs from the float64 reference\n");
    goto done;
  }
  printf("ok\n");
  rc = 0;
  goto done;
oom:
  fprintf(stderr, "out of memory\n");
done:
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
  pagedattn_backend_destroy(be);
  for (int s = 0; s < NUM_SEQS; ++s) free(rows[s]);
  free(kv_c);
  free(k_pe);
  free(fresh);
  free(q);
  free(q_nope);
  free(q_pe);
  free(out);
  free(slots);
  free(tables);
  free(ids);
  return rc;
}
