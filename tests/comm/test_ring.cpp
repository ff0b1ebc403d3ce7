// The MPI backend's point-to-point schedules on their own (src/comm/mpi/ring.hpp), on however many
// ranks mpirun starts: the ring all-reduce, its two halves run one after the other (the
// hierarchical all-reduce's node phases), recursive halving and doubling (power-of-two rank
// counts) and its halves (their reduce-scatter and all-gather), reduce-scatter, all-gather, and
// broadcast along the chain and the binomial tree, and the direct all-reduce (3+ ranks) against
// the ring's bytes; and the order in which the agreement reduces inline data. Which one a
// collective takes depends on the
// size and the nodes (test_collectives covers the routing); here every schedule runs at every
// size, so none goes untested on a rank count the routing never gives it.
#include "comm/host_reduce.hpp"
#include "comm/mpi/ring.hpp"

#include <gpucloud/comm/mpi_interop.hpp>
#include <gpucloud/detail/float_bits.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace gc = gpucloud;
namespace gd = gpucloud::detail;

namespace {

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

std::int32_t value(int rank, std::int64_t i) { return static_cast<std::int32_t>((i * 7 + rank * 13) % 1000 - 500); }

// Runs one schedule to completion on a duplicate of MPI_COMM_WORLD.
void run(gd::RingKind kind, const void* send, void* recv, std::int64_t n, gc::DType t, gc::ReduceOp op, int root = 0,
         gd::RingSteps steps = gd::RingSteps::all, bool one_node = false) {
  static std::vector<unsigned char> scratch(gd::kRingScratchBytes);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    gd::RingCollective ring(kind, send, recv, n, t, op, comm, rank_of(), size_of(), scratch.data(), root, steps,
                            one_node);
    for (unsigned k = 1; !ring.test(); ++k) {
      if (k % 4 == 0) std::this_thread::yield();
    }
  }
  MPI_Comm_free(&comm);
}

bool power_of_two() {
  const int p = size_of();
  return p >= 4 && p <= 16 && (p & (p - 1)) == 0;
}

// Element counts: fewer than the ranks, not dividing by them, one segment per block, more segments
// than slots.
std::vector<std::int64_t> counts() {
  const std::int64_t p = size_of(), seg = static_cast<std::int64_t>(gd::kRingSegmentBytes / 4);
  return {1, p + 1, seg * p / 2 + 3, 3 * seg * p / 2 + 7, (gd::kRingSlots + 3) * seg * p + 5};
}

}  // namespace

TEST(RingSchedules, AllReducesAreExactInAndOutOfPlace) {
  const int p = size_of(), me = rank_of();
  std::vector<gd::RingKind> kinds = {gd::RingKind::all_reduce};
  if (power_of_two()) kinds.push_back(gd::RingKind::all_reduce_halving);
  for (const std::int64_t n : counts()) {
    std::vector<std::int32_t> send(static_cast<std::size_t>(n)), want(send.size());
    for (std::int64_t i = 0; i < n; ++i) {
      send[static_cast<std::size_t>(i)] = value(me, i);
      for (int r = 0; r < p; ++r) want[static_cast<std::size_t>(i)] += value(r, i);
    }
    for (const auto kind : kinds) {
      for (const int form : {0, 1, 2, 3}) {  // whole or halves, by block or (one node, halving) by range
        const bool halves = form % 2 == 1, one_node = form >= 2;
        if (one_node && kind != gd::RingKind::all_reduce_halving) continue;
        const auto run = [one_node](gd::RingKind k, const void* in, void* out, std::int64_t count, gc::DType t,
                                    gc::ReduceOp op, int root = 0, gd::RingSteps steps = gd::RingSteps::all) {
          ::run(k, in, out, count, t, op, root, steps, one_node);
        };
        std::vector<std::int32_t> out(send.size(), -1), in_place = send;
        if (halves) {  // the reduce-scatter half, then the all-gather half: the whole all-reduce
          run(kind, send.data(), out.data(), n, gc::DType::int32, gc::ReduceOp::sum, 0,
              gd::RingSteps::reduce_scatter_half);
          // Only this rank's block need hold its sum: the all-gather half must not read the others.
          const std::int64_t q = n / p, m = n % p, begin = me * q + std::min<std::int64_t>(me, m),
                             end = begin + q + (me < m ? 1 : 0);
          for (std::int64_t i = 0; i < n; ++i) {
            if (i < begin || i >= end) out[static_cast<std::size_t>(i)] = -7;
          }
          run(kind, out.data(), out.data(), n, gc::DType::int32, gc::ReduceOp::sum, 0, gd::RingSteps::all_gather_half);
        } else {
          run(kind, send.data(), out.data(), n, gc::DType::int32, gc::ReduceOp::sum);
        }
        run(kind, in_place.data(), in_place.data(), n, gc::DType::int32, gc::ReduceOp::sum);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < send.size(); ++i) {
          wrong += out[i] != want[i];
          wrong += in_place[i] != want[i];
          wrong += send[i] != value(me, static_cast<std::int64_t>(i));  // send untouched
        }
        EXPECT_EQ(wrong, 0u) << "kind " << static_cast<int>(kind) << ", halves " << halves << ", one node " << one_node
                             << ", n " << n;
      }
    }
  }
}

