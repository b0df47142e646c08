// attngeom._bf16_emulated: a module for the tests, never in a wheel (CMake option
// ATTNGEOM_BF16_EMULATION, which make test's build turns on where SIMDe is installed).
//
// It holds bf16.cpp's product and the float32 softmax forward (attention.hpp) compiled with
// ATTNGEOM_BF16_EMULATED: the AVX512_BF16 register tiles (bf16.cpp, bf16_tiles.hpp) on SIMDe's
// portable definitions of the AVX-512 intrinsics (VDPBF16PS as float32 multiply-adds of the
// widened pairs), with has_bf16_dot() true, and the AMX path's code (bf16.cpp) on eight tiles
// in memory per thread (TDPBF16PS as float32 sums of the pairs in order). So a CPU without
// the instructions runs both paths' own code, their packing, tiles, ragged depths and columns,
// loop orders and reduction trees, and tests/test_bf16.py and tests/test_attention_bf16.py
// check it as they check the CPU's paths. Its sums are ordered as the emulation orders them,
// which the instructions need not match, so it is held to the same bounds as the real paths,
// never to their bits.
#include <pybind11/pybind11.h>

#include "../bindings/attention_outputs.hpp"
#include "../bindings/dot_products.hpp"
#include "attngeom/parallel.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_bf16_emulated, m) {
  m.doc() = "The bfloat16 products' AVX512_BF16 and AMX paths on emulated intrinsics and tiles (tests only).";
  attngeom::bindings::def_dot_products(m);
  attngeom::bindings::def_softmax_attention<float>(m);
  m.def("get_num_threads", &attngeom::get_num_threads, "This module's OpenMP thread budget.");
}
