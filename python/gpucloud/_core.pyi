"""
gpucloud's C++ core, bound by capability: runtime, memory, movement, compute, amp, comm, monitor, checkpoint, telemetry (the same names as the C++ API)
"""
from __future__ import annotations
import collections.abc
import datetime
import numpy
import numpy.typing
import os
import typing
class Error(RuntimeError):
    """Base of every gpucloud error."""
class InvalidArgument(Error, ValueError):
    """A bad argument; nothing was changed."""
class OutOfMemory(Error, MemoryError):
    """An allocation failed; recoverable."""
class DeviceError(Error):
    """A device or runtime failure."""
class CommunicationError(Error):
    """A collective failed, timed out or a peer died."""
class Unsupported(Error, NotImplementedError):
    """Not available in this build or on this device."""
class CheckpointError(Error):
    """A checkpoint cannot be written or read (I/O, truncation, checksum)."""
class CheckpointMismatch(CheckpointError, ValueError):
    """A sound checkpoint that does not fit what it is loaded into; nothing was written."""
__all__: list[str] = ['AllReduceCostModel', 'AllReduceForm', 'AsyncPoolResource', 'Batch', 'BindingAdvice', 'Buffer', 'BufferView', 'BuildInfo', 'CHECKPOINT_FORMAT_VERSION', 'CheckpointError', 'CheckpointManifest', 'CheckpointMismatch', 'CheckpointProgress', 'CheckpointTensorInfo', 'Checkpointer', 'Chunk', 'ChunkTimes', 'CommBackend', 'CommunicationError', 'Communicator', 'ConvLayout', 'CopyPipeline', 'DType', 'Device', 'DeviceError', 'DeviceHealth', 'DeviceKind', 'DeviceMetrics', 'DeviceProperties', 'Error', 'Event', 'FusedAdam', 'FusedSGD', 'GpuPlacement', 'GpuSpec', 'GradBucketer', 'Hierarchy', 'HostThreads', 'InvalidArgument', 'JobControl', 'LaunchInfo', 'LimitingAdaptor', 'LinkCost', 'LossScaler', 'LossScalerOptions', 'LossScalerState', 'MemoryAdvice', 'MemoryInfo', 'MemoryKind', 'MemoryQuota', 'MemoryResource', 'MemoryStatistics', 'MetricStats', 'MetricsMonitor', 'MetricsSummary', 'MigInstance', 'NumaNode', 'OutOfMemory', 'PREEMPTED_EXIT_CODE', 'PendingSave', 'PlainResource', 'PoolResource', 'Precision', 'PrefetchWait', 'Prefetcher', 'RestartInfo', 'StatisticsAdaptor', 'StepMetrics', 'StragglerReport', 'Stream', 'TelemetryExporter', 'TimedEvent', 'Topology', 'Unsupported', 'add_callback', 'advise', 'available_devices', 'bias_grad', 'binding_advice', 'build_info', 'cast', 'checkpoint_directory_name', 'checkpoint_find_latest', 'checkpoint_load', 'checkpoint_read_manifest', 'clear_memory_quota', 'clip_grad_norm', 'comm_group', 'conv2d_backward_data', 'conv2d_backward_filter', 'conv2d_forward', 'conv2d_output_size', 'copy', 'cuda_device_count', 'cuda_unavailable_reason', 'device_properties', 'dtype', 'elapsed_ms', 'fill', 'find_gpu_spec', 'gemm', 'global_norm', 'gpu_specs', 'host_threads', 'launch_host_func', 'launch_info_from_environment', 'memory_info', 'memory_quota', 'memory_quotas', 'mig_instances', 'mse_loss', 'nvml_unavailable_reason', 'parse_bytes', 'peak_tflops', 'prefetch', 'read_metrics', 'relu_backward', 'restart_info_from_environment', 'set_default_resource', 'set_memory_fraction', 'set_memory_quota', 'supports', 'telemetry_job_labels', 'topology']
class _Noop:
    """
    A bare pybind11 class: the method and property baselines of the overhead bench.
    """
    def __init__(self) -> None:
        ...
    def noop(self) -> bool:
        ...
    @property
    def value(self) -> int:
        ...
class DType:
    """
    Element types.
    
    Members:
    
      float32
    
      float64
    
      float16
    
      bfloat16
    
      int32
    
      int64
    
      uint8
    
      float8_e4m3
    
      float8_e5m2
    """
    __members__: typing.ClassVar[dict[str, DType]]
    bfloat16: typing.ClassVar[DType]
    float16: typing.ClassVar[DType]
    float32: typing.ClassVar[DType]
    float64: typing.ClassVar[DType]
    float8_e4m3: typing.ClassVar[DType]
    float8_e5m2: typing.ClassVar[DType]
    int32: typing.ClassVar[DType]
    int64: typing.ClassVar[DType]
    uint8: typing.ClassVar[DType]
    @typing.overload
    def __eq__(self, other: DType) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: DType) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @typing.overload
    def __str__(self) -> str:
        ...
    @typing.overload
    def __str__(self) -> str:
        ...
    @property
    def itemsize(self) -> int:
        """
        Bytes per element.
        """
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class DeviceKind:
    """
    Members:
    
      host
    
      cuda
    """
    __members__: typing.ClassVar[dict[str, DeviceKind]]
    cuda: typing.ClassVar[DeviceKind]
    host: typing.ClassVar[DeviceKind]
    @typing.overload
    def __eq__(self, other: DeviceKind) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: DeviceKind) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class Device:
    """
    The host, or CUDA GPU i.
    """
    @staticmethod
    def cuda(index: typing.SupportsInt | typing.SupportsIndex = 0) -> Device:
        """
        CUDA device `index`; raises if it is not there.
        """
    @staticmethod
    def host() -> Device:
        """
        The host device; always available.
        """
    def __eq__(self, arg0: Device) -> bool:
        ...
    def __hash__(self) -> int:
        ...
    def __init__(self, spec: str = 'host') -> None:
        """
        A device from 'host', 'cpu', 'cuda', 'cuda:N' or a visible GPU's or MIG instance's UUID ('GPU-…', 'MIG-…').
        """
    def __repr__(self) -> str:
        ...
    def __str__(self) -> str:
        ...
    @property
    def index(self) -> int:
        ...
    @property
    def is_cuda(self) -> bool:
        ...
    @property
    def is_host(self) -> bool:
        ...
    @property
    def kind(self) -> DeviceKind:
        ...
class DeviceProperties:
    """
    What a device is and can do.
    """
    def __repr__(self) -> str:
        ...
    @property
    def backend(self) -> str:
        ...
    @property
    def compute_capability_major(self) -> int:
        ...
    @property
    def compute_capability_minor(self) -> int:
        ...
    @property
    def concurrent_managed_access(self) -> bool:
        ...
    @property
    def multiprocessor_count(self) -> int:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def total_memory(self) -> int:
        ...
    @property
    def uuid(self) -> str:
        ...
class MemoryInfo:
    """
    Free and total bytes of a device's memory.
    """
    @property
    def free(self) -> int:
        ...
    @property
    def total(self) -> int:
        ...
class BuildInfo:
    """
    How the library was built.
    """
    @property
    def cuda(self) -> bool:
        ...
    @property
    def cuda_architectures(self) -> str:
        ...
    @property
    def cuda_runtime_version(self) -> int:
        ...
    @property
    def cudnn(self) -> bool:
        """
        cuDNN convolutions available on GPUs.
        """
    @property
    def host_bf16_gemm(self) -> str:
        """
        The host bf16 GEMM's: 'oneDNN' (native bf16 products) or 'widened to fp32'.
        """
    @property
    def host_blas(self) -> str:
        """
        The host GEMM's implementation: 'OpenBLAS' or 'built-in'.
        """
    @property
    def host_conv(self) -> str:
        """
        The host fp32 convolution's: 'oneDNN' or 'im2col + GEMM'.
        """
    @property
    def mpi(self) -> bool:
        """
        MPI communicators available.
        """
    @property
    def nccl(self) -> bool:
        """
        NCCL communicators available.
        """
    @property
    def telemetry(self) -> bool:
        """
        Prometheus telemetry available (built with prometheus-cpp).
        """
    @property
    def version(self) -> str:
        ...
class HostThreads:
    """
    How many host threads the library runs and why.
    """
    def __repr__(self) -> str:
        ...
    @property
    def blas(self) -> int:
        """
        OpenBLAS's threads (0 without OpenBLAS).
        """
    @property
    def cpus(self) -> int:
        """
        CPUs the process may use (affinity, capped by the cgroup CPU quota).
        """
    @property
    def pool(self) -> int:
        """
        The library's compute pool, the calling thread included.
        """
    @property
    def reason(self) -> str:
        """
        Where the figures come from.
        """
