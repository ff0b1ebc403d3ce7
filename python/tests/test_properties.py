"""Property-based tests (hypothesis) of the public Python functions: shapes, dtypes, strides,
aliasing and argument types drawn at random, each result checked against NumPy.

CI runs the "ci" profile: a fixed seed (derandomized) and a bounded number of examples per test.
For a longer local hunt:

    GPUCLOUD_HYPOTHESIS_PROFILE=long python -m pytest python/tests/test_properties.py

Every call must either give NumPy's answer or raise a typed error: TypeError for a value of the
wrong type, gpucloud.Error (InvalidArgument, ...) for a bad value. Never a crash, a bare
RuntimeError from a failed conversion, or a silent wrong answer.
"""
import os
import tempfile

import numpy as np
import pytest

import gpucloud as gc

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install hypothesis)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

settings.register_profile("ci", max_examples=60, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mid", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("GPUCLOUD_HYPOTHESIS_PROFILE", "ci"))

NUMERIC = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9)


def typed_error(e):
    """An error a user can catch by kind: TypeError, or one of gpucloud's typed errors."""
    return isinstance(e, (TypeError, gc.Error))


# ---- copy, cast and fill against NumPy ---------------------------------------------------------

@given(shape=shapes, dtype=st.sampled_from(NUMERIC), data=st.data())
def test_copy_is_byte_identical(shape, dtype, data):
    src = data.draw(hnp.arrays(dtype, shape))
    dst = np.zeros_like(src)
    s = gc.Stream()
    gc.copy(dst, src, s)
    s.synchronize()
    assert dst.tobytes() == src.tobytes()


@given(shape=shapes, src_t=st.sampled_from(NUMERIC), dst_t=st.sampled_from([np.float32, np.float64, np.int32,
                                                                            np.int64]), data=st.data())
def test_cast_matches_numpy_where_numpy_is_defined(shape, src_t, dst_t, data):
    # Values every target holds exactly (NumPy's out-of-range float->int casts are undefined).
    elements = st.integers(-1000, 1000) if np.dtype(src_t).kind in "iu" else st.floats(-1000, 1000, width=16)
    if np.dtype(src_t) == np.uint8:
        elements = st.integers(0, 255)
    src = data.draw(hnp.arrays(src_t, shape, elements=elements))
    dst = np.zeros(shape, dst_t)
    s = gc.Stream()
    gc.cast(dst, src, s)
    s.synchronize()
    expect = np.trunc(src.astype(np.float64)).astype(dst_t) if np.dtype(dst_t).kind == "i" else src.astype(dst_t)
    np.testing.assert_array_equal(dst, expect)


@given(shape=shapes, value=st.integers(-2**63, 2**63 - 1))
def test_integer_fill_is_exact(shape, value):
    dst = np.zeros(shape, np.int64)
    s = gc.Stream()
    gc.fill(dst, value, s)
    s.synchronize()
    assert (dst == value).all()


