// stack_pool.h — fiber stacks for the emulated threads, kept for reuse: a grid creates one
// fiber per thread of every block, and a fresh allocation per fiber would dominate the run.
#ifndef PAGEDATTN_GPUSIM_STACK_POOL_H
#define PAGEDATTN_GPUSIM_STACK_POOL_H

#include <stdlib.h>

#include <new>
#include <vector>

#include <boost/context/stack_context.hpp>

namespace pa_sim {

// Kernel frames are small (a few KiB); sanitizers enlarge them several times.
constexpr size_t kStackBytes = 256 * 1024;

class StackPool {
 public:
  ~StackPool() {
    for (void* p : free_) ::free(p);
  }
  void* take() {
    if (!free_.empty()) {
      void* p = free_.back();
      free_.pop_back();
      return p;
    }
    void* p = ::aligned_alloc(64, kStackBytes);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void give(void* p) { free_.push_back(p); }

 private:
  std::vector<void*> free_;
};

// The pool of the calling host thread (blocks run on the thread that launched them).
inline StackPool& stack_pool() {
  static thread_local StackPool pool;
  return pool;
}

// A Boost.Context StackAllocator over the pool; stores the stack's lowest byte in *bottom (the
// sanitizer annotations of block.cpp name it).
struct PooledStack {
  void** bottom;
  boost::context::stack_context allocate() {
    boost::context::stack_context sc;
    sc.size = kStackBytes;
    *bottom = stack_pool().take();
    sc.sp = static_cast<char*>(*bottom) + kStackBytes;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) noexcept {
    stack_pool().give(static_cast<char*>(sc.sp) - sc.size);
  }
};

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_STACK_POOL_H
