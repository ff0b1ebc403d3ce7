/// @file checkpoint.hpp
/// @brief Checkpoints: asynchronous, atomic, sharded across ranks, in safetensors files with a
///        checksummed JSON manifest, loadable on any number of ranks.
///
/// A checkpoint is the directory ROOT/step-NNNNNNNNNNNN holding manifest.json and one
/// rank-NNNNN.safetensors per writing rank. It appears under that name only once complete (written
/// as ROOT/step-N.tmp-ID, every file and the directory fsync'ed, then renamed), so a reader never
/// sees half of one. docs/checkpoint.md describes the format.
#pragma once

#include <gpucloud/checkpoint/state_dict.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/memory_resource.hpp>
#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpucloud {
class Communicator;
}

namespace gpucloud::checkpoint {

/// @brief The manifest format this library writes (and the newest it reads).
inline constexpr int kFormatVersion = 1;

/// @brief Free-form user metadata (scaler settings, the data loader's position, ...): strings.
using Metadata = std::map<std::string, std::string>;

/// @brief How a Checkpointer writes.
struct Options {
  /// Committed checkpoints to keep (0: all): after each commit, the one just written and the
  /// keep_last - 1 highest steps below it are kept, lower steps deleted. Rotation never deletes
  /// the checkpoint just written, nor a superseded one (docs/checkpoint.md, "Rotation").
  int keep_last = 0;
  /// Page-locked host memory for the snapshots, of kind pinned or host (default: the pinned
  /// default resource). It must outlive the Checkpointer.
  MemoryResource* staging = nullptr;
  /// The ranks that write each checkpoint together (every rank calls every save); null: this
  /// process alone. It must outlive the Checkpointer.
  Communicator* comm = nullptr;
  /// How long a save waits for the other ranks' files (rank 0) or for the commit (the others).
  std::chrono::milliseconds commit_timeout = std::chrono::minutes(10);
};

/// @brief Where one tensor lives in a checkpoint, as its manifest says.
struct TensorInfo {
  DType dtype = DType::float32;     ///< element type
  std::vector<std::int64_t> shape;  ///< global shape
  std::string file;                 ///< file name inside the checkpoint directory
  std::uint64_t begin = 0;          ///< first byte in the file
  std::uint64_t end = 0;            ///< one past the last byte
  std::uint64_t xxh3 = 0;           ///< XXH3-64 of the bytes
};

/// @brief A checkpoint's manifest (verified against its own checksum when read).
struct Manifest {
  int format_version = kFormatVersion;        ///< the format it was written in
  std::int64_t step = 0;                      ///< the training step it holds
  int world_size = 1;                         ///< ranks that wrote it
  std::vector<std::string> files;             ///< its tensor files, one per writing rank
  std::map<std::string, TensorInfo> tensors;  ///< every tensor by name
  Metadata metadata;                          ///< the user's metadata
  std::string directory;                      ///< where it was read from
};

/// @brief A save in flight: wait() for its commit. Copies share the save.
class GPUCLOUD_API PendingSave {
 public:
  /// @brief A handle to no save: done, nothing to wait for.
  PendingSave();
  /// @brief Blocks until the checkpoint is committed (on every rank: until rank 0 renamed it).
  /// @throws CheckpointError with the I/O error (a full disk, another rank's failure, a timeout);
  ///         the error is raised once, by the first wait.
  void wait();
  /// @brief True once it committed or failed; never blocks.
  bool done() const;
  /// @brief The directory it commits to.
  std::string directory() const;
  /// @brief The step it saves.
  std::int64_t step() const;
  /// @brief Seconds from save_async() to the commit (or the failure); 0 while in flight.
  double seconds() const;

  struct State;  ///< shared with the writer (internal)
  /// @brief Wraps @p state (internal).
  explicit PendingSave(std::shared_ptr<State> state);

