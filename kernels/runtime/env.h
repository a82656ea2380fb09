/* kernels/runtime/env.h — strict parsing of the CPU-side backends' environment variables, so
 * every variable refuses what it does not understand in the same way. */
#ifndef PAGEDATTN_KERNELS_RUNTIME_ENV_H
#define PAGEDATTN_KERNELS_RUNTIME_ENV_H

#include <errno.h>
#include <stdlib.h>

#include <string>

namespace pa_runtime {

/* Whether text is a whole decimal number in [lo, hi] (no sign, no spaces, nothing after it);
 * *v is then that number. */
static inline bool parse_whole_number(const char* text, long lo, long hi, long* v) {
  if (text[0] < '0' || text[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  const long x = strtol(text, &end, 10);
  if (*end != '\0' || errno != 0 || x < lo || x > hi) return false;
  *v = x;
  return true;
}

/* "NAME=value" when the variable is set, else "NAME unset": how a backend's settings line
 * (pagedattn_capabilities.settings) names what it read. */
static inline std::string env_note(const char* name) {
  const char* v = getenv(name);
  return v ? std::string(name) + "=" + v : std::string(name) + " unset";
}

}  // namespace pa_runtime

#endif /* PAGEDATTN_KERNELS_RUNTIME_ENV_H */
