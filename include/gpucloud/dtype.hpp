/// @file dtype.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/dtype.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/dtype.hpp>
