/// @file transport.hpp
/// @brief A communicator over someone else's blocking host collectives: a framework's process
///        group (torch.distributed over gloo, through gpucloud.torch.distributed) or your own.
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>

#include <memory>

namespace gpucloud {

/// @brief Blocking collectives over host memory that Communicator::from_transport runs on.
///
/// gpucloud calls them on its host stream's worker thread, one at a time per communicator and in
/// the same order on every rank, after the ranks agreed on the collective (so a transport never
/// sees a mismatched call), under the communicator's timeout. Each blocks until done and throws
/// on failure (gpucloud reports it as a CommunicationError naming the operation).
class GPUCLOUD_API HostTransport {
 public:
  virtual ~HostTransport() = default;
  /// @brief This process's rank among size().
  virtual int rank() const = 0;
  /// @brief Number of ranks.
  virtual int size() const = 0;
  /// @brief In place: @p data holds this rank's values on entry, their reduction over the ranks
  ///        on return. @p op is sum, max or min (gpucloud divides for average).
  virtual void all_reduce(BufferView data, ReduceOp op) = 0;
  /// @brief @p recv (size() x send.size() elements, apart from @p send) gets every rank's
  ///        @p send in rank order.
  virtual void all_gather(BufferView send, BufferView recv) = 0;
  /// @brief @p data gets rank @p root's values on every rank.
  virtual void broadcast(BufferView data, int root) = 0;
  /// @brief A transport over the ranks whose @p color equals this rank's, ordered by @p key then
  ///        rank. Every rank calls it (a collective); gpucloud uses it for the node groups.
  virtual std::shared_ptr<HostTransport> split(int color, int key) = 0;
};

}  // namespace gpucloud
