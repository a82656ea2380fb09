/* examples/c/decode.c — one decode step over a paged KV cache, linked against libpagedattn.
 *
 * Three sequences already have 5, 17 and 40 tokens in the cache (their block tables are
 * deliberately non-contiguous); this step adds one token to each and runs the attention layer.
 * Every call's status is checked; on failure the message from pagedattn_last_error() says why.
 * The outputs are compared with a float64 reference so the example doubles as a test.
 *
 * Usage: pagedattn-example-decode [backend]   (default "cpu"; tensors live in host memory, so a
 * backend whose device is not the CPU is refused)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagedattn/pagedattn.h>

#define NUM_SEQS 3
#define NUM_HEADS 8    /* query heads */
#define NUM_KV_HEADS 2 /* grouped-query attention: 4 query heads share one KV head */
#define HEAD_SIZE 64
#define BLOCK_SIZE 16
#define NUM_BLOCKS 16
#define MAX_BLOCKS_PER_SEQ 4

/* Stops at the first failing call, printing which call, the status name and the message. */
#define CHECK(call)                                                                   \
  do {                                                                                \
    pagedattn_status st_ = (call);                                                    \
    if (st_ != PAGEDATTN_OK) {                                                        \
      fprintf(stderr, "%s:%d: %s\n  -> %s: %s\n", __FILE__, __LINE__, #call,         \
              pagedattn_status_string(st_), pagedattn_last_error());                  \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

static const pagedattn_dlpack_dtype kF32 = {PAGEDATTN_DLPACK_FLOAT, 32, 1};
static const pagedattn_dlpack_dtype kI64 = {PAGEDATTN_DLPACK_INT, 64, 1};

/* A compact row-major host tensor over `data`; shape must outlive the tensor's use. */
static pagedattn_tensor host_tensor(void* data, int32_t ndim, int64_t* shape,
                                    pagedattn_dlpack_dtype dtype) {
  pagedattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = PAGEDATTN_DEVICE_CPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = NULL; /* compact */
  return t;
}

/* Small deterministic generator, so the example prints the same numbers every run. */
static uint32_t rng_state = 12345u;
static float rand_uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return (float)(rng_state >> 8) / 16777216.0f * 2.0f - 1.0f;
}

int main(int argc, char** argv) {
  const char* backend_name = argc > 1 ? argv[1] : "cpu";
  const int32_t context_lens[NUM_SEQS] = {5, 17, 40};
  const int32_t query_lens[NUM_SEQS] = {1, 1, 1};
  /* Block ids of each sequence; unused entries are never read. */
  const int32_t block_tables[NUM_SEQS][MAX_BLOCKS_PER_SEQ] = {
      {7, 0, 0, 0}, {2, 11, 0, 0}, {9, 4, 13, 0}};
  enum { KV_ROW = NUM_KV_HEADS * HEAD_SIZE, Q_ROW = NUM_HEADS * HEAD_SIZE };
  /* Every token of every sequence (context plus the new one), as the model would produce them. */
  static float keys[NUM_SEQS][64][KV_ROW], values[NUM_SEQS][64][KV_ROW];
  static float query[NUM_SEQS][Q_ROW], output[NUM_SEQS][Q_ROW];

  pagedattn_backend* backend = NULL;
  pagedattn_kv_cache* cache = NULL;
  pagedattn_batch* batch = NULL;
  float* ctx_k = NULL;
  float* ctx_v = NULL;
  int64_t* ctx_slots = NULL;
  int exit_code = 1;

  int32_t major = 0;
  pagedattn_version(&major, NULL, NULL);
  if (major != PAGEDATTN_VERSION_MAJOR) {
    fprintf(stderr, "library major version %d, headers %d\n", major, PAGEDATTN_VERSION_MAJOR);
    return 1;
  }
  printf("pagedattn %s, backend %s\n", pagedattn_version_string(), backend_name);

  for (int s = 0; s < NUM_SEQS; ++s) {
    for (int t = 0; t <= context_lens[s]; ++t) {
      for (int e = 0; e < KV_ROW; ++e) {
        keys[s][t][e] = rand_uniform();
        values[s][t][e] = rand_uniform();
      }
    }
    for (int e = 0; e < Q_ROW; ++e) query[s][e] = rand_uniform();
  }

  CHECK(pagedattn_backend_create(&backend, backend_name, NULL));
  pagedattn_capabilities caps;
  memset(&caps, 0, sizeof caps);
  caps.struct_size = sizeof caps;
  CHECK(pagedattn_backend_get_capabilities(&caps, backend));
  if (caps.device.device_type != PAGEDATTN_DEVICE_CPU) {
    fprintf(stderr, "backend %s computes on device type %d; this example uses host memory\n",
            caps.name, caps.device.device_type);
    goto done;
  }

  /* The cache: one layer, float32, NHD layout. */
  pagedattn_kv_cache_desc cdesc;
  CHECK(pagedattn_kv_cache_desc_init(&cdesc));
  cdesc.num_layers = 1;
  cdesc.num_blocks = NUM_BLOCKS;
  cdesc.block_size = BLOCK_SIZE;
  cdesc.num_kv_heads = NUM_KV_HEADS;
  cdesc.head_size = HEAD_SIZE;
  cdesc.dtype = PAGEDATTN_DTYPE_FLOAT32;
  cdesc.layout = PAGEDATTN_LAYOUT_NHD;
  CHECK(pagedattn_kv_cache_create(&cache, backend, &cdesc));

  /* Earlier steps stored the context: write it now with an explicit slot mapping
   * (slot = table[pos / block_size] * block_size + pos % block_size). */
  int64_t num_ctx = 0;
  for (int s = 0; s < NUM_SEQS; ++s) num_ctx += context_lens[s];
  ctx_k = malloc((size_t)num_ctx * KV_ROW * sizeof(float));
  ctx_v = malloc((size_t)num_ctx * KV_ROW * sizeof(float));
  ctx_slots = malloc((size_t)num_ctx * sizeof(int64_t));
  if (!ctx_k || !ctx_v || !ctx_slots) {
    fprintf(stderr, "out of memory\n");
    goto done;
  }
  int64_t row = 0;
  for (int s = 0; s < NUM_SEQS; ++s) {
    for (int p = 0; p < context_lens[s]; ++p, ++row) {
      memcpy(ctx_k + row * KV_ROW, keys[s][p], sizeof keys[s][p]);
      memcpy(ctx_v + row * KV_ROW, values[s][p], sizeof values[s][p]);
      ctx_slots[row] = (int64_t)block_tables[s][p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE;
    }
  }
  int64_t ctx_shape[3] = {num_ctx, NUM_KV_HEADS, HEAD_SIZE};
  int64_t slots_shape[1] = {num_ctx};
  pagedattn_tensor tk = host_tensor(ctx_k, 3, ctx_shape, kF32);
  pagedattn_tensor tv = host_tensor(ctx_v, 3, ctx_shape, kF32);
  pagedattn_tensor tslots = host_tensor(ctx_slots, 1, slots_shape, kI64);
  CHECK(pagedattn_kv_cache_write(cache, 0, &tk, &tv, &tslots, 1.0f, 1.0f, NULL));

  /* This step: one new token per sequence. Planning validates the tables once. */
  pagedattn_batch_desc bdesc;
  CHECK(pagedattn_batch_desc_init(&bdesc));
  bdesc.num_seqs = NUM_SEQS;
  bdesc.query_lens = query_lens;
  bdesc.context_lens = context_lens;
  bdesc.block_tables = &block_tables[0][0];
  bdesc.block_table_stride = MAX_BLOCKS_PER_SEQ;
  CHECK(pagedattn_batch_create(&batch, backend, cache, NULL, &bdesc));

  /* The new tokens' q/k/v: row s is sequence s's token at position context_lens[s]. */
  static float new_k[NUM_SEQS][KV_ROW], new_v[NUM_SEQS][KV_ROW];
  for (int s = 0; s < NUM_SEQS; ++s) {
    memcpy(new_k[s], keys[s][context_lens[s]], sizeof new_k[s]);
    memcpy(new_v[s], values[s][context_lens[s]], sizeof new_v[s]);
  }
  int64_t q_shape[3] = {NUM_SEQS, NUM_HEADS, HEAD_SIZE};
  int64_t kv_shape[3] = {NUM_SEQS, NUM_KV_HEADS, HEAD_SIZE};
  pagedattn_tensor q = host_tensor(query, 3, q_shape, kF32);
  pagedattn_tensor k = host_tensor(new_k, 3, kv_shape, kF32);
  pagedattn_tensor v = host_tensor(new_v, 3, kv_shape, kF32);
  pagedattn_tensor out = host_tensor(output, 3, q_shape, kF32);

  pagedattn_attention_options opts;
  CHECK(pagedattn_attention_options_init(&opts));
  opts.num_heads = NUM_HEADS;
  opts.num_kv_heads = NUM_KV_HEADS;
  opts.head_size = HEAD_SIZE;
  opts.write_kv = 1; /* store the new k/v in the cache, then attend over everything */
  CHECK(pagedattn_forward(backend, batch, cache, 0, &opts, &q, &k, &v, &out, NULL, NULL));

  for (int s = 0; s < NUM_SEQS; ++s) {
    printf("seq %d (context %2d): out[head 0][0..3] = %+.5f %+.5f %+.5f %+.5f\n", s,
           context_lens[s], output[s][0], output[s][1], output[s][2], output[s][3]);
  }

  /* float64 reference: softmax(q.k / sqrt(D)) v over positions 0..context_len. */
  double max_err = 0.0, max_ref = 0.0;
  const double scale = 1.0 / sqrt((double)HEAD_SIZE);
  for (int s = 0; s < NUM_SEQS; ++s) {
    const int n = context_lens[s] + 1;
    for (int h = 0; h < NUM_HEADS; ++h) {
      const int kvh = h / (NUM_HEADS / NUM_KV_HEADS);
      double scores[64], mx = -INFINITY, sum = 0.0;
      for (int t = 0; t < n; ++t) {
        double dot = 0.0;
        for (int d = 0; d < HEAD_SIZE; ++d)
          dot += (double)query[s][h * HEAD_SIZE + d] * keys[s][t][kvh * HEAD_SIZE + d];
        scores[t] = dot * scale;
        if (scores[t] > mx) mx = scores[t];
      }
      for (int t = 0; t < n; ++t) sum += (scores[t] = exp(scores[t] - mx));
      for (int d = 0; d < HEAD_SIZE; ++d) {
        double ref = 0.0;
        for (int t = 0; t < n; ++t) ref += scores[t] / sum * values[s][t][kvh * HEAD_SIZE + d];
        const double err = fabs(ref - output[s][h * HEAD_SIZE + d]);
        if (!(err <= max_err)) max_err = err; /* NaN propagates as a failure */
        if (fabs(ref) > max_ref) max_ref = fabs(ref);
      }
    }
  }
  const double rel = max_err / max_ref;
  printf("max |out - ref| / max |ref| = %.3g (float32 tolerance 1e-5)\n", rel);
  if (!(rel <= 1e-5)) {
    fprintf(stderr, "FAILED: output differs from the float64 reference\n");
    goto done;
  }
  printf("ok\n");
  exit_code = 0;

done:
  /* Destroy in reverse order of creation; each accepts NULL. */
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
  pagedattn_backend_destroy(backend);
  free(ctx_k);
  free(ctx_v);
  free(ctx_slots);
  return exit_code;
}
