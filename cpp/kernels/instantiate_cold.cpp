// The baseline-only concepts: spectra, inverse Laplace solvers, the Radon projector, the
// network Jacobians of the dimension estimates, and the benchmarks' GEMM ceiling.
#include "attngeom/bench.hpp"
#include "attngeom/dimension.hpp"
#include "attngeom/inverse.hpp"
#include "attngeom/radon.hpp"
#include "attngeom/spectral.hpp"
#include "instantiate.hpp"

using namespace attngeom;

extern const void* const attngeom_cold_kernels[];
const void* const attngeom_cold_kernels[] = {
    ATTNGEOM_ADDRESS(batched_svd<float>),
    ATTNGEOM_ADDRESS(batched_svd<double>),
    ATTNGEOM_ADDRESS(factored_svd<float>),
    ATTNGEOM_ADDRESS(factored_svd<double>),
    ATTNGEOM_ADDRESS(matrix_pencil),
    ATTNGEOM_ADDRESS(exp_sum_weights),
    ATTNGEOM_ADDRESS(nnls),
    ATTNGEOM_ADDRESS(radon_forward<float>),
    ATTNGEOM_ADDRESS(radon_forward<double>),
    ATTNGEOM_ADDRESS(radon_adjoint<float>),
    ATTNGEOM_ADDRESS(radon_adjoint<double>),
    ATTNGEOM_ADDRESS(backproject<float>),
    ATTNGEOM_ADDRESS(backproject<double>),
    ATTNGEOM_ADDRESS(sart<float>),
    ATTNGEOM_ADDRESS(sart<double>),
    ATTNGEOM_ADDRESS(network_jacobian<float>),
    ATTNGEOM_ADDRESS(network_jacobian<double>),
    ATTNGEOM_ADDRESS(batched_gemm<float>),
    ATTNGEOM_ADDRESS(batched_gemm<double>),
};
