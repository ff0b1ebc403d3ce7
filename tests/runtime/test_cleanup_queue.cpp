// The cleanup queue that CUDA streams hand their cleanups to (a CUDA callback must not free CUDA
// memory or take the GIL): cleanups run in order on its own thread, owners can wait for theirs,
// a cleanup waiting for its own owner does not deadlock, and destruction runs what is queued.
#include <gtest/gtest.h>

#include "runtime/cleanup_queue.hpp"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

using gpucloud::detail::CleanupQueue;
using gpucloud::detail::PendingCleanups;
using namespace std::chrono_literals;

TEST(CleanupQueue, RunsInPostOrderOnItsOwnThread) {
  CleanupQueue q;
  std::mutex m;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  PendingCleanups pending;
  for (int i = 0; i < 100; ++i) {
    pending.begin();
    q.post([&, i] {
      {
        std::lock_guard<std::mutex> lock(m);
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
      }
      pending.end();
    });
  }
  pending.wait(q);
  EXPECT_TRUE(pending.idle());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  for (auto id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
  EXPECT_FALSE(q.on_worker());
}

TEST(CleanupQueue, WaitReturnsOnlyAfterTheCleanupRan) {
  CleanupQueue q;
  PendingCleanups pending;
  std::atomic<bool> ran{false};
  pending.begin();
  q.post([&] {
    std::this_thread::sleep_for(50ms);
    ran = true;
    pending.end();
  });
  EXPECT_FALSE(pending.idle());
  pending.wait(q);
  EXPECT_TRUE(ran.load());
}

TEST(CleanupQueue, ACleanupThatWaitsForItsOwnerDoesNotDeadlock) {
  CleanupQueue q;
  PendingCleanups pending;
  std::atomic<bool> inner_returned{false};
  pending.begin();
  q.post([&] {
    EXPECT_TRUE(q.on_worker());
    pending.wait(q);  // would wait for itself; returns at once on the worker
    inner_returned = true;
    pending.end();
  });
  pending.wait(q);
  EXPECT_TRUE(inner_returned.load());
}

TEST(CleanupQueue, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    CleanupQueue q;
    q.post([&] { std::this_thread::sleep_for(20ms); });
    for (int i = 0; i < 10; ++i) q.post([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(CleanupQueue, SharedIsOneQueue) { EXPECT_EQ(&CleanupQueue::shared(), &CleanupQueue::shared()); }
