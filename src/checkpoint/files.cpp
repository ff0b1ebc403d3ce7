#include "checkpoint/files.hpp"

#include <gpucloud/runtime/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace gpucloud::checkpoint::detail {

namespace fs = std::filesystem;

namespace {
[[noreturn]] void fail_errno(const char* call, const std::string& path, int err) {
  throw CheckpointError(call, path + ": " + std::strerror(err), __FILE__, __LINE__);
}
}  // namespace

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("open", path, errno);
  return File(fd, path);
}

File File::open_read(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise wait for one for ever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail_errno("open", path, errno);
  File f(fd, path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    throw CheckpointError("open", path + ": " + kind + ", not a regular file (refused: a checkpoint holds only files)",
                          __FILE__, __LINE__);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) fail_errno("fcntl", path, errno);
  return f;
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("write", path_, errno);
    }
    if (w == 0) fail_errno("write", path_, EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void File::read_at(void* data, std::size_t n, std::uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("pread", path_, errno);
    }
    if (r == 0) {
      throw CheckpointError("read",
                            path_ + ": the file ends at byte " + std::to_string(offset) + ", " + std::to_string(n) +
                                " bytes early (truncated)",
                            __FILE__, __LINE__);
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

Mapping::Mapping(const File& file, std::uint64_t size) : size_(static_cast<std::size_t>(size)), path_(file.path()) {
  if (size_ == 0) return;
  data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd_, 0);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    fail_errno("mmap", path_, errno);
  }
}

Mapping::Mapping(Mapping&& other) noexcept : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Mapping::~Mapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

namespace {
// [offset, offset + n) of a mapping widened to whole pages, for madvise.
std::pair<char*, std::size_t> page_range(void* base, std::uint64_t offset, std::uint64_t n) {
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t begin = offset / page * page;
  return {static_cast<char*>(base) + begin, static_cast<std::size_t>(offset + n - begin)};
}
}  // namespace

void Mapping::will_need(std::uint64_t offset, std::uint64_t n) const noexcept {
  if (data_ == nullptr || n == 0) return;
  const auto [p, len] = page_range(data_, offset, n);
  ::madvise(p, len, MADV_WILLNEED);
}

void Mapping::populate(std::uint64_t offset, std::uint64_t n) const {
#ifdef MADV_POPULATE_READ
  if (data_ == nullptr || n == 0) return;
  const auto [p, len] = page_range(data_, offset, n);
  while (::madvise(p, len, MADV_POPULATE_READ) != 0) {
    if (errno == EINTR || errno == EAGAIN) continue;
    if (errno == EINVAL) return;  // a kernel without it: pages fault in on first touch
    if (errno != EFAULT) fail_errno("read (madvise MADV_POPULATE_READ)", path_, errno);
    throw CheckpointError("read",
                          path_ + ": bytes " + std::to_string(offset) + ".." + std::to_string(offset + n) +
                              " cannot be read (an I/O error, or the file shrank while it was loaded)",
                          __FILE__, __LINE__);
  }
#else
  (void)offset;
  (void)n;
#endif
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail_errno("fstat", path_, errno);
  return static_cast<std::uint64_t>(st.st_size);
}

void File::sync_and_close() {
  if (::fsync(fd_) != 0) fail_errno("fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("close", path_, errno);
}

void write_file(const std::string& path, const std::string& text) {
  File f = File::create(path);
  f.write_all(text.data(), text.size());
  f.sync_and_close();
}

std::string read_file(const std::string& path, std::size_t limit) {
  const File f = File::open_read(path);
  const std::uint64_t n = f.size();
  if (n > limit) {
    throw CheckpointError(
        "read",
        path + ": " + std::to_string(n) + " bytes, more than the " + std::to_string(limit) + " such a file can have",
        __FILE__, __LINE__);
  }
  std::string text(static_cast<std::size_t>(n), '\0');
  f.read_at(text.data(), text.size(), 0);
  return text;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("open", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_errno("fsync", path, err);
}

void make_directories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) fail_errno("mkdir", path, ec.value());
}

void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail_errno("rename", from + " -> " + to, errno);
  sync_directory(parent_of(to));
}

void publish(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail_errno("rename", from + " -> " + to, errno);
}

void remove_all_quietly(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

std::string directory_state(const std::string& path) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    const auto size = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    entries.push_back(it->path().filename().string() + '\0' + std::to_string(size_ec ? 0 : size));
  }
  std::sort(entries.begin(), entries.end());
  std::string state;
  for (const auto& e : entries) state += e + '\n';
  return state;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void check_path_argument(const std::string& path, const char* call, const char* arg) {
  GPUCLOUD_EXPECTS(!path.empty(), call, std::string(arg) + ": an empty path");
  const auto nul = path.find('\0');
  GPUCLOUD_EXPECTS(nul == std::string::npos, call,
                   std::string(arg) + ": holds a NUL byte at offset " + std::to_string(nul) +
                       " (a path cannot; it would be cut short there)");
}

std::string parent_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace gpucloud::checkpoint::detail
