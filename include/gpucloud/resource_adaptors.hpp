/// @file resource_adaptors.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/resource_adaptors.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/resource_adaptors.hpp>
