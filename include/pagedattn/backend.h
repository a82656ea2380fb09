/* pagedattn/backend.h — listing, creating and querying backends.
 *
 * A backend is one compute device driven by one implementation: "cpu" (portable SIMD, built into
 * the core), "onednn" (plugin), "cuda" (plugin), "hip" (plugin). "auto" picks the best available
 * one. Plugins are shared objects named libpagedattn-<name>.so, searched first in each directory
 * of the environment variable PAGEDATTN_PLUGIN_PATH (colon-separated), then beside the core
 * library. They are loaded on first use and must match the core's plugin ABI version.
 *
 * Thread safety: a backend handle may be used from many threads at once for calls on distinct
 * batches, outputs and cache regions (see each call). Creating and destroying backends is
 * thread-safe; destroying a backend while another thread uses it, or before the caches and
 * batches created from it, is a caller error (the latter is detected: see destroy).
 */
#ifndef PAGEDATTN_BACKEND_H
#define PAGEDATTN_BACKEND_H

#include "pagedattn/common.h"
#include "pagedattn/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pagedattn_backend pagedattn_backend;

/* Feature bits reported in pagedattn_capabilities.features. */
#define PAGEDATTN_FEATURE_ALIBI (1u << 0)
#define PAGEDATTN_FEATURE_SOFT_CAP (1u << 1)
#define PAGEDATTN_FEATURE_SLIDING_WINDOW (1u << 2)
#define PAGEDATTN_FEATURE_CROSS_ATTENTION (1u << 3)
#define PAGEDATTN_FEATURE_ENCODER (1u << 4)       /* encoder and encoder-only attention */
#define PAGEDATTN_FEATURE_FP8_CACHE (1u << 5)     /* fp8 e4m3 / e5m2 caches */
#define PAGEDATTN_FEATURE_LSE (1u << 6)           /* log-sum-exp output */
#define PAGEDATTN_FEATURE_MERGE_STATES (1u << 7)
#define PAGEDATTN_FEATURE_CHUNKED_PREFILL (1u << 8) /* query_len > 1 with context_len > 0 */
#define PAGEDATTN_FEATURE_HOST_SWAP (1u << 9)     /* swap between device and host caches */
#define PAGEDATTN_FEATURE_GRAPH_CAPTURE (1u << 10) /* forward is capturable in a CUDA/HIP graph */
#define PAGEDATTN_FEATURE_WRAP_CACHE (1u << 11)   /* caches over caller memory */
/* Since 0.2: */
#define PAGEDATTN_FEATURE_SINKS (1u << 12)        /* attention sinks (options.sinks) */
#define PAGEDATTN_FEATURE_CHUNKED_LOCAL (1u << 13) /* options.attention_chunk */
#define PAGEDATTN_FEATURE_HEAD_SCALES (1u << 14)  /* per-KV-head fp8 scales (options, writes) */
#define PAGEDATTN_FEATURE_TREE_MASK (1u << 15)    /* speculative-decoding tree masks (batch) */
#define PAGEDATTN_FEATURE_MLA (1u << 16)          /* latent caches, pagedattn_forward_mla */

