// Buffers and memory resources on every device: kinds, alignment, zero size, bad sizes, out of
// memory (recoverable), pools with stream-ordered reuse, statistics, limits, defaults, managed.
#include <gpucloud/amp/optimizers.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/compute/nn_ops.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/memory/managed_memory.hpp>
#include <gpucloud/memory/plain_resource.hpp>
#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/memory/resource_adaptors.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace gc = gpucloud;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<gc::MemoryKind> kinds_on(gc::Device d) {
  if (d.is_host())
    return {gc::MemoryKind::host, gc::MemoryKind::pinned, gc::MemoryKind::device, gc::MemoryKind::managed};
  return {gc::MemoryKind::device, gc::MemoryKind::managed};
}

// Device-agnostic round trip: upload through pinned memory, download, compare.
std::vector<std::uint8_t> round_trip(const gc::Buffer& b, const std::vector<std::uint8_t>& data, gc::StreamView s) {
  gc::Buffer staging(data.size(), gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  std::copy(data.begin(), data.end(), static_cast<std::uint8_t*>(staging.data()));
  gc::copy(b, staging, s);
  gc::Buffer back(data.size(), gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  gc::copy(back, b, s);
  s.synchronize();
  const auto* p = static_cast<const std::uint8_t*>(back.data());
  return std::vector<std::uint8_t>(p, p + data.size());
}
}  // namespace

class MemoryTest : public gc::testing::OnEveryDevice {};

TEST_P(MemoryTest, EveryKindAllocatesAlignedUsableMemory) {
  gc::Stream s(device());
  for (auto kind : kinds_on(device())) {
    for (std::size_t n : {1u, 255u, 4097u}) {
      gc::Buffer b(n, gc::DType::uint8, device(), kind);
      EXPECT_EQ(b.size(), n);
      EXPECT_EQ(b.size_bytes(), n);
      EXPECT_EQ(b.kind(), kind);
      EXPECT_EQ(b.device(), device());
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % gc::kAllocationAlignment, 0u);
      std::vector<std::uint8_t> data(n);
      std::iota(data.begin(), data.end(), static_cast<std::uint8_t>(n));
      EXPECT_EQ(round_trip(b, data, s), data) << gc::memory_kind_name(kind) << " n=" << n;
    }
  }
}

TEST_P(MemoryTest, ZeroSizeBuffersAreValid) {
  gc::Stream s(device());
  for (auto kind : kinds_on(device())) {
    gc::Buffer b(0, gc::DType::float32, device(), kind);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(b.data(), nullptr);
    gc::Buffer c(0, gc::DType::float32, device(), kind, s);
    gc::copy(c, b, s);
    s.synchronize();
  }
}

TEST_P(MemoryTest, TypedBufferAndMoveSemantics) {
  gc::TypedBuffer<float> t(100, device());
  EXPECT_EQ(t.size(), 100u);
  EXPECT_EQ(t.buffer().dtype(), gc::DType::float32);
  gc::Buffer a(10, gc::DType::int64, device());
  void* p = a.data();
  gc::Buffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move)
  gc::Buffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size_bytes(), 80u);
  EXPECT_THROW((void)c.data_as<float>(), gc::InvalidArgument);
  EXPECT_NE(c.data_as<std::int64_t>(), nullptr);
}

TEST_P(MemoryTest, OverflowingAndAbsurdSizesAreTypedErrors) {
  const std::size_t too_many = std::numeric_limits<std::size_t>::max() / 4 + 1;
  try {
    gc::Buffer b(too_many, gc::DType::float32, device());
    FAIL() << "byte count overflow must be rejected";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "size")) << e.what();
    EXPECT_TRUE(contains(e.what(), "float32")) << e.what();
  }
  // A size_t that came from a negative number.
  EXPECT_THROW(gc::Buffer(static_cast<std::size_t>(-8), gc::DType::uint8, device()), gc::InvalidArgument);
  // Representable, but far beyond any memory: out of memory, naming the request; recoverable.
  const std::size_t absurd = std::size_t{1} << 52;  // 4 PiB
  try {
    gc::Buffer b(absurd, gc::DType::uint8, device());
    FAIL() << "4 PiB cannot be allocated";
  } catch (const gc::OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes(), absurd);
    EXPECT_TRUE(contains(e.what(), std::to_string(absurd))) << e.what();
    if (device().is_host()) {
      EXPECT_TRUE(contains(e.what(), "free of")) << e.what();
      EXPECT_TRUE(contains(e.what(), "device memory on host")) << e.what();
    }
  }
  gc::Buffer fine(1024, gc::DType::uint8, device());
  EXPECT_NE(fine.data(), nullptr);
}

