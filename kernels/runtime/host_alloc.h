/* kernels/runtime/host_alloc.h — the CPU-side backends' host allocator: caches and batch
 * workspaces of the cpu backend, the onednn plugin's tile buffers. Every block is counted in a
 * byte counter checked against a limit (a backend's memory_limit), which a backend and the cpu
 * backend it embeds share, so one limit covers both. */
#ifndef PAGEDATTN_KERNELS_RUNTIME_HOST_ALLOC_H
#define PAGEDATTN_KERNELS_RUNTIME_HOST_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include <atomic>

namespace pa_runtime {

/* Returns `bytes` of zeroed host memory, 64-byte aligned, and adds bytes + 64 (the block and its
 * header) to *used. Blocks of 4 MiB or more are anonymous mappings, zero when first touched (a
 * large cache is not written, nor its pages committed, up front), that start on 2 MiB boundaries
 * with transparent huge pages asked for: paged attention reads scattered cache blocks, and 4 KiB
 * pages would miss the TLB on nearly every one. `limit` caps *used (0: no cap). Returns NULL, with *used unchanged and msg
 * (PA_MSG_LEN bytes, or NULL for none) saying "<what>: ..." why, when the size overflows, the
 * limit would be exceeded, or the system has no memory for it. Thread-safe. */
void* host_alloc(std::atomic<uint64_t>* used, uint64_t limit, size_t bytes, char* msg,
                 const char* what);

/* Frees a block of host_alloc (NULL: does nothing) and takes its bytes off *used, the counter it
 * was allocated against. */
void host_free(std::atomic<uint64_t>* used, void* ptr);

}  // namespace pa_runtime

#endif  // PAGEDATTN_KERNELS_RUNTIME_HOST_ALLOC_H
