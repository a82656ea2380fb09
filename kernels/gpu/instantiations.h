// instantiations.h — THE list of compiled GPU kernels: head size x dtype x cache dtype.
//
// Every file that instantiates or dispatches a kernel expands these X-macros and names no size or
// type of its own: the attention launchers and their dispatch (attention.cuh, cache_ops.cu), the
// cache-write, split-merge and merge_states dispatch (cache_ops.cu), and the capabilities the
// plugin reports (backend.cu). Adding an entry here adds it everywhere; a query dtype also needs
// its translation unit attention_<name>.cu (listed in meson.build), or the link fails naming it.
//
// Each X-macro passes its trailing arguments through to X, so one list can be expanded with
// context (a template parameter, a code), e.g. PA_GPU_HEAD_SIZES(X, T, KT) gives X(64, T, KT) ...
#ifndef PAGEDATTN_GPU_INSTANTIATIONS_H
#define PAGEDATTN_GPU_INSTANTIATIONS_H

// Head sizes: X(DMAX, ...). Each entry DMAX is a kernel that serves every head size d <= DMAX
// (d % 8 == 0) down to the previous entry, so the curated default (64, 128, 256) covers every
// multiple of 8 up to 256 (docs/semantics.md §2.5) with three kernels per dtype pair (80 and 96
// run the 128 kernel with padded tiles); `-Dgpu_instantiations=all` compiles one kernel per head
// size that §2.5 requires of a GPU backend (tighter tiles, about 4x the compile time). Ascending
// order: dispatch takes the first entry >= the head size.
#if defined(PAGEDATTN_GPU_ALL_INSTANTIATIONS)
#define PA_GPU_HEAD_SIZES(X, ...)                                                     \
  X(32, __VA_ARGS__) X(64, __VA_ARGS__) X(80, __VA_ARGS__) X(96, __VA_ARGS__)         \
  X(112, __VA_ARGS__) X(120, __VA_ARGS__) X(128, __VA_ARGS__) X(160, __VA_ARGS__)     \
  X(192, __VA_ARGS__) X(224, __VA_ARGS__) X(256, __VA_ARGS__)
#else
#define PA_GPU_HEAD_SIZES(X, ...) X(64, __VA_ARGS__) X(128, __VA_ARGS__) X(256, __VA_ARGS__)
#endif

// The largest entry above: head sizes beyond it are refused (capabilities and forward).
#define PA_GPU_MAX_HEAD_SIZE 256

// Query / key / value / output element types: X(CODE, TYPE, NAME, ...). CODE is the
// pagedattn_dtype value (the Elem enum of gpu_kernels.h), TYPE the device type of types.cuh, NAME
// the suffix of the translation unit attention_<NAME>.cu that compiles its attention kernels.
#define PA_GPU_DTYPES(X, ...)                                                         \
  X(kF32, float, f32, __VA_ARGS__) X(kF16, f16_t, f16, __VA_ARGS__)                  \
  X(kBF16, bf16_t, bf16, __VA_ARGS__)

// fp8 cache element types: X(CODE, TYPE, ...). Stored as bytes with a float scale for K and V.
#define PA_GPU_FP8_DTYPES(X, ...) X(kE4M3, e4m3_t, __VA_ARGS__) X(kE5M2, e5m2_t, __VA_ARGS__)

// Cache element types for queries of code QCODE and type QTYPE: X(CODE, TYPE, ...). The cache
// holds the query's own type or fp8 (docs/semantics.md §2.4; the core refuses other pairs before
// a kernel runs).
#define PA_GPU_CACHE_DTYPES(X, QCODE, QTYPE, ...) \
  X(QCODE, QTYPE, __VA_ARGS__) PA_GPU_FP8_DTYPES(X, __VA_ARGS__)

#endif  // PAGEDATTN_GPU_INSTANTIATIONS_H
