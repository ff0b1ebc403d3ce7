// The MPI backend of Communicator: host buffers; every collective after an agreement of the ranks
// on it. Small ones travel inside the agreement, large ones (on 2 ranks; from (p - 2) x 512 KiB on
// more, all-reduces on one node from max(384 KiB, (p - 2) x 256 KiB)) in a polled ring of
// point-to-point messages, all-reduces on 4, 8 or 16 ranks below that (or on several nodes) in
// polled halving and doubling, reduce-scatters and all-gathers on one node in halving/doubling or
// the ring at every size, broadcasts on 3+ ranks in a binomial tree (all on the caller's thread
// when the stream is idle), the rest in MPI's blocking collectives on the stream's worker under a
// watchdog; fp16/bf16 reduce through custom MPI ops.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/agreement.hpp"
#include "comm/communicator_impl.hpp"
#include "comm/host_checks.hpp"
#include "comm/host_reduce.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/mpi/ring.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "memory/access.hpp"
#include "runtime/host/deadline.hpp"
#include "runtime/host/host_stream.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace gpucloud {

namespace {
// How the job ends after a collective timed out (CommunicationError's message).
constexpr const char* kEnds = "the job ends at exit (MPI_Abort) since MPI cannot finalise with the collective pending";

// A collective of at most this many bytes in all that runs as a RingCollective runs on the
// caller's thread when the stream is idle (as inline collectives do); larger ones stay
// asynchronous on the worker, so a caller overlapping communication with compute is not held for
// the transfer.
constexpr std::size_t kInPlaceRingBytes = std::size_t{1} << 20;
}  // namespace

using detail::Collective;
using detail::Signature;

namespace {

// ---- fp16 / bf16 on MPI: 2-byte types and reductions that add in fp32 --------------------------

struct NarrowTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};

NarrowTypes& narrow();

// MPI's user op over 2-byte fp16 / bf16 elements: inout = in (op) inout, widened, combined in
// fp32, rounded once (the ring's and the agreement's reduction).
void reduce_narrow(void* in, void* inout, int* len, MPI_Datatype* type, ReduceOp op) {
  detail::reduce_elements(static_cast<const unsigned char*>(in), static_cast<const unsigned char*>(inout),
                          static_cast<unsigned char*>(inout), *len,
                          *type == narrow().f16 ? DType::float16 : DType::bfloat16, op);
}

void narrow_sum(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::sum); }
void narrow_max(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::max); }
void narrow_min(void* in, void* inout, int* len, MPI_Datatype* t) { reduce_narrow(in, inout, len, t, ReduceOp::min); }

NarrowTypes& narrow() {
  static NarrowTypes t;
  return t;
}

void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      GPUCLOUD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    // Registered after the finalisation above, so it runs before it: a job with an abandoned
    // collective ends (MPI_Abort) instead of waiting in MPI_Finalize for the missing rank.
    std::atexit([] { detail::end_job_if_communicator_broke(); });
    int provided = 0;
    GPUCLOUD_MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      GPUCLOUD_FAIL(Unsupported, "Communicator::mpi_world",
                    "MPI was initialised without MPI_THREAD_MULTIPLE, which stream workers need");
    }
    NarrowTypes& t = narrow();
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.f16));
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.bf16));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_sum, 1, &t.sum));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_max, 1, &t.max));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&narrow_min, 1, &t.min));
  });
}

MPI_Datatype mpi_type(DType t, const char* call) {
  switch (t) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::float16:
      return narrow().f16;
    case DType::bfloat16:
      return narrow().bf16;
    case DType::uint8:
      return MPI_UINT8_T;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, call, std::string("dtype: ") + dtype_name(t) + " is not supported by collectives");
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  const bool narrow_type = t == DType::float16 || t == DType::bfloat16;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return narrow_type ? narrow().sum : MPI_SUM;
    case ReduceOp::max:
      return narrow_type ? narrow().max : MPI_MAX;
    case ReduceOp::min:
      return narrow_type ? narrow().min : MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace

// The agreement is an all-reduce of one Agreement by AgreementExchange (below): the header
// fields combine as max and -min, so every rank learns whether all agreed; a collective whose
// data fits in the payload (kInlineBytes) travels inside the same messages, combined when the
// headers agree. Small collectives so cost what a small all-reduce costs, with the checks on.
constexpr std::size_t kInlineBytes = 65536;
constexpr int kFields = detail::kAgreementFields;  // kind, op, root, count, dtype, inline
struct Agreement {
  std::int64_t high[kFields];  // max over ranks
  std::int64_t low[kFields];   // max of the negation: -min over ranks
  alignas(8) unsigned char payload[kInlineBytes];
};
constexpr std::size_t kHeaderBytes = offsetof(Agreement, payload);

// Bytes of the payload a consistent inline agreement uses (what inline_size() gave each rank).
std::size_t payload_bytes(const Agreement& a) {
  const auto kind = static_cast<Collective>(a.high[0]);
  const bool per_rank = kind == Collective::all_gather || kind == Collective::reduce_scatter;
  return static_cast<std::size_t>(a.high[3]) * static_cast<std::size_t>(per_rank ? a.high[5] : 1) *
         dtype_size(static_cast<DType>(a.high[4]));
}

bool consistent(const Agreement& a) {
  for (int i = 0; i < kFields; ++i) {
    if (a.high[i] != -a.low[i]) return false;
  }
  return true;
}

// Whether a consistent agreement's payload is used: its data is inline.
bool carries(const Agreement& a) { return a.high[5] != 0 && consistent(a); }

