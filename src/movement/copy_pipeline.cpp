#include <gpucloud/movement/copy.hpp>
#include <gpucloud/movement/copy_pipeline.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>

#include "memory/access.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/stream_impl.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

namespace gpucloud {

namespace {
enum class Direction { upload, download, transform };

const char* call_name(Direction d) {
  switch (d) {
    case Direction::upload:
      return "CopyPipeline::upload";
    case Direction::download:
      return "CopyPipeline::download";
    case Direction::transform:
      return "CopyPipeline::transform";
  }
  return "CopyPipeline";
}

// Memory a host thread can read and write directly.
bool host_accessible(BufferView v) { return v.device().is_host(); }

BufferView as(BufferView bytes, std::size_t count, DType dtype) {
  return BufferView(bytes.data(), count, dtype, bytes.kind(), bytes.device());
}

struct ChunkEvents {
  TimedEvent copy_in_begin, copy_in_end, compute_end, copy_out_end;
  int stream;
  explicit ChunkEvents(Device d, int s)
      : copy_in_begin(d), copy_in_end(d), compute_end(d), copy_out_end(d), stream(s) {}
};
}  // namespace

struct CopyPipeline::State {
  Device device;
  PipelineOptions options;
  // Buffers first, streams last: streams are destroyed (drained) before the memory they use.
  std::vector<Buffer> staging_in, staging_out, device_chunks;
  std::size_t capacity = 0;  // bytes of each of the buffers above
  std::optional<TimedEvent> entry;
  std::vector<Event> done;
  std::vector<ChunkEvents> timeline;
  std::vector<Stream> streams;

  State(Device d, PipelineOptions o) : device(d), options(o) {
    for (int i = 0; i < o.depth; ++i) {
      streams.emplace_back(d);
      done.emplace_back(d);
    }
    entry.emplace(d);
  }

  void ensure_buffers(std::size_t bytes) {
    if (bytes <= capacity) return;
    for (auto& s : streams) s.synchronize();  // the old buffers may still be in use
    staging_in.clear();
    staging_out.clear();
    device_chunks.clear();
    for (std::size_t i = 0; i < streams.size(); ++i) {
      staging_in.emplace_back(bytes, DType::uint8, Device::host(), MemoryKind::pinned);
      staging_out.emplace_back(bytes, DType::uint8, Device::host(), MemoryKind::pinned);
      device_chunks.emplace_back(bytes, DType::uint8, device, MemoryKind::device);
    }
    capacity = bytes;
  }

