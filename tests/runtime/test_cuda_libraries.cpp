// The CUDA libraries gpucloud loads at first use (src/runtime/cuda/cuda_libraries.hpp), compiled
// into this test with their entry points:
//   CudaLibrariesPresent: with the toolkit visible every library loads, every function it lists
//     resolves, and calls through the entry points reach the real library (its version);
//   CudaLibrariesHidden: run by scripts/without-cuda-libraries.sh (every CUDA directory hidden),
//     each is an Unsupported that names the library, its soname and how to install it, raised
//     again by every later request;
//   CudaLibrariesFromPath / TooOld: hidden too, with GPUCLOUD_CUDA_LIBRARY_PATH naming a stand-in
//     libcublasLt (fake_cuda_library.c): the one found there is loaded and called; one that lacks
//     a function gpucloud calls is refused, naming the function.
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include "runtime/cuda/cuda_libraries.hpp"

#include <cublasLt.h>
#if GPUCLOUD_WITH_CUDNN
#include <cudnn.h>
#endif
#if GPUCLOUD_WITH_NCCL
#include <nccl.h>
#endif

#include <string>
#include <vector>

namespace {

namespace cu = gpucloud::detail::cuda;

std::vector<cu::Library> built_libraries() {
  std::vector<cu::Library> out{cu::Library::cublaslt};
  if (GPUCLOUD_WITH_CUDNN) out.push_back(cu::Library::cudnn);
  if (GPUCLOUD_WITH_NCCL) out.push_back(cu::Library::nccl);
  return out;
}

TEST(CudaLibrariesPresent, EachLoadsAndItsFunctionsAreReachedThroughTheEntryPoints) {
  for (cu::Library lib : built_libraries()) {
    EXPECT_NO_THROW(cu::require(lib)) << cu::library_info(lib).soname;
    EXPECT_TRUE(cu::available(lib));
    EXPECT_EQ(cu::unavailable_reason(lib), "");
  }
  EXPECT_EQ(cublasLtGetVersion() / 10000, static_cast<std::size_t>(CUBLAS_VER_MAJOR));
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
#if GPUCLOUD_WITH_CUDNN
  EXPECT_EQ(cudnnGetVersion() / 10000, static_cast<std::size_t>(CUDNN_MAJOR));
#endif
#if GPUCLOUD_WITH_NCCL
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version / 10000, NCCL_MAJOR);
#endif
}

TEST(CudaLibrariesHidden, EachIsATypedErrorNamingItAndHowToInstallIt) {
  for (cu::Library lib : built_libraries()) {
    const cu::LibraryInfo info = cu::library_info(lib);
    std::string first;
    try {
      cu::require(lib);
      ADD_FAILURE() << info.soname << " loaded: is it outside the hidden directories?";
    } catch (const gpucloud::Unsupported& e) {
      first = e.what();
      EXPECT_NE(first.find(info.soname), std::string::npos) << first;
      EXPECT_NE(first.find("could not be loaded"), std::string::npos) << first;
      EXPECT_NE(first.find("pip install 'gpucloud[cuda13]'"), std::string::npos) << first;
      EXPECT_NE(first.find(info.package), std::string::npos) << first;
    }
    EXPECT_FALSE(cu::available(lib));
    EXPECT_NE(cu::unavailable_reason(lib), "");
    try {
      cu::require(lib);
      ADD_FAILURE() << "the second request loaded " << info.soname;
    } catch (const gpucloud::Unsupported& e) {
      EXPECT_EQ(std::string(e.what()), first);  // the same answer, without trying again
    }
  }
}

TEST(CudaLibrariesFromPath, TheCopyInTheListedDirectoryIsLoadedAndCalled) {
  ASSERT_NO_THROW(cu::require(cu::Library::cublaslt));
  EXPECT_EQ(cublasLtGetVersion(), 130042u);  // the stand-in's answer, through the entry point
}

TEST(CudaLibrariesTooOld, ALibraryWithoutAFunctionGpucloudCallsIsRefusedByName) {
  try {
    cu::require(cu::Library::cublaslt);
    ADD_FAILURE() << "a cuBLASLt without cublasLtCreate was accepted";
  } catch (const gpucloud::Unsupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("has no cublasLt"), std::string::npos) << what;
    EXPECT_NE(what.find("older than the version gpucloud was built against"), std::string::npos) << what;
  }
  EXPECT_FALSE(cu::available(cu::Library::cublaslt));
}

}  // namespace
