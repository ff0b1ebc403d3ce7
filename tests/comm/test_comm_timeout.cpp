// A rank that never joins (default), or that exits at once ("exits"): the others get a
// CommunicationError within the timeout instead of hanging, and the communicator is broken
// afterwards. Rank 0 then returns from main as any program would: MPI cannot finalise with the
// collective abandoned, so the library ends the job (MPI_Abort, with a message) instead of waiting
// in MPI_Finalize for the missing rank, which sleeps far longer than CTest's timeout. Both ways a
// collective waits are timed out: on a busy stream it blocks in MPI on the stream's worker, which
// the watchdog abandons (the stream goes on); on an idle stream a small one runs on the caller's
// thread, polling MPI against the same timeout.
#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace gc = gpucloud;

namespace {
// "late": every rank but 0 arrives 1.5 s after rank 0 has started an all-reduce, well within its
// 10 s timeout: the collective completes with the right sum on every rank (the blocking MPI call
// waits for them; the watchdog does not fire early).
int late_rank(gc::Communicator& c) {
  c.set_timeout(std::chrono::milliseconds(10000));
  gc::Stream s;
  gc::Buffer data(16, gc::DType::float32);
  gc::fill(data, 1.0, s);
  s.synchronize();
  if (c.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto start = std::chrono::steady_clock::now();
  c.all_reduce(data, data, gc::ReduceOp::sum, s);
  s.synchronize();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  bool ok = !c.broken();
  for (std::size_t i = 0; i < 16; ++i) ok = ok && data.data_as<float>()[i] == static_cast<float>(c.size());
  if (c.rank() == 0) {
    ok = ok && ms.count() >= 1000;  // it did wait for the late ranks
    std::printf("rank 0: the all-reduce waited %lld ms for the late ranks\n", static_cast<long long>(ms.count()));
  }
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (c.rank() == 0) std::printf(all_ok ? "LATE RANK TEST PASSED\n" : "LATE RANK TEST FAILED\n");
  return all_ok ? 0 : 1;
}
// "cut": every rank all-reduces 1 MiB and 4 MiB in turn over and over (on 4 ranks, MPI's own
// collective on the worker, then gpucloud's ring on the worker), printing "cut: ready" after 5 rounds; the
// test script then takes one node's link down. Every rank must get a CommunicationError naming the
// all-reduce within its timeout (GPUCLOUD_COMM_TIMEOUT), say so and leave (the job then ends).
int cut_link(gc::Communicator& c) {
  gc::Stream s;
  gc::Buffer data(1 << 20, gc::DType::float32);
  const auto began = std::chrono::steady_clock::now();
  auto since = [&] {
    return static_cast<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count());
  };
  try {
    for (int round = 0; round < 100000; ++round) {
      const gc::BufferView v = round % 2 == 0 ? data.view().slice(0, 1 << 18) : data.view();
      c.all_reduce(v, v, gc::ReduceOp::sum, s);
      s.synchronize();
      if (round == 5) std::printf("cut: rank %d ready\n", c.rank());
      std::fflush(stdout);
    }
  } catch (const gc::CommunicationError& e) {
    std::printf("cut: rank %d CommunicationError at %lld ms: %s\n", c.rank(), since(), e.what());
    std::fflush(stdout);
    return 1;
  }
  std::printf("cut: rank %d FAILED: never cut\n", c.rank());
  return 1;
}
// "stall" / "stall-worker": 2 ranks all-reduce 512 KiB / 4 MiB in place over and over on idle
// streams: a ring of polled messages on each caller's thread, or (above 1 MiB) on the stream's
// worker (the agreement before it takes a few µs of each call); "stall-hierarchical": 4 MiB
// hierarchical all-reduces (its node phases, the ring's two halves, on the worker). 200 ms after the first call, rank 1
// stops itself (SIGSTOP) between two polls, nearly always inside the ring: rank 0 must get the CommunicationError
// within its 1 s timeout instead of waiting for ever, with the communicator broken, and nothing of the abandoned
// collective may keep a core busy afterwards (a thread left polling, or spinning in a blocking MPI call). It then
// leaves and the job ends (the stopped rank with it). "stall-broadcast": the same with 64 MiB broadcasts from rank 1,
// the one that stops: on 2 ranks the chain of polled segments on rank 0's worker, abandoned mid-transfer. Under
// AddressSanitizer (the asan configuration runs these) the abandoned collective, its buffer and
// the exit handler are checked for use after free.
// User and system CPU time of the process so far, all threads.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

enum class Stalled { all_reduce, hierarchical, broadcast };

int stall(gc::Communicator& c, std::size_t floats, Stalled op = Stalled::all_reduce) {
  c.set_timeout(std::chrono::milliseconds(1000));
  gc::Stream s;
  gc::Buffer data(floats, gc::DType::float32);
  gc::fill(data, 0.0, s);
  s.synchronize();
  const auto call = [&] {
    if (op == Stalled::hierarchical) {
      c.hierarchical_all_reduce(data, data, gc::ReduceOp::sum, s);
    } else if (op == Stalled::broadcast) {
      c.broadcast(data, 1, s);
    } else {
      c.all_reduce(data, data, gc::ReduceOp::sum, s);
    }
    s.synchronize();
  };
  // One call on both ranks first: whatever the first call sets up is set up on both before rank 1's
  // 200 ms start (under a loaded ctest -j2 they could otherwise run out before rank 1's first call).
  call();
  const auto began = std::chrono::steady_clock::now();
  std::thread stopper;
  if (c.rank() == 1) {
    stopper = std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::printf("stall: rank 1 stops\n");
      std::fflush(stdout);
      std::raise(SIGSTOP);
    });
  }
  long long calls = 0, waited = 0;
  try {
    for (;; ++calls) {
      call();
      if (std::chrono::steady_clock::now() - began > std::chrono::seconds(20)) break;
    }
  } catch (const gc::CommunicationError& e) {
    waited = static_cast<long long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count());
    // Rank 1 only runs again when the job is being ended (mpirun continues it to terminate it).
    bool ok = c.rank() != 0 || (c.broken() && std::string(e.what()).find("waited") != std::string::npos &&
                                waited >= 1000 && waited < 6000);
    if (c.rank() == 0) {  // CPU time of the whole process over 500 ms of this thread sleeping
      const double before = cpu_seconds();
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const double busy = cpu_seconds() - before;
      std::printf("stall: rank 0 used %.0f ms of CPU in the 500 ms after the error\n", busy * 1e3);
      ok = ok && busy < 0.1;
    }
    std::printf("stall: rank %d CommunicationError at %lld ms after %lld calls: %s\n%s\n", c.rank(), waited, calls,
                e.what(),
                c.rank() != 0 ? ""
                : ok          ? "STALL TEST PASSED"
                              : "STALL TEST FAILED");
    std::fflush(stdout);
    if (stopper.joinable()) stopper.detach();
    return ok ? 0 : 1;  // exit() runs the library's handler, which ends the job
  }
  std::printf("stall: rank %d FAILED: %lld calls and no error\n", c.rank(), calls);
  if (stopper.joinable()) stopper.detach();
  return 1;
}
// "stall-save": rank 1 stops (SIGSTOP) while rank 0 has a checkpoint save in flight whose commit
// waits for rank 1's file (commit_timeout 60 s). Rank 0's next all-reduce times out and breaks the
// communicator; the save must then fail at once, naming the broken communicator, rather than
// wait out the commit timeout (a rank left behind by a dead peer exits promptly).
// "stall-save-idle": the same, but rank 0 runs no collective: it only waits for the save (as a
// trainer does when its next save waits for the previous one). Nothing in the save's directory
// changes, and after the communicator's timeout the save fails, naming the silence; the job then
// ends (MPI could not finalise without rank 1).
int stall_save(gc::Communicator& c, const char* dir, bool idle) {
  c.set_timeout(std::chrono::milliseconds(1000));
  gc::Stream s;
  gc::Buffer data(1024, gc::DType::float32);
  gc::fill(data, 1.0, s);
  s.synchronize();
  gc::checkpoint::Options o;
  o.comm = &c;
  o.commit_timeout = std::chrono::seconds(60);
  gc::checkpoint::Checkpointer ck(dir, o);  // a collective: both ranks are here
  if (c.rank() == 1) {
    std::printf("stall-save: rank 1 stops\n");
    std::fflush(stdout);
    std::raise(SIGSTOP);
    return 0;  // continued only to be ended
  }
  auto pending = ck.save_async(1, {{"w", {data, {1024}}}}, s);
  const auto began = std::chrono::steady_clock::now();
  try {
    if (!idle) {
      c.all_reduce(data, data, gc::ReduceOp::sum, s);
      s.synchronize();
      std::printf("stall-save: FAILED: the all-reduce completed without rank 1\n");
      return 1;
    }
  } catch (const gc::CommunicationError&) {
  }
  try {
    pending.wait();
    std::printf("stall-save: FAILED: the save committed without rank 1\n");
    return 1;
  } catch (const gc::CheckpointError& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count();
    const bool ok =
        ms < 20000 && std::string(e.what()).find(idle ? "changed for" : "communicator is broken") != std::string::npos;
    std::printf("stall-save: the save failed %lld ms after the stop: %s\n%s\n", static_cast<long long>(ms), e.what(),
                ok ? "SAVE STALL TEST PASSED" : "SAVE STALL TEST FAILED");
    std::fflush(stdout);
    return ok ? 0 : 1;
  }
}
// "agreement-form": GPUCLOUD_AGREEMENT=doubling on rank 0 alone (3 ranks on one node, where the
// others agree all-to-all): the communicator is refused on every rank, naming the variable,
// instead of each rank waiting for messages the others never send.
int agreement_form() {
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (world_rank != nullptr && std::string(world_rank) == "0") setenv("GPUCLOUD_AGREEMENT", "doubling", 1);
  try {
    gc::Communicator c = gc::Communicator::mpi_world();
    std::printf("agreement-form: FAILED: the communicator was made\n");
    return 1;
  } catch (const gc::InvalidArgument& e) {
    const bool ok = std::string(e.what()).find("GPUCLOUD_AGREEMENT") != std::string::npos;
    std::printf("agreement-form: rank %s: %s\n%s\n", world_rank != nullptr ? world_rank : "?", e.what(),
                ok ? "AGREEMENT FORM TEST PASSED" : "AGREEMENT FORM TEST FAILED");
    std::fflush(stdout);
    return ok ? 0 : 1;
  }
}
// "bad-env VAR VALUE": VAR=VALUE, invalid, on world rank 0 alone: every rank refuses the
// communicator with an InvalidArgument that names VAR (rank 0 its own reason, the others rank 0's),
// instead of the others waiting in the communicator's first collective for good.
int bad_environment(const char* variable, const char* value) {
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool first = world_rank != nullptr && std::string(world_rank) == "0";
  if (first) setenv(variable, value, 1);
  try {
    gc::Communicator c = gc::Communicator::mpi_world();
    std::printf("bad-env: FAILED: the communicator was made\n");
    return 1;
  } catch (const gc::InvalidArgument& e) {
    const std::string what = e.what();
    const bool ok = what.find(variable) != std::string::npos && (first || what.find("rank 0") != std::string::npos);
    std::printf("bad-env: rank %s: %s\n%s\n", world_rank != nullptr ? world_rank : "?", e.what(),
                ok ? "BAD ENVIRONMENT TEST PASSED" : "BAD ENVIRONMENT TEST FAILED");
    std::fflush(stdout);
    if (!ok) return 1;
  }
  // The job goes on: a communicator made afterwards with the environment mended works.
  unsetenv(variable);
  gc::Communicator c = gc::Communicator::mpi_world();
  gc::Stream s;
  gc::Buffer data(4, gc::DType::float32);
  gc::fill(data, 1.0, s);
  c.all_reduce(data, data, gc::ReduceOp::sum, s);
  s.synchronize();
  const bool summed = static_cast<const float*>(data.data())[0] == static_cast<float>(c.size());
  std::printf("bad-env: %s\n", summed ? "the next communicator works" : "FAILED: the next communicator's sum");
  return summed ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "agreement-form") return agreement_form();
  if (argc > 3 && std::string(argv[1]) == "bad-env") return bad_environment(argv[2], argv[3]);
  const bool exits = argc > 1 && std::string(argv[1]) == "exits";
  gc::Communicator c = gc::Communicator::mpi_world();
  if (argc > 1 && std::string(argv[1]) == "late") return late_rank(c);
  if (argc > 2 && std::string(argv[1]) == "stall-save") return stall_save(c, argv[2], false);
  if (argc > 2 && std::string(argv[1]) == "stall-save-idle") return stall_save(c, argv[2], true);
  if (argc > 1 && std::string(argv[1]) == "cut") return cut_link(c);
  if (argc > 1 && std::string(argv[1]) == "stall") return stall(c, std::size_t{1} << 17);
  if (argc > 1 && std::string(argv[1]) == "stall-worker") return stall(c, std::size_t{1} << 20);
  if (argc > 1 && std::string(argv[1]) == "stall-hierarchical")
    return stall(c, std::size_t{1} << 20, Stalled::hierarchical);
  if (argc > 1 && std::string(argv[1]) == "stall-broadcast") return stall(c, std::size_t{1} << 24, Stalled::broadcast);
  gc::Communicator again = gc::Communicator::mpi_world();  // for the dropped stream, below
  gc::Communicator idle = gc::Communicator::mpi_world();   // for the in-place collective, below
  if (c.rank() != 0) {                                     // never joins: waits, or leaves the job at once
    if (!exits) std::this_thread::sleep_for(std::chrono::seconds(120));
    std::fflush(stdout);
    std::_Exit(0);
  }
  c.set_timeout(std::chrono::milliseconds(1000));
  gc::Stream s;
  gc::Buffer data(16, gc::DType::float32);
  auto keep_busy = [](gc::Stream& stream) {  // what follows queues behind this: the worker runs it
    gc::launch_host_func(stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  };
  const auto start = std::chrono::steady_clock::now();
  keep_busy(s);
  c.all_reduce(data, data, gc::ReduceOp::sum, s);
  bool ok = false;
  try {
    s.synchronize();
    std::printf("FAILED: the all-reduce completed without the other ranks\n");
  } catch (const gc::CommunicationError& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    const std::string what = e.what();
    ok = ms >= 900 && ms < 3500 && what.find("rank 0") != std::string::npos &&
         what.find("waited") != std::string::npos && c.broken();
    std::printf("rank 0: CommunicationError after %lld ms: %s\n", static_cast<long long>(ms), e.what());
    try {
      c.barrier(s);
      ok = false;
    } catch (const gc::CommunicationError&) {  // broken: later operations fail at once
    }
    // The stream went on without the worker stuck in MPI: later work on it runs.
    bool ran = false;
    gc::launch_host_func(s, [&ran] { ran = true; });
    s.synchronize();
    ok = ok && ran;
    if (!ran) std::printf("FAILED: work after the timeout did not run\n");
  }
  {
    // A stream dropped while its collective waits: its destructor returns once the watchdog has
    // let the stuck worker go (another communicator: the broken one refuses work).
    again.set_timeout(std::chrono::milliseconds(500));
    gc::Stream dropped;
    keep_busy(dropped);
    again.all_reduce(data, data, gc::ReduceOp::sum, dropped);
  }
  std::printf("dropped stream: its destructor returned\n");
  {
    // On an idle stream the small all-reduce runs on this thread: it returns after the timeout,
    // and the stream holds the CommunicationError for its next synchronize().
    idle.set_timeout(std::chrono::milliseconds(500));
    gc::Stream quiet;
    const auto began = std::chrono::steady_clock::now();
    idle.all_reduce(data, data, gc::ReduceOp::sum, quiet);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count();
    bool in_place_ok = false;
    try {
      quiet.synchronize();
    } catch (const gc::CommunicationError& e) {
      in_place_ok =
          ms >= 450 && ms < 3000 && idle.broken() && std::string(e.what()).find("waited") != std::string::npos;
      std::printf("in place: CommunicationError after %lld ms: %s\n", static_cast<long long>(ms), e.what());
    }
    if (!in_place_ok) std::printf("FAILED: the in-place all-reduce did not time out as it should\n");
    ok = ok && in_place_ok;
  }
  std::printf(ok ? "TIMEOUT TEST PASSED\n" : "TIMEOUT TEST FAILED\n");
  std::fflush(stdout);
  return ok ? 0 : 1;  // exit() runs the library's handler, which ends the job
}
