// The copy pipeline and the batch prefetcher on every device.
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/movement/copy_pipeline.hpp>
#include <gpucloud/movement/prefetcher.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>
#include <gpucloud/runtime/threads.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gc = gpucloud;
using namespace std::chrono_literals;

namespace {

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng());
  return v;
}

// A host buffer of `kind` (host = pageable, or pinned) holding `data`.
gc::Buffer host_buffer(const std::vector<std::uint8_t>& data, gc::MemoryKind kind) {
  gc::Buffer b(data.size(), gc::DType::uint8, gc::Device::host(), kind);
  if (!data.empty()) std::memcpy(b.data(), data.data(), data.size());
  return b;
}

std::vector<std::uint8_t> read_back(gc::BufferView v, gc::StreamView s) {
  gc::Buffer out(v.size_bytes(), gc::DType::uint8, gc::Device::host(), gc::MemoryKind::pinned);
  gc::copy(out, gc::BufferView(v.data(), v.size_bytes(), gc::DType::uint8, v.kind(), v.device()), s);
  s.synchronize();
  const auto* p = static_cast<const std::uint8_t*>(out.data());
  return std::vector<std::uint8_t>(p, p + v.size_bytes());
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

class PipelineTest : public gc::testing::OnEveryDevice {};

TEST_P(PipelineTest, UploadAndDownloadAreByteIdenticalForEveryShapeOfInput) {
  gc::Stream s(device());
  const std::size_t chunk = 4096;
  for (int depth : {1, 2, 3}) {
    gc::CopyPipeline pipeline(device(), {chunk, depth});
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, chunk - 1, chunk, chunk + 1, 10 * chunk + 3}) {
      for (auto kind : {gc::MemoryKind::host, gc::MemoryKind::pinned}) {
        const auto data = random_bytes(n, static_cast<unsigned>(n + depth));
        gc::Buffer src = host_buffer(data, kind);
        gc::Buffer on_device(n, gc::DType::uint8, device());
        gc::Buffer back(n, gc::DType::uint8, gc::Device::host(), kind);
        pipeline.upload(on_device, src, s);
        EXPECT_EQ(read_back(on_device, s), data) << "upload n=" << n << " depth=" << depth;
        pipeline.download(back, on_device, s);
        s.synchronize();
        EXPECT_EQ(read_back(back, s), data) << "download n=" << n << " depth=" << depth;
      }
    }
  }
}

TEST_P(PipelineTest, TransformStreamsThroughDeviceChunksInPlace) {
  gc::Stream s(device());
  gc::CopyPipeline pipeline(device(), {1000 * sizeof(float), 3});
  const std::size_t n = 12345;
  gc::TypedBuffer<float> data(n, gc::Device::host(), gc::MemoryKind::host);
  std::iota(data.begin(), data.end(), 0.0f);
  // Each chunk is overwritten on the device with its own index, then copied back.
  pipeline.transform(data, data, s,
                     [](const gc::Chunk& c) { gc::fill(c.data, static_cast<double>(c.index), c.stream); });
  s.synchronize();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += data[i] != static_cast<float>(i / 1000);
  EXPECT_EQ(wrong, 0u);
  // Identity transform into another (pinned) array.
  gc::TypedBuffer<float> out(n, gc::Device::host(), gc::MemoryKind::pinned);
  pipeline.transform(out, data, s, [](const gc::Chunk&) {});
  s.synchronize();
  EXPECT_EQ(std::memcmp(out.data(), data.data(), n * sizeof(float)), 0);
}

