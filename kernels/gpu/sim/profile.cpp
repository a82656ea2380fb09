// profile.cpp — the emulator's counters (profile.h): a finished block's per-lane access records
// become warp-wide requests (the lanes' k-th access at one call site and of one kind is one
// instruction), global requests are measured in 32-byte sectors, shared ones in wavefronts over
// 32 banks of 4 bytes, and each launch is reported with its geometry, occupancy by shared memory
// and a roofline estimate of the declared device.
#include "profile.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace pa_sim {

struct LaunchCounter {
  LaunchProfile p;
  std::unordered_set<uintptr_t> sectors;  // every global sector the launch touched
};

namespace {

// PAGEDATTN_GPUSIM_PROFILE: unset, empty or 0 counts nothing unless profile_begin() asks; 1
// prints every launch's report to stderr; anything else is a file the reports are appended to.
const char* env_target() {
  static const char* t = [] {
    const char* e = getenv("PAGEDATTN_GPUSIM_PROFILE");
    return (e && *e && strcmp(e, "0") != 0) ? e : static_cast<const char*>(nullptr);
  }();
  return t;
}

std::mutex g_mu;
bool g_api = false;  // profile_begin() .. profile_end()
std::vector<LaunchProfile> g_launches;

void update_flag() { g_profiling = g_api || env_target() != nullptr; }

// "T f(args) [with A = x; B = y]" (gcc) or "T f(args) [A = x, B = y]" (clang) as "f<x, y>",
// without the namespace and a leading "launch_".
std::string short_function(const char* pretty) {
  const std::string s = pretty ? pretty : "";
  const size_t paren = s.find('(');
  if (paren == std::string::npos) return s;
  size_t start = s.rfind(' ', paren);
  std::string fn = s.substr(start == std::string::npos ? 0 : start + 1, paren - start - 1);
  if (fn.rfind("pagedattn_gpu::", 0) == 0) fn = fn.substr(15);
  if (fn.rfind("launch_", 0) == 0) fn = fn.substr(7);
  const size_t open = s.find('[', paren);
  if (open == std::string::npos) return fn;
  std::string body = s.substr(open + 1, s.rfind(']') - open - 1);
  if (body.rfind("with ", 0) == 0) body = body.substr(5);
  std::vector<std::string> args;
  int depth = 0;
  std::string cur;
  for (char ch : body) {
    if (ch == '<') ++depth;
    if (ch == '>') --depth;
    if ((ch == ';' || ch == ',') && depth == 0) {
      args.push_back(cur);
      cur.clear();
      continue;
    }
    cur += ch;
  }
  args.push_back(cur);
  std::string out;
  for (std::string a : args) {
    while (!a.empty() && a[0] == ' ') a.erase(0, 1);
    const size_t eq = a.find(" = ");
    // gcc also spells out the typedefs of the signature (gpuError_t = cudaError; ...).
    if (eq != std::string::npos && eq >= 2 && a.compare(eq - 2, 2, "_t") == 0) continue;
    if (eq != std::string::npos) a = a.substr(eq + 3);
    for (size_t at; (at = a.find("pagedattn_gpu::")) != std::string::npos;) a.erase(at, 15);
    out += (out.empty() ? "" : ", ") + a;
  }
  return fn + "<" + out + ">";
}

bool is_global(Access k) {
  return k == Access::kGlobalLoad || k == Access::kGlobalStore || k == Access::kAsyncSrc;
}
int global_kind(Access k) {
  return k == Access::kGlobalLoad ? kGlobalLd : k == Access::kGlobalStore ? kGlobalSt : kGlobalAsync;
}
int shared_kind(Access k) {
  switch (k) {
    case Access::kSharedLoad: return kSharedLd;
    case Access::kSharedStore: return kSharedSt;
    case Access::kAsyncDst: return kSharedAsync;
    default: return kSharedLdmatrix;
  }
}

struct Item {
  const char* file;
  int line;
  Access kind;
  uint32_t occ;  // the lane's how-many-th access of this site and kind
  int lane;
  uintptr_t addr;
  unsigned bytes;
  int use;
};

// Distinct bytes of [addr, addr + bytes) over the items, and the distinct 32-byte sectors.
void union_of(std::vector<std::pair<uintptr_t, uintptr_t>>& iv, uint64_t* unique,
              uint64_t* sectors) {
  std::sort(iv.begin(), iv.end());
  uint64_t u = 0, sec = 0;
  uintptr_t lo = 0, hi = 0;
  bool any_sector = false;
  uintptr_t last_sector = 0;
  auto close = [&]() {
    u += hi - lo;
    uintptr_t first = lo >> 5;
    const uintptr_t end = (hi - 1) >> 5;
    if (any_sector && first <= last_sector) first = last_sector + 1;  // counted already
    if (end >= first) sec += end - first + 1;
    if (!any_sector || end > last_sector) last_sector = end;
    any_sector = true;
  };
  bool open = false;
  for (const auto& r : iv) {
    if (open && r.first <= hi) {
      hi = std::max(hi, r.second);
      continue;
    }
    if (open) close();
    lo = r.first;
    hi = r.second;
    open = true;
  }
  if (open) close();
  *unique = u;
  *sectors = sec;
}

// Wavefronts of one shared-memory request: 128 bytes a pass, so the lanes go in phases of
// 128 / width (32 lanes up to 4 bytes each, 16 at 8, 8 at 16; a wave of 64 lanes makes two
// phases of 32 at 4 bytes, AMD's LDS serving half a wave at a time); within a phase a bank gives
// one distinct 4-byte word a pass (lanes on one word share it).
void wavefronts_of(const Item* b, const Item* e, uint64_t* waves, uint64_t* ideal) {
  unsigned width = 1;
  for (const Item* i = b; i != e; ++i) width = std::max(width, i->bytes);
  const int per_phase = 128 / static_cast<int>(std::min(16u, std::max(4u, width)));
  std::vector<std::pair<int, uintptr_t>> words;  // (phase, word)
  std::vector<std::pair<uintptr_t, uintptr_t>> iv;
  for (const Item* i = b; i != e; ++i) {
    for (uintptr_t w = i->addr >> 2; w <= (i->addr + i->bytes - 1) >> 2; ++w)
      words.push_back({i->lane / per_phase, w});
    iv.push_back({i->addr, i->addr + i->bytes});
  }
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  uint64_t total = 0;
  for (size_t s = 0; s < words.size();) {
    size_t t = s;
    int per_bank[32] = {};
    int most = 0;
    for (; t < words.size() && words[t].first == words[s].first; ++t)
      most = std::max(most, ++per_bank[words[t].second % 32]);
    total += most;
    s = t;
  }
  uint64_t unique = 0, sectors = 0;
  union_of(iv, &unique, &sectors);
  *waves = total;
  *ideal = std::max<uint64_t>(1, (unique + 127) / 128);
}

void add(GlobalStat& a, const GlobalStat& b) {
  a.requests += b.requests;
  a.bytes += b.bytes;
  a.unique_bytes += b.unique_bytes;
  a.sectors += b.sectors;
}
void add(SharedStat& a, const SharedStat& b) {
  a.requests += b.requests;
  a.bytes += b.bytes;
  a.wavefronts += b.wavefronts;
  a.ideal += b.ideal;
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// Vendor datasheet peaks: HBM/GDDR bandwidth, dense 16-bit tensor (matrix) throughput with
// float32 accumulation; per-SM (per-CU, per-WGP on gfx1100) shared memory, its per-block
// reservation, resident threads and blocks. SM counts as the runtime declares them.
constexpr DeviceModel kModels[] = {
    {"sm_90", 3.35e12, 989e12, 132, 228 * 1024, 1024, 2048, 32},      // H100 SXM
    {"sm_100", 8.0e12, 2250e12, 148, 228 * 1024, 1024, 2048, 32},     // B200
    {"sm_120", 1.792e12, 209.5e12, 170, 100 * 1024, 1024, 1536, 32},  // RTX 5090
    {"sm_89", 1.008e12, 165.2e12, 128, 100 * 1024, 1024, 1536, 24},   // RTX 4090
    {"sm_86", 1.008e12, 80e12, 84, 100 * 1024, 1024, 1536, 16},       // RTX 3090 Ti
    {"sm_80", 2.0e12, 312e12, 108, 164 * 1024, 1024, 2048, 32},       // A100
    {"sm_80_64k", 2.0e12, 312e12, 108, 64 * 1024, 1024, 2048, 32},    // no such part
    {"sm_75", 0.32e12, 65e12, 40, 64 * 1024, 0, 1024, 16},            // T4
    {"gfx90a", 1.6e12, 191e12, 104, 64 * 1024, 0, 2048, 32},          // one MI250X die
    {"gfx942", 5.3e12, 1307e12, 304, 64 * 1024, 0, 2048, 32},         // MI300X
    {"gfx1100", 0.96e12, 122.8e12, 48, 128 * 1024, 0, 2048, 32},      // RX 7900 XTX (WGPs)
};

}  // namespace

bool g_profiling = (env_target() != nullptr);

GlobalStat LaunchProfile::global_total(int kind) const {
  GlobalStat s;
  for (int u = 0; u < kUses; ++u) add(s, global[kind][u]);
  return s;
}
GlobalStat LaunchProfile::global_use(int use) const {
  GlobalStat s;
  for (int k = 0; k < kGlobalKinds; ++k) add(s, global[k][use]);
  return s;
}
uint64_t LaunchProfile::bytes_moved() const {
  uint64_t b = 0;
  for (int k = 0; k < kGlobalKinds; ++k) b += 32 * global_total(k).sectors;
  return b;
}

LaunchCounter* launch_begin(const LaunchConfig& c) {
  auto* lc = new LaunchCounter();
  LaunchProfile& p = lc->p;
  p.kernel = strcmp(c.name, "kernel") == 0 && c.from && *c.from ? short_function(c.from) : c.name;
  p.site = std::string(c.file) + ":" + std::to_string(c.line);
  const char* dev = getenv("PAGEDATTN_GPUSIM_DEVICE");
  p.device = dev && *dev ? dev : "sm_90";
  p.grid = c.grid;
  p.block = c.block;
  p.smem = c.smem;
  p.warp_size = c.warp_size;
  p.launches = 1;
  return lc;
}

void warp_done(LaunchCounter* lc, const std::vector<const std::vector<AccessRecord>*>& lanes,
               bool counted) {
  LaunchProfile& p = lc->p;
  ++p.warps;
  if (counted) ++p.warps_active;
  static thread_local std::vector<Item> items;
  items.clear();
  struct SiteCount {
    const char* file;
    int line;
    Access kind;
    uint32_t n;
  };
  std::vector<SiteCount> seen;
  for (size_t l = 0; l < lanes.size(); ++l) {
    seen.clear();
    for (const AccessRecord& r : *lanes[l]) {
      SiteCount* sc = nullptr;
      for (SiteCount& s : seen)
        if (s.line == r.line && s.kind == r.kind && s.file == r.file) sc = &s;
      if (!sc) {
        seen.push_back({r.file, r.line, r.kind, 0});
        sc = &seen.back();
      }
      items.push_back({r.file, r.line, r.kind, sc->n++, static_cast<int>(l), r.addr, r.bytes,
                       r.use});
    }
  }
  auto key = [](const Item& i) {
    return std::make_tuple(reinterpret_cast<uintptr_t>(i.file), i.line, static_cast<int>(i.kind),
                           i.occ, i.lane);
  };
  std::sort(items.begin(), items.end(),
            [&](const Item& a, const Item& b) { return key(a) < key(b); });
  std::vector<std::pair<uintptr_t, uintptr_t>> iv;
  for (size_t s = 0; s < items.size();) {
    size_t t = s + 1;
    while (t < items.size() && items[t].file == items[s].file && items[t].line == items[s].line &&
           items[t].kind == items[s].kind && items[t].occ == items[s].occ)
      ++t;
    const Item* b = &items[s];
    const Item* e = b + (t - s);
    uint64_t bytes = 0;
    for (const Item* i = b; i != e; ++i) bytes += i->bytes;
    if (is_global(b->kind)) {
      iv.clear();
      for (const Item* i = b; i != e; ++i) iv.push_back({i->addr, i->addr + i->bytes});
      GlobalStat g;
      g.requests = 1;
      g.bytes = bytes;
      union_of(iv, &g.unique_bytes, &g.sectors);
      for (const auto& r : iv)
        for (uintptr_t s = r.first >> 5; s <= (r.second - 1) >> 5; ++s) lc->sectors.insert(s);
      add(p.global[global_kind(b->kind)][std::min(b->use, kUses - 1)], g);
    } else {
      SharedStat sh;
      sh.requests = 1;
      sh.bytes = bytes;
      wavefronts_of(b, e, &sh.wavefronts, &sh.ideal);
      add(p.shared[shared_kind(b->kind)], sh);
    }
    s = t;
  }
}

void block_done(LaunchCounter* lc, bool active) {
  ++lc->p.blocks;
  if (active) ++lc->p.blocks_active;
}

void count_op(LaunchCounter* lc, Op op, uint64_t n) { lc->p.ops[static_cast<int>(op)] += n; }

void launch_end(LaunchCounter* lc) {
  lc->p.distinct_sectors = lc->sectors.size();
  std::lock_guard<std::mutex> lk(g_mu);
  if (const char* t = env_target()) {
    const std::string r = profile_report(lc->p);
    FILE* f = strcmp(t, "1") == 0 ? stderr : fopen(t, "a");
    if (f) {
      fputs(r.c_str(), f);
      if (f != stderr) fclose(f);
    }
  }
  if (g_api) g_launches.push_back(std::move(lc->p));
  delete lc;
}

void profile_begin() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_launches.clear();
  g_api = true;
  update_flag();
}
void profile_end() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_api = false;
  update_flag();
}
std::vector<LaunchProfile> profile_get() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_launches;
}

