// Thread control for the OpenMP loops of the core.
//
// Every kernel parallelises over independent units (batch x head x query block, samples)
// with one OpenMP loop; Eigen itself is compiled single-threaded (EIGEN_DONT_PARALLELIZE),
// so a unit is computed the same way whatever the thread count.
#pragma once

#include <atomic>
#include <exception>
#include <mutex>

namespace attngeom {

// Number of threads the next parallel region will use.
int get_num_threads();
// Sets the thread count (1 <= n <= max_threads()) for subsequent kernels; OMP_NUM_THREADS
// sets the default. Throws std::invalid_argument outside that range.
void set_num_threads(int n);
// The largest thread count set_num_threads accepts: the OpenMP thread limit, capped at
// 16 threads per processor (beyond that a team only costs memory and creation time, and
// tens of thousands of threads fail to start).
int max_threads();
// Processors available to the process (OpenMP's count; 1 without OpenMP). Unlike the thread
// count it does not change with set_num_threads, so choices made from it (tilings) keep
// results independent of the thread count.
int processors();
// True when the core was compiled with OpenMP.
bool has_openmp();
// Whether a kernel of about `work` multiply-adds is worth a parallel region: waking the
// team costs tens of microseconds (far more when the cores are shared), so small calls run
// on the calling thread. Used as `#pragma omp parallel ... if(parallel_worth(work))`.
inline bool parallel_worth(double work) { return work >= 131072.0; }

// Carries the first exception of an OpenMP loop's units out of the parallel region: one may
// not leave it (the runtime terminates the process), so a failed allocation inside a unit
// would abort the interpreter instead of reaching Python as MemoryError. Units after a
// failure are skipped:
//   FirstException errors;
//   #pragma omp parallel for
//   for (...) errors.run([&] { ...unit... });
//   errors.rethrow();
class FirstException {
 public:
  template <class F>
  void run(F&& unit) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      unit();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
  std::atomic<bool> failed_{false};
};

}  // namespace attngeom
