#include "attngeom/parallel.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <stdexcept>

namespace attngeom {

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("n must be >= 1");
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
