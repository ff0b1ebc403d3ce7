// Writing checkpoints: the snapshot on a copy stream, the files on a background thread, the
// commit by rank 0 once every rank's file is durable (docs/checkpoint.md#how-a-save-commits).
#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>

#include "checkpoint/checkpointer_impl.hpp"
#include "checkpoint/files.hpp"
#include "checkpoint/format.hpp"

#include <nlohmann/json.hpp>

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace gpucloud::checkpoint {

using nlohmann::json;
namespace d = detail;

// ---- PendingSave ----------------------------------------------------------------------------

PendingSave::PendingSave() = default;
PendingSave::PendingSave(std::shared_ptr<State> state) : state_(std::move(state)) {}
void PendingSave::wait() {
  if (state_) state_->wait();
}
bool PendingSave::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished;
}
std::string PendingSave::directory() const { return state_ ? state_->directory : std::string(); }
std::int64_t PendingSave::step() const { return state_ ? state_->step : 0; }
double PendingSave::seconds() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->seconds;
}

std::string directory_name(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld", static_cast<long long>(step));
  return name;
}

namespace {

constexpr const char* kCall = "Checkpointer::save_async";

using d::Item;
using d::marker_file;
using d::poll;
using d::rank_file;
using d::read_error_marker;

// Balanced by bytes: largest first, each to the least loaded rank (ties: the lower). Every rank
// computes the same assignment from the same names and sizes.
void assign_ranks(std::vector<Item>& items, int world) {
  std::vector<Item*> order;
  for (auto& it : items) order.push_back(&it);
  std::stable_sort(order.begin(), order.end(), [](const Item* a, const Item* b) { return a->bytes > b->bytes; });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(world), 0);
  for (Item* it : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    it->rank = static_cast<int>(least);
    load[static_cast<std::size_t>(least)] += std::max<std::uint64_t>(it->bytes, 1);
  }
}

// What every rank must agree on: the step and every tensor's name, dtype and shape.
std::uint64_t layout_hash(std::int64_t step, const std::vector<Item>& items) {
  std::string text = std::to_string(step);
  for (const auto& it : items) {
    text += "|" + it.name + ":" + dtype_name(it.view.dtype()) + d::shape_str(it.shape);
  }
  return d::xxh3(text.data(), text.size());
}

void check_encodable(const std::string& s, const std::string& what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    GPUCLOUD_FAIL(InvalidArgument, kCall, what + ": not valid UTF-8");
  }
}

// SCHED_IDLE for the calling thread (Linux), else the lowest nice value; best effort.
void lower_thread_priority() noexcept {
#if defined(__linux__)
  sched_param param{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) == 0) return;
#endif
  (void)setpriority(PRIO_PROCESS, 0, 19);
}

}  // namespace

std::uint64_t d::random_id() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// ---- Checkpointer ---------------------------------------------------------------------------

Checkpointer::Checkpointer(std::string root, Options options) {
  d::check_path_argument(root, "Checkpointer", "root");
  GPUCLOUD_EXPECTS(options.keep_last >= 0, "Checkpointer",
                   "options.keep_last: " + std::to_string(options.keep_last) + " is negative (0 keeps all)");
  GPUCLOUD_EXPECTS(options.commit_timeout.count() > 0, "Checkpointer", "options.commit_timeout: must be positive");
  if (options.staging != nullptr) {
    const auto kind = options.staging->kind();
    GPUCLOUD_EXPECTS(kind == MemoryKind::pinned || kind == MemoryKind::host, "Checkpointer",
                     std::string("options.staging: a resource of ") + memory_kind_name(kind) +
                         " memory; snapshots need pinned (or host) memory");
  }
  auto impl = std::make_shared<Impl>();
  impl->root = std::move(root);
  impl->options = options;
  d::make_directories(impl->root);
  impl->run_id = d::random_id();
  if (options.comm != nullptr) {
    Communicator& comm = *options.comm;
    impl->rank = comm.rank();
    impl->world = comm.size();
    // Rank 0's run id, for every rank's temporary directory names.
    Stream s(comm.device());
    Buffer host(1, DType::int64, Device::host(), MemoryKind::pinned);
    Buffer shared(1, DType::int64, comm.device(), MemoryKind::device);
    *host.data_as<std::int64_t>() = static_cast<std::int64_t>(impl->run_id);
    copy(shared, host, s);
    comm.broadcast(shared, 0, s);
    copy(host, shared, s);
    s.synchronize();
    impl->run_id = static_cast<std::uint64_t>(*host.data_as<std::int64_t>());
  }
  impl_ = std::move(impl);
}