TEST(RingSchedules, FractionsComeOutAsTheSameBytesOnEveryRank) {
  const int me = rank_of();
  std::vector<gd::RingKind> kinds = {gd::RingKind::all_reduce};
  if (power_of_two()) kinds.push_back(gd::RingKind::all_reduce_halving);
  for (const auto kind : kinds) {
    for (const gc::DType t : {gc::DType::float32, gc::DType::float16}) {
      for (const bool one_node : {false, true}) {
        if (one_node && kind != gd::RingKind::all_reduce_halving) continue;
        const std::int64_t n = counts()[one_node ? 2 : 3];  // one segment a block (halving by range), more
        const std::size_t elem = gc::dtype_size(t);
        std::vector<unsigned char> data(static_cast<std::size_t>(n) * elem);
        for (std::int64_t i = 0; i < n; ++i) {
          const float x = 1.0f / static_cast<float>(3 + (i * 7 + me * 13) % 101);
          if (t == gc::DType::float32) {
            std::memcpy(data.data() + i * 4, &x, 4);
          } else {
            const std::uint16_t h = gd::float_to_half_bits(x);
            std::memcpy(data.data() + i * 2, &h, 2);
          }
        }
        run(kind, data.data(), data.data(), n, t, gc::ReduceOp::sum, 0, gd::RingSteps::all, one_node);
        std::uint64_t sum = 0;
        for (const unsigned char b : data) sum = sum * 1099511628211ull + b;
        std::uint64_t low = sum, high = sum;
        MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        EXPECT_EQ(low, high) << "kind " << static_cast<int>(kind) << ", " << gc::dtype_name(t) << ", one node "
                             << one_node;
      }
    }
  }
}

// Runs a DirectAllReduce to completion on a duplicate of MPI_COMM_WORLD.
void run_direct(const void* send, void* recv, std::int64_t n, gc::DType t, gc::ReduceOp op, bool scatter_only = false) {
  std::vector<unsigned char> workspace(gd::DirectAllReduce::workspace_bytes(n, t, size_of()) + 1);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    gd::DirectAllReduce d(send, recv, n, t, op, comm, rank_of(), size_of(), workspace.data(), scatter_only);
    for (unsigned k = 1; !d.test(); ++k) {
      if (k % 4 == 0) std::this_thread::yield();
    }
  }
  MPI_Comm_free(&comm);
}

