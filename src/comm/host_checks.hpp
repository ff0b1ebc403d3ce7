// Internal: the argument checks the host-memory backends (MPI, transport) share (not API).
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

namespace gpucloud::detail {

/// @p v and @p s are host memory and a host stream that may copy it; @p who names the backend
/// in the message ("the MPI backend", "a transport communicator").
/// @throws InvalidArgument naming @p arg (or the stream) otherwise.
void check_host_buffer(BufferView v, StreamView s, const char* call, const char* arg, const char* who);

/// @p op applies to @p t: average needs a floating dtype, uint8 is not reducible.
void check_reducible(ReduceOp op, DType t, const char* call);

}  // namespace gpucloud::detail
