/// @file pool_resource.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/pool_resource.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/pool_resource.hpp>
