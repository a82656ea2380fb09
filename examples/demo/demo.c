/* examples/demo/demo.c — pagedattn driven the way an LLM inference engine drives it.
 *
 * A stream of requests (random prompt and output lengths) arrives over time. Each step a
 * scheduler builds one mixed batch under a token budget: decodes first, then prefill chunks
 * (a prompt that does not fit the budget is prefilled over several steps), allocating cache
 * blocks from a free list and preempting (recompute) the newest request when blocks run out.
 * Every layer's attention runs over the paged cache; q/k/v are random (this is an attention
 * library's demo, not a model). Finished requests give their blocks back.
 *
 * With --model mla the layer is DeepSeek-V3-like multi-head latent attention (16 heads per
 * tensor-parallel rank, one latent row of 512 + 64 values per token, blocks of 64): each step
 * writes the new tokens' latent rows with pagedattn_kv_cache_write_latent and attends with
 * pagedattn_forward_mla.
 *
 * With --speculative K, every decode verifies K draft tokens in the same step (EAGLE/Medusa
 * style): the current token and its drafts form a tree (a main chain plus alternative branches)
 * passed as the batch's tree mask, K/V are read once for all of them, and a random prefix of the
 * chain is accepted; the rejected drafts' slots are overwritten by later steps.
 *
 * Every --check-every steps one token of one sequence is recomputed here in float64 from the
 * keys and values read back from the cache (over the keys its tree lets it see), for all heads
 * of one layer; an error above the bfloat16 tolerance (2e-2, max |out - ref| / max |ref|) makes
 * the demo exit non-zero.
 *
 * The tensors live in host memory, so the backend must compute on the CPU ("cpu", "onednn").
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pagedattn/pagedattn.h>

/* The embedded model shapes: a Llama-3-8B-like attention layer (the default), or DeepSeek V3's
 * latent attention on one tensor-parallel rank of 8 (--model mla). */
typedef struct model {
  const char* name;
  int heads, kv_heads, head_size, block_size;
  int value_size; /* MLA: the latent rows' leading values (kv_lora_rank); 0 otherwise */
} model;
static const model kLlama = {"llama", 32, 8, 128, 16, 0};
static const model kMla = {"mla", 16, 1, 576, 64, 512};
static model M; /* the one this run uses */
#define NUM_HEADS M.heads
#define NUM_KV_HEADS M.kv_heads
#define HEAD_SIZE M.head_size
#define BLOCK_SIZE M.block_size
#define BF16_TOLERANCE 2e-2

typedef struct config {
  int layers, max_steps, threads, requests, budget, max_seqs, blocks, check_every, quiet;
  int speculative; /* draft tokens verified per decode (0: plain decode) */
  int prompt_min, prompt_max, output_min, output_max;
  uint64_t seed;
  const char* backend;
  pagedattn_layout layout;
} config;

static void usage(FILE* f) {
  fprintf(f,
          "usage: pagedattn-demo [options]\n"
          "  --layers N       decoder layers (default 4)\n"
          "  --steps N        stop after N steps (default 0: until every request is served)\n"
          "  --requests N     requests in the stream (default 32)\n"
          "  --seed N         random seed (default 1)\n"
          "  --backend NAME   cpu, onednn, ... (default cpu; must compute in host memory)\n"
          "  --threads N      backend worker threads (default 0: one per core)\n"
          "  --budget N       tokens per step (default 512)\n"
          "  --max-seqs N     sequences per step (default 64)\n"
          "  --blocks N       cache blocks (default 512)\n"
          "  --layout L       cache layout: nhd or hnd (default nhd)\n"
          "  --check-every N  float64 spot check every N steps (default 8; 0: never)\n"
          "  --speculative K  verify K draft tokens per decode under a tree mask (default 0)\n"
          "  --model NAME     llama (default: 32 query heads, 8 KV heads, head size 128, block\n"
          "                   size 16) or mla (DeepSeek-V3-like latent attention: 16 heads, latent\n"
          "                   rows of 512 + 64, block size 64); bfloat16\n"
          "  --quiet          no per-step lines\n");
}

static int parse_int(const char* flag, const char* s, long lo, long hi, int* out) {
  char* end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (s == NULL || *s == '\0' || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "pagedattn-demo: %s needs an integer in [%ld, %ld], got '%s'\n", flag, lo,
            hi, s ? s : "");
    return 0;
  }
  *out = (int)v;
  return 1;
}

/* Returns 1 to run, 0 to exit successfully (--help), -1 on a bad argument. */
static int parse_args(int argc, char** argv, config* c) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = 1, seed = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--quiet")) {
      c->quiet = 1;
      continue;
    } else if (!strcmp(a, "--backend") && v) {
      c->backend = v;
    } else if (!strcmp(a, "--model") && v && (!strcmp(v, "llama") || !strcmp(v, "mla"))) {
      M = !strcmp(v, "mla") ? kMla : kLlama;
    } else if (!strcmp(a, "--layout") && v && (!strcmp(v, "nhd") || !strcmp(v, "hnd"))) {
      c->layout = !strcmp(v, "hnd") ? PAGEDATTN_LAYOUT_HND : PAGEDATTN_LAYOUT_NHD;
    } else if (!strcmp(a, "--layers")) {
      ok = parse_int(a, v, 1, 256, &c->layers);
    } else if (!strcmp(a, "--steps")) {
      ok = parse_int(a, v, 0, 100000000, &c->max_steps);
    } else if (!strcmp(a, "--requests")) {
      ok = parse_int(a, v, 1, 1000000, &c->requests);
    } else if (!strcmp(a, "--seed")) {
      ok = parse_int(a, v, 0, 2147483647, &seed);
      c->seed = (uint64_t)seed;
    } else if (!strcmp(a, "--threads")) {
      ok = parse_int(a, v, 0, 4096, &c->threads);
    } else if (!strcmp(a, "--budget")) {
      ok = parse_int(a, v, 1, 65536, &c->budget);
    } else if (!strcmp(a, "--max-seqs")) {
      ok = parse_int(a, v, 1, 4096, &c->max_seqs);
    } else if (!strcmp(a, "--blocks")) {
      ok = parse_int(a, v, 1, 1 << 24, &c->blocks);
    } else if (!strcmp(a, "--check-every")) {
      ok = parse_int(a, v, 0, 1000000, &c->check_every);
    } else if (!strcmp(a, "--speculative")) {
      ok = parse_int(a, v, 0, 15, &c->speculative);
    } else {
      fprintf(stderr, "pagedattn-demo: unknown or incomplete option '%s'\n", a);
      usage(stderr);
      return -1;
    }
    if (!ok) return -1;
    ++i; /* consumed the value */
  }
  return 1;
}

