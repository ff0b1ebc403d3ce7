/// @file copy.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/movement/copy.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/movement/copy.hpp>