Checkpointer::~Checkpointer() {
  if (impl_) impl_->finish_previous(false);  // joined here: the writer never outlives its Checkpointer
}
Checkpointer::Checkpointer(Checkpointer&&) noexcept = default;
Checkpointer& Checkpointer::operator=(Checkpointer&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->finish_previous(false);
    impl_ = std::move(other.impl_);
  }
  return *this;
}

const std::string& Checkpointer::root() const { return impl_->root; }

Progress Checkpointer::progress() const {
  std::lock_guard<std::mutex> lock(impl_->progress_mutex);
  Progress p = impl_->progress;
  if (p.committed_step) {
    p.seconds_since_commit =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->commit_time).count();
  }
  return p;
}

void Checkpointer::Impl::finished(std::int64_t step, double seconds, bool ok) {
  std::lock_guard<std::mutex> lock(progress_mutex);
  progress.writing_step.reset();
  if (!ok) {
    ++progress.saves_failed;
    return;
  }
  ++progress.saves_committed;
  progress.committed_step = step;
  progress.last_save_seconds = seconds;
  commit_time = std::chrono::steady_clock::now();
  progress.committed_unix_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void Checkpointer::wait() { impl_->finish_previous(true); }

void Checkpointer::save(std::int64_t step, const StateDict& tensors, StreamView stream, const Metadata& metadata) {
  impl_->start(step, tensors, stream, metadata, /*direct=*/true).wait();
  impl_->finish_previous(false);
}

PendingSave Checkpointer::save_async(std::int64_t step, const StateDict& tensors, StreamView stream,
                                     const Metadata& metadata) {
  return impl_->start(step, tensors, stream, metadata, /*direct=*/false);
}

PendingSave Checkpointer::Impl::start(std::int64_t step, const StateDict& tensors, StreamView stream,
                                      const Metadata& metadata, bool direct) {
  Impl& im = *this;
  // Every argument first: nothing is enqueued or waited for on a bad call.
  GPUCLOUD_EXPECTS(step >= 0, kCall, "step: " + std::to_string(step) + " is negative");
  const Device dev = stream.device();
  std::vector<Item> all;
  for (const auto& [name, ref] : tensors) {
    GPUCLOUD_EXPECTS(!name.empty(), kCall, "tensors: an empty name");
    GPUCLOUD_EXPECTS(name != "__metadata__", kCall, "tensors: '__metadata__' is reserved by safetensors");
    check_encodable(name, "tensors: the name '" + name + "'");
    Item it;
    it.name = name;
    it.view = ref.view;
    it.shape = shape_of(ref, "tensors['" + name + "']");
    it.bytes = ref.view.size_bytes();
    const bool host_memory = ref.view.device().is_host();
    GPUCLOUD_EXPECTS(ref.view.empty() || host_memory || ref.view.device() == dev, kCall,
                     "tensors['" + name + "']: on " + ref.view.device().str() + ", the stream on " + dev.str());
    all.push_back(std::move(it));
  }
  for (const auto& [key, value] : metadata) {
    GPUCLOUD_EXPECTS(key.compare(0, 9, "gpucloud.") != 0, kCall,
                     "metadata['" + key + "']: keys starting with 'gpucloud.' are reserved");
    check_encodable(key, "metadata: a key");
    check_encodable(value, "metadata['" + key + "']");
  }
  {
    // The previous save: joined, its error raised here if nobody saw it. The time it blocks is
    // the writer's lag, reported by progress().
    const auto waiting = std::chrono::steady_clock::now();
    const bool busy = im.current && !PendingSave(im.current).done();
    im.finish_previous(true);
    if (busy) {
      std::lock_guard<std::mutex> lock(im.progress_mutex);
      im.progress.waited_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
    }
  }

  assign_ranks(all, im.world);
  std::vector<Item> mine;
  for (const auto& it : all) {
    if (it.rank == im.rank) mine.push_back(it);
  }
  // Widest elements first, so every tensor starts aligned to its element size in the file.
  std::stable_sort(mine.begin(), mine.end(), [](const Item& a, const Item& b) {
    return dtype_size(a.view.dtype()) > dtype_size(b.view.dtype());
  });
  std::uint64_t total = 0;
  for (auto& it : mine) {
    it.offset = total;
    total += it.bytes;
  }
  // A synchronous save of host memory writes the tensors themselves (nothing can change them
  // before it returns); anything else is snapshotted into staging memory first.
  direct = direct && std::all_of(mine.begin(), mine.end(), [](const Item& it) { return it.view.device().is_host(); });
  auto state = std::make_shared<PendingSave::State>();
  state->directory = im.root + "/" + directory_name(step);
  state->step = step;
  const std::uint64_t layout = layout_hash(step, all);
  std::shared_ptr<Event> snapshot;
  if (direct) {
    stream.synchronize();
    for (auto& it : mine) it.src = static_cast<const char*>(it.view.data());
  } else {
    snapshot = take_snapshot(mine, total, stream);
  }
  im.current = state;
  {
    std::lock_guard<std::mutex> lock(im.progress_mutex);
    im.progress.writing_step = step;
  }
  im.writer = std::thread(
      [impl = this, state, mine = std::move(mine), snapshot, layout, metadata, all = std::move(all), direct]() mutable {
        // In the background, the writer yields the cores to training: each of its wake-ups (after
        // every fsync) would otherwise preempt a compute thread for a scheduler slice.
        if (!direct) lower_thread_priority();
        std::exception_ptr error;
        try {
          impl->write(state, std::move(mine), std::move(snapshot), layout, metadata, all);
        } catch (...) {
          error = std::current_exception();
        }
        impl->finished(state->step,
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - state->started).count(),
                       error == nullptr);
        state->finish(std::move(error));
      });
  return PendingSave(state);
}

