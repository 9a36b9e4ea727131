# Tensor parallelism and cluster launch under mpirun (label mpi).

# Must-show 1: TP=2 vs TP=1, greedy tokens identical, logprobs within 1e-4.
carpool_mpi_test(carpool_tp_equivalence_test 2
  SOURCES tp_equivalence_test.cc
  LIBS carpool_engine carpool_mpi_worker carpool_testing
  TIMEOUT 300)
