/* kernels/onednn/pool.h — the plugin's worker threads. The caller takes part, and a call returns
 * as soon as every item is done: a worker that wakes late (a busy machine) finds nothing left and
 * is not waited for, unlike an OpenMP barrier. Workers run oneDNN primitives single-threaded. */
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
  explicit Pool(int threads);  // threads - 1 workers; the caller is worker 0
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
  uint64_t gen_ = 0;
  int active_ = 0;     // workers inside the current job
  bool stop_ = false;
  int64_t total_ = 0;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace pa_onednn

#endif /* PAGEDATTN_KERNELS_ONEDNN_POOL_H */
