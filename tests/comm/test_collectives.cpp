// Collectives across MPI ranks (CTest starts this under mpirun with 2, 3, 4 and 8 ranks, with
// GPUCLOUD_LOCAL_SIZE simulating several nodes): every operation, dtype and count gives the exact
// answer, on every route (inline, ring, halving, tree, MPI's collective, NCCL where GPUs are), and
// the same bytes on every rank; a #wrong count is reported rather than one bit.
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

TEST(Collectives, RanksAndNodesComeFromTheLauncher) {
  auto& c = world();
  int mpi_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  EXPECT_EQ(c.size(), mpi_size);
  const gc::LaunchInfo info = gc::launch_info_from_environment();
  EXPECT_EQ(info.rank, c.rank());
  EXPECT_EQ(info.size, c.size());
  EXPECT_EQ(info.launcher, "mpirun");
  if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE")) {
    EXPECT_EQ(c.local_size(), std::atoi(forced));
    EXPECT_EQ(c.nodes(), c.size() / c.local_size());
    EXPECT_EQ(c.local_rank(), c.rank() % c.local_size());
    EXPECT_EQ(c.node(), c.rank() / c.local_size());
  }
  EXPECT_EQ(c.local_size() * c.nodes(), c.size());
  // The hierarchical all-reduce's groups: the nodes, or blocks of K local ranks (GPUCLOUD_HIERARCHY=K).
  const gc::Hierarchy h = c.hierarchy();
  const char* asked = std::getenv("GPUCLOUD_HIERARCHY");
  const int k = asked != nullptr ? std::atoi(asked) : 0;
  if (k > 1 && k < c.local_size()) {
    EXPECT_EQ(h.level, "blocks of " + std::to_string(k));
    EXPECT_EQ(h.group_size, k);
    EXPECT_EQ(h.groups, c.size() / k);
    EXPECT_EQ(h.group_rank, c.local_rank() % k);
    EXPECT_EQ(h.group, c.node() * (c.local_size() / k) + c.local_rank() / k);
  } else {
    EXPECT_EQ(h.level, "node");
    EXPECT_EQ(h.group_size, c.local_size());
    EXPECT_EQ(h.groups, c.nodes());
    EXPECT_EQ(h.group_rank, c.local_rank());
    EXPECT_EQ(h.group, c.node());
  }
}

TEST(Collectives, AllReduceEveryOpDtypeAndCountInAndOutOfPlace) {
  auto& c = world();
  gc::Stream s;
  std::size_t wrong = 0;
  for_each_dtype([&](gc::DType t) {
    for (auto op : {gc::ReduceOp::sum, gc::ReduceOp::average, gc::ReduceOp::max, gc::ReduceOp::min}) {
      if (op == gc::ReduceOp::average && !gc::is_floating(t)) continue;
      for (std::size_t n : kCounts) {
        gc::Buffer send = inputs(t, n, c.rank()), recv(n, t);
        c.all_reduce(send, recv, op, s);
        c.all_reduce(send, send, op, s);  // in place
        s.synchronize();
        for (std::size_t i = 0; i < n; ++i) {
          const double want = expected(op, c.size(), i);
          const double tol = t == gc::DType::float16 || t == gc::DType::bfloat16 ? std::abs(want) * 1e-2 : 1e-9;
          wrong += std::abs(load(recv, i) - want) > tol;
          wrong += std::abs(load(send, i) - want) > tol;
        }
      }
    }
  });
  EXPECT_EQ(wrong, 0u);
}

