#include "pool.h"

#include <omp.h>

#include "kernels/runtime/spin.h"

namespace pa_onednn {

Pool::Pool(int threads, int spin_us) : spin_ns_(spin_us > 0 ? int64_t{spin_us} * 1000 : 0) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { loop(i); });
}

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void Pool::drain(int index) {
  for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < total_;) (*job_)(index, i);
}

void Pool::loop(int index) {
  // oneDNN (OpenMP build) would start a team per primitive from this thread otherwise.
  omp_set_num_threads(1);
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] {
      return stop_.load(std::memory_order_relaxed) ||
             gen_.load(std::memory_order_acquire) != seen;
    };
    pa_runtime::spin_until(spin_ns_, ready);
    std::unique_lock<std::mutex> lock(mu_);
    if (!ready()) {
      ++sleepers_;
      cv_work_.wait(lock, ready);
      --sleepers_;
    }
    if (stop_.load()) return;
    seen = gen_.load();
    if (job_ == nullptr) continue;  // woke after that job finished
    ++active_;
    lock.unlock();
    drain(index);
    lock.lock();
    if (--active_ == 0) cv_done_.notify_all();
  }
}

void Pool::run(int64_t total, const std::function<void(int, int64_t)>& fn) {
  if (total <= 0) return;
  std::lock_guard<std::mutex> run_lock(run_mu_);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const bool fan_out = !workers_.empty() && total > 1;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    total_ = total;
    next_.store(0);
    if (fan_out) {
      gen_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
  }
  if (wake) cv_work_.notify_all();
  drain(0);
  {
    // Items are all taken; wait only for workers still running one.
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return active_ == 0; });
    job_ = nullptr;
  }
  omp_set_num_threads(saved);
}

}  // namespace pa_onednn
