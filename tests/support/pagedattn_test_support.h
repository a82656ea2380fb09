/* Shared support for pagedattn's C++ test suites (tests/, tests/gpu/, tests/conformance/).
 *
 * - independent element conversions (bf16, f16, fp8 e4m3fn / e5m2; round-to-nearest-even,
 *   fp8 saturating) used by the float64 reference;
 * - a float64 reference attention (pat::ref_attend) and a case runner (pat::run_attention_case)
 *   that builds a random paged cache, runs pagedattn_forward and checks it against the reference;
 * - seeds (PAGEDATTN_TEST_SEED or std::random_device), backend selection
 *   (PAGEDATTN_TEST_BACKEND, default "cpu"), and device-memory hooks so the same cases run on GPU
 *   backends (tests/gpu registers the hooks; the core library links no GPU runtime).
 */
#ifndef PAGEDATTN_TEST_SUPPORT_H
#define PAGEDATTN_TEST_SUPPORT_H

#include <gtest/gtest.h>
#include <pagedattn/pagedattn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace pat {

/* ---- element conversions (written for the tests, independent of the library) ---- */
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
uint8_t f32_to_e4m3(float x); /* saturating to +-448, NaN -> NaN code */
float e4m3_to_f32(uint8_t b);
uint8_t f32_to_e5m2(float x); /* saturating to +-57344 */
float e5m2_to_f32(uint8_t b);

bool is_fp8(pagedattn_dtype dt);
size_t dtype_bytes(pagedattn_dtype dt);
/* Stores x rounded to dt at p; loads the element at p as float. */
void store(pagedattn_dtype dt, void* p, float x);
float load(pagedattn_dtype dt, const void* p);
/* Rounds x through dt (what storing then loading gives). */
float round_to(pagedattn_dtype dt, float x);
/* A NaN bit pattern of dt (for poisoning outputs): quiet NaNs with a payload no arithmetic
 * makes, so an output NaN that was written differs from one that was not; for fp8 0x7F. */
void store_poison(pagedattn_dtype dt, void* p);
pagedattn_dlpack_dtype dlpack_of(pagedattn_dtype dt);
const char* dtype_str(pagedattn_dtype dt);

/* ---- seeds ---- */
/* PAGEDATTN_TEST_SEED if set, else a fresh std::random_device value. */
uint64_t test_seed();
/* "seed=N (rerun: PAGEDATTN_TEST_SEED=N)" for SCOPED_TRACE; names the sample below too. */
std::string seed_note(uint64_t seed);
/* PAGEDATTN_TEST_SAMPLE=N (N > 1) makes the random-case loops run one case in N: those whose index
 * plus the master seed is a multiple of N (a loop of N cases or fewer runs one), so the seed
 * names the subset. The sanitizer builds of the emulated GPU suites set it (tests/gpusim); unset
 * or 1 runs every case. True when case `index` of `count` runs. */
bool case_sampled(uint64_t master, size_t index, size_t count);

/* ---- device memory (host on CPU; tests/gpu registers hooks for GPU device types) ---- */
struct device_hooks {
  int32_t device_type; /* PAGEDATTN_DEVICE_* these hooks serve */
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*to_device)(void* dst, const void* src, size_t bytes);
  void (*to_host)(void* dst, const void* src, size_t bytes);
};
/* Registers hooks for hooks->device_type (copied). CPU hooks are built in. */
void set_device_hooks(const device_hooks* hooks);
/* Hooks for a device type, or NULL if none is registered. */
const device_hooks* get_device_hooks(int32_t device_type);

/* A buffer in the memory of `device` with a host mirror. */
class DevBuf {
 public:
  DevBuf(pagedattn_device device, size_t bytes);
  ~DevBuf();
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* ptr() const { return dev_; }
  size_t bytes() const { return bytes_; }
  std::vector<uint8_t>& host() { return host_; }
  const std::vector<uint8_t>& host() const { return host_; }
  void upload();   /* host mirror -> device */
  void download(); /* device -> host mirror */
  pagedattn_device device() const { return device_; }

 private:
  pagedattn_device device_;
  const device_hooks* hooks_;
  size_t bytes_;
  void* dev_;
  std::vector<uint8_t> host_;
};

/* A [rows, heads, dim] tensor (or [rows, heads] with dim 0 given as has_dim=false) with chosen
 * strides and byte offset, living in device memory with a host mirror. */
