/// @file gpucloud.hpp
/// @brief Includes the whole public API.
#pragma once

#include <gpucloud/buffer.hpp>
#include <gpucloud/build_info.hpp>
#include <gpucloud/cast.hpp>
#include <gpucloud/communicator.hpp>
#include <gpucloud/conv.hpp>
#include <gpucloud/copy.hpp>
#include <gpucloud/copy_pipeline.hpp>
#include <gpucloud/cost_model.hpp>
#include <gpucloud/device.hpp>
#include <gpucloud/dtype.hpp>
#include <gpucloud/error.hpp>
#include <gpucloud/event.hpp>
#include <gpucloud/gemm.hpp>
#include <gpucloud/gpu_specs.hpp>
#include <gpucloud/grad_buckets.hpp>
#include <gpucloud/loss_scaler.hpp>
#include <gpucloud/managed_memory.hpp>
#include <gpucloud/memory_resource.hpp>
#include <gpucloud/monitor.hpp>
#include <gpucloud/nn_ops.hpp>
#include <gpucloud/optimizers.hpp>
#include <gpucloud/plain_resource.hpp>
#include <gpucloud/pool_resource.hpp>
#include <gpucloud/prefetcher.hpp>
#include <gpucloud/resource_adaptors.hpp>
#include <gpucloud/stream.hpp>
