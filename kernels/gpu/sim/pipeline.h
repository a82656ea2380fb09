// pipeline.h — the cp.async primitives of <cuda_pipeline.h> as deferred copies: a copy lands
// only when a __pipeline_wait_prior retires its group, so a read before the wait sees the old
// shared memory, as on the GPU.
#ifndef PAGEDATTN_GPUSIM_PIPELINE_H
#define PAGEDATTN_GPUSIM_PIPELINE_H

#include "device.h"

// Copies bytes - zfill bytes of src and zeroes the zfill bytes after them, when the group
// retires (CUDA's zero fill: the hardware reads nothing past bytes - zfill).
inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes,
                                    size_t zfill = 0) {
  if (zfill > bytes) zfill = bytes;
  if (bytes > zfill) ::pa_sim::async_copy(dst, src, bytes - zfill);
  if (zfill) ::pa_sim::async_copy(static_cast<char*>(dst) + (bytes - zfill), nullptr, zfill);
}
inline void __pipeline_commit() { ::pa_sim::async_commit(); }
inline void __pipeline_wait_prior(size_t pending) {
  ::pa_sim::async_wait_prior(static_cast<int>(pending));
}

#endif  // PAGEDATTN_GPUSIM_PIPELINE_H
