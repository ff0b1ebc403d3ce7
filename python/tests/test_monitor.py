"""Device monitoring from Python: one reading, the background monitor as a context manager."""

import json
import time

import pytest

import gpucloud as gc


def test_host_reading_reports_memory_and_utilization():
    m = gc.read_metrics(gc.Device.host())
    assert m.source == "procfs"
    assert m.memory_total == gc.memory_info(gc.Device.host()).total
    assert 0 < m.memory_used <= m.memory_total
    assert m.utilization is not None and 0.0 <= m.utilization <= 100.0
    assert m.memory_utilization is None  # a GPU-only figure
    d = m.as_dict()
    assert d["device"] == "host" and d["memory_total"] == m.memory_total
    json.dumps(d)  # loggable as is


def test_monitor_context_manager_keeps_statistics():
    with gc.MetricsMonitor(gc.Device.host(), interval=0.02) as monitor:
        time.sleep(0.2)
        s = monitor.summary()
    assert s.samples >= 4
    assert s.memory_used.count == s.samples
    assert s.memory_used.min <= s.memory_used.mean <= s.memory_used.max
    assert (s.energy_j is not None) == (s.power_w.count > 0)
    assert monitor.latest().source == "procfs"
    stopped = monitor.summary().samples
    time.sleep(0.1)
    assert monitor.summary().samples == stopped + 1  # stopped: only summary()'s own readings
    json.dumps(s.as_dict())


def test_bad_interval_names_the_argument():
    with pytest.raises(gc.InvalidArgument, match="interval: 1 ms is shorter than the 10 ms minimum"):
        gc.MetricsMonitor(gc.Device.host(), interval=0.001)


@pytest.mark.skipif(gc.cuda_device_count() == 0, reason="needs a CUDA device")
def test_gpu_reading():
    m = gc.read_metrics(gc.Device.cuda(0))
    assert m.source in ("nvml", "cuda")
    assert 0 < m.memory_used <= m.memory_total
    if gc.nvml_unavailable_reason() == "":
        assert m.utilization is not None


def test_nvml_reason_without_a_gpu():
    if gc.cuda_device_count() == 0:
        assert gc.nvml_unavailable_reason() != ""


HEALTH = ("xid", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "retired_pages_sbe",
          "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable", "row_remap_failure",
          "pcie_replay_counter", "throttle_reasons")


def test_health_counters_are_a_gpus_and_empty_on_the_host(device):
    reading = gc.read_metrics(device)
    figures = {name: getattr(reading.health, name) for name in HEALTH}
    if device.is_cuda:  # what the GPU reports is a number (scripts/gpu-check.sh shows which)
        assert all(v is None or v >= 0 for v in figures.values()), figures
        assert set(reading.as_dict()) >= {name for name, v in figures.items() if v is not None}
    else:
        assert figures == {name: None for name in HEALTH}
        assert not set(HEALTH) & set(reading.as_dict())

