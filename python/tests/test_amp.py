import numpy as np
import pytest

import gpucloud as gc


def test_scaler_defaults_are_gradscalers():
    o = gc.LossScalerOptions()
    assert (o.init_scale, o.growth_factor, o.backoff_factor, o.growth_interval) == (65536.0, 2.0, 0.5, 2000)
    assert o.hysteresis == 1 and o.min_scale == 0.0 and o.dynamic


def test_unscale_and_the_update_rule(device, stream):
    scaler = gc.LossScaler(device, stream, init_scale=8.0, growth_interval=2)
    g = gc.Buffer(5, "float16", device)
    gc.copy(g, np.array([8, 16, -24, 0, 4], np.float16), stream)
    assert scaler.unscale([g], stream) == 1
    out = np.empty(5, np.float16)
    gc.copy(out, g, stream)
    state = scaler.state(stream)
    np.testing.assert_array_equal(out, [1, 2, -3, 0, 0.5])
    assert not state.found_inf
    trajectory = []
    for overflow in (False, False, True, False, False, False):
        gc.fill(g, np.inf if overflow else 1.0, stream)
        scaler.unscale([g], stream)
        scaler.update(stream)
        s = scaler.state(stream)
        trajectory.append((s.scale, s.growth_tracker))
    assert trajectory == [(8, 1), (16, 0), (8, 0), (8, 1), (16, 0), (16, 1)]
    with pytest.raises(gc.InvalidArgument, match="growth_interval"):
        gc.LossScaler(device, stream, growth_interval=0)


def test_fused_adamw_matches_a_numpy_reference(host_stream):
    stream = host_stream
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1000).astype(np.float32)
    g = np.zeros_like(w)
    ref = w.astype(np.float64)
    m = np.zeros_like(ref)
    v = np.zeros_like(ref)
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
    opt = gc.FusedAdam([(w, g)], stream, lr=lr, weight_decay=wd, decoupled_weight_decay=True)
    for step in range(1, 21):
        g[:] = rng.standard_normal(1000).astype(np.float32)
        opt.step(stream)
        ref *= 1 - lr * wd
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
        ref -= lr / (1 - b1**step) * m / (np.sqrt(v) / np.sqrt(1 - b2**step) + eps)
        stream.synchronize()
    np.testing.assert_allclose(w, ref, rtol=2e-6, atol=2e-6)
    assert opt.step_count(stream) == 20
    assert opt.master(0).size == 0  # fp32 parameters need no master


def test_clip_grad_norm_matches_numpy(host_stream):
    stream = host_stream
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(70000).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    norm = float(np.sqrt((a.astype(np.float64) ** 2).sum() + (b.astype(np.float64) ** 2).sum()))
    expected = a * (5.0 / (norm + 1e-6))
    total = gc.clip_grad_norm([a, b], 5.0, stream)
    stream.synchronize()
    assert np.asarray(total)[0] == pytest.approx(norm, rel=1e-5)
    np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-7)
    clipped = gc.global_norm([a, b], stream)
    stream.synchronize()
    assert np.asarray(clipped)[0] == pytest.approx(5.0, rel=1e-5)


def test_loss_scaler_drives_a_numpy_fp16_model(host_stream):
    """A NumPy MLP-free regression in fp16 with fp32 masters: the scaled fp16 gradients overflow at the
    initial scale, the scaler backs off, the skipped steps are decided on the 'device', and the model trains."""
    stream = host_stream
    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    w_true = (3 * rng.standard_normal(32)).astype(np.float32)
    y = x @ w_true
    w16 = np.zeros(32, np.float16)
    g16 = np.zeros(32, np.float16)
    scaler = gc.LossScaler(gc.Device.host(), stream)
    opt = gc.FusedSGD([(w16, g16)], stream, lr=0.05, momentum=0.5)
    losses, skipped = [], 0
    for _ in range(300):
        stream.synchronize()
        residual = x @ w16.astype(np.float32) - y
        losses.append(float(np.mean(residual**2)))
        scale = scaler.state(stream).scale
        with np.errstate(over="ignore"):
            g16[:] = (2 * x.T @ residual / len(y) * scale).astype(np.float16)  # scaled backward in fp16
        scaler.unscale([g16], stream)
        skipped += scaler.state(stream).found_inf
        opt.step(stream, scaler)
        scaler.update(stream)
    stream.synchronize()
    assert skipped > 0 and scaler.state(stream).scale < 65536
    assert opt.step_count(stream) == 300 - skipped
    assert losses[-1] < 1e-2 * losses[0]
    np.testing.assert_array_equal(w16, np.asarray(opt.master(0)).astype(np.float16))


def test_bad_optimizer_input(host_stream):
    stream = host_stream
    w = np.zeros(4, np.float32)
    with pytest.raises(gc.InvalidArgument, match="grad"):
        gc.FusedSGD([(w, np.zeros(3, np.float32))], stream)
    with pytest.raises(gc.InvalidArgument, match="nesterov"):
        gc.FusedSGD([(w, np.zeros(4, np.float32))], stream, nesterov=True)
    with pytest.raises(gc.InvalidArgument, match="beta"):
        gc.FusedAdam([(w, np.zeros(4, np.float32))], stream, betas=(1.0, 0.999))
    frozen = np.zeros(4, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(gc.InvalidArgument, match="read-only"):
        gc.FusedSGD([(frozen, np.zeros(4, np.float32))], stream)
