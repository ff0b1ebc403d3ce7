/// @file mpi_interop.hpp
/// @brief Deprecated path, kept for one release: include <gpucloud/comm/mpi_interop.hpp> (or <gpucloud/gpucloud.hpp>).
#pragma once

#include <gpucloud/comm/mpi_interop.hpp>
