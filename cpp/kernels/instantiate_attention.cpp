// Softmax and kernel (ridge) attention, forward and backward.
#include "attngeom/attention.hpp"
#include "attngeom/attention_backward.hpp"
#include "attngeom/kernels.hpp"
#include "instantiate.hpp"

using namespace attngeom;

extern const void* const attngeom_attention_kernels[];
const void* const attngeom_attention_kernels[] = {
    ATTNGEOM_ADDRESS(softmax_attention<float>),
    ATTNGEOM_ADDRESS(softmax_attention<double>),
    ATTNGEOM_ADDRESS(softmax_attention_backward<float>),
    ATTNGEOM_ADDRESS(softmax_attention_backward<double>),
    ATTNGEOM_FOR_KERNELS(ridge_attention, float),
    ATTNGEOM_FOR_KERNELS(ridge_attention, double),
    ATTNGEOM_FOR_KERNELS(ridge_attention_backward, float),
    ATTNGEOM_FOR_KERNELS(ridge_attention_backward, double),
};
