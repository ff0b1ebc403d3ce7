// The CUDA GEMM: cuBLASLt, row-major through the transpose identity C^T = op(B)^T op(A)^T (no
// copies), one plan (descriptors, layouts, the heuristic's algorithm) per shape, cached.
#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/runtime/error.hpp>

#include "compute/cuda/cast_backend.hpp"
#include "compute/gemm/alignment.hpp"
#include "compute/gemm/cuda/gemm_backend.hpp"
#include "compute/gemm/cuda/library_check.hpp"
#include "compute/plan_cache.hpp"
#include "memory/workspace.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_libraries.hpp"
#include "runtime/cuda/device_handles.hpp"
#include "runtime/cuda/native_stream.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace gpucloud::detail::cuda {

namespace {

constexpr std::size_t kMaxWorkspace = std::size_t{32} << 20;
// The least alignment of a bias handed to cuBLASLt as it is; less is staged (gemm(), below).
constexpr std::uint32_t kBiasAlignment = 16;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::float32:
      return CUDA_R_32F;
    case DType::float16:
      return CUDA_R_16F;
    case DType::bfloat16:
      return CUDA_R_16BF;
    case DType::float8_e4m3:
      return CUDA_R_8F_E4M3;
    case DType::float8_e5m2:
      return CUDA_R_8F_E5M2;
    default:
      break;
  }
  GPUCLOUD_FAIL(InvalidArgument, "gemm", std::string("dtype ") + dtype_name(t) + " has no cuBLASLt type");
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::relu:
      return CUBLASLT_EPILOGUE_RELU;
    case Epilogue::bias_relu:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::bias_gelu:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One cuBLASLt handle per device (runtime/cuda/device_handles.hpp).
PerDeviceHandles<cublasLtHandle_t>& handles() {
  static PerDeviceHandles<cublasLtHandle_t> h(
      [](cublasLtHandle_t* out) { GPUCLOUD_CUBLAS_CHECK(cublasLtCreate(out)); },
      [](cublasLtHandle_t handle) { return cublasLtDestroy(handle) == CUBLAS_STATUS_SUCCESS; }, "cuBLASLt");
  return h;
}

// The alignments of A, B and C (= D) that the algorithm may assume. cuBLASLt's heuristic assumes
// 256 bytes unless told otherwise, and a view into a larger buffer often has less: an algorithm
// chosen for aligned pointers then fails or reads out of bounds. Part of the plan's key.
struct Alignments {
  std::uint32_t a = 256, b = 256, c = 256;
  std::uint32_t bias = 256;  // the bias cuBLASLt reads: the caller's, or staged in aligned scratch
};

Alignments alignments_of(const BufferView& a, const BufferView& b, const BufferView& c, const GemmPlan& p) {
  Alignments out{pointer_alignment(a.data()), pointer_alignment(b.data()), pointer_alignment(c.data())};
  if (p.has_bias) {
    const std::uint32_t bias = pointer_alignment(p.args.bias.data());
    out.bias = bias < kBiasAlignment ? 256 : bias;  // under kBiasAlignment it is staged (gemm(), below)
  }
  return out;
}

// Everything a plan depends on.
using PlanKey = std::array<std::int64_t, 23>;

PlanKey key_of(int device, DType a, DType b, DType c, const GemmPlan& p, Alignments align) {
  const GemmArgs& g = p.args;
  return {device,
          g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.ldc,
          g.batch,
          g.stride_a,
          g.stride_b,
          g.stride_c,
          static_cast<std::int64_t>(g.trans_a),
          static_cast<std::int64_t>(g.trans_b),
          static_cast<std::int64_t>(g.epilogue),
          static_cast<std::int64_t>(a),
          static_cast<std::int64_t>(b),
          static_cast<std::int64_t>(c),
          p.has_bias ? static_cast<std::int64_t>(g.bias.dtype()) : -1,
          g.tf32 ? 1 : 0,
          g.beta != 0.0f ? 1 : 0,
          static_cast<std::int64_t>(align.a) | static_cast<std::int64_t>(align.b) << 16,
          align.c,
          align.bias};
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;  // cuBLASLt's A (our B), B (our A), C
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
  DType bias_type = DType::float32;  // the bias as cuBLASLt reads it (converted per call if not the caller's)
  std::mutex mutex;                  // the descriptor's pointer attributes are set per call
  ~Plan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void set_batch(cublasLtMatrixLayout_t layout, std::int64_t batch, std::int64_t stride) {
  if (batch == 1) return;
  const int count = static_cast<int>(batch);
  GPUCLOUD_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  GPUCLOUD_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}

// The plan with the bias read as @p bias_type, or null when cuBLASLt has no algorithm for it.
std::unique_ptr<Plan> try_plan(cublasLtHandle_t handle, DType a, DType b, DType c, const GemmPlan& p, Alignments align,
                               DType bias_type) {
  const GemmArgs& g = p.args;
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B.
  const cublasOperation_t lt_ta = g.trans_b == Transpose::transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t lt_tb = g.trans_a == Transpose::transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &lt_ta, sizeof lt_ta));
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &lt_tb, sizeof lt_tb));
  const cublasLtEpilogue_t epilogue = lt_epilogue(g.epilogue);
  GPUCLOUD_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (p.has_bias) {
    const cudaDataType_t type = cuda_type(bias_type);
    GPUCLOUD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    plan->bias_type = bias_type;
  }
  // Layouts of the storage, column-major: a row-major rows x cols matrix is cols x rows.
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, cuda_type(b), static_cast<std::uint64_t>(p.cols_b),
                                                   static_cast<std::uint64_t>(p.rows_b), g.ldb));
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, cuda_type(a), static_cast<std::uint64_t>(p.cols_a),
                                                   static_cast<std::uint64_t>(p.rows_a), g.lda));
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, cuda_type(c), static_cast<std::uint64_t>(g.n),
                                                   static_cast<std::uint64_t>(g.m), g.ldc));
  set_batch(plan->la, g.batch, g.stride_b);
  set_batch(plan->lb, g.batch, g.stride_a);
  set_batch(plan->lc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t max_ws = kMaxWorkspace;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = [&] {
    cublasStatus_t s =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
    // cuBLASLt's A is our B. C and D are the same buffer.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> minimum[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.c}};
    for (const auto& [attribute, bytes] : minimum) {
      if (s != CUBLAS_STATUS_SUCCESS) return s;
      s = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes);
    }
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    return cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->la, plan->lb, plan->lc, plan->lc, pref, 1, &result,
                                          &found);
  }();
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return nullptr;
  GPUCLOUD_CUBLAS_CHECK(st);
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return plan;
}

