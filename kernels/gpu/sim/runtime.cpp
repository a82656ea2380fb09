// runtime.cpp — the emulator's host API: one virtual device whose memory is host memory. Work on
// a stream runs at once, in order, on the calling thread (so every stream is trivially
// synchronized), except while the stream is captured: then launches and copies are recorded for
// graph replay, and the calls CUDA refuses during a global-mode capture (allocation, synchronous
// copies and memsets, synchronization) fail and invalidate the capture, as CUDA does.
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
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

constexpr size_t kDeviceBytes = size_t{16} << 30;
constexpr size_t kSmemDefault = 48 * 1024;

// The virtual devices PAGEDATTN_GPUSIM_DEVICE declares (default sm_90): each with the properties
// the plugin reads, so its refusals (compute capability, code objects, shared memory) can be tested.
struct VirtualDevice {
  const char* target;  // as PAGEDATTN_GPUSIM_DEVICE names it
  const char* name;
  const char* arch;    // gcnArchName ("" on NVIDIA)
  int major, minor, sms, warp;
  size_t smem_optin;   // opt-in shared memory per block (AMD: the 64 KiB of LDS)
};
constexpr VirtualDevice kDevices[] = {
    {"sm_90", "pagedattn gpusim (emulated sm_90)", "", 9, 0, 132, 32, 227 * 1024},
    {"sm_100", "pagedattn gpusim (emulated sm_100)", "", 10, 0, 148, 32, 227 * 1024},
    {"sm_120", "pagedattn gpusim (emulated sm_120)", "", 12, 0, 170, 32, 99 * 1024},
    {"sm_89", "pagedattn gpusim (emulated sm_89)", "", 8, 9, 128, 32, 99 * 1024},
    {"sm_86", "pagedattn gpusim (emulated sm_86)", "", 8, 6, 84, 32, 99 * 1024},
    {"sm_80", "pagedattn gpusim (emulated sm_80)", "", 8, 0, 108, 32, 163 * 1024},
    {"sm_75", "pagedattn gpusim (emulated sm_75)", "", 7, 5, 40, 32, 64 * 1024},
    // No such part: an sm_80 that gives a block less than the smallest tiles need (the refusal).
    {"sm_80_64k", "pagedattn gpusim (emulated sm_80_64k)", "", 8, 0, 108, 32, 64 * 1024},
    {"gfx90a", "pagedattn gpusim (emulated gfx90a)", "gfx90a:sramecc+:xnack-", 9, 0, 104, 64,
     64 * 1024},
    {"gfx942", "pagedattn gpusim (emulated gfx942)", "gfx942:sramecc+:xnack-", 9, 4, 304, 64,
     64 * 1024},
    {"gfx1100", "pagedattn gpusim (emulated gfx1100)", "gfx1100", 11, 0, 48, 32, 64 * 1024},
};

// The declared device (read at every call, so a test may switch it between backends); nullptr
// when PAGEDATTN_GPUSIM_DEVICE names none of the table.
const VirtualDevice* device() {
  const char* e = getenv("PAGEDATTN_GPUSIM_DEVICE");
  if (!e || !*e) return &kDevices[0];
  for (const VirtualDevice& d : kDevices)
    if (strcmp(d.target, e) == 0) return &d;
  return nullptr;
}
size_t smem_optin() {
  const VirtualDevice* d = device();
  return d ? d->smem_optin : 0;
}

// Whether code objects built for `built` (space-separated: sm_XY / sm_XYa machine code, compute_XY
// PTX, gfxNNN) can run on device d, as the loaders decide: machine code runs on the same major
// at an equal or newer minor ("a" targets only on their own), PTX on anything at least as new,
// AMD code objects only on their exact architecture.
bool serves(const char* built, const VirtualDevice& d) {
  const int cc = d.major * 10 + d.minor;
  const char* p = built;
  while (*p) {
    while (*p == ' ') ++p;
    const char* end = p;
    while (*end && *end != ' ') ++end;
    const std::string t(p, end);
    p = end;
    if (t.empty()) continue;
    if (*d.arch) {
      const std::string base = std::string(d.arch).substr(0, std::string(d.arch).find(':'));
      if (t == base) return true;
    } else if (t.rfind("sm_", 0) == 0 && t.size() >= 5) {
      size_t digits = 0;
      const int v = std::stoi(t.substr(3), &digits);  // sm_86, sm_90a, sm_100, sm_120
      const bool arch_specific = 3 + digits < t.size() && t[3 + digits] == 'a';
      if (arch_specific ? v == cc : (v / 10 == d.major && v <= cc)) return true;
    } else if (t.rfind("compute_", 0) == 0 && t.size() >= 10) {
      if (std::stoi(t.substr(8)) <= cc) return true;
    }
  }
  return false;
}

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
      static_cast<size_t>(value) > smem_optin()) {
    return note(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lk(g_mu);
  g_smem_attr[f] = value;
  return cudaSuccess;
}

cudaError_t func_get_attributes(cudaFuncAttributes* a, const void* f, const char* built) {
  const VirtualDevice* d = device();
  if (!d) return note(cudaErrorInvalidDevice);
  if (!serves(built, *d)) return note(cudaErrorNoKernelImageForDevice);
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_smem_attr.find(f);
  a->maxThreadsPerBlock = 1024;
  a->maxDynamicSharedSizeBytes =
      static_cast<int>(it != g_smem_attr.end() ? it->second : kSmemDefault);
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
  if (c.smem > allowed || c.smem > smem_optin()) return note(cudaErrorInvalidValue);
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
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
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
  const pa_sim::VirtualDevice* v = pa_sim::device();
  if (d != 0 || !v) return note(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  strcpy(p->name, v->name);
  strcpy(p->gcnArchName, v->arch);
  p->major = v->major;
  p->minor = v->minor;
  p->multiProcessorCount = v->sms;
  p->totalGlobalMem = pa_sim::kDeviceBytes;
  p->sharedMemPerBlock = *v->arch ? v->smem_optin : pa_sim::kSmemDefault;
  p->sharedMemPerBlockOptin = v->smem_optin;
  p->warpSize = v->warp;
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
