// The MPI backend's collectives: host buffers; every collective after an agreement of the ranks
// on it. Small ones travel inside the agreement, large ones (on 2 ranks reduce-scatters and
// all-reduces above 16 MiB; from (p - 2) x 512 KiB on more, all-reduces on one node from
// max(384 KiB, (p - 2) x 256 KiB)) in a polled ring of point-to-point messages, all-reduces on 4,
// 8 or 16 ranks below that (or on several nodes) in polled halving and doubling, reduce-scatters
// and all-gathers on one node in halving/doubling or the ring at every size, broadcasts on 3+
// ranks in a binomial tree, broadcasts, all-gathers and all-reduces on 2 ranks (the all-reduce up to
// 16 MiB), and these and reduce-scatters up to 16 MiB on 3-16 ranks of one node (the reductions
// where the ring applies, as the direct route), as sends that go with the agreement
// (DirectTransfer; all on the caller's thread when the stream is idle), the rest in MPI's blocking
// collectives on the stream's worker under a watchdog; fp16/bf16 reduce through custom MPI ops.
// Each polled schedule but those sent with the agreement has a second route, MPI's nonblocking
// collective polled the same way (the all-reduce's and reduce-scatter's ring on 3-16 ranks of one
// node up to 16 MiB agreeing by recursive doubling: direct messages with the ring's bits), taken
// when rank 0's timings say it is faster (route_choice.hpp; c.route_now).
#include "comm/mpi/mpi_communicator.hpp"

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/host_checks.hpp"
#include "comm/host_reduce.hpp"
#include "comm/mpi/mpi_types.hpp"
#include "memory/access.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <string>

namespace gpucloud::detail {

namespace {

void check_host(BufferView v, StreamView s, const char* call, const char* arg) {
  detail::check_host_buffer(v, s, call, arg, "the MPI backend");
}

void check_reduction(ReduceOp op, DType t, const char* call) {
  (void)mpi_type(t, call);
  detail::check_reducible(op, t, call);
}

// The checks all_reduce and hierarchical_all_reduce share.
void check_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream, const char* call) {
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                   "recv: must match send's dtype and size");
  check_reduction(op, send.dtype(), call);
}

// Bytes of the agreement's payload a collective of @p n elements per rank, @p parts of them in
// all, needs; more than kInlineBytes when it should not travel inline. All-reduces go inline up
// to kInlineBytes (64 KiB): each exchange round moves the whole vector, as MPI's recursive
// doubling does (2 ranks, 32 KiB: 3.9-5.3 µs over the raw call inline, 9.5-24 after the
// agreement). Reduce-scatter, all-gather and broadcast too on 4, 8, 16, ... ranks, where each
// round carries only what its receiver needs (Rounds; 4 ranks, 16-64 KiB: 10-22 µs over the raw
// call inline, 20-38 after the agreement by halving and doubling); on 2 ranks up to 16 KiB, where
// the ring after the agreement takes over (32 KiB: inline +2.5-3.3 µs, the ring +1.4-2.8, 64 KiB
// +4.7-6.0 against +1.2-3.5); on other rank counts every round moves all ranks' parts, which MPI's
// own algorithms do not: there a reduce-scatter up to 16 KiB in all, a broadcast up to 4 KiB, an
// all-gather up to 2 KiB (3 ranks, with the agreement's eager-sized pieces, three interleaved
// runs: reduce-scatter 4-16 KiB 1.34-1.90x raw inline against 0.72-1.17x after the agreement,
// broadcast 4 KiB 0.57-0.63x against 0.43x; all-gather 4 KiB the same either way, 8 KiB 0.45-0.57x
// inline against 0.65-0.69x, broadcast 16 KiB 0.27-0.30x against 0.48-0.53x). Where the agreement
// is all-to-all (3-16 ranks on one node: AllToAllAgreement), each rank sends only its part on any
// rank count, and reduce-scatters and all-gathers go inline up to kInlineBytes there too (3 ranks,
// 4-64 KiB, two interleaved runs, quiet and beside busy cores: all-gather 0.76-1.12x raw after the
// agreement against 1.19-2.05x inline, reduce-scatter 32-64 KiB 0.90-1.78x against 1.34-1.82x);
// broadcasts not (the root sends every rank the whole payload: 16-64 KiB quiet 0.43-0.69x
// inline against 0.78-0.87x).
std::size_t inline_other_limit(int size, Collective kind, bool all_to_all) {
  if (size == 2) return std::size_t{16} << 10;
  if ((size & (size - 1)) == 0) return kInlineBytes;
  if (all_to_all && kind != Collective::broadcast) return kInlineBytes;
  switch (kind) {
    case Collective::reduce_scatter:
      return std::size_t{16} << 10;
    case Collective::broadcast:
      return std::size_t{4} << 10;
    default:
      return std::size_t{2} << 10;
  }
}
std::size_t inline_size(std::int64_t n, int parts, DType t, std::size_t limit = kInlineBytes) {
  if (n > static_cast<std::int64_t>(limit)) return kInlineBytes + 1;
  const std::size_t bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(parts) * dtype_size(t);
  return bytes <= limit ? bytes : kInlineBytes + 1;
}