TEST(Collectives, HierarchicalEqualsFlatBitForBitOnIntegers) {
  auto& c = world();
  gc::Stream s;
  std::size_t wrong = 0;
  for_each_dtype([&](gc::DType t) {
    for (std::size_t n : kCounts) {  // counts that do not divide by the local size included
      gc::Buffer send = inputs(t, n, c.rank()), flat(n, t), hier(n, t);
      c.all_reduce(send, flat, gc::ReduceOp::sum, s);
      c.hierarchical_all_reduce(send, hier, gc::ReduceOp::sum, s);
      s.synchronize();
      if (!gc::is_floating(t) || t == gc::DType::float32 || t == gc::DType::float64) {
        wrong += n > 0 && std::memcmp(flat.data(), hier.data(), flat.size_bytes()) != 0;
      } else {
        for (std::size_t i = 0; i < n; ++i)
          wrong += std::abs(load(flat, i) - load(hier, i)) > std::abs(load(flat, i)) * 1e-2;
      }
    }
  });
  EXPECT_EQ(wrong, 0u);
  gc::Buffer send = inputs(gc::DType::float32, 1001, c.rank());
  c.hierarchical_all_reduce(send, send, gc::ReduceOp::average, s);  // in place
  s.synchronize();
  for (std::size_t i = 0; i < 1001; ++i)
    ASSERT_FLOAT_EQ(send.data_as<float>()[i], static_cast<float>(expected(gc::ReduceOp::average, c.size(), i)));
}

TEST(Collectives, ReduceScatterAllGatherBroadcastBarrier) {
  auto& c = world();
  gc::Stream s;
  const std::size_t per = 1003;
  gc::Buffer send = inputs(gc::DType::int64, per * static_cast<std::size_t>(c.size()), c.rank());
  gc::Buffer shard(per, gc::DType::int64);
  c.reduce_scatter(send, shard, gc::ReduceOp::sum, s);
  gc::Buffer mine = inputs(gc::DType::float32, per, c.rank());
  gc::Buffer gathered(per * static_cast<std::size_t>(c.size()), gc::DType::float32);
  c.all_gather(mine, gathered, s);
  gc::Buffer bcast = inputs(gc::DType::int32, 77, c.rank());
  c.broadcast(bcast, c.size() - 1, s);
  c.barrier(s);
  s.synchronize();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < per; ++i) {
    wrong += load(shard, i) != expected(gc::ReduceOp::sum, c.size(), static_cast<std::size_t>(c.rank()) * per + i);
  }
  for (int r = 0; r < c.size(); ++r) {
    for (std::size_t i = 0; i < per; ++i) wrong += load(gathered, static_cast<std::size_t>(r) * per + i) != value(r, i);
  }
  for (std::size_t i = 0; i < 77; ++i) wrong += load(bcast, i) != value(c.size() - 1, i);
  EXPECT_EQ(wrong, 0u);
}

// Collectives whose data fits in the agreement's payload travel inside it (up to 64 KiB in all;
// reduce-scatter, all-gather and broadcast on 2 ranks up to 16 KiB, on a rank count that is not a
// power of two reduce-scatter up to 16 KiB, broadcast 4 KiB, all-gather 2 KiB); larger ones take
// the ring (2 ranks; reduce-scatter and all-gather on other counts that are not a power of two, 3 here),
// halving and doubling or the binomial tree (more ranks) or the MPI call. Inline ones run on the
// caller's thread when the stream is idle and on its worker when it is busy, and a rank of either
// kind meets the other: every mix (all idle, all busy, rank 0 busy), every dtype, each collective,
// the sizes around both boundaries.
TEST(Collectives, InlineAndFullPathsGiveTheSameExactAnswers) {
  auto& c = world();
  gc::Stream s;
  const auto ranks = static_cast<std::size_t>(c.size());
  std::size_t wrong = 0;
  for (int mix = 0; mix < 3; ++mix) {
    const bool busy = mix == 1 || (mix == 2 && c.rank() == 0);
    for_each_dtype([&](gc::DType t) {
      const std::size_t elem = gc::dtype_size(t);
      // Per rank: around 2 KiB, 16 KiB and 64 KiB in all (the inline limits), 4 KiB and 64 KiB each
      // (a broadcast's 4 KiB limit).
      for (std::size_t bytes :
           {std::size_t{0}, elem, 2048 / ranks, 2048 / ranks + elem, 16384 / ranks, 16384 / ranks + elem, 65536 / ranks,
            65536 / ranks + elem, std::size_t{4096}, std::size_t{4096} + elem, std::size_t{65536},
            std::size_t{65536} + elem, std::size_t{262144}}) {
        const std::size_t per = bytes / elem;
        // Busy: the collectives queue behind this, and run on the stream's worker.
        if (busy) keep_busy(s);
        if (t != gc::DType::uint8) {
          gc::Buffer send = inputs(t, per * ranks, c.rank()), shard(per, t);
          c.reduce_scatter(send, shard, gc::ReduceOp::max, s);
          gc::Buffer all = inputs(t, per, c.rank());
          c.all_reduce(all, all, gc::ReduceOp::min, s);
          gc::Buffer hier = inputs(t, per, c.rank());
          c.hierarchical_all_reduce(hier, hier, gc::ReduceOp::sum, s);
          s.synchronize();
          for (std::size_t i = 0; i < per; ++i) {
            wrong +=
                load(shard, i) != expected(gc::ReduceOp::max, c.size(), static_cast<std::size_t>(c.rank()) * per + i);
            wrong += load(all, i) != expected(gc::ReduceOp::min, c.size(), i);
            const double want = expected(gc::ReduceOp::sum, c.size(), i);
            wrong += std::abs(load(hier, i) - want) > (gc::is_floating(t) ? std::abs(want) * 1e-2 : 0.0);
          }
        }
        gc::Buffer mine = inputs(t, per, c.rank()), gathered(per * ranks, t);
        c.all_gather(mine, gathered, s);
        gc::Buffer bcast = inputs(t, per, c.rank());
        c.broadcast(bcast, c.size() - 1, s);
        s.synchronize();
        for (int r = 0; r < c.size(); ++r) {
          for (std::size_t i = 0; i < per; ++i)
            wrong += load(gathered, static_cast<std::size_t>(r) * per + i) != value(r, i);
        }
        for (std::size_t i = 0; i < per; ++i) wrong += load(bcast, i) != value(c.size() - 1, i);
      }
    });
    EXPECT_EQ(wrong, 0u) << "mix " << mix;
  }
}

