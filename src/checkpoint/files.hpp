// POSIX file I/O for checkpoints: every failure a CheckpointError with the path and strerror;
// writes that are durable (fsync of files and of the directories that name them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpucloud::checkpoint::detail {

/// An open file descriptor, closed on destruction.
class File {
 public:
  /// Creates (or truncates) @p path for writing.
  static File create(const std::string& path);
  /// Opens @p path for reading: a regular file only (a FIFO, device or directory is refused
  /// without blocking on it). @throws CheckpointError naming @p path.
  static File open_read(const std::string& path);
  File(File&& other) noexcept;
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  ~File();
  /// Writes all @p n bytes (short writes and EINTR retried).
  void write_all(const void* data, std::size_t n);
  /// Reads exactly @p n bytes at @p offset. @throws CheckpointError when the file ends first.
  void read_at(void* data, std::size_t n, std::uint64_t offset) const;
  /// The file's size in bytes.
  std::uint64_t size() const;
  /// fsync, then close (its error reported too: NFS reports write errors at close).
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  friend class Mapping;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

/// A read-only mapping of a whole file (what a load reads its tensors through: no staging copy),
/// unmapped on destruction. Pages are read in by populate(), which reports an I/O error as a
/// CheckpointError instead of the SIGBUS a first touch would raise.
class Mapping {
 public:
  /// Maps the first @p size bytes of @p file (its size, checked by the caller).
  Mapping(const File& file, std::uint64_t size);
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&&) = delete;
  Mapping(const Mapping&) = delete;
  ~Mapping();
  /// The file's bytes.
  const char* data() const noexcept { return static_cast<const char*>(data_); }
  /// Starts reading [offset, offset + n) from disk in the background (best effort).
  void will_need(std::uint64_t offset, std::uint64_t n) const noexcept;
  /// Reads [offset, offset + n) in and maps it (MADV_POPULATE_READ; a no-op on kernels before
  /// 5.14). @throws CheckpointError naming the file on an I/O error.
  void populate(std::uint64_t offset, std::uint64_t n) const;

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

/// Writes @p text to @p path durably (create, write, fsync, close).
void write_file(const std::string& path, const std::string& text);
/// Reads the whole of @p path (at most @p limit bytes, else CheckpointError).
std::string read_file(const std::string& path, std::size_t limit);
/// fsync of a directory, so the entries created or renamed in it survive a power loss.
void sync_directory(const std::string& path);
/// mkdir -p.
void make_directories(const std::string& path);
/// rename(2), then fsync of the target's directory.
void rename_durably(const std::string& from, const std::string& to);
/// rename(2) alone: makes a file another process consumes visible at once, in a directory that
/// process may sync and move away the moment it sees the file (no fsync of it here).
void publish(const std::string& from, const std::string& to);
/// rm -rf; errors ignored (best effort, for clean-up).
void remove_all_quietly(const std::string& path) noexcept;
/// Names of the entries of @p path (empty when it does not exist).
std::vector<std::string> list_directory(const std::string& path);
/// The names and sizes of @p path's entries, sorted (empty when it does not exist): two calls
/// differ when an entry appeared, went or changed size in between.
std::string directory_state(const std::string& path);
/// True when @p path exists.
bool exists(const std::string& path);
/// True when @p path is a regular file (symbolic links followed); nothing is opened.
bool is_regular_file(const std::string& path);
/// Refuses (InvalidArgument from @p call, naming @p arg) an empty path or one holding a NUL byte,
/// which the file system would silently truncate.
void check_path_argument(const std::string& path, const char* call, const char* arg);
/// The directory part of @p path.
std::string parent_of(const std::string& path);

}  // namespace gpucloud::checkpoint::detail
