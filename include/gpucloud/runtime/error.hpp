/// @file error.hpp
/// @brief The typed error hierarchy every gpucloud call reports through.
#pragma once

#include <gpucloud/export.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace gpucloud {

/// @brief Base of every gpucloud error: the failing call, where it was raised and why.
class GPUCLOUD_API Error : public std::runtime_error {
 public:
  /// @brief Builds the error; what() reads "<call>: <reason> (<file>:<line>)".
  Error(std::string call, std::string reason, const char* file, int line);
  /// @brief The API function or library call that failed, e.g. "cudaMalloc" or "Buffer".
  const std::string& call() const noexcept { return call_; }
  /// @brief The human-readable reason, without the location.
  const std::string& reason() const noexcept { return reason_; }
  /// @brief Source file that raised the error.
  const char* file() const noexcept { return file_; }
  /// @brief Source line that raised the error.
  int line() const noexcept { return line_; }

 private:
  std::string call_;
  std::string reason_;
  const char* file_;
  int line_;
};

/// @brief A bad argument, detected before any work was enqueued; nothing was changed.
class GPUCLOUD_API InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// @brief An allocation failed; recoverable: the resource stays usable.
class GPUCLOUD_API OutOfMemory : public Error {
 public:
  /// @brief Builds the error for a request of @p bytes.
  OutOfMemory(std::string call, std::string reason, std::size_t bytes, const char* file, int line);
  /// @brief Bytes that were requested.
  std::size_t requested_bytes() const noexcept { return bytes_; }

 private:
  std::size_t bytes_;
};

/// @brief A device or runtime failure; sticky() says whether the device context is lost.
class GPUCLOUD_API DeviceError : public Error {
 public:
  /// @brief Builds the error; @p sticky marks an error after which the process must restart.
  DeviceError(std::string call, std::string reason, bool sticky, const char* file, int line);
  /// @brief True when the device context is corrupted (illegal address, launch failure, ...).
  bool sticky() const noexcept { return sticky_; }

 private:
  bool sticky_;
};

/// @brief A collective failed, timed out or a peer rank died.
class GPUCLOUD_API CommunicationError : public Error {
 public:
  using Error::Error;
};

/// @brief The operation is not available in this build or on this device.
class GPUCLOUD_API Unsupported : public Error {
 public:
  using Error::Error;
};

/// @brief A checkpoint cannot be written or read: an I/O error (a full disk), a missing or
///        truncated file, a checksum that does not match, a manifest of another format.
class GPUCLOUD_API CheckpointError : public Error {
 public:
  using Error::Error;
};

/// @brief A sound checkpoint that does not fit what it is loaded into: a tensor missing or
///        unexpected, of another dtype or shape. Nothing was written.
class GPUCLOUD_API CheckpointMismatch : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

}  // namespace gpucloud

/// @brief Throws gpucloud::InvalidArgument from @p call naming @p reason unless @p cond holds.
#define GPUCLOUD_EXPECTS(cond, call, reason)                                              \
  do {                                                                                    \
    if (!(cond)) throw ::gpucloud::InvalidArgument((call), (reason), __FILE__, __LINE__); \
  } while (0)

/// @brief Throws gpucloud::@p Type with the given call and reason at this location.
#define GPUCLOUD_FAIL(Type, call, reason) throw ::gpucloud::Type((call), (reason), __FILE__, __LINE__)
