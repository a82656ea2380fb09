// kernels/cpu/targets.cpp — choosing the Highway target of a CPU backend.
//
// Each backend keeps its own dispatch-table index instead of calling
// hwy::SetSupportedTargetsForTest, which is process-global: forcing one backend to AVX2 must not
// switch another backend (or the oneDNN plugin's use of these kernels) in the same process.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <string>

#include <hwy/highway.h>

#include "kernels.h"

namespace pa_cpu {

namespace {

uint32_t index_of(int64_t bit) {
#if (HWY_TARGETS & (HWY_TARGETS - 1)) == 0
  // One compiled target (simd_targets=native where the CPU's best is also the static target,
  // e.g. -march=native on Sapphire Rapids): HWY_EXPORT then makes single-entry tables.
  (void)bit;
  return 0;
#else
  const int64_t mask =
      (HWY_CHOSEN_TARGET_SHIFT(bit) | HWY_CHOSEN_TARGET_MASK_SCALAR) & HWY_CHOSEN_TARGET_MASK_TARGETS;
  return static_cast<uint32_t>(hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<uint64_t>(mask)));
#endif
}

// The pseudo target on top of AVX3_DL: decode through AVX512_BF16 dot products (decode_dp-inl.h).
constexpr const char* kBf16DpName = "AVX3_BF16";

bool cpu_has_bf16_dp() {
#if HWY_ARCH_X86 && (HWY_TARGETS & HWY_AVX3_DL)
  return __builtin_cpu_supports("avx512bf16") != 0;
#else
  return false;
#endif
}

// The pseudo target on top of AVX3_BF16: an fp8 cache's decode on AMX-BF16 tiles.
constexpr const char* kAmxName = "AVX3_AMX";

// AMX-BF16 in the CPU, and the tile data state granted to this process: Linux hands it out only
// on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process; a kernel or
// hypervisor that does not enable it refuses, and the decode stays on AVX512_BF16.
bool cpu_has_amx() {
#if defined(__linux__) && defined(__x86_64__) && (HWY_TARGETS & HWY_AVX3_DL)
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    if (!tile || !bf16) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

bool intel_cpu() {
#if defined(__x86_64__)
  static const bool intel = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid(0, a, b, c, d);
    char vendor[13];
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    return strcmp(vendor, "GenuineIntel") == 0;
  }();
  return intel;
#else
  return false;
#endif
}

}  // namespace

bool prefetch_select(Target* out, char* msg) {
  const char* env = getenv("PAGEDATTN_CPU_PREFETCH");
  if (env == nullptr) return true;  // target_select's default stands
  if (strcmp(env, "twice") != 0 && strcmp(env, "once") != 0) {
    snprintf(msg, PA_MSG_LEN, "PAGEDATTN_CPU_PREFETCH=%.64s is neither \"twice\" nor \"once\"",
             env);
    return false;
  }
  out->prefetch_twice = env[0] == 't';
  return true;
}

bool target_select(const char* name, Target* out, char* msg) {
  const int64_t runnable = hwy::SupportedTargets() & HWY_TARGETS;
  const bool dp_ok = (runnable & HWY_AVX3_DL) != 0 && cpu_has_bf16_dp();
  const bool amx_ok = dp_ok && cpu_has_amx();
  out->bf16_dp = false;
  out->amx = false;
  out->prefetch_twice = !intel_cpu();
  if (name == nullptr || name[0] == '\0') {
    const int64_t best = runnable & -runnable;  // lower bit = better target
    out->bit = best;
    out->name = hwy::TargetName(best);
    out->index = index_of(best);
    if (best == HWY_AVX3_DL && dp_ok) {
      out->name = amx_ok ? kAmxName : kBf16DpName;
      out->bf16_dp = true;
      out->amx = amx_ok;
    }
    return true;
  }
  const bool amx_named = strcmp(name, kAmxName) == 0;
  if ((strcmp(name, kBf16DpName) == 0 && dp_ok) || (amx_named && amx_ok)) {
    out->bit = HWY_AVX3_DL;
    out->name = amx_named ? kAmxName : kBf16DpName;
    out->index = index_of(HWY_AVX3_DL);
    out->bf16_dp = true;
    out->amx = amx_named;
    return true;
  }
  // The portable fallback is EMU128 or SCALAR depending on the compiler (Highway uses SCALAR
  // with GCC < 12.3): accept either name for whichever one was compiled.
  const bool portable = strcmp(name, "EMU128") == 0 || strcmp(name, "SCALAR") == 0;
  for (int64_t t = runnable; t != 0; t &= t - 1) {
    const int64_t bit = t & -t;
    if (strcmp(hwy::TargetName(bit), name) == 0 ||
        (portable && (bit == HWY_EMU128 || bit == HWY_SCALAR))) {
      out->bit = bit;
      out->name = hwy::TargetName(bit);
      out->index = index_of(bit);
      return true;
    }
  }
  std::string list = dp_ok ? kBf16DpName : "";
  if (amx_ok) list = std::string(kAmxName) + ", " + list;
  for (int64_t t = runnable; t != 0; t &= t - 1) {
    if (!list.empty()) list += ", ";
    list += hwy::TargetName(t & -t);
  }
  snprintf(msg, PA_MSG_LEN,
           "PAGEDATTN_CPU_TARGET=%s is not a SIMD target this build can run on this CPU; "
           "runnable targets: %s",
           name, list.c_str());
  return false;
}

}  // namespace pa_cpu
