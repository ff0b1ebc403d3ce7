/// @file detail/hd.hpp
/// @brief GPUCLOUD_HD marks math shared by the CUDA kernels and the host loops (not API).
#pragma once

#if defined(__CUDACC__)
#define GPUCLOUD_HD __host__ __device__
#else
#define GPUCLOUD_HD
#endif
