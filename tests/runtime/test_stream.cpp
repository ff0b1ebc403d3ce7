// Streams and events on every device: ordering, cross-stream dependencies, out-of-order
// completion, errors from enqueued work, timing, and many streams at once.
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include "device_cases.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace gc = gpucloud;
using namespace std::chrono_literals;

namespace {
// Blocks a stream until open() is called: makes "still running" states deterministic.
class Gate {
 public:
  void enqueue_on(gc::StreamView s) {
    auto f = future_;
    gc::launch_host_func(s, [f] { f.wait(); });
  }
  // Enqueues the blocking task and returns once it is running on @p s's worker: that thread is
  // then waiting on the gate, neither starting nor between tasks (what a fork() must not catch
  // under GCC 12's AddressSanitizer, whose allocator lock a starting thread may hold at the fork).
  void enqueue_running_on(gc::StreamView s) {
    auto f = future_;
    auto started = std::make_shared<std::promise<void>>();
    auto running = started->get_future();
    gc::launch_host_func(s, [f, started] {
      started->set_value();
      f.wait();
    });
    running.wait();
  }
  void open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
};
}  // namespace

class StreamTest : public gc::testing::OnEveryDevice {};

TEST_P(StreamTest, RunsWorkInOrder) {
  gc::Stream s(device());
  EXPECT_EQ(s.device(), device());
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) gc::launch_host_func(s, [&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(seen[i], i);
  EXPECT_TRUE(s.query());
}

TEST_P(StreamTest, QueryReportsPendingWork) {
  gc::Stream s(device());
  Gate gate;
  gate.enqueue_on(s);
  EXPECT_FALSE(s.query());
  gate.open();
  s.synchronize();
  EXPECT_TRUE(s.query());
}

TEST_P(StreamTest, ErrorSurfacesAtNextSynchronizeAndLaterWorkIsDiscarded) {
  gc::Stream s(device());
  std::atomic<int> ran{0};
  gc::launch_host_func(s, [&] { ++ran; });
  gc::launch_host_func(s, [] { throw std::runtime_error("batch 7 is corrupt"); });
  gc::launch_host_func(s, [&] { ran += 100; });  // discarded: depends on failed work
  gc::Event e(device());
  e.record(s);  // events still complete, so nobody waiting on them hangs
  e.synchronize();
  try {
    s.synchronize();
    FAIL() << "the enqueued exception must surface";
  } catch (const std::runtime_error& err) {
    EXPECT_STREQ(err.what(), "batch 7 is corrupt");
  }
  EXPECT_EQ(ran.load(), 1);
  std::atomic<bool> cleaned{false};
  gc::launch_cleanup(s, [&] { cleaned = true; });  // cleanups run even after a failure
  e.record(s);
  e.synchronize();
  EXPECT_TRUE(cleaned.load());
  // Reported once; the stream is usable again.
  gc::launch_host_func(s, [&] { ran += 10; });
  s.synchronize();
  EXPECT_EQ(ran.load(), 11);
}

// Two threads share a stream: one thread's failure makes the stream skip the other's work, so the
// other thread's synchronize() must raise too, not return success over dropped work.
TEST(HostStream, EveryThreadWhoseWorkWasDroppedHearsWhy) {
  gc::Stream s;
  Gate gate;
  gate.enqueue_on(s);
  std::atomic<int> ran{0};
  gc::launch_host_func(s, [] { throw std::runtime_error("thread A's step failed"); });
  std::thread b([&] {
    gc::launch_host_func(s, [&] { ++ran; });  // thread B's fill: skipped behind A's failure
  });
  b.join();
  gate.open();
  EXPECT_THROW(s.synchronize(), std::runtime_error);  // thread A
  std::thread b_sync([&] {
    try {
      s.synchronize();
      ADD_FAILURE() << "thread B's work was dropped and its synchronize() returned success";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "thread A's step failed");
    }
    s.synchronize();  // told once: B's stream is clean again
  });
  b_sync.join();
  EXPECT_EQ(ran.load(), 0);
  s.synchronize();  // and A's
}

