// Internal: the MPI backend's agreement, every collective's first step. The ranks all-reduce one
// Agreement (what each is about to run, and the data itself when it fits in the payload) over
// point-to-point messages, polled against the timeout (not API).
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
  // A message goes as pieces of kPieceBytes and a last, shorter one (empty when the message is a
  // multiple): OpenMPI's shared-memory transport sends up to 4 KiB, its own header included,
  // without waiting for the receiver, and a larger message waits for the receiver's
  // acknowledgement, which on oversubscribed cores is a descheduled peer's wake-up (a 4 KiB
  // all-reduce's header and payload would be one such message). A piece shorter than kPieceBytes
  // ends the message, so the receiver knows from each piece's size whether another follows. The
  // first piece has tag 0, the others kTailTag (same-tag messages from one rank match in order).
  static constexpr int kPieceBytes = 4032;
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
