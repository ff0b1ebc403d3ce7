// The host stream's in-place paths (src/runtime/host/host_stream): work a caller runs on an idle
// stream, or takes from the worker while it waits in synchronize(), is ordered with the worker's
// like any enqueued work. Internal: compiled into the test.
#include <gtest/gtest.h>

#include "runtime/host/deadline.hpp"
#include "runtime/host/host_stream.hpp"

#include <atomic>
#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using gpucloud::detail::HostStream;
using namespace std::chrono_literals;

TEST(HostStreamInPlace, RunsOnTheCallingThreadWhenIdleAndCountsAsOutstanding) {
  HostStream s;
  std::thread::id ran_on;
  bool pending_inside = false;
  EXPECT_TRUE(s.run_now_if_idle([&] {
    ran_on = std::this_thread::get_id();
    pending_inside = !s.query();
  }));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(pending_inside);
  EXPECT_TRUE(s.query());
  s.synchronize();
}

TEST(HostStreamInPlace, IsRefusedBehindQueuedWorkAndFromTheStreamsOwnWorker) {
  HostStream s;
  std::atomic<bool> release{false};
  s.launch_host_func(
      [&] {
        while (!release.load()) std::this_thread::yield();
      },
      false);
  bool ran = false;
  EXPECT_FALSE(s.run_now_if_idle([&] { ran = true; }));
  EXPECT_FALSE(ran);
  release.store(true);
  s.synchronize();
  bool refused_on_worker = false;
  s.launch_host_func([&] { refused_on_worker = !s.run_now_if_idle([] {}); }, false);
  s.synchronize();
  EXPECT_TRUE(refused_on_worker);
}

TEST(HostStreamInPlace, WorkEnqueuedMeanwhileByAnotherThreadWaitsForIt) {
  HostStream s;
  std::atomic<bool> inside{false}, enqueued{false}, overlapped{false}, ran{false};
  std::thread other([&] {
    while (!inside.load()) std::this_thread::yield();
    s.launch_host_func(
        [&] {
          overlapped.store(inside.load());
          ran.store(true);
        },
        false);
    enqueued.store(true);
  });
  ASSERT_TRUE(s.run_now_if_idle([&] {
    inside.store(true);
    while (!enqueued.load()) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);  // time enough for a worker that ignored us to run it
    inside.store(false);
  }));
  other.join();
  s.synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_FALSE(overlapped.load());
}

TEST(HostStreamInPlace, AnotherThreadsSynchronizeWaitsForIt) {
  HostStream s;
  std::atomic<bool> inside{false}, finished{false}, saw_finished{false};
  std::thread other([&] {
    while (!inside.load()) std::this_thread::yield();
    s.synchronize();
    saw_finished.store(finished.load());
  });
  ASSERT_TRUE(s.run_now_if_idle([&] {
    inside.store(true);
    std::this_thread::sleep_for(20ms);
    finished.store(true);
  }));
  other.join();
  EXPECT_TRUE(saw_finished.load());
}

TEST(HostStreamInPlace, AThrowIsTheStreamsErrorAndLaterWorkIsSkippedUntilReported) {
  HostStream s;
  ASSERT_TRUE(s.run_now_if_idle([] { throw std::runtime_error("in place"); }));
  EXPECT_FALSE(s.run_now_if_idle([] {}));  // an error is pending: work goes through the queue
  bool ran = false;
  s.launch_host_func([&] { ran = true; }, false);
  EXPECT_THROW(s.synchronize(), std::runtime_error);
  EXPECT_FALSE(ran);
  EXPECT_TRUE(s.run_now_if_idle([&] { ran = true; }));
  EXPECT_TRUE(ran);
}

