// AMP's CUDA stand-ins for builds without CUDA: a clear error from every entry point (which the
// public layer never reaches, since no CUDA Device exists).
#include "amp/amp_launch.hpp"
#include "runtime/cuda/unavailable.hpp"

namespace gpucloud::detail::cuda {
void amp_unscale(const kernels::TensorListMeta<1>&, kernels::ScalerState*, StreamImpl&) { unavailable("unscale"); }
void amp_scale_by(const kernels::TensorListMeta<1>&, const float*, StreamImpl&) { unavailable("scale"); }
void amp_update_scale(kernels::ScalerState*, kernels::ScalerRule, StreamImpl&) { unavailable("update"); }
void amp_sum_squares(const kernels::TensorListMeta<1>&, float*, StreamImpl&) { unavailable("global_norm"); }
void amp_finish_norm(const float*, std::size_t, float, float*, float*, StreamImpl&) { unavailable("global_norm"); }
void amp_begin_step(kernels::StepScalars*, const float*, double, double, double, StreamImpl&) { unavailable("step"); }
void amp_sgd(const kernels::TensorListMeta<4>&, const kernels::SgdOp&, StreamImpl&) { unavailable("FusedSGD::step"); }
void amp_adam(const kernels::TensorListMeta<6>&, const kernels::AdamOp&, StreamImpl&) {
  unavailable("FusedAdam::step");
}

}  // namespace gpucloud::detail::cuda