TEST_P(PipelineTest, StepSeesEveryChunkOnceAndInOrderPerStream) {
  gc::Stream s(device());
  gc::CopyPipeline pipeline(device(), {256, 3});
  const auto data = random_bytes(256 * 20 + 7, 1);
  gc::Buffer src = host_buffer(data, gc::MemoryKind::host);
  gc::Buffer dst(data.size(), gc::DType::uint8, device());
  std::mutex m;
  std::map<void*, std::vector<std::size_t>> executed;  // per stream, in execution order
  std::vector<std::size_t> offsets;
  pipeline.upload(dst, src, s, [&](const gc::Chunk& c) {
    offsets.push_back(c.offset);
    EXPECT_EQ(c.data.size(), std::min<std::size_t>(256, data.size() - c.offset));
    gc::launch_host_func(c.stream, [&, index = c.index, key = static_cast<void*>(c.stream.impl())] {
      std::lock_guard<std::mutex> lock(m);
      executed[key].push_back(index);
    });
  });
  s.synchronize();
  ASSERT_EQ(offsets.size(), 21u);
  for (std::size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(offsets[i], i * 256);
  EXPECT_EQ(executed.size(), 3u);
  std::vector<std::size_t> all;
  for (auto& [stream, order] : executed) {
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
    all.insert(all.end(), order.begin(), order.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<std::size_t> expected(21);
  std::iota(expected.begin(), expected.end(), 0u);
  EXPECT_EQ(all, expected);
  EXPECT_EQ(read_back(dst, s), data);
}

TEST_P(PipelineTest, ExceptionsFromTheStepAndItsWorkReachTheCaller) {
  gc::Stream s(device());
  gc::CopyPipeline pipeline(device(), {512, 2});
  const auto data = random_bytes(512 * 8, 2);
  gc::Buffer src = host_buffer(data, gc::MemoryKind::pinned);
  gc::Buffer dst(data.size(), gc::DType::uint8, device());
  // Thrown by the step itself, while enqueueing chunk 3.
  EXPECT_THROW(pipeline.upload(dst, src, s,
                               [](const gc::Chunk& c) {
                                 if (c.index == 3) throw std::runtime_error("step failed at chunk 3");
                               }),
               std::runtime_error);
  s.synchronize();  // what was enqueued completes; nothing hangs
  // Thrown by work the step enqueued: surfaces at the caller's synchronize().
  pipeline.upload(dst, src, s, [](const gc::Chunk& c) {
    if (c.index == 5) gc::launch_host_func(c.stream, [] { throw std::runtime_error("kernel for chunk 5 failed"); });
  });
  try {
    s.synchronize();
    FAIL() << "the error of the step's work must reach the caller's stream";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "kernel for chunk 5 failed");
  }
  // The pipeline and the stream are usable afterwards.
  pipeline.upload(dst, src, s);
  EXPECT_EQ(read_back(dst, s), data);
}

TEST_P(PipelineTest, BadInputIsRejectedBeforeAnyWork) {
  gc::Stream s(device());
  gc::CopyPipeline pipeline(device(), {1024, 2});
  gc::TypedBuffer<float> host(100, gc::Device::host(), gc::MemoryKind::host);
  gc::TypedBuffer<float> dev(100, device());
  gc::TypedBuffer<float> short_dev(99, device());
  gc::TypedBuffer<std::int32_t> ints(100, device());
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const gc::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_TRUE(contains(message([&] { pipeline.upload(short_dev, host, s); }), "elements"));
  EXPECT_TRUE(contains(message([&] { pipeline.upload(ints, host, s); }), "dtype"));
  EXPECT_TRUE(contains(message([&] { pipeline.transform(host, host, s, {}); }), "step"));
  if (device().is_cuda()) {
    EXPECT_TRUE(contains(message([&] { pipeline.upload(host, dev, s); }), "src: must be host memory"));
    gc::Stream host_stream;
    EXPECT_TRUE(contains(message([&] { pipeline.upload(dev, host, host_stream); }), "stream"));
  }
  EXPECT_THROW(gc::CopyPipeline(device(), {1024, 0}), gc::InvalidArgument);
  EXPECT_TRUE(s.query());
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(PipelineTest);

// The overlap is real, shown by conditions rather than by how long anything takes: chunk 0's
// compute step does not finish before chunk 1's compute step has started, which on chunk 1's
// stream comes after chunk 1's copy. So chunk 1 was copied while chunk 0's compute ran; the
// recorded event times then show it too.
TEST(PipelineOverlap, CopiesOverlapComputeOnTheHostBackend) {
  gc::Stream s;
  gc::PipelineOptions options;
  options.chunk_bytes = 2 << 20;
  options.depth = 3;
  options.record_timeline = true;
  gc::CopyPipeline pipeline(gc::Device::host(), options);
  const std::size_t n = 8 * options.chunk_bytes;
  gc::Buffer src(n, gc::DType::uint8, gc::Device::host(), gc::MemoryKind::host);
  std::memset(src.data(), 7, n);
  gc::Buffer dst(n, gc::DType::uint8, gc::Device::host());
  std::atomic<bool> second_started{false}, first_saw_second{false};
  pipeline.upload(dst, src, s, [&](const gc::Chunk& c) {
    if (c.index == 0) {
      gc::launch_host_func(c.stream, [&] {  // the "kernel" of chunk 0 runs until chunk 1's starts
        const auto give_up = std::chrono::steady_clock::now() + 120s;
        while (!second_started.load() && std::chrono::steady_clock::now() < give_up) {
          std::this_thread::sleep_for(1ms);
        }
        first_saw_second = second_started.load();
      });
    } else if (c.index == 1) {
      gc::launch_host_func(c.stream, [&] { second_started = true; });
    }
  });
  s.synchronize();
  EXPECT_TRUE(first_saw_second.load()) << "chunk 1 was not copied and computed while chunk 0's compute ran";
  const auto t = pipeline.timeline();
  ASSERT_EQ(t.size(), 8u);
  for (const auto& a : t) {
    EXPECT_LE(a.copy_in_begin, a.copy_in_end);
    EXPECT_LE(a.copy_in_end, a.compute_end);
  }
  const auto chunk = [&](std::size_t i) {
    return *std::find_if(t.begin(), t.end(), [i](const gc::ChunkTimes& c) { return c.index == i; });
  };
  EXPECT_LE(chunk(1).copy_in_end, chunk(0).compute_end) << "the events disagree with the order the steps saw";
  for (std::size_t i = 0; i < n; i += 4096) ASSERT_EQ(dst.data_as<unsigned char>()[i], 7) << i;
}

// ---- Prefetcher -----------------------------------------------------------------------------

namespace {
struct Sample {
  std::vector<std::uint8_t> x;
  std::vector<std::uint8_t> y;
};

std::vector<Sample> make_samples(std::size_t count) {
  std::vector<Sample> out;
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back({random_bytes(i == 4 ? 0 : 1000 + 37 * i, static_cast<unsigned>(i)),
                   random_bytes(16, static_cast<unsigned>(100 + i))});
  }
  return out;
}

// A source over `samples`: alternately pageable and pinned host batches, owned by keep_alive.
gc::BatchSource source_over(const std::vector<Sample>& samples, std::atomic<int>& calls) {
  auto next = std::make_shared<std::size_t>(0);
  return [&samples, &calls, next]() -> std::optional<gc::HostBatch> {
    ++calls;
    if (*next == samples.size()) return std::nullopt;
    const Sample& s = samples[*next];
    const auto kind = (*next)++ % 2 == 0 ? gc::MemoryKind::host : gc::MemoryKind::pinned;
    auto x = std::make_shared<gc::Buffer>(host_buffer(s.x, kind));
    auto y = std::make_shared<gc::Buffer>(host_buffer(s.y, kind));
    gc::HostBatch batch{{x->view(), y->view()}, std::make_shared<std::pair<decltype(x), decltype(y)>>(x, y)};
    return batch;
  };
}
}  // namespace

class PrefetcherTest : public gc::testing::OnEveryDevice {};

TEST_P(PrefetcherTest, DeliversEveryBatchInOrderAndIntact) {
  const auto samples = make_samples(9);
  std::atomic<int> calls{0};
  gc::Stream compute(device());
  gc::Prefetcher prefetcher(device(), source_over(samples, calls), {3, gc::MemoryKind::device});
  for (std::size_t i = 0; i < samples.size(); ++i) {
    auto batch = prefetcher.next(compute);
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->index(), i);
    ASSERT_EQ(batch->arrays().size(), 2u);
    EXPECT_EQ(batch->arrays()[0].device(), device());
    EXPECT_EQ(read_back(batch->arrays()[0], compute), samples[i].x) << "batch " << i;
    EXPECT_EQ(read_back(batch->arrays()[1], compute), samples[i].y) << "batch " << i;
  }
  EXPECT_FALSE(prefetcher.next(compute).has_value());
  EXPECT_FALSE(prefetcher.next(compute).has_value());
  EXPECT_EQ(calls.load(), static_cast<int>(samples.size()) + 1);
}

TEST_P(PrefetcherTest, KeepsExactlyDepthBatchesAhead) {
  const auto samples = make_samples(20);
  std::atomic<int> calls{0};
  gc::Stream compute(device());
  gc::Prefetcher prefetcher(device(), source_over(samples, calls), {2, gc::MemoryKind::device});
  auto first = prefetcher.next(compute);
  ASSERT_TRUE(first.has_value());
  // The producer refills to depth and then waits: 1 consumed + 2 ready.
  for (int i = 0; i < 2000 && calls.load() < 3; ++i) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), 3);
  auto second = prefetcher.next(compute);
  for (int i = 0; i < 2000 && calls.load() < 4; ++i) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), 4);
  compute.synchronize();
}