class Stream:
    """
    An in-order asynchronous work queue on one device.
    """
    @staticmethod
    def from_native(native: typing.Any, device: Device | str | None = None) -> Stream:
        """
        Adopts a caller's stream (as Stream(stream), with the device given or taken from the object); the caller keeps it alive.
        """
    def __cuda_stream__(self) -> tuple[int, int]:
        """
        The CUDA stream protocol: (0, cudaStream_t as an int), so frameworks can adopt this stream.
        """
    @typing.overload
    def __init__(self, device: Device = ...) -> None:
        ...
    @typing.overload
    def __init__(self, stream: typing.Any) -> None:
        """
        Adopts a framework's CUDA stream (an object with __cuda_stream__, a torch.cuda.Stream, a cupy.cuda.Stream): gpucloud work is then ordered with the framework's. Every function that takes a Stream accepts these directly.
        """
    def __repr__(self) -> str:
        ...
    def query(self) -> bool:
        """
        True when all enqueued work has finished.
        """
    def synchronize(self) -> None:
        """
        Wait for the work enqueued so far; raises the first error that work raised.
        """
    def wait(self, event: Event) -> None:
        """
        Later work on this stream waits for the event's latest record.
        """
    @property
    def device(self) -> Device:
        ...
    @property
    def native_handle(self) -> int:
        """
        The cudaStream_t as an integer (0 on the host).
        """
class Event:
    """
    A marker recorded on a stream, to order work across streams (a TimedEvent also times it).
    """
    def __init__(self, device: Device = ...) -> None:
        """
        An untimed event (the cheaper kind): it orders work; TimedEvent measures time.
        """
    def query(self) -> bool:
        """
        True when the latest record has completed.
        """
    def record(self, stream: Stream) -> None:
        """
        Capture the work enqueued on `stream` so far.
        """
    def synchronize(self) -> None:
        """
        Block until the latest record has completed.
        """
    @property
    def device(self) -> Device:
        ...
    @property
    def timed(self) -> bool:
        """
        True for a TimedEvent.
        """
class TimedEvent(Event):
    """
    An event that also keeps time: what elapsed_ms() measures between.
    """
    def __init__(self, device: Device = ...) -> None:
        ...
class MemoryKind:
    """
    Where the bytes of a buffer live.
    
    Members:
    
      host
    
      pinned
    
      device
    
      managed
    """
    __members__: typing.ClassVar[dict[str, MemoryKind]]
    device: typing.ClassVar[MemoryKind]
    host: typing.ClassVar[MemoryKind]
    managed: typing.ClassVar[MemoryKind]
    pinned: typing.ClassVar[MemoryKind]
    @typing.overload
    def __eq__(self, other: MemoryKind) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: MemoryKind) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @typing.overload
    def __str__(self) -> str:
        ...
    @typing.overload
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class MemoryResource:
    """
    Allocates memory of one kind on one device.
    """
    @property
    def device(self) -> Device:
        ...
    @property
    def kind(self) -> MemoryKind:
        ...
class PlainResource(MemoryResource):
    """
    One system allocation per request.
    """
    def __init__(self, kind: MemoryKind | str, device: Device | str = ...) -> None:
        ...
class PoolResource(MemoryResource):
    """
    Caching pool with power-of-two size classes and stream-ordered reuse.
    """
    def __init__(self, upstream: MemoryResource, max_block_bytes: typing.SupportsInt | typing.SupportsIndex = 1073741824) -> None:
        ...
    def release(self) -> None:
        """
        Return every cached block upstream.
        """
    @property
    def cached_bytes(self) -> int:
        ...
    @property
    def pool_bytes(self) -> int:
        ...
class AsyncPoolResource(MemoryResource):
    """
    CUDA's stream-ordered allocator.
    """
    def __init__(self, device: Device) -> None:
        ...
class MemoryStatistics:
    @property
    def current_allocations(self) -> int:
        ...
    @property
    def current_bytes(self) -> int:
        ...
    @property
    def peak_bytes(self) -> int:
        ...
    @property
    def total_allocations(self) -> int:
        ...
    @property
    def total_bytes(self) -> int:
        ...
class StatisticsAdaptor(MemoryResource):
    """
    Counts bytes and allocations.
    """
    def __init__(self, upstream: MemoryResource) -> None:
        ...
    def reset_peak(self) -> None:
        ...
    def statistics(self) -> MemoryStatistics:
        ...
class LimitingAdaptor(MemoryResource):
    """
    Fails allocations beyond a byte limit.
    """
    def __init__(self, upstream: MemoryResource, limit_bytes: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def allocated_bytes(self) -> int:
        ...
    @property
    def limit_bytes(self) -> int:
        ...
class MemoryQuota:
    """
    A device's memory quota and what the process holds under it.
    """
    def __repr__(self) -> str:
        ...
    @property
    def device(self) -> Device:
        """
        The device.
        """
    @property
    def held_bytes(self) -> int:
        """
        Bytes the library's resources hold from the device.
        """
    @property
    def limit_bytes(self) -> int | None:
        """
        The quota in bytes; None when unset.
        """
    @property
    def peak_bytes(self) -> int:
        """
        Highest held_bytes seen.
        """
    @property
    def refused(self) -> int:
        """
        Allocations the quota refused.
        """
    @property
    def source(self) -> str:
        """
        Where the limit came from ('' without one).
        """
class Buffer:
    """
    An owning allocation of one dtype, of any memory kind, on one device.
    """
    def __dlpack__(self, *, stream: typing.Any = None, max_version: typing.Any = None, dl_device: typing.Any = None, copy: typing.Any = None) -> typing.Any:
        """
        A DLPack capsule viewing the memory (zero-copy); keeps it alive.
        """
    def __dlpack_device__(self) -> tuple:
        ...
    def __init__(self: Buffer, shape: int | collections.abc.Sequence[int], dtype: DType | str | numpy.dtype[typing.Any] = 'float32', device: Device | str = ..., kind: MemoryKind | str = ..., stream: Stream = None, mr: MemoryResource | None = None) -> None:
        ...
    def __len__(self) -> int:
        ...
    def __repr__(self: Buffer) -> str:
        ...
    def reshape(self, *args) -> BufferView:
        """
        A View of the same memory with another shape (same number of elements).
        """
    @property
    def __array_interface__(self) -> dict:
        ...
    @property
    def __cuda_array_interface__(self) -> dict:
        ...
    @property
    def data_ptr(self) -> int:
        ...
    @property
    def device(self) -> Device:
        ...
    @property
    def dtype(self) -> DType:
        ...
    @property
    def kind(self) -> MemoryKind:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def shape(self) -> tuple:
        ...
    @property
    def size(self) -> int:
        """
        Number of elements.
        """
class BufferView:
    """
    A non-owning view (a pipeline chunk, a batch's array); keeps its owner alive.
    """
    def __dlpack__(self, *, stream: typing.Any = None, max_version: typing.Any = None, dl_device: typing.Any = None, copy: typing.Any = None) -> typing.Any:
        """
        A DLPack capsule viewing the memory (zero-copy); keeps it alive.
        """
    def __dlpack_device__(self) -> tuple:
        ...
    def __len__(self) -> int:
        ...
    def __repr__(self) -> str:
        ...
    def reshape(self, *args) -> BufferView:
        """
        A View of the same memory with another shape (same number of elements).
        """
    @property
    def __array_interface__(self) -> dict:
        ...
    @property
    def __cuda_array_interface__(self) -> dict:
        ...
    @property
    def data_ptr(self) -> int:
        ...
    @property
    def device(self) -> Device:
        ...
    @property
    def dtype(self) -> DType:
        ...
    @property
    def kind(self) -> MemoryKind:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def shape(self) -> tuple:
        ...
    @property
    def size(self) -> int:
        """
        Number of elements.
        """
class MemoryAdvice:
    """
    Hints for managed memory.
    
    Members:
    
      read_mostly
    
      unset_read_mostly
    
      preferred_location
    
      unset_preferred_location
    
      accessed_by
    
      unset_accessed_by
    """
    __members__: typing.ClassVar[dict[str, MemoryAdvice]]
    accessed_by: typing.ClassVar[MemoryAdvice]
    preferred_location: typing.ClassVar[MemoryAdvice]
    read_mostly: typing.ClassVar[MemoryAdvice]
    unset_accessed_by: typing.ClassVar[MemoryAdvice]
    unset_preferred_location: typing.ClassVar[MemoryAdvice]
    unset_read_mostly: typing.ClassVar[MemoryAdvice]
    @typing.overload
    def __eq__(self, other: MemoryAdvice) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: MemoryAdvice) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class Chunk:
    """
    One chunk handed to a pipeline's compute step.
    """
    @property
    def data(self) -> typing.Any:
        """
        The chunk in device memory (a View).
        """
    @property
    def index(self) -> int:
        """
        0, 1, 2, ... in order of the data.
        """
    @property
    def offset(self) -> int:
        """
        First element of the chunk in the whole array.
        """
    @property
    def stream(self) -> typing.Any:
        """
        The stream to enqueue the chunk's work on.
        """