// Large all-reduces (and reduce-scatters, all-gathers) run as a ring of point-to-point messages
// cut into 64 KiB segments, 16 in flight (from 64 KiB on 2 ranks, from (size - 2) x 512 KiB on more; below that on 4,
// 8 or 16 ranks, halving and doubling, cut the same way): every dtype and op, in and out of place, every mix of
// in-place (idle, up to 1 MiB) and worker (busy) ranks, counts that divide neither by the ranks nor by the segments,
// and more segments than slots. Inputs that are not small integers must come out as the same bytes on every rank.
TEST(Collectives, RingCollectivesAreExactAndTheSameBytesOnEveryRank) {
  auto& c = world();
  gc::Stream s;
  const std::size_t ring_from = c.size() == 2 ? (std::size_t{64} << 10) : std::size_t(c.size() - 2) << 19;
  const bool halving = c.size() == 4 || c.size() == 8 || c.size() == 16;
  // The all-reduce's ring on one node where halving does not apply: from max(384 KiB, (p - 2) x 256 KiB).
  const std::size_t ar_ring_from = c.size() == 2 || halving || c.nodes() > 1
                                       ? ring_from
                                       : std::max(std::size_t{384} << 10, std::size_t(c.size() - 2) << 18);
  std::size_t wrong = 0;
  for (int mix = 0; mix < 3; ++mix) {
    const bool busy = mix == 1 || (mix == 2 && c.rank() == 0);
    for_each_dtype([&](gc::DType t) {
      const std::size_t elem = gc::dtype_size(t);
      // Just above the ring's limit; above 1 MiB (on the worker); above 16 segments a rank (2 ranks);
      // halving and doubling (4 or 8 ranks) just above the inline limit and just below the ring's.
      const std::size_t mib = std::size_t{1} << 20;
      for (std::size_t bytes : {ar_ring_from + 3 * elem, mib + 5 * elem > ar_ring_from ? mib + 5 * elem : 0,
                                c.size() == 2 ? (std::size_t{33} << 16) + 7 * elem : 0,
                                halving ? (std::size_t{64} << 10) + 3 * elem : 0, halving ? ring_from - 5 * elem : 0}) {
        if (bytes == 0) continue;
        const std::size_t n = bytes / elem;
        for (auto op : {gc::ReduceOp::sum, gc::ReduceOp::average, gc::ReduceOp::max, gc::ReduceOp::min}) {
          if (op == gc::ReduceOp::average && !gc::is_floating(t)) continue;
          if (t != gc::DType::float32 && op != gc::ReduceOp::sum && op != gc::ReduceOp::max) continue;
          // On more ranks the ring starts at (size - 2) x 512 KiB: fewer combinations keep the test short.
          if (c.size() > 2 && mix != 2 && (t != gc::DType::float32 || op != gc::ReduceOp::sum)) continue;
          if (busy) keep_busy(s);
          gc::Buffer send = inputs(t, n, c.rank()), recv(n, t), in_place = inputs(t, n, c.rank());
          c.all_reduce(send, recv, op, s);
          c.all_reduce(in_place, in_place, op, s);
          // The hierarchical all-reduce's polled phases at the same sizes (worker and caller alike).
          gc::Buffer hier(n, t);
          c.hierarchical_all_reduce(send, hier, op, s);
          s.synchronize();
          for (std::size_t i = 0; i < n; ++i) {
            const double want = expected(op, c.size(), i);
            const double tol = op == gc::ReduceOp::average ? std::abs(want) * 1e-2 : 0.0;
            wrong += std::abs(load(recv, i) - want) > tol;
            wrong += std::abs(load(in_place, i) - want) > tol;
            wrong += std::abs(load(hier, i) - want) > tol;
            if (wrong > 0) break;
          }
          for (std::size_t i = 0; i < n; ++i) wrong += load(send, i) != value(c.rank(), i);  // send untouched
        }
      }
    });
    EXPECT_EQ(wrong, 0u) << "mix " << mix;
  }
  // Reduce-scatter, all-gather and broadcast take the ring from above the inline 16 KiB in all on 2
  // ranks (from (size - 2) x 512 KiB on more; reduce-scatter and all-gather on 3 ranks at every
  // size above their inline limits), every root; per-rank parts of more than 16 segments included.
  // On more ranks, from above the inline size (64 KiB on 4 or 8 ranks; on 3 all-gather 2 KiB,
  // broadcast 4 KiB, reduce-scatter 16 KiB) to the ring: halving and doubling (4 or 8 ranks), the
  // binomial tree broadcast.
  for (int mix = 0; mix < 3; ++mix) {
    const bool busy = mix == 1 || (mix == 2 && c.rank() == 0);
    for (auto t : {gc::DType::float32, gc::DType::float16, gc::DType::int64}) {
      const std::size_t elem = gc::dtype_size(t), ranks = static_cast<std::size_t>(c.size());
      const std::size_t other_from = c.size() == 2 ? 16384 : ring_from;
      const bool two = c.size() == 2;
      const bool power_of_two = (c.size() & (c.size() - 1)) == 0;
      const std::size_t inline_to = power_of_two ? 65536 : 2048;
      // Just above the other inline limits of a rank count that is not a power of two (broadcast, reduce-scatter).
      const std::size_t other_limits[] = {power_of_two ? 0 : 4096 / ranks / elem + 1,
                                          power_of_two ? 0 : 16384 / ranks / elem + 1};
      for (std::size_t per : {other_from / ranks / elem + 1, two ? (std::size_t{33} << 16) / elem + 3 : 0,
                              two ? 0 : inline_to / ranks / elem + 1, two ? 0 : (ring_from - 64) / ranks / elem,
                              other_limits[0], other_limits[1]}) {
        if (per == 0) continue;
        if (busy) keep_busy(s);
        gc::Buffer send = inputs(t, per * ranks, c.rank()), shard(per, t);
        c.reduce_scatter(send, shard, gc::ReduceOp::sum, s);
        gc::Buffer mine = inputs(t, per, c.rank()), gathered(per * ranks, t);
        c.all_gather(mine, gathered, s);
        gc::Buffer bcast = inputs(t, per * ranks, c.rank());
        c.broadcast(bcast, c.size() - 1 - mix % c.size(), s);
        s.synchronize();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < per * ranks; ++i) bad += load(bcast, i) != value(c.size() - 1 - mix % c.size(), i);
        for (std::size_t i = 0; i < per; ++i)
          bad += load(shard, i) != expected(gc::ReduceOp::sum, c.size(), static_cast<std::size_t>(c.rank()) * per + i);
        for (std::size_t r = 0; r < ranks; ++r) {
          for (std::size_t i = 0; i < per; ++i) bad += load(gathered, r * per + i) != value(static_cast<int>(r), i);
        }
        EXPECT_EQ(bad, 0u) << "mix " << mix << ", " << gc::dtype_name(t) << ", " << per << " per rank";
      }
    }
  }
  // Rounding: fractions in fp32 and fp16, summed in a different order per block, give each rank
  // the same bytes (compared as a checksum over the ranks).
  for (auto [t, from] : {std::pair{gc::DType::float32, ar_ring_from}, std::pair{gc::DType::float16, ar_ring_from},
                         std::pair{gc::DType::float32, halving ? std::size_t{64} << 10 : 0},
                         std::pair{gc::DType::float16, halving ? std::size_t{64} << 10 : 0}}) {
    if (from == 0) continue;
    const std::size_t n = from / gc::dtype_size(t) + 4099;
    gc::Buffer b(n, t);
    for (std::size_t i = 0; i < n; ++i) store(b, i, 1.0 / (3.0 + static_cast<double>((i * 7 + c.rank() * 13) % 101)));
    c.all_reduce(b, b, gc::ReduceOp::sum, s);
    s.synchronize();
    EXPECT_TRUE(same_bytes_on_every_rank(b)) << gc::dtype_name(t) << ": the ranks' results differ";
  }
}

