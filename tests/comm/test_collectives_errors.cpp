// What must not corrupt a collective, across MPI ranks: bad input, ranks that disagree on the
// operation, reduce op, root, count or size (an error on every rank, the communicator still
// usable), agreement messages around the piece size, counts above one MPI call, a bad timeout,
// and a communicator dropped with its work queued.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/comm/mpi_interop.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives_cases.hpp"

namespace gc = gpucloud;
using namespace gc::testing::collectives;  // NOLINT(google-build-using-namespace): the suite's harness

TEST(Collectives, BadInputAndMismatchedCountsAreErrorsNotCorruption) {
  auto& c = world();
  gc::Stream s;
  gc::Buffer ints = inputs(gc::DType::int32, 8, c.rank());
  EXPECT_THROW(c.all_reduce(ints, ints, gc::ReduceOp::average, s), gc::InvalidArgument);
  gc::Buffer shorter(7, gc::DType::int32);
  EXPECT_THROW(c.all_reduce(ints, shorter, gc::ReduceOp::sum, s), gc::InvalidArgument);
  EXPECT_THROW(c.broadcast(ints, c.size(), s), gc::InvalidArgument);
  EXPECT_THROW(c.all_gather(ints, ints, s), gc::InvalidArgument);
  // Rank 0 sends 10 elements, the others 11: every rank gets an error, nobody's data changes.
  const std::size_t n = c.rank() == 0 ? 10 : 11;
  gc::Buffer data = inputs(gc::DType::float32, n, c.rank());
  c.all_reduce(data, data, gc::ReduceOp::sum, s);
  expect_disagreement(s, c, "rank " + std::to_string(c.rank()));
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(load(data, i), value(c.rank(), i));
  // Rank 0's data fits in the agreement (64 KiB) and the others' does not (and their streams are
  // busy, so rank 0 runs in place and they on their workers): still an error on every rank.
  const std::size_t straddle = c.rank() == 0 ? 16384 : 16385;
  gc::Buffer big = inputs(gc::DType::float32, straddle, c.rank());
  if (c.rank() != 0) keep_busy(s);
  c.all_reduce(big, big, gc::ReduceOp::sum, s);
  expect_disagreement(s, c, "disagree");
  for (std::size_t i = 0; i < straddle; ++i) EXPECT_EQ(load(big, i), value(c.rank(), i));
  EXPECT_FALSE(c.broken());
  gc::Buffer ok = inputs(gc::DType::float32, 10, c.rank());  // the communicator still works
  c.all_reduce(ok, ok, gc::ReduceOp::sum, s);
  s.synchronize();
  EXPECT_EQ(load(ok, 3), expected(gc::ReduceOp::sum, c.size(), 3));
}

namespace {
// Every rank runs @p mine or, on rank 0, @p rank0: each call is valid on its own, together they
// are different collectives. Every rank must get a CommunicationError naming @p field, and the
// communicator must still work afterwards.
template <class Rank0, class Others>
void expect_disagreement(const char* field, Rank0 rank0, Others others) {
  auto& c = world();
  if (c.size() < 2) GTEST_SKIP() << "needs two ranks";
  gc::Stream s;
  if (c.rank() == 0) {
    rank0(c, s);
  } else {
    others(c, s);
  }
  try {
    s.synchronize();
    ADD_FAILURE() << field << ": mismatched collectives completed";
  } catch (const gc::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(c.rank())), std::string::npos) << e.what();
  }
  EXPECT_FALSE(c.broken());
  gc::Buffer ok = inputs(gc::DType::float32, 10, c.rank());
  c.all_reduce(ok, ok, gc::ReduceOp::sum, s);
  s.synchronize();
  EXPECT_EQ(load(ok, 3), expected(gc::ReduceOp::sum, c.size(), 3));
}
}  // namespace

TEST(Collectives, DifferentReduceOpsAreAnErrorOnEveryRank) {
  gc::Buffer x = inputs(gc::DType::float32, 16, world().rank());
  expect_disagreement(
      "reduce op", [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(x, x, gc::ReduceOp::sum, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(x, x, gc::ReduceOp::max, s); });
  for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(load(x, i), value(world().rank(), i));  // untouched
}

TEST(Collectives, DifferentRootsAreAnErrorOnEveryRank) {
  gc::Buffer x = inputs(gc::DType::int32, 9, world().rank());
  expect_disagreement(
      "root", [&](gc::Communicator& c, gc::Stream& s) { c.broadcast(x, 0, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.broadcast(x, 1, s); });
  for (std::size_t i = 0; i < 9; ++i) EXPECT_EQ(load(x, i), value(world().rank(), i));
}

TEST(Collectives, DifferentOperationsAreAnErrorOnEveryRank) {
  const int n = world().size();
  gc::Buffer send = inputs(gc::DType::float32, 4, world().rank());
  gc::Buffer gathered(4 * static_cast<std::size_t>(n), gc::DType::float32);
  gc::Buffer big = inputs(gc::DType::float32, 4 * static_cast<std::size_t>(n), world().rank());
  gc::Buffer piece(4, gc::DType::float32);
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.all_gather(send, gathered, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(send, send, gc::ReduceOp::sum, s); });
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.reduce_scatter(big, piece, gc::ReduceOp::sum, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(piece, piece, gc::ReduceOp::sum, s); });
  // A barrier against an all-reduce used to abort the whole job (MPI_ERR_TRUNCATE).
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.barrier(s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(send, send, gc::ReduceOp::sum, s); });
  if (world().nodes() > 1 || world().local_size() > 1) {
    expect_disagreement(
        "operation",
        [&](gc::Communicator& c, gc::Stream& s) { c.hierarchical_all_reduce(send, send, gc::ReduceOp::sum, s); },
        [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(send, send, gc::ReduceOp::sum, s); });
  }
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(load(send, i), value(world().rank(), i));
}

