// Internal: a GEMM's arguments after validation, with every default resolved (not API).
#pragma once

#include <gpucloud/compute/gemm.hpp>

#include <cstdint>

namespace gpucloud::detail {

/// True for the fp8 dtypes (e4m3, e5m2).
inline bool is_fp8(DType t) { return t == DType::float8_e4m3 || t == DType::float8_e5m2; }

/// Elements one stored operand of @p rows x @p cols with leading dimension @p ld spans (0 when it
/// is empty); the front end has checked that it fits int64.
inline std::int64_t stored_extent(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

struct GemmPlan {
  GemmArgs args;                                                // lda/ldb/ldc and strides resolved
  std::int64_t rows_a = 0, cols_a = 0, rows_b = 0, cols_b = 0;  // as stored, row-major
  bool has_bias = false;
  Precision precision = Precision::fp32;
};

}  // namespace gpucloud::detail