class ChunkTimes:
    """
    When each stage of a chunk ended, in ms after the call's start.
    """
    @property
    def compute_end(self) -> float:
        ...
    @property
    def copy_in_begin(self) -> float:
        ...
    @property
    def copy_in_end(self) -> float:
        ...
    @property
    def copy_out_end(self) -> float:
        ...
    @property
    def index(self) -> int:
        ...
    @property
    def stream(self) -> int:
        ...
class CopyPipeline:
    """
    Moves arrays between host and device in chunks over several streams, overlapping copies with the compute step.
    """
    def __init__(self, device: Device | str = ..., *, chunk_bytes: typing.SupportsInt | typing.SupportsIndex = 4194304, depth: typing.SupportsInt | typing.SupportsIndex = 3, record_timeline: bool = False) -> None:
        ...
    def download(self, dst: numpy.typing.ArrayLike, src: numpy.typing.ArrayLike, stream: Stream) -> None:
        """
        Copy device `src` into host `dst` chunk by chunk.
        """
    def timeline(self) -> list[ChunkTimes]:
        """
        Stage times of every chunk of the last call (record_timeline=True).
        """
    def transform(self, dst: numpy.typing.ArrayLike, src: numpy.typing.ArrayLike, stream: Stream, step: collections.abc.Callable[[Chunk], None] | None) -> None:
        """
        Stream host `src` through device chunks: copy in, `step(chunk)`, copy back into host `dst`.
        """
    def upload(self, dst: numpy.typing.ArrayLike, src: numpy.typing.ArrayLike, stream: Stream, step: collections.abc.Callable[[Chunk], None] | None = None) -> None:
        """
        Copy host `src` into device `dst` chunk by chunk; `step(chunk)` enqueues work on each chunk.
        """
    @property
    def chunk_bytes(self) -> int:
        ...
    @property
    def depth(self) -> int:
        ...
    @property
    def device(self) -> Device:
        ...
class Batch:
    """
    A batch on the device, handed out by Prefetcher.next().
    """
    @property
    def arrays(self) -> list:
        """
        The arrays in device memory (flat Views; reshape on the consumer's side).
        """
    @property
    def index(self) -> int:
        ...
    @property
    def ready(self) -> Event:
        """
        The event recorded after the batch's copies.
        """
class PrefetchWait:
    """
    What Prefetcher.next() waited: seconds it blocked, and of those the seconds its stream sat idle (the stall a prefetcher exists to hide).
    """
    def __repr__(self) -> str:
        ...
    @property
    def blocked_seconds(self) -> float:
        """
        next() blocked for a batch (0: one was ready)
        """
    @property
    def stream_idle_seconds(self) -> float:
        """
        of those, the stream had no work left
        """
class Prefetcher:
    """
    Keeps the next `depth` batches of a source on the device, copied on its own stream.
    """
    def __init__(self, source: typing.Any, device: Device | str = ..., *, depth: typing.SupportsInt | typing.SupportsIndex = 2, kind: MemoryKind | str = ...) -> None:
        """
        `source` is an iterable of host arrays or of tuples of host arrays (NumPy, torch CPU, ...).
        """
    def batches(self, stream):
        """
        Yield the prefetcher's batches, each with `stream` already waiting for its copies.
        """
    def next(self, stream: Stream) -> typing.Any:
        """
        The next Batch with `stream` already waiting for its copies, or None at the end; re-raises the source's exception.
        """
    def stop(self) -> None:
        """
        End early: drop the batches not handed out and join the producer thread.
        """
    @property
    def device(self) -> Device:
        ...
    @property
    def last_wait(self) -> PrefetchWait:
        """
        What the last next() waited (a PrefetchWait; zeros before the first).
        """