// One rank's data fits in the agreement's payload, the others' does not: still one agreement,
// an error on every rank, no hang.
TEST(Collectives, AnInlineSizeAgainstAFullSizeIsAnErrorOnEveryRank) {
  gc::Buffer small = inputs(gc::DType::float32, 10, world().rank());
  gc::Buffer large = inputs(gc::DType::float32, 20000, world().rank());
  expect_disagreement(
      "count", [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(small, small, gc::ReduceOp::sum, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(large, large, gc::ReduceOp::sum, s); });
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(load(small, i), value(world().rank(), i));
  expect_disagreement(
      "count", [&](gc::Communicator& c, gc::Stream& s) { c.broadcast(large, 0, s); },
      [&](gc::Communicator& c, gc::Stream& s) { c.broadcast(small, 0, s); });
}

// A broadcast, all-gather or all-reduce above the inline size on 2 ranks, and these and the
// reduce-scatter up to 16 MiB on 3-16 ranks of one node: the root (every rank of the others) sends
// its data with its agreement, before it knows the other ranks agree. A disagreement in any field,
// with any rank the sender, or several, is still an error on every rank that changes no rank's
// data, and no message is left over for a later collective: a large collective after each arrives
// whole. (Across nodes the same calls check the agreement of collectives whose data follows it; on
// 4 ranks the 8 MiB all-gathers are past 16 MiB in all, the 1 MiB ones below it.)
TEST(Collectives, DataSentWithTheAgreementIsDrainedOnADisagreement) {
  const int me = world().rank();
  const std::size_t n = (std::size_t{8} << 20) / 4 + 5;  // fp32: two messages, the second short
  gc::Buffer x = inputs(gc::DType::float32, n, me), longer = inputs(gc::DType::float32, n + 1, me);
  gc::Buffer ints = inputs(gc::DType::int32, n, me), small = inputs(gc::DType::float32, 10, me);
  auto unchanged = [&](const gc::Buffer& b) {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < b.size(); ++i) wrong += load(b, i) != value(me, i);
    EXPECT_EQ(wrong, 0u);
  };
  auto arrives_whole = [&](int root) {
    gc::Stream s;
    gc::Buffer after = inputs(gc::DType::float32, n, me);
    world().broadcast(after, root, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += load(after, i) != value(root, i);
    EXPECT_EQ(wrong, 0u);
  };
  auto bcast = [](gc::Buffer& b, int root) {
    return [&b, root](gc::Communicator& c, gc::Stream& s) { c.broadcast(b, root, s); };
  };
  expect_disagreement("root", bcast(x, 0), bcast(x, 1));  // each its own root: both send
  expect_disagreement("root", bcast(x, 1), bcast(x, 0));  // neither sends
  arrives_whole(1);
  expect_disagreement("count", bcast(x, 0), bcast(longer, 0));
  expect_disagreement("dtype", bcast(x, 0), bcast(ints, 0));
  expect_disagreement("count", bcast(x, 0), bcast(small, 0));  // the other rank's data is inline
  arrives_whole(0);
  expect_disagreement("operation", bcast(x, 0),
                      [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(x, x, gc::ReduceOp::sum, s); });
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.barrier(s); }, bcast(x, 1));
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.all_reduce(x, x, gc::ReduceOp::sum, s); }, bcast(x, 1));
  arrives_whole(1);
  // All-gathers: every rank sends. recv is all ranks' blocks of n; a disagreement leaves it as it was.
  const auto ranks = static_cast<std::size_t>(world().size());
  gc::Buffer gathered = inputs(gc::DType::float32, n * ranks, me), gathered_ints(n * ranks, gc::DType::int32);
  gc::Buffer gathered_small(10 * ranks, gc::DType::float32);
  auto gather = [](gc::Buffer& send, gc::Buffer& recv) {
    return [&send, &recv](gc::Communicator& c, gc::Stream& s) { c.all_gather(send, recv, s); };
  };
  auto gathers_whole = [&] {
    gc::Stream s;
    gc::Buffer mine = inputs(gc::DType::float32, n, me), all(n * ranks, gc::DType::float32);
    world().all_gather(mine, all, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t i = 0; i < n; ++i) wrong += load(all, r * n + i) != value(static_cast<int>(r), i);
    }
    EXPECT_EQ(wrong, 0u);
  };
  gc::Buffer longer_gathered(ranks * (n + 1), gc::DType::float32);
  expect_disagreement("count", gather(x, gathered), gather(longer, longer_gathered));
  expect_disagreement("dtype", gather(x, gathered), gather(ints, gathered_ints));
  expect_disagreement("count", gather(x, gathered), gather(small, gathered_small));
  gathers_whole();
  // Gathers up to 16 MiB in all on 3+ ranks: every rank sends its block to every other one.
  const std::size_t m = (std::size_t{1} << 20) / 4 + 5;
  gc::Buffer piece = inputs(gc::DType::float32, m, me), gathered_piece = inputs(gc::DType::float32, m * ranks, me);
  expect_disagreement("count", gather(piece, gathered_piece), gather(x, gathered));
  expect_disagreement("operation", gather(piece, gathered_piece), bcast(piece, 1));
  expect_disagreement("operation", bcast(piece, 2 % static_cast<int>(ranks)), gather(piece, gathered_piece));
  // Reduce-scatters up to 16 MiB in all on 3+ ranks: every rank sends each other rank its block.
  auto scatter = [](gc::Buffer& send, gc::Buffer& recv) {
    return [&send, &recv](gc::Communicator& c, gc::Stream& s) { c.reduce_scatter(send, recv, gc::ReduceOp::sum, s); };
  };
  gc::Buffer scattered = inputs(gc::DType::float32, m, me), longer_scattered = inputs(gc::DType::float32, m + 1, me);
  gc::Buffer longer_values = inputs(gc::DType::float32, (m + 1) * ranks, me);
  expect_disagreement("count", scatter(gathered_piece, scattered), scatter(longer_values, longer_scattered));
  expect_disagreement("operation", scatter(gathered_piece, scattered), gather(piece, gathered_piece));
  expect_disagreement("reduce op", scatter(gathered_piece, scattered), [&](gc::Communicator& c, gc::Stream& s) {
    c.reduce_scatter(gathered_piece, scattered, gc::ReduceOp::max, s);
  });
  unchanged(piece);
  unchanged(gathered_piece);
  unchanged(scattered);
  {
    gc::Stream s;
    world().reduce_scatter(gathered_piece, scattered, gc::ReduceOp::sum, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < m; ++i) {
      wrong += load(scattered, i) != expected(gc::ReduceOp::sum, world().size(), static_cast<std::size_t>(me) * m + i);
    }
    EXPECT_EQ(wrong, 0u);
  }
  expect_disagreement("operation", gather(x, gathered), bcast(x, 1));  // both send
  expect_disagreement("operation", gather(x, gathered), bcast(x, 0));  // only rank 0 sends
  expect_disagreement(
      "operation", [&](gc::Communicator& c, gc::Stream& s) { c.barrier(s); }, gather(x, gathered));
  arrives_whole(0);
  gathers_whole();
  // All-reduces up to 16 MiB: every rank sends the half of its values the other reduces.
  auto reduce = [](gc::Buffer& b, gc::ReduceOp op) {
    return [&b, op](gc::Communicator& c, gc::Stream& s) { c.all_reduce(b, b, op, s); };
  };
  gc::Buffer huge = inputs(gc::DType::float32, (std::size_t{16} << 20) / 4 + 1, me);  // past it: the ring
  expect_disagreement("count", reduce(x, gc::ReduceOp::sum), reduce(longer, gc::ReduceOp::sum));
  expect_disagreement("dtype", reduce(x, gc::ReduceOp::sum), reduce(ints, gc::ReduceOp::sum));
  expect_disagreement("reduce op", reduce(x, gc::ReduceOp::sum), reduce(x, gc::ReduceOp::max));
  expect_disagreement("count", reduce(x, gc::ReduceOp::sum), reduce(huge, gc::ReduceOp::sum));
  expect_disagreement("operation", reduce(x, gc::ReduceOp::sum), gather(x, gathered));
  {
    gc::Stream s;
    gc::Buffer sum = inputs(gc::DType::float32, n, me);
    world().all_reduce(sum, sum, gc::ReduceOp::sum, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += load(sum, i) != expected(gc::ReduceOp::sum, world().size(), i);
    EXPECT_EQ(wrong, 0u);
  }
  arrives_whole(1);
  unchanged(huge);
  for (const gc::Buffer* b : {&x, &longer, &ints, &small}) unchanged(*b);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < gathered.size(); ++i) wrong += load(gathered, i) != value(me, i);
  EXPECT_EQ(wrong, 0u);
}