@given(shape=shapes, dtype=st.sampled_from([np.float32, np.float64]),
       value=st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_float_fill(shape, dtype, value):
    dst = np.zeros(shape, dtype)
    s = gc.Stream()
    gc.fill(dst, value, s)
    s.synchronize()
    assert (dst == dtype(value)).all()


# ---- GEMM against a float64 reference --------------------------------------------------------

@given(m=st.integers(0, 17), n=st.integers(0, 17), k=st.integers(0, 17), trans_a=st.booleans(),
       trans_b=st.booleans(), alpha=st.sampled_from([1.0, -0.5, 2.0]), beta=st.sampled_from([0.0, 1.0, 0.25]),
       seed=st.integers(0, 2**32 - 1))
def test_gemm_matches_float64(m, n, k, trans_a, trans_b, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    ref = alpha * ((a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)) \
        + beta * c.astype(np.float64)
    s = gc.Stream()
    gc.gemm(c, a, b, s, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    s.synchronize()
    scale = max(float(np.abs(ref).max(initial=0.0)), 1.0)
    assert float(np.abs(c - ref).max(initial=0.0)) <= 1e-5 * scale * max(k, 1)


# ---- strides, aliasing -----------------------------------------------------------------------

@given(rows=st.integers(2, 8), cols=st.integers(2, 8), step=st.integers(2, 3))
def test_non_contiguous_memory_is_refused_not_misread(rows, cols, step):
    base = np.arange(rows * cols * step, dtype=np.float32).reshape(rows, cols * step)
    view = base[:, ::step]
    dst = np.zeros((rows, cols), np.float32)
    s = gc.Stream()
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.copy(dst, view, s)
    with pytest.raises(gc.InvalidArgument, match="non-contiguous"):
        gc.copy(view, dst, s)
    s.synchronize()


@given(n=st.integers(1, 50), at=st.integers(0, 49), length=st.integers(1, 50))
def test_overlapping_copies_are_refused(n, at, length):
    buf = gc.Buffer(120, "float32")
    a = np.asarray(buf)
    src, dst = a[:n], a[at:at + length]
    s = gc.Stream()
    if len(dst) != len(src):
        with pytest.raises(gc.Error):
            gc.copy(dst, src, s)
    elif at < n:  # the ranges share elements
        with pytest.raises(gc.InvalidArgument, match="overlaps"):
            gc.copy(dst, src, s)
    else:
        gc.copy(dst, src, s)
    s.synchronize()


@given(count=st.integers(1, 6), duplicate=st.integers(0, 5), data=st.data())
def test_a_tensor_listed_twice_is_refused_by_the_fused_passes(count, duplicate, data):
    grads = [np.full(data.draw(st.integers(1, 40)), 2.0, np.float32) for _ in range(count)]
    listed = grads + [grads[duplicate % count]]
    s = gc.Stream()
    scaler = gc.LossScaler(gc.Device.host(), s)
    with pytest.raises(gc.InvalidArgument, match="overlaps"):
        scaler.unscale(listed, s)
    with pytest.raises(gc.InvalidArgument, match="overlaps"):
        gc.global_norm(listed, s)
    with pytest.raises(gc.InvalidArgument, match="overlaps"):
        gc.FusedSGD([(g, g) for g in grads[:1]], s)
    scaler.unscale(grads, s)  # each once: fine
    s.synchronize()
    assert all((g == 2.0 / 65536).all() for g in grads)


@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=8),
       dtypes=st.lists(st.sampled_from(["float32", "float16"]), min_size=8, max_size=8),
       poison=st.one_of(st.none(), st.tuples(st.integers(0, 7), st.sampled_from([np.inf, -np.inf, np.nan]))))
def test_unscale_finds_any_non_finite_value(sizes, dtypes, poison):
    grads = [np.full(n, 1024.0, dtypes[i]) for i, n in enumerate(sizes)]
    target = None
    if poison is not None:
        candidates = [i for i, g in enumerate(grads) if g.size > 0]
        if candidates:
            target = candidates[poison[0] % len(candidates)]
            grads[target][grads[target].size // 2] = poison[1]
    s = gc.Stream()
    scaler = gc.LossScaler(gc.Device.host(), s, init_scale=1024.0)
    scaler.unscale(grads, s)
    state = scaler.state(s)
    assert state.found_inf == (target is not None)
    for i, g in enumerate(grads):
        finite = g[np.isfinite(g)]
        assert (finite == 1.0).all(), (i, g)


# ---- argument types: a typed error naming the argument, never a crash ------------------------

junk = st.one_of(st.none(), st.text(max_size=5), st.floats(allow_nan=True), st.integers(-2**70, 2**70),
                 st.lists(st.integers(-3, 3), max_size=3), st.binary(max_size=4), st.just(object()))


@given(shape=junk)
def test_buffer_shapes_of_any_type(shape):
    try:
        b = gc.Buffer(shape, "float32")
    except Exception as e:  # noqa: BLE001 - the point is which kind
        assert typed_error(e), repr(e)
    else:
        n = int(np.prod(b.shape)) if b.shape else 1
        assert b.size == n


@given(dtype=junk, device=junk, kind=junk)
def test_buffer_dtype_device_kind_of_any_type(dtype, device, kind):
    with pytest.raises(Exception) as info:
        gc.Buffer(4, dtype, device, kind)
    assert typed_error(info.value), repr(info.value)


@given(value=junk)
def test_fill_values_of_any_type(value):
    dst = np.zeros(4, np.float64)
    s = gc.Stream()
    try:
        gc.fill(dst, value, s)
        s.synchronize()
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), repr(e)


@given(arg=junk, which=st.sampled_from(["stride", "padding", "dilation", "groups"]))
def test_conv_geometry_of_any_type(arg, which):
    x = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((2, 2, 3, 3), np.float32)
    try:
        gc.conv2d_output_size(x.shape, w.shape, **{which: arg})
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), repr(e)