/* ---- small helpers ---------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t* s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}
static int rng_range(uint64_t* s, int lo, int hi) { /* inclusive */
  return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                    /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static double bf16_to_f64(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const pagedattn_dlpack_dtype kBF16 = {PAGEDATTN_DLPACK_BFLOAT, 16, 1};

static pagedattn_tensor host_tensor(void* data, int64_t* shape) {
  pagedattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = PAGEDATTN_DEVICE_CPU;
  t.ndim = 3;
  t.dtype = kBF16;
  t.shape = shape;
  return t;
}

static int report(const char* what, pagedattn_status st) {
  if (st == PAGEDATTN_OK) return 1;
  fprintf(stderr, "pagedattn-demo: %s failed: %s: %s\n", what, pagedattn_status_string(st),
          pagedattn_last_error());
  return 0;
}

/* ---- the engine's state ----------------------------------------------------------------- */

enum { PENDING, WAITING, RUNNING, DONE };

typedef struct request {
  int arrival;        /* step at which it arrives */
  int prompt_len, output_len;
  int generated;      /* output tokens sampled so far */
  int known;          /* prompt + generated: tokens whose K/V must end up in the cache */
  int computed;       /* tokens whose K/V are in the cache */
  int prefill_end;    /* tokens below this position count as prefill (recompute included) */
  int state;
  int step_tokens;    /* tokens scheduled this step (0: not scheduled) */
  int drafts;         /* of them, draft tokens verified under a tree (--speculative) */
  int chain;          /* the tree's main chain: its tokens 0..chain-1 (the current one first) */
  int num_blocks;
  int32_t* table;     /* [max_blocks_per_seq] */
} request;

/* Free list of cache blocks, shuffled so sequences get scattered, non-contiguous blocks. */
typedef struct block_pool {
  int32_t* free_ids;
  int num_free, total, peak_used;
} block_pool;

static int blocks_for(int tokens) { return (tokens + BLOCK_SIZE - 1) / BLOCK_SIZE; }

static void pool_grow(block_pool* p, request* r, int tokens) {
  while (r->num_blocks < blocks_for(tokens)) r->table[r->num_blocks++] = p->free_ids[--p->num_free];
  if (p->total - p->num_free > p->peak_used) p->peak_used = p->total - p->num_free;
}
static void pool_release(block_pool* p, request* r) {
  while (r->num_blocks > 0) p->free_ids[p->num_free++] = r->table[--r->num_blocks];
}

typedef struct engine {
  config cfg;
  request* reqs;
  int* waiting; /* FIFO of request ids; preempted requests go back to the front */
  int num_waiting;
  int* running; /* in admission order */
  int num_running;
  int* sched;   /* this step's batch, in row order */
  int num_sched;
  block_pool pool;
  int max_blocks_per_seq;
  int preemptions;
} engine;

/* Preempts the newest running request not yet scheduled this step: its blocks are freed and it
 * will recompute its tokens as a prefill when readmitted (vLLM's recompute policy). */
static int preempt_one(engine* e) {
  for (int i = e->num_running - 1; i >= 0; --i) {
    request* r = &e->reqs[e->running[i]];
    if (r->step_tokens > 0) continue;
    pool_release(&e->pool, r);
    r->computed = 0;
    r->prefill_end = r->known;
    r->state = WAITING;
    memmove(e->waiting + 1, e->waiting, sizeof(int) * (size_t)e->num_waiting);
    e->waiting[0] = e->running[i];
    e->num_waiting++;
    memmove(e->running + i, e->running + i + 1, sizeof(int) * (size_t)(e->num_running - i - 1));
    e->num_running--;
    e->preemptions++;
    return 1;
  }
  return 0;
}

/* Builds this step's batch: running decodes, then running prefill chunks, then new requests. */
static void schedule(engine* e) {
  int budget = e->cfg.budget;
  e->num_sched = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < e->num_running && budget > 0; ++i) {
      request* r = &e->reqs[e->running[i]];
      const int is_decode = r->known - r->computed == 1;
      if (r->step_tokens > 0 || is_decode != (pass == 0)) continue;
      int n = r->known - r->computed;
      /* A decode verifies up to --speculative drafts, no more than its output can still take. */
      int drafts = 0;
      if (is_decode && e->cfg.speculative > 0) {
        drafts = r->output_len - r->generated - 1;
        if (drafts > e->cfg.speculative) drafts = e->cfg.speculative;
        if (drafts > budget - 1) drafts = budget - 1;
        if (drafts < 0) drafts = 0;
        n += drafts;
      }
      if (n > budget) n = budget;
      int need = blocks_for(r->computed + n) - r->num_blocks;
      int self_preempted = 0;
      while (need > e->pool.num_free) {
        if (!preempt_one(e)) break;
        if (r->state == WAITING) {
          self_preempted = 1; /* it was the newest unscheduled one itself */
          break;
        }
      }
      if (self_preempted) break; /* nothing after it is left in the running list */
      if (need > e->pool.num_free) continue;
      /* Preemptions may have shifted the list; find r's slot again next iteration. */
      for (int j = 0; j < e->num_running; ++j) {
        if (&e->reqs[e->running[j]] == r) i = j;
      }
      pool_grow(&e->pool, r, r->computed + n);
      r->step_tokens = n;
      r->drafts = drafts;
      e->sched[e->num_sched++] = (int)(r - e->reqs);
      budget -= n;
    }
  }
  /* Admit waiting requests while there is budget, room and free blocks (no preemption). */
  while (budget > 0 && e->num_waiting > 0 && e->num_running < e->cfg.max_seqs) {
    request* r = &e->reqs[e->waiting[0]];
    int n = r->known - r->computed;
    if (n > budget) n = budget;
    if (blocks_for(n) > e->pool.num_free) break;
    memmove(e->waiting, e->waiting + 1, sizeof(int) * (size_t)(e->num_waiting - 1));
    e->num_waiting--;
    r->state = RUNNING;
    e->running[e->num_running++] = (int)(r - e->reqs);
    pool_grow(&e->pool, r, n);
    r->step_tokens = n;
    r->drafts = 0;
    e->sched[e->num_sched++] = (int)(r - e->reqs);
    budget -= n;
  }
}

