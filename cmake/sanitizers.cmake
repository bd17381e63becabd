# Sanitizer and fuzzer builds (docs/testing.md). Applied to every target of this tree; libtorch,
# Open MPI and gtest come prebuilt and stay uninstrumented.
#
#   FSDP_SANITIZE=address   AddressSanitizer + UndefinedBehaviorSanitizer (any UB aborts)
#   FSDP_SANITIZE=thread    ThreadSanitizer
#   FSDP_FUZZ=ON            also libFuzzer coverage on the library and the fuzz targets in
#                           tests/fuzz (clang only; with FSDP_SANITIZE=address)
set(FSDP_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan + UBSan) or 'thread'")
option(FSDP_FUZZ "Build the libFuzzer targets (clang, FSDP_SANITIZE=address)" OFF)

if(FSDP_SANITIZE STREQUAL "address")
  # vptr needs the RTTI of every polymorphic type it sees, libtorch's included: left out (UBSan's
  # documented limitation with libraries built without it), every other UB check is on.
  set(_fsdp_san -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=all)
elseif(FSDP_SANITIZE STREQUAL "thread")
  set(_fsdp_san -fsanitize=thread)
elseif(NOT FSDP_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FSDP_SANITIZE must be '', 'address' or 'thread', not '${FSDP_SANITIZE}'")
endif()

if(FSDP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT FSDP_SANITIZE STREQUAL "address")
    message(FATAL_ERROR "FSDP_FUZZ needs clang (CMAKE_CXX_COMPILER=clang++-14) and FSDP_SANITIZE=address")
  endif()
  list(APPEND _fsdp_san -fsanitize=fuzzer-no-link)
endif()

if(_fsdp_san)
  # Reports need function names, files and lines (inlined frames included), not variables or
  # types: line tables only (clang), a fraction of -g's compile and link time with libtorch.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(_fsdp_debug -gline-tables-only)
  else()
    set(_fsdp_debug -g1)
  endif()
  add_compile_options(${_fsdp_san} -fno-omit-frame-pointer ${_fsdp_debug})
  add_link_options(${_fsdp_san})
endif()

# clang refuses a precompiled header built as PIC (the static libraries) in a PIE translation unit
# (the executables that REUSE_FROM it): these builds link everything statically into executables,
# so they leave the position-independence to the compiler's default.
if(_fsdp_san AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(CMAKE_POSITION_INDEPENDENT_CODE OFF)
endif()