@given(a=junk, b=junk)
def test_operations_given_junk_arrays(a, b):
    s = gc.Stream()
    for call in (lambda: gc.copy(a, b, s), lambda: gc.cast(a, b, s), lambda: gc.global_norm([a], s),
                 lambda: gc.FusedSGD([(a, b)], s), lambda: gc.gemm(a, b, b, s)):
        with pytest.raises(Exception) as info:
            call()
        assert typed_error(info.value), repr(info.value)
    s.synchronize()


PUBLIC_FUNCTIONS = sorted(name for name in dir(gc) if not name.startswith("_") and callable(getattr(gc, name))
                          and not isinstance(getattr(gc, name), type))


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
@given(args=st.lists(junk, max_size=5))
def test_every_public_function_given_junk_raises_a_typed_error(name, args):
    """Every module-level function, called with 0-5 arguments of any type: it works or raises a
    TypeError or a gpucloud error, never a crash or a bare RuntimeError."""
    try:
        getattr(gc, name)(*args)
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), f"{name}{tuple(args)!r}: {e!r}"


PUBLIC_CLASSES = sorted(name for name in dir(gc) if not name.startswith("_") and isinstance(getattr(gc, name), type)
                        and not issubclass(getattr(gc, name), BaseException))


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
@given(args=st.lists(junk, max_size=4))
def test_every_public_class_constructed_from_junk_raises_a_typed_error(name, args):
    try:
        getattr(gc, name)(*args)
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), f"{name}{tuple(args)!r}: {e!r}"


@given(args=st.lists(junk, max_size=3), method=st.sampled_from(
    ["synchronize", "wait", "query", "__cuda_stream__"]))
def test_stream_methods_given_junk(args, method):
    s = gc.Stream()
    try:
        getattr(s, method)(*args)
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), f"Stream.{method}{tuple(args)!r}: {e!r}"


CHECKPOINT_CALLABLES = sorted(n for n in gc.checkpoint.__all__ if callable(getattr(gc.checkpoint, n))
                              and not (isinstance(getattr(gc.checkpoint, n), type)
                                       and issubclass(getattr(gc.checkpoint, n), BaseException)))
SCRATCH = tempfile.mkdtemp(prefix="gpucloud_properties_")


@pytest.mark.parametrize("name", CHECKPOINT_CALLABLES)
@given(args=st.lists(junk, max_size=5))
def test_every_checkpoint_call_given_junk_raises_a_typed_error(name, args):
    """gpucloud.checkpoint's functions and classes, in a scratch directory (a junk root is a path)."""
    cwd = os.getcwd()
    os.chdir(SCRATCH)
    try:
        getattr(gc.checkpoint, name)(*args)
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), f"checkpoint.{name}{tuple(args)!r}: {e!r}"
    finally:
        os.chdir(cwd)


TELEMETRY_CALLABLES = sorted(n for n in gc.telemetry.__all__ if callable(getattr(gc.telemetry, n)))


@pytest.mark.parametrize("name", TELEMETRY_CALLABLES)
@given(args=st.lists(junk, max_size=4))
def test_every_telemetry_call_given_junk_raises_a_typed_error(name, args):
    """gpucloud.telemetry's functions and classes. A first argument that is a real port is left out:
    junk must not bind arbitrary ports of the machine the tests run on."""
    if args and isinstance(args[0], int) and not isinstance(args[0], bool) and 1 <= args[0] <= 65535:
        args = ["x", *args[1:]]
    try:
        getattr(gc.telemetry, name)(*args)
    except Exception as e:  # noqa: BLE001
        assert typed_error(e), f"telemetry.{name}{tuple(args)!r}: {e!r}"
