// kernels/runtime/thread_pool.cpp — see thread_pool.h.
#include "thread_pool.h"

#include "spin.h"

namespace pa_runtime {

ThreadPool::ThreadPool(int size, int spin_us)
    : size_(size < 1 ? 1 : size), spin_ns_(spin_us > 0 ? int64_t{spin_us} * 1000 : 0) {
  threads_.reserve(static_cast<size_t>(size_ - 1));
  try {
    for (int w = 1; w < size_; ++w) threads_.emplace_back([this, w] { worker_main(w); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::drain(int worker) {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    fn_(ctx_, i, worker);
  }
}

void ThreadPool::worker_main(int worker) {
  uint64_t seen = 0;
  for (;;) {
    auto published = [&] {
      return stop_.load(std::memory_order_relaxed) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(spin_ns_, published)) {
      std::unique_lock<std::mutex> lk(mu_);
      ++sleepers_;
      start_cv_.wait(lk, published);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = generation_.load(std::memory_order_acquire);
    drain(worker);
    // The last one out wakes the caller if it gave up spinning (a notify with no waiter is
    // cheap; the lock orders it after the caller's predicate check).
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t n, Fn fn, const void* ctx) {
  if (n <= 0) return;
  if (size_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  bool wake = false;
  {
    // Published under mu_ so a worker between its last check and its sleep cannot miss it.
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_.store(size_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) start_cv_.notify_all();
  drain(0);
  auto done = [&] { return busy_.load(std::memory_order_acquire) == 0; };
  if (spin_until(spin_ns_, done)) return;
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, done);
}

}  // namespace pa_runtime