// An all-reduce over 3 or more ranks on one node up to 16 MiB takes the direct all-reduce, sent
// with the agreement, or (agreeing by recursive doubling: GPUCLOUD_AGREEMENT=doubling) has two
// routes, the ring and the direct all-reduce, measured by rank 0 from the first calls (which
// alternate) and re-measured when the machine gets busier: both add in the ring's order, so
// repeated calls give the same bytes whichever runs (a rerun or a resumed job reproduces its sums),
// on every rank. A fresh communicator, so its first calls try both routes. (Forced to MPI's route,
// the sums are MPI's.)
TEST(Collectives, SumsOverThreeOrMoreRanksRepeatBitForBitOnEitherRoute) {
  const char* route = std::getenv("GPUCLOUD_COLLECTIVE_ROUTE");
  if (route != nullptr && std::string(route) == "mpi") GTEST_SKIP() << "MPI's own route forced";
  gc::Communicator c = gc::communicator_from_mpi(MPI_COMM_WORLD);
  if (c.size() < 3) GTEST_SKIP() << "2 ranks send their data with the agreement";
  gc::Stream s;
  for (auto [t, bytes] :
       {std::pair{gc::DType::float32, std::size_t{2} << 20}, std::pair{gc::DType::float16, (std::size_t{3} << 20) + 6},
        std::pair{gc::DType::bfloat16, (std::size_t{12} << 20) + 2}}) {
    const std::size_t n = bytes / gc::dtype_size(t);
    gc::Buffer in(n, t), first(n, t), out(n, t);
    for (std::size_t i = 0; i < n; ++i) {
      store(in, i, (i % 3 == 0 ? -1.0 : 1.0) / (3.0 + static_cast<double>((i * 7 + c.rank() * 13) % 101)));
    }
    std::size_t differ = 0;
    for (int call = 0; call < 10; ++call) {
      c.all_reduce(in, call == 0 ? first : out, gc::ReduceOp::sum, s);
      s.synchronize();
      if (call > 0) differ += std::memcmp(first.data(), out.data(), first.size_bytes()) != 0;
    }
    EXPECT_EQ(differ, 0u) << gc::dtype_name(t) << ": calls gave different bytes";
    EXPECT_TRUE(same_bytes_on_every_rank(first)) << gc::dtype_name(t) << ": the ranks' results differ";
  }
  // The reduce-scatter's ring and direct reduce-scatter alike.
  const std::size_t per = (std::size_t{3} << 20) / 4 / static_cast<std::size_t>(c.size()) + 5;
  gc::Buffer in(per * static_cast<std::size_t>(c.size()), gc::DType::float32), first(per, gc::DType::float32),
      out(per, gc::DType::float32);
  for (std::size_t i = 0; i < in.size(); ++i) {
    store(in, i, 1.0 / (3.0 + static_cast<double>((i * 7 + c.rank() * 13) % 101)));
  }
  std::size_t differ = 0;
  for (int call = 0; call < 10; ++call) {
    c.reduce_scatter(in, call == 0 ? first : out, gc::ReduceOp::sum, s);
    s.synchronize();
    if (call > 0) differ += std::memcmp(first.data(), out.data(), first.size_bytes()) != 0;
  }
  EXPECT_EQ(differ, 0u) << "reduce-scatter: calls gave different bytes";
}