class LossScalerOptions:
    """
    The scaler's settings; defaults are PyTorch GradScaler's.
    """
    dynamic: bool
    def __init__(self) -> None:
        ...
    @property
    def backoff_factor(self) -> float:
        ...
    @backoff_factor.setter
    def backoff_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def growth_factor(self) -> float:
        ...
    @growth_factor.setter
    def growth_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def growth_interval(self) -> int:
        ...
    @growth_interval.setter
    def growth_interval(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hysteresis(self) -> int:
        ...
    @hysteresis.setter
    def hysteresis(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def init_scale(self) -> float:
        ...
    @init_scale.setter
    def init_scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def min_scale(self) -> float:
        ...
    @min_scale.setter
    def min_scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class LossScalerState:
    """
    The scaler's state as the host sees it.
    """
    found_inf: bool
    @typing.overload
    def __init__(self) -> None:
        ...
    @typing.overload
    def __init__(self, scale: typing.SupportsFloat | typing.SupportsIndex, growth_tracker: typing.SupportsInt | typing.SupportsIndex = 0, hysteresis_left: typing.SupportsInt | typing.SupportsIndex = 1, found_inf: bool = False) -> None:
        ...
    @property
    def growth_tracker(self) -> int:
        ...
    @growth_tracker.setter
    def growth_tracker(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hysteresis_left(self) -> int:
        ...
    @hysteresis_left.setter
    def hysteresis_left(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def scale(self) -> float:
        ...
    @scale.setter
    def scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class LossScaler:
    """
    Dynamic (or static) loss scaling with its state on the device.
    """
    def __init__(self, device: Device | str, stream: Stream, *, init_scale: typing.SupportsFloat | typing.SupportsIndex = 65536.0, growth_factor: typing.SupportsFloat | typing.SupportsIndex = 2.0, backoff_factor: typing.SupportsFloat | typing.SupportsIndex = 0.5, growth_interval: typing.SupportsInt | typing.SupportsIndex = 2000, hysteresis: typing.SupportsInt | typing.SupportsIndex = 1, min_scale: typing.SupportsFloat | typing.SupportsIndex = 0.0, dynamic: bool = True) -> None:
        ...
    def load_state(self, state: LossScalerState, stream: Stream) -> None:
        """
        Restore a state (a checkpoint's) in stream order.
        """
    def load_state_dict(self, state: dict[str, numpy.typing.ArrayLike], stream: Stream) -> None:
        """
        Restore {name: array} named as state_dict() (validated as load_state); synchronises the stream.
        """
    def scale(self, values: numpy.typing.ArrayLike, stream: Stream) -> None:
        """
        values *= scale in place (the loss before backward).
        """
    def state(self, stream: Stream) -> LossScalerState:
        """
        Read the state (synchronises the stream).
        """
    def state_dict(self) -> dict:
        """
        The state as {name: BufferView} of its device memory: scale, growth_tracker, hysteresis_left.
        """
    def unscale(self, grads: collections.abc.Iterable, stream: Stream) -> int:
        """
        One fused pass: g /= scale in place, found_inf set on inf/NaN. Returns the number of launches.
        """
    def update(self, stream: Stream) -> None:
        """
        Apply the update rule and clear found_inf (end of every step).
        """
    @property
    def found_inf(self) -> typing.Any:
        ...
    @property
    def options(self) -> LossScalerOptions:
        ...
    @property
    def scale_value(self) -> typing.Any:
        ...
class FusedSGD:
    """
    Fused multi-tensor SGD (torch.optim.SGD's math), fp32 masters for fp16/bf16.
    """
    def __init__(self, params: collections.abc.Iterable, stream: Stream, *, lr: typing.SupportsFloat | typing.SupportsIndex = 0.009999999776482582, momentum: typing.SupportsFloat | typing.SupportsIndex = 0.0, dampening: typing.SupportsFloat | typing.SupportsIndex = 0.0, weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0, nesterov: bool = False, master_weights: bool = True, maximize: bool = False) -> None:
        """
        maximize=True ascends (the gradient negated first, torch's maximize).
        """
    def load_state_dict(self, state: dict[str, numpy.typing.ArrayLike], stream: Stream) -> None:
        """
        Restore {name: array} named as state_dict() (its own views, filled by checkpoint.load, or any arrays); each parameter is then set from its master. Synchronises the stream (it reads the step count).
        """
    def load_step_count(self, steps: typing.SupportsInt | typing.SupportsIndex, stream: Stream) -> None:
        """
        Set the step count (restoring a checkpoint), in stream order.
        """
    def master(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        """
        fp32 master of parameter i (empty for fp32 parameters).
        """
    def momentum_buffer(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        ...
    def set_grads(self, grads: collections.abc.Iterable, stream: Stream) -> None:
        """
        Replace the gradients later steps read (one per parameter, in order, same sizes): a framework's new gradient tensors.
        """
    def set_lr(self, lr: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def set_options(self, *, lr: typing.SupportsFloat | typing.SupportsIndex | None = None, momentum: typing.SupportsFloat | typing.SupportsIndex | None = None, dampening: typing.SupportsFloat | typing.SupportsIndex | None = None, weight_decay: typing.SupportsFloat | typing.SupportsIndex | None = None, nesterov: bool | None = None, maximize: bool | None = None) -> None:
        """
        Change hyperparameters for later steps (None: unchanged); momentum cannot be switched on or off.
        """
    def state_dict(self) -> dict:
        """
        The state as {name: BufferView} of its own memory (no copies): 'step' and 'state.<i>.<buffer>'.
        """
    def step(self, stream: Stream, scaler: LossScaler = None) -> int:
        """
        One fused step in stream order; skipped on the device when the scaler found an overflow. Returns the number of launches.
        """
    def step_count(self, stream: Stream) -> int:
        """
        Completed (not skipped) steps; synchronises the stream.
        """
    @property
    def lr(self) -> float:
        ...
class FusedAdam:
    """
    Fused multi-tensor Adam / AdamW (torch.optim's math), amsgrad optional.
    """
    def __init__(self, params: collections.abc.Iterable, stream: Stream, *, lr: typing.SupportsFloat | typing.SupportsIndex = 0.0010000000474974513, betas: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = (0.8999999761581421, 0.9990000128746033), eps: typing.SupportsFloat | typing.SupportsIndex = 9.99999993922529e-09, weight_decay: typing.SupportsFloat | typing.SupportsIndex = 0.0, amsgrad: bool = False, decoupled_weight_decay: bool = False, master_weights: bool = True, maximize: bool = False) -> None:
        """
        decoupled_weight_decay=True is AdamW; maximize=True ascends (the gradient negated first).
        """
    def exp_avg(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        ...
    def exp_avg_sq(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        ...
    def load_state_dict(self, state: dict[str, numpy.typing.ArrayLike], stream: Stream) -> None:
        """
        Restore {name: array} named as state_dict() (its own views, filled by checkpoint.load, or any arrays); each parameter is then set from its master. Synchronises the stream (it reads the step count).
        """
    def load_step_count(self, steps: typing.SupportsInt | typing.SupportsIndex, stream: Stream) -> None:
        """
        Set the step count (restoring a checkpoint), in stream order.
        """
    def master(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        """
        fp32 master of parameter i (empty for fp32 parameters).
        """
    def max_exp_avg_sq(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        ...
    def set_grads(self, grads: collections.abc.Iterable, stream: Stream) -> None:
        """
        Replace the gradients later steps read (one per parameter, in order, same sizes): a framework's new gradient tensors.
        """
    def set_lr(self, lr: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    def set_options(self, *, lr: typing.SupportsFloat | typing.SupportsIndex | None = None, betas: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] | None = None, eps: typing.SupportsFloat | typing.SupportsIndex | None = None, weight_decay: typing.SupportsFloat | typing.SupportsIndex | None = None, decoupled_weight_decay: bool | None = None, maximize: bool | None = None) -> None:
        """
        Change hyperparameters for later steps (None: unchanged); amsgrad and master weights are fixed.
        """
    def state_dict(self) -> dict:
        """
        The state as {name: BufferView} of its own memory (no copies): 'step' and 'state.<i>.<buffer>'.
        """
    def step(self, stream: Stream, scaler: LossScaler = None) -> int:
        """
        One fused step in stream order; skipped on the device when the scaler found an overflow. Returns the number of launches.
        """
    def step_count(self, stream: Stream) -> int:
        """
        Completed (not skipped) steps; synchronises the stream.
        """
    @property
    def lr(self) -> float:
        ...
class Precision:
    """
    The arithmetic of a GEMM.
    
    Members:
    
      fp32
    
      tf32
    
      fp16
    
      bf16
    
      fp8
    """
    __members__: typing.ClassVar[dict[str, Precision]]
    bf16: typing.ClassVar[Precision]
    fp16: typing.ClassVar[Precision]
    fp32: typing.ClassVar[Precision]
    fp8: typing.ClassVar[Precision]
    tf32: typing.ClassVar[Precision]
    @typing.overload
    def __eq__(self, other: Precision) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: Precision) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class GpuSpec:
    """
    One row of the GPU spec table (dense rates).
    """
    def __repr__(self) -> str:
        ...
    @property
    def bf16_tflops(self) -> float:
        ...
    @property
    def fp16_tflops(self) -> float:
        ...
    @property
    def fp32_tflops(self) -> float:
        ...
    @property
    def fp8_tflops(self) -> float:
        ...
    @property
    def memory_bw_gbs(self) -> float:
        ...
    @property
    def memory_gb(self) -> float:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def needs_cuda12(self) -> bool:
        ...
    @property
    def nvlink_gbs(self) -> float:
        ...
    @property
    def pcie_gen(self) -> int:
        ...
    @property
    def sm(self) -> int:
        ...
    @property
    def tdp_watts(self) -> float:
        ...
    @property
    def tf32_tflops(self) -> float:
        ...
class ConvLayout:
    """
    Memory order of activations (and filters: KCRS or KRSC).
    
    Members:
    
      nchw
    
      nhwc
    """
    __members__: typing.ClassVar[dict[str, ConvLayout]]
    nchw: typing.ClassVar[ConvLayout]
    nhwc: typing.ClassVar[ConvLayout]
    @typing.overload
    def __eq__(self, other: ConvLayout) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: ConvLayout) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class LaunchInfo:
    """
    Where this process sits in the job, as the launcher told it.
    """
    def __repr__(self) -> str:
        ...
    @property
    def launcher(self) -> str:
        ...
    @property
    def local_rank(self) -> int:
        ...
    @property
    def local_size(self) -> int:
        ...
    @property
    def node(self) -> int:
        """
        Index of this process's node; -1 when the launcher does not say (mpirun).
        """
    @property
    def nodes(self) -> int:
        """
        Nodes in the job; 0 when the launcher does not say (mpirun).
        """
    @property
    def rank(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
class Hierarchy:
    """
    The hierarchical all-reduce's inner groups: a node, or (GPUCLOUD_HIERARCHY) a node's NVLink island, NUMA node or block of local ranks.
    """
    def __repr__(self) -> str:
        ...
    @property
    def group(self) -> int:
        """
        This rank's group, numbered by first rank.
        """
    @property
    def group_rank(self) -> int:
        """
        Rank within its group.
        """
    @property
    def group_size(self) -> int:
        """
        Ranks per group.
        """
    @property
    def groups(self) -> int:
        """
        Groups in the communicator.
        """
    @property
    def level(self) -> str:
        """
        'node', 'nvlink', 'numa' or 'blocks of K'.
        """
class LinkCost:
    """
    A link's cost per step: alpha seconds + bytes * beta.
    """
    def __init__(self, alpha: typing.SupportsFloat | typing.SupportsIndex, beta: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def alpha(self) -> float:
        ...
    @alpha.setter
    def alpha(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def beta(self) -> float:
        ...
    @beta.setter
    def beta(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class AllReduceCostModel:
    """
    Alpha-beta predictions of flat and hierarchical all-reduce.
    """
    flat_halving: bool
    inter: LinkCost
    intra: LinkCost
    @staticmethod
    def from_json(json: str) -> AllReduceCostModel:
        ...
    def __init__(self, intra: LinkCost, inter: LinkCost, local_size: typing.SupportsInt | typing.SupportsIndex, nodes: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def flat_seconds(self, bytes: typing.SupportsInt | typing.SupportsIndex) -> float:
        ...
    def hierarchical_seconds(self, bytes: typing.SupportsInt | typing.SupportsIndex) -> float:
        ...
    def prefer_hierarchical(self, bytes: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def ties(self, bytes: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Whether the predictions are within 10 % of each other (all_reduce_auto then times both).
        """
    def to_json(self) -> str:
        ...
    @property
    def local_size(self) -> int:
        ...
    @local_size.setter
    def local_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def nodes(self) -> int:
        ...
    @nodes.setter
    def nodes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class AllReduceForm:
    """
    Which form all_reduce_auto takes for a size.
    
    Members:
    
      flat
    
      hierarchical
    
      measuring
    """
    __members__: typing.ClassVar[dict[str, AllReduceForm]]
    flat: typing.ClassVar[AllReduceForm]
    hierarchical: typing.ClassVar[AllReduceForm]
    measuring: typing.ClassVar[AllReduceForm]
    @typing.overload
    def __eq__(self, other: AllReduceForm) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: AllReduceForm) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class CommBackend:
    """
    Which library moves a communicator's data.
    
    Members:
    
      mpi
    
      nccl
    
      transport
    """
    __members__: typing.ClassVar[dict[str, CommBackend]]
    mpi: typing.ClassVar[CommBackend]
    nccl: typing.ClassVar[CommBackend]
    transport: typing.ClassVar[CommBackend]
    @typing.overload
    def __eq__(self, other: CommBackend) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: CommBackend) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class Communicator:
    """
    A group of processes and stream-ordered collectives between them.
    """
    @staticmethod
    def from_transport(transport: typing.Any) -> Communicator:
        """
        The ranks of a transport's blocking host collectives: an object with rank(), size(), all_reduce(data, dtype, op), all_gather(send, recv, dtype), broadcast(data, dtype, root) and split(color, key), where data/send/recv are writable memoryviews of the bytes, dtype and op names (gloo through torch.distributed: gpucloud.torch.process_group_communicator). A collective: all ranks call.
        """
    @staticmethod
    def mpi(comm: typing.Any) -> Communicator:
        """
        The processes of an existing MPI communicator (mpi4py's, or a Fortran handle), duplicated.
        """
    @staticmethod
    def mpi_world() -> Communicator:
        """
        All processes of the MPI job (mpirun); nodes from shared memory or GPUCLOUD_LOCAL_SIZE.
        """
    @staticmethod
    def nccl(id: bytes, rank: typing.SupportsInt | typing.SupportsIndex, size: typing.SupportsInt | typing.SupportsIndex, device: Device | str) -> Communicator:
        """
        Rank `rank` of `size` processes, one GPU each, joined through `id` (every rank calls it).
        """
    @staticmethod
    def nccl_from_mpi(device: Device | str | None = None) -> Communicator:
        """
        The MPI job's processes over NCCL (the id broadcast through MPI); the GPU is `device`, or the local rank's.
        """
    @staticmethod
    def nccl_single_process(devices: collections.abc.Sequence[typing.Any]) -> list[Communicator]:
        """
        One process driving several GPUs: a communicator per device (use comm_group).
        """
    @staticmethod
    def nccl_unique_id() -> bytes:
        """
        A fresh NCCL unique id (128 bytes) for rank 0 to hand to the others.
        """
    def all_gather(self, send: numpy.typing.ArrayLike, recv: numpy.typing.ArrayLike, stream: Stream) -> None:
        ...
    def all_reduce(self, send: numpy.typing.ArrayLike, recv: numpy.typing.ArrayLike, stream: Stream, *, op: str = 'sum') -> None:
        """
        recv = op over ranks of send (in place when they are the same array).
        """
    def all_reduce_auto(self, send: numpy.typing.ArrayLike, recv: numpy.typing.ArrayLike, stream: Stream, *, op: str = 'sum') -> None:
        """
        All-reduce, flat or hierarchical as the cost model predicts faster (where its predictions tie, the first calls of a size time both forms).
        """
    def all_reduce_auto_form(self, nbytes: typing.SupportsInt | typing.SupportsIndex) -> AllReduceForm:
        """
        The form all_reduce_auto takes for nbytes now: flat, hierarchical or measuring.
        """
    def barrier(self, stream: Stream) -> None:
        ...
    def broadcast(self, buffer: numpy.typing.ArrayLike, root: typing.SupportsInt | typing.SupportsIndex, stream: Stream) -> None:
        ...
    def hierarchical_all_reduce(self, send: numpy.typing.ArrayLike, recv: numpy.typing.ArrayLike, stream: Stream, *, op: str = 'sum') -> None:
        """
        The same result through the node hierarchy (Horovod): reduce-scatter inside each node, all-reduce across nodes, all-gather inside each node.
        """
    def measure_cost_model(self, stream: Stream) -> AllReduceCostModel:
        """
        Fit the cost model's alpha and beta on this job (every rank calls it).
        """
    def reduce_scatter(self, send: numpy.typing.ArrayLike, recv: numpy.typing.ArrayLike, stream: Stream, *, op: str = 'sum') -> None:
        ...
    def set_cost_model(self, model: AllReduceCostModel) -> None:
        ...
    @property
    def backend(self) -> CommBackend:
        ...
    @property
    def broken(self) -> bool:
        ...
    @property
    def busy_seconds(self) -> float:
        """
        Seconds the completed collectives took, measured by the backend (deltas: a step's comm time).
        """
    @property
    def device(self) -> Device:
        ...
    @property
    def hierarchy(self) -> Hierarchy:
        """
        The hierarchical all-reduce's groups (GPUCLOUD_HIERARCHY; the nodes by default).
        """
    @property
    def local_rank(self) -> int:
        ...
    @property
    def local_size(self) -> int:
        ...
    @property
    def node(self) -> int:
        ...
    @property
    def nodes(self) -> int:
        ...
    @property
    def rank(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
    @property
    def timeout(self) -> datetime.timedelta:
        """
        How long a collective may take.
        """
    @timeout.setter
    def timeout(self, arg1: datetime.timedelta) -> None:
        ...
class GradBucketer:
    """
    DDP-style gradient buckets all-reduced (averaged) as they become ready.
    """
    def __init__(self, comm: Communicator, grads: collections.abc.Iterable, *, bucket_bytes: typing.SupportsInt | typing.SupportsIndex = 26214400, first_bucket_bytes: typing.SupportsInt | typing.SupportsIndex = 1048576, hierarchical: bool = False, wire_dtype: DType | str | None = None) -> None:
        ...
    def bucket_of(self, index: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def mark_ready(self, index: typing.SupportsInt | typing.SupportsIndex, stream: Stream) -> None:
        ...
    def wait(self, stream: Stream) -> None:
        ...
    @property
    def bucket_count(self) -> int:
        ...
class NumaNode:
    """
    A NUMA node: its CPUs and its memory.
    """
    def __repr__(self) -> str:
        ...
    @property
    def cpus(self) -> list[int]:
        """
        Its logical CPUs.
        """
    @property
    def index(self) -> int:
        """
        The OS's node number.
        """
    @property
    def memory_bytes(self) -> int:
        """
        Its local memory.
        """
class GpuPlacement:
    """
    Where a GPU sits: its PCI address, nearest NUMA node and CPUs.
    """
    @property
    def cpus(self) -> list[int]:
        """
        The CPUs local to it.
        """
    @property
    def index(self) -> int:
        """
        The CUDA device index.
        """
    @property
    def numa_node(self) -> int:
        """
        The nearest NUMA node; -1 when the platform does not say.
        """
    @property
    def pci_bus_id(self) -> str:
        """
        Its PCI address, e.g. '0000:17:00.0'.
        """
class Topology:
    """
    How the machine's CPUs, memory and GPUs are connected.
    """
    @property
    def allowed_cpus(self) -> list[int]:
        """
        The logical CPUs this process may run on.
        """
    @property
    def cores(self) -> int:
        """
        Physical cores.
        """
    @property
    def gpu_links(self) -> list[list[str]]:
        """
        GPUs x GPUs as nvidia-smi topo -m ('X', 'NV<n>', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS'); empty without NVML.
        """
    @property
    def gpus(self) -> list[GpuPlacement]:
        """
        Every visible CUDA device's placement.
        """
    @property
    def hardware_threads(self) -> int:
        """
        Logical CPUs.
        """
    @property
    def numa_nodes(self) -> list[NumaNode]:
        """
        Every NUMA node.
        """
    @property
    def packages(self) -> int:
        """
        CPU sockets.
        """
    @property
    def source(self) -> str:
        """
        'hwloc <version>' or 'sysfs'.
        """
class MigInstance:
    """
    A MIG instance of a GPU in MIG mode, as nvidia-smi -L lists it.
    """
    def __repr__(self) -> str:
        ...
    @property
    def compute_instance_id(self) -> int:
        """
        Its compute instance id.
        """
    @property
    def gpu(self) -> int:
        """
        The parent GPU's NVML index.
        """
    @property
    def gpu_instance_id(self) -> int:
        """
        Its GPU instance id.
        """
    @property
    def gpu_uuid(self) -> str:
        """
        The parent GPU's UUID.
        """
    @property
    def memory_bytes(self) -> int:
        """
        Its memory.
        """
    @property
    def multiprocessors(self) -> int:
        """
        Its SMs.
        """
    @property
    def uuid(self) -> str:
        """
        The instance's UUID: Device(uuid) and CUDA_VISIBLE_DEVICES take it.
        """
class BindingAdvice:
    """
    Where a rank's host threads belong.
    """
    def __repr__(self) -> str:
        ...
    @property
    def cpus(self) -> list[int]:
        """
        The logical CPUs for the rank.
        """
    @property
    def numa_node(self) -> int:
        """
        Their NUMA node (-1: several).
        """
    @property
    def reason(self) -> str:
        """
        Why.
        """
class DeviceHealth:
    """
    A GPU's health counters (NVML); a figure the GPU does not report is None.
    """
    @property
    def ecc_dbe_aggregate(self) -> float | None:
        """
        Uncorrected ECC errors over the GPU's life.
        """
    @property
    def ecc_dbe_volatile(self) -> float | None:
        """
        Uncorrected (double-bit) ECC errors since the driver loaded.
        """
    @property
    def ecc_sbe_aggregate(self) -> float | None:
        """
        Corrected ECC errors over the GPU's life.
        """
    @property
    def ecc_sbe_volatile(self) -> float | None:
        """
        Corrected ECC errors since the driver loaded.
        """
    @property
    def pcie_replay_counter(self) -> float | None:
        """
        PCIe replays.
        """
    @property
    def remapped_rows_correctable(self) -> float | None:
        """
        Rows remapped for corrected errors.
        """
    @property
    def remapped_rows_uncorrectable(self) -> float | None:
        """
        Rows remapped for uncorrected errors.
        """
    @property
    def retired_pages_dbe(self) -> float | None:
        """
        Pages retired for uncorrected errors.
        """
    @property
    def retired_pages_sbe(self) -> float | None:
        """
        Pages retired for corrected errors.
        """
    @property
    def row_remap_failure(self) -> float | None:
        """
        1 when a row remapping failed.
        """
    @property
    def throttle_reasons(self) -> float | None:
        """
        NVML's clock throttle reason bits (0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake).
        """
    @property
    def xid(self) -> float | None:
        """
        The last XID error seen since monitoring began (0: none).
        """
class DeviceMetrics:
    """
    One reading of a device's load and health; a figure the platform cannot report is None.
    """
    def __repr__(self) -> str:
        ...
    def as_dict(self) -> dict:
        """
        The figures as a dict, for logging.
        """
    @property
    def clock_mhz(self) -> float | None:
        """
        SM clock (host: mean CPU core clock), MHz.
        """
    @property
    def device(self) -> Device:
        """
        The device read.
        """
    @property
    def energy_j(self) -> float | None:
        """
        GPU: joules used since the driver loaded (NVML's counter), or None.
        """
    @property
    def health(self) -> DeviceHealth:
        """
        The GPU's health counters (all None on the host).
        """
    @property
    def memory_total(self) -> int:
        """
        Bytes in all.
        """
    @property
    def memory_used(self) -> int:
        """
        Bytes in use on the device.
        """
    @property
    def memory_utilization(self) -> float | None:
        """
        GPU: % of the last sample period device memory was read or written.
        """
    @property
    def power_limit_w(self) -> float | None:
        """
        The enforced power limit, watts.
        """
    @property
    def power_w(self) -> float | None:
        """
        Watts drawn.
        """
    @property
    def source(self) -> str:
        """
        Where the figures came from: 'nvml', 'cuda' or 'procfs'.
        """
    @property
    def temperature_c(self) -> float | None:
        """
        Degrees Celsius.
        """
    @property
    def utilization(self) -> float | None:
        """
        % of the last sample period the device was busy.
        """
class MetricStats:
    """
    Minimum, mean and maximum of one figure over a monitored run.
    """
    @property
    def count(self) -> int:
        """
        Readings that reported the figure (0: never reported).
        """
    @property
    def max(self) -> float:
        """
        Largest reading.
        """
    @property
    def mean(self) -> float:
        """
        Mean of the readings.
        """
    @property
    def min(self) -> float:
        """
        Smallest reading.
        """
class MetricsSummary:
    """
    What a MetricsMonitor saw since it started or was reset.
    """
    def as_dict(self) -> dict:
        """
        The statistics as nested dicts, for logging and JSON.
        """
    @property
    def device(self) -> Device:
        """
        The device monitored.
        """
    @property
    def energy_j(self) -> float | None:
        """
        Joules: the device's energy counter's increase, or power integrated over time; or None.
        """
    @property
    def memory_used(self) -> MetricStats:
        """
        Bytes in use.
        """
    @property
    def memory_utilization(self) -> MetricStats:
        """
        GPU memory traffic, %.
        """
    @property
    def power_w(self) -> MetricStats:
        """
        Watts.
        """
    @property
    def samples(self) -> int:
        """
        Readings taken.
        """
    @property
    def seconds(self) -> float:
        """
        From the first reading to the last.
        """
    @property
    def temperature_c(self) -> MetricStats:
        """
        Degrees Celsius.
        """
    @property
    def utilization(self) -> MetricStats:
        """
        % busy.
        """
class MetricsMonitor:
    """
    Samples a device every `interval` seconds on a background thread; a context manager that stops on exit.
    """
    def __enter__(self) -> MetricsMonitor:
        ...
    def __exit__(self, *args) -> None:
        ...
    def __init__(self, device: Device | str, interval: typing.SupportsFloat | typing.SupportsIndex = 0.5) -> None:
        ...
    def latest(self) -> DeviceMetrics:
        """
        The most recent reading.
        """
    def reset(self) -> None:
        """
        Forgets the statistics and starts a new period.
        """
    def stop(self) -> None:
        """
        Stops sampling; the statistics stay readable.
        """
    def summary(self) -> MetricsSummary:
        """
        The statistics since the start or the last reset(), including a reading taken now.
        """
class CheckpointTensorInfo:
    """
    Where one tensor lives in a checkpoint.
    """
    def __repr__(self) -> str:
        ...
    @property
    def begin(self) -> int:
        """
        First byte in the file.
        """
    @property
    def dtype(self) -> DType:
        ...
    @property
    def end(self) -> int:
        """
        One past the last byte.
        """
    @property
    def file(self) -> str:
        ...
    @property
    def shape(self) -> list[int]:
        ...
    @property
    def xxh3(self) -> int:
        """
        XXH3-64 of the bytes.
        """
class CheckpointManifest:
    """
    A checkpoint's manifest, verified against its checksum.
    """
    def __repr__(self) -> str:
        ...
    @property
    def directory(self) -> str:
        ...
    @property
    def files(self) -> list[str]:
        ...
    @property
    def format_version(self) -> int:
        ...
    @property
    def metadata(self) -> dict[str, str]:
        ...
    @property
    def step(self) -> int:
        ...
    @property
    def tensors(self) -> dict[str, CheckpointTensorInfo]:
        ...
    @property
    def world_size(self) -> int:
        """
        Ranks that wrote it.
        """
class CheckpointProgress:
    """
    How far a Checkpointer's background writer is behind.
    """
    def __repr__(self) -> str:
        ...
    @property
    def committed_step(self) -> int | None:
        """
        The newest step this Checkpointer committed, or None.
        """
    @property
    def committed_unix_time(self) -> float:
        """
        When it committed, seconds since the epoch (0: none).
        """
    @property
    def last_save_seconds(self) -> float:
        """
        save_async to commit of the last committed save.
        """
    @property
    def saves_committed(self) -> int:
        ...
    @property
    def saves_failed(self) -> int:
        ...
    @property
    def seconds_since_commit(self) -> float:
        """
        Age of that commit (0 before one).
        """
    @property
    def waited_seconds(self) -> float:
        """
        Total time save_async blocked for the previous save (the writer lagging).
        """
    @property
    def writing_step(self) -> int | None:
        """
        The step of the save in flight, or None.
        """
class PendingSave:
    """
    A save in flight: wait() for its commit.
    """
    def done(self) -> bool:
        """
        True once committed or failed; never blocks.
        """
    def wait(self) -> None:
        """
        Block until committed (on every rank); raise CheckpointError with the I/O error, once.
        """
    @property
    def directory(self) -> str:
        ...
    @property
    def seconds(self) -> float:
        """
        Seconds from save_async to the commit (or the failure); 0 while in flight.
        """
    @property
    def step(self) -> int:
        ...
class Checkpointer:
    """
    Writes the checkpoints of one training run under a root directory (root/step-N).
    """
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, arg0: typing.Any, arg1: typing.Any, arg2: typing.Any) -> None:
        """
        Waits for the save in flight (raising its error unless another is already raised).
        """
    def __init__(self, root: str | bytes | os.PathLike[str] | os.PathLike[bytes], keep_last: int = 0, comm: Communicator | None = None, staging: MemoryResource | None = None, commit_timeout: typing.SupportsFloat | typing.SupportsIndex = 600.0) -> None:
        """
        keep_last: committed checkpoints kept (0: all). comm: the ranks that write together (every rank calls every save). staging: a pinned (or host) MemoryResource for the snapshots. commit_timeout: seconds.
        """
    def save(self, step: int, tensors: dict[str, numpy.typing.ArrayLike], stream: Stream, metadata: dict[str, str] | None = None) -> None:
        """
        save_async(...).wait(): returns once committed.
        """
    def save_async(self, step: int, tensors: dict[str, numpy.typing.ArrayLike], stream: Stream, metadata: dict[str, str] | None = None) -> PendingSave:
        """
        Snapshot {name: array} after the stream's work (the stream waits for the snapshot), write it in the background, return a PendingSave at once. Waits for the previous save first (raising its error).
        """
    def wait(self) -> None:
        """
        Wait for the save in flight, if any; raise its error.
        """
    @property
    def progress(self) -> CheckpointProgress:
        """
        The writer's lag: the save in flight, the newest commit and its age, time save_async waited.
        """
    @property
    def root(self) -> str:
        ...
class StragglerReport:
    """
    What the last exchange of step times found.
    """
    def __repr__(self) -> str:
        ...
    @property
    def compute_seconds(self) -> list[float]:
        """
        Every rank's mean own work per step (less data wait and collectives), by rank: what is compared.
        """
    @property
    def lost(self) -> list[int]:
        """
        Ranks whose channel closed (they ended or died); their last period is still compared.
        """
    @property
    def median(self) -> float:
        """
        The median own work per step.
        """
    @property
    def slowest(self) -> int:
        """
        The rank of the most own work per step, or -1.
        """
    @property
    def step_seconds(self) -> list[float]:
        """
        Every rank's mean step time, by rank.
        """
    @property
    def steps(self) -> list[int]:
        """
        The steps each rank had recorded at its last period's end, by rank.
        """
    @property
    def straggler(self) -> bool:
        """
        The slowest is beyond the threshold.
        """
class StepMetrics:
    """
    A process's training metrics (one record per step).
    """
    def record(self, seconds: float, samples: int = 0, data_wait_seconds: float = 0.0, comm_seconds: float = 0.0, loss_scale: float = 0.0, skipped: int = 0) -> None:
        """
        Record one step: its wall time, samples, time waiting for data and in collectives, the loss scale, the steps skipped since the last record (True/1 for this one).
        """
    def record_checkpoint(self, seconds: float) -> None:
        """
        Record one checkpoint save's duration.
        """
    def record_checkpoint_progress(self, progress: CheckpointProgress) -> None:
        """
        Set the checkpoint writer's metrics from a Checkpointer's progress (pending saves, the last commit's step and time, time waited for the writer, failures).
        """
    def record_memory(self, statistics: MemoryStatistics) -> None:
        """
        Set the memory-pool gauges from a StatisticsAdaptor's statistics().
        """
    @property
    def steps(self) -> int:
        """
        Steps recorded so far.
        """
class TelemetryExporter:
    """
    A Prometheus /metrics endpoint of this process (prometheus-cpp), its device and training metrics.
    """
    def __init__(self, port: int = 0, address: str = '0.0.0.0', labels: dict[str, str] | None = None, textfile: str | None = None, *, threads: int = 8, request_timeout: float = 5.0, tls_cert_file: str | None = None, tls_key_file: str | None = None, basic_auth_users: dict[str, str] | None = None, allow: typing.Any = None) -> None:
        """
        port: 0 picks a free one, -1 serves none. address: an IPv4 or IPv6 address to bind. labels: put on every series (job_labels() gives rank, local_rank, node, job). textfile: where write_textfile() writes (node_exporter's textfile collector). threads: serving threads; request_timeout: seconds a client may take to send its request. tls_cert_file, tls_key_file: serve HTTPS. basic_auth_users: {user: bcrypt hash}. allow: the IPv4 CIDR blocks allowed to connect (Prometheus web-config's semantics).
        """
    def detect_stragglers(self, comm: Communicator, stream: Stream, every: int = 50, threshold: typing.SupportsFloat | typing.SupportsIndex = 0.2, min_excess_seconds: typing.SupportsFloat | typing.SupportsIndex = 0.005) -> None:
        """
        Compare the ranks' own work per step: every `every` recorded steps each rank sends rank 0 its means over a TCP channel of its own (set up now by a broadcast and an all-reduce over comm on stream: every rank calls it); exports gpucloud_rank_step_seconds, gpucloud_rank_compute_seconds and gpucloud_straggler. Ranks may record different numbers of steps, stop or die.
        """
    def exposition(self) -> str:
        """
        The text a scrape of /metrics returns now.
        """
    def step(self, samples = 0, comm = None):
        """
        A context manager timing one step: `with exporter.step(samples=n, comm=comm) as st: ...`
            (``comm``: the communicator of the step's collectives, e.g. the DDP hooks' one: their time is
            then not the rank's own work, which straggler detection compares).
        """
    def straggler_report(self) -> StragglerReport:
        ...
    def unwatch(self, monitor: MetricsMonitor) -> None:
        ...
    def watch(self, monitor: MetricsMonitor) -> None:
        """
        Export the monitor's latest reading at each scrape (DCGM_FI_DEV_* names on GPUs).
        """
    def write_textfile(self) -> None:
        """
        Write the exposition to the textfile, atomically.
        """
    @property
    def port(self) -> int:
        ...
    @property
    def steps(self) -> typing.Any:
        """
        The training metrics (StepMetrics).
        """
class RestartInfo:
    """
    Which restart of the job this process belongs to.
    """
    def __repr__(self) -> str:
        ...
    @property
    def count(self) -> int:
        """
        0 for the first launch; the restarts before this one.
        """
    @property
    def reason(self) -> str:
        """
        Why the previous launch ended ('' for the first).
        """
class JobControl:
    """
    A job's stop decision (SIGTERM/SIGUSR1 agreed by every rank at one step), its restart facts and the heartbeat gpucloud-run watches. One may live per process at a time.
    """
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, arg0: typing.Any, arg1: typing.Any, arg2: typing.Any) -> None:
        ...
    def __init__(self, signals: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = [15, 10]) -> None:
        """
        Installs handlers for `signals` (the previous ones return at close()).
        """
    def close(self) -> None:
        """
        Restores the previous signal handlers (also at garbage collection).
        """
    def mark_failed(self) -> None:
        """
        Marks this process as failing: its closed heartbeat says so (what __exit__ does for an exception).
        """
    def request_stop(self) -> None:
        """
        Asks for a stop, as a signal would (a preemption notice polled by the trainer).
        """
    def should_stop(self, step: typing.SupportsInt | typing.SupportsIndex, comm: Communicator = None, stream: Stream = None) -> bool:
        """
        Once per step, after the step's work: True when the job must stop now with the state of `step` saved. With comm a collective: every rank calls it each step and all answer True at the same call.
        """
    @property
    def first_step(self) -> int:
        """
        The step of the first should_stop() call (one past where this launch resumed), -1 before.
        """
    @property
    def restart(self) -> RestartInfo:
        """
        Which restart this process belongs to (RestartInfo).
        """
    @property
    def stop_requested(self) -> bool:
        """
        True once this process got one of the signals (or request_stop()).
        """
    @property
    def stop_signal(self) -> int:
        """
        The signal that asked for the stop (0: none, or request_stop()).
        """
def _noop() -> None:
    """
    A bare pybind11 call: the baseline of bench/bench_python_overhead.py.
    """
def add_callback(stream: Stream, fn: collections.abc.Callable) -> None:
    """
    Run `fn(error)` on the stream once earlier work finished, also after a failure: `error` is the exception that work raised (taken over: synchronize() will not raise it again), or None. For completing futures from a stream; an exception from `fn` is reported as unraisable.
    """
def advise(buffer: numpy.typing.ArrayLike, advice: MemoryAdvice, target: numpy.typing.ArrayLike) -> None:
    """
    Apply a cudaMemAdvise hint to managed memory.
    """
def available_devices() -> list[Device]:
    """
    The host, then every visible CUDA device.
    """
def bias_grad(grad: numpy.typing.ArrayLike, bias_grad: numpy.typing.ArrayLike, stream: Stream) -> None:
    """
    bias_grad[j] = sum over rows of grad[:, j] (grad is rows x len(bias_grad)).
    """
def binding_advice(topology: Topology, local_rank: typing.SupportsInt | typing.SupportsIndex, local_size: typing.SupportsInt | typing.SupportsIndex, gpu: typing.SupportsInt | typing.SupportsIndex = -1) -> BindingAdvice:
    """
    The CPUs for a local rank: near its GPU (gpu >= 0), else an even share within NUMA nodes (os.sched_setaffinity(0, advice.cpus) applies it).
    """
def build_info() -> BuildInfo:
    """
    The configuration this library was built with.
    """
def cast(dst: numpy.typing.ArrayLike, src: numpy.typing.ArrayLike, stream: Stream) -> None:
    """
    dst = src converted to dst's dtype, in stream order.
    """
def checkpoint_directory_name(step: typing.SupportsInt | typing.SupportsIndex) -> str:
    """
    The name of a step's directory: step-000000001000.
    """
def checkpoint_find_latest(root: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> tuple[typing.Any, list]:
    """
    (directory or None, [(skipped directory, reason), ...]): the newest valid checkpoint under root and the newer ones that are not valid, newest first.
    """
def checkpoint_load(directory: str | bytes | os.PathLike[str] | os.PathLike[bytes], into: dict[str, numpy.typing.ArrayLike], stream: Stream, strict: bool = True, verify: str = 'before_writing') -> CheckpointManifest:
    """
    Load into {name: array} (each found by name): everything verified (manifest, headers, dtypes, shapes, and with verify='before_writing' the checksums) before the first write; then copied in stream order, and the stream synchronised. verify='while_copying' checks each host tensor's checksum as it is copied (one pass over the data: faster from the page cache, but a damaged tensor then leaves the others written). A non-contiguous tensor or array (channels_last, a transposed view) is filled through a contiguous copy. Returns the Manifest.
    """
def checkpoint_read_manifest(directory: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> CheckpointManifest:
    """
    Read and verify a checkpoint's manifest.
    """
def clear_memory_quota(device: Device | str) -> None:
    """
    Remove the device's quota (GPUCLOUD_MEMORY_QUOTA's included).
    """
def clip_grad_norm(grads: collections.abc.Iterable, max_norm: typing.SupportsFloat | typing.SupportsIndex, stream: Stream) -> Buffer:
    """
    Scale grads so their global L2 norm is at most max_norm; returns the norm before clipping (a 1-element Buffer on the device, in stream order).
    """
def comm_group(issue: collections.abc.Callable) -> None:
    """
    Calls issue() and sends the collectives it enqueues on several communicators as one NCCL group.
    """
def conv2d_backward_data(dx: numpy.typing.ArrayLike, dy: numpy.typing.ArrayLike, filter: numpy.typing.ArrayLike, stream: Stream, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: typing.SupportsInt | typing.SupportsIndex = 1, layout: str = 'nchw', alpha: typing.SupportsFloat | typing.SupportsIndex = 1.0, beta: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> None:
    """
    dx = alpha * (gradient of the convolution with respect to x, given dy) + beta dx.
    """
def conv2d_backward_filter(dfilter: numpy.typing.ArrayLike, x: numpy.typing.ArrayLike, dy: numpy.typing.ArrayLike, stream: Stream, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: typing.SupportsInt | typing.SupportsIndex = 1, layout: str = 'nchw', alpha: typing.SupportsFloat | typing.SupportsIndex = 1.0, beta: typing.SupportsFloat | typing.SupportsIndex = 0.0) -> None:
    """
    dfilter = alpha * (gradient of the convolution with respect to the filter, summed over the batch) + beta dfilter.
    """
def conv2d_forward(y: numpy.typing.ArrayLike, x: numpy.typing.ArrayLike, filter: numpy.typing.ArrayLike, stream: Stream, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: typing.SupportsInt | typing.SupportsIndex = 1, layout: str = 'nchw', alpha: typing.SupportsFloat | typing.SupportsIndex = 1.0, beta: typing.SupportsFloat | typing.SupportsIndex = 0.0, epilogue: str = 'none', bias: numpy.typing.ArrayLike | None = None) -> None:
    """
    y = epilogue(alpha conv(x, filter) + beta y [+ bias]) in stream order (cross-correlation, as torch.nn.functional.conv2d); epilogue none, bias or bias_relu.
    """
def conv2d_output_size(x_shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], filter_shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1, groups: typing.SupportsInt | typing.SupportsIndex = 1, layout: str = 'nchw') -> list[int]:
    """
    The output's shape (in the layout's order) of a convolution of these shapes.
    """
def copy(dst: numpy.typing.ArrayLike, src: numpy.typing.ArrayLike, stream: Stream) -> None:
    """
    Copy `src` into `dst` in stream order (any memory kinds; zero-copy views of NumPy/PyTorch/CuPy).
    """
def cuda_device_count() -> int:
    """
    Visible CUDA devices (0 without a usable driver).
    """
def cuda_unavailable_reason() -> str:
    """
    Why there is no CUDA device, or ''.
    """
def device_properties(device: Device) -> DeviceProperties:
    """
    Properties of a device.
    """
def dtype(spec: typing.Any) -> DType:
    """
    The DType named by a DType, a string ('float32', 'bf16'), a NumPy or a torch dtype.
    """
def elapsed_ms(start: Event, end: Event) -> float:
    """
    Milliseconds between two completed records of TimedEvents.
    """
def fill(dst: numpy.typing.ArrayLike, value: int | float, stream: Stream) -> None:
    """
    Set every element of dst to value, in stream order: an int exactly (int64 beyond 2^53 too), a float converted as cast() does.
    """
def find_gpu_spec(device_name: str) -> GpuSpec | None:
    """
    The row matching a device name, or None.
    """
def gemm(c: numpy.typing.ArrayLike, a: numpy.typing.ArrayLike, b: numpy.typing.ArrayLike, stream: Stream, *, trans_a: bool = False, trans_b: bool = False, alpha: typing.SupportsFloat | typing.SupportsIndex = 1.0, beta: typing.SupportsFloat | typing.SupportsIndex = 0.0, epilogue: str = 'none', bias: numpy.typing.ArrayLike | None = None, tf32: bool = False, scale_a: typing.SupportsFloat | typing.SupportsIndex = 1.0, scale_b: typing.SupportsFloat | typing.SupportsIndex = 1.0) -> None:
    """
    c = epilogue(alpha op(a) op(b) + beta c [+ bias]) in stream order; shapes from the arrays (2-D, or 3-D batches; a 2-D a or b serves every batch).
    """
def global_norm(tensors: collections.abc.Iterable, stream: Stream) -> Buffer:
    """
    The global L2 norm (a 1-element Buffer on the device).
    """
def gpu_specs() -> list[GpuSpec]:
    """
    The spec table: V100, T4, A100 40/80GB, A10, L4, RTX 4090, H100, H200.
    """
def host_threads() -> HostThreads:
    """
    The process's host thread budget: CPUs it may use (affinity, cgroup CPU quota), the library's pool (GPUCLOUD_HOST_THREADS overrides) and OpenBLAS's threads.
    """
def launch_host_func(stream: Stream, fn: collections.abc.Callable) -> None:
    """
    Run `fn()` on the stream once earlier work finished; its exception surfaces at synchronize().
    """
def launch_info_from_environment() -> LaunchInfo:
    """
    Rank, size and node from mpirun / srun / torchrun variables (GPUCLOUD_LOCAL_SIZE overrides the node size).
    """
def memory_info(device: Device | str) -> MemoryInfo:
    """
    Free and total memory of a device now (the host's capped by its cgroup memory limit).
    """
def memory_quota(device: Device | str) -> MemoryQuota:
    """
    The device's quota and what the process holds under it.
    """
def memory_quotas() -> list[MemoryQuota]:
    """
    Every device the process allocated on or set a quota for, host first.
    """
def mig_instances() -> list[MigInstance]:
    """
    Every MIG instance on the machine's GPUs (NVML); empty without NVML or MIG mode.
    """
def mse_loss(pred: numpy.typing.ArrayLike, target: numpy.typing.ArrayLike, loss: numpy.typing.ArrayLike, grad: numpy.typing.ArrayLike, stream: Stream, scaler: typing.Any = None) -> None:
    """
    loss = mean((pred - target)^2); grad = 2 (pred - target) / N, times the scaler's scale when given.
    """
def nvml_unavailable_reason() -> str:
    """
    Why GPU readings lack NVML's figures (no driver library, no GPU), or '' when NVML works.
    """
def parse_bytes(text: str) -> int:
    """
    Bytes of a size such as '512MiB', '2GB', '4G' (K/M/G/T, KiB..TiB: 1024s; KB..TB: 1000s).
    """
def peak_tflops(spec: GpuSpec, precision: Precision) -> float:
    """
    Dense peak TFLOP/s in a precision.
    """
def prefetch(buffer: numpy.typing.ArrayLike, target: numpy.typing.ArrayLike, stream: Stream) -> None:
    """
    Migrate managed memory to `target` in stream order.
    """
def read_metrics(device: Device | str) -> DeviceMetrics:
    """
    Reads a device's utilisation, memory, temperature, power and clock now.
    """
def relu_backward(grad: numpy.typing.ArrayLike, activation: numpy.typing.ArrayLike, stream: Stream) -> None:
    """
    grad *= (activation > 0), in place.
    """
def restart_info_from_environment() -> RestartInfo:
    """
    GPUCLOUD_RESTART_COUNT / _REASON (gpucloud-run), else TORCHELASTIC_RESTART_COUNT, else SLURM_RESTART_COUNT.
    """
def set_default_resource(kind: MemoryKind | str, device: Device | str, mr: MemoryResource | None) -> None:
    """
    Make `mr` the resource buffers of `kind` on `device` use by default (None restores the built-in one).
    """
def set_memory_fraction(device: Device | str, fraction: typing.SupportsFloat | typing.SupportsIndex) -> None:
    """
    The quota as a share of the device's memory (the host's: its cgroup limit when set), as torch.cuda.set_per_process_memory_fraction.
    """
def set_memory_quota(device: Device | str, limit: typing.SupportsInt | typing.SupportsIndex | str) -> None:
    """
    Cap what the library holds from `device` (pools' caches included) at `limit`: bytes, or a size such as '8GiB'; an allocation beyond it raises OutOfMemory naming the quota, the request and what is held.
    """
def supports(device: Device | str, precision: Precision) -> bool:
    """
    Whether the device runs GEMMs in this precision.
    """
def telemetry_job_labels() -> dict[str, str]:
    """
    rank, local_rank, node and job labels of this process, from the launcher's environment.
    """
def topology() -> Topology:
    """
    The machine's topology: CPUs, NUMA nodes, GPUs and their links (hwloc, NVML).
    """
CHECKPOINT_FORMAT_VERSION: int = 1
PREEMPTED_EXIT_CODE: int = 75
