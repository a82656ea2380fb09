/* kernels/runtime/env.h — strict parsing of the CPU-side backends' environment variables, so
 * every variable refuses what it does not understand in the same way. */
#ifndef PAGEDATTN_KERNELS_RUNTIME_ENV_H
#define PAGEDATTN_KERNELS_RUNTIME_ENV_H

#include <errno.h>
#include <stdlib.h>

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

}  // namespace pa_runtime

#endif /* PAGEDATTN_KERNELS_RUNTIME_ENV_H */