/* ---- the float64 spot check --------------------------------------------------------------- */

typedef struct check_result {
  double rel_err;
  int ok;
} check_result;

/* Whether new token r of a step's q x q tree mask (LSB-first bits) sees new token j. */
static int tree_bit(const uint8_t* bits, int q, int r, int j) {
  const int b = r * q + j;
  return (bits[b / 8] >> (b % 8)) & 1;
}

/* Recomputes row `row` (token at absolute position `pos` of request r) of one layer's output for
 * every head, from the keys/values read back from the cache, and checks that the step's new key
 * and value landed in the cache unchanged. With a tree (the sequence's q x q mask; its new
 * tokens start at position ctx), a new token sees only the new tokens its row lets it see. */
static check_result spot_check(const engine* e, pagedattn_kv_cache* cache, const request* r,
                               int layer, int64_t row, int pos, const uint16_t* q,
                               const uint16_t* k_new, const uint16_t* v_new, const uint16_t* out,
                               uint16_t* readback, uint64_t bytes_per_block, double* scores,
                               const uint8_t* tree, int tree_q, int ctx) {
  check_result res = {0.0, 0};
  const int nkeys = pos + 1;
  const int nblk = blocks_for(nkeys);
  if (!report("pagedattn_kv_cache_read_blocks",
              pagedattn_kv_cache_read_blocks(cache, r->table, (size_t)nblk, readback,
                                             (size_t)nblk * bytes_per_block, NULL)))
    return res;
  /* read_blocks' format: per block, per layer, the K block then the V block, each in the cache's
   * layout order (NHD: slot, head, dim; HND: head, slot, dim). */
  const size_t block_elems = (size_t)BLOCK_SIZE * NUM_KV_HEADS * HEAD_SIZE;
  const size_t per_block = (size_t)e->cfg.layers * 2 * block_elems;
  const int hnd = e->cfg.layout == PAGEDATTN_LAYOUT_HND;
#define CACHE_AT(kv, t, h)                                                                     \
  (readback + (size_t)((t) / BLOCK_SIZE) * per_block + ((size_t)layer * 2 + (kv)) * block_elems + \
   (hnd ? (size_t)(h) * BLOCK_SIZE + (size_t)((t) % BLOCK_SIZE)                                 \
        : (size_t)((t) % BLOCK_SIZE) * NUM_KV_HEADS + (size_t)(h)) * HEAD_SIZE)

  for (int h = 0; h < NUM_KV_HEADS; ++h) {
    if (memcmp(CACHE_AT(0, pos, h), k_new + ((size_t)row * NUM_KV_HEADS + h) * HEAD_SIZE,
               HEAD_SIZE * 2) != 0 ||
        memcmp(CACHE_AT(1, pos, h), v_new + ((size_t)row * NUM_KV_HEADS + h) * HEAD_SIZE,
               HEAD_SIZE * 2) != 0) {
      fprintf(stderr, "pagedattn-demo: the cache does not hold the new key/value of position %d "
                      "(layer %d, KV head %d)\n", pos, layer, h);
      return res;
    }
  }

  const double scale = 1.0 / sqrt((double)HEAD_SIZE);
  double max_err = 0.0, max_ref = 0.0;
  for (int h = 0; h < NUM_HEADS; ++h) {
    const int kvh = h / (NUM_HEADS / NUM_KV_HEADS);
    const uint16_t* qh = q + ((size_t)row * NUM_HEADS + h) * HEAD_SIZE;
    double mx = -INFINITY, sum = 0.0;
    for (int t = 0; t < nkeys; ++t) {
      if (tree != NULL && t >= ctx && !tree_bit(tree, tree_q, pos - ctx, t - ctx)) {
        scores[t] = -INFINITY;
        continue;
      }
      const uint16_t* kt = CACHE_AT(0, t, kvh);
      double dot = 0.0;
      for (int d = 0; d < HEAD_SIZE; ++d) dot += bf16_to_f64(qh[d]) * bf16_to_f64(kt[d]);
      scores[t] = dot * scale;
      if (scores[t] > mx) mx = scores[t];
    }
    for (int t = 0; t < nkeys; ++t) sum += (scores[t] = exp(scores[t] - mx));
    for (int d = 0; d < HEAD_SIZE; ++d) {
      double ref = 0.0;
      for (int t = 0; t < nkeys; ++t) ref += scores[t] * bf16_to_f64(CACHE_AT(1, t, kvh)[d]);
      ref /= sum;
      const double err = fabs(bf16_to_f64(out[((size_t)row * NUM_HEADS + h) * HEAD_SIZE + d]) - ref);
      if (!(err <= max_err)) max_err = err; /* a NaN sticks */
      if (fabs(ref) > max_ref) max_ref = fabs(ref);
    }
  }
#undef CACHE_AT
  res.rel_err = max_ref > 0.0 ? max_err / max_ref : max_err;
  res.ok = res.rel_err <= BF16_TOLERANCE; /* false for NaN */
  return res;
}