// Work with an on_caller form (a polled collective): a thread that reaches synchronize() before
// the worker has started it runs that form itself, on its own thread, exactly once. Whether the
// waiter or the woken worker gets there first is the scheduler's race; the worker, asleep after
// its spin budget, loses nearly every time, so in 50 tries the waiter wins at least once.
TEST(HostStreamHelp, AWaitingThreadRunsWorkTheWorkerHasNotStarted) {
  HostStream s;
  int on_caller = 0;
  for (int trial = 0; trial < 50; ++trial) {
    std::this_thread::sleep_for(2ms);  // the worker past its spin, asleep
    std::atomic<int> worker_runs{0}, caller_runs{0};
    std::thread::id caller_thread;
    s.launch_host_func_or_help([&] { worker_runs.fetch_add(1); },
                               [&] {
                                 caller_thread = std::this_thread::get_id();
                                 caller_runs.fetch_add(1);
                                 return true;
                               });
    s.synchronize();
    ASSERT_EQ(worker_runs.load() + caller_runs.load(), 1) << "trial " << trial;
    if (caller_runs.load() == 1) {
      EXPECT_EQ(caller_thread, std::this_thread::get_id());
      ++on_caller;
    }
  }
  EXPECT_GT(on_caller, 0);
}

// An on_caller form that cannot run now (returns false) leaves the work to the worker, untouched.
TEST(HostStreamHelp, WorkTheCallerCannotTakeRunsOnTheWorker) {
  HostStream s;
  for (int trial = 0; trial < 20; ++trial) {
    std::this_thread::sleep_for(1ms);
    std::atomic<int> worker_runs{0};
    std::thread::id ran_on;
    s.launch_host_func_or_help(
        [&] {
          ran_on = std::this_thread::get_id();
          worker_runs.fetch_add(1);
        },
        [] { return false; });
    s.synchronize();
    EXPECT_EQ(worker_runs.load(), 1);
    EXPECT_NE(ran_on, std::this_thread::get_id());
  }
}

// Only the queue's next work is taken: behind running work the waiter waits, and the worker runs it.
TEST(HostStreamHelp, WorkBehindRunningWorkIsTheWorkers) {
  HostStream s;
  std::atomic<bool> release{false}, started{false};
  s.launch_host_func(
      [&] {
        started.store(true);
        while (!release.load()) std::this_thread::yield();
      },
      false);
  while (!started.load()) std::this_thread::yield();
  std::atomic<int> caller_runs{0}, worker_runs{0};
  s.launch_host_func_or_help([&] { worker_runs.fetch_add(1); },
                             [&] {
                               caller_runs.fetch_add(1);
                               return true;
                             });
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    release.store(true);
  });
  s.synchronize();
  releaser.join();
  EXPECT_EQ(worker_runs.load(), 1);
  EXPECT_EQ(caller_runs.load(), 0);
}

