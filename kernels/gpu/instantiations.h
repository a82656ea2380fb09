// instantiations.h — THE list of compiled attention kernels (head size x dtype x cache dtype).
//
// Each head-size entry DMAX is a kernel that serves every head size d <= DMAX (d % 8 == 0), so
// the default set (64, 128, 256) covers all of SPEC 2 with few kernels; `-Dgpu_instantiations=all`
// compiles one kernel per SPEC head size (tighter tiles, longer build).
#ifndef PAGEDATTN_GPU_INSTANTIATIONS_H
#define PAGEDATTN_GPU_INSTANTIATIONS_H

#if defined(PAGEDATTN_GPU_ALL_INSTANTIATIONS)
#define PA_GPU_HEAD_SIZES(X, ...) \
  X(32, __VA_ARGS__) X(64, __VA_ARGS__) X(80, __VA_ARGS__) X(96, __VA_ARGS__) \
  X(112, __VA_ARGS__) X(120, __VA_ARGS__) X(128, __VA_ARGS__) X(160, __VA_ARGS__) \
  X(192, __VA_ARGS__) X(224, __VA_ARGS__) X(256, __VA_ARGS__)
#else
#define PA_GPU_HEAD_SIZES(X, ...) X(64, __VA_ARGS__) X(128, __VA_ARGS__) X(256, __VA_ARGS__)
#endif

// Query/output types: each gets its own translation unit (attention_<name>.cu) so the two build
// jobs compile them in parallel. Cache types per query type: the same type, e4m3, e5m2.
#define PA_GPU_MAX_HEAD_SIZE 256

#endif  // PAGEDATTN_GPU_INSTANTIATIONS_H