// A framework's stream adopted without owning it: gpucloud work runs on it, and dropping the
// adopter leaves the native stream alive.
TEST_P(StreamTest, FromNativeAdoptsACallersStream) {
  if (device().is_host()) {
    EXPECT_THROW(gc::Stream::from_native(nullptr, device()), gc::InvalidArgument);  // no native handle
    return;
  }
  gc::Stream owner(device());
  std::atomic<int> ran{0};
  {
    // The legacy default stream (PyTorch's current stream outside torch.cuda.stream(...)): host
    // functions, copies and events on it, from another device being current too.
    gc::Stream legacy = gc::Stream::from_native(nullptr, device());
    EXPECT_EQ(legacy.native_handle(), nullptr);
    gc::Buffer host(64, gc::DType::float32, gc::Device::host(), gc::MemoryKind::pinned);
    gc::Buffer dev(64, gc::DType::float32, device(), gc::MemoryKind::device);
    for (std::size_t i = 0; i < 64; ++i) host.data_as<float>()[i] = static_cast<float>(i);
    gc::copy(dev, host, legacy);
    gc::Event copied(device());
    copied.record(legacy);
    owner.wait(copied);
    gc::launch_host_func(legacy, [&] { ++ran; });
    legacy.synchronize();
    EXPECT_EQ(ran.load(), 1);
    ran = 0;
  }
  {
    gc::Stream adopted = gc::Stream::from_native(owner.native_handle(), device());
    EXPECT_EQ(adopted.native_handle(), owner.native_handle());
    gc::launch_host_func(adopted, [&] { ++ran; });
  }  // drained, not destroyed
  gc::launch_host_func(owner, [&] { ++ran; });
  owner.synchronize();
  EXPECT_EQ(ran.load(), 2);
}

// cudaStreamPerThread is a different stream on every host thread: refused, naming the argument,
// before the stream is looked at.
TEST(StreamFromNative, ThePerThreadDefaultStreamIsRefused) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << gc::cuda_unavailable_reason();
  try {
    (void)gc::Stream::from_native(reinterpret_cast<void*>(std::uintptr_t{2}), gc::Device::cuda(0));
    FAIL() << "cudaStreamPerThread was adopted";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("native: cudaStreamPerThread"), std::string::npos) << e.what();
  }
}

TEST(HostStream, EventSynchronizeFromWorkOnItsOwnStreamIsAnErrorNotADeadlock) {
  gc::Stream s;
  gc::Event e;
  Gate gate;
  gate.enqueue_on(s);
  gc::launch_host_func(s, [&e] { e.synchronize(); });
  e.record(s);  // completes only after the work above, which would wait for it forever
  gate.open();
  EXPECT_THROW(s.synchronize(), gc::InvalidArgument);
}

TEST_P(StreamTest, EventOrdersWorkAcrossStreams) {
  gc::Stream producer(device()), consumer(device());
  gc::Event ready(device());
  std::atomic<bool> produced{false};
  bool seen_by_consumer = false;
  gc::launch_host_func(producer, [&] {
    std::this_thread::sleep_for(30ms);
    produced = true;
  });
  ready.record(producer);
  consumer.wait(ready);
  gc::launch_host_func(consumer, [&] { seen_by_consumer = produced.load(); });
  consumer.synchronize();
  EXPECT_TRUE(seen_by_consumer);
  producer.synchronize();
}

TEST_P(StreamTest, StreamsCompleteOutOfOrder) {
  gc::Stream slow(device()), fast(device());
  Gate gate;
  gate.enqueue_on(slow);
  gc::Event slow_done(device()), fast_done(device());
  slow_done.record(slow);
  // Real work on the fast stream (a copy, not a host function: CUDA may serialise host
  // functions of different streams on one thread, and the slow one is blocked).
  gc::TypedBuffer<int> in(1000, gc::Device::host(), gc::MemoryKind::pinned);
  gc::TypedBuffer<int> on_device(1000, device(), gc::MemoryKind::device);
  gc::TypedBuffer<int> out(1000, gc::Device::host(), gc::MemoryKind::pinned);
  for (int i = 0; i < 1000; ++i) in[i] = 3 * i + 1;
  gc::copy(on_device, in, fast);
  gc::copy(out, on_device, fast);
  fast_done.record(fast);
  fast.synchronize();
  EXPECT_TRUE(fast_done.query());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(out[i], 3 * i + 1);
  EXPECT_FALSE(slow_done.query());
  EXPECT_FALSE(slow.query());
  gate.open();
  slow_done.synchronize();
  EXPECT_TRUE(slow_done.query());
  slow.synchronize();
}

