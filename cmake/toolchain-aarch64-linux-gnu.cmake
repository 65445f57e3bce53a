# Cross-compiling for 64-bit Arm Linux (RK3588-class boards) with Debian's
# crossbuild-essential-arm64 and the arm64 multiarch -dev packages:
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
#
# scripts/arm64-check.sh installs what this needs and runs the tests under
# qemu-user. oneDNN's arm64 -dev package cannot be installed beside the
# amd64 one (both own /usr/include/oneapi/dnnl/dnnl_config.h, which differs):
# with only the library (libdnnl2:arm64) installed, pass its headers and
# library as -DES_DNNL_INCLUDE=... -DES_DNNL_LIB=... (the script does).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(ES_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${ES_CROSS_TRIPLE}-gcc)
set(CMAKE_AR ${ES_CROSS_TRIPLE}-gcc-ar CACHE FILEPATH "")
set(CMAKE_RANLIB ${ES_CROSS_TRIPLE}-gcc-ranlib CACHE FILEPATH "")

# Multiarch: the target's libraries live beside the host's, in
# /usr/lib/aarch64-linux-gnu, and the headers are shared in /usr/include, so
# the root is / itself. Programs (protoc-c, bash) are the host's; libraries
# and headers are searched in the root only, and find_library looks in the
# target's multiarch directory because CMAKE_LIBRARY_ARCHITECTURE says so.
set(CMAKE_FIND_ROOT_PATH /)
set(CMAKE_LIBRARY_ARCHITECTURE ${ES_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config must report the target's .pc files, never the host's (same
# names, other library directory). Setting the environment here is enough:
# pkg_check_modules runs at configure time only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${ES_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# try_run and the tests' executables (add_test, so ctest) go through
# qemu-user; -L / makes it load the arm64 dynamic loader (libc6:arm64) and
# libraries from the multiarch paths. The emulated CPU is the target's
# Cortex-A76 (ARMv8.2 with dot product, no SVE, no bf16), not qemu's default
# "max": oneDNN picks its kernels by the CPU it finds, and those of a CPU the
# boards do not have would be tested instead of theirs.
set(ES_QEMU_CPU cortex-a76 CACHE STRING "CPU qemu-aarch64 emulates for the tests")
find_program(ES_QEMU_AARCH64 qemu-aarch64)
if(ES_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ES_QEMU_AARCH64} -L / -cpu ${ES_QEMU_CPU})
endif()
