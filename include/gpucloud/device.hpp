/// @file device.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/device.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/device.hpp>
