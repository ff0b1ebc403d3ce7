import threading

import numpy as np
import pytest

import gpucloud as gc


def test_numpy_views_buffers_without_copying(host_stream):
    b = gc.Buffer((4, 3), "float32")
    gc.fill(b, 1.5, host_stream)
    host_stream.synchronize()
    via_dlpack = np.from_dlpack(b)
    via_interface = np.asarray(b)
    assert via_dlpack.ctypes.data == b.data_ptr == via_interface.ctypes.data
    assert via_dlpack.shape == (4, 3) and via_dlpack.dtype == np.float32
    via_interface[0, 0] = 7.0  # same memory (NumPy < 2 marks DLPack imports read-only)
    assert via_dlpack[0, 0] == 7.0
    assert b.__dlpack_device__() == (1, 0)  # kDLCPU


def test_operations_borrow_numpy_memory_without_copying(host_stream):
    out = np.zeros(1000, np.float64)
    src = np.arange(1000, dtype=np.float64)
    gc.copy(out, src, host_stream)  # writes straight into out's memory
    host_stream.synchronize()
    np.testing.assert_array_equal(out, src)
    halves = np.zeros(1000, np.float16)
    gc.cast(halves, src, host_stream)
    host_stream.synchronize()
    np.testing.assert_array_equal(halves, src.astype(np.float16))


def test_borrowed_arrays_stay_alive_until_the_stream_is_done(host_stream):
    gate = threading.Event()
    gc.launch_host_func(host_stream, gate.wait)
    b = gc.Buffer(1 << 16, "int32")
    gc.copy(b, np.arange(1 << 16, dtype=np.int32), host_stream)  # the only reference is the stream's
    gate.set()
    host_stream.synchronize()
    np.testing.assert_array_equal(np.asarray(b), np.arange(1 << 16, dtype=np.int32))


def test_bfloat16_rounds_to_nearest_even(host_stream):
    x = np.array([1.0, 1.00390625, 1.01171875, -3.0e38], np.float32)  # ties and overflow
    b = gc.Buffer(4, "bf16")
    back = np.empty(4, np.float32)
    gc.cast(b, x, host_stream)
    gc.cast(back, b, host_stream)
    host_stream.synchronize()
    np.testing.assert_array_equal(back[:3], np.array([1.0, 1.0, 1.015625], np.float32))
    assert np.isfinite(back[3]) and abs(back[3] / -3.0e38 - 1) < 2**-8  # finite: bf16 has fp32's range
    assert np.asarray(b).dtype == np.dtype("V2")  # NumPy has no bfloat16: raw 2-byte elements


def test_bad_inputs_raise_the_documented_exceptions(host_stream):
    b = gc.Buffer(6, "float32")
    with pytest.raises(TypeError, match="<c8.*not supported"):
        gc.copy(b, np.zeros(6, np.complex64), host_stream)
    with pytest.raises(gc.InvalidArgument, match="dtype"):
        gc.copy(b, np.zeros(6, np.float64), host_stream)
    with pytest.raises(ValueError, match="shape"):
        gc.copy(b, np.zeros((2, 3), np.float32), host_stream)
    wide = np.zeros((6, 2), np.float32)
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.copy(b, wide[:, 0], host_stream)
    frozen = np.zeros(6, np.float32)
    frozen.setflags(write=False)
    gc.copy(b, frozen, host_stream)  # reading read-only memory is fine
    host_stream.synchronize()
    with pytest.raises(gc.InvalidArgument, match="read-only"):
        gc.copy(frozen, b, host_stream)
    with pytest.raises(TypeError, match="expected a gpucloud.Buffer"):
        gc.copy(b, [1, 2, 3, 4, 5, 6], host_stream)
    assert host_stream.query()  # nothing was enqueued


class _InterfaceOnly:
    """The same memory offered through __array_interface__ alone: the general path."""

    def __init__(self, a):
        self._a = a
        self.__array_interface__ = a.__array_interface__


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("shape", [(0,), (), (3, 4), (1, 5), (4, 1)])
def test_ndarrays_borrow_as_their_array_interface_says(host_stream, dtype, shape):
    # Exact ndarrays take the buffer protocol (no dict per call); the result must be the same
    # memory, dtype and size as the __array_interface__ path gives.
    a = np.zeros(shape, dtype)
    gc.fill(a, 3, host_stream)
    b = np.zeros(shape, dtype)
    gc.fill(_InterfaceOnly(b), 3, host_stream)
    host_stream.synchronize()
    np.testing.assert_array_equal(a, np.full(shape, 3, dtype))
    np.testing.assert_array_equal(b, a)
    src = np.arange(a.size, dtype=dtype).reshape(shape)
    gc.copy(a, src, host_stream)  # straight into a's memory
    host_stream.synchronize()
    np.testing.assert_array_equal(a, src)


def test_ndarrays_the_fast_path_leaves_get_the_general_messages(host_stream):
    b = gc.Buffer(6, "float32")
    with pytest.raises(TypeError, match="unsupported typestr '>f4'"):
        gc.copy(b, np.zeros(6, ">f4"), host_stream)  # big-endian
    with pytest.raises(TypeError, match="not supported"):
        gc.copy(gc.Buffer(6, "uint8"), np.zeros(6, np.bool_), host_stream)
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.copy(b, np.zeros((6, 2), np.float32).T[0], host_stream)
    frozen = np.zeros(6, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(gc.InvalidArgument, match="read-only"):
        gc.fill(frozen, 1.0, host_stream)
    with pytest.raises(gc.InvalidArgument, match="NumPy scalar"):
        gc.fill(np.float32(1), 1.0, host_stream)
    sub = np.zeros(6, np.float32).view(np.recarray)  # a subclass: the general path
    gc.fill(sub, 2.0, host_stream)
    host_stream.synchronize()
    assert np.all(sub == 2.0)
    assert host_stream.query()


class _DLPackOnly:
    """The same memory offered through __dlpack__ alone (as a DLPack producer that is neither NumPy
    nor torch offers it): the general DLPack path."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_producers_are_read_and_their_unsupported_dtypes_named(host_stream):
    b = gc.Buffer(6, "float32")
    gc.copy(b, _DLPackOnly(np.arange(6, dtype=np.float32)), host_stream)
    host_stream.synchronize()
    np.testing.assert_array_equal(np.asarray(b), np.arange(6, dtype=np.float32))
    with pytest.raises(TypeError, match=r"src: DLPack dtype \(code 0, 16 bits\) is not supported"):
        gc.copy(gc.Buffer(6, "int32"), _DLPackOnly(np.zeros(6, np.int16)), host_stream)
    with pytest.raises(TypeError, match=r"DLPack dtype \(code 5, 64 bits\) is not supported"):
        gc.copy(b, _DLPackOnly(np.zeros(6, np.complex64)), host_stream)
    assert host_stream.query()  # nothing was enqueued


def test_gpu_memory_on_a_host_stream_is_rejected():
    if gc.cuda_device_count() == 0:
        pytest.skip(f"needs a CUDA device: {gc.cuda_unavailable_reason()}")
    b = gc.Buffer(4, "float32", gc.Device.cuda(0))
    with pytest.raises(gc.InvalidArgument, match="cuda:0"):
        gc.copy(b, np.zeros(4, np.float32), gc.Stream())
    assert b.__cuda_array_interface__["data"][0] == b.data_ptr
