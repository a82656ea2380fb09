/* kernels/runtime/spin.h — bounded spinning for the CPU worker pools (thread_pool.cpp here and
 * the onednn plugin's pool): wait for a condition without sleeping, for at most a given time;
 * and how long the pools spin (PAGEDATTN_CPU_SPIN_US, spin.cpp). */
#ifndef PAGEDATTN_KERNELS_RUNTIME_SPIN_H
#define PAGEDATTN_KERNELS_RUNTIME_SPIN_H

#include <stdint.h>

#include <chrono>

namespace pa_runtime {

/* How long idle workers (and a caller waiting for them) spin before they sleep, when
 * PAGEDATTN_CPU_SPIN_US is unset: 100 us covers the gap between back-to-back calls (one per
 * layer), and is what an idle backend burns after a call. */
constexpr int kDefaultSpinUs = 100;

/* Sets *us to PAGEDATTN_CPU_SPIN_US, or to kDefaultSpinUs when it is unset, and returns true.
 * Returns false, with msg (PA_MSG_LEN bytes) saying why, when the variable is not a whole number
 * of microseconds in 0..1000000; the backends' create ops then fail with
 * PAGEDATTN_ERROR_INVALID_ARGUMENT. Reads the environment only. */
bool spin_us_from_env(int* us, char* msg);

/* One pause of a spin loop: the CPU's spin-wait hint, or nothing where it has none. */
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* The steady clock in nanoseconds. */
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/* Spins until done() or spin_ns have passed; true if done(). The clock is read every 64 pauses. */
template <class Done>
bool spin_until(int64_t spin_ns, const Done& done) {
  if (done()) return true;
  if (spin_ns <= 0) return false;
  const int64_t end = steady_ns() + spin_ns;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (steady_ns() >= end) return done();
  }
}

}  // namespace pa_runtime

#endif  // PAGEDATTN_KERNELS_RUNTIME_SPIN_H
