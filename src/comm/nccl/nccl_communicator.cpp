// The NCCL backend of Communicator: device buffers on CUDA streams of the communicator's GPU.
//
// Every collective is issued under the communicator's order lock, then an event is recorded
// after it and a host function enqueued that raises the communicator's failure, if any, into the
// stream (it surfaces at the stream's synchronisation). A watchdog thread polls
// ncclCommGetAsyncError and the events: a collective still pending after timeout(), or an
// asynchronous NCCL error, aborts the communicator (ncclCommAbort: the kernels return) and breaks
// it, as PyTorch's ProcessGroupNCCL watchdog does.
#include <gpucloud/runtime/error.hpp>

#include "comm/nccl/nccl_check.hpp"
#include "comm/nccl/nccl_communicator.hpp"
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

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

namespace gpucloud {

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
// ncclGroupEnd, when the kernels are really enqueued.
thread_local int group_depth = 0;
thread_local std::vector<std::function<void()>> group_deferred;

// What a pending collective's host function reads: set by the watchdog when it aborts.
struct OpState {
  std::mutex mutex;
  std::string failure;  // empty: fine
};

struct Pending {
  cudaEvent_t began;  // recorded before the collective: with done, its time on the GPU
  cudaEvent_t done;
  std::chrono::steady_clock::time_point start;
  const char* op;
  std::shared_ptr<OpState> state;
};

}  // namespace

struct NcclCommunicator final : Communicator::Impl {
  ncclComm_t comm = nullptr;   // every rank
  ncclComm_t local = nullptr;  // this node's ranks (== comm with one node; null with one rank per node)
  ncclComm_t cross = nullptr;  // the ranks of this local rank on every node (null with one node)
  void* barrier_word = nullptr;
  void* agree_words = nullptr;         // GPUCLOUD_COMM_CHECKS=1: four int64 for the count/dtype agreement
  std::int64_t* agree_host = nullptr;  // and their pinned copy (a pageable one would block the copy)
  bool aborted = false;

  std::mutex watch_mutex;  // guards pending, aborted, stop
  std::condition_variable wake;
  std::deque<Pending> pending;
  bool stop = false;
  std::thread watchdog;

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
    if (!aborted) {
      if (cross != nullptr && cross != comm) ncclCommDestroy(cross);
      if (local != nullptr && local != comm) ncclCommDestroy(local);
      if (comm != nullptr) ncclCommDestroy(comm);
    }
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