class Tensor {
 public:
  /* row_stride/head_stride 0 = compact. */
  Tensor(pagedattn_device device, pagedattn_dtype dt, int64_t rows, int64_t heads, int64_t dim,
         int64_t row_stride = 0, int64_t head_stride = 0, uint64_t byte_offset = 0);
  /* A 2-D [rows, heads] tensor (lse). */
  static std::unique_ptr<Tensor> make2d(pagedattn_device device, pagedattn_dtype dt, int64_t rows,
                                        int64_t heads, int64_t row_stride = 0,
                                        int64_t head_stride = 0, uint64_t byte_offset = 0);
  /* A 1-D tensor of n elements. */
  static std::unique_ptr<Tensor> make1d(pagedattn_device device, pagedattn_dtype dt, int64_t n);
  void set(int64_t r, int64_t h, int64_t d, float x);
  float get(int64_t r, int64_t h, int64_t d) const;
  void set_raw(int64_t index_elems, const void* src);
  size_t elem_offset(int64_t r, int64_t h, int64_t d) const; /* in elements, from buffer start */
  void poison_all();                 /* every byte of the buffer: NaN pattern */
  /* True if every element outside the logical tensor still holds the poison pattern. */
  bool padding_untouched(std::string* why) const;
  void upload() { buf_.upload(); }
  void download() { buf_.download(); }
  pagedattn_tensor* t() { return &t_; }
  pagedattn_dtype dtype() const { return dt_; }
  int64_t rows() const { return rows_; }
  int64_t heads() const { return heads_; }
  int64_t dim() const { return dim_; }
  DevBuf& buf() { return buf_; }
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

 private:
  Tensor(pagedattn_device device, pagedattn_dtype dt, int ndim, int64_t rows, int64_t heads,
         int64_t dim, int64_t rs, int64_t hs, uint64_t off);
  pagedattn_dtype dt_;
  int ndim_;
  int64_t rows_, heads_, dim_, rs_, hs_;
  uint64_t off_;
  DevBuf buf_;
  pagedattn_tensor t_;
};

/* ---- backend selection ---- */
/* PAGEDATTN_TEST_BACKEND or "cpu". */
std::string backend_name();
/* Fixture: creates the selected backend in SetUp, skipping visibly ("skipped: no GPU",
 * "skipped: target X not supported here", missing device hooks) when it cannot run here. */
class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  pagedattn_backend* be = nullptr;
  pagedattn_capabilities caps{};
  pagedattn_device dev{PAGEDATTN_DEVICE_CPU, 0};
};

/* ---- the reference ---- */
struct RefParams {
  int H = 0, Hkv = 0, D = 0;
  double scale = 0;     /* already defaulted */
  double soft_cap = 0;  /* 0 off */
  int64_t window = 0;   /* 0 off */
  const float* alibi = nullptr; /* [H] or NULL */
  const float* sinks = nullptr; /* [H] or NULL: a logit per head in every row's softmax */
  int64_t chunk = 0;    /* attention chunk C > 0: keys with key / C == pos / C only */
  /* A tree mask over the new tokens (unpacked, [tree_q][tree_q] of 0/1, row: the query token),
   * whose first key is at position tree_ctx, or NULL. */
  const uint8_t* tree = nullptr;
  int64_t tree_ctx = 0, tree_q = 0;
  bool causal = true;
};
/* Float64 attention of nq queries (q: [nq][H][D], absolute positions qpos) over nk keys at
 * positions 0..nk-1 (k, v: [nk][Hkv][D]). out: [nq][H][D], lse: [nq][H] (-inf if no key). */
void ref_attend(const RefParams& p, int64_t nq, const float* q, const int64_t* qpos, int64_t nk,
                const float* k, const float* v, double* out, double* lse);

/* Tolerance on max|out-ref|/max|ref| for a model dtype and cache dtype (docs/semantics.md
 * section 7). */
double tolerance(pagedattn_dtype dtype, pagedattn_dtype cache_dtype);

/* Compares got against ref with tolerance tol on max|got-ref|/max|ref| over the finite
 * reference values; a non-finite reference value (a non-finite input, docs/semantics.md 5.9)
 * must be matched exactly (NaN by NaN, an infinity by the same infinity), and a NaN anywhere
 * else fails. */
::testing::AssertionResult check_close(const char* what, const std::vector<double>& ref,
                                       const std::vector<float>& got, double tol,
                                       double* err_out = nullptr);

