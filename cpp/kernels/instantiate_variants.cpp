// Laplace-Radon transforms and statistics, lightning, random-feature (FAVOR) and whitened
// attention, forward and backward; the forward's float products and the finite check.
#include "attngeom/favor.hpp"
#include "attngeom/favor_backward.hpp"
#include "attngeom/kernels.hpp"
#include "attngeom/laplace_radon.hpp"
#include "attngeom/lightning.hpp"
#include "attngeom/lightning_backward.hpp"
#include "attngeom/products.hpp"
#include "attngeom/random_features.hpp"
#include "attngeom/whitening.hpp"
#include "attngeom/whitening_backward.hpp"
#include "instantiate.hpp"

using namespace attngeom;

extern const void* const attngeom_variant_kernels[];
const void* const attngeom_variant_kernels[] = {
    ATTNGEOM_ADDRESS(tilt_radius<float>),
    ATTNGEOM_ADDRESS(tilt_radius<double>),
    ATTNGEOM_ADDRESS(laplace_transform_complex<float>),
    ATTNGEOM_ADDRESS(laplace_transform_complex<double>),
    ATTNGEOM_FOR_KERNELS(projected_cumulants, float),
    ATTNGEOM_FOR_KERNELS(projected_cumulants, double),
    ATTNGEOM_FOR_KERNELS(gibbs_key_moments, float),
    ATTNGEOM_FOR_KERNELS(gibbs_key_moments, double),
    ATTNGEOM_ADDRESS(lightning_attention<float>),
    ATTNGEOM_ADDRESS(lightning_attention<double>),
    ATTNGEOM_ADDRESS(lightning_attention_backward<float>),
    ATTNGEOM_ADDRESS(lightning_attention_backward<double>),
    ATTNGEOM_ADDRESS(positive_features<float>),
    ATTNGEOM_ADDRESS(positive_features<double>),
    ATTNGEOM_ADDRESS(favor_attention<float>),
    ATTNGEOM_ADDRESS(favor_attention<double>),
    ATTNGEOM_ADDRESS(favor_attention_backward<float>),
    ATTNGEOM_ADDRESS(favor_attention_backward<double>),
    ATTNGEOM_ADDRESS(whiten<float>),
    ATTNGEOM_ADDRESS(whiten<double>),
    ATTNGEOM_ADDRESS(whiten_scan<float>),
    ATTNGEOM_ADDRESS(whiten_scan<double>),
    ATTNGEOM_ADDRESS(whiten_backward<float>),
    ATTNGEOM_ADDRESS(whiten_backward<double>),
    ATTNGEOM_ADDRESS(condition_bound<float>),
    ATTNGEOM_ADDRESS(condition_bound<double>),
    ATTNGEOM_ADDRESS(matmul<float>),
    ATTNGEOM_ADDRESS(matmul<double>),
    ATTNGEOM_ADDRESS(all_finite<float>),
    ATTNGEOM_ADDRESS(all_finite<double>),
};
