// Internal: launches of the mixed-precision kernels on either backend (not API). Each function
// packs its tensors with multi_tensor_apply and runs the shared bodies of kernels/amp/amp_ops.hpp:
// host loops on a host stream's worker, CUDA kernels (src/amp/cuda/amp.cu) on a GPU stream.
#pragma once

#include <gpucloud/runtime/stream.hpp>

#include "kernels/amp/amp_ops.hpp"

#include <array>
#include <vector>

namespace gpucloud::detail::amp {

using Rows1 = std::vector<std::array<BufferView, 1>>;
using Rows4 = std::vector<std::array<BufferView, 4>>;
using Rows6 = std::vector<std::array<BufferView, 6>>;

int unscale(const Rows1& grads, kernels::ScalerState* state, StreamView s);
int scale_by(const Rows1& tensors, const float* factor, StreamView s);
void update_scale(kernels::ScalerState* state, kernels::ScalerRule rule, StreamView s);
/// Blocks (and so partial sums) sum_squares() writes for @p tensors.
std::size_t partial_count(const Rows1& tensors);
int sum_squares(const Rows1& tensors, float* partials, StreamView s);
void finish_norm(const float* partials, std::size_t count, float max_norm, float* norm, float* coef, StreamView s);
void begin_step(kernels::StepScalars* scalars, const float* found_inf, double lr, double beta1, double beta2,
                StreamView s);
int sgd(const Rows4& rows, const kernels::SgdOp& op, StreamView s);
int adam(const Rows6& rows, const kernels::AdamOp& op, StreamView s);

}  // namespace gpucloud::detail::amp

namespace gpucloud::detail::cuda {
// The CUDA side of the launches above (src/amp/cuda/amp.cu, or stand-ins without CUDA).
void amp_unscale(const kernels::TensorListMeta<1>& meta, kernels::ScalerState* state, StreamImpl& s);
void amp_scale_by(const kernels::TensorListMeta<1>& meta, const float* factor, StreamImpl& s);
void amp_update_scale(kernels::ScalerState* state, kernels::ScalerRule rule, StreamImpl& s);
void amp_sum_squares(const kernels::TensorListMeta<1>& meta, float* partials, StreamImpl& s);
void amp_finish_norm(const float* partials, std::size_t count, float max_norm, float* norm, float* coef, StreamImpl& s);
void amp_begin_step(kernels::StepScalars* scalars, const float* found_inf, double lr, double beta1, double beta2,
                    StreamImpl& s);
void amp_sgd(const kernels::TensorListMeta<4>& meta, const kernels::SgdOp& op, StreamImpl& s);
void amp_adam(const kernels::TensorListMeta<6>& meta, const kernels::AdamOp& op, StreamImpl& s);
}  // namespace gpucloud::detail::cuda
