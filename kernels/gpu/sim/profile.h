// profile.h — what the emulator counts per kernel launch, as a profiler would on the GPU: global
// requests and the 32-byte sectors they touch, shared-memory wavefronts (bank conflicts) of plain
// accesses, cp.async destination writes and ldmatrix, warp instructions by class, the launch's
// geometry and occupancy by shared memory, and a roofline estimate on the declared device
// (PAGEDATTN_GPUSIM_DEVICE). Counting is off unless profile_begin() or PAGEDATTN_GPUSIM_PROFILE
// turns it on (README.md, "What it counts").
#ifndef PAGEDATTN_GPUSIM_PROFILE_H
#define PAGEDATTN_GPUSIM_PROFILE_H

#include <stdint.h>

#include <string>
#include <vector>

#include "simt.h"

namespace pa_sim {

// Global traffic by use (the wrappers' MemUse) and by access.
enum { kUseKV, kUseQ, kUseOut, kUseOther, kUses };
enum { kGlobalLd, kGlobalSt, kGlobalAsync, kGlobalKinds };
// Shared-memory accesses by kind.
enum { kSharedLd, kSharedSt, kSharedAsync, kSharedLdmatrix, kSharedKinds };

struct GlobalStat {
  uint64_t requests = 0;      // warp-wide instructions
  uint64_t bytes = 0;         // bytes the lanes asked for
  uint64_t unique_bytes = 0;  // distinct bytes among them, request by request
  uint64_t sectors = 0;       // distinct 32-byte sectors, request by request
};
struct SharedStat {
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t wavefronts = 0;  // bank-conflict passes (32 banks of 4 bytes, 128 bytes a pass)
  uint64_t ideal = 0;       // the passes the same distinct bytes need without conflicts
};

struct PA_SIM_API LaunchProfile {
  std::string kernel;  // the kernel, or the launching function with its template arguments
  std::string site;    // file:line of the launch
  std::string device;  // PAGEDATTN_GPUSIM_DEVICE at the launch
  dim3 grid, block;
  size_t smem = 0;
  int warp_size = 32;
  uint64_t launches = 0;
  uint64_t blocks = 0, blocks_active = 0;  // active: did any counted work
  uint64_t warps = 0, warps_active = 0;
  uint64_t distinct_sectors = 0;  // global sectors touched at least once (merged: summed)
  GlobalStat global[kGlobalKinds][kUses];
  SharedStat shared[kSharedKinds];
  uint64_t ops[static_cast<int>(Op::kCount)] = {};

  GlobalStat global_total(int kind) const;  // every use of one kind
  GlobalStat global_use(int use) const;     // every kind of one use
  uint64_t bytes_moved() const;             // sectors x 32 over every global request (no cache)
  // mma.sync m16n8k16: 2 x 16 x 8 x 16 FLOP; v_mfma 16x16x16: 2 x 16 x 16 x 16.
  uint64_t tensor_flops() const {
    return ops[static_cast<int>(Op::kMma)] * 4096 + ops[static_cast<int>(Op::kMfma)] * 8192;
  }
};

// Sectors per request, and bytes used / bytes fetched (distinct bytes over sectors x 32).
inline double sectors_per_request(const GlobalStat& g) {
  return g.requests ? static_cast<double>(g.sectors) / g.requests : 0;
}
inline double sector_efficiency(const GlobalStat& g) {
  return g.sectors ? static_cast<double>(g.unique_bytes) / (32.0 * g.sectors) : 0;
}
inline double wavefronts_per_request(const SharedStat& s) {
  return s.requests ? static_cast<double>(s.wavefronts) / s.requests : 0;
}

// The declared device's figures the estimate uses (vendor datasheet peaks).
struct DeviceModel {
  const char* target;
  double hbm_bytes_per_s;
  double tensor_flops_per_s;  // dense 16-bit inputs, float32 accumulation
  int sms;
  size_t smem_per_sm;         // shared memory (LDS) an SM (CU) gives its blocks
  size_t smem_reserved;       // what the runtime keeps per block
  int threads_per_sm, blocks_per_sm;
};
struct Estimate {
  const DeviceModel* device = nullptr;  // null: a device the table does not know
  int blocks_per_sm = 0;                // by shared memory, threads and the block limit
  const char* occupancy_limit = "";
  double sm_fraction = 0;               // SMs with work: active blocks / SMs, at most 1
  double memory_s = 0, tensor_s = 0, time_s = 0;
  const char* bound = "";               // "memory" or "tensor"
};
PA_SIM_API const DeviceModel* device_model(const char* target);
PA_SIM_API Estimate estimate(const LaunchProfile& p);

// Starts counting (and forgets earlier launches); stops; the launches counted since the start.
PA_SIM_API void profile_begin();
PA_SIM_API void profile_end();
PA_SIM_API std::vector<LaunchProfile> profile_get();
// Launches of one kernel, geometry and device merged into one (counts added, `launches` kept).
PA_SIM_API std::vector<LaunchProfile> profile_by_kernel(const std::vector<LaunchProfile>& v);
// The report of one launch (or merge). min_bytes > 0: the bytes the work needs at least, to
// which the bytes moved are compared.
PA_SIM_API std::string profile_report(const LaunchProfile& p, double min_bytes = 0);

// The block runner's side (block.cpp).
struct AccessRecord {
  uintptr_t addr;
  const char* file;
  int line;
  uint16_t bytes;
  Access kind;
  uint8_t use;
};
struct LaunchCounter;
LaunchCounter* launch_begin(const LaunchConfig& c);
// One warp of a finished block: its lanes' records, each in program order.
void warp_done(LaunchCounter* lc, const std::vector<const std::vector<AccessRecord>*>& lanes,
               bool counted_ops);
void block_done(LaunchCounter* lc, bool active);
void count_op(LaunchCounter* lc, Op op, uint64_t n);
void launch_end(LaunchCounter* lc);

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_PROFILE_H
