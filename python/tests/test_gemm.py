import numpy as np
import pytest

import gpucloud as gc


def rel_err(got, ref):
    return np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)


def test_fp32_matches_numpy_with_transposes_batches_and_epilogues(host_stream):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 13, 31)).astype(np.float32)
    b = rng.standard_normal((3, 7, 31)).astype(np.float32)  # transposed: c = a @ b^T
    bias = rng.standard_normal(7).astype(np.float32)
    c = np.full((3, 13, 7), np.nan, np.float32)
    gc.gemm(c, a, b, host_stream, trans_b=True, alpha=0.5, epilogue="bias_relu", bias=bias)
    host_stream.synchronize()
    ref = np.maximum(0.5 * a.astype(np.float64) @ b.transpose(0, 2, 1) + bias, 0)
    assert rel_err(c, ref) < 1e-5


def test_fp16_inputs_with_a_shared_weight_and_beta(host_stream):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 16, 64)).astype(np.float16)
    w = rng.standard_normal((64, 32)).astype(np.float16)  # one weight for every batch
    c0 = rng.standard_normal((4, 16, 32)).astype(np.float32)
    c = c0.copy()
    gc.gemm(c, x, w, host_stream, beta=1.0)
    host_stream.synchronize()
    ref = x.astype(np.float64) @ w.astype(np.float64) + c0
    assert rel_err(c, ref) < 1e-2
    out16 = np.zeros((4, 16, 32), np.float16)
    gc.gemm(out16, x, w, host_stream, epilogue="gelu")
    host_stream.synchronize()
    z = x.astype(np.float64) @ w.astype(np.float64)
    gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    assert rel_err(out16, gelu) < 1e-2


def test_shape_errors_name_the_argument(host_stream):
    a = np.zeros((5, 4), np.float32)
    b = np.zeros((3, 6), np.float32)
    c = np.zeros((5, 6), np.float32)
    with pytest.raises(gc.InvalidArgument, match="b: shape"):
        gc.gemm(c, a, b, host_stream)
    with pytest.raises(gc.InvalidArgument, match="epilogue"):
        gc.gemm(c, a, np.zeros((4, 6), np.float32), host_stream, epilogue="swish")
    with pytest.raises(gc.InvalidArgument, match="dimensions"):
        gc.gemm(np.zeros(30, np.float32), a, np.zeros((4, 6), np.float32), host_stream)


def test_spec_table():
    h200 = gc.find_gpu_spec("NVIDIA H200")
    assert h200.name == "H200 SXM" and h200.memory_bw_gbs == 4800
    assert gc.peak_tflops(h200, gc.Precision.bf16) == 989
    assert len(gc.gpu_specs()) == 9
    assert gc.supports(gc.Device.host(), gc.Precision.fp8)