// The messages of the whole-payload exchange: the header, and the payload when the data is inline
// and the headers so far agree (a disagreement's payload is never used, and its sizes may be anything).
int wire_bytes(const Agreement& a) {
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

// The MPI backend: the communicator's duplicate of the caller's MPI communicator, and the
// intra-node (local) and cross-node sub-communicators, built once. Enqueued work holds a
// shared_ptr to it, so a Communicator dropped while its collectives are queued stays alive until
// they have run.
struct MpiCommunicator final : Communicator::Impl, std::enable_shared_from_this<MpiCommunicator> {
  MPI_Comm world = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  MPI_Comm agreement = MPI_COMM_NULL;  // world's duplicate, for the agreement's messages alone
  // The agreement's buffers (this rank's, and what peers send), made once and used under `order`:
  // 64 KiB each, allocated per call they cost page faults whenever malloc returns the top of its
  // heap to the system (2 ranks from Python, 32 KiB all-reduce: 35-50 µs instead of 17).
  std::unique_ptr<Agreement> own_agreement{new Agreement}, peer_agreement{new Agreement}, out_agreement{new Agreement};
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
      (void)ring_scratch.release();
      (void)halving_workspace.release();
      return;
    }
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

  // Drives a polled exchange (an AgreementExchange, a RingCollective) until @p test() is true, the
  // core yielded every kYieldEvery-th test. MPI's own progress already yields on an idle test
  // under mpi_yield_when_idle (oversubscribed cores), so extra yields only cost: every 4th made
  // 4 ranks on 2 cores pay +2.3-6.3 µs over the raw call at 8 B, every 8th +1.1-3.5 µs (never
  // yielding +1.2-4.7 µs); never yielding also lets a polling stream worker starve the trainer's own
  // thread (2-rank train_mlp 101-185 k samples/s against 190-215 k every 8th). It throws the timeout's
  // CommunicationError once the collective has taken `timeout` since @p began, its messages left
  // to MPI: on the caller's thread that is the timeout; on the worker the watchdog's deadline
  // fires at the same time, and the throw ends the abandoned worker's loop (a blocking MPI call
  // would keep it spinning until the process ends).
  static constexpr unsigned kYieldEvery = 8;
  struct Poll {
    MpiCommunicator& c;
    const char* call;
    std::chrono::steady_clock::time_point began;
    template <class Test>
    void operator()(Test test) const {
      const std::chrono::milliseconds limit = c.timeout.load();
      for (unsigned tests = 1; !test(); ++tests) {
        if (std::chrono::steady_clock::now() - began >= limit) {
          std::rethrow_exception(c.timed_out(call, began, kEnds));
        }
        if (tests % kYieldEvery == 0) std::this_thread::yield();
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
  // The halving reduce-scatter's whole vector of partial results (at least @p bytes), grown when a
  // larger one comes (`order` held; nothing is in flight then) and, like the scratch, never freed
  // once a timeout broke the communicator. At most the ring's smallest size (on 16 ranks 7 MiB).
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

  // A collective run by the calling thread when @p stream is idle and no other collective of this
  // communicator is in flight: no hand-off to the worker, which on busy cores costs more than the
  // message. Either its data fits in the agreement (@p inline_bytes: the agreement is the whole
  // collective, @p unpack reads the result) or @p body only polls MPI (a RingCollective). Both are
  // polled against the timeout instead of the watchdog; after a timeout the pending messages are
  // left to MPI (their buffers never freed: the missing rank may still write them) and the stream
  // holds the CommunicationError, as when the worker's call is abandoned. False: enqueue it.
  template <class Pack, class Unpack, class Body>
  bool run_in_place(StreamView stream, const char* call, const Signature& sig, std::size_t inline_bytes,
                    const Pack& pack, const Unpack& unpack, const Body& body) {
    std::unique_lock<std::mutex> lock(order, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    return static_cast<detail::HostStream&>(*stream.impl()).run_now_if_idle([&] {
      detail::NvtxRange range(call);
      check_usable(call);
      const Poll poll{*this, call, std::chrono::steady_clock::now()};
      Agreement& a = make_agreement(sig, inline_bytes, pack);
      AgreementExchange exchange(a, *peer_agreement, *out_agreement, agreement, rank, size);
      poll([&] { return exchange.test(); });
      detail::check_agreement(call, where, a.high, a.low);
      if (inline_bytes <= kInlineBytes) {
        unpack(*this, a.payload);
      } else {
        body(*this, poll);
      }
      busy_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - poll.began).count(),
          std::memory_order_relaxed);
    });
  }

  // The one way a collective is issued: in one order per communicator, after every rank agreed on
  // @p sig. When its data fits in kInlineBytes (@p inline_bytes), @p pack writes it into the
  // agreement's payload and @p unpack reads the result from it: the agreement was the whole
  // collective, run in place when the stream is idle (run_in_place). Otherwise @p body(comm, poll)
  // runs after the agreement: either MPI's blocking (tuned) collectives, or a RingCollective that
  // only waits through `poll` (@p ring_bytes, its bytes in all, non-zero), in place when the stream
  // is idle up to kInPlaceRingBytes. On the stream's worker it holds this communicator and runs
  // under the timeout's deadline: a watchdog abandons the worker of a collective that never
  // completes, and the stream's waiters get the CommunicationError.
  template <class Pack, class Unpack, class Body>
  void enqueue(StreamView stream, const char* call, Signature sig, std::size_t inline_bytes, Pack pack, Unpack unpack,
               Body body, std::size_t ring_bytes = 0) {
    const bool ring_in_place = ring_bytes != 0 && ring_bytes <= kInPlaceRingBytes;
    if ((inline_bytes <= kInlineBytes || ring_in_place) &&
        run_in_place(stream, call, sig, inline_bytes, pack, unpack, body))
      return;
    auto self = shared_from_this();
    launch_host_func(stream, [self, call, sig, inline_bytes, pack, unpack, body] {
      detail::NvtxRange range(call);
      self->check_usable(call);
      const Poll poll{*self, call, std::chrono::steady_clock::now()};  // busy_seconds' timing too
      detail::run_with_deadline(
          self->timeout,
          [&] {
            std::lock_guard<std::mutex> lock(self->order);  // inside the deadline: its holder may be stuck
            self->check_usable(call);
            Agreement& a = self->make_agreement(sig, inline_bytes, pack);
            AgreementExchange exchange(a, *self->peer_agreement, *self->out_agreement, self->agreement, self->rank,
                                       self->size);
            poll([&] { return exchange.test(); });
            detail::check_agreement(call, self->where, a.high, a.low);
            if (inline_bytes <= kInlineBytes) {
              unpack(*self, a.payload);
            } else {
              body(*self, poll);
            }
          },
          [&] { return self->timed_out(call, poll.began, kEnds); });
      self->busy_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - poll.began).count(),
          std::memory_order_relaxed);
    });
  }

  // Runs @p one(offset, count) over [0, n) in pieces of at most max_count elements.
  template <class One>
  void in_pieces(std::int64_t n, One one) const {
    for (std::int64_t at = 0; at < n; at += max_count) one(at, std::min(max_count, n - at));
  }

  // A communicator over a duplicate of @p parent: nodes from GPUCLOUD_LOCAL_SIZE or a
  // shared-memory split, the cross-node communicator, the timeout from GPUCLOUD_COMM_TIMEOUT.
  static std::shared_ptr<MpiCommunicator> build(MPI_Comm parent, const char* call);

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

void detail::abort_job(int code) noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Communicator Communicator::mpi_world() {
  constexpr const char* call = "Communicator::mpi_world";
  ensure_mpi();
  // A process the launcher counts in a larger job, alone in MPI's world (torchrun starts
  // processes without MPI: each would be "rank 0 of 1" and train on its own).
  const LaunchInfo launch = launch_info_from_environment();
  int world = 1;
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  // Slurm's batch script in an allocation of several tasks: the ranks are what srun starts.
  const char* tasks = std::getenv("SLURM_NTASKS");
  GPUCLOUD_EXPECTS(launch.launcher != "slurm-batch" || world > 1 || tasks == nullptr || std::atoi(tasks) <= 1, call,
                   std::string("this process is Slurm's batch script, not one of the allocation's ") + tasks +
                       " tasks (SLURM_NTASKS): start the ranks with srun (srun --mpi=pmix ./trainer) or mpirun");
  GPUCLOUD_EXPECTS(launch.size == world, call,
                   "the launcher (" + launch.launcher + ") started " + std::to_string(launch.size) +
                       " processes but MPI's world has " + std::to_string(world) +
                       (launch.launcher == "torchrun" ? " (WORLD_SIZE without mpirun)" : "") +
                       ": start the job with mpirun or srun, or use NCCL ids through the launcher's store "
                       "(gpucloud.distributed)");
  return Communicator(MpiCommunicator::build(MPI_COMM_WORLD, call));
}

Communicator Communicator::nccl_from_mpi(Device device) {
  constexpr const char* call = "Communicator::nccl_from_mpi";
  Communicator world = mpi_world();
  const auto& mpi = static_cast<const MpiCommunicator&>(*world.impl_);
  if (device.is_host()) {
    const int gpus = cuda_device_count();
    GPUCLOUD_EXPECTS(gpus > 0, call, "device: no GPU is visible (" + cuda_unavailable_reason() + ")");
    device = Device::cuda(mpi.local_rank % gpus);
  }
  // Rank 0 makes the id, MPI hands it to everyone (a failure on rank 0 is everyone's).
  NcclUniqueId id;
  int ok = 1;
  std::string why;
  if (mpi.rank == 0) {
    try {
      id = nccl_unique_id();
    } catch (const Error& e) {
      ok = 0;
      why = e.what();
    }
  }
  GPUCLOUD_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, mpi.world));
  if (!ok)
    GPUCLOUD_FAIL(CommunicationError, call,
                  "rank 0 could not make a NCCL unique id: " + (why.empty() ? std::string("see rank 0") : why));
  GPUCLOUD_MPI_CHECK(MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, mpi.world));
  return Communicator(detail::make_nccl_communicator(id, mpi.rank, mpi.size, device));
}