TEST_P(MemoryTest, ResourceMustMatchKindAndDevice) {
  gc::PlainResource host_mr(gc::MemoryKind::host, gc::Device::host());
  try {
    gc::Buffer b(4, gc::DType::uint8, device(), gc::MemoryKind::device, host_mr);
    FAIL() << "a host resource cannot serve device memory";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "mr:")) << e.what();
  }
  if (device().is_cuda()) {
    EXPECT_THROW(gc::Buffer(4, gc::DType::uint8, device(), gc::MemoryKind::pinned), gc::InvalidArgument);
    EXPECT_THROW(gc::PlainResource(gc::MemoryKind::host, device()), gc::InvalidArgument);
    gc::Stream host_stream;
    EXPECT_THROW(gc::Buffer(4, gc::DType::uint8, device(), gc::MemoryKind::device, host_stream), gc::InvalidArgument);
  }
}

TEST_P(MemoryTest, ElementReadsAndWritesAnyMemoryInStreamOrder) {
  gc::Stream s(device());
  gc::TypedBuffer<std::int32_t> b(8, device(), gc::MemoryKind::device, s);
  gc::fill_integer(b, 7, s);
  b.set_element(3, -5, s);  // after the fill, in the stream's order
  EXPECT_EQ(b.element(3, s), -5);
  EXPECT_EQ(b.element(7, s), 7);
  EXPECT_THROW((void)b.element(8, s), gc::InvalidArgument);
  EXPECT_THROW(b.set_element(8, 1, s), gc::InvalidArgument);
  EXPECT_EQ(b.element(0, s), 7);  // the refused calls changed nothing
  if (device().is_cuda()) {
    // Device memory of a GPU: operator[] would dereference a device pointer on the host.
    try {
      (void)b[0];
      FAIL() << "operator[] on a GPU's device memory was accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_TRUE(contains(e.what(), "element(i, stream)")) << e.what();
    }
    EXPECT_THROW((void)b.begin(), gc::InvalidArgument);
    EXPECT_FALSE(b.view().host_accessible());
  } else {
    EXPECT_EQ(b[3], -5);
    EXPECT_TRUE(b.view().host_accessible());
  }
  gc::TypedBuffer<float> pinned(4, gc::Device::host(), gc::MemoryKind::pinned);
  EXPECT_TRUE(pinned.view().host_accessible());
}

// Library scratch (partial sums, workspaces) comes from the user's default device resource, so
// statistics and limits see it; the built-in one (or CUDA's pool) when none is set.
TEST_P(MemoryTest, LibraryScratchComesFromTheUsersDefaultResource) {
  gc::Stream s(device());
  gc::TypedBuffer<float> pred(1000, device(), gc::MemoryKind::device, s),
      target(1000, device(), gc::MemoryKind::device, s);
  gc::TypedBuffer<float> grad(1000, device(), gc::MemoryKind::device, s), loss(1, device(), gc::MemoryKind::device, s);
  gc::fill(pred, 2.0, s);
  gc::fill(target, 1.0, s);
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::StatisticsAdaptor stats(plain);
  gc::MemoryResource* previous = gc::set_default_resource(gc::MemoryKind::device, device(), &stats);
  ASSERT_NE(previous, nullptr);
  try {
    gc::mse_loss(pred, target, loss, grad, s);
    const gc::Buffer norm = gc::global_norm({grad.view()}, s);
    s.synchronize();
    EXPECT_EQ(loss.element(0, s), 1.0f);
    EXPECT_GE(stats.statistics().total_allocations, 3U);  // mse's partials, the norm's and its coefficient
    const auto after = stats.statistics();
    gc::set_default_resource(gc::MemoryKind::device, device(), nullptr);
    gc::mse_loss(pred, target, loss, grad, s);  // the built-in again: not counted
    s.synchronize();
    EXPECT_EQ(stats.statistics().total_allocations, after.total_allocations);
  } catch (...) {
    gc::set_default_resource(gc::MemoryKind::device, device(), nullptr);
    throw;
  }
  s.synchronize();
  EXPECT_EQ(stats.statistics().current_allocations, 0U);  // scratch is freed in stream order
}

