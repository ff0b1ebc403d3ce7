/// @file buffer.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/buffer.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/buffer.hpp>