TEST_P(PrefetcherTest, SourceExceptionReachesTheConsumerAfterEarlierBatches) {
  int produced = 0;
  gc::Prefetcher prefetcher(device(), [&produced]() -> std::optional<gc::HostBatch> {
    if (produced == 3) throw std::runtime_error("shard 3 is unreadable");
    auto b = std::make_shared<gc::Buffer>(
        host_buffer(random_bytes(64, static_cast<unsigned>(produced)), gc::MemoryKind::host));
    ++produced;
    return gc::HostBatch{{b->view()}, b};
  });
  gc::Stream compute(device());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(prefetcher.next(compute).has_value());
  try {
    (void)prefetcher.next(compute);
    FAIL() << "the source's exception must reach the consumer";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "shard 3 is unreadable");
  }
  EXPECT_FALSE(prefetcher.next(compute).has_value());
  compute.synchronize();
}

// last_wait(): next() blocking while the stream still computes is not a stall; blocking while
// the stream has nothing left to do is, for as long as it lasts.
TEST_P(PrefetcherTest, LastWaitCountsOnlyTheTimeTheStreamSatIdle) {
  std::atomic<bool> open{false}, done{false};
  std::atomic<int> produced{0};
  gc::Prefetcher prefetcher(device(), [&]() -> std::optional<gc::HostBatch> {
    if (produced.load() >= 1) {  // the first batch at once, the others when the test opens the gate
      while (!open.load() && !done.load()) std::this_thread::sleep_for(1ms);
      open = false;
    }
    auto b = std::make_shared<gc::Buffer>(host_buffer(random_bytes(64, 1), gc::MemoryKind::host));
    ++produced;
    return gc::HostBatch{{b->view()}, b};
  });
  gc::Stream compute(device());
  ASSERT_TRUE(prefetcher.next(compute).has_value());
  // The stream busy until the batch has arrived: next() blocks, the stream never idles.
  std::atomic<bool> busy{true};
  gc::add_callback(compute, [&busy](std::exception_ptr) {
    while (busy.load()) std::this_thread::sleep_for(1ms);
  });
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    open = true;
  });
  ASSERT_TRUE(prefetcher.next(compute).has_value());
  opener.join();
  busy = false;
  EXPECT_GE(prefetcher.last_wait().blocked_seconds, 0.04);
  EXPECT_EQ(prefetcher.last_wait().stream_idle_seconds, 0.0);
  compute.synchronize();
  // The stream idle: all of the wait is a stall.
  std::thread opener2([&] {
    std::this_thread::sleep_for(50ms);
    open = true;
  });
  ASSERT_TRUE(prefetcher.next(compute).has_value());
  opener2.join();
  const gc::PrefetchWait w = prefetcher.last_wait();
  EXPECT_GE(w.stream_idle_seconds, 0.04);
  EXPECT_LE(w.stream_idle_seconds, w.blocked_seconds);
  compute.synchronize();
  done = true;  // the producer, a batch ahead, stops waiting for the gate
}

