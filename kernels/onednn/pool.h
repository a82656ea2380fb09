/* kernels/onednn/pool.h — the plugin's worker threads. The caller takes part, and a call returns
 * as soon as every item is done: a worker that wakes late (a busy machine) finds nothing left and
 * is not waited for, unlike an OpenMP barrier. Workers run oneDNN primitives single-threaded.
 * Between calls a worker spins spin_us microseconds before it sleeps (PAGEDATTN_CPU_SPIN_US, as
 * the cpu backend's pool), so calls in a row find it awake instead of finishing without it. */
#ifndef PAGEDATTN_KERNELS_ONEDNN_POOL_H
#define PAGEDATTN_KERNELS_ONEDNN_POOL_H

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pa_onednn {

class Pool {
 public:
  Pool(int threads, int spin_us);  // threads - 1 workers; the caller is worker 0
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /* Runs fn(worker, item) for every item in [0, total), items handed out one at a time. Calls
   * from several threads are serialised. fn must not throw. */
  void run(int64_t total, const std::function<void(int, int64_t)>& fn);

 private:
  void loop(int index);
  void drain(int index);
  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int, int64_t)>* job_ = nullptr;
  std::atomic<uint64_t> gen_{0};  // written under mu_; read without it while spinning
  int active_ = 0;     // workers inside the current job
  int sleepers_ = 0;   // workers blocked on cv_work_
  std::atomic<bool> stop_{false};
  int64_t spin_ns_ = 0;
  int64_t total_ = 0;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace pa_onednn

#endif /* PAGEDATTN_KERNELS_ONEDNN_POOL_H */
