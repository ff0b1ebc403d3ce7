// The collectives suites' main: MPI initialised (MPI_THREAD_MULTIPLE) before the tests, one
// rank's report, and every rank's failures failing the job.
#include <gtest/gtest.h>
#include <mpi.h>

#include "collectives_cases.hpp"

#include <cstdio>

using gpucloud::testing::collectives::world;

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  (void)world();  // initialises MPI (MPI_THREAD_MULTIPLE) before the tests
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank prints the report; every rank's failures still fail the job
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("collectives on %d ranks: %s\n", world().size(), any ? "FAILED" : "passed");
  return any;
}
