// The NCCL backend of Communicator: device buffers on CUDA streams of the communicator's GPU.
//
// The communicators are non-blocking (nccl_comms.hpp): init, split, group end and finalize never
// wait for a missing peer past the timeout. Every collective is issued under the communicator's
// order lock, then an event is recorded after it. A watchdog thread polls ncclCommGetAsyncError
// and the events: a collective still pending after timeout(), or an asynchronous NCCL error,
// aborts the communicators (ncclCommAbort: the kernels return), breaks the communicator and puts a
// CommunicationError on the stream of every pending collective, raised at that stream's next
// synchronisation, as PyTorch's ProcessGroupNCCL watchdog does. The abort takes no lock a
// collective's issue holds for long: never the order lock, and NCCL's own only between polls.
#include <gpucloud/runtime/error.hpp>

#include "comm/nccl/nccl_check.hpp"
#include "comm/nccl/nccl_comms.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "comm/nccl/nccl_wait.hpp"
#include "comm/node_layout.hpp"
#include "memory/access.hpp"
#include "memory/cuda/memory_backend.hpp"
#include "memory/workspace.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

namespace gpucloud {

struct NcclCommunicator;

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId::bytes), "ncclUniqueId is 128 bytes");

ncclDataType_t nccl_type(DType t, const char* call) {
  switch (t) {
    case DType::float32:
      return ncclFloat32;
    case DType::float64:
      return ncclFloat64;
    case DType::float16:
      return ncclFloat16;
    case DType::bfloat16:
      return ncclBfloat16;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
    case DType::uint8:
      return ncclUint8;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, call, std::string("dtype: ") + dtype_name(t) + " is not supported by collectives");
}

ncclRedOp_t nccl_op(ReduceOp op, DType t, const char* call) {
  GPUCLOUD_EXPECTS(op != ReduceOp::average || is_floating(t), call,
                   std::string("op: average needs a floating dtype, not ") + dtype_name(t));
  GPUCLOUD_EXPECTS(t != DType::uint8, call, "dtype: uint8 is not reducible");
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::average:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// Collectives issued inside comm_group() on this thread: their completion tracking runs after
// ncclGroupEnd, when the kernels are really enqueued; the communicators they use are the group's
// members (their NCCL locks are taken around ncclGroupEnd).
thread_local int group_depth = 0;
thread_local std::vector<std::function<void()>> group_deferred;
thread_local std::vector<NcclCommunicator*> group_members;

struct Pending {
  cudaEvent_t began;  // recorded before the collective: with done, its time on the GPU
  cudaEvent_t done;
  std::chrono::steady_clock::time_point start;
  const char* op;
  std::shared_ptr<detail::StreamFailure> stream_failure;  // its stream's: where an abort's error goes
};

}  // namespace

struct NcclCommunicator final : Communicator::Impl {
  std::unique_ptr<detail::NcclComms> comms;  // every rank's, the node's, the cross-node one
  void* barrier_word = nullptr;
  void* agree_words = nullptr;         // GPUCLOUD_COMM_CHECKS=1: four int64 for the count/dtype agreement
  std::int64_t* agree_host = nullptr;  // and their pinned copy (a pageable one would block the copy)

  std::mutex watch_mutex;  // guards pending and stop
  std::condition_variable wake;
  std::deque<Pending> pending;
  bool stop = false;
  std::thread watchdog;

