// The MPI backend of Communicator: host buffers, nonblocking MPI collectives run on the stream's
// worker and polled against the timeout; fp16/bf16 reductions through custom MPI ops.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/agreement.hpp"
#include "comm/communicator_impl.hpp"
#include "comm/host_checks.hpp"
#include "comm/mpi/mpi_check.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "runtime/access.hpp"
#include "runtime/host/deadline.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace gpucloud {

namespace {
// How the job ends after a collective timed out (CommunicationError's message).
constexpr const char* kEnds = "the job ends at exit (MPI_Abort) since MPI cannot finalise with the collective pending";
}  // namespace

using detail::Collective;
using detail::Signature;

// The agreement's reduction (defined with the agreement, below).
void combine_agreements(void* in, void* inout, int* len, MPI_Datatype* type);
struct Agreement;
std::size_t agreement_bytes();

namespace {

// ---- fp16 / bf16 on MPI: 2-byte types and reductions that add in fp32 --------------------------

struct NarrowTypes {
  MPI_Datatype f16 = MPI_DATATYPE_NULL, bf16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
  MPI_Datatype agreement = MPI_DATATYPE_NULL;  // one Agreement
  MPI_Op agree = MPI_OP_NULL;                  // combine_agreements
};

NarrowTypes& narrow();

template <class T, class Combine>
void combine_as(const unsigned char* in, unsigned char* inout, std::int64_t n, Combine combine) {
  for (std::int64_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, in + i * sizeof(T), sizeof(T));
    std::memcpy(&y, inout + i * sizeof(T), sizeof(T));
    const T r = combine(x, y);
    std::memcpy(inout + i * sizeof(T), &r, sizeof(T));
  }
}

template <class Combine>
void combine_narrow(const unsigned char* in, unsigned char* inout, std::int64_t n, bool half, Combine combine) {
  combine_as<std::uint16_t>(in, inout, n, [&](std::uint16_t a, std::uint16_t b) {
    const float x = half ? detail::half_bits_to_float(a) : detail::bfloat16_bits_to_float(a);
    const float y = half ? detail::half_bits_to_float(b) : detail::bfloat16_bits_to_float(b);
    const float r = combine(x, y);
    return half ? detail::float_to_half_bits(r) : detail::float_to_bfloat16_bits(r);
  });
}

// MPI's user op over 2-byte fp16 / bf16 elements: widened, combined in fp32, rounded once.
template <class Combine>
void reduce_narrow(void* in, void* inout, int* len, MPI_Datatype* type, Combine combine) {
  combine_narrow(static_cast<const unsigned char*>(in), static_cast<unsigned char*>(inout), *len, *type == narrow().f16,
                 combine);
}

void narrow_sum(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x + y; });
}
void narrow_max(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x > y ? x : y; });
}
void narrow_min(void* in, void* inout, int* len, MPI_Datatype* t) {
  reduce_narrow(in, inout, len, t, [](float x, float y) { return x < y ? x : y; });
}

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
    GPUCLOUD_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(agreement_bytes()), MPI_BYTE, &t.agreement));
    GPUCLOUD_MPI_CHECK(MPI_Type_commit(&t.agreement));
    GPUCLOUD_MPI_CHECK(MPI_Op_create(&combine_agreements, 1, &t.agree));
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

// The agreement is one MPI_Allreduce of one Agreement (a derived type, so MPI never splits it)
// under a commutative user op: the header fields combine as max and -min, so every rank learns
// whether all agreed; a collective whose data fits in the payload (kInlineBytes) travels inside the
// same message, combined by the op when the headers agree (reductions as the reduce op in the
// dtype, fp16/bf16 through fp32; all-gather and broadcast as bitwise OR of zero-filled slots). Small
// collectives so cost one small-message latency, like the raw call, with the checks on.
constexpr std::size_t kInlineBytes = 1024;
constexpr int kFields = detail::kAgreementFields;  // kind, op, root, count, dtype, inline
struct Agreement {
  std::int64_t high[kFields];  // max over ranks
  std::int64_t low[kFields];   // max of the negation: -min over ranks
  alignas(8) unsigned char payload[kInlineBytes];
};

std::size_t agreement_bytes() { return sizeof(Agreement); }
MPI_Datatype agreement_type() { return narrow().agreement; }
MPI_Op agreement_op() { return narrow().agree; }

