/// @file gpu_specs.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/gpu_specs.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/gpu_specs.hpp>
