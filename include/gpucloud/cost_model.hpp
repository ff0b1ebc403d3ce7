/// @file cost_model.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/comm/cost_model.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/comm/cost_model.hpp>