// The direct all-reduce (3 or more ranks) is the ring's other route: it must give the ring's bytes
// exactly (and its first round the ring reduce-scatter's), for sums whose rounding depends on the order (fractions in
// fp32, fp16, bf16), for max over them, for exact integer sums, in and out of place, at counts that leave blocks empty
// or uneven, with send untouched.
TEST(RingSchedules, TheDirectAllReduceGivesTheRingsBytes) {
  const int p = size_of(), me = rank_of();
  if (p < 3) GTEST_SKIP() << "the direct all-reduce runs on 3 to 16 ranks";
  for (const std::int64_t n : {std::int64_t{1}, static_cast<std::int64_t>(p) + 1, counts()[2], counts()[3]}) {
    for (const gc::DType t : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16, gc::DType::int32}) {
      for (const auto op : {gc::ReduceOp::sum, gc::ReduceOp::max}) {
        const std::size_t elem = gc::dtype_size(t), bytes = static_cast<std::size_t>(n) * elem;
        std::vector<unsigned char> send(bytes);
        for (std::int64_t i = 0; i < n; ++i) {
          const float x = 1.0f / static_cast<float>(3 + (i * 7 + me * 13) % 101) * (i % 3 == 0 ? -1.0f : 1.0f);
          if (t == gc::DType::float32) {
            std::memcpy(send.data() + i * 4, &x, 4);
          } else if (t == gc::DType::int32) {
            const std::int32_t v = value(me, i);
            std::memcpy(send.data() + i * 4, &v, 4);
          } else {
            const std::uint16_t h = t == gc::DType::float16 ? gd::float_to_half_bits(x) : gd::float_to_bfloat16_bits(x);
            std::memcpy(send.data() + i * 2, &h, 2);
          }
        }
        std::vector<unsigned char> ring(bytes), direct(bytes, 0xab), in_place = send;
        run(gd::RingKind::all_reduce, send.data(), ring.data(), n, t, op);
        run_direct(send.data(), direct.data(), n, t, op);
        run_direct(in_place.data(), in_place.data(), n, t, op);
        EXPECT_EQ(std::memcmp(ring.data(), direct.data(), bytes), 0)
            << gc::dtype_name(t) << ", op " << static_cast<int>(op) << ", n " << n;
        EXPECT_EQ(std::memcmp(ring.data(), in_place.data(), bytes), 0)
            << "in place: " << gc::dtype_name(t) << ", op " << static_cast<int>(op) << ", n " << n;
        if (t == gc::DType::int32 && op == gc::ReduceOp::sum) {
          std::size_t wrong = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            std::int32_t got = 0, want = 0;
            std::memcpy(&got, direct.data() + i * 4, 4);
            for (int r = 0; r < p; ++r) want += value(r, i);
            wrong += got != want;
          }
          EXPECT_EQ(wrong, 0u) << "n " << n;
        }
        std::vector<unsigned char> again(bytes);  // send untouched: the same result again
        run_direct(send.data(), again.data(), n, t, op);
        EXPECT_EQ(std::memcmp(again.data(), direct.data(), bytes), 0);
        // The reduce-scatter's first round alone: n elements per rank, RingKind::reduce_scatter's bytes.
        std::vector<unsigned char> all(bytes * static_cast<std::size_t>(p));
        for (int b = 0; b < p; ++b) std::memcpy(all.data() + static_cast<std::size_t>(b) * bytes, send.data(), bytes);
        for (std::size_t i = 0; i < all.size(); i += 2 * elem) all[i] ^= static_cast<unsigned char>(i / bytes + 1);
        std::vector<unsigned char> ring_block(bytes), direct_block(bytes, 0xcd);
        run(gd::RingKind::reduce_scatter, all.data(), ring_block.data(), n, t, op);
        run_direct(all.data(), direct_block.data(), n * p, t, op, /*scatter_only=*/true);
        EXPECT_EQ(std::memcmp(ring_block.data(), direct_block.data(), bytes), 0)
            << "reduce-scatter: " << gc::dtype_name(t) << ", op " << static_cast<int>(op) << ", n " << n;
      }
    }
  }
}

TEST(RingSchedules, ReduceScatterAllGatherAndBroadcastFromEveryRoot) {
  const int p = size_of(), me = rank_of();
  for (const std::int64_t per : counts()) {
    std::vector<std::int32_t> send(static_cast<std::size_t>(per * p)), shard(static_cast<std::size_t>(per));
    for (std::int64_t i = 0; i < per * p; ++i) send[static_cast<std::size_t>(i)] = value(me, i);
    run(gd::RingKind::reduce_scatter, send.data(), shard.data(), per, gc::DType::int32, gc::ReduceOp::sum);
    std::vector<std::int32_t> mine(static_cast<std::size_t>(per)), all(static_cast<std::size_t>(per * p));
    for (std::int64_t i = 0; i < per; ++i) mine[static_cast<std::size_t>(i)] = value(me, i);
    run(gd::RingKind::all_gather, mine.data(), all.data(), per, gc::DType::int32, gc::ReduceOp::sum);
    std::size_t wrong = 0;
    for (std::int64_t i = 0; i < per; ++i) {
      std::int32_t want = 0;
      for (int r = 0; r < p; ++r) want += value(r, me * per + i);
      wrong += shard[static_cast<std::size_t>(i)] != want;
      for (int r = 0; r < p; ++r) wrong += all[static_cast<std::size_t>(r * per + i)] != value(r, i);
    }
    for (const auto kind : {gd::RingKind::broadcast, gd::RingKind::broadcast_tree}) {
      for (int root = 0; root < p; ++root) {
        std::vector<std::int32_t> b = mine;
        run(kind, b.data(), b.data(), per, gc::DType::int32, gc::ReduceOp::sum, root);
        for (std::int64_t i = 0; i < per; ++i) wrong += b[static_cast<std::size_t>(i)] != value(root, i);
      }
    }
    EXPECT_EQ(wrong, 0u) << per << " per rank";
  }
}

