// Direct cuBLAS and cuDNN calls for the benchmarks' ratios (compiled in CUDA builds only).
#include "cuda_baselines.hpp"

#if GPUCLOUD_BENCH_CUDA_BASELINES
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstring>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace gpucloud::bench {

namespace {

constexpr int kRepeats = 5;

// A failing baseline is a broken benchmark, not a result: say where and stop.
void check(bool ok, const char* what, const char* file, int line) {
  if (ok) return;
  std::fprintf(stderr, "baseline failed: %s at %s:%d\n", what, file, line);
  std::abort();
}
#define BASELINE_CHECK(expr) check((expr), #expr, __FILE__, __LINE__)

// Milliseconds per call of @p call on @p stream: one warm-up, then kRepeats timed by events.
template <class Call>
double time_calls(cudaStream_t stream, Call call) {
  cudaEvent_t a = nullptr, b = nullptr;
  BASELINE_CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
  call();
  BASELINE_CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  BASELINE_CHECK(cudaEventRecord(a, stream) == cudaSuccess);
  for (int i = 0; i < kRepeats; ++i) call();
  BASELINE_CHECK(cudaEventRecord(b, stream) == cudaSuccess);
  BASELINE_CHECK(cudaEventSynchronize(b) == cudaSuccess);
  float ms = 0;
  BASELINE_CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / kRepeats;
}

cudaDataType_t blas_type(DType t) {
  return t == DType::float16 ? CUDA_R_16F : t == DType::bfloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

cudnnDataType_t dnn_type(DType t) {
  return t == DType::float16 ? CUDNN_DATA_HALF : t == DType::bfloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

}  // namespace

bool have_cuda_baselines() { return true; }

double cublas_gemm_ms(int device, const void* a, const void* b, void* c, DType in, DType out, bool tf32, std::int64_t m,
                      std::int64_t n, std::int64_t k, std::int64_t batch) {
  if (in == DType::float8_e4m3 || in == DType::float8_e5m2) return -1;
  BASELINE_CHECK(cudaSetDevice(device) == cudaSuccess);
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  BASELINE_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  BASELINE_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  BASELINE_CHECK(cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // Row-major C = A B^T is column-major C^T = B A^T: cuBLAS's A is our B, transposed.
  const double ms = time_calls(stream, [&] {
    BASELINE_CHECK(cublasGemmStridedBatchedEx(
                       handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                       &alpha, b, blas_type(in), static_cast<int>(k), n * k, a, blas_type(in), static_cast<int>(k),
                       m * k, &beta, c, blas_type(out), static_cast<int>(n), m * n, static_cast<int>(batch), compute,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  });
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  return ms;
}

double cudnn_conv_ms(int device, const ConvArgs& a, ConvPassKind pass, void* out, const void* in1, const void* in2,
                     DType dtype) {
  BASELINE_CHECK(cudaSetDevice(device) == cudaSuccess);
  const ConvOutputSize o = conv2d_output_size(a);
  cudaStream_t stream = nullptr;
  cudnnHandle_t h = nullptr;
  BASELINE_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  BASELINE_CHECK(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetStream(h, stream) == CUDNN_STATUS_SUCCESS);
  const cudnnTensorFormat_t format = a.layout == ConvLayout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const cudnnDataType_t type = dnn_type(dtype);
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  BASELINE_CHECK(cudnnCreateTensorDescriptor(&x) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnCreateTensorDescriptor(&y) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnCreateFilterDescriptor(&f) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnCreateConvolutionDescriptor(&conv) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetTensor4dDescriptor(x, format, type, static_cast<int>(a.n), static_cast<int>(a.c),
                                            static_cast<int>(a.h), static_cast<int>(a.w)) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetTensor4dDescriptor(y, format, type, static_cast<int>(a.n), static_cast<int>(a.k),
                                            static_cast<int>(o.h), static_cast<int>(o.w)) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetFilter4dDescriptor(f, type, format, static_cast<int>(a.k), static_cast<int>(a.c / a.groups),
                                            static_cast<int>(a.r), static_cast<int>(a.s)) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetConvolution2dDescriptor(conv, static_cast<int>(a.pad_h), static_cast<int>(a.pad_w),
                                                 static_cast<int>(a.stride_h), static_cast<int>(a.stride_w),
                                                 static_cast<int>(a.dilation_h), static_cast<int>(a.dilation_w),
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetConvolutionGroupCount(conv, static_cast<int>(a.groups)) == CUDNN_STATUS_SUCCESS);
  BASELINE_CHECK(cudnnSetConvolutionMathType(conv, dtype == DType::float32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH) ==
                 CUDNN_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  int found = 0;
  double ms = -1;
  void* ws = nullptr;
  auto workspace = [&](std::size_t bytes) {
    if (bytes > 0) BASELINE_CHECK(cudaMalloc(&ws, bytes) == cudaSuccess);
  };
  switch (pass) {
    case ConvPassKind::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf;
      BASELINE_CHECK(cudnnFindConvolutionForwardAlgorithm(h, x, f, conv, y, 1, &found, &perf) == CUDNN_STATUS_SUCCESS);
      workspace(perf.memory);
      BASELINE_CHECK(cudnnSetConvolutionMathType(conv, perf.mathType) == CUDNN_STATUS_SUCCESS);
      ms = time_calls(stream, [&] {
        BASELINE_CHECK(cudnnConvolutionForward(h, &alpha, x, in1, f, in2, conv, perf.algo, ws, perf.memory, &beta, y,
                                               out) == CUDNN_STATUS_SUCCESS);
      });
      break;
    }
    case ConvPassKind::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf;
      BASELINE_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, f, y, conv, x, 1, &found, &perf) ==
                     CUDNN_STATUS_SUCCESS);
      workspace(perf.memory);
      BASELINE_CHECK(cudnnSetConvolutionMathType(conv, perf.mathType) == CUDNN_STATUS_SUCCESS);
      ms = time_calls(stream, [&] {
        BASELINE_CHECK(cudnnConvolutionBackwardData(h, &alpha, f, in2, y, in1, conv, perf.algo, ws, perf.memory, &beta,
                                                    x, out) == CUDNN_STATUS_SUCCESS);
      });
      break;
    }
    case ConvPassKind::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf;
      BASELINE_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, conv, f, 1, &found, &perf) ==
                     CUDNN_STATUS_SUCCESS);
      workspace(perf.memory);
      BASELINE_CHECK(cudnnSetConvolutionMathType(conv, perf.mathType) == CUDNN_STATUS_SUCCESS);
      ms = time_calls(stream, [&] {
        BASELINE_CHECK(cudnnConvolutionBackwardFilter(h, &alpha, x, in1, y, in2, conv, perf.algo, ws, perf.memory,
                                                      &beta, f, out) == CUDNN_STATUS_SUCCESS);
      });
      break;
    }
  }
  if (ws) cudaFree(ws);
  cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroyFilterDescriptor(f);
  cudnnDestroyTensorDescriptor(y);
  cudnnDestroyTensorDescriptor(x);
  cudnnDestroy(h);
  cudaStreamDestroy(stream);
  return ms;
}

class RawNccl {
 public:
  ncclComm_t comm = nullptr;
  ~RawNccl() {
    if (comm) ncclCommDestroy(comm);
  }
};

std::shared_ptr<RawNccl> raw_nccl(const NcclUniqueId& id, int rank, int size, int device) {
  BASELINE_CHECK(cudaSetDevice(device) == cudaSuccess);
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof uid);
  auto c = std::make_shared<RawNccl>();
  BASELINE_CHECK(ncclCommInitRank(&c->comm, size, uid, rank) == ncclSuccess);
  return c;
}

void raw_nccl_all_reduce(RawNccl& c, void* buf, std::size_t count, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  BASELINE_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, c.comm, s) == ncclSuccess);
  BASELINE_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
}

}  // namespace gpucloud::bench

#else

namespace gpucloud::bench {
bool have_cuda_baselines() { return false; }
double cublas_gemm_ms(int, const void*, const void*, void*, DType, DType, bool, std::int64_t, std::int64_t,
                      std::int64_t, std::int64_t) {
  return -1;
}
double cudnn_conv_ms(int, const ConvArgs&, ConvPassKind, void*, const void*, const void*, DType) { return -1; }
class RawNccl {};
std::shared_ptr<RawNccl> raw_nccl(const NcclUniqueId&, int, int, int) { return nullptr; }
void raw_nccl_all_reduce(RawNccl&, void*, std::size_t, void*) {}
}  // namespace gpucloud::bench

#endif
