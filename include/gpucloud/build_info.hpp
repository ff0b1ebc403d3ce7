/// @file build_info.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/build_info.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/build_info.hpp>
