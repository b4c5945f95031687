# Fuzz builds: -DPARITY_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (libFuzzer is clang's; Debian 12:
# packages clang, libclang-rt-14-dev, libomp-14-dev). scripts/fuzz.sh drives it.
#
# Every library is compiled with -fsanitize=address,undefined,fuzzer-no-link (sanitize.cmake
# adds address,undefined; fuzzer-no-link adds the coverage instrumentation libFuzzer steers
# by, without its main()); each fuzz/*_fuzz.cpp becomes an executable linked with
# -fsanitize=address,undefined,fuzzer (fuzz/CMakeLists.txt). The device code is off and the
# test suite is not built here: this configuration exists for the fuzz targets.
if(PARITY_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PARITY_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
  set(PARITY_FUZZ_LINK_FLAGS -fsanitize=${PARITY_SANITIZERS_CSV},fuzzer)
  message(STATUS "gpt-oss-parity fuzzing: libFuzzer (${CMAKE_CXX_COMPILER_ID} "
                 "${CMAKE_CXX_COMPILER_VERSION})")
endif()

# The fuzz targets in the sanitized tree of scripts/sanitize.sh (-DPARITY_SANITIZE=address,undefined
# -DPARITY_FUZZ_IN_TREE=ON, clang): one build serves the sanitized suite and a short fuzzing run
# (CI's), where a tree of its own cost a third build of the libraries. Every target gets the light
# part of the coverage instrumentation libFuzzer steers by (inline 8-bit counters and the PC
# table: a counter increment per edge, a few per cent of the suite's time), not the comparison
# tracing of fuzzer-no-link (a callback per compared integer, which would slow the suite's
# numerics several times over); the targets' own sources get all of it (-fsanitize=fuzzer).
# Longer campaigns: scripts/fuzz.sh's own tree, fully instrumented.
if(PARITY_FUZZ_IN_TREE)
  if(PARITY_FUZZ)
    message(FATAL_ERROR "PARITY_FUZZ_IN_TREE and PARITY_FUZZ: one or the other")
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang" OR NOT PARITY_SANITIZERS)
    message(FATAL_ERROR "PARITY_FUZZ_IN_TREE needs the sanitized clang tree: configure with "
                        "-DPARITY_SANITIZE=address,undefined -DCMAKE_CXX_COMPILER=clang++")
  endif()
  add_compile_options(-fsanitize-coverage=inline-8bit-counters,pc-table)
  set(PARITY_FUZZ_LINK_FLAGS -fsanitize=${PARITY_SANITIZERS_CSV},fuzzer)
  message(STATUS "gpt-oss-parity fuzz targets in the sanitized tree (${CMAKE_CXX_COMPILER_ID} "
                 "${CMAKE_CXX_COMPILER_VERSION})")
endif()
