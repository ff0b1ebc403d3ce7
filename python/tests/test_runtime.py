import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gpucloud as gc


def test_host_comes_first_and_cuda_absence_is_a_clear_error():
    devices = gc.available_devices()
    assert devices[0] == gc.Device.host()
    assert len(devices) == 1 + gc.cuda_device_count()
    assert gc.Device("cpu") == gc.Device.host()
    if gc.cuda_device_count() == 0:
        reason = gc.cuda_unavailable_reason()
        assert reason
        with pytest.raises((gc.DeviceError, gc.Unsupported)) as info:
            gc.Device.cuda(0)
        assert isinstance(info.value, gc.Error) and isinstance(info.value, RuntimeError)
        assert reason in str(info.value) or "without CUDA" in str(info.value)
    with pytest.raises(gc.InvalidArgument):
        gc.Device("gpu:0")


def test_properties(device):
    p = gc.device_properties(device)
    assert p.name and p.total_memory > 0 and p.multiprocessor_count > 0
    m = gc.memory_info(device)
    assert 0 <= m.free <= m.total
    assert str(device) in ("host", "cuda:0")


def test_stream_runs_python_work_in_order(stream):
    seen = []
    for i in range(200):
        gc.launch_host_func(stream, lambda i=i: seen.append(i))
    stream.synchronize()
    assert seen == list(range(200))
    assert stream.query()


def test_exception_from_enqueued_work_surfaces_at_synchronize(stream):
    ran = []
    gc.launch_host_func(stream, lambda: ran.append(1))
    gc.launch_host_func(stream, lambda: (_ for _ in ()).throw(KeyError("batch 7")))
    gc.launch_host_func(stream, lambda: ran.append(2))  # discarded: it follows the failure
    with pytest.raises(KeyError, match="batch 7"):
        stream.synchronize()
    assert ran == [1]
    gc.launch_host_func(stream, lambda: ran.append(3))
    stream.synchronize()
    assert ran == [1, 3]


def test_add_callback_runs_after_earlier_work_and_takes_over_its_error(stream, monkeypatch):
    """Like cudaStreamAddCallback's status: the callback runs also after a failure and gets the
    error as an exception object of its type (a gpucloud error too); synchronize() then does not
    raise it again. An exception from the callback itself is reported, not raised."""
    seen = []
    gc.launch_host_func(stream, lambda: seen.append("work"))
    gc.add_callback(stream, lambda error: seen.append(("ok", error)))
    stream.synchronize()
    assert seen == ["work", ("ok", None)]
    gc.launch_host_func(stream, lambda: (_ for _ in ()).throw(KeyError("batch 7")))
    gc.launch_host_func(stream, lambda: seen.append("skipped"))  # discarded: it follows the failure
    gc.add_callback(stream, lambda error: seen.append(("failed", type(error), str(error))))
    gc.launch_host_func(stream, lambda: seen.append("after"))  # runs: the callback took the error
    stream.synchronize()
    assert seen[2:] == [("failed", KeyError, "'batch 7'"), "after"]
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_type))
    gc.add_callback(stream, lambda error: 1 / 0)
    stream.synchronize()  # the callback's ZeroDivisionError is unraisable, not the stream's
    assert unraisable == [ZeroDivisionError]
    with pytest.raises(TypeError):
        gc.add_callback(stream, "not callable")


def test_a_callback_dropped_by_its_caller_still_runs_when_the_stream_reaches_it():
    """The stream keeps the callback (and what it closes over) alive: dropped by the caller while
    earlier work blocks the stream, it still runs, once, after that work."""
    import gc as pygc

    stream = gc.Stream()
    gate = threading.Event()
    seen = []

    class Sink:
        def __call__(self, error):
            seen.append(("ran", error))

    gc.launch_host_func(stream, lambda: gate.wait(30))
    sink = Sink()
    gc.add_callback(stream, sink)
    del sink
    pygc.collect()
    assert seen == []
    gate.set()
    stream.synchronize()
    assert seen == [("ran", None)]


def test_events_order_and_time_work_across_streams(device):
    producer, consumer = gc.Stream(device), gc.Stream(device)
    ready, start, end = gc.Event(device), gc.TimedEvent(device), gc.TimedEvent(device)
    assert not ready.timed and start.timed and isinstance(start, gc.Event)
    state = {"produced": False, "seen": None}

    def produce():
        time.sleep(0.03)
        state["produced"] = True

    start.record(producer)
    gc.launch_host_func(producer, produce)
    ready.record(producer)
    end.record(producer)
    consumer.wait(ready)
    gc.launch_host_func(consumer, lambda: state.__setitem__("seen", state["produced"]))
    consumer.synchronize()
    assert state["seen"] is True
    end.synchronize()
    assert gc.elapsed_ms(start, end) >= 25.0
    ready.record(producer)
    producer.synchronize()
    with pytest.raises(gc.InvalidArgument, match="start: an untimed event"):
        gc.elapsed_ms(ready, end)


