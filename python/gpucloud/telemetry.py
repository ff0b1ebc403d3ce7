"""Prometheus telemetry of a training process: a /metrics endpoint, device metrics under the DCGM
exporter's names, training metrics recorded once per step, straggler detection across ranks.

    exporter = gpucloud.telemetry.serve_metrics(port=9400)       # labels: rank, local_rank, node, job
    exporter.watch(gpucloud.MetricsMonitor(dev))
    for step in ...:
        with exporter.step(samples=batch) as st:                 # wall time of the step
            t = time.perf_counter(); b = prefetcher.next(s); st.data_wait_seconds = time.perf_counter() - t
            ...
            st.loss_scale = scaler.state(s).scale

docs/telemetry.md lists the metrics and the deploy/prometheus/ files.
"""
import time

from ._core import StepMetrics, StragglerReport  # noqa: F401
from ._core import TelemetryExporter as Exporter  # noqa: F401
from ._core import telemetry_job_labels as job_labels  # noqa: F401

__all__ = ["Exporter", "StepMetrics", "StragglerReport", "Step", "job_labels", "serve_metrics"]


class Step:
    """One step being timed: set data_wait_seconds, comm_seconds, loss_scale, skipped (True, or a
    count found at a log step) inside the `with`; the record is made at its end (not when the
    block raises). With a communicator, comm_seconds is its busy time during the step unless set."""

    __slots__ = ("_metrics", "samples", "data_wait_seconds", "comm_seconds", "loss_scale", "skipped", "_start",
                 "_comm", "_busy")

    def __init__(self, metrics, samples, comm=None):
        self._metrics = metrics
        self._comm = comm
        self.samples = samples
        self.data_wait_seconds = 0.0
        self.comm_seconds = 0.0
        self.loss_scale = 0.0
        self.skipped = 0

    def __enter__(self):
        self._busy = self._comm.busy_seconds if self._comm is not None else 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            seconds = time.perf_counter() - self._start
            if self._comm is not None and not self.comm_seconds:
                self.comm_seconds = self._comm.busy_seconds - self._busy
            self._metrics.record(seconds, self.samples, self.data_wait_seconds, self.comm_seconds, self.loss_scale,
                                 int(self.skipped))
        return False


def _step(self, samples=0, comm=None):
    """A context manager timing one step: `with exporter.step(samples=n, comm=comm) as st: ...`
    (``comm``: the communicator of the step's collectives, e.g. the DDP hooks' one: their time is
    then not the rank's own work, which straggler detection compares)."""
    return Step(self.steps, samples, comm)


Exporter.step = _step


def serve_metrics(port=0, labels=None, address="0.0.0.0", textfile=None, **security):
    """Start this process's /metrics endpoint (port 0: a free one; see .port), labelled with
    job_labels() (rank, local_rank, node, job) plus `labels`. `security` takes the exporter's
    keyword options: threads, request_timeout, tls_cert_file, tls_key_file, basic_auth_users, allow."""
    if labels is not None and not isinstance(labels, dict):
        raise TypeError(f"labels: expected a dict of {{str: str}}, got {type(labels).__name__}")
    merged = dict(job_labels())
    merged.update(labels or {})
    return Exporter(port=port, address=address, labels=merged, textfile=textfile, **security)
