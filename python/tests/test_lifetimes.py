"""Dropping objects at every point of their use, each case in its own interpreter.

The lifetime rule (docs/architecture.md): work enqueued on a stream keeps alive everything it
touches until it has run, objects with background threads stop at `del` and at exit, and every
export of a buffer waits for the work queued on it. Each case below is an ordinary script a user
could write (a function that returns a result, a `del`, the interpreter exiting with work queued);
it must exit cleanly (status 0, no sanitizer or terminate report, no hang) and print the right
answer. Cases run in subprocesses so that a crash fails one case instead of the whole suite.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import gpucloud as gc

PRELUDE = """
import gc as pygc
import sys
import threading
import time
import numpy as np
import gpucloud as gc

def slow(stream, seconds=0.3):
    # Keeps `stream` busy so that later work is still queued when objects are dropped.
    gc.launch_host_func(stream, lambda: time.sleep(seconds))

def collect():
    for _ in range(3):
        pygc.collect()
    # Reuse freed memory, so a late write into it shows as wrong values.
    return [np.full(4096, 7.0, np.float32) for _ in range(64)]
"""


def run_case(body, timeout=60, env_extra=None):
    code = PRELUDE + textwrap.dedent(body)
    env = dict(os.environ)
    env.update(env_extra or {})
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script hung (no exit within {timeout} s); output so far:\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, f"exit status {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "terminate called" not in r.stderr, r.stderr
    assert "ERROR: AddressSanitizer" not in r.stderr, r.stderr
    return r.stdout


# ---- results that outlive what produced them ------------------------------------------------

def test_norm_returned_from_a_function_outlives_its_stream():
    out = run_case("""
        def norm():
            s = gc.Stream()
            g = np.full(1000, 2.0, np.float32)
            return gc.clip_grad_norm([g], 1.0, s), gc.global_norm([g], s)
        clipped, total = norm()
        collect()
        print(float(np.asarray(clipped)[0]), float(np.asarray(total)[0]))
        del clipped, total
        collect()
    """)
    a, b = map(float, out.split())
    assert abs(a - 2.0 * 1000 ** 0.5) < 1e-3 and abs(b - 1.0) < 1e-3  # the norm before clipping, then after


def test_batch_outlives_its_prefetcher_and_stream():
    out = run_case("""
        def first():
            p = gc.Prefetcher([np.arange(10, dtype=np.float32), np.arange(10, 20, dtype=np.float32)])
            s = gc.Stream()
            return p.next(s)
        b = first()
        collect()
        print(np.asarray(b.arrays[0]).sum())
        arrays = b.arrays
        del b
        collect()
        print(np.asarray(arrays[0]).sum())
    """)
    assert out.split() == ["45.0", "45.0"]


def test_chunk_outlives_its_pipeline_and_stream():
    out = run_case("""
        kept = []
        def upload():
            p = gc.CopyPipeline(chunk_bytes=4096)
            s = gc.Stream()
            src = np.arange(10000, dtype=np.float32)
            dst = gc.Buffer(10000, "float32")
            p.upload(dst, src, s, lambda c: kept.append(c))
            s.synchronize()
        upload()
        collect()
        c = kept[0]
        c.stream.synchronize()
        print(len(kept), float(np.asarray(c.data).sum()))
    """)
    n, total = out.split()
    assert int(n) == 10 and float(total) == sum(range(1024))


# ---- objects dropped with their work still queued ---------------------------------------------

def test_optimizer_dropped_with_a_step_queued_writes_into_live_memory():
    out = run_case("""
        s = gc.Stream()
        w = np.ones(50000, np.float32)
        g = np.full(50000, 0.5, np.float32)
        def train():
            opt = gc.FusedSGD([(w, g)], s, lr=0.5)
            slow(s)
            opt.step(s)
        train()          # the optimizer is gone; its step is still queued
        noise = collect()
        s.synchronize()
        print(float(w.min()), float(w.max()), all(float(n.min()) == 7.0 for n in noise))
    """)
    assert out.split() == ["0.75", "0.75", "True"]


def test_adam_and_scaler_dropped_mid_step():
    out = run_case("""
        s = gc.Stream()
        w = np.ones(3000, np.float32)
        g = np.full(3000, 65536.0, np.float32)
        def step():
            scaler = gc.LossScaler(gc.Device.host(), gc.Stream())
            opt = gc.FusedAdam([(w, g)], s, lr=0.1)
            slow(s)
            scaler.unscale([g], s)
            opt.step(s, scaler)
            scaler.update(s)
        step()
        collect()
        s.synchronize()
        print(float(g[0]), round(float(w[0]), 5))
    """)
    assert out.split() == ["1.0", "0.9"]


def test_communicator_dropped_with_an_all_reduce_queued():
    out = run_case("""
        s = gc.Stream()
        x = np.arange(100, dtype=np.float32)
        def reduce():
            c = gc.Communicator.mpi_world()
            slow(s)
            c.all_reduce(x, x, s)
        reduce()
        collect()
        s.synchronize()
        print(float(x.sum()))
    """)
    assert float(out) == sum(range(100))


def test_bucketer_dropped_right_after_wait():
    out = run_case("""
        c = gc.Communicator.mpi_world()
        compute = gc.Stream()
        g = np.full(1000, 3.0, np.float32)
        def bucket():
            b = gc.GradBucketer(c, [g])
            b.mark_ready(0, compute)
            slow(compute)
            b.wait(compute)
        bucket()
        collect()
        compute.synchronize()
        print(float(g.mean()))
    """)
    assert float(out) == 3.0


def test_streams_and_buffers_dropped_in_every_order():
    run_case("""
        for order in range(6):
            s = gc.Stream()
            b = gc.Buffer(100000, "float32", stream=s)
            src = np.ones(100000, np.float32)
            slow(s, 0.05)
            gc.copy(b, src, s)
            objs = [s, b, src]
            del s, b, src
            perm = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)][order]
            for i in perm:
                objs[i] = None
                collect()
    """)


def test_pool_resource_dropped_while_a_stream_releases_borrowed_arrays():
    run_case("""
        s = gc.Stream()
        pool = gc.PoolResource(gc.PlainResource("host"))
        b = gc.Buffer(10000, "float32", kind="host", stream=s, mr=pool)
        arrays = [np.ones(10000, np.float32) for _ in range(20)]
        slow(s, 0.2)
        for a in arrays:
            gc.copy(b, a, s)
        del arrays, b, pool
        collect()
        s.synchronize()
        print("ok")
    """, timeout=30)


def test_pool_dropped_while_python_work_it_waits_for_is_queued():
    run_case("""
        s = gc.Stream()
        pool = gc.PoolResource(gc.PlainResource("host"))
        b = gc.Buffer(1000, "float32", kind="host", stream=s, mr=pool)
        slow(s, 0.3)     # a Python host function: it needs the GIL to run
        del b, pool      # the pool's destructor waits for b's stream-ordered free, behind it
        s.synchronize()
        print("ok")
    """, timeout=30)


# ---- background threads at exit -----------------------------------------------------------

def test_prefetcher_alive_at_exit():
    run_case("""
        def endless():
            i = 0
            while True:
                i += 1
                yield np.full(1000, i, np.float32)
        p = gc.Prefetcher(endless(), depth=3)
        s = gc.Stream()
        print(np.asarray(p.next(s).arrays[0])[0])
        # no stop(), no del: the interpreter exits with the producer running
    """, timeout=30)


def test_monitor_and_pipeline_alive_at_exit():
    run_case("""
        m = gc.MetricsMonitor(gc.Device.host(), 0.01)  # samples from construction on
        p = gc.CopyPipeline(chunk_bytes=4096)
        s = gc.Stream()
        slow(s, 0.2)
        p.upload(gc.Buffer(10000, "float32"), np.ones(10000, np.float32), s)
        # exit with the pipeline's work queued and the monitor sampling
    """, timeout=30)


def test_work_queued_at_exit_finishes_or_is_dropped_cleanly():
    run_case("""
        s = gc.Stream()
        x = np.zeros(1000000, np.float32)
        slow(s, 0.3)
        gc.fill(x, 1.0, s)
        gc.launch_host_func(s, lambda: None)
    """, timeout=30)


# ---- exports wait ------------------------------------------------------------------------------

def test_every_export_waits_for_the_buffers_stream():
    out = run_case("""
        for export in ("asarray", "from_dlpack", "memoryview"):
            s = gc.Stream()
            b = gc.Buffer(5000000, "float32", stream=s)
            slow(s, 0.2)
            gc.fill(b, 3.0, s)
            if export == "asarray":
                a = np.asarray(b)
            elif export == "from_dlpack":
                a = np.from_dlpack(b)
            else:
                a = np.frombuffer(memoryview(b), np.float32) if hasattr(b, "__buffer__") else np.asarray(b)
            print(export, int((a == 3.0).sum()))
    """)
    for line in out.splitlines():
        assert line.split()[1] == "5000000", line


def test_exports_wait_for_gpucloud_work_on_any_stream():
    out = run_case("""
        b = gc.Buffer(3000000, "float32")      # no stream of its own
        s = gc.Stream()
        slow(s, 0.2)
        gc.fill(b.reshape(3000, 1000), 2.0, s)  # through a View, on another stream
        print(int((np.asarray(b) == 2.0).sum()))
    """)
    assert int(out) == 3000000


def test_optimizer_state_views_wait_for_their_initialisation():
    out = run_case("""
        s = gc.Stream()
        w = np.ones(1000000, np.float16)
        g = np.zeros(1000000, np.float16)
        slow(s, 0.2)
        opt = gc.FusedAdam([(w, g)], s)
        m = np.asarray(opt.master(0))
        v = np.asarray(opt.exp_avg(0))
        print(int((m == 1.0).sum()), int((v == 0.0).sum()))
    """)
    assert out.split() == ["1000000", "1000000"]


def test_empty_buffers_export():
    out = run_case("""
        b = gc.Buffer(0, "float32")
        print(np.asarray(b).shape, np.asarray(b.reshape(0, 5)).shape, np.from_dlpack(b).shape)
    """)
    assert out.strip() == "(0,) (0, 5) (0,)"


# ---- threads sharing a stream ----------------------------------------------------------------

def test_a_raising_host_function_on_a_shared_stream_reaches_every_thread_as_itself():
    # Two threads enqueue host functions that raise and synchronize the one stream they share: the
    # same error may be rethrown by both (it aborted the interpreter: a pybind11 error restored
    # twice). Every error must arrive as the ValueError raised, and the process exit cleanly.
    out = run_case("""
        s = gc.Stream()
        seen = []
        class Boom(ValueError):
            pass
        def bad():
            raise Boom("boom")
        def worker():
            for _ in range(100):
                gc.launch_host_func(s, bad)
                try:
                    s.synchronize()
                    seen.append(None)
                except Boom as e:
                    seen.append(str(e))
                except Exception as e:
                    seen.append("other: " + type(e).__name__ + ": " + str(e))
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert all(x in (None, "boom") for x in seen), [x for x in seen if x not in (None, "boom")][:3]
        assert seen.count("boom") >= 1
        gc.launch_host_func(s, lambda: None)
        s.synchronize()  # the stream is usable after the errors
        print("OK", len(seen))
    """)
    assert out.startswith("OK 400"), out


def test_a_raising_data_source_of_a_prefetcher_reaches_the_consumer_as_itself():
    out = run_case("""
        class SourceError(RuntimeError):
            pass
        def source():
            yield np.ones(8, np.float32)
            raise SourceError("source broke")
        s = gc.Stream()
        p = gc.Prefetcher(source(), depth=2)
        assert p.next(s) is not None
        for _ in range(2):  # raised again at every later call, as itself
            try:
                p.next(s)
            except SourceError as e:
                print("RAISED", e)
    """)
    assert "RAISED source broke" in out, out
