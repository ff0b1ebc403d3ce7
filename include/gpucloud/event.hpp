/// @file event.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/runtime/event.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/runtime/event.hpp>
