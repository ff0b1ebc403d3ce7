#include <gpucloud/checkpoint/state_dict.hpp>
#include <gpucloud/runtime/error.hpp>

#include <limits>

namespace gpucloud {

std::vector<std::int64_t> shape_of(const TensorRef& ref, const std::string& name) {
  if (ref.shape.empty()) return {static_cast<std::int64_t>(ref.view.size())};
  std::uint64_t n = 1;
  bool overflow = false;
  for (auto d : ref.shape) {
    GPUCLOUD_EXPECTS(d >= 0, "shape_of", name + ": shape has the negative dimension " + std::to_string(d));
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / u) overflow = true;
    n *= u;
  }
  std::string shape;
  for (auto d : ref.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  GPUCLOUD_EXPECTS(
      !overflow && n == ref.view.size(), "shape_of",
      name + ": shape [" + shape + "] does not hold the view's " + std::to_string(ref.view.size()) + " elements");
  return ref.shape;
}

void merge_state(StateDict& into, const std::string& prefix, const StateDict& from) {
  for (const auto& entry : from) {
    GPUCLOUD_EXPECTS(into.count(prefix + entry.first) == 0, "merge_state",
                     "name '" + prefix + entry.first + "' is already taken");
  }
  for (const auto& [name, ref] : from) into.emplace(prefix + name, ref);
}

StateDict sub_state(const StateDict& from, const std::string& prefix) {
  StateDict out;
  for (const auto& [name, ref] : from) {
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace(name.substr(prefix.size()), ref);
  }
  return out;
}

}  // namespace gpucloud

// ---- checks for load_state_dict -------------------------------------------------------------

#include "checkpoint/state_checks.hpp"

#include <gpucloud/movement/copy.hpp>

#include <cstring>

namespace gpucloud::detail {

void check_state_entries(const StateDict& expected, const StateDict& given, const char* call) {
  for (const auto& [name, ref] : expected) {
    auto it = given.find(name);
    GPUCLOUD_EXPECTS(it != given.end(), call, "state: no entry '" + name + "'");
    const BufferView v = it->second.view;
    GPUCLOUD_EXPECTS(v.dtype() == ref.view.dtype(), call,
                     "state['" + name + "']: " + dtype_name(v.dtype()) + ", expected " + dtype_name(ref.view.dtype()));
    GPUCLOUD_EXPECTS(v.size() == ref.view.size(), call,
                     "state['" + name + "']: " + std::to_string(v.size()) + " elements, expected " +
                         std::to_string(ref.view.size()));
  }
  for (const auto& entry : given) {
    GPUCLOUD_EXPECTS(expected.count(entry.first) != 0, call, "state: unexpected entry '" + entry.first + "'");
  }
}

void read_to_host(BufferView src, void* out, std::size_t bytes, StreamView stream) {
  Buffer host(bytes, DType::uint8, Device::host(), MemoryKind::pinned);
  copy(host, BufferView(src.data(), bytes, DType::uint8, src.kind(), src.device()), stream);
  stream.synchronize();
  std::memcpy(out, host.data(), bytes);
}

}  // namespace gpucloud::detail