// An agreement message goes as eager-sized pieces of 4032 bytes (the first holds the 96-byte header)
// and a last, shorter one: messages one element short of a piece, exactly one (an empty last
// piece), one past it, exactly two and past two, for each collective (the inline all-gather and
// reduce-scatter send mask blocks in round mask, so their per-rank counts are the same sizes over 1
// and 2 blocks). A rank whose message is split against ranks whose messages are not is a
// disagreement, not a hang.
TEST(Collectives, AgreementMessagesAroundThePieceSizeArriveWhole) {
  auto& c = world();
  gc::Stream s;
  const auto ranks = static_cast<std::size_t>(c.size());
  const std::size_t head = 4032 - 96;  // payload bytes that fill the first piece
  std::size_t wrong = 0;
  for (std::size_t blocks : {std::size_t{1}, std::size_t{2}}) {
    for (std::size_t bytes : {head - 4, head, head + 4, 2 * head + 96, 2 * head + 100}) {
      const std::size_t n = bytes / 4 / blocks;  // int32 elements
      gc::Buffer all = inputs(gc::DType::int32, n, c.rank());
      c.all_reduce(all, all, gc::ReduceOp::sum, s);
      gc::Buffer bcast = inputs(gc::DType::int32, n, c.rank());
      c.broadcast(bcast, 0, s);
      gc::Buffer mine = inputs(gc::DType::int32, n, c.rank()), gathered(n * ranks, gc::DType::int32);
      c.all_gather(mine, gathered, s);
      gc::Buffer send = inputs(gc::DType::int32, n * ranks, c.rank()), shard(n, gc::DType::int32);
      c.reduce_scatter(send, shard, gc::ReduceOp::sum, s);
      s.synchronize();
      for (std::size_t i = 0; i < n; ++i) {
        wrong += load(all, i) != expected(gc::ReduceOp::sum, c.size(), i);
        wrong += load(bcast, i) != value(0, i);
        wrong += load(shard, i) != expected(gc::ReduceOp::sum, c.size(), static_cast<std::size_t>(c.rank()) * n + i);
        for (int r = 0; r < c.size(); ++r) wrong += load(gathered, static_cast<std::size_t>(r) * n + i) != value(r, i);
      }
    }
  }
  EXPECT_EQ(wrong, 0u);
  gc::Buffer split = inputs(gc::DType::int32, head / 4, c.rank());
  gc::Buffer whole = inputs(gc::DType::int32, head / 4 - 1, c.rank());
  expect_disagreement(
      "count", [&](gc::Communicator& comm, gc::Stream& st) { comm.all_reduce(split, split, gc::ReduceOp::sum, st); },
      [&](gc::Communicator& comm, gc::Stream& st) { comm.all_reduce(whole, whole, gc::ReduceOp::sum, st); });
  for (std::size_t i = 0; i < head / 4; ++i) EXPECT_EQ(load(split, i), value(c.rank(), i));
  // Messages of several pieces each, of different lengths: each receiver posts the pieces the
  // sender's header announces, and no piece is left over for the next collective (which
  // expect_disagreement runs and checks).
  gc::Buffer five = inputs(gc::DType::int32, 5000, c.rank()), nine = inputs(gc::DType::int32, 9000, c.rank());
  expect_disagreement(
      "count", [&](gc::Communicator& comm, gc::Stream& st) { comm.all_reduce(five, five, gc::ReduceOp::sum, st); },
      [&](gc::Communicator& comm, gc::Stream& st) { comm.all_reduce(nine, nine, gc::ReduceOp::sum, st); });
}

