# Cross-compiling for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu (`make cross-aarch64`).
# Compile only: the configure checks build static libraries, nothing is linked or run.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
if(NOT CMAKE_CXX_COMPILER)
  set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
endif()
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)
