import threading
import time

import numpy as np
import pytest

import gpucloud as gc


def test_pipeline_upload_download_round_trip(device, stream):
    pipeline = gc.CopyPipeline(device, chunk_bytes=4096, depth=3)
    for n in (0, 1, 1023, 1024, 1025, 10 * 1024 + 7):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        on_device = gc.Buffer(n, "float32", device)
        back = np.empty_like(x)
        pipeline.upload(on_device, x, stream)
        pipeline.download(back, on_device, stream)
        stream.synchronize()
        np.testing.assert_array_equal(back, x)


def test_pipeline_step_sees_each_chunk_once_in_order(device, stream):
    pipeline = gc.CopyPipeline(device, chunk_bytes=256 * 4, depth=2)
    x = np.arange(256 * 7 + 5, dtype=np.float32)
    seen = []

    def step(chunk):
        assert chunk.data.size == min(256, x.size - chunk.offset)
        assert chunk.data.device == device
        seen.append((chunk.index, chunk.offset))
        gc.fill(chunk.data, float(chunk.index), chunk.stream)  # enqueued work on the chunk, in place

    out = np.empty_like(x)
    pipeline.transform(out, x, stream, step)
    stream.synchronize()
    assert seen == [(i, 256 * i) for i in range(8)]
    np.testing.assert_array_equal(out, np.arange(x.size) // 256)


def test_pipeline_step_errors_reach_the_caller(device, stream):
    pipeline = gc.CopyPipeline(device, chunk_bytes=1024, depth=2)
    x = np.zeros(4096, np.uint8)
    dst = gc.Buffer(4096, "uint8", device)

    def failing(chunk):
        if chunk.index == 2:
            raise RuntimeError("no kernel for chunk 2")

    with pytest.raises(RuntimeError, match="chunk 2"):
        pipeline.upload(dst, x, stream, failing)
    stream.synchronize()
    pipeline.upload(dst, x, stream)  # still usable
    stream.synchronize()


def test_pipeline_timeline_shows_copies_overlapping_compute():
    s = gc.Stream()
    pipeline = gc.CopyPipeline(chunk_bytes=1 << 20, depth=3, record_timeline=True)
    x = np.ones(8 << 20, np.uint8)
    dst = gc.Buffer(x.size, "uint8")
    pipeline.upload(dst, x, s, lambda c: gc.launch_host_func(c.stream, lambda: time.sleep(0.01)))
    s.synchronize()
    t = pipeline.timeline()
    assert [c.index for c in t] == list(range(8))
    overlaps = sum(
        b.copy_in_begin < a.compute_end and a.copy_in_end < b.copy_in_end for a in t for b in t if a.index != b.index
    )
    assert overlaps > 0


def make_source(count, seen_calls):
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4, 3)).astype(np.float32), np.arange(4, dtype=np.int64) + i) for i in range(count)]

    def source():
        for b in batches:
            seen_calls.append(1)
            yield b

    return batches, source()


def test_prefetcher_delivers_every_batch_in_order(device, stream):
    calls = []
    batches, source = make_source(6, calls)
    prefetcher = gc.Prefetcher(source, device, depth=2)
    got = []
    for batch in prefetcher.batches(stream):
        x, y = batch.arrays
        assert x.device == device and x.size == 12 and y.dtype == gc.DType.int64
        hx, hy = np.empty(12, np.float32), np.empty(4, np.int64)
        gc.copy(hx, x, stream)
        gc.copy(hy, y, stream)
        stream.synchronize()
        got.append((batch.index, hx.reshape(4, 3), hy))
    assert [g[0] for g in got] == list(range(6))
    for (_, hx, hy), (x, y) in zip(got, batches):
        np.testing.assert_array_equal(hx, x)
        np.testing.assert_array_equal(hy, y)
    assert prefetcher.next(stream) is None


def test_prefetcher_last_wait_is_the_streams_stall_not_the_hosts(device, stream):
    gate = threading.Semaphore(0)

    def gated():  # the first batch at once, each other one when the test opens the gate
        for i in range(3):
            if i > 0:
                gate.acquire(timeout=30)
            yield np.zeros(8, np.float32)

    prefetcher = gc.Prefetcher(gated(), device, depth=1)
    assert prefetcher.last_wait.blocked_seconds == 0.0 and prefetcher.last_wait.stream_idle_seconds == 0.0
    prefetcher.next(stream)
    stream.synchronize()
    threading.Timer(0.05, gate.release).start()
    prefetcher.next(stream)  # the stream has nothing to do meanwhile: all of the wait is a stall
    w = prefetcher.last_wait
    assert w.blocked_seconds >= 0.03 and 0.03 <= w.stream_idle_seconds <= w.blocked_seconds, w
    # The stream still busy (a host function waiting for the batch to have arrived): no stall.
    arrived = threading.Event()
    gc.launch_host_func(stream, lambda: arrived.wait(30))
    threading.Timer(0.05, gate.release).start()
    prefetcher.next(stream)
    arrived.set()
    w = prefetcher.last_wait
    assert w.blocked_seconds >= 0.03 and w.stream_idle_seconds == 0.0, w
    stream.synchronize()


def test_prefetcher_reraises_the_source_exception_after_earlier_batches(device, stream):
    def source():
        yield np.zeros(8, np.float32)
        yield np.ones(8, np.float32)
        raise OSError("shard 2 is unreadable")

    prefetcher = gc.Prefetcher(source(), device)
    assert prefetcher.next(stream).index == 0
    assert prefetcher.next(stream).index == 1
    with pytest.raises(OSError, match="shard 2"):
        prefetcher.next(stream)
    assert prefetcher.next(stream) is None


def test_prefetcher_stops_early_and_drops_cleanly(device, stream):
    def endless():
        while True:
            yield np.zeros(1 << 14, np.float32)

    prefetcher = gc.Prefetcher(endless(), device, depth=3)
    held = prefetcher.next(stream)
    prefetcher.stop()
    assert prefetcher.next(stream) is None
    assert held.arrays[0].size == 1 << 14
    del prefetcher  # a batch may outlive its prefetcher
    del held
    idle = gc.Prefetcher(endless(), device, depth=2)
    time.sleep(0.01)
    del idle  # blocked on a full queue: the destructor stops it without deadlocking on the GIL


def test_prefetcher_rejects_bad_input(device):
    with pytest.raises(gc.InvalidArgument, match="depth"):
        gc.Prefetcher(iter([]), device, depth=0)
    with pytest.raises(gc.InvalidArgument, match="kind"):
        gc.Prefetcher(iter([]), device, kind="pinned")
    with pytest.raises(TypeError):
        gc.Prefetcher(42, device)
    p = gc.Prefetcher(iter([object()]), device)
    with pytest.raises(TypeError, match="source"):
        p.next(gc.Stream(device))


def test_large_host_copies_use_the_cores_and_survive_fork():
    # A 24 MiB copy runs on the pool of cores; a forked child (no threads of the parent) makes its
    # own pool and copies correctly, and neither process hangs at exit.
    import os

    src = np.arange(6 << 20, dtype=np.float32)
    dst = np.zeros_like(src)
    s = gc.Stream()
    gc.copy(dst, src, s)
    s.synchronize()
    assert np.array_equal(dst, src)
    pid = os.fork()
    if pid == 0:  # the child
        ok = False
        try:
            out = np.zeros_like(src)
            cs = gc.Stream()
            gc.copy(out, src, cs)
            cs.synchronize()
            ok = bool(np.array_equal(out, src))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    dst[:] = 0
    gc.copy(dst, src, s)  # the parent's pool still works
    s.synchronize()
    assert np.array_equal(dst, src)
