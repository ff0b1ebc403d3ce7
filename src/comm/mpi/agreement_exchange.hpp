// Internal: the MPI backend's agreement, every collective's first step. The ranks all-reduce one
// Agreement (what each is about to run, and the data itself when it fits in the payload) over
// point-to-point messages, polled against the timeout: by recursive doubling (AgreementExchange)
// or, on 3-16 ranks of one node, all-to-all (AllToAllAgreement) (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include "comm/agreement.hpp"
#include "comm/host_reduce.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/ring.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace gpucloud::detail {

// The agreement is an all-reduce of one Agreement by AgreementExchange (below): the header
// fields combine as max and -min, so every rank learns whether all agreed; a collective whose
// data fits in the payload (kInlineBytes) travels inside the same messages, combined when the
// headers agree. Small collectives so cost what a small all-reduce costs, with the checks on.
inline constexpr std::size_t kInlineBytes = 65536;
inline constexpr int kFields = detail::kAgreementFields;  // kind, op, root, count, dtype, inline
struct Agreement {
  std::int64_t high[kFields];  // max over ranks
  std::int64_t low[kFields];   // max of the negation: -min over ranks
  std::int64_t route;          // max over ranks: rank 0's Route for a routed collective, -1 from the others
  alignas(8) unsigned char payload[kInlineBytes];
};
inline constexpr std::size_t kHeaderBytes = offsetof(Agreement, payload);
// The agreement's messages go as pieces of this many bytes: OpenMPI's shared-memory transport sends
// up to 4 KiB, its own header included, without waiting for the receiver, and a larger message
// waits for the receiver's acknowledgement, which on oversubscribed cores is a descheduled peer's
// wake-up (a 4 KiB all-reduce's header and payload would be one such message).
inline constexpr int kAgreementPieceBytes = 4032;

// Bytes of the payload a consistent inline agreement uses (what inline_size() gave each rank).
inline std::size_t payload_bytes(const Agreement& a) {
  const auto kind = static_cast<Collective>(a.high[0]);
  const bool per_rank = kind == Collective::all_gather || kind == Collective::reduce_scatter;
  return static_cast<std::size_t>(a.high[3]) * static_cast<std::size_t>(per_rank ? a.high[5] : 1) *
         dtype_size(static_cast<DType>(a.high[4]));
}

inline bool consistent(const Agreement& a) {
  for (int i = 0; i < kFields; ++i) {
    if (a.high[i] != -a.low[i]) return false;
  }
  return true;
}

// Whether a consistent agreement's payload is used: its data is inline.
inline bool carries(const Agreement& a) { return a.high[5] != 0 && consistent(a); }

// The messages of the whole-payload exchange: the header, and the payload when the data is inline
// and the headers so far agree (a disagreement's payload is never used, and its sizes may be anything).
inline int wire_bytes(const Agreement& a) {
  return static_cast<int>(kHeaderBytes + (carries(a) ? std::min(payload_bytes(a), kInlineBytes) : 0));
}

// What a rank's payload holds after each round of a power-of-two exchange (mask 1, 2, ...,
// partner rank ^ mask), for the collectives whose rounds need not carry the whole payload:
//  - all-gather: rank r holds the blocks of ranks r & ~(mask - 1) + [0, mask) and sends them, as
//    MPI's recursive doubling does;
//  - reduce-scatter: recursive halving, rank r reduces the blocks equal to r modulo mask and sends
//    its partner the half of them equal to the partner modulo 2 mask, ending with its own block;
//  - broadcast: the ranks within mask of the root (by xor) hold the data, and each sends it to its
//    partner, which does not.
// So each message is the header and only what its receiver needs (at 4 KiB on 4 ranks 1-2 KiB
// and the header), and inline all-gathers and reduce-scatters up to 64 KiB move what MPI's
// algorithms move.
struct Rounds {
  Collective kind;
  std::size_t block;  // bytes of one rank's block (all-gather, reduce-scatter)
  std::size_t whole;  // bytes of the payload (broadcast)
  int size, root;