// A resource is passed by reference (rmm's resource_ref), never as a pointer that may be null.
static_assert(
    !std::is_constructible_v<gc::Buffer, std::size_t, gc::DType, gc::Device, gc::MemoryKind, gc::MemoryResource*>,
    "pass the resource by reference, or omit it for the default");

TEST_P(MemoryTest, LimitingAdaptorFailsCleanlyAndStaysUsable) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::LimitingAdaptor limited(plain, 1 << 20);
  gc::Buffer a(600 << 10, gc::DType::uint8, device(), gc::MemoryKind::device, limited);
  try {
    gc::Buffer b(600 << 10, gc::DType::uint8, device(), gc::MemoryKind::device, limited);
    FAIL() << "over the limit";
  } catch (const gc::OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes(), 600u << 10);
    EXPECT_TRUE(contains(e.what(), "limit")) << e.what();
    EXPECT_TRUE(contains(e.what(), device().str())) << e.what();
  }
  EXPECT_EQ(limited.allocated_bytes(), 600u << 10);
  gc::Buffer c(400 << 10, gc::DType::uint8, device(), gc::MemoryKind::device, limited);
  EXPECT_EQ(limited.allocated_bytes(), 1000u << 10);
}

TEST_P(MemoryTest, StatisticsCountBytesAndAllocations) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::StatisticsAdaptor stats(plain);
  {
    gc::Buffer a(1000, gc::DType::float32, device(), gc::MemoryKind::device, stats);
    gc::Buffer b(24, gc::DType::float64, device(), gc::MemoryKind::device, stats);
    const auto s = stats.statistics();
    EXPECT_EQ(s.current_bytes, 4192u);
    EXPECT_EQ(s.current_allocations, 2u);
  }
  auto s = stats.statistics();
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, 4192u);
  EXPECT_EQ(s.total_allocations, 2u);
  EXPECT_EQ(s.total_bytes, 4192u);
  stats.reset_peak();
  EXPECT_EQ(stats.statistics().peak_bytes, 0u);
}

TEST_P(MemoryTest, PoolReusesBlocksBySizeClass) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::StatisticsAdaptor upstream(plain);
  gc::PoolResource pool(upstream, 1 << 20);
  void* first = nullptr;
  {
    gc::Buffer a(1000, gc::DType::uint8, device(), gc::MemoryKind::device, pool);
    first = a.data();
    EXPECT_EQ(pool.pool_bytes(), 1024u);
  }
  EXPECT_EQ(pool.cached_bytes(), 1024u);
  gc::Buffer b(900, gc::DType::uint8, device(), gc::MemoryKind::device, pool);  // same class: reused
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(upstream.statistics().total_allocations, 1u);
  gc::Buffer c(3000, gc::DType::uint8, device(), gc::MemoryKind::device, pool);  // new class
  EXPECT_NE(c.data(), first);
  EXPECT_EQ(upstream.statistics().total_allocations, 2u);
  gc::Buffer big(2 << 20, gc::DType::uint8, device(), gc::MemoryKind::device, pool);  // above max: upstream
  EXPECT_EQ(upstream.statistics().current_bytes, 1024u + 4096u + (2u << 20));
  pool.release();  // nothing cached right now
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST_P(MemoryTest, PoolReturnsStreamOrderedFreesOnlyAfterEarlierWork) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::PoolResource pool(plain);
  gc::Stream s(device());
  std::promise<void> open;
  auto gate = open.get_future().share();
  gc::launch_host_func(s, [gate] { gate.wait(); });
  std::vector<std::uint8_t> data(5000, 7);
  gc::Buffer src(5000, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  std::copy(data.begin(), data.end(), static_cast<std::uint8_t*>(src.data()));
  {
    gc::Buffer scratch(5000, gc::DType::uint8, device(), gc::MemoryKind::device, s, pool);
    gc::copy(scratch, src, s);  // still queued behind the gate when scratch goes away
  }
  EXPECT_EQ(pool.cached_bytes(), 0u);  // not reusable yet: the queued copy still writes it
  open.set_value();
  s.synchronize();
  EXPECT_EQ(pool.cached_bytes(), 8192u);
}

