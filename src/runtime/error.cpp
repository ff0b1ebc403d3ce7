#include <gpucloud/runtime/error.hpp>

#include <utility>

namespace gpucloud {

namespace {
std::string format(const std::string& call, const std::string& reason, const char* file, int line) {
  return call + ": " + reason + " (" + file + ":" + std::to_string(line) + ")";
}
}  // namespace

Error::Error(std::string call, std::string reason, const char* file, int line)
    : std::runtime_error(format(call, reason, file, line)),
      call_(std::move(call)),
      reason_(std::move(reason)),
      file_(file),
      line_(line) {}

OutOfMemory::OutOfMemory(std::string call, std::string reason, std::size_t bytes, const char* file, int line)
    : Error(std::move(call), std::move(reason), file, line), bytes_(bytes) {}

DeviceError::DeviceError(std::string call, std::string reason, bool sticky, const char* file, int line)
    : Error(std::move(call), std::move(reason), file, line), sticky_(sticky) {}

}  // namespace gpucloud