std::vector<LaunchProfile> profile_by_kernel(const std::vector<LaunchProfile>& v) {
  std::vector<LaunchProfile> out;
  for (const LaunchProfile& l : v) {
    LaunchProfile* m = nullptr;
    for (LaunchProfile& o : out)
      if (o.kernel == l.kernel && o.device == l.device && o.smem == l.smem &&
          o.block.x * o.block.y * o.block.z == l.block.x * l.block.y * l.block.z)
        m = &o;
    if (!m) {
      out.push_back(l);
      continue;
    }
    m->launches += l.launches;
    m->blocks += l.blocks;
    m->blocks_active += l.blocks_active;
    m->warps += l.warps;
    m->warps_active += l.warps_active;
    m->distinct_sectors += l.distinct_sectors;
    for (int k = 0; k < kGlobalKinds; ++k)
      for (int u = 0; u < kUses; ++u) add(m->global[k][u], l.global[k][u]);
    for (int k = 0; k < kSharedKinds; ++k) add(m->shared[k], l.shared[k]);
    for (int o = 0; o < static_cast<int>(Op::kCount); ++o) m->ops[o] += l.ops[o];
  }
  return out;
}

const DeviceModel* device_model(const char* target) {
  for (const DeviceModel& d : kModels)
    if (strcmp(d.target, target) == 0) return &d;
  return nullptr;
}