  // Whether inline exchanges of @p kind on @p size ranks are shaped (when their agreement is consistent).
  static bool shapes(Collective kind, int size) {
    return (size & (size - 1)) == 0 &&
           (kind == Collective::all_gather || kind == Collective::reduce_scatter || kind == Collective::broadcast);
  }
  static bool shaped(const Agreement& a, int size) {
    return carries(a) && shapes(static_cast<Collective>(a.high[0]), size);
  }
  Rounds(const Agreement& a, int p)
      : kind(static_cast<Collective>(a.high[0])),
        block(static_cast<std::size_t>(a.high[3]) * dtype_size(static_cast<DType>(a.high[4]))),
        whole(payload_bytes(a)),
        size(p),
        root(static_cast<int>(a.high[2])) {}
  bool holds(int r, int mask) const { return (r ^ root) < mask; }  // broadcast
  // Calls @p piece(offset, bytes) for each piece of the payload @p from sends @p to in this round, in order.
  template <class Piece>
  void pieces(int from, int to, int mask, Piece piece) const {
    switch (kind) {
      case Collective::all_gather:
        return piece(static_cast<std::size_t>(from & ~(mask - 1)) * block, static_cast<std::size_t>(mask) * block);
      case Collective::reduce_scatter:
        for (int b = to & (2 * mask - 1); b < size; b += 2 * mask) piece(static_cast<std::size_t>(b) * block, block);
        return;
      default:
        if (holds(from, mask) && !holds(to, mask)) piece(0, whole);
        return;
    }
  }
};

// The agreement's all-reduce, over point-to-point messages on the communicator's own duplicate
// (not MPI_Iallreduce: OpenMPI's nonblocking collectives run a libnbc schedule that costs several
// small-message latencies, and a blocking MPI_Allreduce cannot be bounded by a timeout on the
// caller's thread). Recursive doubling: log2(p) rounds, where p is the largest power of two up to
// the size; the ranks above p first fold their agreement into rank - p and get the result back at
// the end. Each pair combines the lower rank's side first, so every rank ends with the same bytes,
// as MPI's all-reduce. Inline all-gathers, reduce-scatters and broadcasts on a power-of-two size
// send only what the receiver needs (Rounds), packed after the header in @p out; the rest
// carry the whole payload (all-reduces as the reduce op in the dtype, fp16/bf16 through fp32;
// all-gather and broadcast as bitwise OR of zero-filled slots). Driven by test(), polled (in
// place or on the worker) against the timeout. @p a (this rank's agreement in, the combined one
// out), @p peer (what peers send) and @p out must stay put until the exchange completes, or for
// ever if it is abandoned.
class AgreementExchange {
 public:
  AgreementExchange(Agreement& a, Agreement& peer, Agreement& out, MPI_Comm comm, int rank, int size)
      : a_(a), peer_(peer), out_(out), comm_(comm), rank_(rank), size_(size) {
    while (p_ * 2 <= size_) p_ *= 2;
  }
  AgreementExchange(const AgreementExchange&) = delete;
  AgreementExchange& operator=(const AgreementExchange&) = delete;

  /// Progresses without blocking; true once this rank has the combined agreement.
  bool test() {
    for (;;) {
      if (phase_ == Phase::done) return true;
      while (receiving_) {  // a full piece has another behind it, received as soon as it is in
        int arrived = 0;
        MPI_Status status;
        GPUCLOUD_MPI_CHECK(MPI_Test(&receive_, &arrived, &status));
        if (!arrived) return false;
        int bytes = 0;
        GPUCLOUD_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
        received_ += bytes;
        receiving_ = bytes == kPieceBytes;
        if (receiving_) {  // never past peer_: a message is at most kMaxWire bytes
          GPUCLOUD_MPI_CHECK(MPI_Irecv(reinterpret_cast<unsigned char*>(&peer_) + received_,
                                       std::min(kPieceBytes, kMaxWire - received_), MPI_BYTE, peer_rank_, kTailTag,
                                       comm_, &receive_));
        }
      }
      int complete = 0;
      GPUCLOUD_MPI_CHECK(MPI_Testall(sends_, requests_, &complete, MPI_STATUSES_IGNORE));
      if (!complete) return false;
      completed();
    }
  }

