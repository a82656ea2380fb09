// kernels/cpu/backend.h — the cpu backend's published face, for a backend that embeds it (the
// onednn plugin runs its decode and short-chunk rows through it, so both backends plan and split
// those rows alike). With it, the scalar conversions of convert.h are published too: an embedder
// that converts elements itself uses them, so it rounds exactly as these kernels do. Nothing else
// of kernels/cpu is for other backends. The op table itself is pa_cpu_backend_ops() of the
// contract header. Internal: not part of the public API or the plugin ABI.
#ifndef PAGEDATTN_KERNELS_CPU_BACKEND_H_
#define PAGEDATTN_KERNELS_CPU_BACKEND_H_

#include <stdint.h>

#include <atomic>

#include "plugin_abi.h"

namespace pa_cpu {

// Creates a CPU backend state for pa_cpu_backend_ops() like its create op, except that its
// allocations are counted in *shared_used (the embedder's counter, which must outlive it)
// against opts->memory_limit, so one limit covers the embedder and this backend together.
// Destroy with pa_cpu_backend_ops()->destroy. Same statuses as the create op.
pagedattn_status create_embedded(void** state, const pagedattn_backend_options* opts,
                                 std::atomic<uint64_t>* shared_used, char* msg);

// The SIMD target a cpu backend runs, as an embedder needs it.
struct TargetChoice {
  // The target's index in Highway's dispatch tables: code compiled with the same Highway targets
  // as the cpu kernels (hwy_dep) dispatches to the same target through it.
  uint32_t index;
  // The decode runs on AVX512-BF16 dot products (the "AVX3_BF16" pseudo-target), converting fp8
  // caches in registers.
  bool bf16_dp;
};

// Picks the target a cpu backend created now runs, as its create op does: PAGEDATTN_CPU_TARGET
// (or the best this CPU runs) and PAGEDATTN_CPU_PREFETCH. Returns PAGEDATTN_OK;
// PAGEDATTN_ERROR_UNSUPPORTED for a target that is unknown, not compiled in or not runnable here,
// or PAGEDATTN_ERROR_INVALID_ARGUMENT for another PAGEDATTN_CPU_PREFETCH than "twice" or "once",
// with msg (PA_MSG_LEN) saying why; *out is then untouched. Reads the environment only; may
// throw std::bad_alloc (composing a message).
pagedattn_status choose_target(TargetChoice* out, char* msg);

}  // namespace pa_cpu

#endif  // PAGEDATTN_KERNELS_CPU_BACKEND_H_
