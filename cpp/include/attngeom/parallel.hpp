// Thread control for the OpenMP loops of the core.
//
// Every kernel parallelises over independent units (batch x head x query block, samples)
// with one OpenMP loop; Eigen itself is compiled single-threaded (EIGEN_DONT_PARALLELIZE),
// so a unit is computed the same way whatever the thread count.
#pragma once

namespace attngeom {

// Number of threads the next parallel region will use.
int get_num_threads();
// Sets the thread count (n >= 1) for subsequent kernels; OMP_NUM_THREADS sets the default.
void set_num_threads(int n);
// True when the core was compiled with OpenMP.
bool has_openmp();
// Whether a kernel of about `work` multiply-adds is worth a parallel region: waking the
// team costs tens of microseconds (far more when the cores are shared), so small calls run
// on the calling thread. Used as `#pragma omp parallel ... if(parallel_worth(work))`.
inline bool parallel_worth(double work) { return work >= 131072.0; }

}  // namespace attngeom
