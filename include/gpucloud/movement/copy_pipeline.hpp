/// @file copy_pipeline.hpp
/// @brief A chunked multi-stream pipeline that overlaps host<->device copies with compute.
#pragma once

#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace gpucloud {

/// @brief Tuning of a CopyPipeline.
struct PipelineOptions {
  std::size_t chunk_bytes = std::size_t{4} << 20;  ///< bytes per chunk (rounded down to whole elements, at least one)
  int depth = 3;                                   ///< chunks in flight: streams, staging and device buffers
  bool record_timeline = false;                    ///< time every stage with events (see timeline())
};

/// @brief When the stages of one chunk ended, in ms after the call's start (event-timed).
struct ChunkTimes {
  std::size_t index;    ///< chunk index
  int stream;           ///< which of the pipeline's streams ran it
  float copy_in_begin;  ///< the chunk's copy in started (staging included)
  float copy_in_end;    ///< the chunk is on the device
  float compute_end;    ///< the step's work finished
  float copy_out_end;   ///< the chunk is back on the host (transform, download), else compute_end
};

/// @brief One chunk handed to a compute step.
struct Chunk {
  std::size_t index;   ///< 0, 1, 2, ... in order of the data
  std::size_t offset;  ///< first element of the chunk within the whole array
  BufferView data;     ///< the chunk in device memory, already copied when work on @c stream runs
  StreamView stream;   ///< the stream the step enqueues its work on
};

/// @brief Enqueues compute on chunk.stream for chunk.data; called on the calling thread, in order.
using ChunkStep = std::function<void(const Chunk& chunk)>;

/// @brief Moves arrays between host and device in chunks over several streams, overlapping the
/// copy of chunk i+1 (and the copy back of chunk i-1) with the compute of chunk i.
///
/// Chunk i runs on stream i % depth: copy in, the step's compute, copy out. Pageable host memory
/// is staged through a ring of pinned buffers (the staging memcpy is itself stream-ordered, on
/// the host); pinned memory is copied directly. Every call is asynchronous with respect to the
/// caller: the internal streams wait for @p stream on entry, and @p stream waits for them on exit,
/// through events — never a device-wide synchronisation. An error raised by work a step enqueued
/// surfaces at @p stream's next synchronize(). The pipeline is not thread-safe; reuse it across
/// calls to keep its streams and buffers.
class GPUCLOUD_API CopyPipeline {
 public:
  /// @brief A pipeline for @p device (the host backend too). @throws InvalidArgument for a depth < 1.
  explicit CopyPipeline(Device device, PipelineOptions options = {});
  /// @brief Waits for the pipeline's work, then releases its streams and buffers.
  ~CopyPipeline();
  CopyPipeline(CopyPipeline&&) noexcept;             ///< Moves ownership.
  CopyPipeline& operator=(CopyPipeline&&) noexcept;  ///< Moves ownership.
  CopyPipeline(const CopyPipeline&) = delete;
  CopyPipeline& operator=(const CopyPipeline&) = delete;

  /// @brief Copies host @p src into device @p dst chunk by chunk; @p step (optional) runs on each
  /// chunk of @p dst as soon as it has landed.
  void upload(BufferView dst, BufferView src, StreamView stream, const ChunkStep& step = {});
  /// @brief Copies device @p src into host @p dst chunk by chunk.
  void download(BufferView dst, BufferView src, StreamView stream);
  /// @brief Streams host @p src through device chunk buffers: copy in, @p step in place, copy back
  /// into host @p dst (which may be @p src itself). Arrays larger than device memory are fine.
  void transform(BufferView dst, BufferView src, StreamView stream, const ChunkStep& step);

  /// @brief Stage times of every chunk of the last call, when options().record_timeline is set.
  ///
  /// Synchronises the pipeline's streams first. Empty when timing is off.
  std::vector<ChunkTimes> timeline() const;
  /// @brief The device.
  Device device() const;
  /// @brief The options in force.
  const PipelineOptions& options() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gpucloud
