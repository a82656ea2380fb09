// mla.cu — the multi-head latent attention kernels (mla.cuh) of every query and cache type
// instantiations.h lists, and their dispatch.
#include "mla.cuh"

#include <algorithm>

namespace pagedattn_gpu {

#if defined(PA_HAS_MMA_SYNC)
constexpr bool kMlaHasMma = true;
constexpr size_t kMlaMmaBytes = MlaMmaTile::kBytes;
#else
constexpr bool kMlaHasMma = false;
constexpr size_t kMlaMmaBytes = 0;
#endif

gpuError_t launch_mla(int32_t qt, int32_t kt, int32_t max_items, int32_t subtiles,
                      const MlaParams& p, gpuStream_t stream, int* unsupported) {
  if (max_items <= 0 || subtiles <= 0) return gpuSuccess;
  switch (qt) {
#define PA_MLA_DTYPE(CODE, T, ...) \
  case CODE: return launch_mla_t<T>(qt, kt, max_items, subtiles, p, stream, unsupported);
    PA_GPU_DTYPES(PA_MLA_DTYPE, )
#undef PA_MLA_DTYPE
    default: *unsupported = 1; return gpuSuccess;
  }
}

size_t mla_smem_need(int32_t qt) {
  size_t need = 0;
#define PA_MLA_NEED(CODE, KT, ...) need = std::max(need, MlaScalarTile<KT>::kBytes);
#define PA_MLA_NEED_Q(CODE, T, ...)                          \
  if (qt == (CODE)) {                                        \
    PA_GPU_CACHE_DTYPES(PA_MLA_NEED, CODE, T, )              \
    if (sizeof(T) == 2 && kMlaHasMma) need = kMlaMmaBytes;    \
  }
  PA_GPU_DTYPES(PA_MLA_NEED_Q, )
#undef PA_MLA_NEED_Q
#undef PA_MLA_NEED
  return need;
}

}  // namespace pagedattn_gpu
