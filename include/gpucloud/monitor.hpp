/// @file monitor.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/monitor/monitor.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/monitor/monitor.hpp>
