// kernels/cpu/attention_unit.cpp — one SIMD target's attention kernels, as a translation unit of
// their own. kernels/cpu/meson.build compiles this file once per x86 target with
// PA_CPU_UNIT=HWY_<target>, so the targets build in parallel (and each can take its own flags);
// attention.cpp then holds only the dispatch tables. foreach_target still walks every target,
// so the -inl.h files' toggled guards stay in step, but only PA_CPU_UNIT's pass defines bodies.
#ifndef PA_CPU_UNIT
#error "attention_unit.cpp is compiled once per target with -DPA_CPU_UNIT=HWY_<target>"
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_unit.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "entry-inl.h"
