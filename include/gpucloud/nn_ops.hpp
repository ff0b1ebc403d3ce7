/// @file nn_ops.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/compute/nn_ops.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/compute/nn_ops.hpp>
