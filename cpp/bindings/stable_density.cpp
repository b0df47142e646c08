// TEMPORARY placeholder
#include <pybind11/pybind11.h>
void bind_stable_density(pybind11::module_& m) {}
