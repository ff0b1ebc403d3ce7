// The MPI return-code check. Its own binary, labelled "mpi": OpenMPI's initialisation leaks by
// design, so the AddressSanitizer configuration leaves MPI tests out.
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi/mpi_check.hpp"

#include <cstdlib>
#include <string>

namespace gc = gpucloud;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST(MpiCheck, MapsErrorCodesToCommunicationErrors) {
  EXPECT_NO_THROW(GPUCLOUD_MPI_CHECK(MPI_SUCCESS));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {  // before MPI_Init: the code, no string (asking OpenMPI for one would abort)
    try {
      GPUCLOUD_MPI_CHECK(MPI_ERR_TRUNCATE);
      FAIL();
    } catch (const gc::CommunicationError& e) {
      EXPECT_TRUE(contains(e.what(), "MPI error " + std::to_string(MPI_ERR_TRUNCATE))) << e.what();
      EXPECT_TRUE(contains(e.what(), "not initialised")) << e.what();
    }
    ASSERT_EQ(MPI_Init(nullptr, nullptr), MPI_SUCCESS);  // a singleton: no launcher needed
    std::atexit([] { MPI_Finalize(); });
  }
  try {
    GPUCLOUD_MPI_CHECK(MPI_ERR_TRUNCATE);
    FAIL();
  } catch (const gc::CommunicationError& e) {
    EXPECT_EQ(e.call(), "MPI_ERR_TRUNCATE");
    EXPECT_TRUE(contains(e.what(), "message truncated")) << e.what();
  }
}
