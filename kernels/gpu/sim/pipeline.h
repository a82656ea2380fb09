// pipeline.h — the cp.async primitives of <cuda_pipeline.h> as deferred copies: a copy lands
// only when a __pipeline_wait_prior retires its group, so a read before the wait sees the old
// shared memory, as on the GPU.
#ifndef PAGEDATTN_GPUSIM_PIPELINE_H
#define PAGEDATTN_GPUSIM_PIPELINE_H

#include "device.h"

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes,
                                    size_t zfill = 0) {
  (void)zfill;
  ::pa_sim::async_copy(dst, src, bytes);
}
inline void __pipeline_commit() { ::pa_sim::async_commit(); }
inline void __pipeline_wait_prior(size_t pending) {
  ::pa_sim::async_wait_prior(static_cast<int>(pending));
}

#endif  // PAGEDATTN_GPUSIM_PIPELINE_H
