/// @file error.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/error.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/error.hpp>
