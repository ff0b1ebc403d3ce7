// The error hierarchy, and the CUDA / cuBLAS / NCCL return-code checks (these run without a GPU:
// they only translate codes).
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include <string>

#if GPUCLOUD_TEST_CUDA_CHECKS
#include "compute/gemm/cuda/library_check.hpp"
#include "runtime/cuda/cuda_check.hpp"
#if GPUCLOUD_TEST_NCCL_CHECKS
#include "comm/nccl/nccl_check.hpp"
#endif
#if GPUCLOUD_TEST_CUDNN_CHECKS
#include "compute/conv/cuda/cudnn_check.hpp"
#endif
#endif

namespace gc = gpucloud;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST(Errors, CarryCallReasonAndLocation) {
  try {
    GPUCLOUD_EXPECTS(1 + 1 == 3, "frobnicate", "n: must be positive");
    FAIL();
  } catch (const gc::Error& e) {
    EXPECT_EQ(e.call(), "frobnicate");
    EXPECT_EQ(e.reason(), "n: must be positive");
    EXPECT_TRUE(contains(e.file(), "test_error_checks.cpp"));
    EXPECT_GT(e.line(), 0);
    EXPECT_TRUE(contains(e.what(), "frobnicate: n: must be positive (")) << e.what();
    EXPECT_NE(dynamic_cast<const gc::InvalidArgument*>(&e), nullptr);
  }
  const gc::OutOfMemory oom("cudaMalloc", "out of memory", 4096, "x.cpp", 7);
  EXPECT_EQ(oom.requested_bytes(), 4096u);
  const gc::DeviceError sticky("k", "illegal address", true, "x.cpp", 1);
  EXPECT_TRUE(sticky.sticky());
  // Every type is a gpucloud::Error and a std::runtime_error.
  EXPECT_NE(dynamic_cast<const std::runtime_error*>(static_cast<const gc::Error*>(&oom)), nullptr);
}

#if GPUCLOUD_TEST_CUDA_CHECKS
TEST(CudaCheck, MapsCodesToTypedErrors) {
  EXPECT_NO_THROW(GPUCLOUD_CUDA_CHECK(cudaSuccess));
  try {
    GPUCLOUD_CUDA_CHECK_ALLOC(cudaErrorMemoryAllocation, 1234);
    FAIL();
  } catch (const gc::OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes(), 1234u);
    EXPECT_TRUE(contains(e.what(), "cudaErrorMemoryAllocation")) << e.what();
    EXPECT_TRUE(contains(e.what(), "recoverable")) << e.what();
  }
  try {
    GPUCLOUD_CUDA_CHECK(cudaErrorIllegalAddress);
    FAIL();
  } catch (const gc::DeviceError& e) {
    EXPECT_TRUE(e.sticky());
    EXPECT_TRUE(contains(e.what(), "cudaErrorIllegalAddress")) << e.what();
    EXPECT_TRUE(contains(e.what(), "must restart")) << e.what();
    EXPECT_TRUE(contains(e.what(), "test_error_checks.cpp")) << e.what();
    EXPECT_EQ(e.call(), "cudaErrorIllegalAddress");
  }
  try {
    GPUCLOUD_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL();
  } catch (const gc::DeviceError& e) {
    EXPECT_FALSE(e.sticky());
    EXPECT_TRUE(contains(e.what(), "invalid argument")) << e.what();
  }
  EXPECT_NO_THROW(GPUCLOUD_CUDA_CHECK_NOTHROW(cudaErrorInvalidValue));
}

// Every code driver_types.h says leaves the process unable to use CUDA again is sticky: the
// trainer must restart rather than retry.
TEST(CudaCheck, EveryCodeThatNeedsARestartIsSticky) {
  for (cudaError_t code :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorAssert, cudaErrorHardwareStackError,
        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace, cudaErrorInvalidPc,
        cudaErrorLaunchTimeout, cudaErrorECCUncorrectable, cudaErrorContained, cudaErrorNvlinkUncorrectable,
        cudaErrorMpsClientTerminated, cudaErrorTensorMemoryLeak, cudaErrorExternalDevice}) {
    EXPECT_TRUE(gc::detail::is_sticky(code)) << cudaGetErrorName(code);
  }
  for (cudaError_t code : {cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorNotReady, cudaErrorNoDevice}) {
    EXPECT_FALSE(gc::detail::is_sticky(code)) << cudaGetErrorName(code);
  }
}

TEST(CublasCheck, MapsStatusesToTypedErrors) {
  EXPECT_NO_THROW(GPUCLOUD_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
  EXPECT_THROW(GPUCLOUD_CUBLAS_CHECK(CUBLAS_STATUS_ALLOC_FAILED), gc::OutOfMemory);
  EXPECT_THROW(GPUCLOUD_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE), gc::InvalidArgument);
  EXPECT_THROW(GPUCLOUD_CUBLAS_CHECK(CUBLAS_STATUS_EXECUTION_FAILED), gc::DeviceError);
  try {
    GPUCLOUD_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL();
  } catch (const gc::Unsupported& e) {
    EXPECT_TRUE(contains(e.what(), "CUBLAS_STATUS_NOT_SUPPORTED")) << e.what();
  }
}

#if GPUCLOUD_TEST_CUDNN_CHECKS
TEST(CudnnCheck, MapsStatusClassesToTypedErrors) {
  EXPECT_NO_THROW(GPUCLOUD_CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
  EXPECT_THROW(GPUCLOUD_CUDNN_CHECK(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED), gc::OutOfMemory);
  EXPECT_THROW(GPUCLOUD_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH), gc::InvalidArgument);
  EXPECT_THROW(GPUCLOUD_CUDNN_CHECK(CUDNN_STATUS_EXECUTION_FAILED), gc::DeviceError);
  try {
    GPUCLOUD_CUDNN_CHECK(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
    FAIL();
  } catch (const gc::Unsupported& e) {
    EXPECT_TRUE(contains(e.what(), "CUDNN_STATUS_NOT_SUPPORTED")) << e.what();
    EXPECT_TRUE(contains(e.what(), "GPUCLOUD_CUDNN_CHECK") || contains(e.what(), "CUDNN_STATUS")) << e.what();
  }
}
#endif

#if GPUCLOUD_TEST_NCCL_CHECKS
TEST(NcclCheck, MapsResultsToTypedErrors) {
  EXPECT_NO_THROW(GPUCLOUD_NCCL_CHECK(ncclSuccess));
  EXPECT_THROW(GPUCLOUD_NCCL_CHECK(ncclInvalidArgument), gc::InvalidArgument);
  try {
    GPUCLOUD_NCCL_CHECK(ncclRemoteError);
    FAIL();
  } catch (const gc::CommunicationError& e) {
    EXPECT_TRUE(contains(e.what(), "ncclRemoteError")) << e.what();
  }
}
#endif
#endif
