/// @file pool_resource.hpp
/// @brief Stream-ordered pools: a size-class pool over any upstream, and CUDA's async pool.
#pragma once

#include <gpucloud/memory/memory_resource.hpp>

#include <cstddef>
#include <memory>

namespace gpucloud {

/// @brief A caching pool with power-of-two size classes over an upstream resource.
///
/// Freed blocks return to their class and are reused by later requests of that class; a
/// stream-ordered free returns the block once the stream's earlier work has finished, so any
/// stream may reuse it safely. Requests above max_block_bytes go straight upstream. When the
/// upstream is out of memory the pool releases its cached blocks and retries once.
class GPUCLOUD_API PoolResource final : public MemoryResource {
 public:
  /// @brief Pools @p upstream (which must outlive the pool); classes from 256 B to @p max_block_bytes.
  explicit PoolResource(MemoryResource& upstream, std::size_t max_block_bytes = std::size_t{1} << 30);
  /// @brief Waits for pending stream-ordered frees, then returns every block upstream.
  ~PoolResource() override;

  /// @brief Returns every cached (free) block to the upstream.
  void release();
  /// @brief Bytes held from the upstream (in use and cached).
  std::size_t pool_bytes() const;
  /// @brief Bytes cached in free lists, ready for reuse.
  std::size_t cached_bytes() const;

 private:
  void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept override;
  struct State;
  std::unique_ptr<State> state_;
};

/// @brief CUDA's stream-ordered allocator (cudaMallocAsync on the device's default pool).
///
/// Only for device memory on a CUDA device; use PoolResource over a PlainResource on the host.
class GPUCLOUD_API AsyncPoolResource final : public MemoryResource {
 public:
  /// @brief The pool of CUDA device @p device. @throws InvalidArgument for the host.
  explicit AsyncPoolResource(Device device);

 private:
  void* do_allocate(std::size_t bytes, std::optional<StreamView> stream) override;
  void do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept override;
};

}  // namespace gpucloud
