#include <gpucloud/memory/plain_resource.hpp>
#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/movement/prefetcher.hpp>
#include <gpucloud/runtime/error.hpp>

#include "memory/access.hpp"
#include "runtime/host/thread_budget.hpp"
#include "runtime/nvtx.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace gpucloud {

namespace detail {

// What the producer thread, the consumer and the batches handed out share.
struct PrefetchShared {
  Device device;
  PrefetchOptions options;
  BatchSource source;
  // Memory first: everything below is destroyed before the pools.
  PlainResource device_plain;
  PoolResource device_pool;
  PlainResource pinned_plain;
  PoolResource pinned_pool;
  Stream copy_stream;

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Batch> ready;
  bool finished = false;  // the producer will add nothing more
  bool stopping = false;
  std::exception_ptr error;
  std::size_t produced = 0;
  std::thread producer;
  // OpenBLAS gets one thread fewer from the Prefetcher's construction to its stop() (a data loader
  // keeps a core busy), counted on the caller's thread in program order: counted while the
  // producer thread ran, the first and last products of a run got another thread count than in a
  // run resumed from a checkpoint, and OpenBLAS's AVX2 kernels give other bits on other counts.
  std::optional<BusyLibraryThread> busy;

  PrefetchShared(Device d, BatchSource s, PrefetchOptions o)
      : device(d),
        options(o),
        source(std::move(s)),
        device_plain(o.kind, d),
        device_pool(device_plain),
        pinned_plain(MemoryKind::pinned, Device::host()),
        pinned_pool(pinned_plain),
        copy_stream(d) {}

  Batch make_batch(HostBatch host, std::shared_ptr<PrefetchShared> self);
  void run(std::shared_ptr<PrefetchShared> self) noexcept;
};

Batch PrefetchShared::make_batch(HostBatch host, std::shared_ptr<PrefetchShared> self) {
  detail::NvtxRange range("gpucloud prefetch batch");
  Batch b;
  b.owner_ = std::move(self);
  b.index_ = produced;
  for (std::size_t i = 0; i < host.arrays.size(); ++i) {
    const BufferView h = host.arrays[i];
    const std::string arg = "source: array " + std::to_string(i);
    GPUCLOUD_EXPECTS(
        h.device().is_host(), "Prefetcher",
        arg + " is " + memory_kind_name(h.kind()) + " memory on " + h.device().str() + ", not host memory");
    void* p = device_pool.allocate(h.size_bytes(), copy_stream.view());
    BufferView on_device(p, h.size(), h.dtype(), options.kind, device);
    b.arrays_.push_back(on_device);  // owned by the batch from here on: release() frees it
    if (h.empty()) continue;
    if (h.kind() == MemoryKind::host) {
      // pin_memory: a host copy into pinned memory now, then an asynchronous copy to the device.
      void* pinned = pinned_pool.allocate(h.size_bytes());
      std::memcpy(pinned, h.data(), h.size_bytes());
      copy(on_device, BufferView(pinned, h.size(), h.dtype(), MemoryKind::pinned, Device::host()), copy_stream);
      pinned_pool.deallocate(pinned, h.size_bytes(), copy_stream.view());
    } else {
      copy(on_device, h, copy_stream);
    }
  }
  if (host.keep_alive) launch_cleanup(copy_stream, [keep = std::move(host.keep_alive)]() mutable { keep.reset(); });
  b.ready_ = std::make_unique<Event>(device);
  b.ready_->record(copy_stream);
  return b;
}

void PrefetchShared::run(std::shared_ptr<PrefetchShared> self) noexcept {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return stopping || ready.size() < static_cast<std::size_t>(options.depth); });
      if (stopping) break;
    }
    try {
      std::optional<HostBatch> host = source();
      if (!host) break;
      Batch b = make_batch(std::move(*host), self);
      std::lock_guard<std::mutex> lock(mutex);
      ++produced;
      ready.push_back(std::move(b));
      changed.notify_all();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::current_exception();
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  finished = true;
  changed.notify_all();
}

}  // namespace detail

// ---- Batch ----------------------------------------------------------------------------------

void Batch::release() noexcept {
  if (owner_) {
    const std::optional<StreamView> order =
        release_on_ ? release_on_ : std::optional<StreamView>(owner_->copy_stream.view());
    for (const BufferView& a : arrays_) owner_->device_pool.deallocate(a.data(), a.size_bytes(), order);
  }
  arrays_.clear();
  ready_.reset();
  owner_.reset();
  release_on_.reset();
}

