// Internal: the Checkpointer's state and what its two halves share (not API): checkpointer.cpp
// takes the snapshot and writes this rank's file; commit.cpp assembles the manifest on rank 0 and
// applies the directory rules (superseding, replacing, rotation, clean-up).
#pragma once

#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/stream.hpp>

#include "checkpoint/files.hpp"
#include "comm/communicator_impl.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gpucloud::checkpoint {

// What a PendingSave waits for: the writer thread finishes it with its error, if any.
struct PendingSave::State {
  std::string directory;
  std::int64_t step = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  double seconds = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;
  bool error_taken = false;

  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    finished = true;
    error = std::move(e);
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return finished; });
    if (error && !error_taken) {
      error_taken = true;
      std::rethrow_exception(error);
    }
  }
};

namespace detail {

/// The file rank @p rank writes in a checkpoint directory.
inline std::string rank_file(int rank) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}
/// Rank @p rank's marker (@p suffix: "json" for its file's layout, "error" for its failure).
inline std::string marker_file(int rank, const char* suffix) {
  char name[40];
  std::snprintf(name, sizeof name, "rank-%05d.%s", rank, suffix);
  return name;
}

// One tensor as this rank writes it.
struct Item {
  std::string name;
  BufferView view;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  int rank = 0;               // the rank that writes it
  std::uint64_t offset = 0;   // in this rank's data (and staging)
  const char* src = nullptr;  // what the writer writes: the staging copy, or the tensor itself
};

/// A random 64-bit id (a run's, a superseded directory's).
std::uint64_t random_id();

// Polls @p ready until it returns true, checking @p failed (a message: throw) in between, for at
// most @p timeout.
template <class Ready, class Failed>
void poll(Ready ready, Failed failed, std::chrono::milliseconds timeout, const std::string& waiting_for) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  while (!ready()) {
    if (auto message = failed()) throw CheckpointError("checkpoint commit", *message, __FILE__, __LINE__);
    if (std::chrono::steady_clock::now() - start > timeout) {
      throw CheckpointError("checkpoint commit",
                            "timed out after " + std::to_string(timeout.count()) + " ms waiting for " + waiting_for,
                            __FILE__, __LINE__);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

// How long nothing changed in a directory other ranks write their part of a save to.
class QuietDirectory {
 public:
  explicit QuietDirectory(std::string path) : path_(std::move(path)), state_(directory_state(path_)) {}
  /// The time since an entry of the directory last appeared, went or changed size, as these calls saw.
  std::chrono::milliseconds quiet_for() {
    const auto now = std::chrono::steady_clock::now();
    std::string state = directory_state(path_);
    if (state != state_) {
      state_ = std::move(state);
      changed_ = now;
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - changed_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string state_;
  std::chrono::steady_clock::time_point changed_ = std::chrono::steady_clock::now();
};

inline std::optional<std::string> read_error_marker(const std::string& path) {
  if (!exists(path)) return std::nullopt;
  try {
    return read_file(path, 1 << 16);
  } catch (const std::exception&) {
    return std::string("(its error marker could not be read)");
  }
}

}  // namespace detail

struct Checkpointer::Impl {
  std::string root;
  Options options;
  int rank = 0, world = 1;
  std::uint64_t run_id = 0;
  std::optional<Stream> copy_stream;  // on the device of the latest save's stream
  Buffer staging;                     // reused while large enough
  std::thread writer;
  std::shared_ptr<PendingSave::State> current;
  mutable std::mutex progress_mutex;  // guards progress and commit_time (the writer updates them)
  Progress progress;
  std::chrono::steady_clock::time_point commit_time;

  ~Impl() { finish_previous(false); }

  // Why a wait for other ranks' part of a save ends before commit_timeout: the save's communicator
  // broke (a peer died or timed out), or nothing in the save's directory @p dir changed for the
  // communicator's timeout, as long as a collective waits for a peer (@p who stopped, died or was
  // cut off; this rank may be waiting outside any collective, which would never time out). The
  // latter breaks the job as a timed-out collective does: MPI cannot finalise without that peer.
  std::optional<std::string> peers_lost(detail::QuietDirectory& dir, const std::string& who) const {
    if (options.comm == nullptr) return std::nullopt;
    if (options.comm->broken())
      return std::string("the communicator is broken (a rank failed or timed out): the save cannot complete");
    const auto quiet = dir.quiet_for();
    if (quiet <= options.comm->timeout()) return std::nullopt;
    std::string why = "nothing in " + dir.path() + " changed for " + std::to_string(quiet.count()) +
                      " ms, longer than the communicator's timeout (GPUCLOUD_COMM_TIMEOUT): " + who +
                      " stopped, died or was cut off, and the save cannot complete";
    gpucloud::detail::note_broken_communicator(gpucloud::detail::where(rank) + ": checkpoint save: " + why);
    return why;
  }

  void finish_previous(bool rethrow) {
    if (writer.joinable()) writer.join();
    if (current && rethrow) {
      auto state = std::move(current);
      state->wait();
    }
    current.reset();
  }

  // The background part of a save.
  void write(const std::shared_ptr<PendingSave::State>& state, std::vector<detail::Item> mine,
             std::shared_ptr<Event> snapshot, std::uint64_t layout, const Metadata& metadata,
             const std::vector<detail::Item>& all);
  PendingSave start(std::int64_t step, const StateDict& tensors, StreamView stream, const Metadata& metadata,
                    bool direct);
  std::shared_ptr<Event> take_snapshot(std::vector<detail::Item>& mine, std::uint64_t total, StreamView stream);
  void commit(const std::string& tmp, const std::string& final_dir, std::int64_t step, std::uint64_t layout,
              const nlohmann::json& own, const std::vector<detail::Item>& all, const Metadata& metadata);
  void clean_up(std::int64_t step, const std::string& keep_tmp);
  void supersede_newer(std::int64_t step);
  void rotate(std::int64_t step);
  void finished(std::int64_t step, double seconds, bool ok);
};

}  // namespace gpucloud::checkpoint
