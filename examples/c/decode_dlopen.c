/* examples/c/decode_dlopen.c — the decode step of decode.c, with libpagedattn loaded at run time.
 *
 * Nothing is linked against the library: it is dlopen'ed and every function resolved with dlsym,
 * as a language runtime or a plugin host would do. The header is used only for the types (the
 * function pointer types come from the declarations through __typeof__, so they cannot drift).
 *
 * Usage: pagedattn-example-decode-dlopen [path/to/libpagedattn.so]
 * The library is argv[1], else $PAGEDATTN_LIBRARY, else "libpagedattn.so.0" then
 * "libpagedattn.so" through the dynamic loader's search path.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pagedattn/pagedattn.h>

#define NUM_SEQS 3
#define NUM_HEADS 8
#define NUM_KV_HEADS 2
#define HEAD_SIZE 64
#define BLOCK_SIZE 16
#define NUM_BLOCKS 16
#define MAX_BLOCKS_PER_SEQ 4

/* The entry points this program uses, resolved by name. */
#define PA_FUNCTIONS(X)          \
  X(pagedattn_version)           \
  X(pagedattn_version_string)    \
  X(pagedattn_status_string)     \
  X(pagedattn_last_error)        \
  X(pagedattn_backend_create)    \
  X(pagedattn_backend_destroy)   \
  X(pagedattn_kv_cache_desc_init) \
  X(pagedattn_kv_cache_create)   \
  X(pagedattn_kv_cache_destroy)  \
  X(pagedattn_kv_cache_write)    \
  X(pagedattn_batch_desc_init)   \
  X(pagedattn_batch_create)      \
  X(pagedattn_batch_destroy)     \
  X(pagedattn_attention_options_init) \
  X(pagedattn_forward)

static struct {
#define PA_FIELD(name) __typeof__(&name) name;
  PA_FUNCTIONS(PA_FIELD)
#undef PA_FIELD
} pa;

