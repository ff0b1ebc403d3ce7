/// @file optimizers.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/amp/optimizers.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/amp/optimizers.hpp>
