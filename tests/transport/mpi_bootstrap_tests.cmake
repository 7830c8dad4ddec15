# The MPI bootstrap's tests: included from tests/transport/CMakeLists.txt
# when MPI is found. They run under mpirun with 3 ranks, and once as a
# singleton without mpirun, where MpiBootstrap initialises (and finalises) MPI
# itself.
add_executable(dlop_mpi_bootstrap_tests mpi_bootstrap_test.cpp)
target_link_libraries(dlop_mpi_bootstrap_tests PRIVATE dlop_transport_mpi GTest::gtest dlop_options)

# We run as root in CI containers; Open MPI refuses that unless told.
set(_dlop_mpi_test_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
# Open MPI leaks in its own initialisation (and in components it unloads, which
# LeakSanitizer cannot even name): keep LeakSanitizer for our code elsewhere.
if(DLOP_SANITIZE MATCHES "address")
  list(APPEND _dlop_mpi_test_env ASAN_OPTIONS=detect_leaks=0)
endif()

add_test(NAME mpi_bootstrap_3_ranks
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe ${MPIEXEC_PREFLAGS}
          $<TARGET_FILE:dlop_mpi_bootstrap_tests> ${MPIEXEC_POSTFLAGS})
add_test(NAME mpi_bootstrap_singleton COMMAND dlop_mpi_bootstrap_tests --dlop-self-init)
set_tests_properties(mpi_bootstrap_3_ranks mpi_bootstrap_singleton PROPERTIES
  ENVIRONMENT "${_dlop_mpi_test_env}" TIMEOUT 120 LABELS transport)
