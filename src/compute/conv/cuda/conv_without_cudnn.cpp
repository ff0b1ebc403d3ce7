// CUDA builds whose toolkit has no cuDNN: convolutions on a GPU say so (the host model still runs).
#include <gpucloud/runtime/error.hpp>

#include "compute/conv/cuda/conv_backend.hpp"

namespace gpucloud::detail::cuda {

void conv2d(const ConvPlan&, BufferView, BufferView, BufferView, StreamImpl&) {
  GPUCLOUD_FAIL(Unsupported, "conv2d", "gpucloud was built without cuDNN: convolutions run on host streams only");
}

}  // namespace gpucloud::detail::cuda
