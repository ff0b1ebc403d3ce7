import numpy as np
import pytest

import gpucloud as gc


def kinds(device):
    return ["host", "pinned", "device", "managed"] if device.is_host else ["device", "managed"]


def home(kind, device):
    return gc.Device.host() if kind in ("host", "pinned") else device


def test_buffers_of_every_kind_round_trip(device, stream):
    data = np.random.default_rng(0).standard_normal((17, 5)).astype(np.float32)
    for kind in kinds(device):
        b = gc.Buffer((17, 5), "float32", home(kind, device), kind)
        assert b.shape == (17, 5) and b.size == 85 and b.nbytes == 340
        assert b.dtype == gc.DType.float32 and str(b.kind) == kind and b.device == home(kind, device)
        assert b.data_ptr % 256 == 0
        out = np.empty_like(data)
        gc.copy(b, data, stream)
        gc.copy(out, b, stream)
        stream.synchronize()
        np.testing.assert_array_equal(out, data)


def test_zero_size_buffers(device, stream):
    b = gc.Buffer(0, "int64", device)
    assert b.size == 0 and b.data_ptr == 0
    gc.copy(b, np.empty(0, np.int64), stream)


def test_bad_sizes_are_typed_errors(device):
    with pytest.raises(gc.InvalidArgument, match="shape"):
        gc.Buffer(-1, "float32", device)
    with pytest.raises(ValueError, match="overflows"):
        gc.Buffer((2**40, 2**40), "float32", device)
    with pytest.raises(gc.OutOfMemory) as info:
        gc.Buffer(2**52, "uint8", device)
    assert isinstance(info.value, MemoryError)
    assert str(2**52) in str(info.value)
    assert gc.Buffer(1024, "uint8", device).nbytes == 1024  # still usable
    with pytest.raises(TypeError, match="dtype"):
        gc.Buffer(4, "complex64", device)
    with pytest.raises(TypeError, match="kind"):
        gc.Buffer(4, "float32", device, "video")


def test_resources_pool_statistics_and_limits(device):
    plain = gc.PlainResource("device", device)
    stats = gc.StatisticsAdaptor(plain)
    pool = gc.PoolResource(stats, max_block_bytes=1 << 20)
    a = gc.Buffer(1000, "uint8", device, "device", mr=pool)
    first = a.data_ptr
    del a
    assert pool.cached_bytes == 1024
    b = gc.Buffer(900, "uint8", device, "device", mr=pool)
    assert b.data_ptr == first
    assert stats.statistics().total_allocations == 1
    limited = gc.LimitingAdaptor(plain, 4096)
    keep = gc.Buffer(3000, "uint8", device, "device", mr=limited)
    with pytest.raises(gc.OutOfMemory, match="limit"):
        gc.Buffer(3000, "uint8", device, "device", mr=limited)
    assert limited.allocated_bytes == 3000
    del keep
    assert gc.Buffer(4000, "uint8", device, "device", mr=limited).nbytes == 4000


def test_default_resource_can_be_replaced(device):
    stats = gc.StatisticsAdaptor(gc.PlainResource("device", device))
    gc.set_default_resource("device", device, stats)
    try:
        gc.Buffer(64, "float32", device)
        assert stats.statistics().total_bytes == 256
    finally:
        gc.set_default_resource("device", device, None)
    gc.Buffer(64, "float32", device)
    assert stats.statistics().total_bytes == 256


def test_stream_ordered_buffer_and_managed_hints(device, stream):
    b = gc.Buffer(4096, "float32", device, "managed", stream=stream)
    gc.prefetch(b, device, stream)
    gc.advise(b, gc.MemoryAdvice.read_mostly, device)
    gc.fill(b, 2.5, stream)
    stream.synchronize()
    assert (np.asarray(b) == 2.5).all()
    with pytest.raises(gc.InvalidArgument, match="not managed"):
        gc.prefetch(gc.Buffer(4, "float32", device), device, stream)


def test_borrowed_arrays_are_released_once_their_work_is_done(device):
    import weakref

    s = gc.Stream(device)
    buf = gc.Buffer(4096, "float32", device)
    a = np.arange(4096, dtype=np.float32)
    alive = weakref.ref(a)
    gc.copy(buf, a, s)  # the stream borrows a until the copy has run
    del a
    s.synchronize()  # ...after which nothing holds it
    assert alive() is None
    out = np.empty(4096, np.float32)
    gc.copy(out, buf, s)
    s.synchronize()
    assert out[4095] == 4095.0
