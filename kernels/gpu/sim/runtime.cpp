// runtime.cpp — the emulator's host API: one virtual device whose memory is host memory. Work on
// a stream runs at once, in order, on the calling thread (so every stream is trivially
// synchronized), except while the stream is captured: then launches and copies are recorded for
// graph replay, and the calls CUDA refuses during a global-mode capture (allocation, synchronous
// copies and memsets, synchronization) fail and invalidate the capture, as CUDA does.
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "simt.h"

namespace pa_sim {

struct Stream {
  unsigned flags = 0;
  bool capturing = false;
  bool invalidated = false;
  std::vector<std::function<void()>> recorded;
};
struct Graph {
  std::vector<std::function<void()>> work;
};
struct GraphExec {
  std::vector<std::function<void()>> work;
};

namespace {

// The virtual device: an H100-like sm_90 part with 132 multiprocessors and 227 KiB of opt-in
// shared memory per block.
constexpr size_t kDeviceBytes = size_t{16} << 30;
constexpr size_t kSmemDefault = 48 * 1024;
constexpr size_t kSmemOptin = 227 * 1024;

std::mutex g_mu;
std::map<const void*, size_t> g_allocs;       // device and pinned allocations
std::map<const void*, int> g_smem_attr;       // kernel -> max dynamic shared memory
int g_captures = 0;                           // streams capturing now
std::vector<Stream*> g_capturing;
thread_local cudaError_t t_last = cudaSuccess;
thread_local int t_device = 0;

cudaError_t note(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// A call CUDA refuses while any stream is captured in global mode: invalidates the captures.
bool refused_in_capture() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_captures == 0) return false;
  for (Stream* s : g_capturing) s->invalidated = true;
  return true;
}

// Work on the legacy stream synchronizes with every blocking stream: a captured one among them
// has its capture invalidated, as CUDA does.
bool legacy_conflict() {
  std::lock_guard<std::mutex> lk(g_mu);
  bool hit = false;
  for (Stream* s : g_capturing) {
    if (!(s->flags & cudaStreamNonBlocking)) {
      s->invalidated = true;
      hit = true;
    }
  }
  return hit;
}

// Runs `work` now, or records it when s is captured.
cudaError_t enqueue(cudaStream_t s, std::function<void()> work) {
  if (s && s->capturing) {
    if (s->invalidated) return cudaErrorStreamCaptureInvalidated;
    s->recorded.push_back(std::move(work));
    return cudaSuccess;
  }
  if (!s && legacy_conflict()) return cudaErrorStreamCaptureImplicit;
  work();
  return cudaSuccess;
}

void* alloc(size_t bytes) {
  const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = aligned_alloc(256, n);
  if (!p) return nullptr;
  // Fresh device memory is not zero on a GPU: 0xff bytes read as NaN in every float format.
  memset(p, 0xff, n);
  std::lock_guard<std::mutex> lk(g_mu);
  g_allocs[p] = bytes;
  return p;
}

cudaError_t release(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_allocs.find(p);
    if (it == g_allocs.end()) return cudaErrorInvalidValue;
    g_allocs.erase(it);
  }
  free(p);
  return cudaSuccess;
}

}  // namespace

cudaError_t func_set_attribute(const void* f, cudaFuncAttribute a, int value) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > kSmemOptin) {
    return note(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lk(g_mu);
  g_smem_attr[f] = value;
  return cudaSuccess;
}

cudaError_t submit(cudaStream_t s, const LaunchConfig& c, std::function<void()> body) {
  // Beyond 48 KiB a kernel needs its attribute raised first, and never past the device's limit.
  size_t allowed = kSmemDefault;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_smem_attr.find(c.func);
    if (it != g_smem_attr.end()) allowed = std::max<size_t>(allowed, it->second);
  }
  if (c.smem > allowed || c.smem > c.smem_limit) return note(cudaErrorInvalidValue);
  LaunchConfig cfg = c;
  return note(enqueue(s, [cfg, body = std::move(body)]() {
    const cudaError_t e = run_grid(cfg, body);
    if (e != cudaSuccess) t_last = e;
  }));
}

}  // namespace pa_sim

using pa_sim::note;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = pa_sim::t_last;
  pa_sim::t_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return pa_sim::t_last; }

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = pa_sim::t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d != 0) return note(cudaErrorInvalidDevice);
  pa_sim::t_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return note(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  strcpy(p->name, "pagedattn gpusim (emulated sm_90)");
  strcpy(p->gcnArchName, "gpusim");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->totalGlobalMem = pa_sim::kDeviceBytes;
  p->sharedMemPerBlock = pa_sim::kSmemDefault;
  p->sharedMemPerBlockOptin = pa_sim::kSmemOptin;
  p->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  if (bytes > pa_sim::kDeviceBytes) return note(cudaErrorMemoryAllocation);
  *p = pa_sim::alloc(bytes);
  return *p ? cudaSuccess : note(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  return note(pa_sim::release(p));
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  size_t used = 0;
  {
    std::lock_guard<std::mutex> lk(pa_sim::g_mu);
    for (const auto& a : pa_sim::g_allocs) used += a.second;
  }
  *total_bytes = pa_sim::kDeviceBytes;
  *free_bytes = used < pa_sim::kDeviceBytes ? pa_sim::kDeviceBytes - used : 0;
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t s) {
  return note(pa_sim::enqueue(s, [=]() { memmove(dst, src, bytes); }));
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t s) {
  if (width > dpitch || width > spitch) return note(cudaErrorInvalidValue);
  return note(pa_sim::enqueue(s, [=]() {
    for (size_t r = 0; r < height; ++r) {
      memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
              width);
    }
  }));
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  *s = new pa_sim::Stream();
  (*s)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return note(cudaErrorInvalidResourceHandle);
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (s && s->capturing) {
    s->invalidated = true;
    return note(cudaErrorStreamCaptureUnsupported);
  }
  if (pa_sim::refused_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (!s || s->capturing) return note(cudaErrorInvalidValue);  // the legacy stream cannot be
  s->capturing = true;
  s->invalidated = false;
  s->recorded.clear();
  std::lock_guard<std::mutex> lk(pa_sim::g_mu);
  ++pa_sim::g_captures;
  pa_sim::g_capturing.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  *g = nullptr;
  if (!s || !s->capturing) return note(cudaErrorInvalidValue);
  s->capturing = false;
  {
    std::lock_guard<std::mutex> lk(pa_sim::g_mu);
    --pa_sim::g_captures;
    auto& v = pa_sim::g_capturing;
    v.erase(std::remove(v.begin(), v.end(), s), v.end());
  }
  if (s->invalidated) {
    s->recorded.clear();
    return note(cudaErrorStreamCaptureInvalidated);
  }
  *g = new pa_sim::Graph{std::move(s->recorded)};
  s->recorded.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long) {
  if (!g) return note(cudaErrorInvalidValue);
  *e = new pa_sim::GraphExec{g->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  if (!e) return note(cudaErrorInvalidValue);
  for (const auto& w : e->work) {
    const cudaError_t r = pa_sim::enqueue(s, w);
    if (r != cudaSuccess) return note(r);
  }
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}
