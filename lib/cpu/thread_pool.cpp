// lib/cpu/thread_pool.cpp — see thread_pool.h.
#include "thread_pool.h"

namespace pa_cpu {

ThreadPool::ThreadPool(int size) : size_(size < 1 ? 1 : size) {
  threads_.reserve(static_cast<size_t>(size_ - 1));
  try {
    for (int w = 1; w < size_; ++w) threads_.emplace_back([this, w] { worker_main(w); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
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
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain(worker);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
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
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_ = size_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  drain(0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return busy_ == 0; });
}

}  // namespace pa_cpu
