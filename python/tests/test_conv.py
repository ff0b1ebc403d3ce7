import numpy as np
import pytest

import gpucloud as gc


def direct_conv(x, w, stride, pad, dil, groups):
    """float64 cross-correlation, NCHW / KCRS, the definition written out."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for kk in range(k):
        g = kk // kg
        for rr in range(r):
            for ss in range(s):
                patch = xp[:, g * cg:(g + 1) * cg, rr * dil[0]:rr * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                           ss * dil[1]:ss * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                y[:, kk] += np.einsum("nchw,c->nhw", patch, w[kk, :, rr, ss].astype(np.float64))
    return y


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_forward_matches_a_direct_convolution(host_stream, layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    ref = direct_conv(x, w, (2, 1), (1, 2), (1, 2), 2)
    if layout == "nhwc":
        x, w = np.ascontiguousarray(x.transpose(0, 2, 3, 1)), np.ascontiguousarray(w.transpose(0, 2, 3, 1))
        ref = ref.transpose(0, 2, 3, 1)
    shape = gc.conv2d_output_size(x.shape, w.shape, layout=layout, **kw)
    assert tuple(shape) == ref.shape
    y = np.full(shape, np.nan, np.float32)
    gc.conv2d_forward(y, x, w, host_stream, layout=layout, **kw)
    host_stream.synchronize()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5


def test_gradients_satisfy_the_adjoint_identities(host_stream):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 7, 7)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    y = np.empty(gc.conv2d_output_size(x.shape, w.shape, stride=2, padding=1), np.float32)
    gc.conv2d_forward(y, x, w, host_stream, stride=2, padding=1)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw = np.empty_like(x), np.empty_like(w)
    gc.conv2d_backward_data(dx, dy, w, host_stream, stride=2, padding=1)
    gc.conv2d_backward_filter(dw, x, dy, host_stream, stride=2, padding=1)
    host_stream.synchronize()
    inner = float((y.astype(np.float64) * dy).sum())
    assert float((x.astype(np.float64) * dx).sum()) == pytest.approx(inner, rel=1e-5)
    assert float((w.astype(np.float64) * dw).sum()) == pytest.approx(inner, rel=1e-5)


def test_fp16_with_fused_bias_relu(host_stream):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    bias = rng.standard_normal(4).astype(np.float16)
    y = np.empty((1, 4, 6, 6), np.float16)
    gc.conv2d_forward(y, x, w, host_stream, padding=1, epilogue="bias_relu", bias=bias)
    host_stream.synchronize()
    ref = np.maximum(direct_conv(x, w, (1, 1), (1, 1), (1, 1), 1) + bias.astype(np.float64)[None, :, None, None], 0)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-2


def test_bad_input_names_the_argument(host_stream):
    x = np.zeros((1, 4, 5, 5), np.float32)
    w = np.zeros((6, 4, 3, 3), np.float32)
    y = np.zeros((1, 6, 3, 3), np.float32)
    with pytest.raises(gc.InvalidArgument, match="y: shape"):
        gc.conv2d_forward(np.zeros((1, 6, 4, 4), np.float32), x, w, host_stream)
    with pytest.raises(gc.InvalidArgument, match="groups"):
        gc.conv2d_forward(y, x, np.zeros((6, 2, 3, 3), np.float32), host_stream, groups=3)
    with pytest.raises(gc.InvalidArgument, match="smaller than one element"):
        gc.conv2d_output_size((1, 4, 2, 2), (6, 4, 3, 3))
    with pytest.raises(gc.InvalidArgument, match="filter: dtype float16"):
        gc.conv2d_forward(y, x, w.astype(np.float16), host_stream)
    with pytest.raises(gc.InvalidArgument, match="4-D"):
        gc.conv2d_forward(y, x[0], w, host_stream)
    with pytest.raises(gc.InvalidArgument, match="layout"):
        gc.conv2d_forward(y, x, w, host_stream, layout="chwn")