 private:
  enum class Phase { start, fold, round, send_back, receive_result, done };
  static constexpr int kMaxWire = static_cast<int>(sizeof(Agreement));
  // A message goes as pieces of kAgreementPieceBytes and a last, shorter one (empty when the
  // message is a multiple): a piece shorter than kPieceBytes ends the message, so the receiver knows
  // from each piece's size whether another follows. The first piece has tag 0, the others kTailTag
  // (same-tag messages from one rank match in order).
  static constexpr int kPieceBytes = kAgreementPieceBytes;
  static constexpr int kTailTag = detail::kRingFirstTag + detail::kRingSlots;  // after the ring's tags
  static constexpr int kMaxPieces = kMaxWire / kPieceBytes + 1;
  static_assert(kPieceBytes > static_cast<int>(kHeaderBytes) && kPieceBytes < kMaxWire);

  // The messages of the current phase have completed: combine, then post the next phase's.
  void completed() {
    const int extra = size_ - p_;
    switch (phase_) {
      case Phase::start:
        if (rank_ >= p_) {  // folded into rank - p: send ours, receive the result
          post(rank_ - p_);
          phase_ = Phase::receive_result;
        } else if (rank_ < extra) {
          receive(rank_ + p_);
          phase_ = Phase::fold;
        } else {
          next_round();
        }
        return;
      case Phase::fold:
        combine(rank_ + p_, 0);
        next_round();
        return;
      case Phase::round:
        combine(rank_ ^ mask_, mask_);
        mask_ *= 2;
        next_round();
        return;
      case Phase::receive_result:
        std::memcpy(static_cast<void*>(&a_), &peer_, static_cast<std::size_t>(wire_bytes(peer_)));
        phase_ = Phase::done;
        return;
      case Phase::send_back:
        phase_ = Phase::done;
        return;
      case Phase::done:
        return;
    }
  }

  void next_round() {
    if (mask_ < p_) {
      post(rank_ ^ mask_, mask_);
      phase_ = Phase::round;
    } else if (rank_ < size_ - p_) {  // the result to the rank folded into this one
      send(&a_, wire_bytes(a_), rank_ + p_);
      phase_ = Phase::send_back;
    } else {
      phase_ = Phase::done;
    }
  }

  // Sends this rank's agreement to @p peer (in round @p mask; 0: a fold, the whole payload) and
  // receives its agreement into peer_.
  void post(int peer, int mask = 0) {
    receive(peer);
    const Agreement* message = &a_;
    int bytes = wire_bytes(a_);
    if (mask != 0 && Rounds::shaped(a_, size_)) {  // the header, then the pieces the peer needs
      // Sent from a_ itself while the pieces are its payload from the start (a broadcast's whole
      // payload, rank 0's all-gather blocks); packed into out_ from the first that is not.
      std::size_t at = 0;
      bool own = true;
      Rounds(a_, size_).pieces(rank_, peer, mask, [&](std::size_t offset, std::size_t n) {
        if (own && offset == at) {
          at += n;
          return;
        }
        if (own) std::memcpy(static_cast<void*>(&out_), &a_, kHeaderBytes + at);
        own = false;
        std::memcpy(out_.payload + at, a_.payload + offset, n);
        at += n;
      });
      message = own ? &a_ : &out_;
      bytes = static_cast<int>(kHeaderBytes + at);
    }
    send(message, bytes, peer);
  }
  // Sends @p bytes of @p message to @p peer in pieces.
  void send(const Agreement* message, int bytes, int peer) {
    const auto* at = reinterpret_cast<const unsigned char*>(message);
    sends_ = 0;
    for (int sent = 0, tag = 0;; tag = kTailTag) {
      const int n = std::min(bytes - sent, kPieceBytes);
      GPUCLOUD_MPI_CHECK(MPI_Isend(at + sent, n, MPI_BYTE, peer, tag, comm_, &requests_[sends_++]));
      sent += n;
      if (n < kPieceBytes) break;
    }
  }
  // Receives @p peer's message into peer_, piece by piece (test()).
  void receive(int peer) {
    GPUCLOUD_MPI_CHECK(MPI_Irecv(&peer_, kPieceBytes, MPI_BYTE, peer, 0, comm_, &receive_));
    receiving_ = true;
    received_ = 0;
    peer_rank_ = peer;
  }

