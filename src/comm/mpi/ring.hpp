// Internal: the MPI backend's large all-reduce, reduce-scatter and all-gather (not API). A ring
// (reduce-scatter steps, then all-gather steps) over point-to-point messages, cut into segments
// that move concurrently, so the reduction of one segment overlaps the transfer of the others.
// Progressed by test() without blocking, so the caller's thread can run it against a timeout;
// OpenMPI's tuned blocking collectives cannot be abandoned that way (its nonblocking ones can:
// route_choice.hpp picks between the two by measurement; docs/collectives.md).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace gpucloud::detail {

/// Whether a collective moving @p bytes in all (the all-reduced vector; every rank's part of a
/// reduce-scatter or all-gather together) over @p size ranks runs as a RingCollective; every rank
/// decides the same from the agreed count and dtype. From above @p inline_limit (what travels
/// inside the agreement) on 2 ranks; from (size - 2) x 512 KiB on more, where the ring's 2 (size - 1)
/// steps stop costing more than MPI's latency-bound algorithms run on the stream's worker (3 ranks
/// on 2 cores: about 512 KiB, 4 ranks: about 1 MiB; docs/collectives.md).
bool ring_applies(std::size_t bytes, int size, std::size_t inline_limit);

/// Whether an all-reduce of @p bytes over @p size ranks on @p nodes nodes runs as the ring
/// (RingKind::all_reduce): never where halving_applies(); where ring_applies(); and on one node from
/// max(384 KiB, (size - 2) x 256 KiB) (rank counts that are not a power of two). With the vectorised
/// reduction the ring beat MPI's blocking collective on the worker from there (3 ranks, 384 KiB:
/// 1.01-1.24x raw against 0.74-0.93x in eight interleaved runs; 6 ranks, 1 MiB: 1.06-1.28x against
/// 0.57-1.00x in four); below, at 3 ranks 256 KiB and 6 ranks 512 KiB, neither won every run.
bool all_reduce_ring_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit);

/// Whether a reduce-scatter or all-gather moving @p bytes in all over @p size ranks on @p nodes nodes runs
/// as a RingCollective: where ring_applies(), and on one node at every size above @p inline_limit that
/// halving and doubling do not take (rank counts that are not a power of two). A reduce-scatter's or
/// all-gather's ring takes size - 1 steps, not the all-reduce's 2 (size - 1), and against MPI's blocking
/// collective on the worker it won at every size measured there (3 and 6 ranks, 8 KiB-1 MiB:
/// docs/collectives.md). Across nodes MPI's latency-bound algorithms keep the sizes below the ring's.
bool ring_applies_per_rank(std::size_t bytes, int size, int nodes, std::size_t inline_limit);

/// Whether an all-reduce of @p bytes over @p size ranks on @p nodes nodes runs as recursive halving
/// then doubling (RingKind::all_reduce_halving) rather than a ring or MPI's collective: 4, 8 or 16
/// ranks, above @p inline_limit; on one node where ring_applies() is false (its 2 log2(size) steps
/// beat the ring's 2 (size - 1) there, and polled on the caller's thread it skips the hand-off MPI's
/// blocking call needs), on more at every size (only 1/size of the vector per rank crosses nodes
/// each way, the ring's 2 (size - 1)/size of it at each boundary: docs/collectives.md).
bool halving_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit);

/// Whether a broadcast of @p bytes over @p size ranks runs as a binomial tree (RingKind::broadcast_tree):
/// above @p inline_limit on 3 or more ranks, below the chain's sizes (ring_applies()): ceil(log2 size) steps
/// where the chain takes size - 1, polled on the caller's thread instead of MPI's blocking call on the worker.
bool tree_applies(std::size_t bytes, int size, std::size_t inline_limit);

/// Segments in flight at once, each in its own scratch slot and under its own message tag.
constexpr int kRingSlots = 8;
/// Bytes of one segment (and of each of a slot's two scratch halves).
constexpr std::size_t kRingSegmentBytes = std::size_t{512} << 10;
/// Bytes of the scratch one RingCollective uses.
constexpr std::size_t kRingScratchBytes = 2 * kRingSlots * kRingSegmentBytes;
/// The first message tag a ring uses (tags [kRingFirstTag, kRingFirstTag + kRingSlots)).
constexpr int kRingFirstTag = 1;

/// Bytes of one message of a DirectTransfer (and of the scratch that drains one).
constexpr std::size_t kDirectPieceBytes = kRingScratchBytes;
/// The tag of a DirectTransfer's messages: the ring's first, on the same communicator (MPI matches
/// same-tag messages from one rank in order, and every rank runs its collectives in one order).
constexpr int kDirectTag = kRingFirstTag;