bool consistent(const Agreement& a) {
  for (int i = 0; i < kFields; ++i) {
    if (a.high[i] != -a.low[i]) return false;
  }
  return true;
}

template <class Combine>
void combine_typed(DType t, const unsigned char* in, unsigned char* inout, std::int64_t n, Combine combine) {
  switch (t) {
    case DType::float32:
      return combine_as<float>(in, inout, n, combine);
    case DType::float64:
      return combine_as<double>(in, inout, n, combine);
    case DType::int32:
      return combine_as<std::int32_t>(in, inout, n, combine);
    case DType::int64:
      return combine_as<std::int64_t>(in, inout, n, combine);
    case DType::float16:
    case DType::bfloat16:
      return combine_narrow(in, inout, n, t == DType::float16, combine);
    default:
      return;
  }
}

void combine_agreements(void* in_v, void* inout_v, int* len, MPI_Datatype*) {
  for (int k = 0; k < *len; ++k) {
    const Agreement& in = static_cast<const Agreement*>(in_v)[k];
    Agreement& io = static_cast<Agreement*>(inout_v)[k];
    const bool same = consistent(in) && consistent(io) && std::equal(in.high, in.high + kFields, io.high);
    for (int i = 0; i < kFields; ++i) {
      io.high[i] = std::max(io.high[i], in.high[i]);
      io.low[i] = std::max(io.low[i], in.low[i]);
    }
    if (!same || in.high[5] == 0) continue;  // a disagreement (the payload is not used) or nothing inline
    const auto kind = static_cast<Collective>(in.high[0]);
    const auto t = static_cast<DType>(in.high[4]);
    if (kind == Collective::all_gather || kind == Collective::broadcast) {
      for (std::size_t i = 0; i < kInlineBytes; ++i) io.payload[i] |= in.payload[i];
      continue;
    }
    const std::int64_t n = in.high[3] * (kind == Collective::reduce_scatter ? in.high[5] : 1);
    switch (static_cast<ReduceOp>(in.high[1])) {
      case ReduceOp::sum:
      case ReduceOp::average:
        combine_typed(t, in.payload, io.payload, n, [](auto x, auto y) {
          using T = decltype(x);
          if constexpr (std::is_integral_v<T>) {  // wraps, as MPI_SUM does (signed overflow is undefined)
            using U = std::make_unsigned_t<T>;
            return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
          } else {
            return x + y;
          }
        });
        break;
      case ReduceOp::max:
        combine_typed(t, in.payload, io.payload, n, [](auto x, auto y) { return x > y ? x : y; });
        break;
      case ReduceOp::min:
        combine_typed(t, in.payload, io.payload, n, [](auto x, auto y) { return x < y ? x : y; });
        break;
    }
  }
}

// The MPI backend: the communicator's duplicate of the caller's MPI communicator, and the
// intra-node (local) and cross-node sub-communicators, built once. Enqueued work holds a
// shared_ptr to it, so a Communicator dropped while its collectives are queued stays alive until
// they have run.
struct MpiCommunicator final : Communicator::Impl, std::enable_shared_from_this<MpiCommunicator> {
  MPI_Comm world = MPI_COMM_NULL, local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
  // Elements per MPI call (MPI counts are int): larger all-reduces and broadcasts are split, larger
  // per-rank reduce-scatters and all-gathers are refused. GPUCLOUD_MPI_MAX_COUNT lowers it (tests).
  std::int64_t max_count = std::numeric_limits<int>::max();

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken communicator may still have an abandoned request in flight: freeing it then is
    // undefined, and the process is about to end the job anyway.
    if (finalized || broken) return;
    for (MPI_Comm* c : {&cross, &local, &world}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
  }