// Work on a worker sees whether a thread waits for its stream (a polling collective then keeps
// the core instead of yielding it); off a worker nobody is waited for.
TEST(HostStreamHelp, WorkSeesWhetherAThreadWaitsForItsStream) {
  HostStream s;
  EXPECT_FALSE(HostStream::waited_for());
  std::atomic<int> phase{0};
  std::atomic<bool> before{true}, during{false};
  s.launch_host_func(
      [&] {
        before.store(HostStream::waited_for());
        phase.store(1);
        const auto until = std::chrono::steady_clock::now() + 10s;
        while (!HostStream::waited_for() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        during.store(HostStream::waited_for());
      },
      false);
  while (phase.load() == 0) std::this_thread::yield();
  s.synchronize();  // the work ends once it sees this wait
  EXPECT_FALSE(before.load());
  EXPECT_TRUE(during.load());
}

// The worker runs all work as an ordinary thread (SCHED_OTHER, which threads started by the work
// inherit), and is woken as one, except for work a waiting caller has been taking (on_caller, the
// last such task run by a caller): then it is woken as SCHED_BATCH, which preempts no running
// thread, such as the caller about to take it. A worker of an application that runs under another
// policy keeps it.
int policy_of(pid_t tid) { return sched_getscheduler(tid); }
void run_as(int policy, const std::function<void()>& body) {  // on a thread of its own under @p policy
  std::thread([&] {
    const sched_param none{};
    ASSERT_EQ(pthread_setschedparam(pthread_self(), policy, &none), 0);
    body();
  }).join();
}
TEST(HostStreamWorker, IsWokenAsABatchThreadOnlyForWorkItsCallersTake) {
  run_as(SCHED_OTHER, [] {  // (whatever policy the test runs under)
    HostStream s;           // its worker starts from this thread
    pid_t worker = 0;
    int policy = -1, started_thread = -1;
    s.launch_host_func(
        [&] {
          worker = gettid();
          policy = policy_of(0);
          std::thread([&] { started_thread = policy_of(0); }).join();
        },
        false);
    s.synchronize();
    EXPECT_EQ(policy, SCHED_OTHER);
    EXPECT_EQ(started_thread, SCHED_OTHER);
    // Work the caller takes, pushed while the worker sleeps (past its 200 µs spin for more work):
    // after one such task the next wakes it as a batch thread, which it stays while it only wakes
    // to find the work taken. On a loaded machine the worker may take one first: tries.
    std::atomic<bool> on_caller{false};
    const auto help = [&] {  // the worker's policy once the work is enqueued
      on_caller.store(false);
      s.launch_host_func_or_help([] {},
                                 [&] {
                                   on_caller.store(true);
                                   return true;
                                 });
      const int woken_as = policy_of(worker);
      s.synchronize();
      return woken_as;
    };
    bool batch = false;
    for (int trial = 0; trial < 50 && !batch; ++trial) {
      std::this_thread::sleep_for(5ms);
      batch = help() == SCHED_BATCH && on_caller.load();
    }
    EXPECT_TRUE(batch);
    // Other work wakes it as an ordinary thread, and it runs all work as one.
    std::this_thread::sleep_for(5ms);
    s.launch_host_func([&] { policy = policy_of(0); }, false);
    s.synchronize();
    EXPECT_EQ(policy, SCHED_OTHER);
    // Once it ran such work itself (the caller could not take it), the next is woken as ordinary.
    s.launch_host_func_or_help([&] { policy = policy_of(0); }, [] { return false; });
    s.synchronize();
    EXPECT_EQ(policy, SCHED_OTHER);
    std::this_thread::sleep_for(5ms);
    EXPECT_EQ(help(), SCHED_OTHER);
  });
}

// The worker's context switches so far (it switches out each time it sleeps after a wake-up).
long switches_of(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  long total = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.find("ctxt_switches:") != std::string::npos) total += std::stol(line.substr(line.find(':') + 1));
  }
  return total;
}
pid_t worker_of(HostStream& s) {
  pid_t worker = 0;
  s.launch_host_func([&] { worker = gettid(); }, false);
  s.synchronize();
  return worker;
}
// Enqueues work a waiting caller may take, and takes it at once; whether the caller ran it.
bool help_at_once(HostStream& s) {
  bool on_caller = false;
  s.launch_host_func_or_help([] {},
                             [&] {
                               on_caller = true;
                               return true;
                             });
  s.synchronize();
  return on_caller;
}
// After two tasks taken at once, enqueues one that no caller takes and waits (without
// synchronize(), up to 10 s: kHelpWindow on a loaded machine) for it to run; the thread that ran
// it, or none.
std::optional<std::thread::id> runs_untaken(HostStream& s) {
  help_at_once(s);
  help_at_once(s);
  std::this_thread::sleep_for(5ms);  // the worker past its spin, asleep
  std::atomic<bool> ran{false};
  std::thread::id ran_on;
  s.launch_host_func_or_help(
      [&] {
        ran_on = std::this_thread::get_id();
        ran.store(true);
      },
      [] { return true; });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!ran.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
  s.synchronize();
  if (!ran.load()) return std::nullopt;
  return ran_on;
}
// Waits for the fork() child @p pid and expects it to have exited with status 0.
[[maybe_unused]] void expect_clean_exit(pid_t pid) {  // (every user is left out under TSan)
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "the child hung or crashed (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Work that waiting callers took at once the last two times does not wake the sleeping worker
// at all (a timer would, were it not taken within kHelpWindow): on a busy node that wake-up took
// the caller's core. Each wake-up that finds the work taken is a switch of the worker, so with a
// wake per enqueue (as other work has) 100 such tasks switch it about 100 times; a loaded
// machine that delays a caller past the window costs a few.
TEST(HostStreamWorker, SleepsThroughWorkItsCallersTakeAtOnce) {
  HostStream s;
  const pid_t worker = worker_of(s);
  help_at_once(s);
  help_at_once(s);
  std::this_thread::sleep_for(5ms);  // past its 200 µs spin for more work: asleep
  const long before = switches_of(worker);
  int on_caller = 0;
  for (int i = 0; i < 100; ++i) {
    on_caller += help_at_once(s) ? 1 : 0;
    std::this_thread::sleep_for(1ms);  // the worker, were it woken, back asleep
  }
  EXPECT_LT(switches_of(worker) - before, 50);
  EXPECT_GT(on_caller, 50);
  // Other work still wakes it at once.
  const long idle = switches_of(worker);
  s.launch_host_func([] {}, false);
  s.synchronize();
  std::this_thread::sleep_for(5ms);  // asleep again (a switch) after its spin for more work
  EXPECT_GT(switches_of(worker), idle);
}

// Such work that no caller takes still runs, on the worker, once the window has passed; and work
// enqueued behind it runs after it.
TEST(HostStreamHelp, WorkNoCallerTakesRunsOnTheWorkerAfterAll) {
  HostStream s;
  for (int trial = 0; trial < 5; ++trial) {
    const auto ran_on = runs_untaken(s);
    ASSERT_TRUE(ran_on.has_value()) << "trial " << trial;
    EXPECT_NE(*ran_on, std::this_thread::get_id());
  }
  help_at_once(s);
  help_at_once(s);
  std::this_thread::sleep_for(5ms);
  std::vector<int> order;
  s.launch_host_func_or_help([&] { order.push_back(1); },
                             [&] {
                               order.push_back(1);
                               return true;
                             });
  s.launch_host_func([&] { order.push_back(2); }, false);  // wakes the worker: it takes both
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// A fork() child's stream gets its own wake-ups (the parent's would wake the parent's worker),
// and the parent's keep working. Without ThreadSanitizer (no new threads after fork()).
TEST(HostStreamWorker, AForkChildWakesItsOwnWorker) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support new threads after fork()";
#else
  HostStream s;
  help_at_once(s);
  help_at_once(s);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang fails the test instead of stalling it
    _exit(runs_untaken(s) && help_at_once(s) ? 0 : 1);
  }
  expect_clean_exit(pid);
  EXPECT_TRUE(runs_untaken(s).has_value());
#endif
}

