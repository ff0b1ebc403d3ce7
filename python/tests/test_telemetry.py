"""gpucloud.telemetry: /metrics over HTTP parsed by prometheus_client's own parser, device and
training metrics, straggler detection under mpirun (one rank slowed on purpose), bad input, and
exporters dropped while they are being scraped."""
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import urllib.request

import pytest

import gpucloud as gc
from gpucloud import telemetry

parser = pytest.importorskip("prometheus_client.parser", reason="pip install prometheus_client")
if not gc.build_info().telemetry:
    pytest.skip("built without prometheus-cpp (Debian: prometheus-cpp-dev)", allow_module_level=True)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def families(text):
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def sample(fams, name, suffix="", **labels):
    for s in fams[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s
    raise AssertionError(f"no sample {name}{suffix} {labels}")


def test_recorded_steps_parse_with_the_official_parser():
    exporter = telemetry.serve_metrics(port=0, address="127.0.0.1", labels={"job": "unit"})
    assert exporter.port > 0
    for i in range(5):
        with exporter.step(samples=128) as st:
            st.data_wait_seconds = 0.001
            st.comm_seconds = 0.002
            st.loss_scale = 65536.0
            st.skipped = i == 3
    exporter.steps.record_checkpoint(1.5)
    fams = families(scrape(exporter.port))
    # Types and names as documented (prometheus_client strips _total from counter family names).
    assert fams["gpucloud_step_seconds"].type == "histogram"
    assert fams["gpucloud_steps"].type == "counter"
    assert fams["gpucloud_loss_scale"].type == "gauge"
    assert sample(fams, "gpucloud_steps", "_total").value == 5
    assert sample(fams, "gpucloud_samples", "_total").value == 640
    assert sample(fams, "gpucloud_skipped_steps", "_total").value == 1
    assert sample(fams, "gpucloud_data_wait_seconds", "_total").value == pytest.approx(0.005)
    assert sample(fams, "gpucloud_comm_seconds", "_total").value == pytest.approx(0.010)
    assert sample(fams, "gpucloud_loss_scale").value == 65536
    assert sample(fams, "gpucloud_step_seconds", "_count").value == 5
    assert sample(fams, "gpucloud_step_seconds", "_bucket", le="+Inf").value == 5
    assert sample(fams, "gpucloud_checkpoint_save_seconds", "_sum").value == 1.5
    labels = sample(fams, "gpucloud_steps", "_total").labels
    assert labels["job"] == "unit" and labels["rank"] == "0" and labels["local_rank"] == "0" and labels["node"]
    assert exporter.steps.steps == 5


def test_a_step_that_raises_is_not_recorded():
    exporter = telemetry.Exporter(port=-1)
    with pytest.raises(ZeroDivisionError):
        with exporter.step(samples=1):
            1 / 0
    assert exporter.steps.steps == 0


def test_host_device_metrics_and_the_textfile(tmp_path):
    path = tmp_path / "gpucloud.prom"
    exporter = telemetry.Exporter(port=-1, labels={"job": "t"}, textfile=str(path))
    monitor = gc.MetricsMonitor("host", interval=0.02)
    exporter.watch(monitor)
    exporter.write_textfile()
    fams = families(path.read_text())
    used = sample(fams, "gpucloud_host_memory_used_bytes", device="host", job="t")
    assert used.value > 0
    exporter.unwatch(monitor)
    assert "gpucloud_host_memory_used_bytes" not in exporter.exposition()


def test_bad_input_is_a_typed_error():
    with pytest.raises(gc.InvalidArgument, match="labels"):
        telemetry.Exporter(port=-1, labels={"bad-name": "x"})
    with pytest.raises(TypeError, match="labels"):
        telemetry.Exporter(port=-1, labels={"job": 3})
    with pytest.raises(TypeError, match="port"):
        telemetry.Exporter(port="9100")
    with pytest.raises(gc.InvalidArgument, match="port"):
        telemetry.Exporter(port=123456)
    first = telemetry.Exporter(port=0, address="127.0.0.1")
    with pytest.raises(gc.InvalidArgument, match=str(first.port)):
        telemetry.Exporter(port=first.port, address="127.0.0.1")
    with pytest.raises(gc.InvalidArgument, match="seconds"):
        first.steps.record(float("nan"))
    with pytest.raises(gc.InvalidArgument, match="samples"):
        first.steps.record(0.1, samples=-3)
    with pytest.raises(TypeError, match="seconds"):
        first.steps.record("fast")
    with pytest.raises(TypeError, match="monitor"):
        first.watch("host")
    assert first.steps.steps == 0


def run_script(body, prefix=(), timeout=120, env=None):
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "terminate called" not in r.stderr and "AddressSanitizer" not in r.stderr, r.stderr
    return r.stdout


def test_dropping_an_exporter_while_it_is_scraped_and_exiting_with_one_serving():
    out = run_script("""
        import threading, urllib.request, gpucloud as gc
        e = gc.telemetry.serve_metrics(port=0, address="127.0.0.1")
        e.watch(gc.MetricsMonitor("host", interval=0.01))
        port, done = e.port, threading.Event()
        def scrape():
            while not done.is_set():
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                except Exception:
                    pass
        threads = [threading.Thread(target=scrape) for _ in range(3)]
        for t in threads: t.start()
        for i in range(200):
            e.steps.record(0.001, 1)
        del e                                  # while scrapes are in flight
        done.set()
        for t in threads: t.join()
        kept = gc.telemetry.serve_metrics(port=0, address="127.0.0.1")   # and exit while serving
        print("OK")
    """)
    assert "OK" in out


def under_mpirun(ranks):
    """The command prefix and environment that run a script on @p ranks ranks (skips without mpirun)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    return (mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)), env


def test_a_straggler_is_found_under_mpirun():
    prefix, env = under_mpirun(3)
    out = run_script("""
        import time, gpucloud as gc
        comm = gc.Communicator.mpi_world()
        s = gc.Stream()
        e = gc.telemetry.Exporter(port=-1, labels=gc.telemetry.job_labels())
        e.detect_stragglers(comm, s, every=5, threshold=0.5)
        for step in range(21):
            # As in a synchronous loop: every rank's step lasts as long as the slowest's, rank 2
            # working 30 ms and the others waiting for it in their collectives.
            with e.step(samples=8) as st:
                time.sleep(0.034)
                st.comm_seconds = 0.0 if comm.rank == 2 else 0.03
        s.synchronize()
        r = e.straggler_report()
        text = e.exposition()
        series = [l for l in text.splitlines() if l.startswith("gpucloud_rank_compute_seconds{")]
        work = r.compute_seconds[2] >= 0.03 and r.compute_seconds[2] > 3 * max(r.compute_seconds[:2])
        print(f"rank {comm.rank}: slowest {r.slowest} straggler {r.straggler} series {len(series)} "
              f"flag {[l for l in text.splitlines() if l.startswith('gpucloud_straggler_rank')][0].split()[-1]} "
              f"work {work}")
    """, prefix=prefix, env=env)
    for rank in range(3):
        assert f"rank {rank}: slowest 2 straggler True series 3 flag 2 work True" in out, out


def test_a_straggler_must_also_exceed_the_minimum_excess():
    """At millisecond steps a shared host's scheduling alone puts one rank 50 % above the other: the
    minimum excess (5 ms by default) keeps that from being named; a real straggler still is."""
    prefix, env = under_mpirun(2)
    out = run_script("""
        import time, gpucloud as gc
        comm = gc.Communicator.mpi_world()
        s = gc.Stream()
        for bad in ({"threshold": -0.1}, {"min_excess_seconds": -1.0}, {"min_excess_seconds": float("inf")}):
            try:
                gc.telemetry.Exporter(port=-1).detect_stragglers(comm, s, every=2, **bad)
            except gc.InvalidArgument as err:
                assert next(iter(bad)) in str(err), err
            else:
                raise AssertionError(f"{bad} accepted")

        def report(own, **options):  # every rank records steps of its given own work until both are compared
            e = gc.telemetry.Exporter(port=-1)
            e.detect_stragglers(comm, s, every=2, **options)
            deadline = time.monotonic() + 60
            while min(e.straggler_report().steps or [0]) < 4:
                assert time.monotonic() < deadline, e.straggler_report().steps
                e.steps.record(own[comm.rank] + 0.01, comm_seconds=0.01)
                time.sleep(0.001)
            r = e.straggler_report()
            comm.barrier(s)
            s.synchronize()
            return r

        noise = (0.001, 0.004)  # 2.5 times the other, 1.5 ms above the median
        r = report(noise)
        print(f"rank {comm.rank}: noise slowest {r.slowest} straggler {r.straggler}")
        r = report(noise, min_excess_seconds=0.0)
        print(f"rank {comm.rank}: no floor straggler {r.straggler}")
        r = report((0.001, 0.02))
        print(f"rank {comm.rank}: real straggler {r.straggler} slowest {r.slowest}")
    """, prefix=prefix, env=env)
    for rank in range(2):
        assert f"rank {rank}: noise slowest 1 straggler False" in out, out
        assert f"rank {rank}: no floor straggler True" in out, out
        assert f"rank {rank}: real straggler True slowest 1" in out, out


def test_unequal_step_counts_leave_the_users_communicator_alone_and_a_rank_that_stops_is_lost():
    prefix, env = under_mpirun(3)
    out = run_script("""
        import time, numpy as np, gpucloud as gc
        comm = gc.Communicator.mpi_world()
        s = gc.Stream()
        e = gc.telemetry.Exporter(port=-1)
        e.detect_stragglers(comm, s, every=5, threshold=0.5)

        def record(seconds):
            with e.step(samples=8) as st:
                time.sleep(seconds)
                st.comm_seconds = 0.0

        def until(done, what):  # ranks that go on recording until rank 0's table says it
            deadline = time.monotonic() + 60
            while not done(e.straggler_report()):
                assert time.monotonic() < deadline, (what, e.straggler_report().steps)
                record(0.005)

        # The slow rank 2 records 10 steps while the others record 40 and more.
        if comm.rank == 2:
            for _ in range(10):
                record(0.04)
        else:
            for _ in range(40):
                record(0.005)
            until(lambda r: r.steps[2:] == [10] and r.straggler and r.slowest == 2, "rank 2 named")
        r = e.straggler_report()
        # The user's communicator saw none of it: a sum over it is right after unequal counts.
        x = np.full(1000, comm.rank + 1.0, np.float32)
        comm.all_reduce(x, x, s)
        s.synchronize()
        print(f"rank {comm.rank}: sum {x[0]:g} slowest {r.slowest} straggler {r.straggler} "
              f"steps {r.steps} lost {r.lost}", flush=True)
        # Rank 2 stops detecting (its exporter goes); the others see it lost, its last period kept.
        if comm.rank == 2:
            del e
        else:
            until(lambda r: r.lost == [2], "rank 2 lost")
            r = e.straggler_report()
            print(f"rank {comm.rank}: after lost {r.lost} straggler {r.straggler}", flush=True)
        comm.all_reduce(x, x, s)
        s.synchronize()
        print(f"rank {comm.rank}: sum {x[0]:g}", flush=True)
    """, prefix=prefix, env=env, timeout=240)
    for rank in (0, 1):
        assert f"rank {rank}: sum 6 slowest 2 straggler True steps [" in out, out
        assert f"rank {rank}: after lost [2] straggler True" in out, out
    assert "rank 2: sum 6" in out, out
    for rank in range(3):
        assert f"rank {rank}: sum 18" in out, out


def test_an_exporter_dropped_mid_period_while_its_stream_is_busy():
    prefix, env = under_mpirun(2)
    out = run_script("""
        import time, gpucloud as gc
        comm = gc.Communicator.mpi_world()
        s = gc.Stream()
        e = gc.telemetry.Exporter(port=-1)
        e.detect_stragglers(comm, s, every=2)
        gc.launch_host_func(s, lambda: time.sleep(0.3))   # the setup's stream still busy
        e.steps.record(0.01)
        e.steps.record(0.01)                                 # a period's summary sent to rank 0
        e.steps.record(0.01)
        del e                                                # mid-period: the channel closes
        s.synchronize()
        print(f"rank {comm.rank} OK")
    """, prefix=prefix, env=env)
    assert "rank 0 OK" in out and "rank 1 OK" in out, out
