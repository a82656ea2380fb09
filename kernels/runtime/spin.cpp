// kernels/runtime/spin.cpp — the pools' spin setting (see spin.h).
#include "spin.h"

#include <stdio.h>
#include <stdlib.h>

#include "env.h"
#include "plugin_abi.h"

namespace pa_runtime {

bool spin_us_from_env(int* us, char* msg) {
  *us = kDefaultSpinUs;
  const char* env = getenv("PAGEDATTN_CPU_SPIN_US");
  if (env == nullptr) return true;
  long v = 0;
  if (!parse_whole_number(env, 0, 1000000, &v)) {
    snprintf(msg, PA_MSG_LEN, "PAGEDATTN_CPU_SPIN_US=%.64s is not a whole number of"
             " microseconds in 0..1000000", env);
    return false;
  }
  *us = static_cast<int>(v);
  return true;
}

}  // namespace pa_runtime
