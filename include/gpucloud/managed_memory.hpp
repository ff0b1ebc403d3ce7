/// @file managed_memory.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/managed_memory.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/managed_memory.hpp>
