"""gpucloud.torch on CUDA tensors, as a trainer runs it: on torch's current stream, which is the
legacy default stream (handle 0) unless the code is inside ``with torch.cuda.stream(...)``. The
drop-ins (optimizers, GradScaler) must accept that stream and give torch's results. Runs wherever
torch sees a GPU and gpucloud was built with CUDA (scripts/gpu-check.sh runs it); skipped elsewhere."""
import pytest

import gpucloud as gc

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
if gc.cuda_device_count() == 0:
    pytest.skip(f"gpucloud has no CUDA device: {gc.cuda_unavailable_reason()}", allow_module_level=True)

import gpucloud.torch as gt  # noqa: E402
from gpucloud.torch import _streams  # noqa: E402


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(64, 8, generator=g).cuda(), torch.randn(64, 1, generator=g).cuda()


def test_torchs_default_stream_is_adopted_and_a_stream_context_is_followed():
    dev = torch.device("cuda", torch.cuda.current_device())
    assert torch.cuda.current_stream(dev).cuda_stream == 0  # the legacy default stream
    s = _streams.stream_for(dev)
    assert s.native_handle == 0 and s.device == gc.Device.cuda(dev.index)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        assert _streams.stream_for(dev).native_handle == side.cuda_stream


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_optimizers_on_the_default_stream_follow_torchs(name):
    kwargs = dict(lr=1e-2) if name != "SGD" else dict(lr=0.05, momentum=0.9)
    ours, theirs = make_model(), make_model()
    opt_ours = getattr(gt.optim, name)(ours.parameters(), **kwargs)
    opt_theirs = getattr(torch.optim, name)(theirs.parameters(), **kwargs)
    x, y = batch()
    for _ in range(20):
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            opt.zero_grad(set_to_none=True)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    torch.cuda.synchronize()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_grad_scaler_matches_torchs_on_the_default_stream_and_skips_an_overflow():
    ours, theirs = make_model(), make_model()
    opt_ours, opt_theirs = gt.optim.AdamW(ours.parameters(), lr=1e-2), torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    sc_ours = gt.GradScaler(init_scale=2.0**10, growth_interval=4)
    # torch.amp.GradScaler("cuda") from torch 2.3; torch.cuda.amp's is deprecated there.
    torch_scaler = (lambda **k: torch.amp.GradScaler("cuda", **k)) if hasattr(torch.amp, "GradScaler") else \
        torch.cuda.amp.GradScaler
    sc_theirs = torch_scaler(init_scale=2.0**10, growth_interval=4)
    x, y = batch()
    for step in range(12):
        for model, opt, scaler in ((ours, opt_ours, sc_ours), (theirs, opt_theirs, sc_theirs)):
            opt.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean() * (float("inf") if step == 5 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    torch.cuda.synchronize()
    assert sc_ours.get_scale() == sc_theirs.get_scale()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_step_inside_a_side_stream_stays_on_it():
    model = make_model()
    opt = gt.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert all(torch.isfinite(p).all() for p in model.parameters())
