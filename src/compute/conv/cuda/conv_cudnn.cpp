// The CUDA convolution: cuDNN's convolution API (forward, backward-data, backward-filter, and
// ConvolutionBiasActivationForward for the fused epilogues). Descriptors and the heuristic's
// algorithm are built once per (shape, dtype, layout, pass, epilogue, device) and cached; the
// workspace comes from the user's device resource or CUDA's stream-ordered pool (memory/workspace.hpp); one handle per
// device, bound to the caller's stream under a lock for each call.
#include <gpucloud/runtime/error.hpp>

#include "compute/conv/cuda/conv_backend.hpp"
#include "compute/conv/cuda/cudnn_check.hpp"
#include "compute/plan_cache.hpp"
#include "memory/workspace.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_libraries.hpp"
#include "runtime/cuda/device_handles.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace gpucloud::detail::cuda {

namespace {

constexpr std::size_t kMaxWorkspace = std::size_t{256} << 20;
constexpr const char* kCall = "conv2d";

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::float16:
      return CUDNN_DATA_HALF;
    case DType::bfloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

int i32(std::int64_t v) { return static_cast<int>(v); }  // validated to fit before we get here

// GPUCLOUD_CUDNN_BENCHMARK=1 (PyTorch's cudnn.benchmark): time every algorithm once per shape
// (cudnnFind*, synchronous, with its own scratch) instead of taking the heuristic's choice.
bool benchmark() {
  static const bool on = [] {
    const char* v = std::getenv("GPUCLOUD_CUDNN_BENCHMARK");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

// One cuDNN handle per device (runtime/cuda/device_handles.hpp); its entry's mutex serialises
// cudnnSetStream + the call.
using Handles = PerDeviceHandles<cudnnHandle_t>;
Handles& handles() {
  static Handles h([](cudnnHandle_t* out) { GPUCLOUD_CUDNN_CHECK(cudnnCreate(out)); },
                   [](cudnnHandle_t handle) { return cudnnDestroy(handle) == CUDNN_STATUS_SUCCESS; }, "cuDNN");
  return h;
}

// Descriptors and the chosen algorithm of one convolution.
struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  int algo = 0;  // the pass's cudnnConvolution*Algo_t
  std::size_t workspace = 0;
  // Forward with a bias: cudnnConvolutionBiasActivationForward, until cuDNN refuses it (bfloat16,
  // or CUDNN_STATUS_NOT_SUPPORTED once), then the convolution, cudnnAddTensor and the activation.
  std::atomic<bool> fused{true};
  ~Plan() {
    if (act) cudnnDestroyActivationDescriptor(act);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (filter) cudnnDestroyFilterDescriptor(filter);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

// Picks the first algorithm that succeeds within the workspace cap (and, when @p only is not -1,
// is that algorithm: cuDNN's fused bias with an identity activation needs IMPLICIT_PRECOMP_GEMM),
// and sets the math type it was measured with on the descriptor, as PyTorch does. fp32 takes only
// FMA-math algorithms, so that no TF32 creeps in.
template <class Perf>
void choose(Plan& plan, const Perf* perf, int returned, int only, bool fp32) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kMaxWorkspace) continue;
    if (only >= 0 && static_cast<int>(perf[i].algo) != only) continue;
    if (fp32 && perf[i].mathType != CUDNN_FMA_MATH) continue;
    plan.algo = static_cast<int>(perf[i].algo);
    plan.workspace = perf[i].memory;
    GPUCLOUD_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, perf[i].mathType));
    return;
  }
  GPUCLOUD_FAIL(Unsupported, kCall,
                "cuDNN offers no algorithm for this shape, layout and dtype within a 256 MiB workspace");
}

