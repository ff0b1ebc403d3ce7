"""What the Python training examples share: values into and out of buffers of any float dtype on
any device (through float32, since NumPy has no bfloat16). The examples import it from their own
directory, which Python puts on the path when it runs them."""
import numpy as np

import gpucloud as gc


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


def describe(summary):
    """The run's device figures for the final summary (what nvidia-smi would have shown meanwhile)."""
    parts = [f"device {summary.device}: {summary.samples} readings over {summary.seconds:.1f} s"]
    if summary.utilization.count:
        parts.append(f"util mean {summary.utilization.mean:.0f}% max {summary.utilization.max:.0f}%")
    parts.append(f"memory peak {summary.memory_used.max / 2**30:.2f} GiB")
    if summary.temperature_c.count:
        parts.append(f"temperature max {summary.temperature_c.max:.0f} C")
    if summary.power_w.count:
        parts.append(f"power mean {summary.power_w.mean:.0f} W")
    if summary.energy_j is not None:
        parts.append(f"energy {summary.energy_j:.0f} J")
    return ", ".join(parts)