// Copies @p mine into the staging memory on the copy stream, after @p stream's work so far; the
// returned event marks the copies done, and @p stream's later work waits for it.
std::shared_ptr<Event> Checkpointer::Impl::take_snapshot(std::vector<Item>& mine, std::uint64_t total,
                                                         StreamView stream) {
  Impl& im = *this;
  const Device dev = stream.device();
  if (im.staging.size_bytes() < total) {
    im.staging = Buffer();
    const auto bytes = static_cast<std::size_t>(total);
    im.staging = im.options.staging != nullptr
                     ? Buffer(bytes, DType::uint8, Device::host(), im.options.staging->kind(), *im.options.staging)
                     : Buffer(bytes, DType::uint8, Device::host(), MemoryKind::pinned);
  }
  // The snapshot: on a GPU, on the copy stream (the copy engine) after the caller's work, the
  // caller's later work after it. On the host a copy stream is one more thread to hand off to
  // and back, on the cores that run the training: the caller's stream copies in its own order.
  StreamView copier = stream;
  if (dev.is_cuda()) {
    if (!im.copy_stream || im.copy_stream->device() != dev) im.copy_stream.emplace(dev);
    Event ready(dev);
    ready.record(stream);
    im.copy_stream->wait(ready);
    copier = *im.copy_stream;
  }
  const auto staging_kind = im.staging.kind();
  for (const auto& it : mine) {
    if (it.bytes == 0) continue;
    const BufferView src(it.view.data(), static_cast<std::size_t>(it.bytes), DType::uint8, it.view.kind(),
                         it.view.device());
    const BufferView dst(static_cast<char*>(im.staging.data()) + it.offset, static_cast<std::size_t>(it.bytes),
                         DType::uint8, staging_kind, Device::host());
    copy(dst, src, copier);
  }
  auto snapshot = std::make_shared<Event>(dev);
  snapshot->record(copier);
  if (copier != stream) stream.wait(*snapshot);
  for (auto& it : mine) it.src = static_cast<const char*>(im.staging.data()) + it.offset;
  return snapshot;
}

