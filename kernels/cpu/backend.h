// lib/cpu/cpu_backend.h — the CPU backend for code that embeds it (the onednn plugin runs its
// decode and short-chunk rows through it, so both backends plan and split those rows alike).
// Internal: not part of the public API or the plugin ABI.
#ifndef PAGEDATTN_LIB_CPU_CPU_BACKEND_H_
#define PAGEDATTN_LIB_CPU_CPU_BACKEND_H_

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

}  // namespace pa_cpu

#endif  // PAGEDATTN_LIB_CPU_CPU_BACKEND_H_
