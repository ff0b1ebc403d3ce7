// Internal: the GEMM's host backend (src/compute/gemm/host/gemm_host.cpp), the reference the
// cuBLASLt path is tested against (not API).
#pragma once

#include <gpucloud/memory/buffer.hpp>

#include "compute/gemm/gemm_plan.hpp"

namespace gpucloud::detail {

/// C = epilogue(alpha op(A) op(B) + beta C) of a validated plan, on the calling thread.
void host_gemm(BufferView c, BufferView a, BufferView b, const GemmPlan& plan);

}  // namespace gpucloud::detail
