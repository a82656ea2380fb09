// cache_ops.cu — cache write (reshape-and-cache), block copies, split-KV merge and merge_states.
#include <math.h>

#include <algorithm>

#include "gpu_kernels.h"
#include "instantiations.h"
#include "types.cuh"
#include "variant.cuh"

namespace pagedattn_gpu {

// Stores 8 floats as 8 elements of CT at p: one vector store when `vec` (aligned), else 8.
template <typename CT>
__device__ __forceinline__ void store8(CT* p, const float* f, bool vec) {
  __align__(16) CT e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<CT>(f[i]);
  if (vec) {
    if constexpr (sizeof(CT) == 4) {
      reinterpret_cast<float4*>(p)[0] = *reinterpret_cast<const float4*>(&e[0]);
      reinterpret_cast<float4*>(p)[1] = *reinterpret_cast<const float4*>(&e[4]);
    } else if constexpr (sizeof(CT) == 2) {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(e);
    } else {
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(e);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = e[i];
  }
}

template <typename T>
__device__ __forceinline__ void load8_any(const T* p, float* f, bool vec) {
  if (vec) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = reinterpret_cast<const float4*>(p)[0];
      const float4 b = reinterpret_cast<const float4*>(p)[1];
      f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
      f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
      return;
    } else {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      load_floats<T, 8>(reinterpret_cast<const T*>(&u), f);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_float(p[i]);
}

// One thread per 8 elements of one (row, head); a slot outside [0, num_slots) is skipped, so a
// device slot mapping can never make us write out of range.
template <typename T, typename CT>
__global__ void cache_write_kernel(const WriteParams p) {
  const int64_t n = p.n_dev ? static_cast<int64_t>(*p.n_dev) : p.n;
  const int groups = p.dim / 8;
  const int64_t per_row = static_cast<int64_t>(p.heads) * groups;
  const int64_t total = n * per_row;
  const bool vec = p.vec8 != 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row;
    const int h = static_cast<int>((i % per_row) / groups);
    const int d0 = static_cast<int>(i % groups) * 8;
    const int64_t slot = !p.slots ? p.inline_slots[row]
                         : p.slots_int64 ? static_cast<const int64_t*>(p.slots)[row]
                                         : static_cast<const int32_t*>(p.slots)[row];
    if (slot < 0 || slot >= p.num_slots) continue;
    // fp8 stores x / scale of head h (a true division, as kernels/cpu/convert.h does: multiplying
    // by a rounded reciprocal can land one ulp off and round to the neighbouring fp8 code).
    const float ks = is_fp8<CT>::value ? head_scale(p.k_head_scales, h, p.k_scale) : 1.f;
    const float vsc = is_fp8<CT>::value ? head_scale(p.v_head_scales, h, p.v_scale) : 1.f;
    const int64_t off = (slot / p.block_size) * p.block_stride + (slot % p.block_size) * p.slot_stride +
                        h * p.head_stride + d0;
    float f[8];
    load8_any<T>(static_cast<const T*>(p.k) + row * p.k_row + h * p.k_head + d0, f, vec);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] / ks;
    store8<CT>(static_cast<CT*>(p.ck) + off, f, vec);
    load8_any<T>(static_cast<const T*>(p.v) + row * p.v_row + h * p.v_head + d0, f, vec);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] / vsc;
    store8<CT>(static_cast<CT*>(p.cv) + off, f, vec);
  }
}