TEST_P(StreamTest, EventWaitCapturesTheRecordAtWaitTime) {
  gc::Stream a(device()), b(device());
  gc::Event e(device());
  EXPECT_TRUE(e.query());  // never recorded: complete
  e.synchronize();
  b.wait(e);  // waits for nothing
  b.synchronize();
  Gate gate;
  gate.enqueue_on(a);
  e.record(a);
  EXPECT_FALSE(e.query());
  b.wait(e);
  std::atomic<bool> b_ran{false};
  gc::launch_host_func(b, [&] { b_ran = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_ran.load());  // b is held back by a's gate
  gate.open();
  b.synchronize();
  EXPECT_TRUE(b_ran.load());
  a.synchronize();
}

TEST_P(StreamTest, EventsTimeWork) {
  gc::Stream s(device());
  gc::TimedEvent start(device()), end(device());
  start.record(s);
  gc::launch_host_func(s, [] { std::this_thread::sleep_for(25ms); });
  end.record(s);
  end.synchronize();
  const float ms = gc::elapsed_ms(start, end);
  EXPECT_GE(ms, 20.0f);  // the event brackets the work it was recorded around
  EXPECT_LT(ms, 60000.0f);
}

TEST_P(StreamTest, ElapsedTimeRejectsBadEvents) {
  gc::Stream s(device());
  gc::TimedEvent recorded(device()), never(device());
  gc::Event untimed(device());
  EXPECT_TRUE(recorded.timed());
  EXPECT_FALSE(untimed.timed());  // events are untimed unless asked (the cheaper kind)
  recorded.record(s);
  untimed.record(s);
  s.synchronize();
  EXPECT_THROW((void)gc::elapsed_ms(recorded, never), gc::InvalidArgument);
  gc::TimedEvent pending(device());
  Gate gate;
  gate.enqueue_on(s);
  pending.record(s);
  EXPECT_THROW((void)gc::elapsed_ms(recorded, pending), gc::Error);
  gate.open();
  s.synchronize();
  EXPECT_GE(gc::elapsed_ms(recorded, pending), 0.0f);
}

// A plain Event is untimed; elapsed_ms() takes TimedEvents only (checked at compile time).
template <class E, class = void>
struct MeasuredBetween : std::false_type {};
template <class E>
struct MeasuredBetween<E, std::void_t<decltype(gc::elapsed_ms(std::declval<const E&>(), std::declval<const E&>()))>>
    : std::true_type {};
static_assert(MeasuredBetween<gc::TimedEvent>::value && !MeasuredBetween<gc::Event>::value,
              "elapsed_ms takes TimedEvents");
static_assert(!std::is_constructible_v<gc::Event, gc::Device, bool>, "no timing flag: TimedEvent times");

TEST_P(StreamTest, PlainEventsAreUntimedAndTimedEventsTime) {
  gc::Stream s(device());
  gc::Event untimed(device());
  gc::TimedEvent start(device()), end(device());
  EXPECT_FALSE(untimed.timed());
  EXPECT_TRUE(start.timed());
  start.record(s);
  untimed.record(s);
  end.record(s);
  s.synchronize();
  EXPECT_GE(gc::elapsed_ms(start, end), 0.0f);
}

TEST_P(StreamTest, ManyStreamsChainedByEvents) {
  constexpr int kStreams = 32;
  std::vector<gc::Stream> streams;
  std::vector<gc::Event> events;
  for (int i = 0; i < kStreams; ++i) {
    streams.emplace_back(device());
    events.emplace_back(device());
  }
  std::vector<int> order;
  std::mutex m;
  Gate gate;
  gate.enqueue_on(streams[0]);
  for (int i = 0; i < kStreams; ++i) {
    if (i > 0) streams[i].wait(events[i - 1]);
    gc::launch_host_func(streams[i], [&, i] {
      std::lock_guard<std::mutex> lock(m);
      order.push_back(i);
    });
    events[i].record(streams[i]);
  }
  gate.open();
  events.back().synchronize();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(kStreams));
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(order[i], i);
  for (auto& s : streams) s.synchronize();
}

TEST_P(StreamTest, MovedStreamKeepsItsWork) {
  gc::Stream a(device());
  std::atomic<int> ran{0};
  gc::launch_host_func(a, [&] { ++ran; });
  gc::Stream b(std::move(a));
  gc::launch_host_func(b, [&] { ++ran; });
  b.synchronize();
  EXPECT_EQ(ran.load(), 2);
  gc::Stream c(device());
  c = std::move(b);
  c.synchronize();
  EXPECT_THROW((void)a.device(), gc::InvalidArgument);  // NOLINT(bugprone-use-after-move)
}

