// Internal: the MPI backend of Communicator (not API). Every collective is issued through
// MpiCommunicator::enqueue: in one order per communicator, after the ranks' agreement
// (comm/mpi/agreement_exchange.hpp), on the caller's thread when the stream is idle and the
// collective is small (run_in_place), else on the stream's worker under the timeout's watchdog.
// The collectives themselves (which algorithm at which size) are in mpi_collectives.cpp, the
// polled point-to-point schedules in ring.hpp, the set-up in mpi_communicator.cpp.
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/agreement.hpp"
#include "comm/communicator_impl.hpp"
#include "comm/hierarchy.hpp"
#include "comm/mpi/agreement_exchange.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/ring.hpp"
#include "comm/mpi/route_choice.hpp"
#include "runtime/host/deadline.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace gpucloud::detail {

// How the job ends after a collective timed out (CommunicationError's message).
inline constexpr const char* kEnds =
    "the job ends at exit (MPI_Abort) since MPI cannot finalise with the collective pending";

// A collective of at most this many bytes in all that runs as a RingCollective runs on the
// caller's thread when the stream is idle (as inline collectives do); larger ones stay
// asynchronous on the worker, so a caller overlapping communication with compute is not held for
// the transfer.
inline constexpr std::size_t kInPlaceRingBytes = std::size_t{1} << 20;

// The MPI backend: the communicator's duplicate of the caller's MPI communicator, and the
// intra-node (local) and cross-node sub-communicators, built once. Enqueued work holds a
// shared_ptr to it, so a Communicator dropped while its collectives are queued stays alive until
// they have run.
struct MpiCommunicator final : Communicator::Impl, std::enable_shared_from_this<MpiCommunicator> {
  MPI_Comm world = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  // The hierarchical all-reduce's inner groups and the communicator across them: local and cross
  // themselves unless GPUCLOUD_HIERARCHY split the nodes (then communicators of their own).
  MPI_Comm group = MPI_COMM_NULL, group_cross = MPI_COMM_NULL;
  MPI_Comm agreement = MPI_COMM_NULL;  // world's duplicate, for the agreement's messages alone
  // The agreement's buffers (this rank's, and what peers send), made once and used under `order`:
  // 64 KiB each, allocated per call they cost page faults whenever malloc returns the top of its
  // heap to the system (2 ranks from Python, 32 KiB all-reduce: 35-50 µs instead of 17).
  std::unique_ptr<Agreement> own_agreement{new Agreement}, peer_agreement{new Agreement}, out_agreement{new Agreement};
  // What each other rank sends in an all-to-all agreement (AllToAllAgreement; by rank, null for
  // this one), made at the first.
  std::vector<std::unique_ptr<Agreement>> all_to_all_peers;
  std::vector<Agreement*> all_to_all_views;
  // Whether this communicator agrees all-to-all (set at its creation, the same on every rank).
  bool all_to_all = false;
  // Rank 0's measured choice of route for routed collectives (route_choice.hpp), or the one
  // GPUCLOUD_COLLECTIVE_ROUTE forces; and the route the collective now running takes (both under
  // `order`).
  RouteChooser routes;
  RoutePolicy route_policy = RoutePolicy::automatic;
  Route route_now = Route::schedule;
  // A routed collective's bytes for the route chooser (0: not routed) and its other route.
  struct Routing {
    std::size_t bytes = 0;
    Route other = Route::mpi;
  };
  // Elements per MPI call (MPI counts are int): larger all-reduces and broadcasts are split, larger
  // per-rank reduce-scatters and all-gathers are refused. GPUCLOUD_MPI_MAX_COUNT lowers it (tests).
  std::int64_t max_count = std::numeric_limits<int>::max();

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken communicator may still have an abandoned request in flight: freeing it, or the
    // agreement buffers it writes, is undefined, and the process is about to end the job anyway.
    if (finalized || broken) {
      (void)own_agreement.release();
      (void)peer_agreement.release();
      (void)out_agreement.release();
      for (auto& p : all_to_all_peers) (void)p.release();
      (void)ring_scratch.release();
      (void)halving_workspace.release();
      return;
    }
    if (group != local && group != MPI_COMM_NULL) MPI_Comm_free(&group);
    if (group_cross != cross && group_cross != MPI_COMM_NULL) MPI_Comm_free(&group_cross);
    for (MPI_Comm* c : {&agreement, &cross, &local, &world}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }

  // This rank's agreement on @p sig (in `own_agreement`; `order` held), for an AgreementExchange
  // to combine with the other ranks'. Every rank must agree on the operation, reduce op, root,
  // count and dtype (the header: each field as itself and negated, so max over ranks gives max and
  // -min); a mismatch is a CommunicationError on every rank instead of corrupted data, a hang or an
  // MPI abort. When @p inline_bytes fit, @p pack writes the payload, all @p inline_bytes of it
  // (all-gather and broadcast zero what is not this rank's: the ranks' slots are ORed together),
  // and a.high[5] holds the ranks; the payload is uninitialised beyond.
  template <class Pack>
  Agreement& make_agreement(const Signature& sig, std::size_t inline_bytes, const Pack& pack) {
    Agreement& a = *own_agreement;
    const bool inline_data = inline_bytes <= kInlineBytes;
    if (inline_data) pack(*this, a.payload);
    std::int64_t fields[kFields];
    detail::agreement_fields(sig, inline_data ? size : 0, fields);
    for (int i = 0; i < kFields; ++i) {
      a.high[i] = fields[i];
      a.low[i] = -fields[i];
    }
    return a;
  }

  // Drives a polled exchange (an AgreementExchange, a RingCollective) until @p test() is true. On
  // the stream's worker the core is yielded every kYieldEvery-th test while no thread waits for
  // the stream: the trainer's own thread may be computing and need the core (never yielding, a
  // polling worker starved it: 2-rank train_mlp 101-185 k samples/s against 190-215 k every 8th).
  // On the caller's thread (in place, or helping synchronize()), or with a thread waiting in
  // synchronize(), never: the waiter needs this done, and a yield to a CPU-bound process on the
  // same core gives it the rest of the scheduler's tick (2 ranks, each core shared with a busy
  // process: 2 MiB all-reduce 12-24 ms yielding every 8th test, 0.3-0.45 ms never). It throws the
  // timeout's CommunicationError once the collective has taken `timeout` since @p began, its
  // messages left to MPI: on the caller's thread that is the timeout; on the worker the watchdog's
  // deadline fires at the same time, and the throw ends the abandoned worker's loop (a blocking
  // MPI call would keep it spinning until the process ends).
  static constexpr unsigned kYieldEvery = 8;
  struct Poll {
    MpiCommunicator& c;
    const char* call;
    std::chrono::steady_clock::time_point began;
    bool on_worker = false;  // yields the core every kYieldEvery-th test (on the caller's thread never)
    template <class Test>
    void operator()(Test test) const {
      const std::chrono::milliseconds limit = c.timeout.load();
      for (unsigned tests = 1; !test(); ++tests) {
        if (std::chrono::steady_clock::now() - began >= limit) {
          std::rethrow_exception(c.timed_out(call, began, kEnds));
        }
        if (on_worker && tests % kYieldEvery == 0 && !HostStream::waited_for()) std::this_thread::yield();
      }
    }
  };

