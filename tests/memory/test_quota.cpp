// The per-process memory quota on every device: what the library holds is counted (pools' caches
// included), an allocation beyond the quota is a typed OutOfMemory naming the quota, the request and
// what is held, nothing is counted for it, pools give their cache back and retry, and a quota below
// what is held refuses until enough is freed.
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/memory/plain_resource.hpp>
#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/memory/quota.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gc = gpucloud;

namespace {
constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class Quota : public gc::testing::OnEveryDevice {
 protected:
  void TearDown() override { gc::clear_memory_quota(device()); }
  // The held bytes other tests' objects may still hold (freed after their streams' work).
  std::size_t held() const { return gc::memory_quota(device()).held_bytes; }
};

TEST_P(Quota, AllocationsBeyondTheQuotaAreATypedErrorNamingItAndNothingIsCounted) {
  const std::size_t base = held();
  gc::set_memory_quota(device(), base + 1 * kMiB);
  const gc::MemoryQuota q = gc::memory_quota(device());
  ASSERT_TRUE(q.limit_bytes.has_value());
  EXPECT_EQ(*q.limit_bytes, base + 1 * kMiB);
  EXPECT_TRUE(contains(q.source, "set_memory_quota(" + device().str())) << q.source;
  EXPECT_EQ(q.device, device());

  auto first = std::make_optional<gc::Buffer>(600 * kKiB, gc::DType::uint8, device());
  EXPECT_EQ(held(), base + 600 * kKiB);
  const std::size_t refused = gc::memory_quota(device()).refused;
  try {
    gc::Buffer second(600 * kKiB, gc::DType::uint8, device());
    FAIL() << "a buffer beyond the quota was allocated";
  } catch (const gc::OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.requested_bytes(), 600 * kKiB);
    EXPECT_TRUE(contains(what, "cannot allocate 614400 bytes")) << what;
    EXPECT_TRUE(contains(what, "memory quota there is " + std::to_string(base + kMiB) + " bytes")) << what;
    EXPECT_TRUE(contains(what, std::to_string(base + 600 * kKiB) + " bytes (") ||
                contains(what, std::to_string(base + 600 * kKiB) + " bytes are held"))
        << what;
    EXPECT_TRUE(contains(what, "set_memory_quota(")) << what;
  }
  EXPECT_EQ(held(), base + 600 * kKiB) << "a refused allocation counts nothing";
  EXPECT_EQ(gc::memory_quota(device()).refused, refused + 1);
  first.reset();  // given back at once, as RMM's limiting adaptor
  EXPECT_EQ(held(), base);
  gc::Buffer second(600 * kKiB, gc::DType::uint8, device());
  EXPECT_GE(gc::memory_quota(device()).peak_bytes, base + 600 * kKiB);
}

TEST_P(Quota, APoolsCacheCountsAndIsGivenBackWhenTheQuotaIsReached) {
  gc::PlainResource upstream(gc::MemoryKind::device, device());
  gc::PoolResource pool(upstream);
  const std::size_t base = held();
  gc::set_memory_quota(device(), base + 5 * kMiB);
  { gc::Buffer a(2 * kMiB, gc::DType::uint8, device(), gc::MemoryKind::device, pool); }
  EXPECT_EQ(pool.cached_bytes(), 2 * kMiB);
  EXPECT_EQ(held(), base + 2 * kMiB) << "the pool's cache is held from the device";
  // Another size class (3 MiB: the 4 MiB one) does not fit beside the cache: the pool releases it
  // and retries.
  gc::Buffer b(3 * kMiB, gc::DType::uint8, device(), gc::MemoryKind::device, pool);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(held(), base + 4 * kMiB);
  EXPECT_THROW(gc::Buffer(2 * kMiB, gc::DType::uint8, device(), gc::MemoryKind::device, pool), gc::OutOfMemory);
  EXPECT_EQ(held(), base + 4 * kMiB);
}

TEST_P(Quota, AQuotaBelowWhatIsHeldRefusesUntilEnoughIsFreed) {
  auto held_buffer = std::make_optional<gc::Buffer>(1 * kMiB, gc::DType::uint8, device());
  gc::set_memory_quota(device(), held() - 512 * kKiB);
  EXPECT_THROW(gc::Buffer(256, gc::DType::uint8, device()), gc::OutOfMemory);
  held_buffer.reset();
  gc::Buffer fits(256, gc::DType::uint8, device());
  gc::clear_memory_quota(device());
  EXPECT_FALSE(gc::memory_quota(device()).limit_bytes.has_value());
  EXPECT_TRUE(gc::memory_quota(device()).source.empty());
}

TEST_P(Quota, AFractionIsOfTheDevicesMemory) {
  gc::set_memory_fraction(device(), 0.25);
  const std::size_t total = gc::memory_info(device()).total;
  EXPECT_NEAR(static_cast<double>(*gc::memory_quota(device()).limit_bytes), static_cast<double>(total) * 0.25, 1.0);
  for (const double bad : {0.0, -0.5, 1.5}) {
    try {
      gc::set_memory_fraction(device(), bad);
      FAIL() << bad;
    } catch (const gc::InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "fraction: ")) << e.what();
      EXPECT_TRUE(contains(e.what(), "is not in (0, 1]")) << e.what();
    }
  }
  EXPECT_NEAR(static_cast<double>(*gc::memory_quota(device()).limit_bytes), static_cast<double>(total) * 0.25, 1.0)
      << "a refused fraction changes nothing";
}

TEST_P(Quota, ThreadsAllocatingAtOnceNeverHoldMoreThanTheQuota) {
  const std::size_t base = held();
  const std::size_t limit = base + 8 * 64 * kKiB;
  gc::set_memory_quota(device(), limit);
  std::vector<std::thread> threads;
  std::atomic<int> over{0}, refusals{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        try {
          std::vector<gc::Buffer> three;
          for (int k = 0; k < 3; ++k) three.emplace_back(64 * kKiB, gc::DType::uint8, device());
          if (gc::memory_quota(device()).held_bytes > limit) over.fetch_add(1);
        } catch (const gc::OutOfMemory&) {
          refusals.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(over.load(), 0);
  EXPECT_EQ(held(), base) << "every refused or freed byte is given back";
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(Quota);

TEST(QuotaSizes, ParseBytesTakesBinaryAndDecimalUnitsAndNamesWhatIsWrong) {
  EXPECT_EQ(gc::parse_bytes("1048576", "x"), 1048576u);
  EXPECT_EQ(gc::parse_bytes("512MiB", "x"), 512 * kMiB);
  EXPECT_EQ(gc::parse_bytes("4G", "x"), 4ull << 30);
  EXPECT_EQ(gc::parse_bytes(" 2 gb ", "x"), 2000000000u);
  EXPECT_EQ(gc::parse_bytes("3KB", "x"), 3000u);
  EXPECT_EQ(gc::parse_bytes("7b", "x"), 7u);
  for (const char* bad : {"", "MiB", "1.5GiB", "-1", "12 apples", "99999999999T"}) {
    try {
      gc::parse_bytes(bad, "quota");
      FAIL() << bad;
    } catch (const gc::InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), std::string("quota: '") + bad + "'")) << e.what();
    }
  }
}

}  // namespace