  // GPUCLOUD_COMM_CHECKS=1: every rank must agree on the operation's count and dtype before it
  // runs (the MPI backend always checks; here it costs a host synchronisation per collective, as
  // PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does). A mismatch is an error on every rank.
  void agree(const char* op, std::int64_t count, DType dtype, cudaStream_t s) {
    const std::int64_t t = static_cast<std::int64_t>(dtype);
    std::int64_t* all = agree_host;
    all[0] = count, all[1] = -count, all[2] = t, all[3] = -t;
    const std::size_t bytes = 4 * sizeof(std::int64_t);
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(agree_words, all, bytes, cudaMemcpyHostToDevice, s));
    GPUCLOUD_NCCL_CHECK(ncclAllReduce(agree_words, agree_words, 4, ncclInt64, ncclMax, comm, s));
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(all, agree_words, bytes, cudaMemcpyDeviceToHost, s));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {  // wait, but never past the timeout: a missing rank must not hang the check
      const cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) GPUCLOUD_CUDA_CHECK(q);
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (waited > timeout.load()) {
        const std::string why = where + ": " + op + " waited " + std::to_string(waited.count()) +
                                " ms for the other ranks to agree on its count (GPUCLOUD_COMM_TIMEOUT); the "
                                "communicator is aborted (ncclCommAbort): later collectives on it fail";
        {
          std::lock_guard<std::mutex> watching(watch_mutex);
          if (!aborted) fail(why);
        }
        throw CommunicationError(op, why, __FILE__, __LINE__);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
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

  // An event after the collective for the watchdog, and a host function that raises the
  // communicator's failure into the stream.
  void track(const char* op, StreamView stream, cudaStream_t s, cudaEvent_t began) {
    auto state = std::make_shared<OpState>();
    cudaEvent_t done = nullptr;
    GPUCLOUD_CUDA_CHECK(cudaEventCreate(&done));
    GPUCLOUD_CUDA_CHECK(cudaEventRecord(done, s));
    {
      std::lock_guard<std::mutex> lock(watch_mutex);
      pending.push_back({began, done, std::chrono::steady_clock::now(), op, state});
    }
    stream.impl()->launch_host_func(
        [state, op] {
          std::lock_guard<std::mutex> lock(state->mutex);
          if (!state->failure.empty()) throw CommunicationError(op, state->failure, __FILE__, __LINE__);
        },
        /*always_run=*/false);
  }

  // Aborts the communicator and fails every pending collective with @p why (watch_mutex held).
  void fail(const std::string& why) {
    broken = true;
    for (auto& p : pending) {
      std::lock_guard<std::mutex> lock(p.state->mutex);
      p.state->failure = why;
    }
    if (!aborted) {
      aborted = true;
      if (cross != nullptr && cross != comm) ncclCommAbort(cross);
      if (local != nullptr && local != comm) ncclCommAbort(local);
      ncclCommAbort(comm);
    }
    std::fprintf(stderr, "gpucloud: %s\n", why.c_str());
  }

  // What, if anything, is wrong now (watch_mutex held): an asynchronous NCCL error, a failed or
  // a late collective. Completed collectives are retired.
  std::string check_health() {
    ncclResult_t async = ncclSuccess;
    for (ncclComm_t c : {comm, local, cross}) {
      if (c != nullptr && async == ncclSuccess && ncclCommGetAsyncError(c, &async) != ncclSuccess)
        async = ncclSystemError;
    }
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
      if (stop || aborted) continue;
      const std::string why = check_health();
      if (why.empty()) continue;
      // Abort with no collective being issued: take the order lock first, as enqueue does.
      lock.unlock();
      {
        std::lock_guard<std::mutex> issuing(order);
        std::lock_guard<std::mutex> watching(watch_mutex);
        if (!aborted) fail(why);
      }
      lock.lock();
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
      GPUCLOUD_NCCL_CHECK(ncclAllReduce(send.data(), recv.data(), recv.size(), type, rop, comm, s));
    });
  }

  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::hierarchical_all_reduce";
    if (local == nullptr || cross == nullptr) {  // one node, or one rank per node: the flat ring is it
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
      GPUCLOUD_NCCL_CHECK(ncclReduceScatter(scratch, mine, shard, type, rop, local, s));
      GPUCLOUD_NCCL_CHECK(ncclAllReduce(mine, mine, shard, type, rop, cross, s));
      GPUCLOUD_NCCL_CHECK(ncclAllGather(mine, scratch, shard, type, local, s));
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
      GPUCLOUD_NCCL_CHECK(ncclReduceScatter(send.data(), recv.data(), recv.size(), type, rop, comm, s));
    });
  }

  void all_gather(BufferView send, BufferView recv, StreamView stream) override {
    constexpr const char* call = "Communicator::all_gather";
    check_memory(send, stream, call, "send");
    check_memory(recv, stream, call, "recv");
    detail::check_no_overlap(recv, send, call, "send");
    const ncclDataType_t type = nccl_type(send.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(send.size()), send.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CHECK(ncclAllGather(send.data(), recv.data(), send.size(), type, comm, s));
    });
  }

  void broadcast(BufferView buffer, int root, StreamView stream) override {
    constexpr const char* call = "Communicator::broadcast";
    check_memory(buffer, stream, call, "buffer");
    const ncclDataType_t type = nccl_type(buffer.dtype(), call);
    enqueue(call, stream, static_cast<std::int64_t>(buffer.size()), buffer.dtype(), [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CHECK(ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), type, root, comm, s));
    });
  }

  void barrier(StreamView stream) override {
    constexpr const char* call = "Communicator::barrier";
    GPUCLOUD_EXPECTS(
        stream.device() == device, call,
        "stream: the NCCL communicator lives on " + device.str() + ", the stream on " + stream.device().str());
    enqueue(call, stream, 0, DType::int32, [&](cudaStream_t s) {
      GPUCLOUD_NCCL_CHECK(ncclAllReduce(barrier_word, barrier_word, 1, ncclInt32, ncclMax, comm, s));
    });
  }

  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override {
    ncclComm_t c = intra ? local : cross;
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
        GPUCLOUD_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c, s));
        GPUCLOUD_CUDA_CHECK(cudaEventRecord(a, s));
        for (int i = 0; i < repeats; ++i)
          GPUCLOUD_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c, s));
        GPUCLOUD_CUDA_CHECK(cudaEventRecord(b, s));
        GPUCLOUD_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        GPUCLOUD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        seconds = ms / 1e3 / repeats;
      }
      // The slowest rank's time counts.
      auto* t = reinterpret_cast<double*>(static_cast<unsigned char*>(buf) + count * 4);
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(t, &seconds, sizeof seconds, cudaMemcpyHostToDevice, s));
      GPUCLOUD_NCCL_CHECK(ncclAllReduce(t, t, 1, ncclFloat64, ncclMax, comm, s));
      GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(&seconds, t, sizeof seconds, cudaMemcpyDeviceToHost, s));
      GPUCLOUD_CUDA_CHECK(cudaStreamSynchronize(s));
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

  // Every rank's host key, all-gathered over comm (a collective of every rank, at setup).
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
      GPUCLOUD_NCCL_CHECK(ncclAllGather(slot, buf, 1, ncclUint64, comm, s));
      GPUCLOUD_CUDA_CHECK(
          cudaMemcpyAsync(keys.data(), buf, keys.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s));
      GPUCLOUD_CUDA_CHECK(cudaStreamSynchronize(s));
    } catch (...) {
      if (s) cudaStreamDestroy(s);
      detail::cuda::deallocate(MemoryKind::device, buf, device.index());
      throw;
    }
    cudaStreamDestroy(s);
    detail::cuda::deallocate(MemoryKind::device, buf, device.index());
    return keys;
  }

  // The node structure, the barrier's word, the timeout and the watchdog, once comm exists.
  // Nodes are @p known (one process driving all its GPUs), else simulated (GPUCLOUD_LOCAL_SIZE),
  // else found from every rank's host name: any rank order and uneven nodes are seen as they are
  // (the hierarchical all-reduce then refuses, as on MPI), never assumed to be blocks.
  void finish_setup(std::optional<detail::NodeLayout> known, ncclConfig_t* config) {
    detail::DeviceGuard guard(device.index());
    where = detail::where(rank) + " (" + device.str() + ")";
    timeout = detail::timeout_from_environment();
    detail::NodeLayout layout;
    if (known) {
      layout = *known;
    } else if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
      layout =
          detail::block_layout(rank, size, detail::local_size_from_environment(forced, size, "Communicator::nccl"));
    } else {
      layout = detail::node_layout(gather_host_keys(), rank);
    }
    local_rank = layout.local_rank;
    local_size = layout.local_size;
    node = layout.node;
    nodes = layout.nodes;
    uniform_nodes = layout.uniform;
    if (nodes == 1) {
      local = comm;
    } else if (!uniform_nodes) {
      // Nodes of different sizes: no sub-communicators (the flat ring serves every collective).
    } else if (local_size > 1) {
      GPUCLOUD_NCCL_CHECK(ncclCommSplit(comm, node, rank, &local, config));
      GPUCLOUD_NCCL_CHECK(ncclCommSplit(comm, local_rank, rank, &cross, config));
    } else {
      cross = comm;
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

namespace detail {

std::unique_ptr<Communicator::Impl> make_nccl_communicator(const NcclUniqueId& id, int rank, int size, Device device) {
  constexpr const char* call = "Communicator::nccl";
  GPUCLOUD_EXPECTS(size >= 1 && rank >= 0 && rank < size, call,
                   "rank: " + std::to_string(rank) + " is not a rank of " + std::to_string(size));
  GPUCLOUD_EXPECTS(device.is_cuda(), call, "device: NCCL communicators live on a GPU, not " + device.str());
  auto c = std::make_unique<NcclCommunicator>();
  c->backend = CommBackend::nccl;
  c->device = device;
  c->rank = rank;
  c->size = size;
  DeviceGuard guard(device.index());
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  GPUCLOUD_NCCL_CHECK(ncclCommInitRankConfig(&c->comm, size, uid, rank, &config));
  c->finish_setup(std::nullopt, &config);
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
  std::vector<ncclComm_t> comms(list.size(), nullptr);
  GPUCLOUD_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(list.size()), list.data()));
  std::vector<Communicator> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    auto c = std::make_unique<NcclCommunicator>();
    c->backend = CommBackend::nccl;
    c->device = devices[i];
    c->rank = static_cast<int>(i);
    c->size = static_cast<int>(list.size());
    c->comm = comms[i];
    c->finish_setup(detail::NodeLayout{c->rank, c->size, 0, 1, true}, nullptr);  // one process: one node
    out.push_back(Communicator(std::move(c)));
  }
  return out;
}

void comm_group(const std::function<void()>& issue) {
  GPUCLOUD_NCCL_CHECK(ncclGroupStart());
  ++group_depth;
  std::vector<std::function<void()>> deferred;
  try {
    issue();
  } catch (...) {
    --group_depth;
    ncclGroupEnd();
    if (group_depth == 0) group_deferred.clear();
    throw;
  }
  --group_depth;
  if (group_depth == 0) deferred.swap(group_deferred);
  GPUCLOUD_NCCL_CHECK(ncclGroupEnd());
  for (auto& track : deferred) track();
}

}  // namespace gpucloud
