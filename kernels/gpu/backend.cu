// backend.cu — the GPU backend's glue: pa_backend_ops over the CUDA or HIP runtime.
//
// Host side only: device state, memory, capabilities, cache attachment, the batch plan's device
// buffer (its contents come from schedule.cu) and launches. The core has validated every
// argument before an op runs.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu_kernels.h"
#include "instantiations.h"
#include "plugin_abi.h"
#include "schedule.h"

using namespace pagedattn_gpu;

namespace {
constexpr bool same_code(int32_t elem, pagedattn_dtype dt) {
  return elem == static_cast<int32_t>(dt);
}
}  // namespace
static_assert(same_code(kF32, PAGEDATTN_DTYPE_FLOAT32) &&
                  same_code(kF16, PAGEDATTN_DTYPE_FLOAT16) &&
                  same_code(kBF16, PAGEDATTN_DTYPE_BFLOAT16) &&
                  same_code(kE4M3, PAGEDATTN_DTYPE_FP8_E4M3) &&
                  same_code(kE5M2, PAGEDATTN_DTYPE_FP8_E5M2),
              "gpu_kernels.h element codes must be the pagedattn_dtype values");

void pagedattn_gpu::set_msg(char* msg, const char* fmt, ...) {
  if (!msg) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, PA_MSG_LEN, fmt, ap);
  va_end(ap);
}

namespace {

// Maps a runtime error to a status, naming the call, and clears the runtime's sticky-free error.
pagedattn_status dev_error(gpuError_t e, const char* what, char* msg) {
  (void)gpuGetLastError();
  set_msg(msg, "%s: %s (%d)", what, gpuGetErrorString(e), static_cast<int>(e));
  if (e == gpuErrorMemoryAllocation) return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  return PAGEDATTN_ERROR_DEVICE;
}

#define PA_CHECK(call, what)                                  \
  do {                                                        \
    gpuError_t e_ = (call);                                   \
    if (e_ != gpuSuccess) return dev_error(e_, (what), msg);  \
  } while (0)

struct State {
  int device = 0;
  int sm_count = 1;
  int64_t smem_per_block = 0;  // opt-in dynamic shared memory per block
  bool matrix_cores = false;   // AMD CDNA2+: 16-bit tiles take the MFMA kernel
  uint64_t total_memory = 0;
  uint64_t limit = 0;
  std::atomic<uint64_t> used{0};
  std::string target;    // pagedattn_capabilities.target: "sm_90", "gfx942"
  std::string settings;  // pagedattn_capabilities.settings
  std::mutex mu;
  std::unordered_map<void*, size_t> sizes;  // allocation sizes, for the memory limit
};

// Makes the backend's device current for the calling thread and restores the caller's after.
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int dev) {
    if (gpuGetDevice(&prev) != gpuSuccess) prev = -1;
    if (prev != dev) (void)gpuSetDevice(dev);
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev >= 0 && gpuGetDevice(&cur) == gpuSuccess && cur != prev) (void)gpuSetDevice(prev);
  }
};

bool reserve(State* s, uint64_t bytes, char* msg) {
  if (s->limit == 0) {
    s->used += bytes;
    return true;
  }
  uint64_t cur = s->used.load();
  do {
    if (cur + bytes > s->limit || cur + bytes < cur) {
      set_msg(msg, "memory limit: %llu bytes requested, %llu of %llu in use",
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(cur),
              static_cast<unsigned long long>(s->limit));
      return false;
    }
  } while (!s->used.compare_exchange_weak(cur, cur + bytes));
  return true;
}

size_t elem_size(pagedattn_dtype t) {
  switch (t) {
    case PAGEDATTN_DTYPE_FLOAT32: return 4;
    case PAGEDATTN_DTYPE_FLOAT16:
    case PAGEDATTN_DTYPE_BFLOAT16: return 2;
    default: return 1;
  }
}

