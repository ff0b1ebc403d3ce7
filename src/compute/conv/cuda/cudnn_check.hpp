// Internal: checks for cuDNN return codes (not API).
#pragma once

#include <cudnn_graph.h>

namespace gpucloud::detail {

/// Throws for @p status != CUDNN_STATUS_SUCCESS, by cuDNN 9's status classes: OutOfMemory for
/// allocation failures, InvalidArgument for BAD_PARAM*, Unsupported for NOT_SUPPORTED*,
/// DeviceError otherwise; the message carries cuDNN's string and its last error message.
void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace gpucloud::detail

#define GPUCLOUD_CUDNN_CHECK(call) ::gpucloud::detail::check_cudnn((call), #call, __FILE__, __LINE__)
