#include "attngeom/parallel.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <stdexcept>
#include <string>

namespace attngeom {

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int processors() {
#ifdef _OPENMP
  return std::max(1, omp_get_num_procs());
#else
  return 1;
#endif
}

int max_threads() {
#ifdef _OPENMP
  return std::max(1, std::min(omp_get_thread_limit(), 16 * std::max(1, omp_get_num_procs())));
#else
  return 1;
#endif
}

void set_num_threads(int n) {
  if (n < 1 || n > max_threads())
    throw std::invalid_argument("n must be an integer in [1, " + std::to_string(max_threads()) + "], got " +
                                std::to_string(n));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace attngeom
