// attention_bf16.cu — attention kernels with bf16 queries (one translation unit per query type so
// the build compiles them in parallel). The instantiated sizes are listed in instantiations.h.
#include "instantiations.h"
#include "attention.cuh"

namespace pagedattn_gpu {

gpuError_t launch_attention_bf16(int32_t kt, bool decode, int32_t max_items, const AttnParams& p,
                              gpuStream_t stream, int* unsupported) {
  return launch_attention_t<bf16_t>(kt, decode, max_items, p, stream, unsupported);
}

}  // namespace pagedattn_gpu
