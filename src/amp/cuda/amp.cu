// CUDA launchers for the mixed-precision kernels: the bodies of amp_ops.hpp, the block reduction
// of the norm through CUB.
#include "kernels/amp/amp_ops.hpp"
#include "runtime/cuda/launch.cuh"

#include "amp/amp_launch.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/stream_impl.hpp"

#include <cuda_runtime_api.h>
#include <cub/block/block_reduce.cuh>

namespace gpucloud::detail::cuda {

namespace {
using namespace kernels;

template <int Depth, class Body>
__global__ void __launch_bounds__(kMtaThreads) multi_tensor_kernel(Body body, Grid grid, TensorListMeta<Depth> meta) {
  body(ThreadIndex{blockIdx.x, threadIdx.x}, grid, meta);
}

__global__ void __launch_bounds__(kMtaThreads) sum_squares_kernel(Grid grid, TensorListMeta<1> meta, float* partials) {
  using Reduce = cub::BlockReduce<float, kMtaThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const float mine = thread_sum_of_squares(ThreadIndex{blockIdx.x, threadIdx.x}, grid, meta);
  const float block_sum = Reduce(temp).Sum(mine);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

template <int Depth, class Body>
void launch_mta(const TensorListMeta<Depth>& meta, const Body& body, StreamImpl& s) {
  DeviceGuard guard(s.device().index());
  const Grid grid = mta_grid(meta);
  multi_tensor_kernel<Depth><<<grid.blocks, grid.threads, 0, native(s)>>>(body, grid, meta);
  GPUCLOUD_CUDA_CHECK(cudaGetLastError());
}

struct UpdateScaleFn {
  ScalerState* state;
  ScalerRule rule;
  __device__ void operator()() const { update_scale(state, rule); }
};
struct FinishNormFn {
  float max_norm;
  float* norm;
  float* coef;
  __device__ void operator()(double total) const { finish_norm_total(total, max_norm, norm, coef); }
};
struct BeginStepFn {
  StepScalars* scalars;
  const float* found_inf;
  double lr, beta1, beta2;
  __device__ void operator()() const { begin_step(scalars, found_inf, lr, beta1, beta2); }
};
}  // namespace

void amp_unscale(const TensorListMeta<1>& meta, ScalerState* state, StreamImpl& s) {
  launch_mta(meta, ElementwiseBody<1, UnscaleOp>{UnscaleOp{state}}, s);
}

void amp_scale_by(const TensorListMeta<1>& meta, const float* factor, StreamImpl& s) {
  launch_mta(meta, ElementwiseBody<1, ScaleByOp>{ScaleByOp{factor}}, s);
}

void amp_update_scale(ScalerState* state, ScalerRule rule, StreamImpl& s) {
  launch_single(UpdateScaleFn{state, rule}, s);
}

void amp_sum_squares(const TensorListMeta<1>& meta, float* partials, StreamImpl& s) {
  DeviceGuard guard(s.device().index());
  const Grid grid = mta_grid(meta);
  sum_squares_kernel<<<grid.blocks, grid.threads, 0, native(s)>>>(grid, meta, partials);
  GPUCLOUD_CUDA_CHECK(cudaGetLastError());
}

void amp_finish_norm(const float* partials, std::size_t count, float max_norm, float* norm, float* coef,
                     StreamImpl& s) {
  launch_sum_then(partials, static_cast<std::int64_t>(count), FinishNormFn{max_norm, norm, coef}, s);
}

void amp_begin_step(StepScalars* scalars, const float* found_inf, double lr, double beta1, double beta2,
                    StreamImpl& s) {
  launch_single(BeginStepFn{scalars, found_inf, lr, beta1, beta2}, s);
}

void amp_sgd(const TensorListMeta<4>& meta, const SgdOp& op, StreamImpl& s) {
  launch_mta(meta, ElementwiseBody<4, SgdOp>{op}, s);
}

void amp_adam(const TensorListMeta<6>& meta, const AdamOp& op, StreamImpl& s) {
  launch_mta(meta, ElementwiseBody<6, AdamOp>{op}, s);
}

}  // namespace gpucloud::detail::cuda