/// Whether an all-reduce of @p bytes over @p size ranks runs as a direct 2-rank exchange (its data
/// sent with the agreement: MpiCommunicator): 2 ranks, above @p inline_limit, and each rank's half
/// of the vector at most one DirectTransfer message (kDirectPieceBytes: 16 MiB in all).
bool two_rank_all_reduce_applies(std::size_t bytes, int size, std::size_t inline_limit);
/// Block @p r of @p count elements split over @p size ranks, as the ring splits an all-reduce (and
/// the direct routes and the all-to-all agreement with it): the first element and the length, the
/// first count % size blocks one longer.
void ring_block(std::int64_t count, int size, int r, std::int64_t& offset, std::int64_t& length);
/// The block of @p count elements rank @p r (0 or 1) of a direct 2-rank all-reduce reduces: the
/// ring's 2-rank block (ring_block).
inline void direct_block(std::int64_t count, int r, std::int64_t& offset, std::int64_t& length) {
  ring_block(count, 2, r, offset, length);
}

/// One buffer sent to, or received from, one other rank, unpipelined (the data a broadcast,
/// all-gather or all-reduce sends with its agreement): every message posted at once, kDirectPieceBytes each
/// (the last shorter), under kDirectTag. With a single-copy transport each moves as one read by
/// the receiver, with no further step of the sender's: beside a busy core the sender need not run
/// again (a chain of 512 KiB segments, 8 in flight, needs it once per 4 MiB). Exactly one of
/// @p send and @p recv is not null; it must stay put until the transfer completes, or for ever if
/// it is abandoned.
class DirectTransfer {
 public:
  DirectTransfer(const void* send, void* recv, std::size_t bytes, int peer, MPI_Comm comm);
  DirectTransfer(const DirectTransfer&) = delete;
  DirectTransfer& operator=(const DirectTransfer&) = delete;
  /// Progresses without blocking; true once every message has completed.
  bool test();

 private:
  std::vector<MPI_Request> requests_;
};

/// Progresses every transfer of @p transfers without blocking; true once all have completed.
inline bool all_complete(std::deque<DirectTransfer>& transfers) {
  bool done = true;
  for (DirectTransfer& t : transfers) done = t.test() && done;
  return done;
}

/// Whether an all-reduce of @p bytes over @p size ranks may run as a DirectAllReduce: 3 to 16
/// ranks on one node, where the ring applies (all_reduce_ring_applies), up to 2 x kDirectPieceBytes
/// (16 MiB) in all, so that the blocks received from the other ranks fit a bounded workspace.
bool all_reduce_direct_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit);

/// An all-reduce over 3 or more ranks in two rounds of direct messages, with the ring's blocks and
/// the ring's bits: every rank sends block q of its values to rank q and receives every other rank's
/// values of its own block into @p workspace ((size - 1) blocks), reduces them in the ring's order
/// and operand order (block b: ((x[b+1] op x[b+2]) op ...) op x[b], so every rank ends with what
/// RingKind::all_reduce gives, bit for bit), then sends its result to every rank and receives
/// theirs. Two synchronisations where the ring takes 2 (size - 1): beside busy cores each one risks a
/// descheduled peer's scheduler tick (docs/collectives.md). Messages under kDirectTag. The buffers
/// and @p workspace must stay put until it completes, or for ever if it is abandoned. Average is not
/// divided here.
/// With @p scatter_only it is the reduce-scatter's: @p count elements in all (size equal blocks),
/// the first round alone, this rank's block of the result into @p recv (count / size elements),
/// with RingKind::reduce_scatter's bits.
/// With @p values_sent the caller has posted the first round's sends (block q of send to each rank
/// q, one message under kDirectTag: MpiCommunicator's all-reduce sent with its agreement), and calls
/// test() only once they have completed.
class DirectAllReduce {
 public:
  DirectAllReduce(const void* send, void* recv, std::int64_t count, DType t, ReduceOp op, MPI_Comm comm, int rank,
                  int size, unsigned char* workspace, bool scatter_only = false, bool values_sent = false);
  DirectAllReduce(const DirectAllReduce&) = delete;
  DirectAllReduce& operator=(const DirectAllReduce&) = delete;
  /// Progresses without blocking; true once this rank has the result.
  bool test();
  /// Bytes of the workspace an all-reduce of @p count elements of @p t over @p size ranks needs.
  static std::size_t workspace_bytes(std::int64_t count, DType t, int size);

 private:
  void block(int b, std::int64_t& offset, std::int64_t& length) const;  // the ring's blocks
  unsigned char* slot(int q) const;  // where rank q's values of this rank's block arrive
  void reduce();
  void gather();

  const unsigned char* send_;
  unsigned char* recv_;
  std::int64_t count_;
  DType dtype_;
  ReduceOp op_;
  std::size_t elem_;
  MPI_Comm comm_;
  int rank_, size_, phase_ = 0;
  unsigned char* workspace_;
  bool scatter_only_;
  std::vector<MPI_Request> receives_, sends_;
};

