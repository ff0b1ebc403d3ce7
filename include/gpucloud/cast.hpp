/// @file cast.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/compute/cast.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/compute/cast.hpp>