/* The MLA form of spot_check: row `row`'s output of every head from the latent rows read back
 * (scores over all D values, weights times the rows' leading R), after checking that the step's
 * new row landed as [kv_c, k_pe]. */
static check_result spot_check_mla(const engine* e, pagedattn_kv_cache* cache, const request* r,
                                   int layer, int64_t row, int pos, const uint16_t* q_nope,
                                   const uint16_t* q_pe, const uint16_t* kv_c,
                                   const uint16_t* k_pe, const uint16_t* out, float scale,
                                   uint16_t* readback, uint64_t bytes_per_block, double* scores,
                                   const uint8_t* tree, int tree_q, int ctx) {
  check_result res = {0.0, 0};
  const int D = M.head_size, R = M.value_size, P = D - R;
  const int nkeys = pos + 1;
  const int nblk = blocks_for(nkeys);
  if (!report("pagedattn_kv_cache_read_blocks",
              pagedattn_kv_cache_read_blocks(cache, r->table, (size_t)nblk, readback,
                                             (size_t)nblk * bytes_per_block, NULL)))
    return res;
  /* read_blocks' format for a latent cache: per block, per layer, its rows (no V block). */
  const size_t block_elems = (size_t)BLOCK_SIZE * D;
  const size_t per_block = (size_t)e->cfg.layers * block_elems;
#define ROW_AT(t) \
  (readback + (size_t)((t) / BLOCK_SIZE) * per_block + (size_t)layer * block_elems + \
   (size_t)((t) % BLOCK_SIZE) * D)
  if (memcmp(ROW_AT(pos), kv_c + (size_t)row * R, (size_t)R * 2) != 0 ||
      memcmp(ROW_AT(pos) + R, k_pe + (size_t)row * P, (size_t)P * 2) != 0) {
    fprintf(stderr, "pagedattn-demo: the cache does not hold the new latent row of position %d "
                    "(layer %d)\n", pos, layer);
    return res;
  }
  double max_err = 0.0, max_ref = 0.0;
  for (int h = 0; h < NUM_HEADS; ++h) {
    const uint16_t* qn = q_nope + ((size_t)row * NUM_HEADS + h) * R;
    const uint16_t* qp = q_pe + ((size_t)row * NUM_HEADS + h) * P;
    double mx = -INFINITY, sum = 0.0;
    for (int t = 0; t < nkeys; ++t) {
      if (tree != NULL && t >= ctx && !tree_bit(tree, tree_q, pos - ctx, t - ctx)) {
        scores[t] = -INFINITY;
        continue;
      }
      const uint16_t* kt = ROW_AT(t);
      double dot = 0.0;
      for (int d = 0; d < R; ++d) dot += bf16_to_f64(qn[d]) * bf16_to_f64(kt[d]);
      for (int d = 0; d < P; ++d) dot += bf16_to_f64(qp[d]) * bf16_to_f64(kt[R + d]);
      scores[t] = dot * (double)scale;
      if (scores[t] > mx) mx = scores[t];
    }
    for (int t = 0; t < nkeys; ++t) sum += (scores[t] = exp(scores[t] - mx));
    for (int d = 0; d < R; ++d) {
      double ref = 0.0;
      for (int t = 0; t < nkeys; ++t) ref += scores[t] * bf16_to_f64(ROW_AT(t)[d]);
      ref /= sum;
      const double err = fabs(bf16_to_f64(out[((size_t)row * NUM_HEADS + h) * R + d]) - ref);
      if (!(err <= max_err)) max_err = err; /* a NaN sticks */
      if (fabs(ref) > max_ref) max_ref = fabs(ref);
    }
  }
#undef ROW_AT
  res.rel_err = max_ref > 0.0 ? max_err / max_ref : max_err;
  res.ok = res.rel_err <= BF16_TOLERANCE; /* false for NaN */
  return res;
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  M = kLlama;
  config cfg = {.layers = 4, .max_steps = 0, .threads = 0, .requests = 32, .budget = 512,
                .max_seqs = 64, .blocks = 512, .check_every = 8, .quiet = 0,
                .prompt_min = 16, .prompt_max = 512, .output_min = 8, .output_max = 64,
                .seed = 1, .backend = "cpu", .layout = PAGEDATTN_LAYOUT_NHD};
  int pr = parse_args(argc, argv, &cfg);
  if (pr <= 0) return pr == 0 ? 0 : 2;

  const int max_total = cfg.prompt_max + cfg.output_max;
  engine e;
  memset(&e, 0, sizeof e);
  e.cfg = cfg;
  e.max_blocks_per_seq = blocks_for(max_total);
  if (cfg.blocks < e.max_blocks_per_seq) {
    fprintf(stderr, "pagedattn-demo: --blocks %d cannot hold one request of %d tokens (%d blocks)\n",
            cfg.blocks, max_total, e.max_blocks_per_seq);
    return 2;
  }

  pagedattn_backend* backend = NULL;
  pagedattn_kv_cache* cache = NULL;
  pagedattn_batch* batch = NULL;
  uint16_t *pool = NULL, *out = NULL, *readback = NULL;
  int32_t *qlens = NULL, *clens = NULL, *tables = NULL;
  double* scores = NULL;
  uint8_t* tree_bits = NULL;  /* --speculative: this step's tree masks */
  int64_t* tree_ip = NULL;
  int exit_code = 1;
  uint64_t rng = cfg.seed * 0x9E3779B97F4A7C15ULL + 1;

  /* The request stream: random lengths, arrivals 0-3 steps apart after an initial burst. */
  e.reqs = calloc((size_t)cfg.requests, sizeof *e.reqs);
  e.waiting = calloc((size_t)cfg.requests, sizeof(int));
  e.running = calloc((size_t)cfg.requests, sizeof(int));
  e.sched = calloc((size_t)cfg.requests, sizeof(int));
  e.pool.free_ids = calloc((size_t)cfg.blocks, sizeof(int32_t));
  int32_t* table_mem = calloc((size_t)cfg.requests * (size_t)e.max_blocks_per_seq, sizeof(int32_t));
  if (!e.reqs || !e.waiting || !e.running || !e.sched || !e.pool.free_ids || !table_mem) {
    fprintf(stderr, "pagedattn-demo: out of memory\n");
    goto done;
  }
  for (int i = 0, t = 0; i < cfg.requests; ++i) {
    request* r = &e.reqs[i];
    if (i >= 8) t += rng_range(&rng, 0, 3);
    r->arrival = t;
    r->prompt_len = rng_range(&rng, cfg.prompt_min, cfg.prompt_max);
    r->output_len = rng_range(&rng, cfg.output_min, cfg.output_max);
    r->known = r->prefill_end = r->prompt_len;
    r->state = PENDING;
    r->table = table_mem + (size_t)i * e.max_blocks_per_seq;
  }
  e.pool.total = e.pool.num_free = cfg.blocks;
  for (int i = 0; i < cfg.blocks; ++i) e.pool.free_ids[i] = i;
  for (int i = cfg.blocks - 1; i > 0; --i) {
    int j = rng_range(&rng, 0, i);
    int32_t tmp = e.pool.free_ids[i];
    e.pool.free_ids[i] = e.pool.free_ids[j];
    e.pool.free_ids[j] = tmp;
  }

  /* Backend and cache. */
  pagedattn_backend_options bopts;
  if (!report("pagedattn_backend_options_init", pagedattn_backend_options_init(&bopts))) goto done;
  bopts.num_threads = cfg.threads;
  if (!report("pagedattn_backend_create", pagedattn_backend_create(&backend, cfg.backend, &bopts)))
    goto done;
  pagedattn_capabilities caps;
  memset(&caps, 0, sizeof caps);
  caps.struct_size = sizeof caps;
  if (!report("pagedattn_backend_get_capabilities",
              pagedattn_backend_get_capabilities(&caps, backend)))
    goto done;
  if (caps.device.device_type != PAGEDATTN_DEVICE_CPU) {
    fprintf(stderr, "pagedattn-demo: backend '%s' computes on device type %d; the demo keeps its "
                    "tensors in host memory, so use a CPU backend (--backend cpu)\n",
            caps.name, caps.device.device_type);
    goto done;
  }

  pagedattn_kv_cache_desc cdesc;
  if (!report("pagedattn_kv_cache_desc_init", pagedattn_kv_cache_desc_init(&cdesc))) goto done;
  cdesc.num_layers = cfg.layers;
  cdesc.num_blocks = cfg.blocks;
  cdesc.block_size = BLOCK_SIZE;
  cdesc.num_kv_heads = NUM_KV_HEADS;
  cdesc.head_size = HEAD_SIZE;
  cdesc.dtype = PAGEDATTN_DTYPE_BFLOAT16;
  cdesc.layout = cfg.layout;
  const int mla = M.value_size > 0;
  if (mla) cdesc.flags |= PAGEDATTN_KV_CACHE_LATENT;
  uint64_t bytes_per_block = 0;
  if (!report("pagedattn_kv_cache_bytes_per_block",
              pagedattn_kv_cache_bytes_per_block(&bytes_per_block, &cdesc)) ||
      !report("pagedattn_kv_cache_create", pagedattn_kv_cache_create(&cache, backend, &cdesc)))
    goto done;

  printf("pagedattn %s, backend %s (%d threads)\n", pagedattn_version_string(), caps.name,
         caps.max_num_threads);
  if (mla)
    printf("model: %d layers of latent attention (MLA), %d query heads, latent rows of %d + %d, "
           "bfloat16\n", cfg.layers, NUM_HEADS, M.value_size, HEAD_SIZE - M.value_size);
  else
    printf("model: %d layers, %d query heads, %d KV heads, head size %d, bfloat16\n",
           cfg.layers, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE);
  printf("cache: %s, %d blocks of %d tokens, %.1f MiB; %d requests (prompts %d-%d, outputs %d-%d), "
         "%d tokens/step, seed %llu\n",
         cfg.layout == PAGEDATTN_LAYOUT_HND ? "HND" : "NHD", cfg.blocks, BLOCK_SIZE,
         (double)bytes_per_block * cfg.blocks / (1024.0 * 1024.0),
         cfg.requests, cfg.prompt_min, cfg.prompt_max, cfg.output_min, cfg.output_max,
         cfg.budget, (unsigned long long)cfg.seed);
  if (cfg.speculative > 0)
    printf("speculative decoding: each decode verifies up to %d draft tokens under a tree mask\n",
           cfg.speculative);

  /* q/k/v of each layer are random windows of one pool of random bf16 values: generating fresh
   * numbers per layer would cost more than the attention being shown. */
  const size_t q_row = (size_t)NUM_HEADS * HEAD_SIZE, kv_row = (size_t)NUM_KV_HEADS * HEAD_SIZE;
  const size_t pool_len = 2 * (size_t)cfg.budget * q_row + 4096;
  pool = malloc(pool_len * sizeof *pool);
  out = malloc((size_t)cfg.budget * q_row * sizeof *out);
  readback = malloc((size_t)e.max_blocks_per_seq * bytes_per_block);
  qlens = malloc((size_t)cfg.requests * sizeof *qlens);
  clens = malloc((size_t)cfg.requests * sizeof *clens);
  tables = malloc((size_t)cfg.requests * (size_t)e.max_blocks_per_seq * sizeof *tables);
  scores = malloc((size_t)max_total * sizeof *scores);
  /* A decode's tree: the current token and its drafts, (K+1)^2 bits. */
  const int64_t tree_bytes_per_seq = ((int64_t)(cfg.speculative + 1) * (cfg.speculative + 1) + 7) / 8;
  tree_bits = calloc((size_t)cfg.max_seqs * (size_t)tree_bytes_per_seq, 1);
  tree_ip = calloc((size_t)cfg.requests + 1, sizeof *tree_ip);
  if (!pool || !out || !readback || !qlens || !clens || !tables || !scores || !tree_bits ||
      !tree_ip) {
    fprintf(stderr, "pagedattn-demo: out of memory\n");
    goto done;
  }
  for (size_t i = 0; i < pool_len; ++i)
    pool[i] = f32_to_bf16((float)((double)(rng_next(&rng) >> 11) / 4503599627370496.0 - 1.0));

  pagedattn_attention_options aopts;
  if (!report("pagedattn_attention_options_init", pagedattn_attention_options_init(&aopts)))
    goto done;
  aopts.num_heads = NUM_HEADS;
  aopts.num_kv_heads = NUM_KV_HEADS;
  aopts.head_size = HEAD_SIZE;
  aopts.write_kv = 1;
  /* DeepSeek's softmax scale is 1/sqrt(qk_nope + rope = 192), not 1/sqrt(576). */
  if (mla) aopts.scale = (float)(1.0 / sqrt(192.0));

  long long prefill_tokens = 0, decode_tokens = 0, drafts_verified = 0, drafts_accepted = 0;
  int served = 0, steps = 0, next_arrival = 0, num_checks = 0;
  double attn_time = 0.0, worst_err = 0.0;
  const double t_start = now_s();
  for (int clock = 0; served < cfg.requests && (cfg.max_steps == 0 || steps < cfg.max_steps);
       ++clock) {
    /* Idle engine: jump to the next arrival. */
    if (e.num_running == 0 && e.num_waiting == 0 && next_arrival < cfg.requests &&
        e.reqs[next_arrival].arrival > clock)
      clock = e.reqs[next_arrival].arrival;
    while (next_arrival < cfg.requests && e.reqs[next_arrival].arrival <= clock) {
      e.reqs[next_arrival].state = WAITING;
      e.waiting[e.num_waiting++] = next_arrival++;
    }

    schedule(&e);
    if (e.num_sched == 0) continue; /* cannot happen with enough blocks; keeps the loop safe */

    int n_prefill = 0, n_decode = 0, n_prefill_seqs = 0;
    for (int i = 0; i < e.num_sched; ++i) {
      const request* r = &e.reqs[e.sched[i]];
      qlens[i] = r->step_tokens;
      clens[i] = r->computed;
      memcpy(tables + (size_t)i * e.max_blocks_per_seq, r->table,
             (size_t)r->num_blocks * sizeof(int32_t));
      int pre = r->prefill_end - r->computed;
      if (pre < 0) pre = 0;
      if (pre > r->step_tokens) pre = r->step_tokens;
      n_prefill += pre;
      n_decode += r->step_tokens - pre;
      n_prefill_seqs += pre > 0;
    }
    /* --speculative: each verifying decode's tree. Token 0 is the current token; tokens
     * 0..chain-1 form the main chain (each the child of the one before), the other drafts are
     * alternatives hanging off a random chain token. A token sees itself and its ancestors. */
    tree_ip[0] = 0;
    for (int i = 0; i < e.num_sched; ++i) {
      request* r = &e.reqs[e.sched[i]];
      tree_ip[i + 1] = tree_ip[i];
      if (r->drafts == 0) continue;
      const int q = r->step_tokens;
      uint8_t* bits = tree_bits + tree_ip[i];
      memset(bits, 0, (size_t)tree_bytes_per_seq);
      r->chain = 1 + (r->drafts + 1) / 2;
      int parent[16];
      for (int j = 0; j < q; ++j) {
        parent[j] = j == 0 ? -1 : j < r->chain ? j - 1 : rng_range(&rng, 0, r->chain - 2);
        for (int a = j; a >= 0; a = parent[a]) bits[(j * q + a) / 8] |= (uint8_t)(1u << ((j * q + a) % 8));
      }
      tree_ip[i + 1] = tree_ip[i] + tree_bytes_per_seq;
    }
    const double t0 = now_s();
    pagedattn_batch_desc bdesc;
    if (!report("pagedattn_batch_desc_init_sized",
                pagedattn_batch_desc_init_sized(&bdesc, sizeof bdesc)))
      goto done;
    bdesc.num_seqs = e.num_sched;
    if (cfg.speculative > 0) {
      bdesc.tree_mask = tree_bits;
      bdesc.tree_mask_indptr = tree_ip;
    }
    bdesc.query_lens = qlens;
    bdesc.context_lens = clens;
    bdesc.block_tables = tables;
    bdesc.block_table_stride = e.max_blocks_per_seq;
    if (batch == NULL) {
      /* Plan once with the engine's capacities, then update in place every step (the pattern
       * that lets a GPU backend replay a captured graph). */
      bdesc.max_num_seqs = cfg.max_seqs;
      bdesc.max_num_tokens = cfg.budget;
      bdesc.max_blocks_per_seq = e.max_blocks_per_seq;
      bdesc.max_seq_len = max_total;
      bdesc.max_tree_mask_bytes = cfg.speculative > 0 ? cfg.max_seqs * tree_bytes_per_seq : 0;
      if (!report("pagedattn_batch_create",
                  pagedattn_batch_create(&batch, backend, cache, NULL, &bdesc)))
        goto done;
    } else if (!report("pagedattn_batch_update", pagedattn_batch_update(batch, &bdesc))) {
      goto done;
    }
    const int32_t* qstart = NULL;
    int32_t qstart_count = 0;
    if (!report("pagedattn_batch_get_query_start",
                pagedattn_batch_get_query_start(&qstart, &qstart_count, batch)))
      goto done;
    const int64_t num_tokens = qstart[e.num_sched];

    /* Spot check this step? Pick a layer, a sequence and one of its new tokens. */
    const int check = cfg.check_every > 0 && steps % cfg.check_every == 0;
    const int check_layer = check ? rng_range(&rng, 0, cfg.layers - 1) : -1;
    const int check_seq = check ? rng_range(&rng, 0, e.num_sched - 1) : 0;
    const int check_tok = check ? rng_range(&rng, 0, qlens[check_seq] - 1) : 0;
    const int check_tree = check && e.reqs[e.sched[check_seq]].drafts > 0;
    double check_time = 0.0;

    int64_t q_shape[3] = {num_tokens, NUM_HEADS, HEAD_SIZE};
    int64_t kv_shape[3] = {num_tokens, NUM_KV_HEADS, HEAD_SIZE};
    for (int layer = 0; layer < cfg.layers; ++layer) {
      /* Random windows, 64-element aligned, for this layer's q, k and v. */
      const size_t q_len = (size_t)num_tokens * q_row, kv_len = (size_t)num_tokens * kv_row;
      const uint16_t* qd = pool + (rng_next(&rng) % ((pool_len - q_len) / 64)) * 64;
      const uint16_t* kd = pool + (rng_next(&rng) % ((pool_len - kv_len) / 64)) * 64;
      const uint16_t* vd = pool + (rng_next(&rng) % ((pool_len - kv_len) / 64)) * 64;
      pagedattn_tensor tq = host_tensor((void*)qd, q_shape);
      pagedattn_tensor tk = host_tensor((void*)kd, kv_shape);
      pagedattn_tensor tv = host_tensor((void*)vd, kv_shape);
      pagedattn_tensor tout = host_tensor(out, q_shape);
      const size_t out_len = (size_t)num_tokens * NUM_HEADS * (mla ? M.value_size : HEAD_SIZE);
      if (layer == check_layer) {
        /* Poison the output: every row must be written. */
        for (size_t i = 0; i < out_len; ++i) out[i] = 0x7fc0;
      }
      /* MLA: q_nope [T, H, R] and q_pe [T, H, D - R] (its own window), the step's latent rows
       * written first as kv_c [T, 1, R] and k_pe [T, 1, D - R]; out [T, H, R]. */
      const int R = M.value_size, P = HEAD_SIZE - M.value_size;
      const uint16_t* pd = pool + (rng_next(&rng) % ((pool_len - q_len) / 64)) * 64;
      int64_t qn_shape[3] = {num_tokens, NUM_HEADS, R}, qp_shape[3] = {num_tokens, NUM_HEADS, P};
      int64_t kc_shape[3] = {num_tokens, 1, R}, kp_shape[3] = {num_tokens, 1, P};
      if (mla) {
        pagedattn_tensor tqn = host_tensor((void*)qd, qn_shape);
        pagedattn_tensor tqp = host_tensor((void*)pd, qp_shape);
        pagedattn_tensor tkc = host_tensor((void*)kd, kc_shape);
        pagedattn_tensor tkp = host_tensor((void*)vd, kp_shape);
        pagedattn_tensor tmo = host_tensor(out, qn_shape);
        const int64_t* slots = NULL;
        int64_t nslots = 0;
        if (!report("pagedattn_batch_get_slot_mapping",
                    pagedattn_batch_get_slot_mapping(&slots, &nslots, batch)))
          goto done;
        int64_t s_shape[1] = {nslots};
        pagedattn_tensor ts;
        memset(&ts, 0, sizeof ts);
        ts.data = (void*)slots;
        ts.device.device_type = PAGEDATTN_DEVICE_CPU;
        ts.ndim = 1;
        ts.dtype.code = PAGEDATTN_DLPACK_INT;
        ts.dtype.bits = 64;
        ts.dtype.lanes = 1;
        ts.shape = s_shape;
        if (!report("pagedattn_kv_cache_write_latent",
                    pagedattn_kv_cache_write_latent(cache, layer, &tkc, &tkp, &ts, 1.0f, NULL)) ||
            !report("pagedattn_forward_mla",
                    pagedattn_forward_mla(backend, batch, cache, layer, &aopts, &tqn, &tqp, &tmo,
                                          NULL, NULL)))
          goto done;
      } else if (!report("pagedattn_forward",
                         pagedattn_forward(backend, batch, cache, layer, &aopts, &tq, &tk, &tv,
                                           &tout, NULL, NULL))) {
        goto done;
      }
      if (layer == check_layer) {
        const double tc = now_s();
        for (size_t i = 0; i < out_len; ++i) {
          if ((out[i] & 0x7f80) == 0x7f80) {
            fprintf(stderr, "pagedattn-demo: step %d layer %d: output element %zu is not finite "
                            "(row %zu)\n", steps, layer, i, i / (out_len / (size_t)num_tokens));
            goto done;
          }
        }
        const request* r = &e.reqs[e.sched[check_seq]];
        const int64_t row = qstart[check_seq] + check_tok;
        const int pos = r->computed + check_tok;
        const uint8_t* tb = check_tree ? tree_bits + tree_ip[check_seq] : NULL;
        check_result cr =
            mla ? spot_check_mla(&e, cache, r, layer, row, pos, qd, pd, kd, vd, out, aopts.scale,
                                 readback, bytes_per_block, scores, tb, qlens[check_seq],
                                 r->computed)
                : spot_check(&e, cache, r, layer, row, pos, qd, kd, vd, out, readback,
                             bytes_per_block, scores, tb, qlens[check_seq], r->computed);
        ++num_checks;
        if (!(cr.rel_err <= worst_err)) worst_err = cr.rel_err;
        if (!cfg.quiet || !cr.ok) {
          printf("  check: step %d layer %d request %d position %d (%d keys%s), all %d heads: "
                 "max rel err %.2e %s\n", steps, layer, e.sched[check_seq], pos, pos + 1,
                 check_tree ? ", draft tree" : "", NUM_HEADS, cr.rel_err, cr.ok ? "ok" : "FAILED");
        }
        if (!cr.ok) {
          fprintf(stderr, "pagedattn-demo: spot check failed (tolerance %.0e)\n", BF16_TOLERANCE);
          goto done;
        }
        check_time = now_s() - tc;
      }
    }
    const double step_time = now_s() - t0 - check_time;
    attn_time += step_time;

    /* Advance the requests; sample a token where a sequence's known tokens are all cached. */
    int finished = 0;
    for (int i = 0; i < e.num_sched; ++i) {
      request* r = &e.reqs[e.sched[i]];
      if (r->drafts > 0) {
        /* Accept the current token and a random prefix of the chain's drafts; the model's
         * next token comes with them, and the rejected drafts' slots are written over later. */
        const int a = rng_range(&rng, 1, r->chain);
        drafts_verified += r->drafts;
        drafts_accepted += a - 1;
        r->computed += a;
        r->generated += a;
        r->known = r->computed + 1;
        r->step_tokens = r->drafts = 0;
        if (r->generated == r->output_len) {
          r->state = DONE;
          pool_release(&e.pool, r);
          ++finished;
          ++served;
        }
        continue;
      }
      r->computed += r->step_tokens;
      r->step_tokens = 0;
      if (r->computed == r->known) {
        r->generated++;
        r->known++;
        if (r->generated == r->output_len) {
          r->state = DONE;
          pool_release(&e.pool, r);
          ++finished;
          ++served;
        }
      }
    }
    if (finished > 0) {
      int w = 0;
      for (int i = 0; i < e.num_running; ++i)
        if (e.reqs[e.running[i]].state == RUNNING) e.running[w++] = e.running[i];
      e.num_running = w;
    }
    prefill_tokens += n_prefill;
    decode_tokens += n_decode;
    if (!cfg.quiet) {
      printf("step %4d  prefill %4d tok (%2d seqs)  decode %3d  blocks %4d/%d  waiting %3d  "
             "done %4d  %7.1f ms\n", steps, n_prefill, n_prefill_seqs, n_decode,
             e.pool.total - e.pool.num_free, e.pool.total, e.num_waiting, served,
             step_time * 1e3);
    }
    ++steps;
  }
  const double wall = now_s() - t_start;

  const long long total = prefill_tokens + decode_tokens;
  printf("\nserved %d/%d requests in %d steps (%d preemptions)\n", served, cfg.requests, steps,
         e.preemptions);
  printf("tokens: %lld prefill + %lld decode = %lld\n", prefill_tokens, decode_tokens, total);
  if (cfg.speculative > 0)
    printf("speculative: %lld draft tokens verified, %lld accepted\n", drafts_verified,
           drafts_accepted);
  printf("attention: %.2f s for %d layers = %.0f tokens/s (wall %.2f s with the demo's checks)\n",
         attn_time, cfg.layers, attn_time > 0 ? (double)total / attn_time : 0.0, wall);
  printf("peak cache blocks used: %d/%d (%.0f%%)\n", e.pool.peak_used, e.pool.total,
         100.0 * e.pool.peak_used / e.pool.total);
  printf("spot checks: %d, max relative error %.2e (bfloat16 tolerance %.0e)\n", num_checks,
         worst_err, BF16_TOLERANCE);
  if (served == cfg.requests && e.pool.num_free != e.pool.total) {
    fprintf(stderr, "pagedattn-demo: %d blocks still allocated after the last request\n",
            e.pool.total - e.pool.num_free);
    goto done;
  }
  exit_code = 0;

done:
  pagedattn_batch_destroy(batch);
  pagedattn_kv_cache_destroy(cache);
  pagedattn_backend_destroy(backend);
  free(pool);
  free(out);
  free(readback);
  free(qlens);
  free(clens);
  free(tables);
  free(scores);
  free(tree_bits);
  free(tree_ip);
  free(table_mem);
  free(e.reqs);
  free(e.waiting);
  free(e.running);
  free(e.sched);
  free(e.pool.free_ids);
  return exit_code;
}
