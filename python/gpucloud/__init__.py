"""gpucloud: the runtime pieces of multi-GPU data-parallel training.

The same concepts and names as the C++ library, capability by capability: runtime (devices,
streams, events, dtypes), memory (buffers of every kind, RMM-style resources), movement (copies,
the copy pipeline, the prefetcher), compute (cast and fill, GEMM, convolution, training-step ops),
amp (loss scaling, fused optimizers, clipping), comm (MPI and NCCL communicators, gradient
buckets), monitor (device metrics) and checkpoint (asynchronous sharded checkpoints in
safetensors files). Every operation accepts gpucloud buffers and, without
copying, anything that speaks DLPack or the array interfaces (NumPy arrays, PyTorch tensors, CuPy
arrays); every Stream parameter also takes a framework's stream (__cuda_stream__).
"""

from ._cuda_libraries import publish_wheel_library_dirs as _publish_wheel_library_dirs

_publish_wheel_library_dirs()  # before any GPU use: where the nvidia-* wheels' libraries are

from ._core import (  # noqa: E402, F401
    AllReduceCostModel,
    AllReduceForm,
    AsyncPoolResource,
    Batch,
    Buffer,
    BindingAdvice,
    BuildInfo,
    CheckpointError,
    CheckpointMismatch,
    Chunk,
    ChunkTimes,
    CommBackend,
    CommunicationError,
    Communicator,
    ConvLayout,
    CopyPipeline,
    Device,
    DeviceError,
    DeviceHealth,
    DeviceKind,
    DeviceMetrics,
    DeviceProperties,
    DType,
    Error,
    Event,
    FusedAdam,
    FusedSGD,
    GpuSpec,
    GpuPlacement,
    GradBucketer,
    Hierarchy,
    HostThreads,
    InvalidArgument,
    LaunchInfo,
    LimitingAdaptor,
    LinkCost,
    LossScaler,
    LossScalerOptions,
    LossScalerState,
    MemoryAdvice,
    MemoryInfo,
    MemoryKind,
    MemoryQuota,
    MemoryResource,
    MemoryStatistics,
    MetricStats,
    MetricsMonitor,
    MetricsSummary,
    MigInstance,
    NumaNode,
    OutOfMemory,
    PlainResource,
    PoolResource,
    Precision,
    PrefetchWait,
    Prefetcher,
    StatisticsAdaptor,
    Stream,
    TimedEvent,
    Topology,
    Unsupported,
    BufferView,
    advise,
    available_devices,
    build_info,
    bias_grad,
    binding_advice,
    cast,
    comm_group,
    conv2d_forward,
    conv2d_backward_data,
    conv2d_backward_filter,
    conv2d_output_size,
    clear_memory_quota,
    clip_grad_norm,
    copy,
    cuda_device_count,
    cuda_unavailable_reason,
    device_properties,
    dtype,
    elapsed_ms,
    fill,
    find_gpu_spec,
    gemm,
    global_norm,
    gpu_specs,
    host_threads,
    launch_info_from_environment,
    add_callback,
    launch_host_func,
    memory_info,
    memory_quota,
    memory_quotas,
    mig_instances,
    mse_loss,
    parse_bytes,
    nvml_unavailable_reason,
    peak_tflops,
    prefetch,
    read_metrics,
    relu_backward,
    set_default_resource,
    set_memory_fraction,
    set_memory_quota,
    supports,
    topology,
)

__version__ = build_info().version


def _batches(self, stream):
    """Yield the prefetcher's batches, each with `stream` already waiting for its copies."""
    while (batch := self.next(stream)) is not None:
        yield batch


Prefetcher.batches = _batches

from . import distributed  # noqa: E402,F401  (NCCL ids through torchrun's store)
from . import checkpoint  # noqa: E402,F401  (gpucloud.checkpoint)
from . import telemetry  # noqa: E402,F401  (gpucloud.telemetry)
from . import elastic  # noqa: E402,F401  (gpucloud.elastic)

__all__ = [name for name in dir() if not name.startswith("_")]
