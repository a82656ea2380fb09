// kernels/runtime/host_alloc.cpp — see host_alloc.h.
#include "host_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "plugin_abi.h"

namespace pa_runtime {

namespace {

constexpr size_t kAlign = 64;  // also the header that describes the block
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeMin = size_t{4} << 20;

// What host_free needs, in the kAlign bytes before the pointer host_alloc returns.
struct Header {
  size_t total;    // bytes counted against *used
  size_t map_len;  // bytes mapped at the header (a large block), 0 for a posix_memalign one
};
static_assert(sizeof(Header) <= kAlign, "the header fits in front of the block");

// A large block: anonymous pages, zero when first touched (no memset that would commit every
// page up front), on a 2 MiB boundary with transparent huge pages asked for. NULL on failure.
void* map_block(size_t total, size_t* map_len) {
  const size_t page = 4096;
  const size_t len = (total + page - 1) / page * page;
  if (len < total || len + kHugePage < len) return nullptr;
  void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(raw);
  char* aligned = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage * kHugePage);
  // Give back the slack on both sides.
  if (aligned > base) munmap(base, static_cast<size_t>(aligned - base));
  const size_t tail = static_cast<size_t>(base + len + kHugePage - (aligned + len));
  if (tail > 0) munmap(aligned + len, tail);
#ifdef MADV_HUGEPAGE
  madvise(aligned, len / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only
#endif
  *map_len = len;
  return aligned;
}

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
  size_t map_len = 0;
  if (total >= kHugeMin) {
    p = map_block(total, &map_len);
  } else if (posix_memalign(&p, kAlign, total) == 0 && p != nullptr) {
    memset(p, 0, total);
  } else {
    p = nullptr;
  }
  if (p == nullptr) {
    used->fetch_sub(total);
    if (msg != nullptr)
      snprintf(msg, PA_MSG_LEN, "%s: could not allocate %zu bytes of host memory", what, bytes);
    return nullptr;
  }
  Header* h = static_cast<Header*>(p);
  h->total = total;
  h->map_len = map_len;
  return static_cast<char*>(p) + kAlign;
}

void host_free(std::atomic<uint64_t>* used, void* ptr) {
  if (ptr == nullptr) return;
  char* base = static_cast<char*>(ptr) - kAlign;
  const Header h = *reinterpret_cast<const Header*>(base);
  used->fetch_sub(h.total);
  if (h.map_len != 0)
    munmap(base, h.map_len);
  else
    free(base);
}

}  // namespace pa_runtime
