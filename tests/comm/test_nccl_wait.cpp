// The NCCL backend's wait for a non-blocking communicator to settle (src/comm/nccl/nccl_wait.hpp),
// run here with a scripted state instead of NCCL's: it returns the settled state (success or an
// error), gives up at the timeout on a state that stays in progress (a peer that never comes), and
// stops at once when the communicator is aborted from another thread.
#include <gtest/gtest.h>

#include "comm/nccl/nccl_wait.hpp"

#include <atomic>
#include <chrono>
#include <thread>

namespace {

using gpucloud::detail::SettleOutcome;
using gpucloud::detail::wait_to_settle;
using namespace std::chrono_literals;

constexpr int kSuccess = 0, kInProgress = 7, kRemoteError = 6;  // as ncclResult_t numbers them

TEST(NcclWait, ACallThatSettlesAtOnceIsPolledOnce) {
  int polls = 0;
  const auto r = wait_to_settle([&] { return ++polls, kSuccess; }, kInProgress, 1000ms, [] { return false; });
  EXPECT_EQ(r.outcome, SettleOutcome::settled);
  EXPECT_EQ(r.state, kSuccess);
  EXPECT_EQ(polls, 1);
}

TEST(NcclWait, ReturnsTheStateItSettlesIn) {
  int polls = 0;
  auto query = [&] { return ++polls < 5 ? kInProgress : kRemoteError; };
  const auto r = wait_to_settle(query, kInProgress, 10000ms, [] { return false; });
  EXPECT_EQ(r.outcome, SettleOutcome::settled);
  EXPECT_EQ(r.state, kRemoteError);
  EXPECT_EQ(polls, 5);
}

TEST(NcclWait, GivesUpAtTheTimeoutWithoutSpinning) {
  int polls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = wait_to_settle([&] { return ++polls, kInProgress; }, kInProgress, 200ms, [] { return false; });
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.outcome, SettleOutcome::timed_out);
  EXPECT_EQ(r.state, kInProgress);
  EXPECT_GE(r.waited, 200ms);
  EXPECT_GE(took, 200ms);
  // Sleeps grow to 1 ms: at most ~210 polls in 200 ms, however fast the machine (a loaded one polls less).
  EXPECT_LT(polls, 400);
}

TEST(NcclWait, StopsWhenAnotherThreadAbortsTheCommunicator) {
  std::atomic<bool> aborted{false};
  std::thread watchdog([&] {
    std::this_thread::sleep_for(50ms);
    aborted = true;
  });
  const auto r = wait_to_settle([] { return kInProgress; }, kInProgress, 60000ms, [&] { return aborted.load(); });
  watchdog.join();
  EXPECT_EQ(r.outcome, SettleOutcome::stopped);
  EXPECT_LT(r.waited, 30000ms);
}

TEST(NcclWait, AZeroTimeoutStillPollsOnce) {
  const auto r = wait_to_settle([] { return kSuccess; }, kInProgress, 0ms, [] { return false; });
  EXPECT_EQ(r.outcome, SettleOutcome::settled);
}

}  // namespace
