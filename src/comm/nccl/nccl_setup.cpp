// The NCCL backend's setup: the node structure and sub-communicators, the all-reduce timing the
// cost model asks for, and the constructors (one rank per process, or one process for every GPU).
#include "comm/nccl/nccl_communicator.hpp"
#include "comm/nccl/nccl_communicator_impl.hpp"

#include "comm/hierarchy.hpp"
#include "comm/nccl/nccl_check.hpp"
#include "memory/cuda/memory_backend.hpp"
#include "runtime/cuda/cuda_libraries.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace gpucloud {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId::bytes), "ncclUniqueId is 128 bytes");

namespace detail {

double NcclCommunicator::time_all_reduce(bool intra, std::size_t bytes, int repeats) {
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

// Every rank's @p mine (the same number of words on each), all-gathered over every rank in rank
// order (a collective of every rank, at setup).
std::vector<std::uint64_t> NcclCommunicator::gather_words(const std::vector<std::uint64_t>& mine) {
  const std::size_t k = mine.size();
  std::vector<std::uint64_t> all(k * static_cast<std::size_t>(size));
  void* buf = detail::cuda::allocate(MemoryKind::device, all.size() * sizeof(std::uint64_t), device.index());
  cudaStream_t s = nullptr;
  try {
    auto* slot = static_cast<std::uint64_t*>(buf) + k * static_cast<std::size_t>(rank);
    GPUCLOUD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(slot, mine.data(), k * sizeof(std::uint64_t), cudaMemcpyHostToDevice, s));
    GPUCLOUD_NCCL_CALL(*comms, ncclAllGather(slot, buf, k, ncclUint64, comms->all(), s));
    GPUCLOUD_CUDA_CHECK(
        cudaMemcpyAsync(all.data(), buf, all.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s));
    wait_stream(s, "Communicator::nccl", "the other ranks' host names and groups");
  } catch (...) {
    if (s) cudaStreamDestroy(s);
    detail::cuda::deallocate(MemoryKind::device, buf, device.index());
    throw;
  }
  cudaStreamDestroy(s);
  detail::cuda::deallocate(MemoryKind::device, buf, device.index());
  return all;
}

// The node structure, the barrier's word and the watchdog, once the communicator exists.
// Nodes are @p known (one process driving all its GPUs), else simulated (GPUCLOUD_LOCAL_SIZE),
// else found from every rank's host name: any rank order and uneven nodes are seen as they are
// (the hierarchical all-reduce then refuses, as on MPI), never assumed to be blocks.
void NcclCommunicator::finish_setup(std::optional<detail::NodeLayout> known) {
  constexpr const char* call = "Communicator::nccl";
  const detail::HierarchyRequest hierarchy = detail::hierarchy_from_environment(call);
  detail::DeviceGuard guard(device.index());
  detail::NodeLayout layout;
  if (known) {
    layout = *known;
  } else if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
    layout = detail::block_layout(rank, size, detail::local_size_from_environment(forced, size, call));
  } else {
    layout = detail::node_layout(gather_words({detail::host_key()}), rank);
  }
  local_rank = layout.local_rank;
  local_size = layout.local_size;
  node = layout.node;
  nodes = layout.nodes;
  uniform_nodes = layout.uniform;
  use_nodes_as_groups();
  detail::check_blocks(hierarchy, local_size, uniform_nodes, call);
  std::optional<detail::NodeLayout> grouped;
  if (!known && hierarchy.kind != detail::HierarchyRequest::Kind::node) {
    // The GPUs joined by NVLink (auto, nvlink), a NUMA node's or blocks of local ranks: every
    // rank's key, all-gathered, the same decision on every rank.
    const long long key = detail::local_subgroup_key(hierarchy, device.index(), local_rank);
    const auto words = gather_words({static_cast<std::uint64_t>(node), static_cast<std::uint64_t>(key)});
    grouped = detail::group_layout_of_pairs(std::vector<std::int64_t>(words.begin(), words.end()), rank);
  }
  if (grouped) {
    grouping = Hierarchy{detail::hierarchy_level(hierarchy, true), grouped->node, grouped->nodes, grouped->local_rank,
                         grouped->local_size};
    uniform_groups = true;
    comms->split(grouped->node, grouped->local_rank, rank, "Communicator::nccl: ncclCommSplit");
  } else if (nodes == 1) {
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

std::unique_ptr<Communicator::Impl> make_nccl_communicator(const NcclUniqueId& id, int rank, int size, Device device) {
  constexpr const char* call = "Communicator::nccl";
  GPUCLOUD_EXPECTS(size >= 1 && rank >= 0 && rank < size, call,
                   "rank: " + std::to_string(rank) + " is not a rank of " + std::to_string(size));
  GPUCLOUD_EXPECTS(device.is_cuda(), call, "device: NCCL communicators live on a GPU, not " + device.str());
  cuda::require(cuda::Library::nccl);  // loaded at first use: Unsupported naming it when it is missing
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
  detail::cuda::require(detail::cuda::Library::nccl);
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
  detail::cuda::require(detail::cuda::Library::nccl);
  const int n = static_cast<int>(list.size());
  std::vector<std::unique_ptr<detail::NcclCommunicator>> made;
  for (int i = 0; i < n; ++i) made.push_back(std::make_unique<detail::NcclCommunicator>(devices[i], i, n));
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

}  // namespace gpucloud