// A free in a busy stream's order comes back through an event, taken when the pool is next used
// (no host function per free); the pool's destructor waits for the frees still pending.
TEST_P(MemoryTest, PoolTakesBackOrderedFreesWhenNextUsedAndWaitsForThemAtDestruction) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::StatisticsAdaptor upstream(plain);
  gc::Stream s(device());
  std::promise<void> open_later;
  std::thread opener;
  {
    gc::PoolResource pool(upstream);
    std::promise<void> open;
    gc::launch_host_func(s, [gate = open.get_future().share()] { gate.wait(); });
    void* first = nullptr;
    {
      gc::Buffer a(4096, gc::DType::uint8, device(), gc::MemoryKind::device, s, pool);
      first = a.data();
    }
    {
      gc::Buffer b(4096, gc::DType::uint8, device(), gc::MemoryKind::device, pool);
      EXPECT_NE(b.data(), first);  // the stream may still touch the first block
    }
    open.set_value();
    s.synchronize();
    gc::Buffer c(4096, gc::DType::uint8, device(), gc::MemoryKind::device, pool);
    gc::Buffer d(4096, gc::DType::uint8, device(), gc::MemoryKind::device, pool);
    EXPECT_TRUE(c.data() == first || d.data() == first);  // back when the pool was next used
    EXPECT_EQ(upstream.statistics().total_allocations, 2u);
    gc::launch_host_func(s, [gate = open_later.get_future().share()] { gate.wait(); });
    { gc::Buffer e(8192, gc::DType::uint8, device(), gc::MemoryKind::device, s, pool); }
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      open_later.set_value();
    });
  }  // the destructor waits for e's return, then gives every block back
  opener.join();
  EXPECT_EQ(upstream.statistics().current_bytes, 0u);
  s.synchronize();
}

TEST_P(MemoryTest, PoolReleasesCacheAndRetriesWhenUpstreamIsExhausted) {
  gc::PlainResource plain(gc::MemoryKind::device, device());
  gc::LimitingAdaptor limited(plain, 8192);
  gc::PoolResource pool(limited);
  { gc::Buffer a(4096, gc::DType::uint8, device(), gc::MemoryKind::device, pool); }
  EXPECT_EQ(pool.cached_bytes(), 4096u);
  gc::Buffer b(8192, gc::DType::uint8, device(), gc::MemoryKind::device, pool);  // needs the cache back
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(limited.allocated_bytes(), 8192u);
  EXPECT_THROW(gc::Buffer(4096, gc::DType::uint8, device(), gc::MemoryKind::device, pool), gc::OutOfMemory);
}

TEST_P(MemoryTest, DefaultResourceCanBeReplacedAndRestored) {
  auto& builtin = gc::default_resource(gc::MemoryKind::device, device());
  gc::StatisticsAdaptor stats(builtin);
  gc::MemoryResource* previous = gc::set_default_resource(gc::MemoryKind::device, device(), &stats);
  EXPECT_EQ(previous, &builtin);
  { gc::Buffer a(64, gc::DType::float32, device()); }
  EXPECT_EQ(stats.statistics().total_bytes, 256u);
  gc::set_default_resource(gc::MemoryKind::device, device(), nullptr);
  EXPECT_EQ(&gc::default_resource(gc::MemoryKind::device, device()), &builtin);
  gc::PlainResource managed(gc::MemoryKind::managed, device());
  EXPECT_THROW(gc::set_default_resource(gc::MemoryKind::device, device(), &managed), gc::InvalidArgument);
}