  // Where, the timeout and the failure hook, before the first NCCL call.
  NcclCommunicator(Device d, int r, int n) {
    backend = CommBackend::nccl;
    device = d;
    rank = r;
    size = n;
    where = detail::where(rank) + " (" + device.str() + ")";
    timeout = detail::timeout_from_environment();
    comms = std::make_unique<detail::NcclComms>(where, timeout);
    comms->on_failure([this](const std::string& why) {
      std::lock_guard<std::mutex> lock(watch_mutex);
      fail(why);
    });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex);
      stop = true;
    }
    wake.notify_all();
    if (watchdog.joinable()) watchdog.join();
    detail::DeviceGuard guard(device.index());
    for (auto& p : pending) {
      cudaEventDestroy(p.began);
      cudaEventDestroy(p.done);
    }
    comms.reset();  // finalize (or abort, past the timeout) before the buffers go
    if (barrier_word != nullptr) detail::cuda::deallocate(MemoryKind::device, barrier_word, device.index());
    if (agree_words != nullptr) detail::cuda::deallocate(MemoryKind::device, agree_words, device.index());
    if (agree_host != nullptr) detail::cuda::deallocate(MemoryKind::pinned, agree_host, device.index());
  }

  // Buffers the collective may use: reachable from a stream of this communicator's GPU.
  void check_memory(BufferView v, StreamView s, const char* call, const char* arg) const {
    GPUCLOUD_EXPECTS(s.device() == device, call,
                     "stream: the NCCL communicator lives on " + device.str() + ", the stream on " + s.device().str());
    detail::check_access(v, s, detail::Access::kernel, call, arg);
  }

  // Waits for @p s to run what the caller enqueued (NCCL's kernels among it), never past the
  // timeout: a missing rank must not hang the host. Past it the communicator is aborted.
  void wait_stream(cudaStream_t s, const char* op, const char* waiting_for) {
    const detail::Settle r = detail::wait_to_settle(
        [&] {
          const cudaError_t q = cudaStreamQuery(s);
          if (q == cudaErrorNotReady) (void)cudaGetLastError();
          return static_cast<int>(q);
        },
        static_cast<int>(cudaErrorNotReady), timeout.load(), [this] { return broken.load(); });
    if (r.outcome == detail::SettleOutcome::settled) {
      GPUCLOUD_CUDA_CHECK(static_cast<cudaError_t>(r.state));
      return;
    }
    if (r.outcome == detail::SettleOutcome::stopped) {
      throw CommunicationError(op, where + ": the communicator broke while " + op + " waited for " + waiting_for,
                               __FILE__, __LINE__);
    }
    const std::string why = where + ": " + op + " waited " + std::to_string(r.waited.count()) + " ms for " +
                            waiting_for +
                            " (GPUCLOUD_COMM_TIMEOUT); the communicator is aborted (ncclCommAbort): later "
                            "collectives on it fail";
    {
      std::lock_guard<std::mutex> watching(watch_mutex);
      fail(why);
    }
    throw CommunicationError(op, why, __FILE__, __LINE__);
  }

  // GPUCLOUD_COMM_CHECKS=1: every rank must agree on the operation's count and dtype before it
  // runs (the MPI backend always checks; here it costs a host synchronisation per collective, as
  // PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does). A mismatch is an error on every rank.
  void agree(const char* op, std::int64_t count, DType dtype, cudaStream_t s) {
    const std::int64_t t = static_cast<std::int64_t>(dtype);
    std::int64_t* all = agree_host;
    all[0] = count, all[1] = -count, all[2] = t, all[3] = -t;
    const std::size_t bytes = 4 * sizeof(std::int64_t);
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(agree_words, all, bytes, cudaMemcpyHostToDevice, s));
    GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(agree_words, agree_words, 4, ncclInt64, ncclMax, comms->all(), s));
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(all, agree_words, bytes, cudaMemcpyDeviceToHost, s));
    wait_stream(s, op, "the other ranks to agree on its count");
    if (all[0] != -all[1] || all[2] != -all[3]) {
      throw CommunicationError(op,
                               where + ": ranks disagree on the count (" + std::to_string(-all[1]) + " to " +
                                   std::to_string(all[0]) + ") or the dtype; nothing was exchanged",
                               __FILE__, __LINE__);
    }
  }

  // Issues @p issue (NCCL calls on the native stream) in order, then tracks its completion.
  template <class Issue>
  void enqueue(const char* op, StreamView stream, std::int64_t count, DType dtype, Issue issue) {
    std::lock_guard<std::mutex> lock(order);
    check_usable(op);
    detail::DeviceGuard guard(device.index());
    const cudaStream_t s = detail::cuda::native(stream);
    if (agree_words != nullptr && group_depth == 0) agree(op, count, dtype, s);
    if (group_depth > 0) join_group();
    cudaEvent_t began = nullptr;  // the communicator's own timing of the collective (busy_seconds)
    GPUCLOUD_CUDA_CHECK(cudaEventCreate(&began));
    GPUCLOUD_CUDA_CHECK(cudaEventRecord(began, s));
    {
      detail::NvtxRange range(op);
      issue(s);
    }
    auto track = [this, op, stream, s, began] { this->track(op, stream, s, began); };
    if (group_depth > 0) {
      group_deferred.push_back(track);
    } else {
      track();
    }
  }

  // This communicator has a call in the open group: its abort waits for the group's end.
  void join_group() {
    for (NcclCommunicator* m : group_members) {
      if (m == this) return;
    }
    std::lock_guard<std::mutex> lock(comms->mutex());
    comms->group_opened();
    group_members.push_back(this);
  }

  // An event after the collective for the watchdog, which also keeps the stream's failure slot:
  // no host function per collective (it would stall the stream for a host round trip).
  void track(const char* op, StreamView stream, cudaStream_t s, cudaEvent_t began) {
    cudaEvent_t done = nullptr;
    GPUCLOUD_CUDA_CHECK(cudaEventCreate(&done));
    GPUCLOUD_CUDA_CHECK(cudaEventRecord(done, s));
    std::lock_guard<std::mutex> lock(watch_mutex);
    pending.push_back({began, done, std::chrono::steady_clock::now(), op, stream.impl()->failure()});
  }

  // Breaks the communicator, puts @p why on every pending collective's stream and aborts (watch_mutex held).
  void fail(const std::string& why) {
    const bool first = !broken.exchange(true);
    for (auto& p : pending) {
      p.stream_failure->set(std::make_exception_ptr(CommunicationError(p.op, why, __FILE__, __LINE__)));
    }
    comms->abort(why);
    if (first) std::fprintf(stderr, "gpucloud: %s\n", why.c_str());
  }

  // What, if anything, is wrong now (watch_mutex held): an asynchronous NCCL error, a failed or
  // a late collective. Completed collectives are retired.
  std::string check_health() {
    const ncclResult_t async = comms->async_error();
    if (async != ncclSuccess && async != ncclInProgress) {
      return where + ": NCCL reported an asynchronous error (" + ncclGetErrorString(async) +
             "); the communicator is aborted (ncclCommAbort): later collectives on it fail";
    }
    const auto now = std::chrono::steady_clock::now();
    while (!pending.empty()) {
      Pending& p = pending.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p.began, p.done) == cudaSuccess) {
          busy_ns.fetch_add(static_cast<std::int64_t>(static_cast<double>(ms) * 1e6), std::memory_order_relaxed);
        }
        cudaEventDestroy(p.began);
        cudaEventDestroy(p.done);
        pending.pop_front();
        continue;
      }
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.start);
      if (q != cudaErrorNotReady) return where + ": " + p.op + " failed on the GPU (" + cudaGetErrorString(q) + ")";
      if (waited > timeout.load()) {
        return where + ": " + p.op + " waited " + std::to_string(waited.count()) +
               " ms for the other ranks to finish the collective (GPUCLOUD_COMM_TIMEOUT): a rank is missing, "
               "stopped or dead, or the transfer needs longer than the timeout (then raise it: GPUCLOUD_COMM_TIMEOUT "
               "or set_timeout). The communicator is aborted (ncclCommAbort): later collectives on it fail";
      }
      break;  // collectives complete in order: the oldest pending one decides
    }
    return {};
  }

  void watch() {
    cudaSetDevice(device.index());
    std::unique_lock<std::mutex> lock(watch_mutex);
    while (!stop) {
      wake.wait_for(lock, std::chrono::milliseconds(50));
      if (stop || broken) continue;
      const std::string why = check_health();
      if (!why.empty()) fail(why);
    }
  }

  void start_watchdog() {
    watchdog = std::thread([this] { watch(); });
  }

  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::all_reduce";
    check_memory(send, stream, call, "send");
    check_memory(recv, stream, call, "recv");
    GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                     "recv: must match send's dtype and size");
    const ncclDataType_t type = nccl_type(send.dtype(), call);
    const ncclRedOp_t rop = nccl_op(op, send.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(send.size()), send.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(send.data(), recv.data(), recv.size(), type, rop, comms->all(), s));
    });
  }

  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::hierarchical_all_reduce";
    if (comms->local() == nullptr ||
        comms->cross() == nullptr) {  // one node, or one rank per node: the flat ring is it
      all_reduce(send, recv, op, stream);
      return;
    }
    check_memory(send, stream, call, "send");
    check_memory(recv, stream, call, "recv");
    GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                     "recv: must match send's dtype and size");
    // Its copies into and out of the padded scratch would run before a group's collectives.
    GPUCLOUD_EXPECTS(group_depth == 0, call, "cannot run inside comm_group(): it mixes copies with collectives");
    const ncclDataType_t type = nccl_type(send.dtype(), call);
    const ncclRedOp_t rop = nccl_op(op, send.dtype(), call);  // average: mean of node means (uniform nodes)
    if (send.empty()) return;
    const std::size_t n = send.size(), elem = dtype_size(send.dtype());
    const std::size_t L = static_cast<std::size_t>(local_size), shard = (n + L - 1) / L;
    enqueue(call, stream, static_cast<std::int64_t>(n), send.dtype(), [&](cudaStream_t s) {
      // Pad to L equal shards in scratch: reduce-scatter inside the node, all-reduce each shard
      // across nodes, all-gather inside the node, all in place; copy the n results out.
      const detail::Workspace padded(shard * L * elem, stream);
      auto* scratch = static_cast<unsigned char*>(padded.get());
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(scratch, send.data(), n * elem, cudaMemcpyDefault, s));
      if (shard * L > n) GPUCLOUD_CUDA_CHECK(cudaMemsetAsync(scratch + n * elem, 0, (shard * L - n) * elem, s));
      unsigned char* mine = scratch + static_cast<std::size_t>(local_rank) * shard * elem;
      GPUCLOUD_NCCL_CALL(*comms, ncclReduceScatter(scratch, mine, shard, type, rop, comms->local(), s));
      GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(mine, mine, shard, type, rop, comms->cross(), s));
      GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(mine, scratch, shard, type, comms->local(), s));
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(recv.data(), scratch, n * elem, cudaMemcpyDefault, s));
    });
  }

  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::reduce_scatter";
    check_memory(send, stream, call, "send");
    check_memory(recv, stream, call, "recv");
    detail::check_no_overlap(recv, send, call, "send");
    const ncclDataType_t type = nccl_type(send.dtype(), call);
    const ncclRedOp_t rop = nccl_op(op, send.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(recv.size()), recv.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CALL(*comms, ncclReduceScatter(send.data(), recv.data(), recv.size(), type, rop, comms->all(), s));
    });
  }

  void all_gather(BufferView send, BufferView recv, StreamView stream) override {
    constexpr const char* call = "Communicator::all_gather";
    check_memory(send, stream, call, "send");
    check_memory(recv, stream, call, "recv");
    detail::check_no_overlap(recv, send, call, "send");
    const ncclDataType_t type = nccl_type(send.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(send.size()), send.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(send.data(), recv.data(), send.size(), type, comms->all(), s));
    });
  }

  void broadcast(BufferView buffer, int root, StreamView stream) override {
    constexpr const char* call = "Communicator::broadcast";
    check_memory(buffer, stream, call, "buffer");
    const ncclDataType_t type = nccl_type(buffer.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(buffer.size()), buffer.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CALL(*comms,
                         ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), type, root, comms->all(), s));
    });
  }

  void barrier(StreamView stream) override {
    constexpr const char* call = "Communicator::barrier";
    GPUCLOUD_EXPECTS(
        stream.device() == device, call,
        "stream: the NCCL communicator lives on " + device.str() + ", the stream on " + stream.device().str());
    enqueue(call, stream, 0, DType::int32, [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(barrier_word, barrier_word, 1, ncclInt32, ncclMax, comms->all(), s));
    });
  }

  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override {
    constexpr const char* call = "Communicator::time_all_reduce";
    ncclComm_t c = intra ? comms->local() : comms->cross();
    detail::DeviceGuard guard(device.index());
    const std::size_t count = std::max<std::size_t>(bytes / 4, 1);
    void* buf = detail::cuda::allocate(MemoryKind::device, count * 4 + sizeof(double), device.index());
    cudaStream_t s = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    double seconds = 0;
    try {
      GPUCLOUD_CUDA_CHECK(cudaMemset(buf, 0, count * 4 + sizeof(double)));
      GPUCLOUD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      GPUCLOUD_CUDA_CHECK(cudaEventCreate(&a));
      GPUCLOUD_CUDA_CHECK(cudaEventCreate(&b));
      if (c != nullptr) {
        GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c, s));
        GPUCLOUD_CUDA_CHECK(cudaEventRecord(a, s));
        for (int i = 0; i < repeats; ++i)
          GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c, s));
        GPUCLOUD_CUDA_CHECK(cudaEventRecord(b, s));
        wait_stream(s, call, "the other ranks' all-reduces");
        float ms = 0;
        GPUCLOUD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        seconds = ms / 1e3 / repeats;
      }
      // The slowest rank's time counts.
      auto* t = reinterpret_cast<double*>(static_cast<unsigned char*>(buf) + count * 4);
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(t, &seconds, sizeof seconds, cudaMemcpyHostToDevice, s));
      GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(t, t, 1, ncclFloat64, ncclMax, comms->all(), s));
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(&seconds, t, sizeof seconds, cudaMemcpyDeviceToHost, s));
      wait_stream(s, call, "the other ranks' times");
    } catch (...) {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
      if (s) cudaStreamDestroy(s);
      detail::cuda::deallocate(MemoryKind::device, buf, device.index());
      throw;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    detail::cuda::deallocate(MemoryKind::device, buf, device.index());
    return seconds;
  }

  // Every rank's host key, all-gathered over every rank (a collective of every rank, at setup).
  std::vector<std::uint64_t> gather_host_keys() {
    std::vector<std::uint64_t> keys(static_cast<std::size_t>(size));
    keys[static_cast<std::size_t>(rank)] = detail::host_key();
    void* buf = detail::cuda::allocate(MemoryKind::device, keys.size() * sizeof(std::uint64_t), device.index());
    cudaStream_t s = nullptr;
    try {
      auto* slot = static_cast<std::uint64_t*>(buf) + rank;
      GPUCLOUD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(slot, &keys[static_cast<std::size_t>(rank)], sizeof(std::uint64_t),
                                          cudaMemcpyHostToDevice, s));
      GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(slot, buf, 1, ncclUint64, comms->all(), s));
      GPUCLOUD_CUDA_CHECK(
          cudaMemcpyAsync(keys.data(), buf, keys.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s));
      wait_stream(s, "Communicator::nccl", "the other ranks' host names");
    } catch (...) {
      if (s) cudaStreamDestroy(s);
      detail::cuda::deallocate(MemoryKind::device, buf, device.index());
      throw;
    }
    cudaStreamDestroy(s);
    detail::cuda::deallocate(MemoryKind::device, buf, device.index());
    return keys;
  }

  // The node structure, the barrier's word and the watchdog, once the communicator exists.
  // Nodes are @p known (one process driving all its GPUs), else simulated (GPUCLOUD_LOCAL_SIZE),
  // else found from every rank's host name: any rank order and uneven nodes are seen as they are
  // (the hierarchical all-reduce then refuses, as on MPI), never assumed to be blocks.
  void finish_setup(std::optional<detail::NodeLayout> known) {
    constexpr const char* call = "Communicator::nccl";
    detail::DeviceGuard guard(device.index());
    detail::NodeLayout layout;
    if (known) {
      layout = *known;
    } else if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
      layout = detail::block_layout(rank, size, detail::local_size_from_environment(forced, size, call));
    } else {
      layout = detail::node_layout(gather_host_keys(), rank);
    }
    local_rank = layout.local_rank;
    local_size = layout.local_size;
    node = layout.node;
    nodes = layout.nodes;
    uniform_nodes = layout.uniform;
    if (nodes == 1) {
      comms->alias_local();
    } else if (!uniform_nodes) {
      // Nodes of different sizes: no sub-communicators (the flat ring serves every collective).
    } else if (local_size > 1) {
      comms->split(node, local_rank, rank, "Communicator::nccl: ncclCommSplit");
    } else {
      comms->alias_cross();
    }
    barrier_word = detail::cuda::allocate(MemoryKind::device, sizeof(int), device.index());
    GPUCLOUD_CUDA_CHECK(cudaMemset(barrier_word, 0, sizeof(int)));
    if (const char* checks = std::getenv("GPUCLOUD_COMM_CHECKS"); checks != nullptr && std::string(checks) == "1") {
      agree_words = detail::cuda::allocate(MemoryKind::device, 4 * sizeof(std::int64_t), device.index());
      agree_host = static_cast<std::int64_t*>(
          detail::cuda::allocate(MemoryKind::pinned, 4 * sizeof(std::int64_t), device.index()));
    }
    start_watchdog();
  }
};

