/// @file plain_resource.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/memory/plain_resource.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/memory/plain_resource.hpp>