Batch::~Batch() { release(); }

Batch::Batch(Batch&& other) noexcept
    : index_(other.index_),
      arrays_(std::move(other.arrays_)),
      ready_(std::move(other.ready_)),
      owner_(std::move(other.owner_)),
      release_on_(std::exchange(other.release_on_, std::nullopt)) {
  other.arrays_.clear();
}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    release();
    index_ = other.index_;
    arrays_ = std::move(other.arrays_);
    other.arrays_.clear();
    ready_ = std::move(other.ready_);
    owner_ = std::move(other.owner_);
    release_on_ = std::exchange(other.release_on_, std::nullopt);
  }
  return *this;
}

// ---- Prefetcher -----------------------------------------------------------------------------

Prefetcher::Prefetcher(Device device, BatchSource source, PrefetchOptions options) {
  GPUCLOUD_EXPECTS(static_cast<bool>(source), "Prefetcher", "source: empty function");
  GPUCLOUD_EXPECTS(options.depth >= 1 && options.depth <= 1024, "Prefetcher",
                   "options.depth: " + std::to_string(options.depth) + " is not in [1, 1024]");
  GPUCLOUD_EXPECTS(
      options.kind == MemoryKind::device || options.kind == MemoryKind::managed, "Prefetcher",
      std::string("options.kind: batches go to device or managed memory, not ") + memory_kind_name(options.kind));
  shared_ = std::make_shared<detail::PrefetchShared>(device, std::move(source), options);
  shared_->busy.emplace();
  shared_->producer = std::thread([s = shared_] { s->run(s); });
}

Prefetcher::~Prefetcher() { stop(); }

void Prefetcher::stop() noexcept {
  if (!shared_) return;
  std::deque<Batch> dropped;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
    shared_->changed.notify_all();
  }
  if (shared_->producer.joinable()) shared_->producer.join();
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    dropped.swap(shared_->ready);
    shared_->error = nullptr;
  }
  dropped.clear();  // outside the lock; their memory returns after the copies
  // Everything the source handed over is released here, on the caller's thread, before stop()
  // returns: the copies finish, their host arrays are let go, and the source itself (a Python
  // iterator, say) is destroyed; nothing is left to release later on a stream's thread.
  try {
    shared_->copy_stream.synchronize();
  } catch (...) {  // a failed copy belongs to a batch nobody will consume
  }
  shared_->source = nullptr;
  shared_->busy.reset();
}

Device Prefetcher::device() const noexcept { return shared_->device; }

PrefetchWait Prefetcher::last_wait() const noexcept { return last_wait_; }

std::optional<Batch> Prefetcher::next(StreamView stream) {
  GPUCLOUD_EXPECTS(stream.device() == shared_->device, "Prefetcher::next",
                   "stream: batches are on " + shared_->device.str() + ", the stream on " + stream.device().str());
  std::optional<Batch> b;
  last_wait_ = {};
  {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    auto available = [&] { return !shared_->ready.empty() || shared_->finished || shared_->stopping; };
    if (!available()) {
      // About to block: a callback behind the stream's queued work marks when the stream ran
      // out of it; the part of the wait after that mark is the stall.
      using Clock = std::chrono::steady_clock;
      const auto began = Clock::now();
      auto idle_at = std::make_shared<std::atomic<Clock::rep>>(std::numeric_limits<Clock::rep>::max());
      lock.unlock();
      add_callback(stream, [idle_at](std::exception_ptr) { idle_at->store(Clock::now().time_since_epoch().count()); });
      lock.lock();
      shared_->changed.wait(lock, available);
      const auto ended = Clock::now();
      const Clock::time_point idle(Clock::duration(std::min(idle_at->load(), ended.time_since_epoch().count())));
      last_wait_.blocked_seconds = std::chrono::duration<double>(ended - began).count();
      last_wait_.stream_idle_seconds = std::chrono::duration<double>(ended - std::max(began, idle)).count();
    }
    if (shared_->ready.empty()) {
      if (shared_->error) std::rethrow_exception(std::exchange(shared_->error, nullptr));
      return std::nullopt;
    }
    b.emplace(std::move(shared_->ready.front()));
    shared_->ready.pop_front();
    shared_->changed.notify_all();  // room for the producer
  }
  stream.wait(b->ready());
  b->release_on_ = stream;
  return b;
}

}  // namespace gpucloud
