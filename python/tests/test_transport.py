"""Communicator.from_transport with a transport written in Python (one rank, in-process): the
adapter hands it writable memoryviews, dtype and op names, on the stream's worker; its results
land in the buffers; its exception becomes a CommunicationError naming the collective; an
object that is not a transport is refused naming the missing method. Runs in every Python
configuration (ASan's too); over gloo with several ranks: test_process_group.py."""
import numpy as np
import pytest

import gpucloud as gc


class OneRank:
    """The trivial transport of a job of one: every collective leaves the data as it is."""

    def __init__(self):
        self.calls = []
        self.fail = False

    def rank(self):
        return 0

    def size(self):
        return 1

    def all_reduce(self, data, dtype, op):
        if self.fail:
            raise ConnectionError("peer vanished (test)")
        assert isinstance(data, memoryview) and not data.readonly
        self.calls.append(("all_reduce", dtype, op, data.nbytes))
        data[0:1] = data[0:1]  # writable

    def all_gather(self, send, recv, dtype):
        self.calls.append(("all_gather", dtype, send.nbytes, recv.nbytes))
        recv[:] = send

    def broadcast(self, data, dtype, root):
        self.calls.append(("broadcast", dtype, root))

    def split(self, color, key):
        return self


def test_a_python_transport_runs_every_collective():
    t = OneRank()
    comm = gc.Communicator.from_transport(t)
    assert comm.backend == gc.CommBackend.transport and (comm.rank, comm.size, comm.nodes) == (0, 1, 1)
    s = gc.Stream()
    x = np.arange(6, dtype=np.float32)
    out = np.zeros(6, np.float32)
    comm.all_reduce(x, out, s, op="average")
    g = np.zeros(3, np.int64)
    comm.all_gather(np.array([4, 5, 6], np.int64), g, s)
    comm.broadcast(x, 0, s)
    comm.barrier(s)
    s.synchronize()
    assert np.array_equal(out, x) and g.tolist() == [4, 5, 6]
    # every collective is preceded by the agreement: 12 int64 under max
    assert ("all_reduce", "int64", "max", 96) in t.calls
    assert ("all_reduce", "float32", "sum", 24) in t.calls  # average is a sum, divided by gpucloud
    assert ("all_gather", "int64", 8, 8) in t.calls  # host keys at setup
    t.fail = True
    comm.all_reduce(x, out, s)
    with pytest.raises(gc.CommunicationError, match=r"Communicator::all_reduce.*the transport failed.*peer vanished"):
        s.synchronize()


def test_what_is_not_a_transport_is_refused():
    with pytest.raises(gc.InvalidArgument, match=r"has no method rank\(\)"):
        gc.Communicator.from_transport(object())

    class BadRank(OneRank):
        def rank(self):
            return 3

    with pytest.raises(gc.InvalidArgument, match="outside its size"):
        gc.Communicator.from_transport(BadRank())


def test_exiting_with_a_transport_collective_queued_neither_crashes_nor_hangs():
    """The interpreter ends while a collective over a Python transport still waits on its stream
    (behind a slow host function), with the transport and the communicator dropped: the process
    exits cleanly (the worker does not call into a finalising interpreter)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import time, numpy as np, gpucloud as gc
        from test_transport import OneRank
        comm = gc.Communicator.from_transport(OneRank())
        s = gc.Stream()
        gc.launch_host_func(s, lambda: time.sleep(0.5))
        x = np.ones(1000, np.float32)
        comm.all_reduce(x, x, s)
        del comm
        print("exiting", flush=True)
    """)
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "exiting" in r.stdout, r.stdout + r.stderr