  // a_ = (lower rank's side) (+) (higher rank's side), whichever side this rank is, of the
  // agreement @p peer sent in round @p mask (0: a fold): the headers as max and -min, the payloads
  // when both headers are consistent and the same.
  void combine(int peer, int mask) {
    const bool same = carries(peer_) && carries(a_) && std::equal(peer_.high, peer_.high + kFields, a_.high);
    const bool shaped = mask != 0 && Rounds::shaped(a_, size_);
    for (int i = 0; i < kFields; ++i) {
      a_.high[i] = std::max(a_.high[i], peer_.high[i]);
      a_.low[i] = std::max(a_.low[i], peer_.low[i]);
    }
    a_.route = std::max(a_.route, peer_.route);
    if (!same) return;  // a disagreement (its payload is not used) or nothing inline
    const auto kind = static_cast<Collective>(a_.high[0]);
    const auto t = static_cast<DType>(a_.high[4]);
    const auto op = static_cast<ReduceOp>(a_.high[1]);
    if (shaped) {  // the pieces this rank needs, in the order the peer packed them
      std::size_t at = 0;
      Rounds(a_, size_).pieces(peer, rank_, mask, [&](std::size_t offset, std::size_t n) {
        unsigned char* mine = a_.payload + offset;
        const unsigned char* theirs = peer_.payload + at;
        at += n;
        if (kind != Collective::reduce_scatter) {
          std::memcpy(mine, theirs, n);
        } else {
          const auto count = static_cast<std::int64_t>(n / dtype_size(t));
          if (peer < rank_) {
            detail::reduce_elements(theirs, mine, mine, count, t, op);
          } else {
            detail::reduce_elements(mine, theirs, mine, count, t, op);
          }
        }
      });
      return;
    }
    const std::size_t n = payload_bytes(a_);
    if (kind == Collective::all_gather || kind == Collective::broadcast) {
      for (std::size_t i = 0; i < n; ++i) a_.payload[i] |= peer_.payload[i];
      return;
    }
    const std::int64_t count = a_.high[3] * (kind == Collective::reduce_scatter ? a_.high[5] : 1);
    if (peer < rank_) {
      detail::reduce_elements(peer_.payload, a_.payload, a_.payload, count, t, op);
    } else {
      detail::reduce_elements(a_.payload, peer_.payload, a_.payload, count, t, op);
    }
  }

  Agreement& a_;
  Agreement& peer_;  // what a peer sent: only the bytes it sent are read
  Agreement& out_;   // what this rank sends in a round that carries only part of the payload
  MPI_Comm comm_;
  int rank_, size_, p_ = 1, mask_ = 1;
  Phase phase_ = Phase::start;
  MPI_Request requests_[kMaxPieces];  // the pieces sent in this phase (sends_ of them)
  int sends_ = 0;
  MPI_Request receive_ = MPI_REQUEST_NULL;  // the piece being received
  bool receiving_ = false;                  // until a piece shorter than kPieceBytes is in
  int received_ = 0, peer_rank_ = -1;       // bytes of peer_ in so far; whose message
};

}  // namespace gpucloud::detail

