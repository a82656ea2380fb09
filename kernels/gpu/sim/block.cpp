// block.cpp — the block runner: each thread of a block is a fiber (Boost.Context); a thread runs
// until it reaches a barrier, a warp-collective operation or its end, and the seed picks which
// ready thread runs next. A warp operation (shuffle, gather, __syncwarp) completes as soon as the
// warp's last lane arrives, so warps run ahead of one another between barriers; the block's
// __syncthreads completes when no thread can run. Divergence (a thread that exited, or waits
// elsewhere, while others wait) aborts with the kernel and line. Blocks of a grid run one after
// another in a seeded random order.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <boost/context/fiber.hpp>

#include "profile.h"
#include "simt.h"
#include "stack_pool.h"

// AddressSanitizer must be told of every stack switch (Boost.Context 1.74's fcontext fibers do
// not), or it reports the fibers' frames as overflows of the runner's stack.
#if defined(__SANITIZE_ADDRESS__)
#define PA_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PA_SIM_ASAN 1
#endif
#endif
#if defined(PA_SIM_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace ctx = boost::context;

namespace pa_sim {
namespace {

enum class Wait { kRun, kBlock, kWarp, kDone };
enum class WarpOp { kSync, kShuffle, kGather };

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

struct Thread {
  ctx::fiber fib;   // the thread, while suspended
  ctx::fiber back;  // the runner, while the thread runs
  void* stack = nullptr;  // the lowest byte of the fiber's stack (kStackBytes long)
  void* fake = nullptr;   // ASan's fake-stack handle while the thread is switched out
  Builtins b{};
  int linear = 0;
  Wait wait = Wait::kRun;
  WarpOp op = WarpOp::kSync;
  const char* file = "";
  int line = 0;
  const char* fn = "";
  unsigned mask = 0;
  uint64_t xin = 0, xout = 0;
  int xlane = 0;
  const void* gsrc = nullptr;  // a gather's source, its size, destination and slot stride
  size_t gbytes = 0;
  void* gdst = nullptr;
  size_t gstride = 0;
  std::vector<Copy> open;               // cp.async copies not yet committed
  std::deque<std::vector<Copy>> groups;  // committed groups, oldest first
  std::vector<AccessRecord> log;         // accesses in program order, while profiling
};

struct BlockRun {
  const LaunchConfig* cfg = nullptr;
  uint3 block{};
  uint64_t seed = 0;
  char* smem = nullptr;
  std::vector<Thread> th;
  std::vector<float> scratch;  // 256 floats per warp
  std::vector<unsigned char> gathered;  // a gather's slots, staged before they are handed out
  LaunchCounter* prof = nullptr;        // the launch's counters while profiling
  std::vector<char> warp_ops;           // per warp: whether it counted an instruction
};

// Counts warp instruction `op` of the warp holding thread `linear`.
void count_warp_op(BlockRun& br, int linear, Op op) {
  if (!br.prof) return;
  count_op(br.prof, op, 1);
  br.warp_ops[linear / br.cfg->warp_size] = 1;
}

thread_local Thread* t_cur = nullptr;
thread_local BlockRun* t_block = nullptr;

// The stack switches, annotated for AddressSanitizer: the runner into a thread (resume), a thread
// back to the runner (suspend), and a thread's last switch (leave: its stack is done).
#if defined(PA_SIM_ASAN)
thread_local const void* t_host_bottom = nullptr;
thread_local size_t t_host_size = 0;
void asan_entered() { __sanitizer_finish_switch_fiber(nullptr, &t_host_bottom, &t_host_size); }
void resume(Thread& t) {
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack, kStackBytes);
  t.fib = std::move(t.fib).resume();
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
}
void suspend(Thread& t) {
  __sanitizer_start_switch_fiber(&t.fake, t_host_bottom, t_host_size);
  t.back = std::move(t.back).resume();
  __sanitizer_finish_switch_fiber(t.fake, &t_host_bottom, &t_host_size);
}
void asan_leaving() { __sanitizer_start_switch_fiber(nullptr, t_host_bottom, t_host_size); }
#else
void asan_entered() {}
void resume(Thread& t) { t.fib = std::move(t.fib).resume(); }
// Hands control back to the runner until this thread is resumed.
void suspend(Thread& t) { t.back = std::move(t.back).resume(); }
void asan_leaving() {}
#endif

uint64_t base_seed() {
  static const uint64_t s = [] {
    const char* e = getenv("PAGEDATTN_GPUSIM_SEED");
    return (e && *e) ? strtoull(e, nullptr, 0) : uint64_t{1};
  }();
  return s;
}
std::atomic<uint64_t> g_launches{0};

// Whether two threads wait at one source line (string literals of one file usually share a
// pointer; compare the text only when they do not).
bool same_site(const Thread& a, const Thread& b) {
  return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

std::string site(const Thread& t) {
  return std::string(t.file) + ":" + std::to_string(t.line);
}

[[noreturn]] void fail(const BlockRun& br, const std::string& what, const char* fn) {
  const LaunchConfig& c = *br.cfg;
  fprintf(stderr,
          "gpusim: %s\n  kernel %s (launched at %s:%d as %s), block (%u,%u,%u) of (%u,%u,%u), "
          "%u threads, warp size %d\n  seed: PAGEDATTN_GPUSIM_SEED=%llu (launch seed %llu)\n",
          what.c_str(), fn && *fn ? fn : "?", c.file, c.line, c.name, br.block.x, br.block.y,
          br.block.z, c.grid.x, c.grid.y, c.grid.z, c.block.x * c.block.y * c.block.z,
          c.warp_size, static_cast<unsigned long long>(base_seed()),
          static_cast<unsigned long long>(br.seed));
  fflush(stderr);
  abort();
}

Thread& cur() {
  if (!t_cur) {
    fprintf(stderr, "gpusim: a device function ran outside a kernel\n");
    abort();
  }
  return *t_cur;
}

// Completes the warp operation of the warp whose first thread is `lo` if every live lane has
// arrived at it; true if it completed.
bool complete_warp(BlockRun& br, int lo, std::vector<int>& ready) {
  const int ws = br.cfg->warp_size;
  const int hi = std::min(static_cast<int>(br.th.size()), lo + ws);
  int live = 0, at = 0;
  const Thread* first = nullptr;
  for (int i = lo; i < hi; ++i) {
    const Thread& t = br.th[i];
    if (t.wait == Wait::kDone) continue;
    ++live;
    if (t.wait == Wait::kWarp) {
      ++at;
      if (!first) first = &t;
    }
  }
  if (at == 0 || at < live) return false;
  for (int i = lo; i < hi; ++i) {
    const Thread& t = br.th[i];
    if (t.wait == Wait::kDone) {
      fail(br, "thread " + std::to_string(i) + " exited while its warp waits at " + site(*first),
           first->fn);
    }
    if (t.op != first->op || !same_site(t, *first)) {
      fail(br, "warp divergence: thread " + std::to_string(first->linear) + " waits at " +
                   site(*first) + ", thread " + std::to_string(i) + " at " + site(t),
           first->fn);
    }
    // CUDA's shuffles and __syncwarp here name the full warp (HIP's take no mask).
    if (ws == 32 && t.mask != 0xffffffffu) {
      fail(br, "warp operation at " + site(t) + " with a partial mask", t.fn);
    }
  }
  if (first->op == WarpOp::kGather) {
    // Every source is read before any destination is written, so they may overlap.
    const size_t stride = first->gstride;
    br.gathered.assign(static_cast<size_t>(hi - lo) * stride, 0);
    for (int i = lo; i < hi; ++i) {
      const Thread& t = br.th[i];
      if (t.gstride != stride || t.gbytes > stride) {
        fail(br, "warp gather at " + site(t) + ": thread " + std::to_string(i) + " passes " +
                     std::to_string(t.gbytes) + " bytes in slots of " +
                     std::to_string(t.gstride) + ", thread " + std::to_string(first->linear) +
                     " slots of " + std::to_string(stride),
             t.fn);
      }
      if (t.gbytes) memcpy(&br.gathered[(i - lo) * stride], t.gsrc, t.gbytes);
    }
    for (int i = lo; i < hi; ++i) memcpy(br.th[i].gdst, br.gathered.data(), br.gathered.size());
  }
  if (first->op == WarpOp::kShuffle) count_warp_op(br, lo, Op::kShuffle);
  if (first->op == WarpOp::kSync) count_warp_op(br, lo, Op::kSyncwarp);
  if (first->op == WarpOp::kShuffle) {
    for (int i = lo; i < hi; ++i) {
      Thread& t = br.th[i];
      const int src = (i - lo) ^ t.xlane;
      t.xout = src < hi - lo ? br.th[lo + src].xin : t.xin;
    }
  }
  for (int i = lo; i < hi; ++i) {
    br.th[i].wait = Wait::kRun;
    ready.push_back(i);
  }
  return true;
}

// complete_warp for every warp; true if any completed.
bool complete_warps(BlockRun& br, std::vector<int>& ready) {
  bool progress = false;
  for (int lo = 0; lo < static_cast<int>(br.th.size()); lo += br.cfg->warp_size)
    progress = complete_warp(br, lo, ready) || progress;
  return progress;
}

// Releases a __syncthreads that every live thread waits at; aborts on any divergence.
void complete_barrier(BlockRun& br, std::vector<int>& ready) {
  const Thread* first = nullptr;
  for (const Thread& t : br.th) {
    if (t.wait == Wait::kBlock) {
      first = &t;
      break;
    }
  }
  for (const Thread& t : br.th) {
    if (t.wait == Wait::kWarp) {
      fail(br, "thread " + std::to_string(t.linear) + " waits at a warp operation at " + site(t) +
                   " that its warp never completes" +
                   (first ? ", while thread " + std::to_string(first->linear) +
                                " waits at __syncthreads at " + site(*first)
                          : std::string()),
           t.fn);
    }
  }
  for (const Thread& t : br.th) {
    if (t.wait == Wait::kDone) {
      fail(br, "thread " + std::to_string(t.linear) + " exited while thread " +
                   std::to_string(first->linear) + " waits at __syncthreads at " + site(*first),
           first->fn);
    }
    if (!same_site(t, *first)) {
      fail(br, "barrier divergence: thread " + std::to_string(first->linear) +
                   " waits at __syncthreads at " + site(*first) + ", thread " +
                   std::to_string(t.linear) + " at " + site(t),
           first->fn);
    }
  }
  for (int lo = 0; lo < static_cast<int>(br.th.size()); lo += br.cfg->warp_size)
    count_warp_op(br, lo, Op::kBarrier);
  for (Thread& t : br.th) {
    t.wait = Wait::kRun;
    ready.push_back(t.linear);
  }
}

void run_block(BlockRun& br, const std::function<void()>& body, std::mt19937_64& rng) {
  const LaunchConfig& c = *br.cfg;
  const int n = static_cast<int>(c.block.x * c.block.y * c.block.z);
  br.th.resize(n);
  br.scratch.assign(static_cast<size_t>((n + c.warp_size - 1) / c.warp_size) * 256, 0.f);
  for (int i = 0; i < n; ++i) {
    Thread& t = br.th[i];
    t.linear = i;
    t.b.thread_idx = {i % c.block.x, (i / c.block.x) % c.block.y, i / (c.block.x * c.block.y)};
    t.b.block_idx = br.block;
    t.b.block_dim = c.block;
    t.b.grid_dim = c.grid;
    t.fib = ctx::fiber(std::allocator_arg, PooledStack{&t.stack},
                       [&t, &body](ctx::fiber&& back) {
                         asan_entered();
                         t.back = std::move(back);
                         body();
                         t.wait = Wait::kDone;
                         asan_leaving();
                         return std::move(t.back);
                       });
  }
  std::vector<int> ready(n);
  for (int i = 0; i < n; ++i) ready[i] = i;
  t_block = &br;
  // Half the blocks (by the seed) run warp by warp: the warp that ran last goes on while any of
  // its lanes can, so one warp reaches the next barrier before another starts, the order that
  // exposes a missing __syncthreads between a warp's reads and another's writes. The other half
  // interleave threads uniformly.
  const bool by_warp = (rng() & 1) != 0;
  int last_warp = -1;
  for (;;) {
    while (!ready.empty()) {
      size_t k = rng() % ready.size();
      if (by_warp && last_warp >= 0) {
        for (size_t j = 0; j < ready.size(); ++j) {
          const size_t at = (k + j) % ready.size();
          if (ready[at] / c.warp_size == last_warp) {
            k = at;
            break;
          }
        }
      }
      Thread& t = br.th[ready[k]];
      last_warp = t.linear / c.warp_size;
      ready[k] = ready.back();
      ready.pop_back();
      t_cur = &t;
      resume(t);
      t_cur = nullptr;
      // A warp whose last lane has just arrived goes on at once, so it may run ahead of the other
      // warps up to the next barrier, as on a GPU: a missing __syncthreads then shows.
      complete_warp(br, t.linear - t.linear % c.warp_size, ready);
    }
    bool all_done = true;
    for (const Thread& t : br.th) all_done = all_done && t.wait == Wait::kDone;
    if (all_done) break;
    if (!complete_warps(br, ready)) complete_barrier(br, ready);
  }
  t_block = nullptr;
  if (br.prof) {
    bool active = false;
    std::vector<const std::vector<AccessRecord>*> lanes;
    for (int lo = 0; lo < n; lo += c.warp_size) {
      lanes.clear();
      bool any = br.warp_ops[lo / c.warp_size] != 0;
      for (int i = lo; i < std::min(n, lo + c.warp_size); ++i) {
        lanes.push_back(&br.th[i].log);
        any = any || !br.th[i].log.empty();
      }
      warp_done(br.prof, lanes, any);
      active = active || any;
    }
    block_done(br.prof, active);
  }
}

// Marks the running thread as waiting at warp operation `op` of this site; the caller sets the
// operation's own fields, then suspends.
Thread& at_warp_op(WarpOp op, unsigned mask, const char* file, int line, const char* fn) {
  Thread& t = cur();
  t.wait = Wait::kWarp;
  t.op = op;
  t.mask = mask;
  t.file = file;
  t.line = line;
  t.fn = fn;
  return t;
}

}  // namespace

const Builtins& builtins() { return cur().b; }

void sync_block(const char* file, int line, const char* fn) {
  Thread& t = cur();
  t.wait = Wait::kBlock;
  t.file = file;
  t.line = line;
  t.fn = fn;
  suspend(t);
}

void sync_warp(unsigned mask, const char* file, int line, const char* fn) {
  suspend(at_warp_op(WarpOp::kSync, mask, file, line, fn));
}

uint64_t shfl_xor_bits(uint64_t bits, int lane_mask, unsigned mask, const char* file, int line,
                       const char* fn) {
  Thread& t = at_warp_op(WarpOp::kShuffle, mask, file, line, fn);
  t.xin = bits;
  t.xlane = lane_mask;
  suspend(t);
  return t.xout;
}

void warp_gather(const void* src, size_t bytes, void* dst, size_t stride, unsigned mask,
                 const char* file, int line, const char* fn) {
  Thread& t = at_warp_op(WarpOp::kGather, mask, file, line, fn);
  t.gsrc = src;
  t.gbytes = bytes;
  t.gdst = dst;
  t.gstride = stride;
  suspend(t);
}

void kernel_abort(const char* what, const char* file, int line, const char* fn) {
  cur();
  fail(*t_block, std::string(what) + " at " + file + ":" + std::to_string(line), fn);
}

int warp_size() { return t_block ? t_block->cfg->warp_size : 32; }

int lane_id() { return cur().linear % t_block->cfg->warp_size; }

float* warp_scratch() {
  const int w = cur().linear / t_block->cfg->warp_size;
  return t_block->scratch.data() + static_cast<size_t>(w) * 256;
}

char* dynamic_smem() {
  cur();
  return t_block->smem;
}

size_t dynamic_smem_bytes() {
  cur();
  return t_block->cfg->smem;
}

void note_access(Access kind, int use, const void* addr, unsigned bytes, const char* file,
                 int line) {
  Thread& t = cur();
  if (!t_block->prof) return;
  t.log.push_back({reinterpret_cast<uintptr_t>(addr), file, line, static_cast<uint16_t>(bytes),
                   kind, static_cast<uint8_t>(use)});
}

void note_op(Op op) {
  Thread& t = cur();
  if (t_block->prof && t.linear % t_block->cfg->warp_size == 0)
    count_warp_op(*t_block, t.linear, op);
}

void async_copy(void* dst, const void* src, size_t bytes) {
  cur().open.push_back({dst, src, bytes});
}

void async_commit() {
  Thread& t = cur();
  t.groups.push_back(std::move(t.open));
  t.open.clear();
  if (t_block->prof && t.linear % t_block->cfg->warp_size == 0)
    count_warp_op(*t_block, t.linear, Op::kCommit);
}

void async_wait_prior(int pending) {
  Thread& t = cur();
  if (t_block->prof && t.linear % t_block->cfg->warp_size == 0)
    count_warp_op(*t_block, t.linear, Op::kWait);
  while (static_cast<int>(t.groups.size()) > pending) {
    for (const Copy& cp : t.groups.front()) {
      if (cp.src) memcpy(cp.dst, cp.src, cp.bytes);
      else memset(cp.dst, 0, cp.bytes);  // a zero fill
    }
    t.groups.pop_front();
  }
}

cudaError_t run_grid(const LaunchConfig& c, const std::function<void()>& body) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (threads == 0 || threads > 1024 || c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 ||
      c.grid.y > 65535 || c.grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  LaunchCounter* const prof = profiling() ? launch_begin(c) : nullptr;
  const uint64_t seed = base_seed() ^ (0x9e3779b97f4a7c15ull * (1 + g_launches.fetch_add(1)));
  std::mt19937_64 rng(seed);
  std::vector<uint3> blocks;
  blocks.reserve(uint64_t{c.grid.x} * c.grid.y * c.grid.z);
  for (unsigned z = 0; z < c.grid.z; ++z)
    for (unsigned y = 0; y < c.grid.y; ++y)
      for (unsigned x = 0; x < c.grid.x; ++x) blocks.push_back({x, y, z});
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const uint3& b : blocks) {
    BlockRun br;
    br.cfg = &c;
    br.block = b;
    br.seed = seed;
    br.prof = prof;
    if (prof) br.warp_ops.assign((threads + c.warp_size - 1) / c.warp_size, 0);
    // Exactly the launch's bytes (16-byte aligned, as the vector accesses need), so ASan
    // reports any access past them.
    std::unique_ptr<char[]> smem(new char[c.smem]);
    br.smem = smem.get();
    run_block(br, body, rng);
  }
  if (prof) launch_end(prof);
  return cudaSuccess;
}

}  // namespace pa_sim