namespace {

// Closes the outermost group: ncclGroupEnd under every member's NCCL lock (taken in one order),
// then each member's communicators waited out against its timeout (non-blocking: the group end
// answers ncclInProgress). Returns the first member's error, after every member is settled.
void end_group(std::vector<NcclCommunicator*> members) {
  std::sort(members.begin(), members.end());
  ncclResult_t result;
  {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (NcclCommunicator* m : members) locks.emplace_back(m->comms->mutex());
    result = ncclGroupEnd();
    for (NcclCommunicator* m : members) m->comms->group_closed();
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    for (NcclCommunicator* m : members)
      m->comms->abort(std::string("ncclGroupEnd failed: ") + ncclGetErrorString(result));
    GPUCLOUD_NCCL_CHECK(result);
  }
  std::exception_ptr first;
  for (NcclCommunicator* m : members) {
    try {
      m->comms->settle("comm_group: ncclGroupEnd");
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

namespace detail {

std::unique_ptr<Communicator::Impl> make_nccl_communicator(const NcclUniqueId& id, int rank, int size, Device device) {
  constexpr const char* call = "Communicator::nccl";
  GPUCLOUD_EXPECTS(size >= 1 && rank >= 0 && rank < size, call,
                   "rank: " + std::to_string(rank) + " is not a rank of " + std::to_string(size));
  GPUCLOUD_EXPECTS(device.is_cuda(), call, "device: NCCL communicators live on a GPU, not " + device.str());
  auto c = std::make_unique<NcclCommunicator>(device, rank, size);
  DeviceGuard guard(device.index());
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof uid);
  // Non-blocking: a rank that never joins is a CommunicationError at the timeout, not a hang.
  c->comms->init_rank(uid, rank, size, "Communicator::nccl: ncclCommInitRankConfig");
  c->finish_setup(std::nullopt);
  return c;
}

}  // namespace detail

NcclUniqueId Communicator::nccl_unique_id() {
  ncclUniqueId uid;
  GPUCLOUD_NCCL_CHECK(ncclGetUniqueId(&uid));
  NcclUniqueId id;
  std::memcpy(id.bytes.data(), &uid, sizeof uid);
  return id;
}

Communicator Communicator::nccl(const NcclUniqueId& id, int rank, int size, Device device) {
  return Communicator(detail::make_nccl_communicator(id, rank, size, device));
}

std::vector<Communicator> Communicator::nccl_single_process(const std::vector<Device>& devices) {
  constexpr const char* call = "Communicator::nccl_single_process";
  GPUCLOUD_EXPECTS(!devices.empty(), call, "devices: at least one GPU");
  std::vector<int> list;
  for (const Device& d : devices) {
    GPUCLOUD_EXPECTS(d.is_cuda(), call, "devices: " + d.str() + " is not a GPU");
    for (int seen : list) GPUCLOUD_EXPECTS(seen != d.index(), call, "devices: " + d.str() + " is listed twice");
    list.push_back(d.index());
  }
  const int n = static_cast<int>(list.size());
  std::vector<std::unique_ptr<NcclCommunicator>> made;
  for (int i = 0; i < n; ++i) made.push_back(std::make_unique<NcclCommunicator>(devices[i], i, n));
  // ncclCommInitAll is blocking: one non-blocking init per device in a group instead.
  ncclUniqueId uid;
  GPUCLOUD_NCCL_CHECK(ncclGetUniqueId(&uid));
  ncclConfig_t config = detail::non_blocking_config();
  std::vector<ncclComm_t> raw(list.size(), nullptr);
  GPUCLOUD_NCCL_CHECK(ncclGroupStart());
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < n && (result == ncclSuccess || result == ncclInProgress); ++i) {
    detail::DeviceGuard guard(list[i]);
    result = ncclCommInitRankConfig(&raw[i], n, uid, i, &config);
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (result == ncclSuccess || result == ncclInProgress) result = ended;
  if (result != ncclSuccess && result != ncclInProgress) {
    for (ncclComm_t c : raw) {
      if (c != nullptr) ncclCommAbort(c);
    }
    GPUCLOUD_NCCL_CHECK(result);
  }
  for (int i = 0; i < n; ++i) {
    try {
      made[i]->comms->adopt(raw[i], "Communicator::nccl_single_process: ncclGroupEnd");
    } catch (...) {
      for (int j = i + 1; j < n; ++j) ncclCommAbort(raw[j]);  // not adopted yet: nothing else frees them
      throw;
    }
  }
  std::vector<Communicator> out;
  for (int i = 0; i < n; ++i) {
    made[i]->finish_setup(detail::NodeLayout{i, n, 0, 1, true});  // one process: one node
    out.push_back(Communicator(std::move(made[i])));
  }
  return out;
}

void comm_group(const std::function<void()>& issue) {
  GPUCLOUD_NCCL_CHECK(ncclGroupStart());
  ++group_depth;
  try {
    issue();
  } catch (...) {
    --group_depth;
    if (group_depth == 0) {
      group_deferred.clear();
      std::vector<NcclCommunicator*> members;
      members.swap(group_members);
      try {
        end_group(std::move(members));
      } catch (...) {  // the issue's own error is the one to report
      }
    } else {
      ncclGroupEnd();
    }
    throw;
  }
  --group_depth;
  if (group_depth > 0) {
    GPUCLOUD_NCCL_CHECK(ncclGroupEnd());  // nested: NCCL launches at the outermost end
    return;
  }
  std::vector<std::function<void()>> deferred;
  deferred.swap(group_deferred);
  std::vector<NcclCommunicator*> members;
  members.swap(group_members);
  end_group(std::move(members));
  for (auto& track : deferred) track();
}

}  // namespace gpucloud