  // Every rank must agree on the operation, reduce op, root, count and dtype; a mismatch is a
  // CommunicationError on every rank instead of corrupted data, a hang or an MPI abort. @p a
  // carries this rank's inline payload in, and the combined one out.
  void agree(const char* call, const Signature& sig, Agreement& a) {
    std::int64_t fields[kFields];
    detail::agreement_fields(sig, a.high[5], fields);
    for (int i = 0; i < kFields; ++i) {
      a.high[i] = fields[i];
      a.low[i] = -fields[i];
    }
    GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &a, 1, agreement_type(), agreement_op(), world));
    detail::check_agreement(call, where, a.high, a.low);
  }

  // The one way a collective is enqueued: on the stream's worker, holding this communicator, in
  // one order per communicator, after every rank agreed on @p sig. When its data fits in
  // kInlineBytes (@p inline_bytes), @p pack writes it into the agreement's payload and @p unpack
  // reads the result from it: the agreement was the whole collective. Otherwise @p body runs the
  // MPI calls. They are the blocking (tuned) collectives, run under the timeout's deadline: a
  // watchdog abandons the worker of one that never completes, and the stream's waiters get the
  // CommunicationError.
  template <class Pack, class Unpack, class Body>
  void enqueue(StreamView stream, const char* call, Signature sig, std::size_t inline_bytes, Pack pack, Unpack unpack,
               Body body) {
    auto self = shared_from_this();
    launch_host_func(stream, [self, call, sig, inline_bytes, pack, unpack, body] {
      detail::NvtxRange range(call);
      self->check_usable(call);
      const auto began = std::chrono::steady_clock::now();  // the communicator's own timing (busy_seconds)
      detail::run_with_deadline(
          self->timeout,
          [&] {
            std::lock_guard<std::mutex> lock(self->order);  // inside the deadline: its holder may be stuck
            self->check_usable(call);
            Agreement a{};
            const bool inline_data = inline_bytes <= kInlineBytes;
            a.high[5] = inline_data ? self->size : 0;
            if (inline_data) pack(*self, a.payload);
            self->agree(call, sig, a);
            if (inline_data) {
              unpack(*self, a.payload);
            } else {
              body(*self);
            }
          },
          [&] { return self->timed_out(call, began, kEnds); });
      self->busy_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - began).count(),
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
// all, needs; more than kInlineBytes when it does not fit.
std::size_t inline_size(std::int64_t n, int parts, DType t) {
  if (n > static_cast<std::int64_t>(kInlineBytes)) return kInlineBytes + 1;
  return static_cast<std::size_t>(n) * static_cast<std::size_t>(parts) * dtype_size(t);
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
  enqueue(
      stream, call,
      {Collective::all_reduce, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, 1, recv.dtype()), pack_whole(send), unpack_reduced(recv, op),
      [send, recv, op, n](MpiCommunicator& c) {
        const MPI_Datatype type = mpi_type(recv.dtype(), call);
        const std::size_t elem = dtype_size(recv.dtype());
        const bool in_place = send.data() == recv.data();
        c.in_pieces(n, [&](std::int64_t at, std::int64_t count) {
          auto* out = static_cast<unsigned char*>(recv.data()) + at * elem;
          const void* in = in_place ? MPI_IN_PLACE : static_cast<const unsigned char*>(send.data()) + at * elem;
          GPUCLOUD_MPI_CHECK(MPI_Allreduce(in, out, static_cast<int>(count), type, mpi_op(op, recv.dtype()), c.world));
        });
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      });
}

void MpiCommunicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  check_all_reduce(send, recv, op, stream, call);
  const auto total = static_cast<std::int64_t>(send.size());
  enqueue(stream, call,
          {Collective::hierarchical_all_reduce, static_cast<std::int64_t>(op), -1, total,
           static_cast<std::int64_t>(send.dtype())},
          inline_size(total, 1, send.dtype()), pack_whole(send), unpack_reduced(recv, op),  // tiny: flat, inline
          [send, recv, op, total](MpiCommunicator& c) {
            const MPI_Datatype type = mpi_type(send.dtype(), call);
            const MPI_Op mop = mpi_op(op, send.dtype());
            const std::size_t elem = dtype_size(send.dtype());
            const int L = c.local_size;
            c.in_pieces(total, [&](std::int64_t at, std::int64_t n) {
              const auto* in = static_cast<const unsigned char*>(send.data()) + at * elem;
              auto* out = static_cast<unsigned char*>(recv.data()) + at * elem;
              // Shards of the piece over the node's ranks; the first n % L get one more.
              std::vector<int> counts(L), displs(L);
              for (int i = 0, pos = 0; i < L; ++i) {
                counts[i] = static_cast<int>(n / L + (i < n % L ? 1 : 0));
                displs[i] = pos;
                pos += counts[i];
              }
              // This rank's shard is computed in place, in recv, where the all-gather expects it.
              const int me = c.local_rank;
              unsigned char* mine = out + static_cast<std::size_t>(displs[me]) * elem;
              // (1) reduce-scatter inside the node
              if (in == out) {  // in place: MPI leaves the shard at the front of recv
                GPUCLOUD_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, out, counts.data(), type, mop, c.local));
                if (displs[me] != 0) std::memmove(mine, out, static_cast<std::size_t>(counts[me]) * elem);
              } else {
                GPUCLOUD_MPI_CHECK(MPI_Reduce_scatter(in, mine, counts.data(), type, mop, c.local));
              }
              // (2) all-reduce of the shard among the ranks holding it on the other nodes
              GPUCLOUD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mine, counts[me], type, mop, c.cross));
              // (3) all-gather inside the node
              GPUCLOUD_MPI_CHECK(
                  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, counts.data(), displs.data(), type, c.local));
            });
            if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
          });
}

void MpiCommunicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::reduce_scatter";
  check_host(send, stream, call, "send");
  check_host(recv, stream, call, "recv");
  check_reduction(op, send.dtype(), call);
  detail::check_no_overlap(recv, send, call, "send");
  check_count(recv, max_count, call, "recv");
  const auto n = static_cast<std::int64_t>(recv.size());
  enqueue(
      stream, call,
      {Collective::reduce_scatter, static_cast<std::int64_t>(op), -1, n, static_cast<std::int64_t>(recv.dtype())},
      inline_size(n, size, recv.dtype()), pack_whole(send),
      [recv, op, n](MpiCommunicator& c, const unsigned char* payload) {
        const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(recv.dtype());
        copy_bytes(recv.data(), payload + static_cast<std::size_t>(c.rank) * bytes, bytes);
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
      },
      [send, recv, op, n](MpiCommunicator& c) {
        GPUCLOUD_MPI_CHECK(MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(n),
                                                    mpi_type(recv.dtype(), call), mpi_op(op, recv.dtype()), c.world));
        if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
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
  enqueue(
      stream, call, {Collective::all_gather, -1, -1, n, static_cast<std::int64_t>(send.dtype())},
      inline_size(n, size, send.dtype()),
      [send](MpiCommunicator& c, unsigned char* payload) {  // into this rank's slot; the others stay 0
        copy_bytes(payload + static_cast<std::size_t>(c.rank) * send.size_bytes(), send.data(), send.size_bytes());
      },
      [recv](MpiCommunicator&, const unsigned char* payload) { copy_bytes(recv.data(), payload, recv.size_bytes()); },
      [send, recv, n](MpiCommunicator& c) {
        const MPI_Datatype type = mpi_type(send.dtype(), call);
        GPUCLOUD_MPI_CHECK(
            MPI_Allgather(send.data(), static_cast<int>(n), type, recv.data(), static_cast<int>(n), type, c.world));
      });
}

void MpiCommunicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  check_host(buffer, stream, call, "buffer");
  (void)mpi_type(buffer.dtype(), call);
  const auto n = static_cast<std::int64_t>(buffer.size());
  enqueue(
      stream, call, {Collective::broadcast, -1, root, n, static_cast<std::int64_t>(buffer.dtype())},
      inline_size(n, 1, buffer.dtype()),
      [buffer, root](MpiCommunicator& c, unsigned char* payload) {  // the root's data; the others' stay 0
        if (c.rank == root) copy_bytes(payload, buffer.data(), buffer.size_bytes());
      },
      [buffer](MpiCommunicator&, const unsigned char* payload) {
        copy_bytes(buffer.data(), payload, buffer.size_bytes());
      },
      [buffer, root, n](MpiCommunicator& c) {
        const MPI_Datatype type = mpi_type(buffer.dtype(), call);
        const std::size_t elem = dtype_size(buffer.dtype());
        c.in_pieces(n, [&](std::int64_t at, std::int64_t count) {
          GPUCLOUD_MPI_CHECK(MPI_Bcast(static_cast<unsigned char*>(buffer.data()) + at * elem, static_cast<int>(count),
                                       type, root, c.world));
        });
      });
}

void MpiCommunicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: the MPI backend runs on host streams");
  enqueue(
      stream, call, {Collective::barrier}, 0, [](MpiCommunicator&, unsigned char*) {},
      [](MpiCommunicator&, const unsigned char*) {},  // the agreement is the barrier
      [](MpiCommunicator& c) { GPUCLOUD_MPI_CHECK(MPI_Barrier(c.world)); });
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
