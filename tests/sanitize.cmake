# Tests of a sanitizer build (FSDP_SANITIZE, cmake/sanitizers.cmake; run by scripts/sanitize.sh):
# the unit and dist tiers as they are, a 2-rank MPI smoke test (collectives, a FULL_SHARD step,
# checkpoint save / load / export / import) and, with FSDP_FUZZ, the fuzz targets' short runs.
# The runtime options and suppressions come from tests/sanitizers/ through the environment that
# scripts/sanitize.sh sets.
set(FSDP_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none)
set_tests_properties(unit PROPERTIES TIMEOUT 300)
set_tests_properties(dist PROPERTIES TIMEOUT 600)

if(FSDP_SANITIZE STREQUAL "address")
  add_executable(fsdp_mpi_smoke mpi/mpi_main.cpp mpi/test_collectives_mpi.cpp mpi/test_checkpoint.cpp)
  target_link_libraries(fsdp_mpi_smoke PRIVATE fsdp_test_common)
  target_precompile_headers(fsdp_mpi_smoke REUSE_FROM fsdp)
  # Open MPI's components are built without frame pointers and dlclose()d at MPI_Finalize: only
  # the slow unwinder gives their leaked allocations stacks that reach the libraries that
  # tests/sanitizers/lsan.supp names (the fast one stops after one frame, <unknown module>).
  string(REPLACE ";" " " _mpirun "${FSDP_MPIRUN}")
  add_test(NAME mpi_smoke_n2 COMMAND sh -c
    "ASAN_OPTIONS=\"$ASAN_OPTIONS:fast_unwind_on_malloc=0\" exec ${_mpirun} -n 2 $<TARGET_FILE:fsdp_mpi_smoke>")
  set_tests_properties(mpi_smoke_n2 PROPERTIES TIMEOUT 600 LABELS mpi RUN_SERIAL TRUE)
endif()

if(FSDP_FUZZ)
  add_subdirectory(fuzz)
endif()
