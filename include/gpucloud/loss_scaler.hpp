/// @file loss_scaler.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/amp/loss_scaler.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/amp/loss_scaler.hpp>