// memcpy, but an empty buffer's null address is fine.
void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

// Inline packing of a whole buffer, and unpacking of a reduction's result.
auto pack_whole(BufferView send) {
  return [send](MpiCommunicator&, unsigned char* payload) { copy_bytes(payload, send.data(), send.size_bytes()); };
}
auto unpack_reduced(BufferView recv, ReduceOp op) {
  return [recv, op](MpiCommunicator& c, const unsigned char* payload) {
    copy_bytes(recv.data(), payload, recv.size_bytes());
    if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
  };
}

// Runs a RingCollective over @p comm (the agreement's duplicate; for the hierarchical all-reduce's
// phases, the node's communicator or the one across nodes) in the communicator's scratch, waiting
// through @p poll (on the caller's thread, or on the worker under the watchdog; both against the
// timeout).
template <class Poll>
void run_ring(MpiCommunicator& c, const Poll& poll, MPI_Comm comm, detail::RingKind kind, const void* send, void* recv,
              std::int64_t n, DType t, ReduceOp op, int root = 0, detail::RingSteps steps = detail::RingSteps::all) {
  int rank = 0, size = 1;
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(comm, &size));
  const bool one_node = comm == c.local || comm == c.group || c.nodes == 1;
  detail::RingCollective ring(kind, send, recv, n, t, op, comm, rank, size, c.scratch(), root, steps, one_node);
  poll([&] { return ring.test(); });
}

// Waits for @p request through @p poll.
template <class Poll>
void wait_request(const Poll& poll, MPI_Request request) {
  poll([&] {
    int done = 0;
    GPUCLOUD_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  });
}

// Per-rank counts of reduce-scatter and all-gather go to MPI as one int.
void check_count(BufferView v, std::int64_t max_count, const char* call, const char* arg) {
  GPUCLOUD_EXPECTS(static_cast<std::int64_t>(v.size()) <= max_count, call,
                   std::string(arg) + ": " + std::to_string(v.size()) + " elements per rank exceed the MPI backend's " +
                       std::to_string(max_count) + " (MPI counts are int); split the call");
}

}  // namespace

