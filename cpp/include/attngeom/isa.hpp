// Instruction-set levels: which x86-64 level this module was compiled for and which levels
// the running CPU supports (CPUID through the compiler's builtins, which also check that the
// operating system saves the wide registers).
#pragma once

#include <string>
#include <vector>

namespace attngeom {

// The level this module was compiled for: "baseline", "avx2" (x86-64-v3: AVX2, FMA, BMI2),
// "avx512" (x86-64-v4: AVX-512 F/BW/CD/DQ/VL) or "native" (-march=native).
std::string compiled_level();

// Levels the running CPU can execute, lowest first; always starts with "baseline".
std::vector<std::string> supported_levels();

}  // namespace attngeom