// The plan: the bias in its own dtype, or, where cuBLASLt takes no float32 bias with this output
// (it documents the output's dtype as the bias's default; bfloat16 for fp8 products into float32),
// converted per call: the host model adds the float32 bias, a difference far inside the 16-bit
// and fp8 tolerances.
std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, DType a, DType b, DType c, const GemmPlan& p,
                                Alignments align) {
  // fp8 products with a float32 output take a bfloat16 bias (cublasLtMatmul's fp8 table).
  const bool fp8_fp32 = is_fp8(a) && c == DType::float32;
  const DType bias_type = !p.has_bias ? c : fp8_fp32 ? DType::bfloat16 : p.args.bias.dtype();
  if (auto plan = try_plan(handle, a, b, c, p, align, bias_type)) return plan;
  if (p.has_bias && bias_type != c) {
    if (auto plan = try_plan(handle, a, b, c, p, align, c)) return plan;
  }
  GPUCLOUD_FAIL(Unsupported, "gemm", "cuBLASLt has no algorithm for this shape, layout and dtype combination");
}

detail::PlanCache<PlanKey, Plan>& plans() {
  static detail::PlanCache<PlanKey, Plan> cache;
  return cache;
}

}  // namespace

void gemm(BufferView c, BufferView a, BufferView b, const GemmPlan& p, StreamImpl& stream) {
  require(Library::cublaslt);  // loaded at first use: Unsupported naming it when it is missing
  const GemmArgs& g = p.args;
  const bool fp8 = is_fp8(a.dtype());  // its pairing and layout checked by the front end
  const int device = stream.device().index();
  DeviceGuard guard(device);
  const cudaStream_t native = cuda::native(stream);
  cublasLtHandle_t handle = handles().get(device).handle;
  const Alignments align = alignments_of(a, b, c, p);
  Plan& plan = plans().get(key_of(device, a.dtype(), b.dtype(), c.dtype(), p, align),
                           [&] { return make_plan(handle, a.dtype(), b.dtype(), c.dtype(), p, align); });

  // Stream-ordered scratch (the user's device resource, or CUDA's async pool): the workspace,
  // and the fp8 scales.
  const StreamView view = StreamView::from_impl(stream);
  const Workspace workspace_scratch(plan.workspace, view);
  const Workspace scales_scratch(fp8 ? 2 * sizeof(float) : 0, view);
  // The bias cuBLASLt reads: the caller's, or a copy in the call's (aligned) scratch when it must
  // be converted to the plan's bias dtype or its address is under kBiasAlignment (a view at an odd
  // element offset): cuBLASLt's epilogue reads it with vector loads.
  const bool stage_bias =
      p.has_bias && (plan.bias_type != g.bias.dtype() || pointer_alignment(g.bias.data()) < kBiasAlignment);
  const Workspace bias_scratch(stage_bias ? g.bias.size() * dtype_size(plan.bias_type) : 0, view);
  const void* bias = p.has_bias ? g.bias.data() : nullptr;
  if (stage_bias) {
    const BufferView converted(bias_scratch.get(), g.bias.size(), plan.bias_type, MemoryKind::device, stream.device());
    cast(converted, g.bias, stream);
    bias = converted.data();
  }
  void* workspace = workspace_scratch.get();
  auto* scales = static_cast<float*>(scales_scratch.get());
  if (fp8) {
    const float host_scales[2] = {g.scale_b, g.scale_a};  // cuBLASLt's A is our B
    GPUCLOUD_CUDA_CHECK(cudaMemcpyAsync(scales, host_scales, sizeof host_scales, cudaMemcpyHostToDevice, native));
  }

  std::lock_guard<std::mutex> lock(plan.mutex);
  if (p.has_bias) {
    GPUCLOUD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (fp8) {
    const float* sa = scales;
    const float* sb = scales + 1;
    GPUCLOUD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    GPUCLOUD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  }
  GPUCLOUD_CUBLAS_CHECK(cublasLtMatmul(handle, plan.op, &g.alpha, b.data(), plan.la, a.data(), plan.lb, &g.beta,
                                       c.data(), plan.lc, c.data(), plan.lc, &plan.algo, workspace, plan.workspace,
                                       native));
}

}  // namespace gpucloud::detail::cuda