void MpiCommunicator::all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::all_reduce";
  check_all_reduce(send, recv, op, stream, call);
  const auto n = static_cast<std::int64_t>(recv.size());
  // Large all-reduces run as a ring of polled point-to-point messages (faster than OpenMPI's tuned
  // call here, and abandonable on any thread); where it applies is the same on every rank.
  // 4, 8 or 16 ranks halve and double instead below the ring's sizes, or on more than one node;
  // other rank counts on one node take the ring from 384 KiB or more (all_reduce_ring_applies).
  // 2 ranks up to 16 MiB: two direct exchanges, the first sent with the agreement (below).
  const bool two_rank = detail::two_rank_all_reduce_applies(recv.size_bytes(), size, kInlineBytes);
  const bool halving = detail::halving_applies(recv.size_bytes(), size, nodes, kInlineBytes);
  const bool ring = !two_rank && detail::all_reduce_ring_applies(recv.size_bytes(), size, nodes, kInlineBytes);
  // 3-16 ranks on one node up to 16 MiB agreeing by recursive doubling: the ring, or two rounds of
  // direct messages (the same bits) when rank 0 measured them faster (route_choice.hpp).
  const bool direct_route = detail::all_reduce_direct_applies(recv.size_bytes(), size, nodes, kInlineBytes);
  // 3-16 ranks of one node agreeing all-to-all: the direct route always, its first round sent with
  // the agreement (sends_with_agreement).
  const bool direct_with_agreement = !two_rank && sends_with_agreement(Collective::all_reduce, recv.size_bytes());
  enqueue(
      stream, call,
      {Collective::all_reduce, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, 1, recv.dtype()), pack_whole(send), unpack_reduced(recv, op),
      [send, recv, op, n, ring, halving, two_rank, direct_with_agreement](MpiCommunicator& c, const auto& poll) {
        if (two_rank) {  // the other rank's half of its send for this rank's block, reduce, swap the results
          const int peer = 1 - c.rank;
          const std::size_t elem = dtype_size(recv.dtype());
          std::int64_t at = 0, len = 0, peer_at = 0, peer_len = 0;
          detail::direct_block(n, c.rank, at, len);
          detail::direct_block(n, peer, peer_at, peer_len);
          const auto bytes = [elem](std::int64_t k) { return static_cast<std::size_t>(k) * elem; };
          unsigned char* theirs = c.scratch();
          auto* out = static_cast<unsigned char*>(recv.data());
          const auto* mine = static_cast<const unsigned char*>(send.data()) + bytes(at);
          {
            detail::DirectTransfer in(nullptr, theirs, bytes(len), peer, c.agreement);
            poll([&] { return in.test(); });
          }
          if (peer < c.rank) {  // the lower rank's values first, as the ring: the same bits on both
            detail::reduce_elements(theirs, mine, out + bytes(at), len, recv.dtype(), op);
          } else {
            detail::reduce_elements(mine, theirs, out + bytes(at), len, recv.dtype(), op);
          }
          poll([&] { return c.early_sends_done(); });  // (in place, the other's result lands on it)
          detail::DirectTransfer result(out + bytes(at), nullptr, bytes(len), peer, c.agreement);
          detail::DirectTransfer other(nullptr, out + bytes(peer_at), bytes(peer_len), peer, c.agreement);
          poll([&] {
            const bool sent = result.test();
            return other.test() && sent;
          });
        } else if (direct_with_agreement) {  // this rank's values of each block went with its agreement
          detail::DirectAllReduce d(send.data(), recv.data(), n, recv.dtype(), op, c.agreement, c.rank, c.size,
                                    c.workspace(detail::DirectAllReduce::workspace_bytes(n, recv.dtype(), c.size)),
                                    false, /*values_sent=*/true);
          bool sent = false;
          poll([&] { return (sent = sent || c.early_sends_done()) && d.test(); });
        } else if ((ring || halving) && c.route_now == Route::mpi) {
          MPI_Request q;
          GPUCLOUD_MPI_CHECK(MPI_Iallreduce(send.data() == recv.data() ? MPI_IN_PLACE : send.data(), recv.data(),
                                            static_cast<int>(n), mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()),
                                            c.world, &q));
          wait_request(poll, q);
        } else if (c.route_now == Route::direct) {  // two rounds, the ring's bits
          detail::DirectAllReduce d(send.data(), recv.data(), n, recv.dtype(), op, c.agreement, c.rank, c.size,
                                    c.workspace(detail::DirectAllReduce::workspace_bytes(n, recv.dtype(), c.size)));
          poll([&] { return d.test(); });
        } else if (ring || halving) {
          run_ring(c, poll, c.agreement, ring ? detail::RingKind::all_reduce : detail::RingKind::all_reduce_halving,
                   send.data(), recv.data(), n, recv.dtype(), op);
        } else {
          const MPI_Datatype type = mpi_type(recv.dtype(), call);
          const std::size_t elem = dtype_size(recv.dtype());
          const bool in_place = send.data() == recv.data();
          c.in_pieces(n, [&](std::int64_t at, std::int64_t count) {
            auto* out = static_cast<unsigned char*>(recv.data()) + at * elem;
            const void* in = in_place ? MPI_IN_PLACE : static_cast<const unsigned char*>(send.data()) + at * elem;
            GPUCLOUD_MPI_CHECK(
                MPI_Allreduce(in, out, static_cast<int>(count), type, mpi_op(op, recv.dtype()), c.world));
          });
        }
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      ring || halving || two_rank ? recv.size_bytes() : 0,
      two_rank || direct_with_agreement ? Route::schedule : (direct_route ? Route::direct : Route::mpi),
      [send, n](MpiCommunicator& c) {  // each other rank's block of this rank's values, to it
        const std::size_t elem = dtype_size(send.dtype());
        for (int q = 0; q < c.size; ++q) {
          if (q == c.rank) continue;
          std::int64_t at = 0, len = 0;
          detail::ring_block(n, c.size, q, at, len);
          c.early_sends.emplace_back(
              static_cast<const unsigned char*>(send.data()) + static_cast<std::size_t>(at) * elem, nullptr,
              static_cast<std::size_t>(len) * elem, q, c.agreement);
        }
      });
}

void MpiCommunicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  check_all_reduce(send, recv, op, stream, call);
  const auto total = static_cast<std::int64_t>(send.size());
  enqueue(
      stream, call,
      {Collective::hierarchical_all_reduce, static_cast<std::int64_t>(op), -1, total,
       static_cast<std::int64_t>(send.dtype())},
      inline_size(total, 1, send.dtype()), pack_whole(send), unpack_reduced(recv, op),  // tiny: flat, inline
      [send, recv, op, total](MpiCommunicator& c, const auto& poll) {
        // No pieces: the phases' messages are segments, whatever the count (MPI counts are int).
        const std::size_t elem = dtype_size(send.dtype());
        const DType t = send.dtype();
        // Shards over the node's ranks, the first total % L one longer: the ring all-reduce's
        // blocks, so its two halves are phases (1) and (3).
        const std::int64_t L = c.grouping.group_size, me = c.grouping.group_rank;
        const std::int64_t shard = total / L + (me < total % L ? 1 : 0),
                           offset = me * (total / L) + std::min(me, total % L);
        unsigned char* mine = static_cast<unsigned char*>(recv.data()) + static_cast<std::size_t>(offset) * elem;
        // (1) reduce-scatter inside the node: this rank's shard of the sum into recv
        run_ring(c, poll, c.group, detail::RingKind::all_reduce, send.data(), recv.data(), total, t, op, 0,
                 detail::RingSteps::reduce_scatter_half);
        // (2) all-reduce of the shard among the ranks holding it on the other nodes, in place
        const std::size_t bytes = static_cast<std::size_t>(shard) * elem;
        const int groups = c.grouping.groups;
        const auto across = detail::halving_applies(bytes, groups, std::min(groups, c.nodes), 0)
                                ? detail::RingKind::all_reduce_halving
                                : detail::RingKind::all_reduce;
        run_ring(c, poll, c.group_cross, across, mine, mine, shard, t, op);
        // (3) all-gather inside the node
        run_ring(c, poll, c.group, detail::RingKind::all_reduce, recv.data(), recv.data(), total, t, op, 0,
                 detail::RingSteps::all_gather_half);
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      recv.size_bytes());  // every phase polled: on the caller's thread when idle, up to 1 MiB
}

void MpiCommunicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::reduce_scatter";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  check_reduction(op, send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  check_count(recv, max_count, call, "recv");
  const auto n = static_cast<std::int64_t>(recv.size());
  const std::size_t limit = inline_other_limit(size, Collective::reduce_scatter, all_to_all);
  const bool ring = detail::ring_applies_per_rank(send.size_bytes(), size, nodes, limit);
  // 4, 8 or 16 ranks below the ring's sizes: the halving all-reduce's first half, polled.
  const bool halving = detail::halving_applies(send.size_bytes(), size, 1, limit);
  // 3-16 ranks on one node up to 16 MiB where the ring runs: its other route is the direct
  // reduce-scatter (the ring's bits), not MPI's.
  const bool direct = ring && detail::direct_applies(send.size_bytes(), size, nodes, limit);
  // Where the agreement is all-to-all that route is the one, its round sent with the agreement.
  const bool with_agreement = direct && sends_with_agreement(Collective::reduce_scatter, send.size_bytes());
  enqueue(
      stream, call,
      {Collective::reduce_scatter, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, size, recv.dtype(), limit), pack_whole(send),
      [recv, op, n](MpiCommunicator& c, const unsigned char* payload) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(recv.dtype());
        copy_bytes(recv.data(), payload + static_cast<std::size_t>(c.rank) * bytes, bytes);
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      [send, recv, op, n, ring, halving, with_agreement](MpiCommunicator& c, const auto& poll) {
        if (with_agreement || c.route_now == Route::direct) {  // one round, the ring's bits
          const std::int64_t all = n * c.size;
          detail::DirectAllReduce d(send.data(), recv.data(), all, recv.dtype(), op, c.agreement, c.rank, c.size,
                                    c.workspace(detail::DirectAllReduce::workspace_bytes(all, recv.dtype(), c.size)),
                                    /*scatter_only=*/true, /*values_sent=*/with_agreement);
          poll([&] {
            const bool sent = !with_agreement || c.early_sends_done();  // (send and recv do not overlap)
            return d.test() && sent;
          });
        } else if ((ring || halving) && c.route_now == Route::mpi) {
          MPI_Request q;
          GPUCLOUD_MPI_CHECK(MPI_Ireduce_scatter_block(send.data(), recv.data(), static_cast<int>(n),
                                                       mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()), c.world,
                                                       &q));
          wait_request(poll, q);
        } else if (ring) {
          run_ring(c, poll, c.agreement, detail::RingKind::reduce_scatter, send.data(), recv.data(), n, recv.dtype(),
                   op);
        } else if (halving) {  // block `rank` of the partial results ends reduced: copied out
          unsigned char* partial = c.workspace(send.size_bytes());
          run_ring(c, poll, c.agreement, detail::RingKind::all_reduce_halving, send.data(), partial, n * c.size,
                   recv.dtype(), op, 0, detail::RingSteps::reduce_scatter_half);
          copy_bytes(recv.data(), partial + static_cast<std::size_t>(c.rank) * recv.size_bytes(), recv.size_bytes());
        } else {
          GPUCLOUD_MPI_CHECK(MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(n),
                                                      mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()), c.world));
        }
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      ring || halving ? send.size_bytes() : 0, with_agreement ? Route::schedule : (direct ? Route::direct : Route::mpi),
      [send, n](MpiCommunicator& c) {  // block q of this rank's values to each other rank q
        const std::size_t block = static_cast<std::size_t>(n) * dtype_size(send.dtype());
        for (int q = 0; q < c.size; ++q) {
          if (q == c.rank) continue;
          c.early_sends.emplace_back(
              static_cast<const unsigned char*>(send.data()) + static_cast<std::size_t>(q) * block, nullptr, block, q,
              c.agreement);
        }
      });
}

void MpiCommunicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  (void)mpi_type(send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  check_count(send, max_count, call, "send");
  const auto n = static_cast<std::int64_t>(send.size());
  const std::size_t limit = inline_other_limit(size, Collective::all_gather, all_to_all);
  const bool ring = detail::ring_applies_per_rank(recv.size_bytes(), size, nodes, limit);
  // 4, 8 or 16 ranks below the ring's sizes: the halving all-reduce's second half (recursive
  // doubling), polled.
  const bool doubling = detail::halving_applies(recv.size_bytes(), size, 1, limit);
  // On 2 ranks, and up to 16 MiB on 3-16 ranks of one node: each rank's block goes to every other
  // rank with its agreement (MpiCommunicator::sends_with_agreement).
  const bool with_agreement = sends_with_agreement(Collective::all_gather, recv.size_bytes());
  enqueue(
      stream, call, {Collective::all_gather, -1, -1, n, static_cast<std::int64_t>(send.dtype())},
      inline_size(n, size, send.dtype(), limit),
      [send](MpiCommunicator& c, unsigned char* payload) {  // into this rank's slot; the others 0
        const std::size_t slot = send.size_bytes(), at = static_cast<std::size_t>(c.rank) * slot;
        std::memset(payload, 0, slot * static_cast<std::size_t>(c.size));
        copy_bytes(payload + at, send.data(), slot);
      },
      [recv](MpiCommunicator&, const unsigned char* payload) { copy_bytes(recv.data(), payload, recv.size_bytes()); },
      [send, recv, n, ring, doubling, with_agreement](MpiCommunicator& c, const auto& poll) {
        if (with_agreement) {  // this rank's block went with its agreement: the others' into their slots
          const std::size_t block = send.size_bytes();
          auto* slots = static_cast<unsigned char*>(recv.data());
          std::deque<detail::DirectTransfer> receives;
          for (int q = 0; q < c.size; ++q) {
            if (q != c.rank)
              receives.emplace_back(nullptr, slots + static_cast<std::size_t>(q) * block, block, q, c.agreement);
          }
          copy_bytes(slots + static_cast<std::size_t>(c.rank) * block, send.data(), block);
          return poll([&] { return detail::all_complete(receives); });
        }
        if ((ring || doubling) && c.route_now == Route::mpi) {
          MPI_Request q;
          const MPI_Datatype type = mpi_type(send.dtype(), call);
          GPUCLOUD_MPI_CHECK(MPI_Iallgather(send.data(), static_cast<int>(n), type, recv.data(), static_cast<int>(n),
                                            type, c.world, &q));
          return wait_request(poll, q);
        }
        if (ring)
          return run_ring(c, poll, c.agreement, detail::RingKind::all_gather, send.data(), recv.data(), n, recv.dtype(),
                          ReduceOp::sum);
        if (doubling) {  // this rank's block in place, then the others'
          copy_bytes(static_cast<unsigned char*>(recv.data()) + static_cast<std::size_t>(c.rank) * send.size_bytes(),
                     send.data(), send.size_bytes());
          return run_ring(c, poll, c.agreement, detail::RingKind::all_reduce_halving, recv.data(), recv.data(),
                          n * c.size, recv.dtype(), ReduceOp::sum, 0, detail::RingSteps::all_gather_half);
        }
        const MPI_Datatype type = mpi_type(send.dtype(), call);
        GPUCLOUD_MPI_CHECK(
            MPI_Allgather(send.data(), static_cast<int>(n), type, recv.data(), static_cast<int>(n), type, c.world));
      },
      ring || doubling || with_agreement ? recv.size_bytes() : 0,
      with_agreement ? Route::schedule : Route::mpi,  // (sent with the agreement: one route)
      [send](MpiCommunicator& c) {                    // to every other rank (sent_with_agreement)
        for (int q = 0; q < c.size; ++q) {
          if (q != c.rank) c.early_sends.emplace_back(send.data(), nullptr, send.size_bytes(), q, c.agreement);
        }
      });
}

void MpiCommunicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  check_host(buffer, stream, call, "buffer");
  (void)mpi_type(buffer.dtype(), call);
  const auto n = static_cast<std::int64_t>(buffer.size());
  const std::size_t limit = inline_other_limit(size, Collective::broadcast, all_to_all);
  const bool ring = detail::ring_applies(buffer.size_bytes(), size, limit);
  const bool tree = detail::tree_applies(buffer.size_bytes(), size, limit);  // 3+ ranks, below the chain
  // On 2 ranks, and up to 16 MiB on 3-16 ranks of one node: the root's data goes to every rank with
  // its agreement (MpiCommunicator::sends_with_agreement).
  const bool with_agreement = sends_with_agreement(Collective::broadcast, buffer.size_bytes());
  enqueue(
      stream, call, {Collective::broadcast, -1, root, n, static_cast<std::int64_t>(buffer.dtype())},
      inline_size(n, 1, buffer.dtype(), limit),
      // The root's data; the others' zeros for the bitwise OR, except where Rounds shapes the
      // exchange: a rank's payload is then only ever overwritten by the whole of its holder's.
      [buffer, root](MpiCommunicator& c, unsigned char* payload) {
        if (c.rank == root) {
          copy_bytes(payload, buffer.data(), buffer.size_bytes());
        } else if (!Rounds::shapes(Collective::broadcast, c.size)) {
          std::memset(payload, 0, buffer.size_bytes());
        }
      },
      [buffer, root](MpiCommunicator& c, const unsigned char* payload) {  // the root's buffer has it
        if (c.rank != root) copy_bytes(buffer.data(), payload, buffer.size_bytes());
      },
      [buffer, root, n, ring, tree, with_agreement](MpiCommunicator& c, const auto& poll) {
        if (with_agreement) {  // the root's data went with its agreement
          if (c.rank == root) return;
          detail::DirectTransfer receive(nullptr, buffer.data(), buffer.size_bytes(), root, c.agreement);
          return poll([&] { return receive.test(); });
        }
        if ((ring || tree) && c.route_now == Route::mpi) {
          MPI_Request q;
          GPUCLOUD_MPI_CHECK(
              MPI_Ibcast(buffer.data(), static_cast<int>(n), mpi_type(buffer.dtype(), call), root, c.world, &q));
          return wait_request(poll, q);
        }
        if (ring || tree)
          return run_ring(c, poll, c.agreement, ring ? detail::RingKind::broadcast : detail::RingKind::broadcast_tree,
                          buffer.data(), buffer.data(), n, buffer.dtype(), ReduceOp::sum, root);
        const MPI_Datatype type = mpi_type(buffer.dtype(), call);
        const std::size_t elem = dtype_size(buffer.dtype());
        c.in_pieces(n, [&](std::int64_t at, std::int64_t count) {
          GPUCLOUD_MPI_CHECK(MPI_Bcast(static_cast<unsigned char*>(buffer.data()) + at * elem, static_cast<int>(count),
                                       type, root, c.world));
        });
      },
      ring || tree || with_agreement ? buffer.size_bytes() : 0,
      with_agreement ? Route::schedule : Route::mpi,  // (sent with the agreement: one route)
      [buffer](MpiCommunicator& c) {                  // the root's, to every other rank
        for (int q = 0; q < c.size; ++q) {
          if (q != c.rank) c.early_sends.emplace_back(buffer.data(), nullptr, buffer.size_bytes(), q, c.agreement);
        }
      });
}

void MpiCommunicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: the MPI backend runs on host streams");
  enqueue(
      stream, call, {Collective::barrier}, 0, [](MpiCommunicator&, unsigned char*) {},
      [](MpiCommunicator&, const unsigned char*) {},  // the agreement is the barrier
      [](MpiCommunicator& c, const auto&) { GPUCLOUD_MPI_CHECK(MPI_Barrier(c.world)); });
}

}  // namespace gpucloud::detail