// The widest access (16, 8, 4, 2 or 1 bytes) that divides every byte quantity given.
int widest_vec(std::initializer_list<uint64_t> quantities) {
  int v = 16;
  for (uint64_t q : quantities)
    while (v > 1 && (q % static_cast<uint64_t>(v)) != 0) v /= 2;
  return v;
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

// The device's architecture as capabilities.target names it: sm_XY, or gfxNNN (the part of
// gcnArchName "gfx942:sramecc+:xnack-" before the feature flags).
std::string device_target(const gpuDeviceProp& prop) {
#if defined(PA_TARGET_GFX)
  const std::string arch(prop.gcnArchName);
  return arch.substr(0, arch.find(':'));
#else
  return "sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
#endif
}

pagedattn_status probe(int32_t device_index, char* msg) {
  int n = 0;
  gpuError_t e = gpuGetDeviceCount(&n);
  if (e != gpuSuccess) {
    (void)gpuGetLastError();
    set_msg(msg, "%sGetDeviceCount: %s (%d)", PA_RUNTIME_NAME, gpuGetErrorString(e),
            static_cast<int>(e));
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
  if (device_index < 0 || device_index >= n) {
    set_msg(msg, "device %d requested, %d %s device(s) present", device_index, n, PA_RUNTIME_NAME);
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
  gpuDeviceProp prop;
  e = gpuGetDeviceProperties(&prop, device_index);
  if (e != gpuSuccess) {
    (void)gpuGetLastError();
    set_msg(msg, "%sGetDeviceProperties(%d): %s (%d)", PA_RUNTIME_NAME, device_index,
            gpuGetErrorString(e), static_cast<int>(e));
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
#if !defined(PA_TARGET_GFX)
  if (prop.major < 8) {
    set_msg(msg, "device %d (%s) has compute capability %d.%d; the plugin is built for 8.0+",
            device_index, prop.name, prop.major, prop.minor);
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
#endif
  // A device the plugin carries no code object for would fail every launch: the runtime says
  // so when asked for a kernel's attributes.
  {
    DeviceGuard g(device_index);
    gpuFuncAttributes attr;
    e = kernel_attributes(&attr);
    if (e != gpuSuccess) {
      (void)gpuGetLastError();
      set_msg(msg, "device %d (%s, %s) cannot run this plugin's kernels: %s (%d); the plugin "
              "carries code for %s",
              device_index, prop.name, device_target(prop).c_str(), gpuGetErrorString(e),
              static_cast<int>(e), PA_GPU_CODE_OBJECTS);
      return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
    }
  }
  // Nor may the largest attention tile ask for more shared memory than a block can have.
  const size_t need = pagedattn_gpu::attention_smem_need();
  if (PA_SMEM_PER_BLOCK(prop) < need) {
    set_msg(msg, "device %d (%s, %s) gives a block at most %zu bytes of shared memory; this "
            "plugin's attention tiles need up to %zu",
            device_index, prop.name, device_target(prop).c_str(),
            static_cast<size_t>(PA_SMEM_PER_BLOCK(prop)), need);
    return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
  }
  return PAGEDATTN_OK;
}

pagedattn_status create(void** out, const pagedattn_backend_options* opts, char* msg) {
  pagedattn_status st = probe(opts->device_index, msg);
  if (st != PAGEDATTN_OK) return st;
  State* s = new (std::nothrow) State();
  if (!s) {
    set_msg(msg, "out of host memory creating the %s backend", PA_RUNTIME_NAME);
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
  s->device = opts->device_index;
  s->limit = opts->memory_limit;
  gpuDeviceProp prop;
  gpuError_t e = gpuGetDeviceProperties(&prop, s->device);
  if (e != gpuSuccess) {
    delete s;
    return dev_error(e, "GetDeviceProperties", msg);
  }
  s->sm_count = std::max(1, prop.multiProcessorCount);
  s->smem_per_block = static_cast<int64_t>(PA_SMEM_PER_BLOCK(prop));
  s->total_memory = prop.totalGlobalMem;
  try {
    s->target = device_target(prop);
    s->matrix_cores = s->target == "gfx90a" || s->target == "gfx940" ||
                      s->target == "gfx941" || s->target == "gfx942";
    char line[512];
    snprintf(line, sizeof line,
             "device %d: %s (%s), %d multiprocessors, %.1f GiB; code objects %s", s->device,
             prop.name, s->target.c_str(), s->sm_count,
             static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
             PA_GPU_CODE_OBJECTS);
    s->settings = line;
  } catch (...) {
    delete s;
    set_msg(msg, "out of host memory creating the %s backend", PA_RUNTIME_NAME);
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
  *out = s;
  return PAGEDATTN_OK;
}

void destroy(void* state) { delete static_cast<State*>(state); }

void get_capabilities(void* state, pagedattn_capabilities* caps) {
  State* s = static_cast<State*>(state);
  caps->name = PA_RUNTIME_NAME;
  caps->device.device_type = PA_DEVICE_TYPE;
  caps->device.device_id = s->device;
  caps->features = PAGEDATTN_FEATURE_ALIBI | PAGEDATTN_FEATURE_SOFT_CAP |
                   PAGEDATTN_FEATURE_SLIDING_WINDOW | PAGEDATTN_FEATURE_CROSS_ATTENTION |
                   PAGEDATTN_FEATURE_ENCODER | PAGEDATTN_FEATURE_FP8_CACHE |
                   PAGEDATTN_FEATURE_LSE | PAGEDATTN_FEATURE_MERGE_STATES |
                   PAGEDATTN_FEATURE_CHUNKED_PREFILL | PAGEDATTN_FEATURE_HOST_SWAP |
                   PAGEDATTN_FEATURE_GRAPH_CAPTURE | PAGEDATTN_FEATURE_WRAP_CACHE |
                   PAGEDATTN_FEATURE_SINKS | PAGEDATTN_FEATURE_CHUNKED_LOCAL |
                   PAGEDATTN_FEATURE_HEAD_SCALES | PAGEDATTN_FEATURE_TREE_MASK |
                   PAGEDATTN_FEATURE_MLA;
  // Latent (MLA) caches: rows of kMlaRow (DeepSeek V2/V3, Kimi K2: 512 values + 64 rotary).
  caps->latent_sizes = 1u << (kMlaRow / 32 - 1);
  // The dtypes and the largest head size come from instantiations.h.
#define PA_DTYPE_BIT(CODE, ...) | PAGEDATTN_DTYPE_BIT(CODE)
  caps->dtypes = 0u PA_GPU_DTYPES(PA_DTYPE_BIT, );
  caps->cache_dtypes = caps->dtypes PA_GPU_FP8_DTYPES(PA_DTYPE_BIT, );
#undef PA_DTYPE_BIT
  caps->layouts = (1u << PAGEDATTN_LAYOUT_NHD) | (1u << PAGEDATTN_LAYOUT_HND);
  caps->block_sizes = 0x1ffu;  // 1..256: tables are read per key, any power of two works
  // Every multiple of 8 up to PA_GPU_MAX_HEAD_SIZE (bit i = head size 8 * (i + 1)).
  caps->head_sizes = PA_GPU_MAX_HEAD_SIZE >= 256 ? 0xffffffffu
                                                 : (1u << (PA_GPU_MAX_HEAD_SIZE / 8)) - 1u;
  caps->max_num_threads = 0;
  caps->total_memory = s->total_memory;
  caps->target = s->target.c_str();
  caps->settings = s->settings.c_str();
}

// ---------------------------------------------------------------------------------------------
// Memory

pagedattn_status alloc(void* state, size_t bytes, int32_t host, void** ptr, char* msg) {
  State* s = static_cast<State*>(state);
  if (bytes == 0) bytes = 1;
  if (!reserve(s, bytes, msg)) return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  DeviceGuard g(s->device);
  void* p = nullptr;
  gpuError_t e = host ? gpuHostAlloc(&p, bytes) : gpuMalloc(&p, bytes);
  if (e == gpuSuccess) {
    if (host) {
      memset(p, 0, bytes);
    } else {
      // cudaMemset is asynchronous on the legacy stream: finish it before a caller's
      // non-blocking stream can touch the memory.
      e = gpuMemset(p, 0, bytes);
      if (e == gpuSuccess) e = gpuStreamSynchronize(nullptr);
    }
    if (e != gpuSuccess) {
      if (host) (void)gpuFreeHost(p);
      else (void)gpuFree(p);
    }
  }
  if (e != gpuSuccess) {
    s->used -= bytes;
    pagedattn_status st = dev_error(e, host ? "pinned host allocation" : "device allocation", msg);
    return st == PAGEDATTN_ERROR_DEVICE ? PAGEDATTN_ERROR_OUT_OF_MEMORY : st;
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->sizes[p] = bytes;
  }
  *ptr = p;
  return PAGEDATTN_OK;
}

void free_mem(void* state, void* ptr, int32_t host) {
  if (!ptr) return;
  State* s = static_cast<State*>(state);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    auto it = s->sizes.find(ptr);
    if (it != s->sizes.end()) {
      s->used -= it->second;
      s->sizes.erase(it);
    }
  }
  DeviceGuard g(s->device);
  if (host) (void)gpuFreeHost(ptr);
  else (void)gpuFree(ptr);
}

// Per-cache state: device arrays of the layer pointers, so copy_blocks does all layers in one
// launch.
struct CacheData {
  void** k_layers = nullptr;  // device [num_layers]
  void** v_layers = nullptr;
};

bool on_device(const pa_cache* c) { return !c->host && c->device.device_type == PA_DEVICE_TYPE; }

pagedattn_status cache_attach(void* state, pa_cache* cache, char* msg) {
  State* s = static_cast<State*>(state);
  cache->backend_data = nullptr;
  if (!on_device(cache)) return PAGEDATTN_OK;
  DeviceGuard g(s->device);
  const size_t n = static_cast<size_t>(cache->num_layers);
  void** dev = nullptr;
  PA_CHECK(gpuMalloc(reinterpret_cast<void**>(&dev), 2 * n * sizeof(void*)), "layer pointer array");
  std::vector<void*> host(2 * n);
  for (size_t l = 0; l < n; ++l) {
    host[l] = cache->k_layers[l];
    host[n + l] = cache->v_layers[l];
  }
  gpuError_t e = gpuMemcpy(dev, host.data(), 2 * n * sizeof(void*), gpuMemcpyHostToDevice);
  if (e == gpuSuccess) e = gpuStreamSynchronize(nullptr);  // pageable copies may still be in DMA
  CacheData* cd = (e == gpuSuccess) ? new (std::nothrow) CacheData() : nullptr;
  if (!cd) {
    (void)gpuFree(dev);
    if (e != gpuSuccess) return dev_error(e, "layer pointer copy", msg);
    set_msg(msg, "out of host memory attaching a cache");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
  cd->k_layers = dev;
  cd->v_layers = dev + n;
  cache->backend_data = cd;
  return PAGEDATTN_OK;
}

void cache_detach(void* state, pa_cache* cache) {
  CacheData* cd = static_cast<CacheData*>(cache->backend_data);
  if (!cd) return;
  DeviceGuard g(static_cast<State*>(state)->device);
  (void)gpuFree(cd->k_layers);
  delete cd;
  cache->backend_data = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Cache operations

// Fills the cache-write parameters of write a: the k/v tensors, the layer's K/V bases and
// strides, the fp8 scales (scalar or per head), and vec8 (1 when every 8-element group of both
// sides is aligned for a vector access). The slots and the row count are the caller's to set.
void fill_write_params(WriteParams* p, const pa_write_args& a) {
  const pa_cache* c = a.cache;
  const pa_tensor3& k = a.k;
  const pa_tensor3& v = a.v;
  const int32_t layer = a.layer;
  const size_t ce = elem_size(c->dtype), te = elem_size(k.dtype);
  memset(static_cast<void*>(p), 0, sizeof(*p));
  p->k = k.data;
  p->v = v.data;
  p->k_row = k.row_stride;
  p->k_head = k.head_stride;
  p->v_row = v.row_stride;
  p->v_head = v.head_stride;
  p->ck = c->k_layers[layer];
  p->cv = c->v_layers[layer];
  p->block_stride = c->block_stride;
  p->slot_stride = c->slot_stride;
  p->head_stride = c->head_stride;
  p->num_slots = static_cast<int64_t>(c->num_blocks) * c->block_size;
  p->block_size = c->block_size;
  p->heads = c->num_kv_heads;
  p->dim = c->head_size;
  p->k_scale = a.k_scale;
  p->v_scale = a.v_scale;
  p->k_head_scales = a.k_head_scales;
  p->v_head_scales = a.v_head_scales;
  const int cache_vec = widest_vec({reinterpret_cast<uintptr_t>(p->ck),
                                    reinterpret_cast<uintptr_t>(p->cv),
                                    static_cast<uint64_t>(c->block_stride) * ce,
                                    static_cast<uint64_t>(c->slot_stride) * ce,
                                    static_cast<uint64_t>(c->head_stride) * ce});
  const int rows_vec = widest_vec({reinterpret_cast<uintptr_t>(p->k),
                                   reinterpret_cast<uintptr_t>(p->v),
                                   static_cast<uint64_t>(p->k_row) * te,
                                   static_cast<uint64_t>(p->k_head) * te,
                                   static_cast<uint64_t>(p->v_row) * te,
                                   static_cast<uint64_t>(p->v_head) * te});
  p->vec8 = (cache_vec >= static_cast<int>(std::min<uint64_t>(8 * ce, 16)) &&
             rows_vec >= static_cast<int>(std::min<uint64_t>(8 * te, 16)))
                ? 1 : 0;
  if (c->latent) {
    // k holds each row's leading k.dim values and v the rest, or k whole rows (v absent).
    p->latent_k = v.data ? k.dim : c->head_size;
    if (p->latent_k % 8 != 0) p->vec8 = 0;  // v's groups would start unaligned
  }
}

pagedattn_status cache_write(void* state, const pa_write_args* a, char* msg) {
  State* s = static_cast<State*>(state);
  DeviceGuard g(s->device);
  const pa_cache* c = a->cache;
  const size_t te = elem_size(a->k.dtype);
  WriteParams p;
  fill_write_params(&p, *a);
  gpuStream_t stream = static_cast<gpuStream_t>(a->stream);
  if (a->slots_on_device) {
    p.slots = a->slots;
    p.slots_int64 = a->slots_int64;
    p.n = a->n;
    PA_CHECK(launch_cache_write(a->k.dtype, c->dtype, a->n, p, stream), "cache write launch");
    return PAGEDATTN_OK;
  }
  // Host slots: chunks travel in the kernel parameters.
  const char* kbase = static_cast<const char*>(a->k.data);
  const char* vbase = static_cast<const char*>(a->v.data);
  for (int64_t r0 = 0; r0 < a->n; r0 += kInlineSlots) {
    const int64_t cnt = std::min<int64_t>(kInlineSlots, a->n - r0);
    for (int64_t i = 0; i < cnt; ++i)
      p.inline_slots[i] = a->slots_int64 ? static_cast<const int64_t*>(a->slots)[r0 + i]
                                         : static_cast<const int32_t*>(a->slots)[r0 + i];
    p.slots = nullptr;
    p.n = cnt;
    p.k = kbase + r0 * a->k.row_stride * static_cast<int64_t>(te);
    p.v = vbase ? vbase + r0 * a->v.row_stride * static_cast<int64_t>(te) : nullptr;
    PA_CHECK(launch_cache_write(a->k.dtype, c->dtype, cnt, p, stream), "cache write launch");
  }
  return PAGEDATTN_OK;
}

bool compact(const pa_cache* c) {
  const int64_t hd = c->head_size, bs = c->block_size, h = c->num_kv_heads;
  if (c->block_stride != bs * h * hd) return false;
  if (c->layout == PAGEDATTN_LAYOUT_NHD) return c->slot_stride == h * hd && c->head_stride == hd;
  return c->head_stride == bs * hd && c->slot_stride == hd;
}

// Copies one block (one layer, K or V) between two caches of equal geometry, any strides.
gpuError_t copy_block(const pa_cache* dst, void* dbase, int64_t dblk, const pa_cache* src,
                      const void* sbase, int64_t sblk, gpuStream_t stream) {
  const size_t es = elem_size(src->dtype);
  char* d = static_cast<char*>(dbase) + dblk * dst->block_stride * static_cast<int64_t>(es);
  const char* s = static_cast<const char*>(sbase) + sblk * src->block_stride * static_cast<int64_t>(es);
  if (compact(dst) && compact(src) && dst->layout == src->layout)
    return gpuMemcpyAsync(d, s, static_cast<size_t>(src->block_stride) * es, gpuMemcpyDefault, stream);
  const size_t width = static_cast<size_t>(src->head_size) * es;
  for (int32_t h = 0; h < src->num_kv_heads; ++h) {
    gpuError_t e = gpuMemcpy2DAsync(d + h * dst->head_stride * static_cast<int64_t>(es),
                                    static_cast<size_t>(dst->slot_stride) * es,
                                    s + h * src->head_stride * static_cast<int64_t>(es),
                                    static_cast<size_t>(src->slot_stride) * es, width,
                                    static_cast<size_t>(src->block_size), gpuMemcpyDefault, stream);
    if (e != gpuSuccess) return e;
  }
  return gpuSuccess;
}

pagedattn_status swap_blocks(void* state, const pa_cache* dst, const pa_cache* src,
                             const int32_t* pairs, size_t n, void* stream, char* msg) {
  DeviceGuard g(static_cast<State*>(state)->device);
  gpuStream_t st = static_cast<gpuStream_t>(stream);
  const bool whole = compact(dst) && compact(src) && dst->layout == src->layout;
  const size_t bytes = static_cast<size_t>(src->block_stride) * elem_size(src->dtype);
  const int planes = src->latent ? 1 : 2;  // a latent cache's rows move once
  for (int32_t l = 0; l < src->num_layers; ++l) {
    for (int kv = 0; kv < planes; ++kv) {
      void* db = kv ? dst->v_layers[l] : dst->k_layers[l];
      const void* sb = kv ? src->v_layers[l] : src->k_layers[l];
      size_t i = 0;
      while (i < n) {
        // Runs of consecutive source and destination ids move as one copy.
        size_t run = 1;
        if (whole)
          while (i + run < n && pairs[2 * (i + run)] == pairs[2 * i] + static_cast<int32_t>(run) &&
                 pairs[2 * (i + run) + 1] == pairs[2 * i + 1] + static_cast<int32_t>(run))
            ++run;
        if (whole) {
          PA_CHECK(gpuMemcpyAsync(static_cast<char*>(db) + pairs[2 * i + 1] * bytes,
                                  static_cast<const char*>(sb) + pairs[2 * i] * bytes, run * bytes,
                                  gpuMemcpyDefault, st),
                   "swap copy");
        } else {
          PA_CHECK(copy_block(dst, db, pairs[2 * i + 1], src, sb, pairs[2 * i], st), "swap copy");
        }
        i += run;
      }
    }
  }
  return PAGEDATTN_OK;
}

pagedattn_status copy_blocks(void* state, const pa_cache* cache, const int32_t* pairs, size_t n,
                             void* stream, char* msg) {
  const CacheData* cd = static_cast<const CacheData*>(cache->backend_data);
  if (!cd) return swap_blocks(state, cache, cache, pairs, n, stream, msg);  // host caches
  DeviceGuard g(static_cast<State*>(state)->device);
  const int es = static_cast<int>(elem_size(cache->dtype));
  CopyParams p;
  memset(static_cast<void*>(&p), 0, sizeof(p));
  p.k_layers = cd->k_layers;
  p.v_layers = cd->v_layers;
  p.block_stride = cache->block_stride;
  p.slot_stride = cache->slot_stride;
  p.head_stride = cache->head_stride;
  p.num_layers = cache->num_layers;
  p.block_size = cache->block_size;
  p.heads = cache->num_kv_heads;
  p.row_bytes = cache->head_size * es;
  p.elem_bytes = es;
  p.planes = cache->latent ? 1 : 2;
  std::initializer_list<uint64_t> q = {static_cast<uint64_t>(p.row_bytes),
                                       static_cast<uint64_t>(cache->block_stride) * es,
                                       static_cast<uint64_t>(cache->slot_stride) * es,
                                       static_cast<uint64_t>(cache->head_stride) * es};
  int vec = widest_vec(q);
  for (int32_t l = 0; l < cache->num_layers; ++l)
    vec = std::min(vec, widest_vec({reinterpret_cast<uintptr_t>(cache->k_layers[l]),
                                    reinterpret_cast<uintptr_t>(cache->v_layers[l])}));
  p.vec = vec;
  for (size_t i0 = 0; i0 < n; i0 += kCopyPairsPerLaunch) {
    const size_t cnt = std::min<size_t>(kCopyPairsPerLaunch, n - i0);
    p.num_pairs = static_cast<int32_t>(cnt);
    memcpy(p.pairs, pairs + 2 * i0, 2 * cnt * sizeof(int32_t));
    PA_CHECK(launch_copy_blocks(p, static_cast<gpuStream_t>(stream)), "copy_blocks launch");
  }
  return PAGEDATTN_OK;
}

// read_blocks' packed record: per id, per layer, K then V, each in layout order (a latent
// cache's rows once).
pagedattn_status move_packed(void* state, const pa_cache* c, const int32_t* ids, size_t n,
                             char* host, bool to_host, void* stream, char* msg) {
  DeviceGuard g(static_cast<State*>(state)->device);
  gpuStream_t st = static_cast<gpuStream_t>(stream);
  pa_cache packed = *c;  // the host record, seen as a one-block compact cache
  const int64_t hd = c->head_size, bs = c->block_size, h = c->num_kv_heads;
  packed.block_stride = bs * h * hd;
  packed.slot_stride = (c->layout == PAGEDATTN_LAYOUT_NHD) ? h * hd : hd;
  packed.head_stride = (c->layout == PAGEDATTN_LAYOUT_NHD) ? hd : bs * hd;
  const size_t blk = static_cast<size_t>(packed.block_stride) * elem_size(c->dtype);
  const int planes = c->latent ? 1 : 2;
  for (size_t i = 0; i < n; ++i) {
    for (int32_t l = 0; l < c->num_layers; ++l) {
      for (int kv = 0; kv < planes; ++kv) {
        char* rec = host + ((i * c->num_layers + l) * planes + kv) * blk;
        void* base = kv ? c->v_layers[l] : c->k_layers[l];
        gpuError_t e = to_host ? copy_block(&packed, rec, 0, c, base, ids[i], st)
                               : copy_block(c, base, ids[i], &packed, rec, 0, st);
        if (e != gpuSuccess) return dev_error(e, to_host ? "read_blocks copy" : "load_blocks copy", msg);
      }
    }
  }
  PA_CHECK(gpuStreamSynchronize(st), "stream synchronize");
  return PAGEDATTN_OK;
}

pagedattn_status read_blocks(void* state, const pa_cache* cache, const int32_t* ids, size_t n,
                             void* buffer, void* stream, char* msg) {
  return move_packed(state, cache, ids, n, static_cast<char*>(buffer), true, stream, msg);
}

pagedattn_status load_blocks(void* state, const pa_cache* cache, const int32_t* ids, size_t n,
                             const void* buffer, void* stream, char* msg) {
  return move_packed(state, cache, ids, n, const_cast<char*>(static_cast<const char*>(buffer)),
                     false, stream, msg);
}

// ---------------------------------------------------------------------------------------------
// Planning

pagedattn_status plan_batch(void* state, pa_batch* b, int32_t is_update, char* msg) {
  State* s = static_cast<State*>(state);
  DeviceGuard g(s->device);
  Plan* pl = static_cast<Plan*>(b->backend_data);
  if (!is_update || !pl) {
    pl = new (std::nothrow) Plan();
    if (!pl) {
      set_msg(msg, "out of host memory planning a batch");
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    plan_layout(pl, b, s->sm_count);
    try {
      pl->host.assign(pl->meta_bytes, 0);
    } catch (...) {
      const size_t bytes = pl->dev_bytes;
      delete pl;
      set_msg(msg, "out of host memory planning a batch (%zu bytes)", bytes);
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    if (!reserve(s, pl->dev_bytes, msg)) {
      delete pl;
      return PAGEDATTN_ERROR_OUT_OF_MEMORY;
    }
    gpuError_t e = gpuMalloc(reinterpret_cast<void**>(&pl->dev), pl->dev_bytes);
    if (e != gpuSuccess) {
      s->used -= pl->dev_bytes;
      delete pl;
      pagedattn_status st = dev_error(e, "batch workspace allocation", msg);
      return st == PAGEDATTN_ERROR_DEVICE ? PAGEDATTN_ERROR_OUT_OF_MEMORY : st;
    }
    b->backend_data = pl;
    b->backend_bytes = pl->dev_bytes;
  }
  pagedattn_status st = fill_plan(pl, b, msg);
  if (st != PAGEDATTN_OK) {
    if (!is_update) {
      (void)gpuFree(pl->dev);
      s->used -= pl->dev_bytes;
      delete pl;
      b->backend_data = nullptr;
    }
    return st;
  }
  PA_CHECK(gpuMemcpy(pl->dev, pl->host.data(), pl->meta_bytes, gpuMemcpyHostToDevice),
           "batch metadata copy");
  // A pageable copy returns once staged; wait for it so kernels on any stream see the update.
  PA_CHECK(gpuStreamSynchronize(nullptr), "batch metadata copy");
  return PAGEDATTN_OK;
}

void free_batch(void* state, pa_batch* b) {
  Plan* pl = static_cast<Plan*>(b->backend_data);
  if (!pl) return;
  State* s = static_cast<State*>(state);
  DeviceGuard g(s->device);
  (void)gpuFree(pl->dev);
  s->used -= pl->dev_bytes;
  delete pl;
  b->backend_data = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Forward

// Fills a forward's attention parameters but its work list and CTA shape (schedule.cu sets those
// per launch): q, out and lse, the heads, the semantics (scale, soft cap, window, chunk, ALiBi,
// sinks, attention type), the plan's lengths, and where keys and values come from: the k/v
// tensors for the encoder types, else the paged cache (self or cross) with its fp8 scales.
// Returns the keys' element type.
int32_t fill_attn_params(AttnParams* p, const pa_forward_args* a, const Plan* pl) {
  const pa_cache* c = a->cache;
  const bool cross = a->attention_type == PAGEDATTN_ATTENTION_CROSS;
  const bool encoder = a->attention_type == PAGEDATTN_ATTENTION_ENCODER ||
                       a->attention_type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
  memset(static_cast<void*>(p), 0, sizeof(*p));
  p->q = a->q.data;
  p->out = a->out.data;
  p->q_row = a->q.row_stride;
  p->q_head = a->q.head_stride;
  p->o_row = a->out.row_stride;
  p->o_head = a->out.head_stride;
  p->lse = a->lse.data;
  p->lse_row = a->lse.row_stride;
  p->lse_head = a->lse.head_stride;
  p->num_heads = a->num_heads;
  p->num_kv_heads = a->num_kv_heads;
  p->head_size = a->head_size;
  p->group = a->num_heads / a->num_kv_heads;
  p->scale = a->scale;
  p->k_scale = 1.f;
  p->v_scale = 1.f;
  p->soft_cap = a->soft_cap;
  p->window = a->sliding_window;
  p->chunk = a->attention_chunk;
  p->alibi = a->alibi_slopes;
  p->sinks = a->sinks;
  p->tree_ip = pl->cap_tree > 0 ? pl->d<int64_t>(pl->o_tree_ip) : nullptr;
  p->tree = pl->cap_tree > 0 ? pl->d<uint8_t>(pl->o_tree) : nullptr;
  p->kind = cross ? kCross : (encoder ? kEncoder : kDecoder);
  p->query_lens = pl->d<int32_t>(pl->o_qlen);
  p->context_lens = pl->d<int32_t>(pl->o_ctx);
  p->query_start = pl->d<int32_t>(pl->o_qstart);
  p->encoder_lens = pl->d<int32_t>(pl->o_enc);
  if (encoder) {
    const size_t te = elem_size(a->k.dtype);
    p->kv.k = a->k.data;
    p->kv.v = a->v.data;
    p->kv.slot_stride = a->k.row_stride;
    p->kv.head_stride = a->k.head_stride;
    p->kv.v_slot_stride = a->v.row_stride;
    p->kv.v_head_stride = a->v.head_stride;
    p->kv.paged = 0;
    p->kv.vec = widest_vec({static_cast<uint64_t>(a->head_size) * te,
                            reinterpret_cast<uintptr_t>(p->kv.k), reinterpret_cast<uintptr_t>(p->kv.v),
                            static_cast<uint64_t>(a->k.row_stride) * te,
                            static_cast<uint64_t>(a->k.head_stride) * te,
                            static_cast<uint64_t>(a->v.row_stride) * te,
                            static_cast<uint64_t>(a->v.head_stride) * te});
    return a->k.dtype;
  }
  const size_t ce = elem_size(c->dtype);
  const bool fp8 = c->dtype == PAGEDATTN_DTYPE_FP8_E4M3 || c->dtype == PAGEDATTN_DTYPE_FP8_E5M2;
  if (fp8) {
    p->k_scale = a->k_scale;
    p->v_scale = a->v_scale;
    p->k_head_scales = a->k_head_scales;
    p->v_head_scales = a->v_head_scales;
  }
  p->kv.k = c->k_layers[a->layer];
  p->kv.v = c->v_layers[a->layer];
  p->kv.block_stride = c->block_stride;
  p->kv.slot_stride = c->slot_stride;
  p->kv.head_stride = c->head_stride;
  p->kv.v_slot_stride = c->slot_stride;
  p->kv.v_head_stride = c->head_stride;
  p->kv.paged = 1;
  p->kv.tables = cross ? pl->d<int32_t>(pl->o_xtab) : pl->d<int32_t>(pl->o_tab);
  p->kv.table_stride = cross ? pl->xtab_stride : pl->tab_stride;
  p->kv.block_size = cross ? a->batch->cross_block_size : a->batch->block_size;
  if (p->kv.block_size <= 0) p->kv.block_size = c->block_size;
  p->kv.vec = widest_vec({static_cast<uint64_t>(a->head_size) * ce,
                          reinterpret_cast<uintptr_t>(p->kv.k), reinterpret_cast<uintptr_t>(p->kv.v),
                          static_cast<uint64_t>(c->block_stride) * ce,
                          static_cast<uint64_t>(c->slot_stride) * ce,
                          static_cast<uint64_t>(c->head_stride) * ce});
  return c->dtype;
}

pagedattn_status forward(void* state, const pa_forward_args* a, char* msg) {
  State* s = static_cast<State*>(state);
  DeviceGuard g(s->device);
  const Plan* pl = static_cast<const Plan*>(a->batch->backend_data);
  if (!pl) {
    set_msg(msg, "batch was not planned for the %s backend", PA_RUNTIME_NAME);
    return PAGEDATTN_ERROR_INVALID_HANDLE;
  }
  gpuStream_t stream = static_cast<gpuStream_t>(a->stream);
  const pa_cache* c = a->cache;
  const int32_t qt = a->q.dtype;
  const bool cross = a->attention_type == PAGEDATTN_ATTENTION_CROSS;

  if (a->write_kv && c) {
    // The write is launched even when this step has no rows: the launch reads the row count on
    // the device, so a captured graph replays a later step's write.
    pa_write_args wa;
    (void)pa_forward_write_args(a, &wa);
    WriteParams w;
    fill_write_params(&w, wa);
    const int64_t write_rows = set_write_launch(*pl, cross, &w);
    PA_CHECK(launch_cache_write(qt, c->dtype, write_rows, w, stream), "cache write launch");
  }

  AttnParams p;
  const int32_t kt = fill_attn_params(&p, a, pl);
  p.smem_per_block = s->smem_per_block;
  p.matrix_cores = s->matrix_cores;

  int unsupported = 0;
  const bool split = decode_split(*pl, a->num_heads, a->head_size);
  const int32_t decode_items = set_decode_launch(*pl, split, &p);
  PA_CHECK(launch_attention(qt, kt, true, decode_items, p, stream, &unsupported),
           "decode attention launch");
  if (split) {
    SplitMergeParams m;
    const int32_t merge_items = set_merge_launch(*pl, &m);
    m.query_start = p.query_start;
    m.part_o = p.part_o;
    m.part_lse = p.part_lse;
    m.out = p.out;
    m.o_row = p.o_row;
    m.o_head = p.o_head;
    m.lse = p.lse;
    m.lse_row = p.lse_row;
    m.lse_head = p.lse_head;
    m.num_heads = p.num_heads;
    m.head_size = p.head_size;
    m.sinks = p.sinks;
    PA_CHECK(launch_split_merge(qt, merge_items, m, stream), "split-KV merge launch");
  }
  const int32_t prefill_items = set_prefill_launch(*pl, &p);
  PA_CHECK(launch_attention(qt, kt, false, prefill_items, p, stream, &unsupported),
           "prefill attention launch");
  if (unsupported) {
    set_msg(msg, "no %s kernel for head size %d (largest instantiated: %d)", PA_RUNTIME_NAME,
            a->head_size, PA_GPU_MAX_HEAD_SIZE);
    return PAGEDATTN_ERROR_UNSUPPORTED;
  }
  return PAGEDATTN_OK;
}

// Multi-head latent attention (mla.cuh): decode rows over the split or whole list (then the
// merge of the split partials, value-size wide), prefill tiles cut into sub-tiles of kMlaRows
// rows. Refuses what it has no kernel for before it launches anything.
pagedattn_status forward_mla(void* state, const pa_forward_args* a, char* msg) {
  State* s = static_cast<State*>(state);
  DeviceGuard g(s->device);
  const Plan* pl = static_cast<const Plan*>(a->batch->backend_data);
  if (!pl) {
    set_msg(msg, "batch was not planned for the %s backend", PA_RUNTIME_NAME);
    return PAGEDATTN_ERROR_INVALID_HANDLE;
  }
  if (a->head_size != kMlaRow || a->value_size != kMlaValue) {
    set_msg(msg, "%s: multi-head latent attention with value size %d over rows of %d is not "
            "supported (supported: value size %d over rows of %d)",
            PA_RUNTIME_NAME, a->value_size, a->head_size, kMlaValue, kMlaRow);
    return PAGEDATTN_ERROR_UNSUPPORTED;
  }
  const int32_t qt = a->q.dtype;
  const size_t need = mla_smem_need(qt);
  if (need == 0 || s->smem_per_block < static_cast<int64_t>(need)) {
    if (need == 0)
      set_msg(msg, "%s: no multi-head latent attention kernel for queries of dtype %d",
              PA_RUNTIME_NAME, static_cast<int>(qt));
    else
      set_msg(msg, "%s: the multi-head latent attention tile needs %zu bytes of shared memory "
              "per block; the device gives %lld", PA_RUNTIME_NAME, need,
              static_cast<long long>(s->smem_per_block));
    return PAGEDATTN_ERROR_UNSUPPORTED;
  }
  gpuStream_t stream = static_cast<gpuStream_t>(a->stream);
  MlaParams p;
  memset(static_cast<void*>(&p), 0, sizeof(p));
  const int32_t kt = fill_attn_params(&p.a, a, pl);
  p.a.smem_per_block = s->smem_per_block;
  p.q_pe = a->q_pe.data;
  p.qpe_row = a->q_pe.row_stride;
  p.qpe_head = a->q_pe.head_stride;
  p.q_lead = a->q_pe.data ? a->value_size : a->head_size;
  bool listed = false;  // the pair in instantiations.h (the core admits no other)
#define PA_MLA_CACHE(CODE, KT, ...) listed = listed || kt == (CODE);
#define PA_MLA_QUERY(CODE, T, ...) \
  if (qt == (CODE)) { PA_GPU_CACHE_DTYPES(PA_MLA_CACHE, CODE, T, ) }
  PA_GPU_DTYPES(PA_MLA_QUERY, )
#undef PA_MLA_QUERY
#undef PA_MLA_CACHE
  if (!listed) {
    set_msg(msg, "no %s multi-head latent attention kernel for query dtype %d and cache dtype %d",
            PA_RUNTIME_NAME, static_cast<int>(qt), static_cast<int>(kt));
    return PAGEDATTN_ERROR_UNSUPPORTED;
  }

  int unsupported = 0;
  const bool split = decode_split(*pl, a->num_heads, kMlaValue);
  const int32_t decode_items = set_mla_decode_launch(*pl, split, &p.a);
  PA_CHECK(launch_mla(qt, kt, decode_items, 1, p, stream, &unsupported), "MLA decode launch");
  if (split) {
    SplitMergeParams m;
    const int32_t merge_items = set_merge_launch(*pl, &m);
    m.query_start = p.a.query_start;
    m.part_o = p.a.part_o;
    m.part_lse = p.a.part_lse;
    m.out = p.a.out;
    m.o_row = p.a.o_row;
    m.o_head = p.a.o_head;
    m.lse = p.a.lse;
    m.lse_row = p.a.lse_row;
    m.lse_head = p.a.lse_head;
    m.num_heads = p.a.num_heads;
    m.head_size = kMlaValue;  // the partials and the output rows are value-size wide
    m.sinks = p.a.sinks;
    PA_CHECK(launch_split_merge(qt, merge_items, m, stream), "MLA split-KV merge launch");
  }
  int32_t subtiles = 1;
  const int32_t prefill_items = set_mla_prefill_launch(*pl, &p.a, &subtiles);
  PA_CHECK(launch_mla(qt, kt, prefill_items, subtiles, p, stream, &unsupported),
           "MLA prefill launch");
  if (unsupported) {
    set_msg(msg, "no %s multi-head latent attention kernel for query dtype %d and cache dtype %d",
            PA_RUNTIME_NAME, static_cast<int>(qt), static_cast<int>(kt));
    return PAGEDATTN_ERROR_UNSUPPORTED;
  }
  return PAGEDATTN_OK;
}

pagedattn_status merge_states(void* state, const pa_merge_args* a, char* msg) {
  DeviceGuard g(static_cast<State*>(state)->device);
  MergeStatesParams p;
  p.o1 = a->o1.data;
  p.o2 = a->o2.data;
  p.out = a->out.data;
  p.o1_row = a->o1.row_stride;
  p.o1_head = a->o1.head_stride;
  p.o2_row = a->o2.row_stride;
  p.o2_head = a->o2.head_stride;
  p.out_row = a->out.row_stride;
  p.out_head = a->out.head_stride;
  p.lse1 = a->lse1.data;
  p.lse2 = a->lse2.data;
  p.lse_out = a->lse_out.data;
  p.l1_row = a->lse1.row_stride;
  p.l1_head = a->lse1.head_stride;
  p.l2_row = a->lse2.row_stride;
  p.l2_head = a->lse2.head_stride;
  p.lo_row = a->lse_out.row_stride;
  p.lo_head = a->lse_out.head_stride;
  p.rows = a->out.rows;
  p.heads = a->out.heads;
  p.dim = a->out.dim;
  PA_CHECK(launch_merge_states(a->out.dtype, p, static_cast<gpuStream_t>(a->stream)),
           "merge_states launch");
  return PAGEDATTN_OK;
}

pagedattn_status synchronize(void* state, void* stream, char* msg) {
  DeviceGuard g(static_cast<State*>(state)->device);
  PA_CHECK(gpuStreamSynchronize(static_cast<gpuStream_t>(stream)), "stream synchronize");
  return PAGEDATTN_OK;
}

const pa_backend_ops kOps = {
    PA_PLUGIN_ABI_VERSION,
    sizeof(pa_backend_ops),
    PA_RUNTIME_NAME,
    probe,
    create,
    destroy,
    get_capabilities,
    alloc,
    free_mem,
    cache_attach,
    cache_detach,
    cache_write,
    copy_blocks,
    swap_blocks,
    read_blocks,
    load_blocks,
    plan_batch,
    free_batch,
    forward,
    merge_states,
    synchronize,
    forward_mla,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) uint32_t pagedattn_plugin_abi_version(void) {
  return PA_PLUGIN_ABI_VERSION;
}

extern "C" __attribute__((visibility("default"))) const pa_backend_ops* pagedattn_plugin_ops(void) {
  return &kOps;
}