 private:
  std::shared_ptr<State> state_;
};

/// @brief How far a Checkpointer's background writer is behind (Checkpointer::progress()).
struct Progress {
  std::optional<std::int64_t> writing_step;    ///< the step of the save in flight, if any
  std::optional<std::int64_t> committed_step;  ///< the newest step this Checkpointer committed
  double seconds_since_commit = 0;             ///< age of that commit (0 before the first)
  double committed_unix_time = 0;              ///< when it committed, seconds since the epoch (0: none)
  double last_save_seconds = 0;                ///< save_async() to commit of the last committed save
  double waited_seconds = 0;          ///< total time save_async() blocked for the previous save (the writer lagging)
  std::uint64_t saves_committed = 0;  ///< saves committed so far
  std::uint64_t saves_failed = 0;     ///< saves that failed so far
};

/// @brief Writes the checkpoints of one training run under a root directory.
///
/// save_async() snapshots the tensors into pinned staging memory on a copy stream ordered after
/// the caller's stream (events: no device-wide synchronisation; the caller's stream waits for the
/// snapshot before its later writes), returns at once, and writes the files on a background
/// thread. The next save waits for the previous one. Each rank writes the tensors it is assigned
/// (balanced by bytes); rank 0 writes the manifest and commits.
class GPUCLOUD_API Checkpointer {
 public:
  /// @brief Writes under @p root (created if missing). With options.comm, a collective: every rank
  ///        constructs it (they agree on a run id through one broadcast on an internal stream).
  /// @throws InvalidArgument for bad options, CheckpointError when @p root cannot be created.
  explicit Checkpointer(std::string root, Options options = {});
  /// @brief Waits for the save in flight (its error, if any, is dropped: wait() to see it).
  ~Checkpointer();
  Checkpointer(Checkpointer&&) noexcept;             ///< Moves ownership.
  Checkpointer& operator=(Checkpointer&&) noexcept;  ///< Waits for this one's save, then moves.
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// @brief Starts saving @p tensors as step @p step: every argument checked, the previous save
  ///        waited for (its error rethrown), the snapshot enqueued after @p stream's work; then
  ///        returns. @p tensors must stay alive until @p stream reaches this point.
  /// @throws InvalidArgument (a negative step, an empty or reserved name, a shape that does not
  ///         match its view, memory on another device than @p stream), CheckpointError.
  PendingSave save_async(std::int64_t step, const StateDict& tensors, StreamView stream, const Metadata& metadata = {});
  /// @brief save_async(...).wait(): returns once committed.
  void save(std::int64_t step, const StateDict& tensors, StreamView stream, const Metadata& metadata = {});
  /// @brief Waits for the save in flight, if any. @throws CheckpointError as PendingSave::wait.
  void wait();
  /// @brief The root directory.
  const std::string& root() const;
  /// @brief The writer's lag: the save in flight, the newest commit and its age, time spent
  ///        waiting for the writer. Thread-safe; never blocks on a save.
  Progress progress() const;

  struct Impl;  ///< internal

 private:
  std::shared_ptr<Impl> impl_;
};

/// @brief A committed checkpoint that find_latest() passed over, and why.
struct SkippedCheckpoint {
  std::string directory;  ///< the checkpoint passed over
  std::string reason;     ///< what is wrong with it (the error reading it raised)
};

/// @brief What find_latest() found.
struct LatestScan {
  std::optional<std::string> directory;    ///< the newest valid checkpoint, if any
  std::vector<SkippedCheckpoint> skipped;  ///< the newer ones that are not valid, newest first
};

/// @brief Scans @p root: the newest committed checkpoint whose manifest verifies and whose files
///        are present with their sizes, and every newer one it skipped with the reason.
///        Directories being written (step-N.tmp-ID) or superseded are not candidates.
GPUCLOUD_API LatestScan find_latest(const std::string& root);

/// @brief find_latest(@p root).directory, with one warning on stderr per checkpoint skipped;
///        nullopt when there is none (or no @p root).
GPUCLOUD_API std::optional<std::string> latest(const std::string& root);

/// @brief Reads @p directory's manifest and verifies its checksum and version.
/// @throws CheckpointError naming the file and what is wrong.
GPUCLOUD_API Manifest read_manifest(const std::string& directory);

/// @brief When load() checks the tensors' checksums.
enum class Verify {
  /// Every byte of every tensor before the first write: a failed load leaves `into` untouched.
  before_writing,
  /// Each host tensor while it is copied (one pass over the data, not two): a checksum failure
  /// then leaves `into` partly overwritten; every other check still precedes the first write.
  while_copying,
};

/// @brief Loads the checkpoint in @p directory into the tensors of @p into (each found by name).
///
/// Verifies the manifest, the header of every file it reads, every tensor's dtype and shape, and
/// (as @p verify says) its checksum before the first write into @p into; then copies in @p
/// stream's order and synchronises it. Written by any number of ranks, it loads on any number:
/// each rank reads what it needs.
/// @param directory the checkpoint (a directory latest() returned)
/// @param into the tensors to fill, by name; their dtypes and shapes must match the checkpoint's
/// @param stream the copies into @p into are ordered on it; it is synchronised before returning
/// @param strict every tensor of the checkpoint must also be in @p into (as torch's strict load)
/// @param verify before_writing (every checksum before the first write) or while_copying
/// @return the manifest (step, metadata)
/// @throws CheckpointError (missing, truncated or corrupt files), CheckpointMismatch (a tensor
///         missing, unexpected, or of another dtype or shape), InvalidArgument; @p into is then
///         untouched (but for a checksum failure under Verify::while_copying).
GPUCLOUD_API Manifest load(const std::string& directory, const StateDict& into, StreamView stream, bool strict = true,
                           Verify verify = Verify::before_writing);

/// @brief The name of step @p step's directory ("step-000000001000").
GPUCLOUD_API std::string directory_name(std::int64_t step);

}  // namespace gpucloud::checkpoint
