// kernels/runtime/host_alloc.cpp — see host_alloc.h.
#include "host_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "plugin_abi.h"

namespace pa_runtime {

namespace {

constexpr size_t kAlign = 64;  // also the header that keeps the block's size
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = size_t{4} << 20;

}  // namespace

void* host_alloc(std::atomic<uint64_t>* used, uint64_t limit, size_t bytes, char* msg,
                 const char* what) {
  const size_t total = bytes + kAlign;
  if (total < bytes) {
    if (msg != nullptr) snprintf(msg, PA_MSG_LEN, "%s: %zu bytes overflow", what, bytes);
    return nullptr;
  }
  const uint64_t now = used->fetch_add(total) + total;
  if (limit != 0 && now > limit) {
    used->fetch_sub(total);
    if (msg != nullptr)
      snprintf(msg, PA_MSG_LEN,
               "%s: %zu bytes would exceed the backend's memory_limit of %llu bytes "
               "(%llu in use)",
               what, bytes, static_cast<unsigned long long>(limit),
               static_cast<unsigned long long>(now - total));
    return nullptr;
  }
  void* p = nullptr;
  const bool huge = total >= kHugeMin;
  if (posix_memalign(&p, huge ? kHugePage : kAlign, total) != 0 || p == nullptr) {
    used->fetch_sub(total);
    if (msg != nullptr)
      snprintf(msg, PA_MSG_LEN, "%s: could not allocate %zu bytes of host memory", what, bytes);
    return nullptr;
  }
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, total / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only
#endif
  memset(p, 0, total);
  *static_cast<size_t*>(p) = total;
  return static_cast<char*>(p) + kAlign;
}

void host_free(std::atomic<uint64_t>* used, void* ptr) {
  if (ptr == nullptr) return;
  char* base = static_cast<char*>(ptr) - kAlign;
  used->fetch_sub(*reinterpret_cast<size_t*>(base));
  free(base);
}

}  // namespace pa_runtime