// A stream made when the process has no file descriptor left wakes its worker through a
// condition variable, at once, for all work (in a child: the limit is process-wide). Not under
// the sanitizers: ThreadSanitizer starts no threads after fork(), and UBSan's check of a virtual
// call opens a pipe (to see whether the object's memory is readable), which fails there too and
// reads as an invalid vptr; the main and host configurations run it.
TEST(HostStreamWorker, WithoutFileDescriptorsItWakesItsWorkerAtOnce) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizers' runtimes need file descriptors of their own";
#else
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_NOFILE, &none) != 0 || eventfd(0, 0) >= 0) _exit(2);
    HostStream s;
    _exit(runs_untaken(s) ? 0 : 1);
  }
  expect_clean_exit(pid);
#endif
}

TEST(HostStreamWorker, KeepsAPolicyOtherThanSchedOther) {
  run_as(SCHED_BATCH, [] {  // (not SCHED_IDLE: on a loaded machine it would wait for an idle core)
    HostStream s;           // its worker starts from this thread, as SCHED_BATCH
    int policy = -1;
    s.launch_host_func([&] { policy = policy_of(0); }, false);
    s.synchronize();
    EXPECT_EQ(policy, SCHED_BATCH);  // not switched to SCHED_OTHER for its work
    for (int i = 0; i < 3; ++i) {    // taken by the caller, so the next would wake it as batch
      std::this_thread::sleep_for(5ms);
      s.launch_host_func_or_help([] {}, [] { return true; });
      s.synchronize();
    }
    s.launch_host_func([&] { policy = policy_of(0); }, false);
    s.synchronize();
    EXPECT_EQ(policy, SCHED_BATCH);
  });
}

// A throw from the on_caller form is the stream's error, raised once by synchronize(), as from
// the worker; the stream runs work again afterwards.
TEST(HostStreamHelp, AThrowOnTheCallerIsTheStreamsError) {
  HostStream s;
  bool thrown = false;
  for (int trial = 0; trial < 50 && !thrown; ++trial) {
    std::this_thread::sleep_for(2ms);
    std::atomic<bool> threw{false};
    s.launch_host_func_or_help([] {},
                               [&]() -> bool {
                                 threw.store(true);
                                 throw std::runtime_error("on the caller");
                               });
    if (threw.load()) break;  // unreachable: only synchronize() runs it
    try {
      s.synchronize();
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "on the caller");
      thrown = true;
    }
    EXPECT_EQ(thrown, threw.load());
  }
  EXPECT_TRUE(thrown);
  s.synchronize();  // raised once
  bool ran = false;
  s.launch_host_func([&] { ran = true; }, false);
  s.synchronize();
  EXPECT_TRUE(ran);
}

}  // namespace

