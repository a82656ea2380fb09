/* kernels/runtime/thread_pool.h — the CPU backend's persistent worker pool.
 *
 * parallel_for(n, f) runs f(i, worker) for every i in [0, n) on the calling thread (worker 0) and
 * the pool's threads (workers 1..size-1), dynamically scheduled one index at a time, and returns
 * when all are done. Concurrent callers are serialised (each call completes correctly); `worker`
 * indexes per-worker scratch. No allocation per call.
 *
 * Between calls a worker spins for spin_us microseconds before it sleeps, and so does the caller
 * waiting for the workers: waking a sleeping thread costs a system call and, in a virtual machine,
 * a wake-up of the idle virtual CPU (a decode call of 33 us took 100 us on 2 threads of a KVM
 * guest). Back-to-back calls (one per layer) then find the workers awake. */
#ifndef PAGEDATTN_KERNELS_RUNTIME_THREAD_POOL_H
#define PAGEDATTN_KERNELS_RUNTIME_THREAD_POOL_H

#include <stdint.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace pa_runtime {

class ThreadPool {
 public:
  /* Starts size - 1 threads (size >= 1) that spin spin_us microseconds (0: none) before they
   * sleep. May throw std::system_error / std::bad_alloc. */
  ThreadPool(int size, int spin_us);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /* Workers, the caller included: the `worker` argument of f is in [0, size()). */
  int size() const { return size_; }

  /* Runs f(i, worker) for every i in [0, n) and returns when all are done (see above). */
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
  int64_t spin_ns_;
  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;       // guards the sleeps: a generation is published under it
  std::condition_variable start_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};  // pool threads still working on the current generation
  std::atomic<bool> stop_{false};
  int sleepers_ = 0;  // workers blocked on start_cv_ (under mu_)
  Fn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace pa_runtime

#endif  // PAGEDATTN_KERNELS_RUNTIME_THREAD_POOL_H