  // @throws InvalidArgument naming the argument, before anything is enqueued.
  void check(Direction dir, BufferView dst, BufferView src, StreamView caller, const ChunkStep& step) const;
  // Chunk @p src_chunk into @p work on slot @p k's stream: pageable memory through the slot's
  // pinned staging.
  void copy_in(BufferView work, BufferView src_chunk, std::size_t k);
  // @p work out to @p dst_chunk on slot @p k's stream, pageable memory through the pinned staging.
  void copy_out(BufferView dst_chunk, BufferView work, std::size_t k);
  // The caller's stream waits for the first @p used slots; errors raised by work on them surface
  // at the caller's next synchronize().
  void join(StreamView caller, std::size_t used);
  void run(Direction dir, BufferView dst, BufferView src, StreamView caller, const ChunkStep& step);
};

void CopyPipeline::State::check(Direction dir, BufferView dst, BufferView src, StreamView caller,
                                const ChunkStep& step) const {
  const char* call = call_name(dir);
  GPUCLOUD_EXPECTS(caller.device() == device, call,
                   "stream: the pipeline runs on " + device.str() + ", the stream on " + caller.device().str());
  GPUCLOUD_EXPECTS(
      dst.dtype() == src.dtype(), call,
      std::string("src: dtype ") + dtype_name(src.dtype()) + " differs from dst's " + dtype_name(dst.dtype()));
  GPUCLOUD_EXPECTS(dst.size() == src.size(), call,
                   "src: " + std::to_string(src.size()) + " elements, dst holds " + std::to_string(dst.size()));
  GPUCLOUD_EXPECTS(host_accessible(src) || dir == Direction::download, call,
                   std::string("src: must be host memory, got ") + memory_kind_name(src.kind()) + " memory on " +
                       src.device().str());
  GPUCLOUD_EXPECTS(host_accessible(dst) || dir == Direction::upload, call,
                   std::string("dst: must be host memory, got ") + memory_kind_name(dst.kind()) + " memory on " +
                       dst.device().str());
  if (dir != Direction::transform) {
    const BufferView on_device = dir == Direction::upload ? dst : src;
    detail::check_access(on_device, caller, detail::Access::copy, call, dir == Direction::upload ? "dst" : "src");
  }
  if (dir == Direction::transform) {
    GPUCLOUD_EXPECTS(static_cast<bool>(step), call, "step: transform needs a compute step");
    const bool same = dst.data() == src.data();
    if (!same) detail::check_no_overlap(dst, src, call, "src");
  } else {
    detail::check_no_overlap(dst, src, call, "src");
  }
}

void CopyPipeline::State::copy_in(BufferView work, BufferView src_chunk, std::size_t k) {
  Stream& s = streams[k];
  if (src_chunk.kind() != MemoryKind::host) return copy(work, src_chunk, s);
  const BufferView staged = as(staging_in[k].view(), src_chunk.size(), src_chunk.dtype());
  launch_host_func(s, [to = staged.data(), from = src_chunk.data(), bytes = src_chunk.size_bytes()] {
    detail::NvtxRange stage("gpucloud stage in");
    std::memcpy(to, from, bytes);
  });
  copy(work, staged, s);
}

void CopyPipeline::State::copy_out(BufferView dst_chunk, BufferView work, std::size_t k) {
  Stream& s = streams[k];
  if (dst_chunk.kind() != MemoryKind::host) return copy(dst_chunk, work, s);
  const BufferView staged = as(staging_out[k].view(), dst_chunk.size(), dst_chunk.dtype());
  copy(staged, work, s);
  launch_host_func(s, [to = dst_chunk.data(), from = staged.data(), bytes = dst_chunk.size_bytes()] {
    detail::NvtxRange stage("gpucloud stage out");
    std::memcpy(to, from, bytes);
  });
}

void CopyPipeline::State::join(StreamView caller, std::size_t used) {
  std::vector<detail::StreamImpl*> impls;
  for (std::size_t k = 0; k < used; ++k) {
    done[k].record(streams[k]);
    caller.wait(done[k]);
    impls.push_back(streams[k].impl());
  }
  launch_host_func(caller, [impls] {
    for (auto* impl : impls) {
      if (auto error = impl->take_error()) std::rethrow_exception(error);
    }
  });
}

void CopyPipeline::State::run(Direction dir, BufferView dst, BufferView src, StreamView caller, const ChunkStep& step) {
  check(dir, dst, src, caller, step);
  const std::size_t n = src.size();
  if (n == 0) return;

  detail::NvtxRange range(call_name(dir));
  const std::size_t elem = dtype_size(src.dtype());
  const std::size_t chunk = std::max<std::size_t>(1, options.chunk_bytes / elem);
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const std::size_t used = std::min<std::size_t>(chunks, streams.size());
  ensure_buffers(chunk * elem);

  timeline.clear();
  entry->record(caller);  // internal streams start after the caller's earlier work
  for (std::size_t k = 0; k < used; ++k) streams[k].wait(*entry);

  try {
    for (std::size_t i = 0; i < chunks; ++i) {  // chunk i on slot i % depth: copy in, step, copy out
      const std::size_t k = i % streams.size();
      Stream& s = streams[k];
      const std::size_t offset = i * chunk;
      const std::size_t len = std::min(chunk, n - offset);
      const BufferView src_chunk = src.slice(offset, len);
      const BufferView dst_chunk = dst.slice(offset, len);
      ChunkEvents* ev = nullptr;
      if (options.record_timeline) {
        timeline.emplace_back(device, static_cast<int>(k));
        ev = &timeline.back();
        ev->copy_in_begin.record(s);
      }
      // Where the chunk lives on the device while the step runs.
      BufferView work = dst_chunk;
      if (dir == Direction::transform) work = as(device_chunks[k].view(), len, src.dtype());
      if (dir == Direction::download) work = src_chunk;

      if (dir != Direction::download) copy_in(work, src_chunk, k);
      if (ev != nullptr) ev->copy_in_end.record(s);
      if (step) step(Chunk{i, offset, work, s.view()});
      if (ev != nullptr) ev->compute_end.record(s);
      if (dir != Direction::upload) copy_out(dst_chunk, work, k);
      if (ev != nullptr) ev->copy_out_end.record(s);
    }
  } catch (...) {
    join(caller, used);  // what was enqueued still completes in the caller's order
    throw;
  }
  join(caller, used);
}

CopyPipeline::CopyPipeline(Device device, PipelineOptions options) {
  GPUCLOUD_EXPECTS(options.depth >= 1 && options.depth <= 64, "CopyPipeline",
                   "options.depth: " + std::to_string(options.depth) + " is not in [1, 64]");
  GPUCLOUD_EXPECTS(options.chunk_bytes >= 1, "CopyPipeline", "options.chunk_bytes: must be positive");
  state_ = std::make_unique<State>(device, options);
}

CopyPipeline::~CopyPipeline() = default;
CopyPipeline::CopyPipeline(CopyPipeline&&) noexcept = default;
CopyPipeline& CopyPipeline::operator=(CopyPipeline&&) noexcept = default;

void CopyPipeline::upload(BufferView dst, BufferView src, StreamView stream, const ChunkStep& step) {
  state_->run(Direction::upload, dst, src, stream, step);
}

void CopyPipeline::download(BufferView dst, BufferView src, StreamView stream) {
  state_->run(Direction::download, dst, src, stream, {});
}

void CopyPipeline::transform(BufferView dst, BufferView src, StreamView stream, const ChunkStep& step) {
  state_->run(Direction::transform, dst, src, stream, step);
}

std::vector<ChunkTimes> CopyPipeline::timeline() const {
  std::vector<ChunkTimes> out;
  if (state_->timeline.empty()) return out;
  for (auto& s : state_->streams) s.synchronize();
  const TimedEvent& start = *state_->entry;
  start.synchronize();
  for (std::size_t i = 0; i < state_->timeline.size(); ++i) {
    const ChunkEvents& e = state_->timeline[i];
    out.push_back(ChunkTimes{i, e.stream, elapsed_ms(start, e.copy_in_begin), elapsed_ms(start, e.copy_in_end),
                             elapsed_ms(start, e.compute_end), elapsed_ms(start, e.copy_out_end)});
  }
  return out;
}

Device CopyPipeline::device() const { return state_->device; }

const PipelineOptions& CopyPipeline::options() const { return state_->options; }

}  // namespace gpucloud
