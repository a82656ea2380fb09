/* The umbrella header alone, compiled as strict C99 (-std=c99 -Wall -Wextra -Werror -pedantic). */
#include <pagedattn/pagedattn.h>

#include <stdio.h>

int main(void) {
  pagedattn_tensor t;
  pagedattn_kv_cache_desc d;
  pagedattn_batch_desc b;
  pagedattn_attention_options o;
  pagedattn_capabilities c;
  int32_t major = 0, minor = 0, patch = 0;
  const int32_t v = pagedattn_version(&major, &minor, &patch);
  (void)t; (void)d; (void)b; (void)o; (void)c;
  if (v != PAGEDATTN_VERSION_NUMBER || major != PAGEDATTN_VERSION_MAJOR) {
    fprintf(stderr, "header %s, library %s\n", PAGEDATTN_VERSION_STRING, pagedattn_version_string());
    return 1;
  }
  printf("C99 header test: pagedattn %s\n", pagedattn_version_string());
  return 0;
}