def test_event_takes_no_timing_flag_and_elapsed_ms_refuses_untimed_events(device):
    stream = gc.Stream(device)
    with pytest.raises(TypeError):
        gc.Event(device, timing=True)  # TimedEvent measures time
    start, untimed, end = gc.TimedEvent(device), gc.Event(device), gc.TimedEvent(device)
    assert start.timed and not untimed.timed
    for e in (start, untimed, end):
        e.record(stream)
    stream.synchronize()
    assert gc.elapsed_ms(start, end) >= 0.0
    with pytest.raises(gc.InvalidArgument, match="end: an untimed event"):
        gc.elapsed_ms(start, untimed)
    with pytest.raises(gc.InvalidArgument, match="start: an untimed event"):
        gc.elapsed_ms(untimed, end)


def test_query_sees_pending_work(stream):
    gate = threading.Event()
    gc.launch_host_func(stream, gate.wait)
    assert not stream.query()
    gate.set()
    stream.synchronize()
    assert stream.query()


def test_python_dash_m_prints_configuration_and_devices():
    out = subprocess.run([sys.executable, "-m", "gpucloud"], check=True, capture_output=True, text=True).stdout
    assert out.startswith(f"gpucloud {gc.__version__}")
    assert "devices:" in out and "host:" in out
    assert "now (procfs): util" in out  # the host's load, read through read_metrics


def test_dropping_a_stream_with_python_work_queued_finishes_it_without_deadlock(device):
    seen = []
    s = gc.Stream(device)
    gate = threading.Event()
    gc.launch_host_func(s, gate.wait)
    gc.launch_host_func(s, lambda: seen.append("ran"))
    threading.Timer(0.05, gate.set).start()
    del s  # the destructor waits for the queue, with the GIL released
    assert seen == ["ran"]


def test_build_info_names_the_optional_parts():
    info = gc.build_info()
    assert info.host_blas in ("OpenBLAS", "built-in")
    assert info.host_bf16_gemm in ("oneDNN", "widened to fp32")
    assert info.host_conv in ("oneDNN", "im2col + GEMM")
    assert isinstance(info.nccl, bool) and isinstance(info.cudnn, bool) and isinstance(info.mpi, bool)
    if not info.cuda:
        assert not info.nccl and not info.cudnn


# ---- the CUDA stream protocol: frameworks' streams in, gpucloud's out --------------------------