// A fresh communicator's first calls of a routed collective alternate its two routes: the
// all-gather's, the broadcast's (every root) and the reduce-scatter's (on 3-16 ranks of one node
// the direct one) must each give the exact data on either.
TEST(Collectives, RoutedCollectivesAreExactOnEitherRoute) {
  gc::Communicator c = gc::communicator_from_mpi(MPI_COMM_WORLD);
  gc::Stream s;
  const std::size_t ranks = static_cast<std::size_t>(c.size());
  for (const std::size_t per : {(std::size_t{3} << 20) / 8 / ranks + 3, (std::size_t{1} << 20) / ranks + 1}) {
    for (int call = 0; call < 8; ++call) {  // (every rank makes every call, whatever it found)
      std::size_t bad = 0;
      gc::Buffer mine = inputs(gc::DType::int64, per, c.rank()), gathered(per * ranks, gc::DType::int64);
      c.all_gather(mine, gathered, s);
      const int root = call % c.size();
      gc::Buffer bcast = inputs(gc::DType::int64, per * ranks, c.rank());
      c.broadcast(bcast, root, s);
      gc::Buffer send = inputs(gc::DType::int64, per * ranks, c.rank()), shard(per, gc::DType::int64);
      c.reduce_scatter(send, shard, gc::ReduceOp::sum, s);
      s.synchronize();
      for (std::size_t r = 0; r < ranks; ++r) {
        for (std::size_t i = 0; i < per; ++i) bad += load(gathered, r * per + i) != value(static_cast<int>(r), i);
      }
      for (std::size_t i = 0; i < per * ranks; ++i) bad += load(bcast, i) != value(root, i);
      for (std::size_t i = 0; i < per; ++i) {
        bad += load(shard, i) != expected(gc::ReduceOp::sum, c.size(), static_cast<std::size_t>(c.rank()) * per + i);
      }
      EXPECT_EQ(bad, 0u) << per << " per rank, call " << call;
    }
  }
}

