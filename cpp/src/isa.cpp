#include "attngeom/isa.hpp"

namespace attngeom {

std::string compiled_level() { return ATTNGEOM_ISA; }

std::vector<std::string> supported_levels() {
  std::vector<std::string> levels{"baseline"};
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // x86-64-v3 also lists F16C, LZCNT and MOVBE, present on every CPU with AVX2 and BMI2.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  if (v3) levels.emplace_back("avx2");
  if (v4) levels.emplace_back("avx512");
#endif
  return levels;
}

}  // namespace attngeom