/* ---- the attention case runner ---- */
struct SeqSpec {
  int32_t qlen = 1;
  int32_t ctx = 0;
  int32_t enc = 0; /* cross: encoder tokens */
};

/* One input element of a case overwritten after the random fill (for non-finite inputs): 'q'
 * is query `pos` of sequence `seq`; 'k' and 'v' are the key/value at absolute position `pos` of
 * the sequence (a context token the caller wrote before the step, or one of the step's own). h
 * is a query head for 'q' and a KV head for 'k'/'v'. */
struct Poke {
  char what = 'q';
  int seq = 0;
  int64_t pos = 0;
  int h = 0, d = 0;
  float value = 0;
};

struct AttnCase {
  pagedattn_dtype dtype = PAGEDATTN_DTYPE_FLOAT32;
  pagedattn_dtype cache_dtype = PAGEDATTN_DTYPE_INVALID; /* INVALID: same as dtype ("auto") */
  pagedattn_layout layout = PAGEDATTN_LAYOUT_NHD;
  int32_t block_size = 16;
  int32_t num_layers = 1;
  int32_t layer = 0;
  int32_t H = 4, Hkv = 4, D = 64;
  float scale = 0;
  float soft_cap = 0;
  int32_t window = 0;
  bool alibi = false;
  pagedattn_attention_type type = PAGEDATTN_ATTENTION_DECODER;
  bool write_kv = true;
  float k_scale = 1, v_scale = 1;
  bool sinks = false;        /* random sinks per query head (some -inf, some large) */
  int32_t chunk = 0;         /* attention_chunk */
  bool head_scales = false;  /* random per-KV-head k/v scales (fp8 caches use them), passed to
                                the forward and the caller's writes; the scalars then differ */
  bool sized_opts = true;    /* init the options with _init_sized (false: the 0.1 init) */
  bool tree = false;         /* random draft-tree masks (chains, empty segments, branching
                                trees) on the decoder sequences of more than one new token */
  bool lse = false;
  bool strided_io = false;   /* non-compact q/k/v/out/lse with byte offsets */
  bool wrap_cache = false;   /* cache over test memory with padded strides */
  bool caller_slots = false; /* pass the slot mapping in the batch desc */
  bool via_update = false;   /* plan a different step with spare capacity, then batch_update */
  int32_t spare_seqs = 2;    /* via_update: the first plan's sequences beyond the case's */
  bool seq_lens_form = false; /* describe the batch as seq_lens + query_start_loc (vLLM v1) */
  int32_t pad_rows = 0;      /* extra trailing rows of q/k/v/out/lse (a padded token count):
                                q/k/v's hold garbage, out/lse's must stay untouched */
  int32_t extra_blocks = 3;  /* blocks outside the batch */
  std::vector<SeqSpec> seqs;
  std::vector<Poke> pokes;   /* decoder and encoder cases */
  std::string describe() const;
};

struct CaseResult {
  double err = 0;     /* max|out-ref|/max|ref| */
  double lse_err = 0; /* max|lse-ref| / max(1,|ref|) */
};

/* Runs one case on `be` (device `dev`) with `seed`; checks out (every row written, padding
 * untouched), lse, and the whole cache image (only the step's slots of the given layer change,
 * to the right values). */
::testing::AssertionResult run_attention_case(pagedattn_backend* be, const AttnCase& c,
                                              uint64_t seed, CaseResult* res = nullptr);

/* Random sequences: ragged lengths incl. 1 and mid-block ends, shuffled order. */
std::vector<SeqSpec> random_decode_seqs(std::mt19937_64& rng, int n, int max_ctx);
std::vector<SeqSpec> random_prefill_seqs(std::mt19937_64& rng, int n, int max_q);
std::vector<SeqSpec> random_chunked_seqs(std::mt19937_64& rng, int n, int min_len, int max_len);
std::vector<SeqSpec> random_mixed_seqs(std::mt19937_64& rng, int n, int max_q, int max_ctx,
                                       bool idle_entries);

/* Helpers for refusal tests. */
std::string last_error();
/* Expects status st and a last_error containing `needle` (case-insensitive). */
::testing::AssertionResult status_is(pagedattn_status got, pagedattn_status want,
                                     const std::string& needle = "");

}  // namespace pat

#endif /* PAGEDATTN_TEST_SUPPORT_H */