// The NCCL backend across the same ranks, one GPU each, when the machine has that many GPUs.
TEST(Collectives, NcclBackendAgreesWithTheExactAnswers) {
  auto& c = world();
  if (gc::cuda_device_count() < c.local_size()) {
    GTEST_SKIP() << "needs a GPU per rank of the node (" << c.local_size() << "), this machine has "
                 << gc::cuda_device_count() << " (" << gc::cuda_unavailable_reason() << ")";
  }
  if (!gc::build_info().nccl) GTEST_SKIP() << "built without NCCL (GPUCLOUD_NCCL=OFF or none found)";
  gc::Communicator nccl = gc::Communicator::nccl_from_mpi();
  EXPECT_EQ(nccl.backend(), gc::CommBackend::nccl);
  EXPECT_EQ(nccl.rank(), c.rank());
  EXPECT_EQ(nccl.size(), c.size());
  EXPECT_EQ(nccl.nodes(), c.nodes());
  gc::Stream s(nccl.device());
  std::size_t wrong = 0;
  for_each_dtype([&](gc::DType t) {
    for (auto op : {gc::ReduceOp::sum, gc::ReduceOp::average, gc::ReduceOp::max, gc::ReduceOp::min}) {
      if (op == gc::ReduceOp::average && !gc::is_floating(t)) continue;
      for (std::size_t n : kCounts) {
        gc::Buffer in = inputs(t, n, c.rank()), flat(n, t), hier(n, t);
        gc::Buffer d_in(n, t, nccl.device()), d_flat(n, t, nccl.device()), d_hier(n, t, nccl.device());
        gc::copy(d_in, in, s);
        nccl.all_reduce(d_in, d_flat, op, s);
        nccl.hierarchical_all_reduce(d_in, d_hier, op, s);
        gc::copy(flat, d_flat, s);
        gc::copy(hier, d_hier, s);
        s.synchronize();
        for (std::size_t i = 0; i < n; ++i) {
          const double want = expected(op, c.size(), i);
          const double tol = t == gc::DType::float16 || t == gc::DType::bfloat16 ? std::abs(want) * 1e-2 : 1e-9;
          wrong += std::abs(load(flat, i) - want) > tol;
          wrong += std::abs(load(hier, i) - want) > tol;
        }
      }
    }
  });
  EXPECT_EQ(wrong, 0u);
  // GPUCLOUD_COMM_CHECKS=1: ranks that disagree on the count get an error, not corrupted data.
  if (c.size() == 1) return;  // one rank cannot disagree
  setenv("GPUCLOUD_COMM_CHECKS", "1", 1);
  gc::Communicator checked = gc::Communicator::nccl_from_mpi();
  unsetenv("GPUCLOUD_COMM_CHECKS");
  gc::Buffer mismatched(static_cast<std::size_t>(c.rank()) + 1, gc::DType::float32, checked.device());
  EXPECT_THROW(checked.all_reduce(mismatched, mismatched, gc::ReduceOp::sum, s), gc::CommunicationError);
}

