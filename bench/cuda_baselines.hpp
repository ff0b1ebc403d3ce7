// The peers the wrappers are measured against on a GPU: the same operation called directly
// through cuBLAS and cuDNN, on the same device buffers, in the same process. No CUDA types here.
#pragma once

#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/compute/conv.hpp>
#include <gpucloud/runtime/dtype.hpp>

#include <cstdint>
#include <memory>

namespace gpucloud::bench {

/// True when the baselines were compiled in (a CUDA build; cuDNN for the convolution).
bool have_cuda_baselines();

/// Milliseconds of one direct cublasGemmStridedBatchedEx computing row-major C = A B^T (m x n,
/// inner k, batch products packed back to back) on device @p device, averaged over a few calls
/// after a warm-up; -1 when cuBLAS has no GemmEx path for these dtypes (fp8) or no baseline.
double cublas_gemm_ms(int device, const void* a, const void* b, void* c, DType in, DType out, bool tf32, std::int64_t m,
                      std::int64_t n, std::int64_t k, std::int64_t batch);

/// The convolution passes.
enum class ConvPassKind { forward, backward_data, backward_filter };

/// Milliseconds of the fastest algorithm cudnnFind*Algorithm measures for this pass (no epilogue),
/// called directly on the same buffers: forward (y, x, filter), backward_data (dx, dy, filter),
/// backward_filter (dfilter, x, dy). -1 without cuDNN.
double cudnn_conv_ms(int device, const ConvArgs& args, ConvPassKind pass, void* out, const void* in1, const void* in2,
                     DType dtype);

/// A raw NCCL communicator (ncclCommInitRank on @p device), the collectives' baseline.
class RawNccl;
/// Joins rank @p rank of @p size through @p id; null when the baselines are not compiled in.
std::shared_ptr<RawNccl> raw_nccl(const NcclUniqueId& id, int rank, int size, int device);
/// One in-place float32 sum ncclAllReduce of @p count elements at @p buf on @p stream (a
/// cudaStream_t), waited for.
void raw_nccl_all_reduce(RawNccl& comm, void* buf, std::size_t count, void* stream);

}  // namespace gpucloud::bench