namespace {
// A blocking call on @p s's worker under a 200 ms deadline that never returns by itself: the
// watchdog abandons it and synchronize() raises its error. True when that happened in time.
bool deadline_fires(HostStream& s) {
  s.launch_host_func(
      [] {
        gpucloud::detail::run_with_deadline(
            std::chrono::milliseconds(200), [] { std::this_thread::sleep_for(std::chrono::hours(1)); },
            [] { return std::make_exception_ptr(std::runtime_error("deadline passed")); });
      },
      false);
  const auto began = std::chrono::steady_clock::now();
  try {
    s.synchronize();
  } catch (const std::runtime_error& e) {
    return std::string(e.what()) == "deadline passed" && std::chrono::steady_clock::now() - began < 5s;
  }
  return false;
}
}  // namespace

// A failure put on the stream from outside (the NCCL watchdog's, for a collective it aborted):
// the next synchronize() raises it once, after the stream's own work; it can be set after the
// stream is gone (the setter holds the slot, not the stream).
TEST(StreamFailure, TheNextSynchronizeRaisesItOnceAndTheSlotOutlivesTheStream) {
  std::shared_ptr<gpucloud::detail::StreamFailure> slot;
  {
    HostStream s;
    slot = s.failure();
    std::atomic<bool> ran{false};
    s.launch_host_func([&] { ran = true; }, /*always_run=*/false);
    slot->set(std::make_exception_ptr(std::runtime_error("collective aborted")));
    slot->set(std::make_exception_ptr(std::runtime_error("a second one is not kept")));
    EXPECT_TRUE(slot->pending());
    try {
      s.synchronize();
      ADD_FAILURE() << "synchronize did not raise the failure";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "collective aborted");
    }
    EXPECT_TRUE(ran.load());
    EXPECT_FALSE(slot->pending());
    EXPECT_NO_THROW(s.synchronize());  // raised once
    slot->set(std::make_exception_ptr(std::runtime_error("taken by take_error")));
    EXPECT_TRUE(static_cast<bool>(s.take_error()));
    EXPECT_NO_THROW(s.synchronize());
  }
  slot->set(std::make_exception_ptr(std::runtime_error("after the stream")));  // no stream to touch
  EXPECT_TRUE(slot->pending());
}

TEST(Deadline, AbandonsAStuckCallAndTheStreamGoesOn) {
  HostStream s;
  EXPECT_TRUE(deadline_fires(s));
  EXPECT_TRUE(deadline_fires(s));  // a new worker ran the second
}

// The watchdog behind run_with_deadline is a thread: a fork() child has none of the parent's, so
// it starts its own there, and a call that never returns is still abandoned instead of hanging.
// ThreadSanitizer does not support threads started after a fork of a threaded process, so it is
// left to the other configurations (as HostStream.AForkChildGetsItsOwnWorkerAndAnErrorForWorkInFlight).
// The parent is quiet at the fork: GCC 12's AddressSanitizer takes no locks around fork(), so a
// thread still starting there (the worker that replaced the abandoned one) can hold its allocator's
// lock at that moment, and the child's first thread then waits for it forever (seen in CI, 1 in
// ~200 runs under load; glibc's own malloc and thread creation are fork-safe, so programs without
// the sanitizer are not exposed).
TEST(Deadline, AForkChildStartsItsOwnWatchdog) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support new threads after fork()";
#else
  HostStream s;
  EXPECT_TRUE(deadline_fires(s));  // the watchdog's thread now runs in this process
  s.launch_host_func([] {}, false);
  s.synchronize();  // the replacement worker has started and run: no thread is starting at the fork
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang fails the test instead of stalling it
    HostStream child;
    _exit(deadline_fires(child) ? 0 : 1);
  }
  expect_clean_exit(pid);
  EXPECT_TRUE(deadline_fires(s));  // and the parent's still does
#endif
}