TEST(Collectives, CommunicatorFromTheCallersMpiCommunicator) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  // Even and odd ranks, each its own group: a collective on one must not see the other.
  MPI_Comm halves = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &halves), MPI_SUCCESS);
  {
    gc::Communicator c = gc::communicator_from_mpi(halves);
    const int members = (world_size + 1 - world_rank % 2) / 2;
    EXPECT_EQ(c.size(), members);
    EXPECT_EQ(c.rank(), world_rank / 2);
    gc::Stream s;
    gc::Buffer x(5, gc::DType::int64);
    for (std::size_t i = 0; i < 5; ++i) x.data_as<std::int64_t>()[i] = world_rank;
    c.all_reduce(x, x, gc::ReduceOp::sum, s);
    s.synchronize();
    std::int64_t want = 0;
    for (int r = world_rank % 2; r < world_size; r += 2) want += r;
    for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(x.data_as<std::int64_t>()[i], want);
  }
  MPI_Comm_free(&halves);  // the gpucloud communicator used a duplicate: freeing ours is fine
  EXPECT_THROW(gc::Communicator::mpi(-7), gc::InvalidArgument);
  EXPECT_THROW(gc::Communicator::mpi(1 << 30), gc::InvalidArgument);
}

TEST(Collectives, SubCommunicatorsKeepTheWorldsNodes) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm parity = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &parity), MPI_SUCCESS);
  {
    gc::Communicator c = gc::communicator_from_mpi(parity);
    const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE");
    if (forced != nullptr && *forced != '\0') {
      const int local = std::atoi(forced);
      std::set<int> nodes;
      for (int r = world_rank % 2; r < world_size; r += 2) nodes.insert(r / local);
      EXPECT_EQ(c.nodes(), static_cast<int>(nodes.size()));
      EXPECT_EQ(c.node(), static_cast<int>(std::distance(nodes.begin(), nodes.find(world_rank / local))));
    } else {
      // Real nodes (one machine, or network namespaces as nodes): each world rank's node is its
      // shared-memory group, named by the group's lowest world rank; the sub-communicator must
      // see the nodes its own ranks live on.
      MPI_Comm shm = MPI_COMM_NULL;
      ASSERT_EQ(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &shm),
                MPI_SUCCESS);
      int leader = world_rank;
      MPI_Allreduce(&world_rank, &leader, 1, MPI_INT, MPI_MIN, shm);
      std::vector<int> leaders(static_cast<std::size_t>(world_size));
      MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
      MPI_Comm_free(&shm);
      std::set<int> nodes;
      for (int r = world_rank % 2; r < world_size; r += 2) nodes.insert(leaders[static_cast<std::size_t>(r)]);
      EXPECT_EQ(c.nodes(), static_cast<int>(nodes.size()));
    }
    gc::Stream s;
    gc::Buffer x = inputs(gc::DType::int32, 7, world_rank);
    gc::Buffer y = inputs(gc::DType::int32, 7, world_rank);
    c.hierarchical_all_reduce(x, x, gc::ReduceOp::sum, s);
    c.all_reduce(y, y, gc::ReduceOp::sum, s);
    s.synchronize();
    for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(load(x, i), load(y, i));
  }
  MPI_Comm_free(&parity);
}
