// Every kernel of the core instantiated for float and double without Python or pybind11, for
// the compile-only build (CMake option ATTNGEOM_KERNELS_ONLY, `make cross-aarch64`). Each
// instantiate_*.cpp exports a table holding the addresses of its kernels' specialisations, so
// the compiler generates their code for the target as the bindings would.
#pragma once

#define ATTNGEOM_ADDRESS(...) reinterpret_cast<const void*>(&__VA_ARGS__)

// One function per precision and kernel functor psi (kernels.hpp).
#define ATTNGEOM_FOR_KERNELS(F, T)                                                          \
  ATTNGEOM_ADDRESS(F<T, ::attngeom::ExpKernel<T>>), ATTNGEOM_ADDRESS(F<T, ::attngeom::GaussianKernel<T>>), \
      ATTNGEOM_ADDRESS(F<T, ::attngeom::CauchyKernel<T>>), ATTNGEOM_ADDRESS(F<T, ::attngeom::StableKernel<T>>)
