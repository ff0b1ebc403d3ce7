/// @file grad_buckets.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/comm/grad_buckets.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/comm/grad_buckets.hpp>
