/// @file prefetcher.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/movement/prefetcher.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/movement/prefetcher.hpp>