TEST_P(PrefetcherTest, StopsEarlyWithoutLeaksOrDeadlocks) {
  std::atomic<int> released{0};
  auto endless = [&released]() -> std::optional<gc::HostBatch> {
    auto b = std::make_shared<gc::Buffer>(host_buffer(random_bytes(1 << 16, 9), gc::MemoryKind::host));
    gc::HostBatch batch{{b->view()}, std::shared_ptr<void>(new int(0), [b, &released](int* p) {
                          ++released;
                          delete p;
                        })};
    return batch;
  };
  gc::Stream compute(device());
  std::optional<gc::Batch> held;
  {
    gc::Prefetcher prefetcher(device(), endless, {4, gc::MemoryKind::device});
    held = prefetcher.next(compute);
    ASSERT_TRUE(held.has_value());
    prefetcher.stop();
    EXPECT_FALSE(prefetcher.next(compute).has_value());
    prefetcher.stop();  // idempotent
  }
  // A batch outlives its prefetcher and stays readable.
  EXPECT_EQ(read_back(held->arrays()[0], compute).size(), std::size_t{1} << 16);
  held.reset();
  compute.synchronize();
  EXPECT_GT(released.load(), 0);
  // Destroying a prefetcher that is blocked on a full queue, without stop(), is fine too.
  { gc::Prefetcher idle(device(), endless, {2, gc::MemoryKind::device}); }
}

