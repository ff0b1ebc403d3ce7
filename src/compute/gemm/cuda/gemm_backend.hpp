// Internal: the GEMM's CUDA backend, cuBLASLt (src/compute/gemm/cuda/gemm_cublaslt.cpp), or its
// stand-in without CUDA (gemm_disabled.cpp). Not API.
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "compute/gemm/gemm_plan.hpp"
#include "runtime/stream_impl.hpp"

namespace gpucloud::detail::cuda {

/// cuBLASLt GEMM of a validated plan.
void gemm(BufferView c, BufferView a, BufferView b, const GemmPlan& plan, StreamImpl& stream);

}  // namespace gpucloud::detail::cuda
