/// @file conv.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/compute/conv.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/compute/conv.hpp>
