#include "comm/host_checks.hpp"

#include <gpucloud/runtime/error.hpp>

#include "memory/access.hpp"

#include <string>

namespace gpucloud::detail {

void check_host_buffer(BufferView v, StreamView s, const char* call, const char* arg, const char* who) {
  GPUCLOUD_EXPECTS(s.device().is_host(), call,
                   std::string("stream: ") + who + " runs on host streams, not " + s.device().str());
  GPUCLOUD_EXPECTS(v.device().is_host(), call,
                   std::string(arg) + ": " + who + " takes host memory, not memory of " + v.device().str());
  check_access(v, s, Access::copy, call, arg);
}

void check_reducible(ReduceOp op, DType t, const char* call) {
  GPUCLOUD_EXPECTS(op != ReduceOp::average || is_floating(t), call,
                   std::string("op: average needs a floating dtype, not ") + dtype_name(t));
  GPUCLOUD_EXPECTS(t != DType::uint8, call, "dtype: uint8 is not reducible");
}

}  // namespace gpucloud::detail