/* Resolves every entry point; returns 0 and prints the missing one on failure. */
static int load_api(void* lib) {
#define PA_LOAD(name)                                                        \
  *(void**)(&pa.name) = dlsym(lib, #name);                                   \
  if (pa.name == NULL) {                                                     \
    fprintf(stderr, "dlsym(%s) failed: %s\n", #name, dlerror());             \
    return 0;                                                                \
  }
  PA_FUNCTIONS(PA_LOAD)
#undef PA_LOAD
  return 1;
}

#define CHECK(call)                                                                   \
  do {                                                                                \
    pagedattn_status st_ = (call);                                                    \
    if (st_ != PAGEDATTN_OK) {                                                        \
      fprintf(stderr, "%s:%d: %s\n  -> %s: %s\n", __FILE__, __LINE__, #call,         \
              pa.pagedattn_status_string(st_), pa.pagedattn_last_error());            \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

static const pagedattn_dlpack_dtype kF32 = {PAGEDATTN_DLPACK_FLOAT, 32, 1};
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

static uint32_t rng_state = 12345u;
static float rand_uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return (float)(rng_state >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static void* open_library(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : getenv("PAGEDATTN_LIBRARY");
  if (path != NULL && path[0] != '\0') {
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) fprintf(stderr, "dlopen(%s) failed: %s\n", path, dlerror());
    return lib;
  }
  void* lib = dlopen("libpagedattn.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) lib = dlopen("libpagedattn.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) fprintf(stderr, "dlopen(libpagedattn.so) failed: %s\n", dlerror());
  return lib;
}

int main(int argc, char** argv) {
  enum { KV_ROW = NUM_KV_HEADS * HEAD_SIZE, Q_ROW = NUM_HEADS * HEAD_SIZE, MAX_CTX = 41 };
  const int32_t context_lens[NUM_SEQS] = {5, 17, 40};
  const int32_t query_lens[NUM_SEQS] = {1, 1, 1};
  const int32_t block_tables[NUM_SEQS][MAX_BLOCKS_PER_SEQ] = {
      {7, 0, 0, 0}, {2, 11, 0, 0}, {9, 4, 13, 0}};
  static float keys[NUM_SEQS][MAX_CTX][KV_ROW], values[NUM_SEQS][MAX_CTX][KV_ROW];
  static float query[NUM_SEQS][Q_ROW], output[NUM_SEQS][Q_ROW];
  static float new_k[NUM_SEQS][KV_ROW], new_v[NUM_SEQS][KV_ROW];
  static float ctx_k[NUM_SEQS * MAX_CTX][KV_ROW], ctx_v[NUM_SEQS * MAX_CTX][KV_ROW];
  static int64_t ctx_slots[NUM_SEQS * MAX_CTX];

  pagedattn_backend* backend = NULL;
  pagedattn_kv_cache* cache = NULL;
  pagedattn_batch* batch = NULL;
  int exit_code = 1;

  void* lib = open_library(argc, argv);
  if (lib == NULL || !load_api(lib)) return 1;

  /* The library must speak the ABI of the header these types came from. */
  int32_t major = 0;
  pa.pagedattn_version(&major, NULL, NULL);
  if (major != PAGEDATTN_VERSION_MAJOR) {
    fprintf(stderr, "library major version %d, headers %d\n", major, PAGEDATTN_VERSION_MAJOR);
    dlclose(lib);
    return 1;
  }
  printf("pagedattn %s loaded at run time\n", pa.pagedattn_version_string());

  for (int s = 0; s < NUM_SEQS; ++s) {
    for (int t = 0; t <= context_lens[s]; ++t) {
      for (int e = 0; e < KV_ROW; ++e) {
        keys[s][t][e] = rand_uniform();
        values[s][t][e] = rand_uniform();
      }
    }
    for (int e = 0; e < Q_ROW; ++e) query[s][e] = rand_uniform();
  }

  CHECK(pa.pagedattn_backend_create(&backend, "cpu", NULL));

  pagedattn_kv_cache_desc cdesc;
  CHECK(pa.pagedattn_kv_cache_desc_init(&cdesc));
  cdesc.num_layers = 1;
  cdesc.num_blocks = NUM_BLOCKS;
  cdesc.block_size = BLOCK_SIZE;
  cdesc.num_kv_heads = NUM_KV_HEADS;
  cdesc.head_size = HEAD_SIZE;
  cdesc.dtype = PAGEDATTN_DTYPE_FLOAT32;
  cdesc.layout = PAGEDATTN_LAYOUT_NHD;
  CHECK(pa.pagedattn_kv_cache_create(&cache, backend, &cdesc));

  /* Store the context of earlier steps. */
  int64_t num_ctx = 0;
  for (int s = 0; s < NUM_SEQS; ++s) {
    for (int p = 0; p < context_lens[s]; ++p, ++num_ctx) {
      memcpy(ctx_k[num_ctx], keys[s][p], sizeof ctx_k[num_ctx]);
      memcpy(ctx_v[num_ctx], values[s][p], sizeof ctx_v[num_ctx]);
      ctx_slots[num_ctx] =
          (int64_t)block_tables[s][p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE;
    }
  }
  int64_t ctx_shape[3] = {num_ctx, NUM_KV_HEADS, HEAD_SIZE};
  int64_t slots_shape[1] = {num_ctx};
  pagedattn_tensor tk = host_tensor(ctx_k, 3, ctx_shape, kF32);
  pagedattn_tensor tv = host_tensor(ctx_v, 3, ctx_shape, kF32);
  pagedattn_tensor tslots = host_tensor(ctx_slots, 1, slots_shape, kI64);
  CHECK(pa.pagedattn_kv_cache_write(cache, 0, &tk, &tv, &tslots, 1.0f, 1.0f, NULL));

  pagedattn_batch_desc bdesc;
  CHECK(pa.pagedattn_batch_desc_init(&bdesc));
  bdesc.num_seqs = NUM_SEQS;
  bdesc.query_lens = query_lens;
  bdesc.context_lens = context_lens;
  bdesc.block_tables = &block_tables[0][0];
  bdesc.block_table_stride = MAX_BLOCKS_PER_SEQ;
  CHECK(pa.pagedattn_batch_create(&batch, backend, cache, NULL, &bdesc));

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
  CHECK(pa.pagedattn_attention_options_init(&opts));
  opts.num_heads = NUM_HEADS;
  opts.num_kv_heads = NUM_KV_HEADS;
  opts.head_size = HEAD_SIZE;
  opts.write_kv = 1;
  CHECK(pa.pagedattn_forward(backend, batch, cache, 0, &opts, &q, &k, &v, &out, NULL, NULL));

  /* Same float64 reference as decode.c. */
  double max_err = 0.0, max_ref = 0.0;
  const double scale = 1.0 / sqrt((double)HEAD_SIZE);
  for (int s = 0; s < NUM_SEQS; ++s) {
    const int n = context_lens[s] + 1;
    printf("seq %d (context %2d): out[head 0][0..3] = %+.5f %+.5f %+.5f %+.5f\n", s,
           context_lens[s], output[s][0], output[s][1], output[s][2], output[s][3]);
    for (int h = 0; h < NUM_HEADS; ++h) {
      const int kvh = h / (NUM_HEADS / NUM_KV_HEADS);
      double scores[MAX_CTX], mx = -INFINITY, sum = 0.0;
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
        if (!(err <= max_err)) max_err = err;
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
  pa.pagedattn_batch_destroy(batch);
  pa.pagedattn_kv_cache_destroy(cache);
  pa.pagedattn_backend_destroy(backend);
  dlclose(lib);
  return exit_code;
}
