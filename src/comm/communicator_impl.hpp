// Internal: what a Communicator backend (MPI: src/comm/mpi/, NCCL: src/comm/nccl/) provides (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>

#include "comm/auto_form.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpucloud {

/// The state every backend shares, and its operations. Public entry points validate what is
/// backend-independent; the backend checks memory and devices and enqueues the work.
struct Communicator::Impl {
  virtual ~Impl() = default;

  CommBackend backend = CommBackend::mpi;
  Device device = Device::host();  // where its buffers live (host for MPI)
  int rank = 0, size = 1, local_rank = 0, local_size = 1, node = 0, nodes = 1;
  bool uniform_nodes = true;
  // The hierarchical all-reduce's inner groups (Communicator::hierarchy): the nodes unless the
  // backend split them (GPUCLOUD_HIERARCHY).
  Hierarchy grouping;
  bool uniform_groups = true;
  /// The groups are the nodes.
  void use_nodes_as_groups() {
    grouping = Hierarchy{"node", node, nodes, local_rank, local_size};
    uniform_groups = uniform_nodes;
  }
  std::atomic<std::chrono::milliseconds> timeout{std::chrono::milliseconds(600000)};  // set_timeout races with workers
  std::atomic<bool> broken{false};
  std::atomic<std::int64_t> busy_ns{0};  // time the collectives took, measured by the backend
  std::mutex order;                      // collectives on one communicator are issued in one order on every rank
  std::string where;                     // "host:rank N" for messages
  std::optional<AllReduceCostModel> model;
  // all_reduce_auto's trials by size class where the model ties (cleared with a new model).
  mutable std::mutex auto_lock;
  std::unordered_map<int, detail::AutoFormTrials> auto_trials;
  void forget_auto_trials() {
    std::lock_guard<std::mutex> lock(auto_lock);
    auto_trials.clear();
  }

  /// Throws CommunicationError when an earlier timeout or failure broke the communicator.
  void check_usable(const char* op) const;
  /// The error of collective @p op that did not complete within the timeout (waited since
  /// @p began); breaks the communicator and records why for the exit handler. @p ends says how
  /// the job ends.
  std::exception_ptr timed_out(const char* op, std::chrono::steady_clock::time_point began, const char* ends);

  virtual void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) = 0;
  virtual void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) = 0;
  virtual void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) = 0;
  virtual void all_gather(BufferView send, BufferView recv, StreamView stream) = 0;
  virtual void broadcast(BufferView buffer, int root, StreamView stream) = 0;
  virtual void barrier(StreamView stream) = 0;
  /// Seconds per all-reduce of @p bytes within the node (intra) or across nodes (!intra), the
  /// slowest rank's; a collective (every rank calls it). Synchronous.
  virtual double time_all_reduce(bool intra, std::size_t bytes, int repeats) = 0;
  /// Whether this backend's flat all-reduce (beyond its inline sizes) halves and doubles on this
  /// job rather than running a ring: the cost model's flat_halving.
  virtual bool flat_all_reduce_halves() const { return false; }
};

namespace detail {

/// GPUCLOUD_COMM_TIMEOUT (seconds, fractions allowed, 0.001 to 1e9) or the default of 600 s.
/// @throws InvalidArgument naming the variable for anything else (inf, nan, text, out of range).
std::chrono::milliseconds timeout_from_environment();

/// GPUCLOUD_LOCAL_SIZE's value @p text as processes per simulated node of a @p world_size job.
/// @throws InvalidArgument naming the variable unless it is an integer that divides the job.
int local_size_from_environment(const char* text, int world_size, const char* call);

/// Expands Slurm's tasks-per-node list ("4(x2)" -> 4,4; "2(x3),1" -> 2,2,2,1) read from the
/// variable @p name. @throws InvalidArgument naming it when it is not such a list.
std::vector<int> parse_slurm_tasks_per_node(const std::string& text, const char* name);

/// Records that a collective was abandoned (a timeout): the job can then no longer finalise MPI.
void note_broken_communicator(const std::string& why);

/// At exit: when a collective was abandoned, prints why and ends the whole job (MPI_Abort), since
/// MPI_Finalize would wait for the missing rank (or crash when it shows up late). Otherwise returns.
void end_job_if_communicator_broke() noexcept;

/// Ends every process of the job with @p code: MPI_Abort when MPI is up, else _Exit.
[[noreturn]] void abort_job(int code) noexcept;

/// "hostname:rank N", for messages.
std::string where(int rank);

}  // namespace detail
}  // namespace gpucloud