/// Whether a reduction moving @p bytes in all over @p size ranks on @p nodes nodes may take a direct
/// route (DirectAllReduce; its second, instead of MPI's nonblocking collective) where its schedule
/// is the ring, whose bits the direct one gives: 3 to 16 ranks on one node, above @p inline_limit,
/// up to 2 x kDirectPieceBytes (16 MiB).
bool direct_applies(std::size_t bytes, int size, int nodes, std::size_t inline_limit);

/// Which collective a RingCollective runs, and how.
enum class RingKind { all_reduce, reduce_scatter, all_gather, broadcast, all_reduce_halving, broadcast_tree };

/// Which of an all-reduce's steps (ring or halving) a RingCollective runs: all of them, or one half
/// (the hierarchical all-reduce's node phases; the halving form's halves are the reduce-scatter and
/// all-gather of 4-16 ranks below the ring's sizes): the reduce-scatter half leaves block `rank` of
/// the reduction in recv, the all-gather half spreads every rank's block `rank` of recv to the others.
enum class RingSteps { all, reduce_scatter_half, all_gather_half };

/// One collective over the ranks of @p comm. all_reduce: recv = reduce(send), @p count elements,
/// send == recv in place; blocks of count / size (the first count % size one longer).
/// reduce_scatter: recv (@p count) = block `rank` of reduce(send) (size x count). all_gather: recv
/// (size x count) = every rank's send (@p count). broadcast: recv (@p count, send unused) = @p root's,
/// segments passed down the chain root, root+1, ..., root-1; broadcast_tree: the same along a binomial tree
/// (ceil(log2 size) steps: at step k the ranks holding the data, root + [0, 2^k), send to root + 2^k + their
/// distance). Reductions run along the ring: block b is
/// reduced by ranks b+1, b+2, ..., b once and copied to the others, so every rank ends with the
/// same bytes. all_reduce_halving (a power-of-two @p size up to 16): the same blocks, reduced by
/// recursive halving (step k sends half of the blocks still held to rank ^ 2^k, low bits first so
/// that the small pieces cross nodes) then gathered by recursive doubling in the reverse order;
/// block b is reduced along a tree once and ends on rank b, so again every rank has the same bytes. Blocks are cut into
/// segments of kRingSegmentBytes (all_reduce_halving: 4 x kRingSegmentBytes / size, a step moving one per block it
/// exchanges); slot s carries segments s, s + kRingSlots, ... through the steps, one at a time. The buffers and @p
/// scratch (kRingScratchBytes) must stay put until it completes, or for ever if it is abandoned. Average is not divided
/// here (the caller divides). @p one_node (every rank of @p comm on one node): halving and doubling whose blocks are
/// one segment each (up to 4 x kRingSegmentBytes in all) take the high rank bits first while halving and the low ones
/// first while doubling, so what a step exchanges is one contiguous range: one message each way instead of one per
/// block.
class RingCollective {
 public:
  RingCollective(RingKind kind, const void* send, void* recv, std::int64_t count, DType t, ReduceOp op, MPI_Comm comm,
                 int rank, int size, unsigned char* scratch, int root = 0, RingSteps steps = RingSteps::all,
                 bool one_node = false);
  RingCollective(const RingCollective&) = delete;
  RingCollective& operator=(const RingCollective&) = delete;

  /// Progresses without blocking; true once this rank has the result.
  bool test();

 private:
  static constexpr int kMaxHalvingRanks = 16;
  struct Slot {
    std::int64_t segment = 0;
    int step = 0;
    bool active = false;
    int pending = 0;  // requests posted for the current step, from requests[0]
    MPI_Request requests[kMaxHalvingRanks];
  };
  void start(int slot, std::int64_t segment);
  void post(int slot);
  void completed(int slot);
  void post_broadcast(int slot);
  void post_halving(int slot);
  void completed_halving(int slot);
  // The contiguous form of a halving or doubling step (one_node, one segment per block): the
  // first element and the length of the range @p mask blocks long that holds block @p b.
  void range(int b, int mask, std::int64_t& offset, std::int64_t& length) const;
  // Element offset (in the whole vector) and length of @p segment of block @p block.
  void piece(int block, std::int64_t segment, std::int64_t& offset, std::int64_t& length) const;
  int block(int k) const { return ((k % size_) + size_) % size_; }
  unsigned char* half(int slot, int step) const {
    return scratch_ + (2 * static_cast<std::size_t>(slot) + static_cast<std::size_t>(step % 2)) * kRingSegmentBytes;
  }

  RingKind kind_;
  const unsigned char* send_;
  unsigned char* recv_;
  std::int64_t count_, segment_elems_, segments_ = 1;
  DType dtype_;
  ReduceOp op_;
  std::size_t elem_;
  MPI_Comm comm_;
  int rank_, size_, root_, first_step_ = 0, end_step_ = 0, live_ = 0, log_size_ = 0;
  bool contiguous_ = false;  // halving and doubling by ranges (above)
  unsigned char* scratch_;
  Slot slots_[kRingSlots];
};

}  // namespace gpucloud::detail
