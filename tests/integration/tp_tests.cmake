# Tensor parallelism and cluster launch under mpirun (label mpi).

# Must-show 1: TP=2 vs TP=1, greedy tokens identical, logprobs within 1e-4.
carpool_mpi_test(carpool_tp_equivalence_test 2
  SOURCES tp_equivalence_test.cc
  LIBS carpool_engine carpool_mpi_worker carpool_testing
  TIMEOUT 300)

# mpirun launches with real processes (must-show 2 and 4). One mpirun job set at a time: the
# rank-failure tests time the router's reaction.
add_executable(carpool_tp_mpirun_test tp_mpirun_test.cc)
target_link_libraries(carpool_tp_mpirun_test
  PRIVATE carpool_client carpool_engine carpool_testing GTest::gmock GTest::gtest_main
          carpool_warnings)
set_target_properties(carpool_tp_mpirun_test PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
string(JOIN "," CARPOOL_MPIRUN_FLAGS_CSV ${CARPOOL_MPIRUN_TEST_FLAGS})
target_compile_definitions(carpool_tp_mpirun_test PRIVATE
  CARPOOL_BIN_DIR="${CMAKE_BINARY_DIR}/bin"
  CARPOOL_MPIEXEC="${MPIEXEC_EXECUTABLE}"
  CARPOOL_MPIRUN_FLAGS="${CARPOOL_MPIRUN_FLAGS_CSV}")
add_dependencies(carpool_tp_mpirun_test carpool-router carpool-worker)
gtest_discover_tests(carpool_tp_mpirun_test
  PROPERTIES LABELS mpi RESOURCE_LOCK carpool_mpirun TIMEOUT 120
  DISCOVERY_TIMEOUT 60)