Estimate estimate(const LaunchProfile& p) {
  Estimate e;
  e.device = device_model(p.device.c_str());
  if (!e.device) return e;
  const DeviceModel& d = *e.device;
  const uint64_t threads = uint64_t{p.block.x} * p.block.y * p.block.z;
  // No shared memory and none reserved (AMD): shared memory does not limit the blocks.
  const uint64_t smem_block = p.smem + d.smem_reserved;
  const uint64_t by_smem = smem_block ? d.smem_per_sm / smem_block : d.blocks_per_sm;
  const uint64_t by_threads = threads ? d.threads_per_sm / threads : 0;
  uint64_t blocks = d.blocks_per_sm;
  e.occupancy_limit = "blocks per SM";
  if (by_threads < blocks) {
    blocks = by_threads;
    e.occupancy_limit = "threads";
  }
  if (by_smem < blocks) {
    blocks = by_smem;
    e.occupancy_limit = "shared memory";
  }
  e.blocks_per_sm = static_cast<int>(blocks);
  const double per_launch = p.launches ? static_cast<double>(p.blocks_active) / p.launches : 0;
  e.sm_fraction = std::min(1.0, per_launch / d.sms);
  if (e.sm_fraction <= 0) return e;
  e.memory_s = 32.0 * p.distinct_sectors / (d.hbm_bytes_per_s * e.sm_fraction);
  e.tensor_s = static_cast<double>(p.tensor_flops()) / (d.tensor_flops_per_s * e.sm_fraction);
  e.time_s = std::max(e.memory_s, e.tensor_s);
  e.bound = e.tensor_s > e.memory_s ? "tensor" : "memory";
  return e;
}

