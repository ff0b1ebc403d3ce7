/// @file copy_pipeline.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/movement/copy_pipeline.hpp> (or
/// <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/movement/copy_pipeline.hpp>
