// JobControl::should_stop across ranks (in the collectives suite): one rank asked to stop makes
// every rank answer true at the same call, one call later; requests at different steps stop all
// at the first one's; a stream of another device is refused before anything is enqueued.
#include "../comm/collectives_cases.hpp"

#include <gpucloud/elastic/job_control.hpp>

#include <gpucloud/memory/resource_adaptors.hpp>

#include <algorithm>
#include <memory>

namespace gpucloud::testing::collectives {
namespace {

// The step at which should_stop() first answered true on this rank, or -1; every rank asks
// for @p steps steps, rank r asking for a stop at request_at[r] (-1: never).
std::int64_t stop_step(const std::vector<int>& request_at, int steps) {
  Stream s;
  elastic::JobControl control;
  const int r = world().rank();
  const int at = r < static_cast<int>(request_at.size()) ? request_at[static_cast<std::size_t>(r)] : -1;
  for (int step = 0; step < steps; ++step) {
    if (step == at) control.request_stop();
    if (control.should_stop(step, &world(), s)) return step;
  }
  return -1;
}

// Every rank's value of @p v (MPI, outside the code under test).
std::vector<std::int64_t> gathered(std::int64_t v) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(world().size()));
  MPI_Allgather(&v, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  return all;
}

TEST(JobControlAgreement, OneRankAskedStopsEveryRankAtTheSameStep) {
  std::vector<int> request_at(static_cast<std::size_t>(world().size()), -1);
  request_at.back() = 5;  // the last rank only, as when one node gets the preemption notice
  for (std::int64_t v : gathered(stop_step(request_at, 20))) EXPECT_EQ(v, 6);
}

TEST(JobControlAgreement, TheFirstRequestWins) {
  std::vector<int> request_at(static_cast<std::size_t>(world().size()), -1);
  for (std::size_t r = 0; r < request_at.size(); ++r) request_at[r] = static_cast<int>(9 - r % 3);
  const int first = *std::min_element(request_at.begin(), request_at.end());
  for (std::int64_t v : gathered(stop_step(request_at, 20))) EXPECT_EQ(v, first + 1);
}

TEST(JobControlAgreement, NoRequestNoStop) {
  for (std::int64_t v : gathered(stop_step({}, 12))) EXPECT_EQ(v, -1);
}

TEST(JobControlAgreement, OutlivesAResourceInstalledAfterIt) {
  // A trainer makes its JobControl first and installs a statistics adaptor as the default device
  // resource afterwards, which main destroys first: the JobControl's own buffers must not come
  // from it (under the sanitizers a release through the destroyed adaptor is a report).
  elastic::JobControl control;
  Stream s;
  {
    auto stats = std::make_unique<StatisticsAdaptor>(default_resource(MemoryKind::device, s.device()));
    set_default_resource(MemoryKind::device, s.device(), stats.get());
    for (int step = 0; step < 3; ++step) EXPECT_FALSE(control.should_stop(step, &world(), s));
    s.synchronize();
    set_default_resource(MemoryKind::device, s.device(), nullptr);
  }  // the adaptor is gone (heap memory: under AddressSanitizer a later use is a report)
  EXPECT_FALSE(control.should_stop(3, &world(), s));
}

TEST(JobControlAgreement, AStreamOfAnotherDeviceIsRefused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "needs a GPU stream to mismatch the host communicator";
  elastic::JobControl control;
  Stream gpu(Device::cuda(0));
  EXPECT_THROW(control.should_stop(0, &world(), gpu), InvalidArgument);
}

}  // namespace
}  // namespace gpucloud::testing::collectives
