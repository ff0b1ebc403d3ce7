#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>

#include "memory/access.hpp"
#include "runtime/stream_impl.hpp"

#include <string>

namespace gpucloud {

namespace {
struct Bucket {
  std::vector<std::size_t> members;  // gradient indices
  std::vector<std::size_t> offsets;  // element offset of each member in the fusion buffer
  std::size_t elements = 0;
  std::size_t pending = 0;  // members not yet ready this step
  DType dtype = DType::float32;
  Buffer fusion;  // in the wire dtype
};
}  // namespace

struct GradBucketer::Impl {
  Communicator* comm;
  BucketOptions options;
  std::vector<BufferView> grads;
  std::vector<std::size_t> bucket_of;
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  std::size_t launched = 0;
  Device device = Device::host();
  std::shared_ptr<Stream> comm_stream;  // shared with the error check wait() enqueues on the caller's stream
  std::vector<std::unique_ptr<Event>> grad_events;  // one per gradient: its readiness
  std::unique_ptr<Event> done;

  void launch(Bucket& b) {
    Stream& s = *comm_stream;
    for (std::size_t m : b.members) s.wait(*grad_events[m]);
    // Pack, average, unpack: all on the communication stream.
    for (std::size_t j = 0; j < b.members.size(); ++j) {
      const BufferView g = grads[b.members[j]];
      const BufferView slot = b.fusion.view().slice(b.offsets[j], g.size());
      if (slot.dtype() == g.dtype()) {
        copy(slot, g, s);
      } else {
        cast(slot, g, s);
      }
    }
    if (options.hierarchical) {
      comm->hierarchical_all_reduce(b.fusion, b.fusion, ReduceOp::average, s);
    } else {
      comm->all_reduce(b.fusion, b.fusion, ReduceOp::average, s);
    }
    for (std::size_t j = 0; j < b.members.size(); ++j) {
      const BufferView g = grads[b.members[j]];
      const BufferView slot = b.fusion.view().slice(b.offsets[j], g.size());
      if (slot.dtype() == g.dtype()) {
        copy(g, slot, s);
      } else {
        cast(g, slot, s);
      }
    }
    ++launched;
  }
};

GradBucketer::GradBucketer(Communicator& comm, std::vector<BufferView> grads, BucketOptions options) {
  constexpr const char* call = "GradBucketer";
  GPUCLOUD_EXPECTS(!grads.empty(), call, "grads: empty list");
  GPUCLOUD_EXPECTS(options.bucket_bytes > 0 && options.first_bucket_bytes > 0, call,
                   "options: bucket caps must be positive");
  if (options.wire_dtype) {
    GPUCLOUD_EXPECTS(
        *options.wire_dtype == DType::float16 || *options.wire_dtype == DType::bfloat16, call,
        std::string("options.wire_dtype: ") + dtype_name(*options.wire_dtype) + " is not float16 or bfloat16");
  }
  detail::check_disjoint(
      grads, [](std::size_t i) { return "grads[" + std::to_string(i) + "]"; }, call);
  auto impl = std::make_unique<Impl>();
  impl->comm = &comm;
  impl->options = options;
  impl->device = grads.front().device();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const BufferView g = grads[i];
    GPUCLOUD_EXPECTS(is_floating(g.dtype()) && dtype_size(g.dtype()) >= 2, call,
                     "grads[" + std::to_string(i) + "]: dtype " + dtype_name(g.dtype()) + " is not a gradient type");
    GPUCLOUD_EXPECTS(
        g.device() == impl->device, call,
        "grads[" + std::to_string(i) + "]: on " + g.device().str() + ", the others on " + impl->device.str());
    // The wire dtype applies to fp32 gradients; narrower ones travel as they are.
    const DType wire = options.wire_dtype && g.dtype() == DType::float32 ? *options.wire_dtype : g.dtype();
    bool open = !impl->buckets.empty();
    if (open) {
      Bucket& last = impl->buckets.back();
      const std::size_t last_cap = impl->buckets.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
      open = last.dtype == wire && (last.elements + g.size()) * dtype_size(wire) <= last_cap;
    }
    if (!open) {
      impl->buckets.emplace_back();
      impl->buckets.back().dtype = wire;
    }
    Bucket& b = impl->buckets.back();
    b.members.push_back(i);
    b.offsets.push_back(b.elements);
    b.elements += g.size();
    impl->bucket_of.push_back(impl->buckets.size() - 1);
  }
  impl->grads = std::move(grads);
  impl->ready.assign(impl->grads.size(), false);
  impl->comm_stream = std::make_shared<Stream>(impl->device);
  for (auto& b : impl->buckets) {
    b.fusion = Buffer(b.elements, b.dtype, impl->device, MemoryKind::device);
    b.pending = b.members.size();
  }
  for (std::size_t i = 0; i < impl->grads.size(); ++i)
    impl->grad_events.push_back(std::make_unique<Event>(impl->device));
  impl->done = std::make_unique<Event>(impl->device);
  impl_ = std::move(impl);
}

GradBucketer::~GradBucketer() {
  if (impl_ && impl_->comm_stream) {
    try {
      impl_->comm_stream->synchronize();
    } catch (...) {
      // an error of the last step belongs to its wait(); the memory must outlive the work either way
    }
  }
}

void GradBucketer::mark_ready(std::size_t index, StreamView stream) {
  constexpr const char* call = "GradBucketer::mark_ready";
  Impl& s = *impl_;
  GPUCLOUD_EXPECTS(index < s.grads.size(), call,
                   "index: " + std::to_string(index) + " is not below " + std::to_string(s.grads.size()));
  GPUCLOUD_EXPECTS(!s.ready[index], call, "index: gradient " + std::to_string(index) + " is already ready this step");
  GPUCLOUD_EXPECTS(stream.device() == s.device, call,
                   "stream: on " + stream.device().str() + ", gradients on " + s.device.str());
  s.ready[index] = true;
  s.grad_events[index]->record(stream);
  --s.buckets[s.bucket_of[index]].pending;
  // Buckets are launched in bucket order on every rank (as PyTorch DDP does): collectives must be
  // issued in the same order everywhere, whatever order this rank's gradients became ready in.
  while (s.launched < s.buckets.size() && s.buckets[s.launched].pending == 0) s.launch(s.buckets[s.launched]);
}

void GradBucketer::wait(StreamView stream) {
  constexpr const char* call = "GradBucketer::wait";
  Impl& s = *impl_;
  std::string missing;
  for (std::size_t i = 0; i < s.grads.size(); ++i) {
    if (!s.ready[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  }
  GPUCLOUD_EXPECTS(missing.empty(), call, "gradients not marked ready this step: " + missing);
  s.done->record(*s.comm_stream);
  stream.wait(*s.done);
  // Errors of the communication stream (a timeout, say) reach the caller's stream. The check holds
  // the communication stream, so a bucketer dropped right after wait() leaves it valid.
  launch_host_func(stream, [comm = s.comm_stream] {
    if (auto error = comm->impl()->take_error()) std::rethrow_exception(error);
  });
  s.ready.assign(s.grads.size(), false);
  for (auto& b : s.buckets) b.pending = b.members.size();
  s.launched = 0;
}

std::size_t GradBucketer::bucket_count() const noexcept { return impl_->buckets.size(); }

std::size_t GradBucketer::bucket_of(std::size_t index) const {
  GPUCLOUD_EXPECTS(index < impl_->grads.size(), "GradBucketer::bucket_of", "index: out of range");
  return impl_->bucket_of[index];
}

std::size_t GradBucketer::launched() const noexcept { return impl_->launched; }

}  // namespace gpucloud