std::unique_ptr<Plan> make_plan(cudnnHandle_t handle, const ConvPlan& p) {
  const kernels::ConvGeometry& g = p.g;
  auto plan = std::make_unique<Plan>();
  const cudnnDataType_t type = cudnn_type(p.dtype);
  const cudnnTensorFormat_t format = g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  GPUCLOUD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  GPUCLOUD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x, format, type, i32(g.n), i32(g.c), i32(g.h), i32(g.w)));
  GPUCLOUD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  GPUCLOUD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, format, type, i32(g.n), i32(g.k), i32(g.oh), i32(g.ow)));
  GPUCLOUD_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->filter));
  GPUCLOUD_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(plan->filter, type, format, i32(g.k), i32(g.cg()), i32(g.r), i32(g.s)));
  GPUCLOUD_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  GPUCLOUD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, i32(g.pad_h), i32(g.pad_w), i32(g.stride_h),
                                                       i32(g.stride_w), i32(g.dilation_h), i32(g.dilation_w),
                                                       CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  GPUCLOUD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan->conv, i32(g.groups)));
  // fp32 stays fp32 (no TF32: the fp32 tolerance is 1e-5); fp16/bf16 on tensor cores.
  GPUCLOUD_CUDNN_CHECK(
      cudnnSetConvolutionMathType(plan->conv, p.dtype == DType::float32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, k = 0, oh = 0, ow = 0;
  GPUCLOUD_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->filter, &n, &k, &oh, &ow));
  if (oh != g.oh || ow != g.ow) {
    throw DeviceError(kCall,
                      "cuDNN's output size " + std::to_string(oh) + " x " + std::to_string(ow) + " differs from ours " +
                          std::to_string(g.oh) + " x " + std::to_string(g.ow),
                      false, __FILE__, __LINE__);
  }
  constexpr int kCount = 16;
  int returned = 0;
  const bool fp32 = p.dtype == DType::float32;
  switch (p.pass) {
    case ConvPass::forward: {
      if (p.has_bias) {
        GPUCLOUD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->bias));
        GPUCLOUD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->bias, CUDNN_TENSOR_NCHW, type, 1, i32(g.k), 1, 1));
        GPUCLOUD_CUDNN_CHECK(cudnnCreateActivationDescriptor(&plan->act));
        const bool relu = p.args.epilogue == Epilogue::bias_relu;
        GPUCLOUD_CUDNN_CHECK(cudnnSetActivationDescriptor(
            plan->act, relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0));
      }
      cudnnConvolutionFwdAlgoPerf_t perf[kCount];
      GPUCLOUD_CUDNN_CHECK(benchmark()
                               ? cudnnFindConvolutionForwardAlgorithm(handle, plan->x, plan->filter, plan->conv,
                                                                      plan->y, kCount, &returned, perf)
                               : cudnnGetConvolutionForwardAlgorithm_v7(handle, plan->x, plan->filter, plan->conv,
                                                                        plan->y, kCount, &returned, perf));
      // The fused call takes float and half data (cudnnConvolutionBiasActivationForward's table);
      // with an identity activation only IMPLICIT_PRECOMP_GEMM. Otherwise the bias and ReLU run
      // as their own cuDNN calls after the convolution (any algorithm).
      plan->fused = p.has_bias && p.dtype != DType::bfloat16;
      const bool identity_bias = plan->fused && p.args.epilogue == Epilogue::bias;
      bool chosen = false;
      if (identity_bias) {
        try {
          choose(*plan, perf, returned, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, fp32);
          chosen = true;
        } catch (const Unsupported&) {
          plan->fused = false;  // no such algorithm within the cap: unfused
        }
      }
      if (!chosen) choose(*plan, perf, returned, -1, fp32);
      break;
    }
    case ConvPass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kCount];
      GPUCLOUD_CUDNN_CHECK(benchmark()
                               ? cudnnFindConvolutionBackwardDataAlgorithm(handle, plan->filter, plan->y, plan->conv,
                                                                           plan->x, kCount, &returned, perf)
                               : cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, plan->filter, plan->y, plan->conv,
                                                                             plan->x, kCount, &returned, perf));
      choose(*plan, perf, returned, -1, fp32);
      break;
    }
    case ConvPass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kCount];
      GPUCLOUD_CUDNN_CHECK(benchmark()
                               ? cudnnFindConvolutionBackwardFilterAlgorithm(handle, plan->x, plan->y, plan->conv,
                                                                             plan->filter, kCount, &returned, perf)
                               : cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, plan->x, plan->y, plan->conv,
                                                                               plan->filter, kCount, &returned, perf));
      choose(*plan, perf, returned, -1, fp32);
      break;
    }
  }
  return plan;
}

using PlanKey = std::array<std::int64_t, 20>;

PlanKey key_of(int device, const ConvPlan& p) {
  PlanKey key{};
  key[0] = device;
  const detail::ConvKey conv = detail::conv_key(p);
  std::copy(conv.begin(), conv.end(), key.begin() + 1);
  return key;
}

