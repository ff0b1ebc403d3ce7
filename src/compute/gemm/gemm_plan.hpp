// Internal: a GEMM's arguments after validation, with every default resolved (not API).
#pragma once

#include <gpucloud/compute/gemm.hpp>

namespace gpucloud::detail {

struct GemmPlan {
  GemmArgs args;                                                // lda/ldb/ldc and strides resolved
  std::int64_t rows_a = 0, cols_a = 0, rows_b = 0, cols_b = 0;  // as stored, row-major
  bool has_bias = false;
  Precision precision = Precision::fp32;
};

}  // namespace gpucloud::detail