std::string profile_report(const LaunchProfile& p, double min_bytes) {
  static const char* const kUseNames[kUses] = {"K/V", "Q", "out", "other"};
  static const char* const kGlobalNames[kGlobalKinds] = {"load", "store", "cp.async"};
  static const char* const kSharedNames[kSharedKinds] = {"load", "store", "cp.async dst",
                                                         "ldmatrix"};
  static const char* const kOpNames[static_cast<int>(Op::kCount)] = {
      "mma.sync", "shuffle", "syncwarp", "barrier", "cp.async commit", "cp.async wait",
      "mfma"};
  const uint64_t threads = uint64_t{p.block.x} * p.block.y * p.block.z;
  const double warps = p.warps_active ? static_cast<double>(p.warps_active) : 1.0;
  std::string r = fmt("gpusim profile: %s (launched at %s) on %s, %llu launch%s\n",
                      p.kernel.c_str(), p.site.c_str(), p.device.c_str(),
                      static_cast<unsigned long long>(p.launches), p.launches == 1 ? "" : "es");
  const Estimate e = estimate(p);
  r += fmt("  geometry: grid (%u,%u,%u), %llu blocks (%llu active) of %llu threads (warp %d), "
           "%zu B dynamic shared memory",
           p.grid.x, p.grid.y, p.grid.z, static_cast<unsigned long long>(p.blocks),
           static_cast<unsigned long long>(p.blocks_active),
           static_cast<unsigned long long>(threads), p.warp_size, p.smem);
  if (e.device)
    r += fmt("; %d blocks/SM (limit: %s; registers not modeled)", e.blocks_per_sm,
             e.occupancy_limit);
  r += "\n";
  for (int k = 0; k < kGlobalKinds; ++k)
    for (int u = 0; u < kUses; ++u) {
      const GlobalStat& g = p.global[k][u];
      if (!g.requests) continue;
      r += fmt("  global %-8s %-5s %9llu requests  %6.2f sectors/request  efficiency %5.1f%%  "
               "%llu B moved (%llu B asked)\n",
               kGlobalNames[k], kUseNames[u], static_cast<unsigned long long>(g.requests),
               sectors_per_request(g), 100 * sector_efficiency(g),
               static_cast<unsigned long long>(32 * g.sectors),
               static_cast<unsigned long long>(g.bytes));
    }
  r += fmt("  global bytes moved %llu (sectors of every request), %llu distinct (each sector "
           "once: DRAM with a perfect L2)",
           static_cast<unsigned long long>(p.bytes_moved()),
           static_cast<unsigned long long>(32 * p.distinct_sectors));
  if (min_bytes > 0)
    r += fmt("\n  vs the minimum %.0f B: moved %.3f x, distinct %.3f x, K/V moved %.3f x",
             min_bytes, p.bytes_moved() / min_bytes, 32.0 * p.distinct_sectors / min_bytes,
             32.0 * p.global_use(kUseKV).sectors / min_bytes);
  r += "\n";
  for (int k = 0; k < kSharedKinds; ++k) {
    const SharedStat& s = p.shared[k];
    if (!s.requests) continue;
    r += fmt("  shared %-12s %9llu requests  %6.2f wavefronts/request (ideal %.2f)\n",
             kSharedNames[k], static_cast<unsigned long long>(s.requests),
             wavefronts_per_request(s), static_cast<double>(s.ideal) / s.requests);
  }
  r += "  per active warp:";
  for (int o = 0; o < static_cast<int>(Op::kCount); ++o)
    r += fmt(" %s %.1f,", kOpNames[o], p.ops[o] / warps);
  r += fmt(" ldmatrix %.1f, global ld %.1f st %.1f cp.async %.1f, shared ld %.1f st %.1f "
           "(FP32 and conversions not counted)\n",
           p.shared[kSharedLdmatrix].requests / warps, p.global_total(kGlobalLd).requests / warps,
           p.global_total(kGlobalSt).requests / warps,
           p.global_total(kGlobalAsync).requests / warps, p.shared[kSharedLd].requests / warps,
           p.shared[kSharedSt].requests / warps);
  if (e.device && e.time_s > 0) {
    r += fmt("  roofline %s (%.2f TB/s, %.0f TFLOP/s tensor, %d SMs) of the distinct bytes and "
             "the mma.sync FLOP (%.3g), "
             "%.0f%% of SMs busy, estimated %.2f us, %s-bound (memory %.2f us, tensor %.2f us)\n",
             e.device->target, e.device->hbm_bytes_per_s / 1e12,
             e.device->tensor_flops_per_s / 1e12, e.device->sms,
             static_cast<double>(p.tensor_flops()), 100 * e.sm_fraction, e.time_s * 1e6, e.bound,
             e.memory_s * 1e6, e.tensor_s * 1e6);
  }
  return r;
}

}  // namespace pa_sim
