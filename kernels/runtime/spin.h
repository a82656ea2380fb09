/* lib/cpu/spin.h — bounded spinning for the CPU worker pools (lib/cpu/thread_pool.cpp and the
 * onednn plugin's pool): wait for a condition without sleeping, for at most a given time. */
#ifndef PAGEDATTN_LIB_CPU_SPIN_H
#define PAGEDATTN_LIB_CPU_SPIN_H

#include <stdint.h>

#include <chrono>

namespace pa_cpu {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

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

}  // namespace pa_cpu

#endif  // PAGEDATTN_LIB_CPU_SPIN_H
