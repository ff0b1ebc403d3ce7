// Internal: the CUDA libraries gpucloud loads when it first needs them (not API).
//
// cuBLASLt, cuDNN and NCCL are not linked: every function the library calls in them
// (cuda_library_symbols.def) is an entry point of its own (cuda_library_trampolines.S) that jumps
// through a slot, and require() fills a library's slots with dlopen/dlsym. A program linked
// against gpucloud then starts, and runs on the host, on a machine that has none of them, as
// PyTorch's and CuPy's wheels do. The CUDA runtime is linked statically and loads the driver
// itself; NVML is loaded by monitor/cuda/nvml_metrics.cpp.
//
// Search order for each: the process (a library already loaded), then the dynamic loader's own
// (LD_LIBRARY_PATH, gpucloud's RUNPATH: the directories they were found in at build time,
// ld.so.conf), then the directories of $GPUCLOUD_CUDA_LIBRARY_PATH (the Python package puts the
// nvidia-* wheels' there), then $CUDA_HOME and $CUDA_PATH's lib64 and lib.
#pragma once

#include <string>

namespace gpucloud::detail::cuda {

/// A library loaded at run time.
enum class Library { cublaslt, cudnn, nccl };

/// The library's name for messages, its soname and the PyPI wheel that provides it.
struct LibraryInfo {
  const char* name;     // "cuBLASLt"
  const char* soname;   // "libcublasLt.so.13"
  const char* package;  // "nvidia-cublas"
};
/// What @p lib is.
LibraryInfo library_info(Library lib) noexcept;

/// Loads @p lib and resolves every function gpucloud calls in it, once per process (thread-safe).
/// @throws Unsupported naming the library, why it could not be loaded (dlerror, or the missing
/// function), and how to install it. Later calls throw the same.
void require(Library lib);

/// True when @p lib is loaded or loads now (require() without the throw).
bool available(Library lib) noexcept;

/// Why @p lib could not be loaded (empty when it is loaded, or not tried yet).
std::string unavailable_reason(Library lib);

}  // namespace gpucloud::detail::cuda
