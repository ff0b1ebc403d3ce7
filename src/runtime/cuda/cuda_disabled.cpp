// The CUDA backend's stand-in for builds without CUDA: no devices, and a clear error from
// every entry point (which the public layer never reaches, since no CUDA Device exists).
#include <gpucloud/runtime/error.hpp>

#include "amp/amp_launch.hpp"
#include "compute/nn_ops_launch.hpp"
#include "runtime/cuda/cuda_backend.hpp"

namespace gpucloud::detail::cuda {
namespace {
[[noreturn]] void unavailable(const char* call) {
  GPUCLOUD_FAIL(Unsupported, call, "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)");
}
}  // namespace

bool built() noexcept { return false; }
int runtime_version() noexcept { return 0; }
int device_count(std::string& reason) noexcept {
  reason = "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)";
  return 0;
}
DeviceProperties properties(int) { unavailable("device_properties"); }
MemoryInfo memory_info(int) { unavailable("memory_info"); }
std::unique_ptr<StreamImpl> make_stream(int) { unavailable("Stream"); }
std::unique_ptr<StreamImpl> adopt_stream(int, void*) { unavailable("Stream::from_native"); }
std::unique_ptr<EventImpl> make_event(int, bool) { unavailable("Event"); }
void* allocate(MemoryKind, std::size_t, int) { unavailable("allocate"); }
void deallocate(MemoryKind, void*, int) noexcept {}
void* allocate_async(std::size_t, int, StreamImpl*) { unavailable("allocate"); }
void deallocate_async(void*, int, StreamImpl*) noexcept {}
void memcpy_async(void*, const void*, std::size_t, StreamImpl&) { unavailable("copy"); }
void prefetch(const void*, std::size_t, Device, StreamImpl&) { unavailable("prefetch"); }
void advise(const void*, std::size_t, MemoryAdvice, Device) { unavailable("advise"); }
PointerInfo pointer_info(const void*) { return PointerInfo{}; }
void gemm(BufferView, BufferView, BufferView, const GemmPlan&, StreamImpl&) { unavailable("gemm"); }
void conv2d(const ConvPlan&, BufferView, BufferView, BufferView, StreamImpl&) { unavailable("conv2d"); }
void read_metrics(int, DeviceMetrics&) { unavailable("read_metrics"); }
std::string nvml_unavailable_reason() {
  return "gpucloud was built without CUDA (GPUCLOUD_CUDA=OFF or no toolkit found)";
}
void cast(BufferView, BufferView, StreamImpl&) { unavailable("cast"); }
void fill(BufferView, double, StreamImpl&) { unavailable("fill"); }
void fill(BufferView, std::int64_t, StreamImpl&) { unavailable("fill"); }

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

void nn_mse(const kernels::MseBody&, kernels::Grid, float*, StreamImpl&) { unavailable("mse_loss"); }
void nn_relu_backward(const kernels::ReluBackwardBody&, kernels::Grid, StreamImpl&) { unavailable("relu_backward"); }
void nn_bias_grad(const kernels::BiasGradBody&, kernels::Grid, StreamImpl&) { unavailable("bias_grad"); }

}  // namespace gpucloud::detail::cuda
