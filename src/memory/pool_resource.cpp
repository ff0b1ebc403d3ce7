#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>

#include "memory/cuda/memory_backend.hpp"
#include "memory/host_memory.hpp"
#include "memory/quota_ledger.hpp"
#include "runtime/stream_impl.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

namespace gpucloud {

namespace {
constexpr unsigned kMinClassShift = 8;  // 256 B, the allocation alignment

unsigned class_of(std::size_t bytes) {
  unsigned shift = kMinClassShift;
  while ((std::size_t{1} << shift) < bytes) ++shift;
  return shift - kMinClassShift;
}

std::size_t class_bytes(unsigned c) { return std::size_t{1} << (c + kMinClassShift); }
}  // namespace

struct PoolResource::State {
  State(MemoryResource& up, std::size_t max_block) : upstream(up), max_block_bytes(max_block) {}
  MemoryResource& upstream;
  std::size_t max_block_bytes;
  std::mutex mutex;
  std::condition_variable returned;
  std::vector<std::vector<void*>> free_lists;
  std::size_t pending_returns = 0;  // returns waiting in a host stream's queue
  std::size_t pool_bytes = 0;
  std::size_t cached_bytes = 0;
  // A block freed in a busy stream's order comes back when the event recorded after its last use
  // has completed: polled when the pool is next used, with no host function per free (on a GPU it
  // would stall the stream for a host round trip).
  struct Returning {
    Event done;
    void* p;
    unsigned c;
  };
  std::deque<Returning> returning;
  std::vector<Event> spare_events;  // completed ones, recorded again by later frees

  // Caller holds the mutex: the returning blocks whose event has completed go to the free lists.
  void reap() noexcept {
    for (auto it = returning.begin(); it != returning.end();) {
      bool done = true;
      try {
        done = it->done.query();
      } catch (...) {  // a failed device: nothing will use the block again either way
      }
      if (!done) {
        ++it;
        continue;
      }
      push(it->p, it->c);
      try {
        spare_events.push_back(std::move(it->done));
      } catch (...) {  // no room to keep it: it is destroyed instead
      }
      it = returning.erase(it);
    }
  }

  // Caller holds the mutex.
  void push(void* p, unsigned c) {
    free_lists[c].push_back(p);
    cached_bytes += class_bytes(c);
  }
  // Caller holds the mutex.
  void release_locked() {
    for (unsigned c = 0; c < free_lists.size(); ++c) {
      for (void* p : free_lists[c]) {
        upstream.deallocate(p, class_bytes(c));
        pool_bytes -= class_bytes(c);
      }
      free_lists[c].clear();
    }
    cached_bytes = 0;
  }
};

PoolResource::PoolResource(MemoryResource& upstream, std::size_t max_block_bytes)
    : MemoryResource(upstream.kind(), upstream.device()), state_(new State(upstream, max_block_bytes)) {
  GPUCLOUD_EXPECTS(max_block_bytes >= class_bytes(0), "PoolResource",
                   "max_block_bytes: must be at least " + std::to_string(class_bytes(0)));
  GPUCLOUD_EXPECTS(max_block_bytes <= (std::size_t{1} << 48), "PoolResource",
                   "max_block_bytes: " + std::to_string(max_block_bytes) + " is absurdly large");
  state_->free_lists.resize(class_of(max_block_bytes) + 1);
}

PoolResource::~PoolResource() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->returned.wait(lock, [this] { return state_->pending_returns == 0; });
  for (auto& r : state_->returning) {
    try {
      r.done.synchronize();
    } catch (...) {  // a failed device: its work will not touch the block any more
    }
  }
  state_->reap();
  state_->release_locked();
}

void PoolResource::release() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->reap();
  state_->release_locked();
}

std::size_t PoolResource::pool_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->pool_bytes;
}

std::size_t PoolResource::cached_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->reap();
  return state_->cached_bytes;
}

void* PoolResource::do_allocate(std::size_t bytes, std::optional<StreamView> stream) {
  if (bytes > state_->max_block_bytes) return state_->upstream.allocate(bytes, stream);
  const unsigned c = class_of(bytes);
  const std::size_t size = class_bytes(c);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->reap();
    auto& list = state_->free_lists[c];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      state_->cached_bytes -= size;
      return p;
    }
  }
  void* p = nullptr;
  try {
    p = state_->upstream.allocate(size);
  } catch (const OutOfMemory&) {
    release();  // give the cache back and retry once, as the caching allocators do
    p = state_->upstream.allocate(size);
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->pool_bytes += size;
  return p;
}

void PoolResource::do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  if (bytes > state_->max_block_bytes) {
    state_->upstream.deallocate(p, bytes, stream);
    return;
  }
  const unsigned c = class_of(bytes);
  State* state = state_.get();
  if (stream) {
    // An idle host stream has run everything before this free: the block is free now. Otherwise an
    // event recorded after the stream's work so far says when (no host function per free).
    if (stream->device().is_host() && stream->impl()->query()) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->push(p, c);
      return;
    }
    try {
      std::lock_guard<std::mutex> lock(state->mutex);
      Event done = [&] {
        if (state->spare_events.empty()) return Event(stream->device());
        Event spare = std::move(state->spare_events.back());
        state->spare_events.pop_back();
        return spare;
      }();
      done.record(*stream);
      state->returning.push_back({std::move(done), p, c});
      return;
    } catch (...) {  // could not record (out of memory, another device): a host function instead
    }
  }
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    ++state->pending_returns;
  }
  // Without a stream: after the work every host stream was given so far (release_after).
  detail::release_after(stream, [state, p, c] {
    // Notify under the lock: once pending_returns reaches 0 the destructor may free the state.
    std::lock_guard<std::mutex> lock(state->mutex);
    state->push(p, c);
    --state->pending_returns;
    state->returned.notify_all();
  });
}

// ---- AsyncPoolResource ----------------------------------------------------------------------

AsyncPoolResource::AsyncPoolResource(Device device) : MemoryResource(MemoryKind::device, device) {
  GPUCLOUD_EXPECTS(device.is_cuda(), "AsyncPoolResource",
                   "device: CUDA's stream-ordered pool needs a CUDA device; on the host use PoolResource");
}

void* AsyncPoolResource::do_allocate(std::size_t bytes, std::optional<StreamView> stream) {
  detail::quota_take(device(), kind(), bytes);
  try {
    return detail::cuda::allocate_async(bytes, device().index(), stream ? stream->impl() : nullptr);
  } catch (...) {
    detail::quota_give(device(), bytes);
    throw;
  }
}

void AsyncPoolResource::do_deallocate(void* p, std::size_t bytes, std::optional<StreamView> stream) noexcept {
  detail::quota_give(device(), bytes);
  detail::cuda::deallocate_async(p, device().index(), stream ? stream->impl() : nullptr);
}

}  // namespace gpucloud