TEST_P(PrefetcherTest, BadInputIsATypedError) {
  auto nothing = []() -> std::optional<gc::HostBatch> { return std::nullopt; };
  EXPECT_THROW(gc::Prefetcher(device(), nothing, {0, gc::MemoryKind::device}), gc::InvalidArgument);
  EXPECT_THROW(gc::Prefetcher(device(), nothing, {2, gc::MemoryKind::pinned}), gc::InvalidArgument);
  EXPECT_THROW(gc::Prefetcher(device(), gc::BatchSource{}), gc::InvalidArgument);
  if (device().is_cuda()) {
    gc::Prefetcher p(device(), nothing);
    gc::Stream host_stream;
    EXPECT_THROW((void)p.next(host_stream), gc::InvalidArgument);
    // A source that hands out GPU memory instead of host memory.
    auto gpu = std::make_shared<gc::Buffer>(16, gc::DType::uint8, device());
    gc::Prefetcher wrong(device(), [gpu]() -> std::optional<gc::HostBatch> {
      return gc::HostBatch{{gpu->view()}, gpu};
    });
    gc::Stream compute(device());
    EXPECT_THROW((void)wrong.next(compute), gc::InvalidArgument);
  }
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(PrefetcherTest);

// A Prefetcher's producer keeps a core busy: from the Prefetcher's construction to its stop(),
// OpenBLAS gets one thread fewer (at least one), where the count can change between products (its
// pthreads server without CPU affinity, the count the library's own); afterwards the budget again.
// Counted in program order, not while the producer thread runs: every run of a program gives each
// product the same count, so the same bits (resumed runs match uninterrupted ones). Anywhere else
// nothing moves.
TEST(PrefetcherThreads, OpenBlasGetsOneThreadFewerFromConstructionToStop) {
  const gc::HostThreads before = gc::host_threads();
  using Config = const char* (*)();
  using Parallel = int (*)();
  const auto config = reinterpret_cast<Config>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const auto parallel = reinterpret_cast<Parallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  const bool own_count = std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("GOTO_NUM_THREADS") == nullptr &&
                         std::getenv("OMP_NUM_THREADS") == nullptr;
  const bool adjustable = before.blas > 1 && own_count && config != nullptr && parallel != nullptr && parallel() == 1 &&
                          std::strstr(config(), "NO_AFFINITY") != nullptr;
  std::mutex m;
  std::condition_variable cv;
  bool started = false, go = false;
  {
    gc::Prefetcher prefetcher(gc::Device::host(),
                              [&]() -> std::optional<gc::HostBatch> {
                                std::unique_lock<std::mutex> lock(m);
                                started = true;
                                cv.notify_all();
                                cv.wait(lock, [&] { return go; });
                                return std::nullopt;
                              },
                              {1, gc::MemoryKind::device});
    const int fewer = adjustable ? before.blas - 1 : before.blas;
    EXPECT_EQ(gc::host_threads().blas, fewer)  // whether or not the producer has started
        << "OpenBLAS config " << (config ? config() : "none");
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return started; });
    }
    EXPECT_EQ(gc::host_threads().blas, fewer);
    {
      std::lock_guard<std::mutex> lock(m);
      go = true;
    }
    cv.notify_all();
    gc::Stream s(gc::Device::host());
    EXPECT_FALSE(prefetcher.next(s).has_value());  // the producer has ended
    EXPECT_EQ(gc::host_threads().blas, fewer);
    prefetcher.stop();
    EXPECT_EQ(gc::host_threads().blas, before.blas);
  }
  EXPECT_EQ(gc::host_threads().blas, before.blas);  // (its destructor's second stop(): no change)
}
