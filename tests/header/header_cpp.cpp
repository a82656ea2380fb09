// The umbrella header alone, compiled as strict C++17 (-Wall -Wextra -Werror -pedantic).
#include <pagedattn/pagedattn.h>

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout<pagedattn_tensor>::value, "C layout");
static_assert(std::is_trivially_copyable<pagedattn_attention_options>::value, "C struct");

int main() {
  pagedattn_backend* be = nullptr;
  const pagedattn_status st = pagedattn_backend_create(&be, "cpu", nullptr);
  pagedattn_backend_destroy(be);
  if (st != PAGEDATTN_OK) {
    std::fprintf(stderr, "create cpu: %s\n", pagedattn_last_error());
    return 1;
  }
  std::printf("C++17 header test: pagedattn %s\n", pagedattn_version_string());
  return pagedattn_version(nullptr, nullptr, nullptr) == PAGEDATTN_VERSION_NUMBER ? 0 : 1;
}