Communicator Communicator::mpi(std::int64_t fortran_handle) {
  int initialized = 0, finalized = 0;
  GPUCLOUD_MPI_CHECK(MPI_Initialized(&initialized));
  GPUCLOUD_MPI_CHECK(MPI_Finalized(&finalized));
  GPUCLOUD_EXPECTS(initialized && !finalized, "Communicator::mpi",
                   "fortran_handle: MPI is not initialised (or already finalised), so no MPI communicator exists");
  const MPI_Comm parent = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  GPUCLOUD_EXPECTS(parent != MPI_COMM_NULL && static_cast<std::int64_t>(MPI_Comm_c2f(parent)) == fortran_handle,
                   "Communicator::mpi",
                   "fortran_handle: " + std::to_string(fortran_handle) + " is not a live MPI communicator");
  int inter = 0;
  GPUCLOUD_MPI_CHECK(MPI_Comm_test_inter(parent, &inter));
  GPUCLOUD_EXPECTS(!inter, "Communicator::mpi", "fortran_handle: an inter-communicator; pass an intra-communicator");
  ensure_mpi();
  return Communicator(MpiCommunicator::build(parent, "Communicator::mpi"));
}

std::shared_ptr<MpiCommunicator> MpiCommunicator::build(MPI_Comm parent, const char* call) {
  auto c = std::make_shared<MpiCommunicator>();
  c->timeout = detail::timeout_from_environment();  // the environment first: a bad value changes nothing
  if (const char* m = std::getenv("GPUCLOUD_MPI_MAX_COUNT"); m != nullptr && *m != '\0') {
    char* end = nullptr;
    const long long v = std::strtoll(m, &end, 10);
    GPUCLOUD_EXPECTS(end != m && *end == '\0' && v >= 1 && v <= c->max_count, call,
                     std::string("GPUCLOUD_MPI_MAX_COUNT: '") + m + "' is not a count in [1, 2147483647]");
    c->max_count = v;
  }
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(parent, &c->world));
  GPUCLOUD_MPI_CHECK(MPI_Comm_dup(c->world, &c->agreement));
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->world, &c->rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->world, &c->size));
  c->where = detail::where(c->rank);
  if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
    // Simulated nodes are blocks of the job's world ranks, whatever communicator this is: a
    // sub-communicator's ranks keep the nodes their processes are on.
    int world_rank = 0, world_size = 1;
    GPUCLOUD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    GPUCLOUD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    const int local_size = detail::local_size_from_environment(forced, world_size, call);
    GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, world_rank / local_size, c->rank, &c->local));
  } else {
    GPUCLOUD_MPI_CHECK(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &c->local));
  }
  GPUCLOUD_MPI_CHECK(MPI_Comm_rank(c->local, &c->local_rank));
  GPUCLOUD_MPI_CHECK(MPI_Comm_size(c->local, &c->local_size));
  GPUCLOUD_MPI_CHECK(MPI_Comm_split(c->world, c->local_rank, c->rank, &c->cross));
  int sizes[2] = {c->local_size, -c->local_size};
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, c->world));
  c->uniform_nodes = sizes[0] == -sizes[1];
  // The nodes of the job and this rank's node, the same on every rank also when nodes differ in
  // size (where a cross-node communicator does not span every node): node k is the k-th distinct
  // node leader (a node's lowest rank) in rank order.
  int leader = c->rank;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(&c->rank, &leader, 1, MPI_INT, MPI_MIN, c->local));
  std::vector<int> leaders(static_cast<std::size_t>(c->size));
  GPUCLOUD_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, c->world));
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  c->nodes = static_cast<int>(leaders.size());
  c->node = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) - leaders.begin());
  return c;
}

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
// inline against 0.65-0.69x, broadcast 16 KiB 0.27-0.30x against 0.48-0.53x).
std::size_t inline_other_limit(int size, Collective kind) {
  if (size == 2) return std::size_t{16} << 10;
  if ((size & (size - 1)) == 0) return kInlineBytes;
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
  const bool one_node = comm == c.local || c.nodes == 1;
  detail::RingCollective ring(kind, send, recv, n, t, op, comm, rank, size, c.scratch(), root, steps, one_node);
  poll([&] { return ring.test(); });
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
  const bool halving = detail::halving_applies(recv.size_bytes(), size, nodes, kInlineBytes);
  const bool ring = detail::all_reduce_ring_applies(recv.size_bytes(), size, nodes, kInlineBytes);
  enqueue(
      stream, call,
      {Collective::all_reduce, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, 1, recv.dtype()), pack_whole(send), unpack_reduced(recv, op),
      [send, recv, op, n, ring, halving](MpiCommunicator& c, const auto& poll) {
        if (ring || halving) {
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
      ring || halving ? recv.size_bytes() : 0);
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
        const std::int64_t L = c.local_size, me = c.local_rank;
        const std::int64_t shard = total / L + (me < total % L ? 1 : 0),
                           offset = me * (total / L) + std::min(me, total % L);
        unsigned char* mine = static_cast<unsigned char*>(recv.data()) + static_cast<std::size_t>(offset) * elem;
        // (1) reduce-scatter inside the node: this rank's shard of the sum into recv
        run_ring(c, poll, c.local, detail::RingKind::all_reduce, send.data(), recv.data(), total, t, op, 0,
                 detail::RingSteps::reduce_scatter_half);
        // (2) all-reduce of the shard among the ranks holding it on the other nodes, in place
        const std::size_t bytes = static_cast<std::size_t>(shard) * elem;
        const auto across = detail::halving_applies(bytes, c.nodes, c.nodes, 0) ? detail::RingKind::all_reduce_halving
                                                                                : detail::RingKind::all_reduce;
        run_ring(c, poll, c.cross, across, mine, mine, shard, t, op);
        // (3) all-gather inside the node
        run_ring(c, poll, c.local, detail::RingKind::all_reduce, recv.data(), recv.data(), total, t, op, 0,
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
  const std::size_t limit = inline_other_limit(size, Collective::reduce_scatter);
  const bool ring = detail::ring_applies_per_rank(send.size_bytes(), size, nodes, limit);
  // 4, 8 or 16 ranks below the ring's sizes: the halving all-reduce's first half, polled.
  const bool halving = detail::halving_applies(send.size_bytes(), size, 1, limit);
  enqueue(
      stream, call,
      {Collective::reduce_scatter, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, size, recv.dtype(), limit), pack_whole(send),
      [recv, op, n](MpiCommunicator& c, const unsigned char* payload) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(recv.dtype());
        copy_bytes(recv.data(), payload + static_cast<std::size_t>(c.rank) * bytes, bytes);
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      [send, recv, op, n, ring, halving](MpiCommunicator& c, const auto& poll) {
        if (ring) {
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
      ring || halving ? send.size_bytes() : 0);
}

void MpiCommunicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  (void)mpi_type(send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  check_count(send, max_count, call, "send");
  const auto n = static_cast<std::int64_t>(send.size());
  const std::size_t limit = inline_other_limit(size, Collective::all_gather);
  const bool ring = detail::ring_applies_per_rank(recv.size_bytes(), size, nodes, limit);
  // 4, 8 or 16 ranks below the ring's sizes: the halving all-reduce's second half (recursive
  // doubling), polled.
  const bool doubling = detail::halving_applies(recv.size_bytes(), size, 1, limit);
  enqueue(
      stream, call, {Collective::all_gather, -1, -1, n, static_cast<std::int64_t>(send.dtype())},
      inline_size(n, size, send.dtype(), limit),
      [send](MpiCommunicator& c, unsigned char* payload) {  // into this rank's slot; the others 0
        const std::size_t slot = send.size_bytes(), at = static_cast<std::size_t>(c.rank) * slot;
        std::memset(payload, 0, slot * static_cast<std::size_t>(c.size));
        copy_bytes(payload + at, send.data(), slot);
      },
      [recv](MpiCommunicator&, const unsigned char* payload) { copy_bytes(recv.data(), payload, recv.size_bytes()); },
      [send, recv, n, ring, doubling](MpiCommunicator& c, const auto& poll) {
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
      ring || doubling ? recv.size_bytes() : 0);
}

void MpiCommunicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  check_host(buffer, stream, call, "buffer");
  (void)mpi_type(buffer.dtype(), call);
  const auto n = static_cast<std::int64_t>(buffer.size());
  const std::size_t limit = inline_other_limit(size, Collective::broadcast);
  const bool ring = detail::ring_applies(buffer.size_bytes(), size, limit);
  const bool tree = detail::tree_applies(buffer.size_bytes(), size, limit);  // 3+ ranks, below the chain
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
      [buffer, root, n, ring, tree](MpiCommunicator& c, const auto& poll) {
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
      ring || tree ? buffer.size_bytes() : 0);
}

void MpiCommunicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: the MPI backend runs on host streams");
  enqueue(
      stream, call, {Collective::barrier}, 0, [](MpiCommunicator&, unsigned char*) {},
      [](MpiCommunicator&, const unsigned char*) {},  // the agreement is the barrier
      [](MpiCommunicator& c, const auto&) { GPUCLOUD_MPI_CHECK(MPI_Barrier(c.world)); });
}

}  // namespace gpucloud

namespace gpucloud {

double MpiCommunicator::time_all_reduce(bool intra, std::size_t bytes, int repeats) {
  const MPI_Comm comm = intra ? local : cross;
  std::vector<float> buf(std::max<std::size_t>(bytes / 4, 1));
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  GPUCLOUD_MPI_CHECK(MPI_Barrier(world));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) {
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, comm));
  }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeats;
  GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, world));
  return t;
}

}  // namespace gpucloud