TEST(Collectives, PartlyOverlappingSendAndRecvAreRejected) {
  auto& c = world();
  gc::Stream s;
  gc::Buffer x(20, gc::DType::float32);
  EXPECT_THROW(c.all_reduce(x.view().slice(0, 10), x.view().slice(5, 10), gc::ReduceOp::sum, s), gc::InvalidArgument);
  EXPECT_THROW(c.hierarchical_all_reduce(x.view().slice(0, 10), x.view().slice(1, 10), gc::ReduceOp::sum, s),
               gc::InvalidArgument);
}

// Counts above what one MPI call takes (int) are split into several calls (all-reduce, broadcast;
// the hierarchical all-reduce's phases send segments, whatever the count) or refused before any
// work (per-rank counts of reduce-scatter and all-gather). GPUCLOUD_MPI_MAX_COUNT lowers the limit so the split runs
// here on small buffers.
TEST(Collectives, CountsAboveOneMpiCallAreSplitOrRefused) {
  setenv("GPUCLOUD_MPI_MAX_COUNT", "1000", 1);
  gc::Communicator c = gc::Communicator::mpi_world();
  unsetenv("GPUCLOUD_MPI_MAX_COUNT");
  gc::Stream s;
  const std::size_t n = 2501;
  for (auto t : {gc::DType::float32, gc::DType::bfloat16, gc::DType::int64}) {
    gc::Buffer in_place = inputs(t, n, c.rank());
    gc::Buffer send = inputs(t, n, c.rank());
    gc::Buffer recv(n, t);
    gc::Buffer hier = inputs(t, n, c.rank());
    gc::Buffer bcast = inputs(t, n, c.rank());
    c.all_reduce(in_place, in_place, gc::ReduceOp::sum, s);
    c.all_reduce(send, recv, gc::ReduceOp::max, s);
    c.hierarchical_all_reduce(hier, hier, gc::ReduceOp::sum, s);
    c.broadcast(bcast, c.size() - 1, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += load(in_place, i) != expected(gc::ReduceOp::sum, c.size(), i);
      wrong += load(recv, i) != expected(gc::ReduceOp::max, c.size(), i);
      wrong += load(hier, i) != expected(gc::ReduceOp::sum, c.size(), i);
      wrong += load(bcast, i) != value(c.size() - 1, i);
    }
    EXPECT_EQ(wrong, 0u) << gc::dtype_name(t);
  }
  gc::Buffer send(1001, gc::DType::float32);
  gc::Buffer gathered(1001 * static_cast<std::size_t>(c.size()), gc::DType::float32);
  try {
    c.all_gather(send, gathered, s);
    ADD_FAILURE() << "an all-gather of 1001 elements per rank must be refused at a limit of 1000";
  } catch (const gc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("send: 1001 elements per rank"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.reduce_scatter(gathered, send, gc::ReduceOp::sum, s), gc::InvalidArgument);
  s.synchronize();  // nothing was enqueued
}

TEST(Collectives, AnOutOfRangeTimeoutIsRefusedNamingTheVariable) {
  for (const char* bad : {"inf", "nan", "1e16", "0.0001", "0", "-3", "ten", "5s"}) {
    setenv("GPUCLOUD_COMM_TIMEOUT", bad, 1);
    try {
      (void)gc::Communicator::mpi_world();
      ADD_FAILURE() << "GPUCLOUD_COMM_TIMEOUT=" << bad << " was accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GPUCLOUD_COMM_TIMEOUT"), std::string::npos) << e.what();
    }
  }
  setenv("GPUCLOUD_COMM_TIMEOUT", "0.25", 1);
  EXPECT_EQ(gc::Communicator::mpi_world().timeout().count(), 250);
  unsetenv("GPUCLOUD_COMM_TIMEOUT");
}

// Enqueued collectives keep their communicator alive: one dropped (say, made inside a function)
// while its all-reduce waits behind other work still runs it, on every rank.
TEST(Collectives, ACommunicatorDroppedWhileItsWorkIsQueuedStillRunsIt) {
  gc::Stream s;
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  gc::launch_host_func(s, [open] { open.wait(); });
  gc::Buffer x = inputs(gc::DType::int64, 33, world().rank());
  {
    gc::Communicator c = gc::Communicator::mpi_world();
    c.all_reduce(x, x, gc::ReduceOp::sum, s);
  }  // dropped with the all-reduce still queued
  gate.set_value();
  s.synchronize();
  for (std::size_t i = 0; i < 33; ++i) EXPECT_EQ(load(x, i), expected(gc::ReduceOp::sum, world().size(), i));
}

// Simulated nodes (GPUCLOUD_LOCAL_SIZE) are blocks of world ranks, also for a sub-communicator:
// its ranks keep the nodes their processes are on.
