/// @file gemm.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/compute/gemm.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/compute/gemm.hpp>