void Checkpointer::Impl::write(const std::shared_ptr<PendingSave::State>& state, std::vector<Item> mine,
                               std::shared_ptr<Event> snapshot, std::uint64_t layout, const Metadata& metadata,
                               const std::vector<Item>& all) {
  const std::string final_dir = state->directory;
  const std::string tmp = final_dir + ".tmp-" + d::hex64(run_id);
  const std::string file = tmp + "/" + rank_file(rank);
  try {
    if (snapshot) snapshot->synchronize();
    d::make_directories(tmp);
    std::map<std::string, d::FileEntry> entries;
    for (const auto& it : mine) {
      entries[it.name] = d::FileEntry{it.view.dtype(), it.shape, it.offset, it.offset + it.bytes};
    }
    // The checksums on a second thread while this one writes: the save takes the longer of the
    // two, not their sum.
    auto checksums = std::async(std::launch::async, [&mine] {
      std::map<std::string, std::uint64_t> out;
      for (const auto& it : mine) out[it.name] = d::xxh3(it.src, static_cast<std::size_t>(it.bytes));
      return out;
    });
    Metadata file_meta{{"format", "pt"}, {"gpucloud.step", std::to_string(state->step)}};
    const std::string prefix = d::safetensors_prefix(entries, file_meta);
    {
      d::File f = d::File::create(file);
      f.write_all(prefix.data(), prefix.size());
      // Runs of tensors adjacent in memory (all of them, from staging) go in one write.
      for (std::size_t i = 0; i < mine.size();) {
        std::size_t j = i + 1;
        std::uint64_t run = mine[i].bytes;
        while (j < mine.size() && mine[j].src == mine[i].src + run) run += mine[j++].bytes;
        if (run > 0) f.write_all(mine[i].src, static_cast<std::size_t>(run));
        i = j;
      }
      f.sync_and_close();
    }
    std::map<std::string, std::uint64_t> sums = checksums.get();
    // Where each tensor lies in the file, and its checksum: rank 0 assembles the manifest.
    json marker = {{"layout", d::hex64(layout)}, {"tensors", json::object()}};
    for (const auto& it : mine) {
      marker["tensors"][it.name] = {{"begin", prefix.size() + it.offset},
                                    {"end", prefix.size() + it.offset + it.bytes},
                                    {"xxh3_64", d::hex64(sums[it.name])}};
    }
    if (rank == 0) {
      commit(tmp, final_dir, state->step, layout, marker, all, metadata);
      return;
    }
    const std::string done = tmp + "/" + marker_file(rank, "json");
    d::write_file(done + ".part", marker.dump());
    // Not rename_durably: rank 0 may read the marker, sync the directory and rename it to the
    // checkpoint the moment the marker appears, before an fsync of it here could open it.
    d::publish(done + ".part", done);
    // Committed once rank 0 has renamed the directory, with a manifest of this run and step.
    const std::string manifest = final_dir + "/manifest.json";
    const std::string run = d::hex64(run_id);
    d::QuietDirectory quiet(tmp);
    poll(
        [&] {
          if (!d::exists(manifest)) return false;
          try {
            const Manifest m = d::decode_manifest(d::read_file(manifest, d::kMaxManifestBytes), manifest);
            const auto it = m.metadata.find("gpucloud.run");
            return m.step == state->step && it != m.metadata.end() && it->second == run;
          } catch (const CheckpointError&) {
            return false;
          }
        },
        [&]() -> std::optional<std::string> {
          auto e = read_error_marker(tmp + "/commit.error");
          if (e) return "rank 0 failed to write the checkpoint: " + *e;
          return peers_lost(quiet, "rank 0, or a rank whose file it waits for,");
        },
        options.commit_timeout, "rank 0 to commit " + final_dir);
  } catch (const std::exception& e) {
    // Best effort: free the space, and tell the other ranks (rank 0: that the commit failed).
    std::remove(file.c_str());
    try {
      if (d::exists(tmp)) {
        d::write_file(tmp + "/" + (rank == 0 ? std::string("commit.error") : marker_file(rank, "error")), e.what());
      }
    } catch (...) {
    }
    throw;
  }
}

}  // namespace gpucloud::checkpoint
