// The host backend's pool of cores (src/runtime/host/parallel_for): every index exactly once,
// errors reach the caller, nested and concurrent callers run serially instead of waiting.
#include <gtest/gtest.h>

#include "runtime/host/parallel_for.hpp"

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using gpucloud::detail::parallel_for;

TEST(ParallelFor, CoversEveryIndexOnceForAnySizeAndGrain) {
  for (std::int64_t n : {0, 1, 7, 100, 4096, 100003}) {
    for (std::int64_t grain : {1, 3, 64, 1 << 20}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
      });
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << n << " " << i;
    }
  }
}

TEST(ParallelFor, TheFirstErrorReachesTheCallerAndThePoolStaysUsable) {
  EXPECT_THROW(parallel_for(1000, 1,
                            [](std::int64_t b, std::int64_t e) {
                              if (b <= 500 && 500 < e) throw std::runtime_error("index 500");
                            }),
               std::runtime_error);
  std::atomic<std::int64_t> sum{0};
  parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST(ParallelFor, NestedAndConcurrentCallersFinish) {
  std::atomic<std::int64_t> total{0};
  auto job = [&] {
    parallel_for(64, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        parallel_for(100, 1, [&](std::int64_t b2, std::int64_t e2) { total += e2 - b2; });  // serial inside
      }
    });
  };
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) callers.emplace_back(job);
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 64 * 100);
}

}  // namespace
