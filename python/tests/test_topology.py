"""gc.topology() and gc.binding_advice() against the kernel's own description, under taskset, and
`python -m gpucloud topo`, each restricted case in a fresh process."""
import os
import shutil
import subprocess
import sys

import pytest

import gpucloud as gc


def cpu_list(path):
    with open(path) as f:
        text = f.read().strip()
    out = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def test_the_topology_is_the_kernels():
    t = gc.topology()
    assert t.source.startswith("hwloc ") or t.source == "sysfs", t.source
    assert t.hardware_threads == len(cpu_list("/sys/devices/system/cpu/online"))
    assert sorted(t.allowed_cpus) == sorted(os.sched_getaffinity(0))
    for n in t.numa_nodes:
        path = f"/sys/devices/system/node/node{n.index}/cpulist"
        if os.path.exists(path):
            assert n.cpus == cpu_list(path)
        assert n.memory_bytes > 0
    assert len(t.gpus) == gc.cuda_device_count()


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_under_taskset_the_allowed_cpus_and_the_advice_follow():
    code = ("import gpucloud as gc; t = gc.topology(); a = gc.binding_advice(t, 0, 2); b = gc.binding_advice(t, 1, 2);"
            "print(t.allowed_cpus, a.cpus, b.cpus)")
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.split("]")[0] == "[0", out  # the one allowed CPU; both ranks advised onto it
    assert out.strip() == "[0] [0] [0]", out


def test_binding_advice_shares_the_allowed_cpus_and_names_bad_arguments():
    t = gc.topology()
    for size in range(1, 5):
        advice = [gc.binding_advice(t, r, size) for r in range(size)]
        assert all(a.cpus and set(a.cpus) <= set(t.allowed_cpus) for a in advice)
        if size <= len(t.allowed_cpus):
            seen = [c for a in advice for c in a.cpus]
            assert sorted(seen) == sorted(set(seen)) and set(seen) == set(t.allowed_cpus), (size, advice)
    with pytest.raises(gc.InvalidArgument, match=r"local_rank: 3 is not in \[0, 2\)"):
        gc.binding_advice(t, 3, 2)
    with pytest.raises(gc.InvalidArgument, match="gpu: 7 is not -1"):
        gc.binding_advice(t, 0, 1, 7)


def test_python_m_gpucloud_topo_reports_the_machine_and_the_advice():
    out = subprocess.run([sys.executable, "-m", "gpucloud", "topo", "--local-size", "2"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    t = gc.topology()
    assert f"{t.cores} cores, {t.hardware_threads} hardware threads" in out, out
    assert "NUMA node 0: CPUs" in out and "binding advice for 2 local rank(s)" in out, out
    assert "local rank 0: CPUs" in out and "local rank 1: CPUs" in out, out


def test_mig_instances_and_devices_by_uuid():
    instances = gc.mig_instances()  # NVML's; none without it (this machine) or without MIG mode
    if gc.cuda_device_count() == 0:
        assert instances == []
    for m in instances:
        assert m.uuid.startswith("MIG-") and m.gpu_uuid.startswith("GPU-") and m.multiprocessors > 0, m
    for i in range(gc.cuda_device_count()):  # every visible device by its UUID
        uuid = gc.device_properties(gc.Device(f"cuda:{i}")).uuid
        assert gc.Device(uuid) == gc.Device(f"cuda:{i}")
    with pytest.raises(gc.InvalidArgument, match="'MIG-0badc0de' is not the UUID of any of the"):
        gc.Device("MIG-0badc0de")

