// The NCCL backend's collectives and watchdog (nccl_communicator_impl.hpp says how failures are
// handled).
#include "comm/nccl/nccl_communicator_impl.hpp"

#include "comm/nccl/nccl_wait.hpp"
#include "memory/cuda/memory_backend.hpp"
#include "memory/workspace.hpp"

#include <cstdio>
#include <exception>

namespace gpucloud::detail {

namespace {

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

}  // namespace

// Where, the timeout and the failure hook, before the first NCCL call.
NcclCommunicator::NcclCommunicator(Device d, int r, int n) {
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

NcclCommunicator::~NcclCommunicator() {
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

// Waits for @p s to run what the caller enqueued (NCCL's kernels among it), never past the
// timeout: a missing rank must not hang the host. Past it the communicator is aborted.
void NcclCommunicator::wait_stream(cudaStream_t s, const char* op, const char* waiting_for) {
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
  const std::string why = where + ": " + op + " waited " + std::to_string(r.waited.count()) + " ms for " + waiting_for +
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
void NcclCommunicator::agree(const char* op, std::int64_t count, DType dtype, cudaStream_t s) {
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

// An event after the collective for the watchdog, which also keeps the stream's failure slot:
// no host function per collective (it would stall the stream for a host round trip).
void NcclCommunicator::track(const char* op, StreamView stream, cudaStream_t s, cudaEvent_t began) {
  cudaEvent_t done = nullptr;
  GPUCLOUD_CUDA_CHECK(cudaEventCreate(&done));
  GPUCLOUD_CUDA_CHECK(cudaEventRecord(done, s));
  std::lock_guard<std::mutex> lock(watch_mutex);
  pending.push_back({began, done, std::chrono::steady_clock::now(), op, stream.impl()->failure()});
}

// Breaks the communicator, puts @p why on every pending collective's stream and aborts (watch_mutex held).
void NcclCommunicator::fail(const std::string& why) {
  const bool first = !broken.exchange(true);
  for (auto& p : pending) {
    p.stream_failure->set(std::make_exception_ptr(CommunicationError(p.op, why, __FILE__, __LINE__)));
  }
  comms->abort(why);
  if (first) std::fprintf(stderr, "gpucloud: %s\n", why.c_str());
}

// What, if anything, is wrong now (watch_mutex held): an asynchronous NCCL error, a failed or
// a late collective. Completed collectives are retired.
std::string NcclCommunicator::check_health() {
  const ncclResult_t async = comms->async_error();
  if (async != ncclSuccess && async != ncclInProgress) {
    return where + ": NCCL reported an asynchronous error (" + ncclGetErrorString(async) +
           "); the communicator is aborted (ncclCommAbort): later collectives on it fail";
  }
  const auto now = std::chrono::steady_clock::now();
  while (!pending.empty()) {
    NcclPending& p = pending.front();
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

void NcclCommunicator::watch() {
  cudaSetDevice(device.index());
  std::unique_lock<std::mutex> lock(watch_mutex);
  while (!stop) {
    wake.wait_for(lock, std::chrono::milliseconds(50));
    if (stop || broken) continue;
    const std::string why = check_health();
    if (!why.empty()) fail(why);
  }
}

void NcclCommunicator::all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
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

void NcclCommunicator::hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
  constexpr const char* call = "Communicator::hierarchical_all_reduce";
  if (comms->local() == nullptr || comms->cross() == nullptr) {  // one node, or one rank per node: the flat ring is it
    all_reduce(send, recv, op, stream);
    return;
  }
  check_memory(send, stream, call, "send");
  check_memory(recv, stream, call, "recv");
  GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                   "recv: must match send's dtype and size");
  // Its copies into and out of the padded scratch would run before a group's collectives.
  GPUCLOUD_EXPECTS(nccl_group().depth == 0, call, "cannot run inside comm_group(): it mixes copies with collectives");
  const ncclDataType_t type = nccl_type(send.dtype(), call);
  const ncclRedOp_t rop = nccl_op(op, send.dtype(), call);  // average: mean of node means (uniform nodes)
  if (send.empty()) return;
  const std::size_t n = send.size(), elem = dtype_size(send.dtype());
  const std::size_t L = static_cast<std::size_t>(grouping.group_size), shard = (n + L - 1) / L;
  enqueue(call, stream, static_cast<std::int64_t>(n), send.dtype(), [&](cudaStream_t s) {
    // Pad to L equal shards in scratch: reduce-scatter inside the group (a node, or its NVLink
    // island), all-reduce each shard across the groups, all-gather inside the group, all in place;
    // copy the n results out.
    const detail::Workspace padded(shard * L * elem, stream);
    auto* scratch = static_cast<unsigned char*>(padded.get());
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(scratch, send.data(), n * elem, cudaMemcpyDefault, s));
    if (shard * L > n) GPUCLOUD_CUDA_CHECK(cudaMemsetAsync(scratch + n * elem, 0, (shard * L - n) * elem, s));
    unsigned char* mine = scratch + static_cast<std::size_t>(grouping.group_rank) * shard * elem;
    GPUCLOUD_NCCL_CALL(*comms, ncclReduceScatter(scratch, mine, shard, type, rop, comms->local(), s));
    GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(mine, mine, shard, type, rop, comms->cross(), s));
    GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(mine, scratch, shard, type, comms->local(), s));
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(recv.data(), scratch, n * elem, cudaMemcpyDefault, s));
  });
}

void NcclCommunicator::reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) {
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

void NcclCommunicator::all_gather(BufferView send, BufferView recv, StreamView stream) {
  constexpr const char* call = "Communicator::all_gather";
  check_memory(send, stream, call, "send");
  check_memory(recv, stream, call, "recv");
  detail::check_no_overlap(recv, send, call, "send");
  const ncclDataType_t type = nccl_type(send.dtype(), call);
  enqueue(call, stream, static_cast<std::int64_t>(send.size()), send.dtype(), [&](cudaStream_t s) {
    GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(send.data(), recv.data(), send.size(), type, comms->all(), s));
  });
}

void NcclCommunicator::broadcast(BufferView buffer, int root, StreamView stream) {
  constexpr const char* call = "Communicator::broadcast";
  check_memory(buffer, stream, call, "buffer");
  const ncclDataType_t type = nccl_type(buffer.dtype(), call);
  enqueue(call, stream, static_cast<std::int64_t>(buffer.size()), buffer.dtype(), [&](cudaStream_t s) {
    GPUCLOUD_NCCL_CALL(*comms, ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), type, root, comms->all(), s));
  });
}

void NcclCommunicator::barrier(StreamView stream) {
  constexpr const char* call = "Communicator::barrier";
  GPUCLOUD_EXPECTS(
      stream.device() == device, call,
      "stream: the NCCL communicator lives on " + device.str() + ", the stream on " + stream.device().str());
  enqueue(call, stream, 0, DType::int32, [&](cudaStream_t s) {
    GPUCLOUD_NCCL_CALL(*comms, ncclAllReduce(barrier_word, barrier_word, 1, ncclInt32, ncclMax, comms->all(), s));
  });
}

}  // namespace gpucloud::detail