/* What a backend can do, so a caller can decide before calling. */
typedef struct pagedattn_capabilities {
  uint32_t struct_size;      /* in: sizeof(pagedattn_capabilities) */
  const char* name;          /* "cpu", "onednn", "cuda", "hip"; static string */
  pagedattn_device device;   /* where tensors and caches must live */
  uint32_t features;         /* PAGEDATTN_FEATURE_* */
  uint32_t dtypes;           /* q/k/v/out types: PAGEDATTN_DTYPE_BIT(PAGEDATTN_DTYPE_*) */
  uint32_t cache_dtypes;     /* cache types: PAGEDATTN_DTYPE_BIT(...) */
  uint32_t layouts;          /* bit PAGEDATTN_LAYOUT_* (1u << layout) */
  uint32_t block_sizes;      /* bit k set = block size 2^k supported (k = 0..8) */
  uint32_t head_sizes;       /* bit i set = head size 8*(i+1) supported (8..256) */
  int32_t max_num_threads;   /* CPU: worker threads in use; GPU: 0 */
  uint64_t total_memory;     /* bytes of device memory (GPU), 0 if unknown / host */
  /* Since 0.2 (a caller built against 0.1 passes the shorter struct_size and gets the fields
   * above). Both strings are owned by the backend and valid until it is destroyed. */
  const char* target;        /* the code path the backend runs, which decides how results round:
                                on CPU backends the SIMD target, spelled as PAGEDATTN_CPU_TARGET
                                takes it ("AVX3_AMX", "AVX3_BF16", "AVX3", "AVX2", "SSE4"...);
                                on GPU backends the device architecture ("sm_90", "gfx942") */
  const char* settings;      /* one line: what the backend chose when it was created and the
                                value of every environment variable it read, e.g. "target
                                AVX3_BF16 (best runnable; PAGEDATTN_CPU_TARGET unset), prefetch
                                twice, 2 threads, PAGEDATTN_CPU_SPIN_US=100" */
  uint32_t latent_sizes;     /* latent (MLA) caches: bit i set = row size 32*(i+1) supported
                                (32..1024); 0 without PAGEDATTN_FEATURE_MLA. The value sizes a
                                row size takes are in docs/semantics.md section 8. */
} pagedattn_capabilities;

/* Options for pagedattn_backend_create. Initialise with pagedattn_backend_options_init. */
typedef struct pagedattn_backend_options {
  uint32_t struct_size;   /* sizeof(pagedattn_backend_options) */
  int32_t device_index;   /* GPU ordinal; 0 on CPU */
  int32_t num_threads;    /* CPU backends: worker threads, 0 = one per online core */
  uint32_t flags;         /* reserved, must be 0 */
  /* Upper bound on bytes this backend may hold for caches, batch metadata and batch workspaces
   * together (0 = unlimited; pagedattn_backend_get_memory_usage reports the sum). An allocation
   * beyond it fails with PAGEDATTN_ERROR_OUT_OF_MEMORY. */
  uint64_t memory_limit;
} pagedattn_backend_options;

/* Fills *opts with defaults (device 0, all cores, no limit) and sets struct_size.
 * Returns PAGEDATTN_ERROR_NULL_POINTER if opts is NULL. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_options_init(pagedattn_backend_options* opts);

/* One entry of the backend list. Strings are static and owned by the library. */
typedef struct pagedattn_backend_info {
  uint32_t struct_size; /* in: sizeof(pagedattn_backend_info) */
  const char* name;     /* "cpu", "onednn", "cuda", "hip" */
  int32_t available;    /* 1 if pagedattn_backend_create(name) can succeed with device 0 */
  const char* reason;   /* why it is unavailable ("" when available), e.g. the plugin's path and
                           dlopen's message, or "no CUDA device: cudaGetDeviceCount returned 100" */
} pagedattn_backend_info;

/* Number of backends pagedattn knows of (available or not). Thread-safe; cannot fail. */
PAGEDATTN_API int32_t pagedattn_backend_count(void);

