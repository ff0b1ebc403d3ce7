/// @file export.hpp
/// @brief Symbol visibility: the library is built with hidden visibility and exports its API.
#pragma once

#if defined(_WIN32)
#if defined(GPUCLOUD_BUILDING_LIBRARY)
#define GPUCLOUD_API __declspec(dllexport)
#else
#define GPUCLOUD_API __declspec(dllimport)
#endif
#else
/// Marks a declaration as part of the exported ABI.
#define GPUCLOUD_API __attribute__((visibility("default")))
#endif
