/* A stand-in for a CUDA library, for the loader's tests (test_cuda_libraries): every function
 * gpucloud lists for cuBLASLt (src/runtime/cuda/cuda_library_symbols.def), each returning
 * FAKE_VERSION, so that a call through gpucloud's entry points shows which copy was loaded.
 * With FAKE_ONLY_VERSION, only cublasLtGetVersion: a library older than the one gpucloud needs. */
#define GPUCLOUD_WITH_CUDNN 0
#define GPUCLOUD_WITH_NCCL 0
#define FAKE_VERSION 130042

#ifdef FAKE_ONLY_VERSION
long cublasLtGetVersion(void) { return FAKE_VERSION; }
#else
#define GPUCLOUD_CUDA_SYMBOL(library, name) \
  long name(void) { return FAKE_VERSION; }
#include "runtime/cuda/cuda_library_symbols.def"
#endif