// A latent cache's write: one thread per 8 values of a row, the leading latent_k from k, the
// rest from v, stored once (no V); fp8 stores x / k_scale. Bad slots are skipped as above.
template <typename T, typename CT>
__global__ void cache_write_latent_kernel(const WriteParams p) {
  const int64_t n = p.n_dev ? static_cast<int64_t>(*p.n_dev) : p.n;
  const int groups = p.dim / 8;
  const int64_t total = n * groups;
  const int lead = p.latent_k;
  const bool vec = p.vec8 != 0;  // only when lead is a multiple of 8: no group straddles
  const float sc = is_fp8<CT>::value ? head_scale(p.k_head_scales, 0, p.k_scale) : 1.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / groups;
    const int d0 = static_cast<int>(i % groups) * 8;
    const int64_t slot = !p.slots ? p.inline_slots[row]
                         : p.slots_int64 ? static_cast<const int64_t*>(p.slots)[row]
                                         : static_cast<const int32_t*>(p.slots)[row];
    if (slot < 0 || slot >= p.num_slots) continue;
    const int64_t off =
        (slot / p.block_size) * p.block_stride + (slot % p.block_size) * p.slot_stride + d0;
    const T* kr = static_cast<const T*>(p.k) + row * p.k_row;
    float f[8];
    if (d0 + 8 <= lead) {
      load8_any<T>(kr + d0, f, vec);
    } else {
      const T* vr = static_cast<const T*>(p.v) + row * p.v_row;
      if (d0 >= lead) {
        load8_any<T>(vr + (d0 - lead), f, vec);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int d = d0 + e;
          f[e] = to_float(d < lead ? kr[d] : vr[d - lead]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = f[e] / sc;
    store8<CT>(static_cast<CT*>(p.ck) + off, f, vec);
  }
}

template <typename T, typename CT>
gpuError_t launch_write_t(int64_t max_rows, const WriteParams& p, gpuStream_t stream) {
  const int64_t total = max_rows * p.heads * (p.dim / 8);
  if (total <= 0) return gpuSuccess;
  const int threads = 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;  // grid-stride loop covers the rest
  auto kernel = p.latent_k > 0 ? cache_write_latent_kernel<T, CT> : cache_write_kernel<T, CT>;
  PA_LAUNCH(kernel, static_cast<unsigned>(blocks), threads, 0, stream)(p);
  return gpuGetLastError();
}

// Every cache type instantiations.h lists for inputs of type T (code qt).
template <typename T>
gpuError_t launch_write_q(int32_t qt, int32_t ct, int64_t max_rows, const WriteParams& p,
                          gpuStream_t stream) {
#define PA_WRITE_CACHE(CODE, CT, ...) \
  if (ct == (CODE)) return launch_write_t<T, CT>(max_rows, p, stream);
  PA_GPU_CACHE_DTYPES(PA_WRITE_CACHE, qt, T, )
#undef PA_WRITE_CACHE
  return gpuErrorInvalidValue;
}

gpuError_t launch_cache_write(int32_t qt, int32_t ct, int64_t max_rows, const WriteParams& p,
                              gpuStream_t stream) {
  switch (qt) {
#define PA_WRITE_DTYPE(CODE, T, ...) \
  case CODE: return launch_write_q<T>(qt, ct, max_rows, p, stream);
    PA_GPU_DTYPES(PA_WRITE_DTYPE, )
#undef PA_WRITE_DTYPE
    default: return gpuErrorInvalidValue;
  }
}

// grid (pairs, layers, planes): one CTA copies one block of one layer's K or V (or a latent
// cache's rows), row by row.
__global__ void copy_blocks_kernel(const CopyParams p) {
  const int pair = blockIdx.x;
  const int layer = blockIdx.y;
  char* base = static_cast<char*>(blockIdx.z == 0 ? p.k_layers[layer] : p.v_layers[layer]);
  const int64_t src = p.pairs[2 * pair], dst = p.pairs[2 * pair + 1];
  if (src == dst) return;
  const int units = p.row_bytes / p.vec;
  const int rows = p.block_size * p.heads;
  for (int i = threadIdx.x; i < rows * units; i += blockDim.x) {
    const int row = i / units, u = i % units;
    const int slot = row / p.heads, h = row % p.heads;
    const int64_t inner = (slot * p.slot_stride + h * p.head_stride) * p.elem_bytes + u * p.vec;
    const char* s = base + src * p.block_stride * p.elem_bytes + inner;
    char* d = base + dst * p.block_stride * p.elem_bytes + inner;
    switch (p.vec) {
      case 16: *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(s); break;
      case 8: *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(s); break;
      case 4: *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(s); break;
      case 2: *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s); break;
      default: *d = *s; break;
    }
  }
}

gpuError_t kernel_attributes(gpuFuncAttributes* attr) {
  return gpuFuncGetAttributes(attr, copy_blocks_kernel);
}

gpuError_t launch_copy_blocks(const CopyParams& p, gpuStream_t stream) {
  if (p.num_pairs <= 0) return gpuSuccess;
  dim3 grid(static_cast<unsigned>(p.num_pairs), static_cast<unsigned>(p.num_layers),
            static_cast<unsigned>(p.planes));
  PA_LAUNCH(copy_blocks_kernel, grid, 256, 0, stream)(p);
  return gpuGetLastError();
}

// Combines the split-KV partials of one decode row and head: weights exp(lse_i - max), then the
// row ends as one whose keys were all seen at once (row_norm), which adds the sink once.
template <typename T>
__global__ void split_merge_kernel(const SplitMergeParams p) {
  if (static_cast<int32_t>(blockIdx.x) >= *p.num_items) return;
  const MergeItem mi = p.items[blockIdx.x];
  const int h = blockIdx.y;
  const int64_t row = p.query_start[mi.seq];
  float mx = -INFINITY;
  for (int i = 0; i < mi.count; ++i)
    mx = max_keep_nan(mx, p.part_lse[static_cast<int64_t>(mi.first + i) * p.num_heads + h]);
  const bool poisoned = max_poisoned(mx);  // a part read a NaN or +inf score
  float wsum = 0.f;
  for (int i = 0; i < mi.count; ++i) {
    const float l = p.part_lse[static_cast<int64_t>(mi.first + i) * p.num_heads + h];
    wsum += (l == -INFINITY || poisoned) ? 0.f : __expf(l - mx);
  }
  // The partials are normalised and scaled by V's scale already.
  const RowNorm n = row_norm(mx, wsum, row_sink(p.sinks, h, false), 1.f);
  T* out = static_cast<T*>(p.out) + row * p.o_row + h * p.o_head;
  for (int d = threadIdx.x; d < p.head_size; d += blockDim.x) {
    float acc = 0.f;
    if (wsum > 0.f) {
      for (int i = 0; i < mi.count; ++i) {
        const int64_t part = mi.first + i;
        const float l = p.part_lse[part * p.num_heads + h];
        if (l == -INFINITY) continue;
        acc += __expf(l - mx) * p.part_o[(part * p.num_heads + h) * p.head_size + d];
      }
    }
    out[d] = from_float<T>(acc * n.inv);
  }
  if (threadIdx.x == 0 && p.lse) p.lse[row * p.lse_row + h * p.lse_head] = n.lse;
}

gpuError_t launch_split_merge(int32_t qt, int32_t max_items, const SplitMergeParams& p,
                              gpuStream_t stream) {
  if (max_items <= 0) return gpuSuccess;
  dim3 grid(static_cast<unsigned>(max_items), static_cast<unsigned>(p.num_heads));
  switch (qt) {
#define PA_MERGE_DTYPE(CODE, T, ...) \
  case CODE: PA_LAUNCH(split_merge_kernel<T>, grid, 128, 0, stream)(p); break;
    PA_GPU_DTYPES(PA_MERGE_DTYPE, )
#undef PA_MERGE_DTYPE
    default: return gpuErrorInvalidValue;
  }
  return gpuGetLastError();
}

// merge_states: one CTA per (row, head), any head size. Each element of out is computed by the
// thread that reads it from o1/o2, so out may alias o1 or o2 element for element; the lse values
// are read before the barrier and written after it, so lse_out may alias lse1 or lse2.
template <typename T>
__global__ void merge_states_kernel(const MergeStatesParams p) {
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const float l1 = p.lse1[row * p.l1_row + h * p.l1_head];
  const float l2 = p.lse2[row * p.l2_row + h * p.l2_head];
  const float mx = max_keep_nan(l1, l2);
  const bool poisoned = max_poisoned(mx);  // a NaN or +inf lse: NaN, as float64 gives
  const float w1 = (l1 == -INFINITY) ? 0.f : __expf(l1 - mx);
  const float w2 = (l2 == -INFINITY) ? 0.f : __expf(l2 - mx);
  const float ws = w1 + w2;
  const T* o1 = static_cast<const T*>(p.o1) + row * p.o1_row + h * p.o1_head;
  const T* o2 = static_cast<const T*>(p.o2) + row * p.o2_row + h * p.o2_head;
  T* out = static_cast<T*>(p.out) + row * p.out_row + h * p.out_head;
  for (int d = threadIdx.x; d < p.dim; d += blockDim.x) {
    float r = 0.f;
    if (ws > 0.f) {
      const float a = (w1 > 0.f) ? w1 * to_float(o1[d]) : 0.f;
      const float b = (w2 > 0.f) ? w2 * to_float(o2[d]) : 0.f;
      r = (a + b) / ws;
    }
    out[d] = from_float<T>(poisoned ? NAN : r);
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.lse_out)
    p.lse_out[row * p.lo_row + h * p.lo_head] =
        poisoned ? NAN : (ws > 0.f) ? mx + logf(ws) : -INFINITY;
}

gpuError_t launch_merge_states(int32_t qt, const MergeStatesParams& p, gpuStream_t stream) {
  if (p.rows <= 0 || p.heads <= 0) return gpuSuccess;
  dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads));
  switch (qt) {
#define PA_MERGE_DTYPE(CODE, T, ...) \
  case CODE: PA_LAUNCH(merge_states_kernel<T>, grid, 128, 0, stream)(p); break;
    PA_GPU_DTYPES(PA_MERGE_DTYPE, )
#undef PA_MERGE_DTYPE
    default: return gpuErrorInvalidValue;
  }
  return gpuGetLastError();
}

gpuError_t launch_attention(int32_t qt, int32_t kt, bool decode, int32_t max_items,
                            const AttnParams& p, gpuStream_t stream, int* unsupported) {
  if (max_items <= 0) return gpuSuccess;
  switch (qt) {
#define PA_ATTN_DTYPE(CODE, T, ...) \
  case CODE: return launch_attention_t<T>(qt, kt, decode, max_items, p, stream, unsupported);
    PA_GPU_DTYPES(PA_ATTN_DTYPE, )
#undef PA_ATTN_DTYPE
    default: *unsupported = 1; return gpuSuccess;
  }
}

size_t attention_smem_need() {
  size_t need = 0;
#define PA_NEED_DTYPE(CODE, T, ...) need = std::max(need, attention_smem_need_t<T>());
  PA_GPU_DTYPES(PA_NEED_DTYPE, )
#undef PA_NEED_DTYPE
  return need;
}

}  // namespace pagedattn_gpu
