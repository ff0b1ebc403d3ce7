/// @file communicator.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/comm/communicator.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/comm/communicator.hpp>