TEST_P(MemoryTest, StreamOrderedBufferOutlivesItsQueuedWork) {
  // The buffer is destroyed while a copy into it is still queued: the free must wait for it
  // (under AddressSanitizer a premature free is a use-after-free report).
  gc::Stream s(device());
  std::promise<void> open;
  auto gate = open.get_future().share();
  gc::launch_host_func(s, [gate] { gate.wait(); });
  gc::Buffer src(1 << 16, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  {
    gc::Buffer dst(1 << 16, gc::DType::uint8, device(), gc::MemoryKind::device, s);
    gc::copy(dst, src, s);
  }
  open.set_value();
  s.synchronize();
}

TEST_P(MemoryTest, ABufferWithoutAStreamOutlivesEveryStreamsQueuedWork) {
  // Allocated without a stream, used by queued work on two streams, dropped before that work ran:
  // as cudaFree waits for the device, the free waits for the work queued on every stream so far
  // (a trainer returning from main mid-step). Memory allocated while that work is half done must
  // not get the same bytes (under AddressSanitizer a premature free is a use-after-free report).
  gc::Stream s(device()), t(device());
  std::promise<void> open_first, open_second;
  auto first = open_first.get_future().share(), second = open_second.get_future().share();
  constexpr std::size_t n = 1 << 16;
  gc::Buffer src(n, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  std::iota(static_cast<std::uint8_t*>(src.data()), static_cast<std::uint8_t*>(src.data()) + n, std::uint8_t{0});
  gc::Buffer out(n, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  gc::Event halfway(device());
  {
    gc::Buffer dst(n, gc::DType::uint8, device());  // no stream
    gc::launch_host_func(s, [first] { first.wait(); });
    gc::copy(dst, src, s);
    halfway.record(s);
    gc::launch_host_func(s, [second] { second.wait(); });
    gc::copy(out, dst, s);
    gc::launch_host_func(t, [second] { second.wait(); });  // t is busy too: the free waits for it as well
  }
  open_first.set_value();
  halfway.synchronize();
  std::vector<gc::Buffer> others;  // what a block freed too early would be handed at once
  for (int i = 0; i < 4; ++i) {
    others.emplace_back(n, gc::DType::uint8, device());
    if (device().is_host()) std::memset(others.back().data(), 0xAB, n);
  }
  open_second.set_value();
  s.synchronize();
  t.synchronize();
  EXPECT_EQ(std::memcmp(out.data(), src.data(), n), 0);
}

TEST_P(MemoryTest, ManagedPrefetchAndAdvice) {
  gc::Stream s(device());
  gc::TypedBuffer<float> m(4096, device(), gc::MemoryKind::managed);
  gc::prefetch(m, device(), s);
  gc::prefetch(m, gc::Device::host(), s);
  gc::advise(m, gc::MemoryAdvice::read_mostly, device());
  gc::advise(m, gc::MemoryAdvice::unset_read_mostly, device());
  gc::advise(m, gc::MemoryAdvice::preferred_location, gc::Device::host());
  s.synchronize();
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i);  // host-accessible
  EXPECT_EQ(m[4095], 4095.0f);
  gc::TypedBuffer<float> plain(16, device(), gc::MemoryKind::device);
  try {
    gc::prefetch(plain, device(), s);
    FAIL() << "prefetch of non-managed memory";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "not managed")) << e.what();
  }
  EXPECT_THROW(gc::advise(plain, gc::MemoryAdvice::read_mostly, device()), gc::InvalidArgument);
}

TEST_P(MemoryTest, ViewsSliceWithinBounds) {
  gc::TypedBuffer<std::int32_t> b(100, device());
  gc::BufferView v = b;
  auto s = v.slice(10, 20);
  EXPECT_EQ(s.size(), 20u);
  EXPECT_EQ(static_cast<char*>(s.data()) - static_cast<char*>(v.data()), 40);
  EXPECT_NO_THROW((void)v.slice(100, 0));
  EXPECT_THROW((void)v.slice(90, 11), gc::InvalidArgument);
  EXPECT_THROW((void)v.slice(101, 0), gc::InvalidArgument);
  EXPECT_THROW(gc::BufferView(nullptr, 3, gc::DType::uint8, gc::MemoryKind::host, gc::Device::host()),
               gc::InvalidArgument);
}

TEST_P(MemoryTest, PointerInfoFindsWhereMemoryLives) {
  gc::Buffer d(16, gc::DType::uint8, device(), gc::MemoryKind::device);
  const auto info = gc::pointer_info(d.data());
  EXPECT_EQ(info.device, device());
  EXPECT_EQ(info.kind, device().is_cuda() ? gc::MemoryKind::device : gc::MemoryKind::host);
  gc::Buffer p(16, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  EXPECT_EQ(gc::pointer_info(p.data()).kind,
            gc::cuda_device_count() > 0 ? gc::MemoryKind::pinned : gc::MemoryKind::host);
  std::vector<int> pageable(4);
  EXPECT_EQ(gc::pointer_info(pageable.data()).kind, gc::MemoryKind::host);
  EXPECT_EQ(gc::pointer_info(pageable.data()).device, gc::Device::host());
  EXPECT_EQ(gc::pointer_info(nullptr).kind, gc::MemoryKind::host);
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(MemoryTest);

TEST(HostMemory, PinnedAndHostMemoryBelongToTheHost) {
  EXPECT_NO_THROW(gc::PlainResource(gc::MemoryKind::pinned, gc::Device::host()));
  EXPECT_THROW(gc::AsyncPoolResource{gc::Device::host()}, gc::InvalidArgument);
  EXPECT_THROW(gc::PoolResource(gc::default_resource(gc::MemoryKind::host, gc::Device::host()), 16),
               gc::InvalidArgument);
}