class ForeignStream:
    """Any framework's stream, as the CUDA stream protocol describes it."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def test_a_host_stream_has_no_cuda_stream_to_share():
    with pytest.raises(gc.InvalidArgument, match="host stream has no CUDA stream"):
        gc.Stream().__cuda_stream__()


def test_foreign_streams_are_typed_errors_without_a_gpu():
    if gc.cuda_device_count() > 0:
        pytest.skip("a GPU is present: test_gpucloud_streams_round_trip_through_the_protocol runs instead")
    with pytest.raises(gc.Error):
        gc.Stream(ForeignStream(1234))
    with pytest.raises(TypeError, match="stream: expected a gpucloud.Stream"):
        gc.Stream("not a stream")
    with pytest.raises(TypeError):  # where a Stream is expected, the conversion fails cleanly
        gc.copy(np.zeros(3), np.ones(3), ForeignStream(1234))


def test_gpucloud_streams_round_trip_through_the_protocol():
    if gc.cuda_device_count() == 0:
        pytest.skip(f"no CUDA device: {gc.cuda_unavailable_reason()}")
    own = gc.Stream(gc.Device.cuda(0))
    version, handle = own.__cuda_stream__()
    assert version == 0 and handle == own.native_handle != 0
    adopted = gc.Stream(ForeignStream(handle))  # as a framework's stream would come in
    assert adopted.native_handle == handle and adopted.device == gc.Device.cuda(0)
    legacy = gc.Stream.from_native(0, gc.Device.cuda(0))  # torch's current stream by default
    assert legacy.native_handle == 0 and legacy.__cuda_stream__() == (0, 0)
    with pytest.raises(gc.InvalidArgument, match="cudaStreamPerThread"):
        gc.Stream.from_native(2, gc.Device.cuda(0))
    buf = gc.Buffer(1000, "float32", gc.Device.cuda(0))
    gc.fill(buf, 3.0, ForeignStream(handle))  # accepted wherever a Stream is
    own.synchronize()  # the same CUDA stream: the fill is done
    host = np.zeros(1000, np.float32)
    gc.copy(host, buf, own)
    own.synchronize()
    assert (host == 3.0).all()


def test_torch_streams_are_accepted():
    torch = pytest.importorskip("torch")
    if gc.cuda_device_count() == 0 or not torch.cuda.is_available():
        pytest.skip("needs a GPU and a CUDA build of torch")
    ts = torch.cuda.Stream()
    s = gc.Stream(ts)
    assert s.native_handle == ts.cuda_stream
    x = torch.zeros(1000, device="cuda")
    gc.fill(x, 2.0, ts)
    ts.synchronize()
    assert float(x.sum()) == 2000.0


def test_python_and_cpp_share_one_name_each():
    for gone in ("View", "conv2d", "conv2d_output_shape"):  # the C++ names are BufferView, conv2d_forward, ...
        assert not hasattr(gc, gone), gone
    with pytest.raises(AttributeError):
        gc.no_such_name  # noqa: B018


def test_hierarchical_all_reduce_has_its_own_name():
    if not gc.build_info().mpi:
        pytest.skip("built without MPI")
    c = gc.Communicator.mpi_world()
    s = gc.Stream()
    x = np.arange(10, dtype=np.float32)
    c.hierarchical_all_reduce(x, x, s)
    with pytest.raises(TypeError):
        c.all_reduce(x, x, s, hierarchical=True)
    s.synchronize()
    assert (x == np.arange(10, dtype=np.float32)).all()  # one rank: the sum is the input


def _in_forked_child(body):
    """Runs body() in a fork() child (killed by SIGALRM after 20 s: a hang fails, never blocks the
    suite); returns the child's exit code, or -signal."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            signal.alarm(20)
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def test_a_stream_made_before_fork_runs_work_in_the_child():
    # The child's copy of an idle stream has no worker thread of the parent's: it starts one.
    s = gc.Stream()
    a = np.zeros(1000, np.float32)
    gc.fill(a, 1.0, s)
    s.synchronize()

    def child():
        gc.fill(a, 3.0, s)
        s.synchronize()
        e = gc.Event()
        e.record(s)
        e.synchronize()
        return 0 if (a == 3.0).all() else 1

    assert _in_forked_child(child) == 0
    gc.fill(a, 2.0, s)  # and the parent's stream goes on
    s.synchronize()
    assert (a == 2.0).all()


def test_work_in_flight_at_fork_is_reported_in_the_child_not_waited_for():
    # A task still running (and one queued behind it, and an event after them) when the process
    # forks: in the parent they finish; in the child they never run, so synchronize() and the
    # event's synchronize() raise instead of waiting forever, and the stream then runs new work.
    # The parent waits until the sleep runs: a worker thread still starting at the fork could hold
    # the allocator lock of GCC 12's AddressSanitizer (python-asan), which takes none around fork.
    s = gc.Stream()
    ran = []
    running = threading.Event()

    def sleeper():
        running.set()
        time.sleep(0.5)

    gc.launch_host_func(s, sleeper)
    gc.launch_host_func(s, lambda: ran.append("queued"))
    e = gc.Event()
    e.record(s)
    assert running.wait(10)  # the sleep is running

    def child():
        try:
            s.synchronize()
            return 1
        except gc.Error as err:
            if "fork" not in str(err):
                return 2
        try:
            e.synchronize()
            return 3
        except gc.Error as err:
            if "fork" not in str(err):
                return 4
        b = np.zeros(10, np.float32)
        gc.fill(b, 5.0, s)
        s.synchronize()  # the error was reported once; new work runs
        if not (b == 5.0).all() or ran:
            return 5
        return 0

    assert _in_forked_child(child) == 0
    s.synchronize()
    e.synchronize()
    assert ran == ["queued"]


def test_errors_name_their_source_relative_to_the_project_root():
    # file:line is kept for bug reports, but not the build machine's absolute path.
    import re

    with pytest.raises(gc.InvalidArgument) as raised:
        gc.Buffer(-1, "float32")
    with pytest.raises(gc.InvalidArgument) as from_core:
        gc.Checkpointer("a\0b") if hasattr(gc, "Checkpointer") else gc.checkpoint.Checkpointer("a\0b")
    for e in (raised.value, from_core.value):
        where = re.findall(r"\(([^()]*):(\d+)\)\s*$", str(e))
        assert where, str(e)
        path = where[-1][0]
        assert not path.startswith("/") and re.match(r"(src|python/src|kernels|include)/", path), str(e)
