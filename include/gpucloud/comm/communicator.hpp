/// @file communicator.hpp
/// @brief Communicators and stream-ordered collectives (NCCL for GPU buffers, MPI for host
///        buffers), with Horovod's hierarchical all-reduce.
#pragma once

#include <gpucloud/comm/cost_model.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gpucloud {

/// @brief How values are combined.
enum class ReduceOp { sum, average, max, min };

/// @brief Which library moves a communicator's data.
enum class CommBackend : std::uint8_t {
  mpi,        ///< OpenMPI: host buffers on host streams
  nccl,       ///< NCCL: device buffers on CUDA streams of the communicator's GPU
  transport,  ///< a HostTransport's host collectives (gloo through torch.distributed, your own)
};

/// @brief Which form all_reduce_auto() takes for a size.
enum class AllReduceForm : std::uint8_t {
  flat,          ///< all_reduce()
  hierarchical,  ///< hierarchical_all_reduce()
  measuring,     ///< the model's predictions tie: the next calls alternate the forms, timed
};

class HostTransport;

/// @brief NCCL's unique id (ncclUniqueId): made by one rank, handed to all by the caller (a
///        store, MPI, mpi4py, torch.distributed), then every rank joins with it.
struct NcclUniqueId {
  std::array<unsigned char, 128> bytes{};  ///< opaque
};

/// @brief Where this process sits in the job, as the launcher told it.
struct LaunchInfo {
  int rank = 0;          ///< global rank
  int size = 1;          ///< number of processes
  int local_rank = 0;    ///< rank within the node
  int local_size = 1;    ///< processes on the node
  std::string launcher;  ///< "mpirun", "srun", "torchrun", "slurm-batch" (a batch script) or "none"
  int node = 0;          ///< index of this process's node; -1 when the launcher does not say (mpirun)
  int nodes = 1;         ///< nodes in the job; 0 when the launcher does not say (mpirun)
};

/// @brief The inner groups of hierarchical_all_reduce and all_reduce_auto: the ranks joined by
///        the fastest link. A node by default; GPUCLOUD_HIERARCHY=nvlink|numa|K (or auto: NVLink
///        islands on NCCL) splits nodes into NVLink islands, NUMA nodes or blocks of K local ranks
///        where that gives groups of equal size, more than one per node.
struct Hierarchy {
  std::string level = "node";  ///< "node", "nvlink", "numa" or "blocks of K"
  int group = 0;               ///< this rank's group, numbered by first rank
  int groups = 1;              ///< groups in the communicator
  int group_rank = 0;          ///< rank within its group
  int group_size = 1;          ///< ranks per group (this rank's group's, when groups differ)
};

/// @brief Reads OMPI_COMM_WORLD_* (mpirun), SLURM_* of the step (srun: tasks per node in
///        Slurm's "4(x2)" / "3,1" form), PMI_* (MPICH), RANK / WORLD_SIZE / LOCAL_* / GROUP_*
///        (torchrun); GPUCLOUD_LOCAL_SIZE overrides the node size, so several "nodes" can be
///        simulated on one machine. A process started alone, or as Slurm's batch script, is rank 0 of 1.
/// @throws InvalidArgument naming the variable for inconsistent ones (a rank outside the size,
///         tasks per node that do not add up to the step, a local size that does not divide the size).
GPUCLOUD_API LaunchInfo launch_info_from_environment();

/// @brief A group of processes and the collectives between them.
///
/// Every operation is stream-ordered: it runs when the stream reaches it, and the stream's later
/// work sees its result. On the MPI backend the stream is a host stream and the buffers host
/// memory; on NCCL, a stream of the communicator's GPU and memory that GPU reaches. A collective
/// that does not complete within timeout() (GPUCLOUD_COMM_TIMEOUT seconds, default 600, like
/// PyTorch's NCCL default) raises CommunicationError naming the operation, the rank and the time
/// waited, at the stream's synchronisation; the communicator is then broken (every later
/// operation raises too). On NCCL a watchdog thread polls ncclCommGetAsyncError and the age of
/// every pending collective, and calls ncclCommAbort when one is late or has failed.
class GPUCLOUD_API Communicator {
 public:
  /// @brief All processes of the MPI job (MPI_Init_thread with MPI_THREAD_MULTIPLE if nobody has
  ///        initialised MPI yet; it is then finalised at exit). Nodes come from a shared-memory
  ///        split, or from GPUCLOUD_LOCAL_SIZE. Sub-communicators are built here, once.
  /// @throws Unsupported when built without MPI, CommunicationError when MPI fails,
  ///         InvalidArgument when the launcher's variables count more processes than MPI's world
  ///         (torchrun's WORLD_SIZE without mpirun: each process would be rank 0 of 1).
  static Communicator mpi_world();
  /// @brief The processes of an existing MPI intra-communicator, given by its Fortran handle
  ///        (`MPI_Comm_c2f(comm)` in C, `comm.py2f()` in mpi4py; gpucloud/mpi_interop.hpp takes an
  ///        MPI_Comm). The communicator is duplicated, so the caller's stays the caller's. MPI must
  ///        be initialised, with MPI_THREAD_MULTIPLE. A collective over the parent: all its ranks call.
  /// @throws InvalidArgument when MPI is not initialised or the handle is not a live
  ///         intra-communicator; Unsupported when built without MPI or without MPI_THREAD_MULTIPLE.
  static Communicator mpi(std::int64_t fortran_handle);
  /// @brief The ranks of a @p transport's blocking host collectives (gloo through
  ///        torch.distributed, your own; gpucloud/comm/transport.hpp): gpucloud's checks,
  ///        agreement, timeout, hierarchical all-reduce and buckets over them, on host streams.
  ///        Nodes from the ranks' host names (or GPUCLOUD_LOCAL_SIZE). GPUCLOUD_COMM_CHECKS=0 skips
  ///        the agreement before each collective. A collective: all ranks call.
  /// @throws InvalidArgument for a null transport, a rank outside its size, or a bad
  ///         GPUCLOUD_COMM_CHECKS (not 0 or 1).
  static Communicator from_transport(std::shared_ptr<HostTransport> transport);

