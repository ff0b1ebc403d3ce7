/// @file prefetcher.hpp
/// @brief A training-loop batch prefetcher: the next batches are already on the device.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace gpucloud {

/// @brief One batch as the source produces it: host arrays (inputs, labels, ...).
struct HostBatch {
  std::vector<BufferView> arrays;    ///< host memory, pageable or pinned
  std::shared_ptr<void> keep_alive;  ///< held until the batch's copies have finished, then released
};

/// @brief Produces the next host batch, or std::nullopt at the end; may throw.
using BatchSource = std::function<std::optional<HostBatch>()>;

/// @brief Tuning of a Prefetcher.
struct PrefetchOptions {
  int depth = 2;                         ///< batches kept ready on the device ahead of the consumer
  MemoryKind kind = MemoryKind::device;  ///< device or managed memory for the batches
};

namespace detail {
struct PrefetchShared;
}

/// @brief A batch on the device, handed to the consumer by Prefetcher::next().
///
/// Move-only. Its device memory is released in the order of the stream it was handed to, so it
/// may be dropped as soon as the work that reads it has been enqueued.
class GPUCLOUD_API Batch {
 public:
  ~Batch();
  Batch(Batch&&) noexcept;             ///< Moves ownership.
  Batch& operator=(Batch&&) noexcept;  ///< Moves ownership.
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  /// @brief 0, 1, 2, ... in the order the source produced them.
  std::size_t index() const noexcept { return index_; }
  /// @brief The arrays, in device memory, in the source's order.
  const std::vector<BufferView>& arrays() const noexcept { return arrays_; }
  /// @brief Recorded on the copy stream after the batch's copies (next() already made the
  ///        consumer's stream wait for it).
  const Event& ready() const noexcept { return *ready_; }

 private:
  friend struct detail::PrefetchShared;
  friend class Prefetcher;
  Batch() = default;
  void release() noexcept;
  std::size_t index_ = 0;
  std::vector<BufferView> arrays_;
  std::unique_ptr<Event> ready_;
  std::shared_ptr<detail::PrefetchShared> owner_;  // keeps the memory pool and copy stream alive
  std::optional<StreamView> release_on_;
};

/// @brief How long Prefetcher::next() waited for its batch, and how much of that the consumer's
///        stream sat idle (everything queued on it done): the stall a prefetcher exists to hide.
///        A host thread that runs ahead of its stream blocks in next() while the stream still
///        computes; only stream_idle_seconds delayed the training.
struct PrefetchWait {
  double blocked_seconds = 0;      ///< next() blocked for a batch (0: one was ready)
  double stream_idle_seconds = 0;  ///< of those, the stream had no work left
};

/// @brief Keeps the next `depth` batches of a source on the device, copied on its own stream by
/// a producer thread, like PyTorch's pin_memory + non_blocking copies on a side stream.
///
/// Pageable host arrays are first copied into pinned memory (a pool), then sent to the device
/// asynchronously. The source runs on the producer thread. An exception it throws reaches the
/// consumer from next(), after the batches produced before it.
class GPUCLOUD_API Prefetcher {
 public:
  /// @brief Starts prefetching from @p source onto @p device. @throws InvalidArgument for a depth < 1
  ///        or a kind other than device/managed.
  Prefetcher(Device device, BatchSource source, PrefetchOptions options = {});
  /// @brief stop()s; never throws.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// @brief The next batch, with @p stream already waiting for its copies; std::nullopt at the end
  ///        (or after stop()). Blocks until a batch is ready. Rethrows the source's exception.
  std::optional<Batch> next(StreamView stream);
  /// @brief Ends prefetching early: waits for a source call in progress to return, drops the
  ///        batches not handed out (freeing their memory), and joins the producer thread.
  void stop() noexcept;
  /// @brief The device batches are copied to.
  Device device() const noexcept;
  /// @brief What the last next() waited (zeros before the first). Measured only when next() has
  ///        to block: a host callback on the stream then marks when its queued work ran out.
  PrefetchWait last_wait() const noexcept;

 private:
  std::shared_ptr<detail::PrefetchShared> shared_;
  PrefetchWait last_wait_;
};

}  // namespace gpucloud
