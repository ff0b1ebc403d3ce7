/// @file stream.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/stream.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/stream.hpp>
