/// @file memory_resource.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/memory_resource.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/memory_resource.hpp>