TEST_P(StreamTest, DestructorFinishesEnqueuedWork) {
  std::atomic<int> ran{0};
  {
    gc::Stream s(device());
    for (int i = 0; i < 50; ++i) gc::launch_host_func(s, [&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST_P(StreamTest, RejectsEmptyHostFunction) {
  gc::Stream s(device());
  EXPECT_THROW(gc::launch_host_func(s, nullptr), gc::InvalidArgument);
  EXPECT_THROW(gc::add_callback(s, nullptr), gc::InvalidArgument);
}

// add_callback: runs after earlier work, also after a failure, and gets (takes over) its error,
// as cudaStreamAddCallback hands a status; its own exception is the stream's next error.
TEST_P(StreamTest, CallbacksGetTheErrorOfEarlierWorkAndTakeItOver) {
  gc::Stream s(device());
  std::vector<std::string> seen;  // written by the stream's host functions, in order
  gc::launch_host_func(s, [&] { seen.push_back("work"); });
  gc::add_callback(s, [&](std::exception_ptr e) { seen.push_back(e ? "error" : "ok"); });
  s.synchronize();
  gc::launch_host_func(s, [] { throw gc::CommunicationError("all_reduce", "peer gone", __FILE__, __LINE__); });
  gc::launch_host_func(s, [&] { seen.push_back("skipped"); });
  gc::add_callback(s, [&](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
      seen.push_back("no error");
    } catch (const gc::CommunicationError& err) {
      seen.push_back(std::string("error: ") + err.what());
    }
  });
  gc::launch_host_func(s, [&] { seen.push_back("after"); });  // runs: the callback took the error
  s.synchronize();                                            // and nothing is raised here
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], "work");
  EXPECT_EQ(seen[1], "ok");
  EXPECT_NE(seen[2].find("error: "), std::string::npos);
  EXPECT_NE(seen[2].find("peer gone"), std::string::npos) << seen[2];
  EXPECT_EQ(seen[3], "after");
  gc::add_callback(s, [](std::exception_ptr) { throw std::runtime_error("callback failed"); });
  EXPECT_THROW(s.synchronize(), std::runtime_error);
}

GPUCLOUD_INSTANTIATE_ON_EVERY_DEVICE(StreamTest);

TEST(HostStream, SynchronizingFromOwnWorkIsAnErrorNotADeadlock) {
  gc::Stream s;
  gc::StreamView v = s;
  gc::launch_host_func(s, [v] { v.synchronize(); });
  EXPECT_THROW(s.synchronize(), gc::InvalidArgument);
}

TEST(HostStream, EventAndStreamOnDifferentDevicesAreRejected) {
  if (gc::cuda_device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << gc::cuda_unavailable_reason();
  gc::Stream host_stream;
  gc::Event cuda_event(gc::Device::cuda(0));
  EXPECT_THROW(cuda_event.record(host_stream), gc::InvalidArgument);
  EXPECT_THROW(host_stream.wait(cuda_event), gc::InvalidArgument);
}

// fork() copies a stream without its worker thread: in the child an idle stream starts a new
// worker, work in flight at the fork (never run there) is an error at synchronize() and at an
// event recorded behind it, not a hang; the parent's stream is untouched. The child reports by
// exit code (and is killed by an alarm if it hangs). ThreadSanitizer does not support threads
// started after a fork of a threaded process, so it is left to the other configurations.
TEST(HostStream, AForkChildGetsItsOwnWorkerAndAnErrorForWorkInFlight) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support new threads after fork()";
#else
  gc::Stream idle, busy;
  std::atomic<int> counter{0};
  gc::launch_host_func(idle, [&] { ++counter; });
  idle.synchronize();
  Gate gate;
  gate.enqueue_running_on(busy);  // running (blocked) at the fork
  gc::launch_host_func(busy, [&] { counter += 100; });
  gc::Event after;
  after.record(busy);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    int code = 0;
    try {
      gc::launch_host_func(idle, [&] { ++counter; });
      idle.synchronize();
      if (counter != 2) code = 1;
      try {
        busy.synchronize();
        code = 2;
      } catch (const gc::Error& e) {
        if (std::string(e.what()).find("fork") == std::string::npos) code = 3;
      }
      try {
        after.synchronize();
        code = 4;
      } catch (const gc::Error& e) {
        if (std::string(e.what()).find("fork") == std::string::npos) code = 5;
      }
      gc::launch_host_func(busy, [&] { counter += 10; });
      busy.synchronize();
      if (counter != 12) code = 6;
    } catch (...) {
      code = 7;
    }
    _exit(code);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "the child hung or crashed (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  gate.open();
  busy.synchronize();
  after.synchronize();
  EXPECT_EQ(counter, 101);
#endif
}
