# Sanitizer builds: -DPARITY_SANITIZE=address,undefined (or ON, the same) instruments every
# target of the build (libraries, tools, tests), CPU side only. scripts/sanitize.sh drives it.
#
# -fno-sanitize-recover=undefined: UBSan's default is to print and go on, so a report would
#   pass a test; aborting makes it fail where it happens.
# -fno-omit-frame-pointer and -g1: ASan's fast unwinder walks frame pointers, and a report is
#   only worth reading with file:line in it (line tables are enough; full -g doubles the
#   compile time).
# Neither GCC nor clang enables float-divide-by-zero under "undefined": the numerics make inf
#   and NaN on purpose (masked scores, injected faults). Clang's "undefined" does check
#   float-cast-overflow (a NaN or huge double cast to an integer), which is undefined for real.
# thread and memory are refused: libgomp and libhdf5 are not instrumented, so they would
#   report races and uninitialised reads that are not ours.
set(PARITY_SANITIZERS "")
if(PARITY_FUZZ AND NOT PARITY_SANITIZE)
  set(PARITY_SANITIZE address,undefined)  # a fuzz build is an ASan+UBSan build
endif()
if(PARITY_SANITIZE)
  if(PARITY_SANITIZE MATCHES "^(ON|on|On|TRUE|true|YES|yes|1)$")
    set(PARITY_SANITIZERS address undefined)
  else()
    string(REPLACE "," ";" PARITY_SANITIZERS "${PARITY_SANITIZE}")
  endif()
  foreach(s IN LISTS PARITY_SANITIZERS)
    if(NOT s MATCHES "^(address|undefined|leak)$")
      message(FATAL_ERROR "PARITY_SANITIZE: '${s}' is not supported (address, undefined, leak)")
    endif()
  endforeach()
endif()

if(PARITY_SANITIZERS)
  # The device code runs on the GPU, where these sanitizers do not reach (device_check.sh runs
  # compute-sanitizer there); a sanitized build is the CPU side.
  if(GPU STREQUAL "cuda" OR GPU STREQUAL "hip")
    message(FATAL_ERROR "PARITY_SANITIZE builds the CPU side only: configure with -DGPU=off")
  endif()
  set(GPU "off")

  list(JOIN PARITY_SANITIZERS "," PARITY_SANITIZERS_CSV)
  set(PARITY_SANITIZE_FLAGS -fsanitize=${PARITY_SANITIZERS_CSV} -fno-omit-frame-pointer -g1)
  if("undefined" IN_LIST PARITY_SANITIZERS)
    list(APPEND PARITY_SANITIZE_FLAGS -fno-sanitize-recover=undefined)
  endif()
  # Every target of the tree, the test binary and the tools it runs through the shell alike.
  add_compile_options(${PARITY_SANITIZE_FLAGS})
  add_link_options(-fsanitize=${PARITY_SANITIZERS_CSV})
  message(STATUS "gpt-oss-parity sanitizers: ${PARITY_SANITIZERS_CSV} (${CMAKE_CXX_COMPILER_ID} "
                 "${CMAKE_CXX_COMPILER_VERSION})")
endif()