namespace gpucloud::detail {

/// Whether a communicator of @p size ranks over @p nodes nodes agrees all-to-all
/// (AllToAllAgreement) rather than by recursive doubling (AgreementExchange), unless
/// GPUCLOUD_AGREEMENT=doubling: 3 to 16 ranks on one node. The same on every rank: it depends on
/// the communicator alone.
inline bool all_to_all_agreement(int size, int nodes) { return nodes == 1 && size >= 3 && size <= 16; }

/// Inline all-reduces larger than this reduce in two rounds of an all-to-all agreement (each rank
/// its block of the values, then the blocks to every rank), smaller ones in one (each rank every
/// rank's whole vector): at 64 KiB on 4 ranks the one round moved 3x the bytes and ran at 0.82 of
/// MPI's all-reduce where recursive doubling ran at 1.09.
inline constexpr std::size_t kAllToAllWholeBytes = 16384;

/// Whether the inline all-reduce of a consistent agreement @p h reduces in two rounds (above).
inline bool all_to_all_split(const Agreement& h) {
  const auto kind = static_cast<Collective>(h.high[0]);
  return (kind == Collective::all_reduce || kind == Collective::hierarchical_all_reduce) &&
         payload_bytes(h) > kAllToAllWholeBytes;
}

/// The part of its payload (@p offset, @p bytes) a rank whose agreement is @p h sends rank @p to in
/// an all-to-all agreement of @p size ranks (rank @p from sending): nothing unless its data is
/// inline; an all-gather's own block, the receiver's block of a reduce-scatter or a split
/// all-reduce, a broadcast root's whole payload, the whole payload of the rest. Never past the
/// payload, whatever @p h holds.
inline void all_to_all_part(const Agreement& h, int from, int to, int size, std::size_t& offset, std::size_t& bytes) {
  offset = 0;
  bytes = 0;
  if (!carries(h)) return;
  const auto kind = static_cast<Collective>(h.high[0]);
  const std::size_t elem = dtype_size(static_cast<DType>(h.high[4]));
  const std::size_t block = static_cast<std::size_t>(h.high[3]) * elem;
  if (all_to_all_split(h)) {
    std::int64_t at = 0, len = 0;
    ring_block(h.high[3], size, to, at, len);
    offset = static_cast<std::size_t>(at) * elem;
    bytes = static_cast<std::size_t>(len) * elem;
  } else if (kind == Collective::all_gather) {
    offset = static_cast<std::size_t>(from) * block;
    bytes = block;
  } else if (kind == Collective::reduce_scatter) {
    offset = static_cast<std::size_t>(to) * block;
    bytes = block;
  } else if (kind == Collective::broadcast) {
    if (from == h.high[2]) bytes = payload_bytes(h);
  } else {
    bytes = payload_bytes(h);
  }
  if (offset > kInlineBytes || bytes > kInlineBytes - offset) offset = bytes = 0;
}

/// The agreement of a one-node communicator of 3 to 16 ranks (all_to_all_agreement): every rank
/// sends its header, and the part of its inline data the receiver needs (all_to_all_part), to every
/// other rank at once, and combines what it receives itself. One synchronisation where recursive
/// doubling takes log2(p) (plus two for the ranks above a power of two): beside busy cores each is
/// a wait for a descheduled peer (4 ranks on 2 cores beside two CPU-bound processes, a 104-byte
/// agreement: 2.0-2.1 ms against 2.8 ms; 8 ranks 2.0-2.3 against 3.9-4.0 ms). Each receiver reads a
/// sender's header before it posts the receives of its data, so it receives exactly what was sent
/// even when the ranks disagree: nothing is left in flight. Inline reductions combine the ranks'
/// values in recursive doubling's order (a balanced tree, the lower ranks' side first, the ranks
/// above a power of two folded into rank - p first), so every rank ends with the bytes that
/// AgreementExchange gives. @p a (this rank's agreement in, the combined one out) and @p peers
/// (indexed by rank, one Agreement for each other rank) must stay put until the exchange completes,
/// or for ever if it is abandoned.
class AllToAllAgreement {
 public:
  AllToAllAgreement(Agreement& a, Agreement* const* peers, MPI_Comm comm, int rank, int size)
      : a_(a), peers_(peers), comm_(comm), rank_(rank), size_(size) {
    headers_.resize(static_cast<std::size_t>(size), MPI_REQUEST_NULL);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      GPUCLOUD_MPI_CHECK(MPI_Irecv(peers_[q], static_cast<int>(kHeaderBytes), MPI_BYTE, q, kHeaderTag, comm_,
                                   &headers_[static_cast<std::size_t>(q)]));
    }
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      pending_.emplace_back();
      GPUCLOUD_MPI_CHECK(
          MPI_Isend(&a_, static_cast<int>(kHeaderBytes), MPI_BYTE, q, kHeaderTag, comm_, &pending_.back()));
      std::size_t offset = 0, bytes = 0;
      all_to_all_part(a_, rank_, q, size_, offset, bytes);
      pieces(a_.payload + offset, bytes, q, /*send=*/true);
    }
  }
  AllToAllAgreement(const AllToAllAgreement&) = delete;
  AllToAllAgreement& operator=(const AllToAllAgreement&) = delete;

  /// Progresses without blocking; true once this rank has the combined agreement.
  bool test() {
    if (done_) return true;
    for (int q = 0; q < size_ && headers_in_ < size_ - 1; ++q) {
      MPI_Request& h = headers_[static_cast<std::size_t>(q)];
      if (h == MPI_REQUEST_NULL) continue;
      int arrived = 0;
      GPUCLOUD_MPI_CHECK(MPI_Test(&h, &arrived, MPI_STATUS_IGNORE));  // (sets h to MPI_REQUEST_NULL)
      if (!arrived) continue;
      ++headers_in_;
      std::size_t offset = 0, bytes = 0;
      all_to_all_part(*peers_[q], q, rank_, size_, offset, bytes);
      pieces(peers_[q]->payload, bytes, q, /*send=*/false);
    }
    if (headers_in_ < size_ - 1) return false;
    int complete = 0;
    GPUCLOUD_MPI_CHECK(MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &complete, MPI_STATUSES_IGNORE));
    if (!complete) return false;
    if (!results_) {
      pending_.clear();
      combine();
      if (results_) return test();  // the second round of a split all-reduce, posted
    }
    done_ = true;
    return true;
  }

 private:
  // After the ring's tags, the direct transfers' and AgreementExchange's (0 and its tail tag).
  static constexpr int kHeaderTag = detail::kRingFirstTag + detail::kRingSlots + 1;
  static constexpr int kDataTag = kHeaderTag + 1;
  static constexpr int kResultTag = kHeaderTag + 2;  // a split all-reduce's second round
  // Eager pieces (kAgreementPieceBytes): a sender never waits for a descheduled receiver; the
  // receiver knows from the sender's header how many come.
  static constexpr int kPieceBytes = kAgreementPieceBytes;

  // Sends @p bytes at @p at to, or receives them from, rank @p peer, in pieces of kPieceBytes.
  void pieces(unsigned char* at, std::size_t bytes, int peer, bool send, int tag = kDataTag) {
    for (std::size_t done = 0; done < bytes; done += kPieceBytes) {
      const int n = static_cast<int>(std::min<std::size_t>(bytes - done, kPieceBytes));
      pending_.emplace_back();
      if (send) {
        GPUCLOUD_MPI_CHECK(MPI_Isend(at + done, n, MPI_BYTE, peer, tag, comm_, &pending_.back()));
      } else {
        GPUCLOUD_MPI_CHECK(MPI_Irecv(at + done, n, MPI_BYTE, peer, tag, comm_, &pending_.back()));
      }
    }
  }

  // a_ = every rank's agreement combined: the headers as max and -min, the route as max, and when
  // they agree and the data is inline, its result in a_.payload (as AgreementExchange leaves it).
  void combine() {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const Agreement& p = *peers_[q];
      for (int i = 0; i < kFields; ++i) {
        a_.high[i] = std::max(a_.high[i], p.high[i]);
        a_.low[i] = std::max(a_.low[i], p.low[i]);
      }
      a_.route = std::max(a_.route, p.route);
    }
    if (!carries(a_)) return;  // a disagreement (its payloads are not used) or nothing inline
    const auto kind = static_cast<Collective>(a_.high[0]);
    const auto t = static_cast<DType>(a_.high[4]);
    const std::size_t block = static_cast<std::size_t>(a_.high[3]) * dtype_size(t);
    switch (kind) {
      case Collective::all_gather:
        for (int q = 0; q < size_; ++q) {
          if (q != rank_) std::memcpy(a_.payload + static_cast<std::size_t>(q) * block, peers_[q]->payload, block);
        }
        return;
      case Collective::broadcast: {
        const int root = static_cast<int>(a_.high[2]);
        if (root != rank_) std::memcpy(a_.payload, peers_[root]->payload, payload_bytes(a_));
        return;
      }
      case Collective::reduce_scatter:
        reduce(a_.payload + static_cast<std::size_t>(rank_) * block, a_.high[3], t);
        return;
      default:
        if (!all_to_all_split(a_)) {
          reduce(a_.payload, a_.high[3], t);
          return;
        }
        split_round(t);
    }
  }
  // A split all-reduce: this rank's block of every rank's values, reduced; then its block to every
  // rank and theirs from them (this rank's values of the others' blocks went in the first round:
  // their region may be written).
  void split_round(DType t) {
    const std::size_t elem = dtype_size(t);
    std::int64_t at = 0, len = 0;
    ring_block(a_.high[3], size_, rank_, at, len);
    unsigned char* own = a_.payload + static_cast<std::size_t>(at) * elem;
    reduce(own, len, t);
    results_ = true;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      std::int64_t q_at = 0, q_len = 0;
      ring_block(a_.high[3], size_, q, q_at, q_len);
      pieces(a_.payload + static_cast<std::size_t>(q_at) * elem, static_cast<std::size_t>(q_len) * elem, q,
             /*send=*/false, kResultTag);
    }
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) pieces(own, static_cast<std::size_t>(len) * elem, q, /*send=*/true, kResultTag);
    }
  }
  // Every rank's @p count values (this rank's at @p mine, the others' at the start of their
  // peers_' payloads) reduced into @p mine in recursive doubling's order (AgreementExchange): the
  // ranks from the largest power of two p up folded into rank - p, then a balanced tree over p,
  // each pair as (lower rank's side) op (higher rank's side).
  void reduce(unsigned char* mine, std::int64_t count, DType t) {
    const auto op = static_cast<ReduceOp>(a_.high[1]);
    unsigned char* v[16];
    for (int q = 0; q < size_; ++q) v[q] = q == rank_ ? mine : peers_[q]->payload;
    int p = 1;
    while (p * 2 <= size_) p *= 2;
    for (int r = 0; r + p < size_; ++r) detail::reduce_elements(v[r], v[r + p], v[r], count, t, op);
    for (int mask = 1; mask < p; mask *= 2) {
      for (int r = 0; r < p; r += 2 * mask) detail::reduce_elements(v[r], v[r + mask], v[r], count, t, op);
    }
    if (v[0] != mine) std::memcpy(mine, v[0], static_cast<std::size_t>(count) * dtype_size(t));
  }

  Agreement& a_;
  Agreement* const* peers_;
  MPI_Comm comm_;
  int rank_, size_;
  std::vector<MPI_Request> headers_;  // the header from each other rank (MPI_REQUEST_NULL once in)
  std::vector<MPI_Request> pending_;  // every send, and the receives of the data posted so far
  int headers_in_ = 0;
  bool results_ = false;  // a split all-reduce's second round is posted
  bool done_ = false;
};

}  // namespace gpucloud::detail
