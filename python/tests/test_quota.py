"""The per-process memory quota (gc.set_memory_quota, GPUCLOUD_MEMORY_QUOTA) on the host: typed
errors naming the quota, the request and what is held; the environment variable, read in a
fresh process each; a real cgroup memory limit (a child moved into a cgroup this test makes) as the
host's memory; and the quota's metrics in the Prometheus exposition."""
import os
import subprocess
import sys
import textwrap

import pytest

import gpucloud as gc
from cgroups import cgroup  # noqa: E402

KIB, MIB = 1024, 1024 * 1024


@pytest.fixture
def host_quota():
    yield gc.Device.host()
    gc.clear_memory_quota("host")


def run(body, env=None, timeout=120):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return r


def test_a_buffer_beyond_the_quota_is_out_of_memory_naming_quota_request_and_held(host_quota):
    base = gc.memory_quota("host").held_bytes
    gc.set_memory_quota("host", base + 1 * MIB)
    q = gc.memory_quota("host")
    assert q.limit_bytes == base + MIB and q.device == gc.Device.host() and "set_memory_quota(host" in q.source
    first = gc.Buffer((600 * KIB,), gc.DType.uint8)
    with pytest.raises(gc.OutOfMemory) as e:
        gc.Buffer((600 * KIB,), gc.DType.uint8)
    text = str(e.value)
    assert "cannot allocate 614400 bytes" in text and f"memory quota there is {base + MIB} bytes" in text, text
    assert f"and {base + 600 * KIB} bytes" in text and "are held" in text, text
    assert gc.memory_quota("host").refused >= 1 and gc.memory_quota("host").held_bytes == base + 600 * KIB
    del first
    second = gc.Buffer((600 * KIB,), gc.DType.uint8)  # given back at once: it fits now
    assert "MemoryQuota(device=host, limit_bytes=" in repr(gc.memory_quota("host"))
    gc.set_memory_quota("host", "64MiB")  # a size as text
    assert gc.memory_quota("host").limit_bytes == 64 * MIB
    assert gc.Device.host() in [q.device for q in gc.memory_quotas()]
    del second


def test_bad_quotas_are_typed_errors_that_change_nothing(host_quota):
    gc.set_memory_quota("host", 10 * MIB)
    with pytest.raises(gc.InvalidArgument, match=r"limit: '1\.5GiB' is not a size"):
        gc.set_memory_quota("host", "1.5GiB")
    with pytest.raises(gc.InvalidArgument, match=r"fraction: 1\.5.* is not in \(0, 1\]"):
        gc.set_memory_fraction("host", 1.5)
    with pytest.raises(TypeError):
        gc.set_memory_quota("host", -1)
    assert gc.memory_quota("host").limit_bytes == 10 * MIB
    assert gc.parse_bytes("2GB") == 2 * 10**9 and gc.parse_bytes("3K") == 3 * KIB


QUOTA_CHILD = """
    import gpucloud as gc
    q = gc.memory_quota("host")
    print("limit", q.limit_bytes, "source", q.source)
    try:
        gc.Buffer((3 * 1024 * 1024,), gc.DType.uint8)
        print("allocated")
    except gc.OutOfMemory as e:
        print("refused", e)
"""


@pytest.mark.parametrize("value, limit", [("host=2MiB", 2 * MIB), ("2MiB", 2 * MIB), ("cuda=1GiB,host=2MiB", 2 * MIB),
                                          ("cuda=1G", None), ("host=1GiB,host=2MiB", 2 * MIB)])
def test_the_environment_variable_sets_the_quota_at_the_first_allocation(value, limit):
    r = run(QUOTA_CHILD, env={"GPUCLOUD_MEMORY_QUOTA": value})
    assert r.returncode == 0, r.stderr
    assert f"limit {limit} " in r.stdout, r.stdout
    if limit is None:
        assert "allocated" in r.stdout
    else:
        assert "refused" in r.stdout and f"(GPUCLOUD_MEMORY_QUOTA={value})" in r.stdout, r.stdout


def test_a_fraction_in_the_environment_is_of_the_hosts_memory():
    total = gc.memory_info("host").total
    for value in ("0.25", "25%"):
        r = run(QUOTA_CHILD, env={"GPUCLOUD_MEMORY_QUOTA": value})
        assert r.returncode == 0, r.stderr
        limit = int(r.stdout.split()[1])
        assert abs(limit - total // 4) <= 4096, (value, limit, total)


@pytest.mark.parametrize("value, message", [("host=lots", "entry 'host=lots': 'lots' is not a size"),
                                            ("gpu0=1G", "'gpu0=1G': the device must be host, cuda or cuda:N"),
                                            ("1.5", "is not in (0, 1]"), ("cuda=x", "entry 'cuda=x'")])
def test_a_malformed_environment_variable_is_an_error_naming_the_entry(value, message):
    r = run(QUOTA_CHILD, env={"GPUCLOUD_MEMORY_QUOTA": value})
    assert r.returncode != 0 and "InvalidArgument" in r.stderr and message in r.stderr, r.stderr


def test_a_cgroup_memory_limit_is_the_hosts_memory_and_a_fraction_is_of_it():
    body = """
        import gpucloud as gc
        info = gc.memory_info("host")
        print("total", info.total, "free", info.free)
        gc.set_memory_fraction("host", 0.5)
        print("limit", gc.memory_quota("host").limit_bytes)
        try:
            gc.Buffer((300 * 1024 * 1024,), gc.DType.uint8)
        except gc.OutOfMemory as e:
            print("refused", e)
    """
    with cgroup("memory", {"memory.max": 512 * MIB, "memory.limit_in_bytes": 512 * MIB}) as enter:
        r = run(enter + textwrap.dedent(body))
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert int(words[1]) == 512 * MIB and int(words[3]) <= 512 * MIB, r.stdout
    assert f"limit {256 * MIB}" in r.stdout and "refused" in r.stdout, r.stdout


def test_the_quota_and_what_is_held_are_metrics(host_quota):
    if not gc.build_info().telemetry:
        pytest.skip("built without prometheus-cpp (Debian: prometheus-cpp-dev)")
    parser = pytest.importorskip("prometheus_client.parser", reason="pip install prometheus_client")
    gc.set_memory_quota("host", gc.memory_quota("host").held_bytes + MIB)
    keep = gc.Buffer((512 * KIB,), gc.DType.uint8)
    with pytest.raises(gc.OutOfMemory):
        gc.Buffer((MIB,), gc.DType.uint8)
    exporter = gc.telemetry.Exporter(port=-1, labels={"job": "q"})
    fams = {f.name: f for f in parser.text_string_to_metric_families(exporter.exposition())}
    q = gc.memory_quota("host")

    def value(name, suffix=""):
        return [s.value for s in fams[name].samples if s.name == name + suffix and s.labels == {"device": "host",
                                                                                               "job": "q"}][0]
    assert value("gpucloud_memory_quota_bytes") == q.limit_bytes
    assert value("gpucloud_memory_held_bytes") == q.held_bytes
    assert value("gpucloud_memory_held_peak_bytes") == q.peak_bytes
    assert fams["gpucloud_memory_quota_refusals"].type == "counter"
    assert value("gpucloud_memory_quota_refusals", "_total") == q.refused >= 1
    del keep