  // The ring all-reduce's scratch (kRingScratchBytes), made at its first use (`order` held) and,
  // like the agreement's buffers, never freed once a timeout broke the communicator.
  std::unique_ptr<unsigned char[]> ring_scratch;
  unsigned char* scratch() {
    if (!ring_scratch) ring_scratch.reset(new unsigned char[detail::kRingScratchBytes]);
    return ring_scratch.get();
  }
  // The halving reduce-scatter's whole vector of partial results, or the other ranks' blocks a
  // direct all-reduce receives (at least @p bytes), grown when a larger one comes (`order` held;
  // nothing is in flight then) and, like the scratch, never freed once a timeout broke the
  // communicator. At most 15 MiB (a direct all-reduce of 16 MiB on 16 ranks).
  std::unique_ptr<unsigned char[]> halving_workspace;
  std::size_t halving_workspace_bytes = 0;
  unsigned char* workspace(std::size_t bytes) {
    if (bytes > halving_workspace_bytes) {
      halving_workspace.reset();
      halving_workspace.reset(new unsigned char[bytes]);
      halving_workspace_bytes = bytes;
    }
    return halving_workspace.get();
  }

  // Collectives above the inline size whose data goes with the agreement: on 2 ranks the broadcast,
  // the all-gather and the all-reduce up to 16 MiB; on an all-to-all communicator (3-16 ranks of
  // one node) the same and the reduce-scatter up to kWithAgreementBytes (the reductions where the
  // direct route applies). The sender (the broadcast's root, every rank of the others) posts its
  // buffer to each receiver (a reduction: the receiver's block of send, the direct exchange's first
  // round) as a DirectTransfer, here, right behind its agreement messages instead of after the
  // agreement completed, and a receiver posts the receives only once the headers agree (the
  // collective's body: into its buffer, or the reduction's scratch). The wait saved is, on cores
  // shared with busy processes, often a scheduler tick (docs/collectives.md). On a disagreement
  // every rank holds the header of every rank that sent to it (the 2-rank exchange and the all-to-
  // all agreement both deliver them), so it drains exactly what each sent into the scratch
  // (drain_early): the sends complete, no data changes and no message is left for a later
  // collective. `order` held.
  static constexpr std::size_t kWithAgreementBytes = std::size_t{16} << 20;
  std::deque<detail::DirectTransfer> early_sends;
  // Whether a collective of @p kind above the inline size, whose data in all is @p bytes (an all-
  // gather's whole recv, a reduce-scatter's send), sends its data with its agreement (above). The
  // same on every rank.
  bool sends_with_agreement(Collective kind, std::size_t bytes) const {
    if (size == 2) {
      return kind == Collective::broadcast || kind == Collective::all_gather ||
             (kind == Collective::all_reduce && detail::two_rank_all_reduce_applies(bytes, size, kInlineBytes));
    }
    if (!all_to_all || bytes > kWithAgreementBytes) return false;
    if (kind == Collective::reduce_scatter) {  // where its ring runs (above the inline size: the caller's)
      return detail::direct_applies(bytes, size, nodes, 0) && detail::ring_applies_per_rank(bytes, size, nodes, 0);
    }
    return kind == Collective::broadcast || kind == Collective::all_gather ||
           (kind == Collective::all_reduce && detail::all_reduce_direct_applies(bytes, size, nodes, kInlineBytes));
  }
  // The bytes the rank @p sender, whose agreement header is @p fields, sent rank @p receiver with
  // it (0: none).
  std::size_t sent_with_agreement(const std::int64_t* fields, int sender, int receiver) const {
    if (fields[5] != 0 || sender == receiver) return 0;  // (inline data travels in the agreement itself)
    const auto kind = static_cast<Collective>(fields[0]);
    if (kind != Collective::broadcast && kind != Collective::all_gather && kind != Collective::all_reduce &&
        kind != Collective::reduce_scatter)
      return 0;
    const std::size_t elem = dtype_size(static_cast<DType>(fields[4]));
    const auto count = static_cast<std::size_t>(fields[3]);
    const bool per_rank = kind == Collective::all_gather || kind == Collective::reduce_scatter;
    const std::size_t all = per_rank ? count * elem * static_cast<std::size_t>(size) : count * elem;
    if (!sends_with_agreement(kind, all)) return 0;
    if (kind == Collective::broadcast) return fields[2] == sender ? count * elem : 0;
    if (per_rank) return count * elem;  // its block, or the receiver's block of its values
    std::int64_t offset = 0, length = 0;
    detail::ring_block(fields[3], size, receiver, offset, length);  // the receiver's block
    return static_cast<std::size_t>(length) * elem;
  }
  // Whether this rank's sends with its agreement have completed.
  bool early_sends_done() { return detail::all_complete(early_sends); }
  // After a disagreement: receives into the scratch, and drops, the data each other rank sent with
  // its agreement (its header, in peer_agreement or all_to_all_peers, says how much: one
  // DirectTransfer), through @p poll, calling @p progress (this rank's own early sends) as it waits.
  template <class Progress>
  void drain_early(const Poll& poll, const Progress& progress) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const Agreement& theirs = all_to_all ? *all_to_all_views[static_cast<std::size_t>(peer)] : *peer_agreement;
      const std::size_t bytes = sent_with_agreement(theirs.high, peer, rank);
      for (std::size_t at = 0; at < bytes; at += detail::kDirectPieceBytes) {  // DirectTransfer's messages
        const auto n = static_cast<int>(std::min(detail::kDirectPieceBytes, bytes - at));
        MPI_Request request;
        GPUCLOUD_MPI_CHECK(MPI_Irecv(scratch(), n, MPI_BYTE, peer, detail::kDirectTag, agreement, &request));
        poll([&] {
          int done = 0;
          (void)progress();
          GPUCLOUD_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
          return done != 0;
        });
      }
    }
  }

  // A collective run by the calling thread when @p stream is idle and no other collective of this
  // communicator is in flight: no hand-off to the worker, which on busy cores costs more than the
  // message. Either its data fits in the agreement (@p inline_bytes: the agreement is the whole
  // collective, @p unpack reads the result) or @p body only polls MPI (a RingCollective, or MPI's
  // nonblocking collective). Both are polled against the timeout instead of the watchdog; after a
  // timeout the pending messages are left to MPI (their buffers never freed: the missing rank may
  // still write them) and the stream holds the CommunicationError, as when the worker's call is
  // abandoned. False: enqueue it.
  template <class Pack, class Unpack, class Body, class Early>
  bool run_in_place(StreamView stream, const char* call, const Signature& sig, std::size_t inline_bytes,
                    Routing routing, const Pack& pack, const Unpack& unpack, const Body& body, const Early& early) {
    std::unique_lock<std::mutex> lock(order, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    return static_cast<detail::HostStream&>(*stream.impl()).run_now_if_idle([&] {
      run_on_caller(call, sig, inline_bytes, routing, pack, unpack, body, early);
    });
  }
  // The collective on the calling thread (`order` held), polled against the timeout.
  template <class Pack, class Unpack, class Body, class Early>
  void run_on_caller(const char* call, const Signature& sig, std::size_t inline_bytes, Routing routing,
                     const Pack& pack, const Unpack& unpack, const Body& body, const Early& early) {
    detail::NvtxRange range(call);
    check_usable(call);
    const Poll poll{*this, call, std::chrono::steady_clock::now()};
    run_agreed(poll, sig, inline_bytes, routing, pack, unpack, body, early);
  }

  // The collective, `order` held: the agreement (with rank 0's route when @p routing's bytes are
  // not 0), then the inline result or @p body, all waited for through @p poll; rank 0 times a routed
  // body for the route chooser.
  template <class Pack, class Unpack, class Body, class Early>
  void run_agreed(const Poll& poll, const Signature& sig, std::size_t inline_bytes, Routing routing, const Pack& pack,
                  const Unpack& unpack, const Body& body, const Early& early) {
    Agreement& a = make_agreement(sig, inline_bytes, pack);
    a.route = rank == 0 && routing.bytes != 0 ? static_cast<std::int64_t>(pick_route(sig.kind, routing)) : -1;
    bool early_sent = false;  // (read before the exchange combines the other ranks' headers into a)
    for (int q = 0; q < size && !early_sent; ++q) early_sent = sent_with_agreement(a.high, rank, q) != 0;
    early_sends.clear();  // (the last collective's completed: it waited for them, or broke the communicator)
    const auto progress = [&] { return !early_sent || early_sends_done(); };
    if (all_to_all) {
      detail::AllToAllAgreement exchange(a, all_to_all_agreements(), agreement, rank, size);
      if (early_sent) early(*this);  // right behind this rank's agreement messages
      poll([&] {
        (void)progress();
        return exchange.test();
      });
    } else {
      AgreementExchange exchange(a, *peer_agreement, *out_agreement, agreement, rank, size);
      if (early_sent) {
        exchange.test();  // this rank's agreement message first, its data right behind it
        early(*this);
      }
      // (Both ranks may have sent data: each drains the other's while its own go.)
      poll([&] {
        (void)progress();
        return exchange.test();
      });
    }
    if (!consistent(a)) {
      drain_early(poll, progress);
      poll(progress);  // (the others drain this one's)
    }
    detail::check_agreement(poll.call, where, a.high, a.low);
    route_now = routing.bytes != 0 && a.route > 0 ? static_cast<Route>(a.route) : Route::schedule;
    if (inline_bytes <= kInlineBytes) {
      unpack(*this, a.payload);
    } else {
      const auto began = std::chrono::steady_clock::now();
      body(*this, poll);
      if (rank == 0 && routing.bytes != 0 && !forced()) {
        routes.record(sig.kind, routing.bytes, route_now,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(), routing.other);
      }
    }
    poll(progress);  // this rank's data sent with the agreement
    busy_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - poll.began).count(),
        std::memory_order_relaxed);
  }
  bool forced() const { return route_policy == RoutePolicy::schedule || route_policy == RoutePolicy::mpi; }
  // The buffers of an AllToAllAgreement: one Agreement for each other rank, by rank.
  Agreement* const* all_to_all_agreements() {
    if (all_to_all_views.empty()) {
      all_to_all_peers.resize(static_cast<std::size_t>(size));
      all_to_all_views.resize(static_cast<std::size_t>(size), nullptr);
      for (int q = 0; q < size; ++q) {
        if (q == rank) continue;
        all_to_all_peers[static_cast<std::size_t>(q)].reset(new Agreement);
        all_to_all_views[static_cast<std::size_t>(q)] = all_to_all_peers[static_cast<std::size_t>(q)].get();
      }
    }
    return all_to_all_views.data();
  }
  Route pick_route(Collective kind, Routing routing) {
    if (forced()) return route_policy == RoutePolicy::mpi ? Route::mpi : Route::schedule;
    return routes.pick(kind, routing.bytes, routing.other);
  }

  // What a collective sends with its agreement (sends_with_agreement's, into early_sends): nothing.
  struct NoEarly {
    void operator()(MpiCommunicator&) const {}
  };
  // The one way a collective is issued: in one order per communicator, after every rank agreed on
  // @p sig. When its data fits in kInlineBytes (@p inline_bytes), @p pack writes it into the
  // agreement's payload and @p unpack reads the result from it: the agreement was the whole
  // collective, run in place when the stream is idle (run_in_place). Otherwise @p body(comm, poll)
  // runs after the agreement: either MPI's blocking (tuned) collectives, or (@p polled_bytes, its
  // bytes in all, non-zero) it only waits through `poll`: a RingCollective or, where the
  // collective is routed (@p other not Route::schedule), its other route (MPI's nonblocking
  // collective, or the direct all-reduce) when rank 0's route chooser says so (route_now). A
  // polled collective runs in place when the stream is idle up to kInPlaceRingBytes, and a thread
  // that waits in synchronize() before the worker has started it runs it too; on the worker it
  // holds this communicator and runs under the timeout's deadline: a watchdog abandons the worker
  // of a collective that never completes, and the stream's waiters get the CommunicationError.
  template <class Pack, class Unpack, class Body, class Early = NoEarly>
  void enqueue(StreamView stream, const char* call, Signature sig, std::size_t inline_bytes, Pack pack, Unpack unpack,
               Body body, std::size_t polled_bytes = 0, Route other = Route::schedule, Early early = {}) {
    // Routed: every rank decides the same from the agreed kind and count (MPI's counts are int).
    const Routing routing{detail::routed(route_policy, sig.kind, size, other) && polled_bytes != 0 &&
                                  inline_bytes > kInlineBytes && sig.count <= max_count
                              ? polled_bytes
                              : 0,
                          other};
    if ((inline_bytes <= kInlineBytes || (polled_bytes != 0 && polled_bytes <= kInPlaceRingBytes)) &&
        run_in_place(stream, call, sig, inline_bytes, routing, pack, unpack, body, early))
      return;
    auto self = shared_from_this();
    auto on_worker = [self, call, sig, inline_bytes, routing, pack, unpack, body, early] {
      detail::NvtxRange range(call);
      self->check_usable(call);
      const Poll poll{*self, call, std::chrono::steady_clock::now(), true};  // busy_seconds' timing too
      detail::run_with_deadline(
          self->timeout,
          [&] {
            std::lock_guard<std::mutex> lock(self->order);  // inside the deadline: its holder may be stuck
            self->check_usable(call);
            self->run_agreed(poll, sig, inline_bytes, routing, pack, unpack, body, early);
          },
          [&] { return self->timed_out(call, poll.began, kEnds); });
    };
    if (inline_bytes > kInlineBytes && polled_bytes == 0) {  // MPI's blocking call: on the worker, under the watchdog
      launch_host_func(stream, std::move(on_worker));
      return;
    }
    // Polled: a thread waiting in synchronize() before the worker starts it runs it in place.
    static_cast<detail::HostStream&>(*stream.impl())
        .launch_host_func_or_help(std::move(on_worker),
                                  [self, call, sig, inline_bytes, routing, pack, unpack, body, early] {
                                    std::unique_lock<std::mutex> lock(self->order, std::try_to_lock);
                                    if (!lock.owns_lock()) return false;
                                    self->run_on_caller(call, sig, inline_bytes, routing, pack, unpack, body, early);
                                    return true;
                                  });
  }

  // Runs @p one(offset, count) over [0, n) in pieces of at most max_count elements.
  template <class One>
  void in_pieces(std::int64_t n, One one) const {
    for (std::int64_t at = 0; at < n; at += max_count) one(at, std::min(max_count, n - at));
  }

  // A communicator over a duplicate of @p parent: nodes from GPUCLOUD_LOCAL_SIZE or a
  // shared-memory split, the cross-node communicator, the timeout from GPUCLOUD_COMM_TIMEOUT.
  // @p checks (the caller's own checks of the environment) and the reading of the GPUCLOUD_*
  // variables run first; if they throw on any rank, every rank throws.
  static std::shared_ptr<MpiCommunicator> build(MPI_Comm parent, const char* call,
                                                const std::function<void()>& checks = {});
  // The hierarchical all-reduce's groups (GPUCLOUD_HIERARCHY): the nodes, or their NUMA nodes or
  // blocks of local ranks, split from world (a collective, at setup).
  void split_groups(const HierarchyRequest& request, const char* call);

  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void all_gather(BufferView send, BufferView recv, StreamView stream) override;
  void broadcast(BufferView buffer, int root, StreamView stream) override;
  void barrier(StreamView stream) override;
  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override;
  bool flat_all_reduce_halves() const override {
    return detail::halving_applies(std::size_t{1} << 30, size, nodes, kInlineBytes);
  }
};

}  // namespace gpucloud::detail