// Inline collectives (up to 64 KiB: reduced inside the agreement, by recursive doubling or, on one
// node, all-to-all) reduce in recursive doubling's order: the ranks from the largest power of two p
// up folded into rank - p, then a balanced tree over p, each pair (lower rank's side) op (higher
// rank's side). Fractions in fp32, fp16 and bf16 come out as exactly the bytes of that order,
// computed here from every rank's values, for all-reduces (below and above the size at which the
// all-to-all form splits them into two rounds, and counts that do not divide by the ranks) and
// reduce-scatters, whichever form this layout takes.
TEST(RingSchedules, InlineSumsAddInRecursiveDoublingsOrder) {
  gc::Communicator c = gc::communicator_from_mpi(MPI_COMM_WORLD);
  gc::Stream s;
  const int p = size_of();
  const auto fraction = [](int r, std::int64_t i) {
    return static_cast<float>((i % 3 == 0 ? -1.0 : 1.0) / (3.0 + static_cast<double>((i * 7 + r * 13) % 101)));
  };
  const auto values = [&](int r, std::int64_t n, gc::DType t) {  // rank r's n values in dtype t, as bytes
    std::vector<unsigned char> v(static_cast<std::size_t>(n) * gc::dtype_size(t));
    for (std::int64_t i = 0; i < n; ++i) {
      const float f = fraction(r, i);
      if (t == gc::DType::float32) {
        std::memcpy(v.data() + i * 4, &f, 4);
      } else {
        const std::uint16_t h = t == gc::DType::float16 ? gd::float_to_half_bits(f) : gd::float_to_bfloat16_bits(f);
        std::memcpy(v.data() + i * 2, &h, 2);
      }
    }
    return v;
  };
  // Every rank's n values from element @p at, reduced in recursive doubling's order.
  const auto expected = [&](std::int64_t at, std::int64_t n, std::int64_t whole, gc::DType t) {
    std::vector<std::vector<unsigned char>> v;
    for (int r = 0; r < p; ++r) {
      auto all = values(r, whole, t);
      v.emplace_back(all.begin() + at * static_cast<std::int64_t>(gc::dtype_size(t)),
                     all.begin() + (at + n) * static_cast<std::int64_t>(gc::dtype_size(t)));
    }
    int q = 1;
    while (q * 2 <= p) q *= 2;
    const auto op = [&](int lo, int hi) {
      gd::reduce_elements(v[static_cast<std::size_t>(lo)].data(), v[static_cast<std::size_t>(hi)].data(),
                          v[static_cast<std::size_t>(lo)].data(), n, t, gc::ReduceOp::sum);
    };
    for (int r = 0; r + q < p; ++r) op(r, r + q);
    for (int mask = 1; mask < q; mask *= 2) {
      for (int r = 0; r < q; r += 2 * mask) op(r, r + mask);
    }
    return v[0];
  };
  for (gc::DType t : {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16}) {
    const auto elem = static_cast<std::int64_t>(gc::dtype_size(t));
    for (std::int64_t bytes : {std::int64_t{4096}, std::int64_t{16384} + 8 * p + 4, std::int64_t{65536} - 12}) {
      const std::int64_t n = bytes / elem;
      gc::Buffer b(static_cast<std::size_t>(n), t);
      const auto mine = values(rank_of(), n, t);
      std::memcpy(b.data(), mine.data(), mine.size());
      c.all_reduce(b, b, gc::ReduceOp::sum, s);
      s.synchronize();
      const auto want = expected(0, n, n, t);
      EXPECT_TRUE(std::memcmp(b.data(), want.data(), want.size()) == 0)
          << gc::dtype_name(t) << ", " << n << " elements: not recursive doubling's sum";
    }
    const std::int64_t per = 4000 / elem / p + 3;  // a reduce-scatter's block
    gc::Buffer in(static_cast<std::size_t>(per * p), t), out(static_cast<std::size_t>(per), t);
    const auto mine = values(rank_of(), per * p, t);
    std::memcpy(in.data(), mine.data(), mine.size());
    c.reduce_scatter(in, out, gc::ReduceOp::sum, s);
    s.synchronize();
    const auto want = expected(rank_of() * per, per, per * p, t);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size()), 0)
        << gc::dtype_name(t) << ": the reduce-scatter's block is not recursive doubling's sum";
  }
}

int main(int argc, char** argv) {
  int provided = 0;  // (a Communicator's stream workers need MPI_THREAD_MULTIPLE)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank_of() != 0) {  // one rank reports; every rank's failures still fail the exit status
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