  /// @brief A fresh NCCL unique id (ncclGetUniqueId), for rank 0 to hand to the others.
  /// @throws Unsupported when built without CUDA/NCCL.
  static NcclUniqueId nccl_unique_id();
  /// @brief Rank @p rank of @p size processes, one GPU each (@p device), joined through @p id
  ///        (ncclCommInitRank; a collective: every rank calls it). Nodes come from the ranks'
  ///        host names, all-gathered at setup (GPUCLOUD_LOCAL_SIZE overrides).
  /// @throws InvalidArgument for a rank outside the size or a non-CUDA device, Unsupported
  ///         without NCCL, CommunicationError when NCCL fails.
  static Communicator nccl(const NcclUniqueId& id, int rank, int size, Device device);
  /// @brief The MPI job's processes over NCCL, rank 0's unique id broadcast through MPI; the GPU
  ///        is @p device, or cuda(local rank % visible GPUs) when @p device is the host.
  static Communicator nccl_from_mpi(Device device = Device::host());
  /// @brief One process driving several GPUs (ncclCommInitAll): a communicator per device, ranks
  ///        in the order given. Issue their collectives inside comm_group().
  static std::vector<Communicator> nccl_single_process(const std::vector<Device>& devices);

  ~Communicator();
  Communicator(Communicator&&) noexcept;             ///< Moves ownership.
  Communicator& operator=(Communicator&&) noexcept;  ///< Moves ownership.
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  CommBackend backend() const noexcept;  ///< @brief Which library moves the data.
  Device device() const noexcept;        ///< @brief Where the buffers live (the host for MPI).
  int rank() const noexcept;             ///< @brief This process's rank.
  int size() const noexcept;             ///< @brief Number of processes.
  int local_rank() const noexcept;       ///< @brief Rank within the node.
  int local_size() const noexcept;       ///< @brief Processes per node.
  int node() const noexcept;             ///< @brief Index of this process's node.
  int nodes() const noexcept;            ///< @brief Number of nodes.
  Hierarchy hierarchy() const;           ///< @brief The hierarchical all-reduce's groups.
  /// @brief How long a collective may take before it is a CommunicationError.
  std::chrono::milliseconds timeout() const noexcept;
  /// @brief Changes the timeout for later operations.
  void set_timeout(std::chrono::milliseconds timeout);

  /// @brief recv = op over all ranks of send (in place when they are the same memory).
  ///        dtypes: float32/64, float16, bfloat16 (accumulated in fp32 pairwise), int32/64.
  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream);
  /// @brief The same result through the node hierarchy (Horovod): reduce-scatter inside each node,
  ///        all-reduce of each shard across nodes, all-gather inside each node. Any count.
  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream);
  /// @brief recv (count) = op over ranks of send's (size * count) slice number rank().
  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream);
  /// @brief recv (size * count) = every rank's send (count), in rank order.
  void all_gather(BufferView send, BufferView recv, StreamView stream);
  /// @brief buffer = root's buffer on every rank.
  void broadcast(BufferView buffer, int root, StreamView stream);
  /// @brief Returns (on the stream) once every rank has reached it.
  void barrier(StreamView stream);

  /// @brief Measures the cost model's alpha and beta for this job (a collective: every rank calls
  ///        it; takes a fraction of a second): timed all-reduces of 8 B and 4 MiB inside the nodes
  ///        and across them, solved for latency and inverse bandwidth. Synchronises @p stream.
  AllReduceCostModel measure_cost_model(StreamView stream);
  /// @brief The cost model all_reduce_auto() uses (set one measured earlier, or measure one).
  void set_cost_model(const AllReduceCostModel& model);
  /// @brief All-reduce, flat or hierarchical as the cost model predicts faster for this size
  ///        (flat when no model was set or measured). Where the predictions tie
  ///        (AllReduceCostModel::ties), the first 6 calls of a size class (powers of two) alternate
  ///        the forms, each waiting for @p stream before and after, and the slowest rank's
  ///        median time of each decides the class on every rank alike.
  void all_reduce_auto(BufferView send, BufferView recv, ReduceOp op, StreamView stream);
  /// @brief The form all_reduce_auto() takes for @p bytes now.
  AllReduceForm all_reduce_auto_form(std::size_t bytes) const;

  /// @brief True after a timeout or a failed collective; every later operation raises.
  bool broken() const noexcept;
  /// @brief Seconds the collectives completed so far took, measured by the backend itself (MPI:
  ///        around the calls on the stream's worker; NCCL: CUDA events around each collective,
  ///        counted once the watchdog sees it complete). Deltas of it are a step's comm time.
  double busy_seconds() const noexcept;

  struct Impl;  ///< the backend (internal)

 private:
  explicit Communicator(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the work enqueued on streams, which keeps it alive
};

/// @brief Runs @p issue, which enqueues collectives on several communicators of this process (one
///        per GPU, from Communicator::nccl_single_process), as one NCCL group (ncclGroupStart /
///        ncclGroupEnd), as NCCL requires when one thread drives several GPUs. Plain call on MPI.
GPUCLOUD_API void comm_group(const std::function<void()>& issue);

}  // namespace gpucloud
