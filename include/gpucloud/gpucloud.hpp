/// @file gpucloud.hpp
/// @brief Includes the whole public API, capability by capability.
#pragma once

// runtime: devices, streams, events, errors, dtypes, build and GPU facts
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/dtype.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/event.hpp>
#include <gpucloud/runtime/gpu_specs.hpp>
#include <gpucloud/runtime/stream.hpp>
#include <gpucloud/runtime/threads.hpp>
// memory: buffers and RMM-style resources
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/memory/managed_memory.hpp>
#include <gpucloud/memory/memory_resource.hpp>
#include <gpucloud/memory/plain_resource.hpp>
#include <gpucloud/memory/pool_resource.hpp>
#include <gpucloud/memory/quota.hpp>
#include <gpucloud/memory/resource_adaptors.hpp>
// movement: copies, the copy pipeline, the prefetcher
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/movement/copy_pipeline.hpp>
#include <gpucloud/movement/prefetcher.hpp>
// compute: cast and fill, GEMM, convolution, training-step ops
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/compute/conv.hpp>
#include <gpucloud/compute/gemm.hpp>
#include <gpucloud/compute/nn_ops.hpp>
// amp: loss scaling, fused optimizers
#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/amp/optimizers.hpp>
// comm: communicators, gradient buckets, the collective cost model
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/cost_model.hpp>
#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/comm/transport.hpp>
// monitor: device metrics
#include <gpucloud/monitor/monitor.hpp>
#include <gpucloud/monitor/topology.hpp>
// checkpoint: named state, asynchronous sharded checkpoints in safetensors files
#include <gpucloud/checkpoint/checkpoint.hpp>
#include <gpucloud/checkpoint/state_dict.hpp>
// elastic: preemption agreed across ranks, restart facts, the supervisor's heartbeat
#include <gpucloud/elastic/job_control.hpp>
// telemetry: a Prometheus endpoint, training metrics, straggler detection
#include <gpucloud/telemetry/telemetry.hpp>
