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
