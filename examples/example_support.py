"""What the Python training examples share: values into and out of buffers of any float dtype on
any device (through float32, since NumPy has no bfloat16). The examples import it from their own
directory, which Python puts on the path when it runs them."""
import argparse
import math

import numpy as np

import gpucloud as gc


def positive_int(text, low=1):
    """argparse type: an integer >= 1 (or ``low``), with a message that names the problem."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
    return value


def count(text):
    """argparse type: an integer >= 0."""
    return positive_int(text, low=0)


def step_or_none(text):
    """argparse type: a step number, or -1 for none."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"{value}: a step, or -1 for none")
    return value


def finite_float(low=None, high=None, low_inclusive=False):
    """argparse type: a finite float, optionally within bounds."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not finite")
        if low is not None and (value < low or (value == low and not low_inclusive)):
            raise argparse.ArgumentTypeError(f"{value} must be {'>=' if low_inclusive else '>'} {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} must be <= {high}")
        return value
    return parse


def to_device(array, dtype, device, stream):
    """A new buffer of ``dtype`` on ``device`` holding ``array`` rounded to it (synchronises)."""
    f32 = gc.Buffer(array.shape, "float32", device)
    gc.copy(f32, np.ascontiguousarray(array, np.float32), stream)
    out = gc.Buffer(array.shape, dtype, device)
    gc.cast(out, f32, stream)
    stream.synchronize()
    return out


def to_numpy(view, device, stream):
    """The values of ``view`` (any float dtype, on ``device``) as a float32 NumPy array (synchronises)."""
    f32 = gc.Buffer(view.shape, "float32", device)
    gc.cast(f32, view, stream)
    host = np.empty(view.shape, np.float32)
    gc.copy(host, f32, stream)
    stream.synchronize()
    return host


def brief(metrics):
    """The device's load for a progress line: ``util  37%  mem  1.23 GiB``."""
    util = f"{metrics.utilization:3.0f}%" if metrics.utilization is not None else "   -"
    return f"util {util}  mem {metrics.memory_used / 2**30:5.2f} GiB"


def describe(summary, samples=0):
    """The run's device figures for the final summary (what nvidia-smi would have shown meanwhile),
    with the energy per sample when the device reports energy and ``samples`` (this process's) > 0."""
    parts = [f"device {summary.device}: {summary.samples} readings over {summary.seconds:.1f} s"]
    if summary.utilization.count:
        parts.append(f"util mean {summary.utilization.mean:.0f}% max {summary.utilization.max:.0f}%")
    parts.append(f"memory peak {summary.memory_used.max / 2**30:.2f} GiB")
    if summary.temperature_c.count:
        parts.append(f"temperature max {summary.temperature_c.max:.0f} C")
    if summary.power_w.count:
        parts.append(f"power mean {summary.power_w.mean:.0f} W")
    if summary.energy_j is not None:
        per_sample = f" ({summary.energy_j / samples:.3g} J/sample)" if samples > 0 else ""
        parts.append(f"energy {summary.energy_j:.0f} J{per_sample}")
    else:
        parts.append("energy not measured (no power sensor or energy counter)")
    return ", ".join(parts)
