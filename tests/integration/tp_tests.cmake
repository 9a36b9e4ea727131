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

# cluster/launch/mpirun.sh in both layouts, with a rank killed under --router-outside.
add_test(NAME carpool_tp_launch_test
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tp_launch_test.sh ${CMAKE_BINARY_DIR}/bin
          ${PROJECT_SOURCE_DIR})
set_tests_properties(carpool_tp_launch_test PROPERTIES
  LABELS mpi RESOURCE_LOCK carpool_mpirun TIMEOUT 180)

# How plan.py, mpirun.sh and carpool.sbatch name a worker's GPUs (ordinals, --gpus for a group,
# CUDA_VISIBLE_DEVICES left as the job had it) and carpool-worker's refusal of a bad --gpus; fake
# mpirun and scontrol, no GPU, a few seconds.
find_program(CARPOOL_LAUNCH_TEST_PYTHON python3)
add_test(NAME carpool_launch_gpus_test
  COMMAND ${CARPOOL_LAUNCH_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/launch_gpus_test.py
          ${CMAKE_BINARY_DIR}/bin ${PROJECT_SOURCE_DIR})
set_tests_properties(carpool_launch_gpus_test PROPERTIES LABELS unit TIMEOUT 120)

# Must-show 3: a one-node Slurm cluster (munged, slurmctld, slurmd) runs cluster/slurm/carpool.sbatch;
# skipped (exit 77) with the reason where the Slurm packages are missing.
add_test(NAME carpool_slurm_test
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/slurm/slurm_test.sh ${CMAKE_BINARY_DIR}/bin
          ${PROJECT_SOURCE_DIR})
set_tests_properties(carpool_slurm_test PROPERTIES
  LABELS slurm RESOURCE_LOCK carpool_mpirun SKIP_RETURN_CODE 77 TIMEOUT 240)
