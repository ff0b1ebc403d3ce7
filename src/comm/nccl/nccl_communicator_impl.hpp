// Internal: the NCCL backend of Communicator (not API). Its collectives and watchdog are in
// nccl_communicator.cpp, its setup (nodes, splits, the constructors) in nccl_setup.cpp, and
// comm_group in nccl_group.cpp.
//
// The communicators are non-blocking (nccl_comms.hpp): init, split, group end and finalize never
// wait for a missing peer past the timeout. Every collective is issued under the communicator's
// order lock, then an event is recorded after it. A watchdog thread polls ncclCommGetAsyncError
// and the events: a collective still pending after timeout(), or an asynchronous NCCL error,
// aborts the communicators (ncclCommAbort: the kernels return), breaks the communicator and puts a
// CommunicationError on the stream of every pending collective, raised at that stream's next
// synchronisation, as PyTorch's ProcessGroupNCCL watchdog does. The abort takes no lock a
// collective's issue holds for long: never the order lock, and NCCL's own only between polls.
#pragma once

#include <gpucloud/runtime/error.hpp>

#include "comm/communicator_impl.hpp"
#include "comm/nccl/nccl_comms.hpp"
#include "comm/node_layout.hpp"
#include "memory/access.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/native_stream.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gpucloud::detail {

struct NcclCommunicator;

/// The comm_group() open on this thread: its depth, the completion tracking deferred to its end
/// (when the kernels are really enqueued), and the communicators with a call in it (their NCCL
/// locks are taken around ncclGroupEnd).
struct NcclGroupState {
  int depth = 0;
  std::vector<std::function<void()>> deferred;
  std::vector<NcclCommunicator*> members;
};
/// This thread's group state.
NcclGroupState& nccl_group() noexcept;

/// A collective the watchdog waits for.
struct NcclPending {
  cudaEvent_t began;  // recorded before the collective: with done, its time on the GPU
  cudaEvent_t done;
  std::chrono::steady_clock::time_point start;
  const char* op;
  std::shared_ptr<StreamFailure> stream_failure;  // its stream's: where an abort's error goes
};

struct NcclCommunicator final : Communicator::Impl {
  std::unique_ptr<NcclComms> comms;  // every rank's, the node's, the cross-node one
  void* barrier_word = nullptr;
  void* agree_words = nullptr;         // GPUCLOUD_COMM_CHECKS=1: four int64 for the count/dtype agreement
  std::int64_t* agree_host = nullptr;  // and their pinned copy (a pageable one would block the copy)

  std::mutex watch_mutex;  // guards pending and stop
  std::condition_variable wake;
  std::deque<NcclPending> pending;
  bool stop = false;
  std::thread watchdog;

  /// Rank @p r of @p n on @p d: where, the timeout and the failure hook, before any NCCL call.
  NcclCommunicator(Device d, int r, int n);
  /// Stops the watchdog, then finalizes the communicators (aborts them past the timeout).
  ~NcclCommunicator() override;

  /// The node structure, the sub-communicators, the barrier's word and the watchdog, once the
  /// communicator exists: nodes are @p known, else GPUCLOUD_LOCAL_SIZE's blocks, else the ranks'
  /// host names; the hierarchy's groups split the nodes where GPUCLOUD_HIERARCHY finds NVLink
  /// islands, NUMA nodes or blocks (nccl_setup.cpp).
  void finish_setup(std::optional<NodeLayout> known);
  /// Every rank's words (as many on each), all-gathered in rank order (a collective, at setup).
  std::vector<std::uint64_t> gather_words(const std::vector<std::uint64_t>& mine);

  /// Buffers the collective may use: reachable from a stream of this communicator's GPU.
  void check_memory(BufferView v, StreamView s, const char* call, const char* arg) const {
    GPUCLOUD_EXPECTS(s.device() == device, call,
                     "stream: the NCCL communicator lives on " + device.str() + ", the stream on " + s.device().str());
    check_access(v, s, Access::kernel, call, arg);
  }
  /// Waits for @p s, never past the timeout (then the communicator is aborted and this throws).
  void wait_stream(cudaStream_t s, const char* op, const char* waiting_for);
  /// GPUCLOUD_COMM_CHECKS=1: every rank agrees on @p count and @p dtype before @p op runs.
  void agree(const char* op, std::int64_t count, DType dtype, cudaStream_t s);

  /// Issues @p issue (NCCL calls on the native stream) in order, then tracks its completion.
  template <class Issue>
  void enqueue(const char* op, StreamView stream, std::int64_t count, DType dtype, Issue issue) {
    std::lock_guard<std::mutex> lock(order);
    check_usable(op);
    DeviceGuard guard(device.index());
    const cudaStream_t s = cuda::native(stream);
    NcclGroupState& group = nccl_group();
    if (agree_words != nullptr && group.depth == 0) agree(op, count, dtype, s);
    if (group.depth > 0) join_group();
    cudaEvent_t began = nullptr;  // the communicator's own timing of the collective (busy_seconds)
    GPUCLOUD_CUDA_CHECK(cudaEventCreate(&began));
    GPUCLOUD_CUDA_CHECK(cudaEventRecord(began, s));
    {
      NvtxRange range(op);
      issue(s);
    }
    auto tracking = [this, op, stream, s, began] { track(op, stream, s, began); };
    if (group.depth > 0) {
      group.deferred.push_back(tracking);
    } else {
      tracking();
    }
  }
  /// This communicator has a call in the open group: its abort waits for the group's end.
  void join_group();
  /// An event after the collective for the watchdog, with the stream's failure slot.
  void track(const char* op, StreamView stream, cudaStream_t s, cudaEvent_t began);
  /// Breaks the communicator, puts @p why on every pending collective's stream and aborts
  /// (watch_mutex held).
  void fail(const std::string& why);
  /// What, if anything, is wrong now (watch_mutex held); retires completed collectives.
  std::string check_health();
  /// The watchdog's loop.
  void watch();
  void start_watchdog() {
    watchdog = std::thread([this] { watch(); });
  }

  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override;
  void all_gather(BufferView send, BufferView recv, StreamView stream) override;
  void broadcast(BufferView buffer, int root, StreamView stream) override;
  void barrier(StreamView stream) override;
  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override;
};

}  // namespace gpucloud::detail
