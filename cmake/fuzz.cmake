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
