/// @file grad_buckets.hpp
/// @brief Gradient buckets (PyTorch DDP / Horovod tensor fusion): all-reduce of fused gradients
///        launched on a communication stream as soon as a bucket is ready, overlapping backward.
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

namespace gpucloud {

/// @brief Bucketing settings; the caps are PyTorch DDP's defaults.
struct BucketOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;       ///< cap of every bucket after the first
  std::size_t first_bucket_bytes = std::size_t{1} << 20;  ///< cap of the first bucket (it is ready first)
  bool hierarchical = false;                              ///< hierarchical all-reduce across nodes
  std::optional<DType> wire_dtype;                        ///< compress fp32 gradients to float16/bfloat16 on the wire
};

/// @brief Packs gradients into fusion buffers and all-reduces (averages) each bucket on its own
///        communication stream the moment all of its gradients are marked ready.
///
/// Register the gradients in the order backward produces them (the reverse of the forward
/// order); a bucket holds consecutive gradients of one dtype up to its cap (a larger gradient
/// gets a bucket of its own). Each step: mark_ready(i, stream) for every gradient as backward
/// finishes it, then wait(stream); the gradients then hold the average over ranks. Every rank
/// must register the same gradients; the order of mark_ready may differ between ranks.
class GPUCLOUD_API GradBucketer {
 public:
  /// @brief Buckets @p grads (memory the communicator's backend takes) for @p comm, which must
  ///        outlive the bucketer. @throws InvalidArgument for empty lists or unsupported dtypes.
  GradBucketer(Communicator& comm, std::vector<BufferView> grads, BucketOptions options = {});
  ~GradBucketer();
  GradBucketer(const GradBucketer&) = delete;
  GradBucketer& operator=(const GradBucketer&) = delete;

  /// @brief Gradient @p index is final once the work enqueued on @p stream so far has run; when it
  ///        completes its bucket, the bucket's all-reduce is launched at once on the comm stream
  ///        (after the earlier buckets': every rank issues the buckets in the same order).
  /// @throws InvalidArgument for an index out of range or marked twice this step.
  void mark_ready(std::size_t index, StreamView stream);
  /// @brief Makes @p stream wait for every bucket's all-reduce and starts the next step.
  /// @throws InvalidArgument naming the gradients not marked ready (nothing is launched for them).
  void wait(StreamView stream);

  /// @brief Number of buckets.
  std::size_t bucket_count() const noexcept;
  /// @brief Bucket of gradient @p index.
  std::size_t bucket_of(std::size_t index) const;
  /// @brief Buckets launched so far in the current step.
  std::size_t launched() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpucloud
