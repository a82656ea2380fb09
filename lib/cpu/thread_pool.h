/* lib/cpu/thread_pool.h — the CPU backend's persistent worker pool.
 *
 * parallel_for(n, f) runs f(i, worker) for every i in [0, n) on the calling thread (worker 0) and
 * the pool's threads (workers 1..size-1), dynamically scheduled one index at a time, and returns
 * when all are done. Concurrent callers are serialised (each call completes correctly); `worker`
 * indexes per-worker scratch. No allocation per call. */
#ifndef PAGEDATTN_LIB_CPU_THREAD_POOL_H
#define PAGEDATTN_LIB_CPU_THREAD_POOL_H

#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace pa_cpu {

class ThreadPool {
 public:
  /* Starts size - 1 threads (size >= 1). May throw std::system_error / std::bad_alloc. */
  explicit ThreadPool(int size);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  template <class F>
  void parallel_for(int64_t n, const F& f) {
    run(n, [](const void* ctx, int64_t i, int w) { (*static_cast<const F*>(ctx))(i, w); }, &f);
  }

 private:
  using Fn = void (*)(const void* ctx, int64_t i, int worker);
  void run(int64_t n, Fn fn, const void* ctx);
  void worker_main(int worker);
  void drain(int worker);

  int size_;
  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;
  int busy_ = 0;  // pool threads still working on the current generation
  bool stop_ = false;
  Fn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace pa_cpu

#endif  // PAGEDATTN_LIB_CPU_THREAD_POOL_H
