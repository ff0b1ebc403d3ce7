// The one __global__ wrapper: runs a body with the hardware's block and thread index.
#pragma once

#include "kernels/launch/launch.hpp"

namespace gpucloud::kernels {
namespace {  // internal linkage: safe beside other CUDA libraries in one process

template <class Body>
__global__ void run_body(Body body, Grid grid) {
  body(ThreadIndex{blockIdx.x, threadIdx.x}, grid);
}

}  // namespace
}  // namespace gpucloud::kernels