/* Describes backend number `index` (0 <= index < pagedattn_backend_count()), loading and probing
 * its plugin if needed. Returns PAGEDATTN_ERROR_NULL_POINTER, PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_OUT_OF_RANGE (bad index). An unavailable backend is not an error: available
 * is 0 and reason says why. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_get_info(pagedattn_backend_info* out,
                                                         int32_t index);

/* Creates a backend by name: "cpu", "onednn", "cuda", "hip", or "auto" (the first that can be
 * created of cuda, hip, onednn, cpu: onednn shares the cpu kernels for decode, for fp8 caches
 * on CPUs with bf16 dot products and for steps its tiles would run in float32, and is faster
 * for bf16 prefill chunks, so it is preferred whenever its plugin loads — see README). opts may be NULL
 * for defaults. On success *out owns a new handle; free it with pagedattn_backend_destroy.
 * CPU backends keep num_threads - 1 worker threads; after a call they spin for
 * PAGEDATTN_CPU_SPIN_US microseconds (default 100, read here; see README) before they sleep.
 * Returns: PAGEDATTN_ERROR_NULL_POINTER (out or name), PAGEDATTN_ERROR_STRUCT_SIZE,
 * PAGEDATTN_ERROR_INVALID_ARGUMENT (negative thread count or device index, flags != 0,
 * PAGEDATTN_CPU_SPIN_US not a whole number in 0..1000000),
 * PAGEDATTN_ERROR_UNKNOWN_BACKEND, PAGEDATTN_ERROR_BACKEND_UNAVAILABLE (no such device, no
 * driver, a device index other than 0 on a CPU backend, oneDNN failing to initialise),
 * PAGEDATTN_ERROR_PLUGIN / PAGEDATTN_ERROR_PLUGIN_ABI (the message names the file),
 * PAGEDATTN_ERROR_UNSUPPORTED (cpu, onednn: PAGEDATTN_CPU_TARGET names a SIMD target this build
 * cannot run on this CPU), PAGEDATTN_ERROR_OUT_OF_MEMORY (host memory, worker threads, device
 * memory), PAGEDATTN_ERROR_DEVICE. With "auto", the status of the last candidate tried (cpu) and
 * a message listing why each candidate failed. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_create(pagedattn_backend** out, const char* name,
                                                       const pagedattn_backend_options* opts);

/* Destroys a backend. NULL is a no-op. All caches and batches created from it must be destroyed
 * first; if some are still alive the backend is kept alive until the last one is destroyed
 * (reference-counted), so out-of-order destruction never crashes. Waits for none of the caller's
 * streams: synchronise them first. Not thread-safe with other calls on the same backend. */
PAGEDATTN_API void pagedattn_backend_destroy(pagedattn_backend* backend);

/* Fills *out (up to out->struct_size bytes) with the backend's capabilities. Returns
 * PAGEDATTN_ERROR_NULL_POINTER, PAGEDATTN_ERROR_STRUCT_SIZE, PAGEDATTN_ERROR_INVALID_HANDLE.
 * Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_get_capabilities(
    pagedattn_capabilities* out, const pagedattn_backend* backend);

/* Memory a backend holds now (pagedattn_backend_get_memory_usage). */
typedef struct pagedattn_memory_usage {
  uint32_t struct_size;  /* in: sizeof(pagedattn_memory_usage) */
  uint64_t bytes_in_use; /* caches it allocated (not caches over caller memory), batch metadata
                            and batch workspaces, on the device and in host memory: what
                            memory_limit bounds */
  uint64_t memory_limit; /* the backend's memory_limit; 0 = unlimited */
  int32_t num_caches;    /* caches created from the backend and not yet destroyed */
  int32_t num_batches;   /* batches likewise */
} pagedattn_memory_usage;

/* Fills *out (up to out->struct_size bytes) with what `backend` holds at the time of the call;
 * with other threads allocating, the figures are a snapshot. Returns PAGEDATTN_ERROR_NULL_POINTER
 * (out, backend), PAGEDATTN_ERROR_STRUCT_SIZE, PAGEDATTN_ERROR_INVALID_HANDLE. Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_get_memory_usage(
    pagedattn_memory_usage* out, const pagedattn_backend* backend);

/* Waits until all work pagedattn queued on `stream` (NULL = default stream) has finished, and
 * reports an asynchronous device error if one occurred. CPU backends run synchronously, so this
 * returns PAGEDATTN_OK at once for a valid backend. Returns PAGEDATTN_ERROR_NULL_POINTER
 * (backend), PAGEDATTN_ERROR_INVALID_HANDLE (backend destroyed or not a backend),
 * PAGEDATTN_ERROR_DEVICE (GPU: the stream synchronisation failed, e.g. an earlier kernel faulted).
 * Thread-safe. */
PAGEDATTN_API pagedattn_status pagedattn_backend_synchronize(pagedattn_backend* backend,
                                                            void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PAGEDATTN_BACKEND_H */