detail::PlanCache<PlanKey, Plan>& plans() {
  static detail::PlanCache<PlanKey, Plan> cache;
  return cache;
}

}  // namespace

void conv2d(const ConvPlan& p, BufferView out, BufferView in1, BufferView in2, StreamImpl& stream) {
  require(Library::cudnn);  // loaded at first use: Unsupported naming it when it is missing
  const int device = stream.device().index();
  DeviceGuard guard(device);
  const cudaStream_t native = cuda::native(stream);
  Handles::Entry& h = handles().get(device);
  std::lock_guard<std::mutex> lock(h.mutex);
  GPUCLOUD_CUDNN_CHECK(cudnnSetStream(h.handle, native));
  const float alpha = p.args.alpha, beta = p.args.beta;
  if (p.g.n == 0) {  // only the filter gradient gets here: dfilter = beta * dfilter
    if (beta == 0.0f) {
      GPUCLOUD_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), native));
    } else if (beta != 1.0f) {
      cudnnTensorDescriptor_t d = nullptr;
      GPUCLOUD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
      const cudnnStatus_t st = [&] {
        const cudnnStatus_t s = cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_type(p.dtype), 1, 1, 1,
                                                           static_cast<int>(out.size()));
        return s != CUDNN_STATUS_SUCCESS ? s : cudnnScaleTensor(h.handle, d, out.data(), &beta);
      }();
      cudnnDestroyTensorDescriptor(d);
      GPUCLOUD_CUDNN_CHECK(st);
    }
    return;
  }
  Plan& plan = plans().get(key_of(device, p), [&] { return make_plan(h.handle, p); });
  const Workspace scratch(plan.workspace, StreamView::from_impl(stream));
  void* workspace = scratch.get();
  switch (p.pass) {
    case ConvPass::forward:
      if (p.has_bias && plan.fused.load()) {
        // y = act(alpha * conv(x) + beta * z + bias), z = y. cuDNN does not document that z goes
        // unread when alpha2 (beta) is 0, and 0 * NaN is NaN: a y that was never written is
        // cleared first, so beta = 0 never reads it (as the unfused call promises).
        if (beta == 0.0f) GPUCLOUD_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), native));
        const cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
            h.handle, &alpha, plan.x, in1.data(), plan.filter, in2.data(), plan.conv,
            static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), workspace, plan.workspace, &beta, plan.y, out.data(),
            plan.bias, p.args.bias.data(), plan.act, plan.y, out.data());
        if (st != CUDNN_STATUS_NOT_SUPPORTED) {
          GPUCLOUD_CUDNN_CHECK(st);
          break;
        }
        plan.fused = false;  // refused before it ran (it checks its arguments first): unfused from now on
      }
      GPUCLOUD_CUDNN_CHECK(cudnnConvolutionForward(h.handle, &alpha, plan.x, in1.data(), plan.filter, in2.data(),
                                                   plan.conv, static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo),
                                                   workspace, plan.workspace, &beta, plan.y, out.data()));
      if (p.has_bias) {  // the epilogue as its own calls: y += bias (broadcast over N, H, W), then ReLU
        const float one = 1.0f, zero = 0.0f;
        GPUCLOUD_CUDNN_CHECK(cudnnAddTensor(h.handle, &one, plan.bias, p.args.bias.data(), &one, plan.y, out.data()));
        if (p.args.epilogue == Epilogue::bias_relu) {
          GPUCLOUD_CUDNN_CHECK(
              cudnnActivationForward(h.handle, plan.act, &one, plan.y, out.data(), &zero, plan.y, out.data()));
        }
      }
      break;
    case ConvPass::backward_data:
      GPUCLOUD_CUDNN_CHECK(cudnnConvolutionBackwardData(
          h.handle, &alpha, plan.filter, in2.data(), plan.y, in1.data(), plan.conv,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), workspace, plan.workspace, &beta, plan.x, out.data()));
      break;
    case ConvPass::backward_filter:
      GPUCLOUD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h.handle, &alpha, plan.x, in1.data(), plan.y, in2.data(),
                                                          plan.conv,
                                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo),
                                                          workspace, plan.workspace, &beta, plan.filter, out.data()));
      break;
  }
}

}  // namespace gpucloud::detail::cuda
