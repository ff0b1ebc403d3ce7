"""gpucloud.torch's drop-ins misused as torch users do: state dicts that are wrong in one entry,
scalers copied, pickled and torch.save'd mid-run, non-contiguous tensors into checkpoints. Each
case where the interpreter could crash runs in its own process. Skipped without torch (CI's
interop configuration has it)."""
import copy
import io
import math
import pickle
import subprocess
import sys
import textwrap

import pytest

import gpucloud as gc

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
import gpucloud.torch as gt  # noqa: E402

GOOD = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.25, "growth_interval": 10, "_growth_tracker": 7}


def trained_scaler(steps=5, overflow_at=(1,)):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = gt.optim.SGD(model.parameters(), 0.05)
    scaler = gt.GradScaler(init_scale=256.0, growth_interval=3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    for i in range(steps):
        opt.zero_grad()
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        if i in overflow_at:
            next(model.parameters()).grad.view(-1)[0] = math.inf
        scaler.step(opt)
        scaler.update()
    return scaler, model, opt, (x, y)


# ---- GradScaler.load_state_dict: the whole dict checked, then applied -------------------------

BAD_ENTRIES = [
    ("scale", -1.0), ("scale", 0.0), ("scale", math.inf), ("scale", math.nan), ("scale", "1024"), ("scale", None),
    ("growth_factor", 1.0), ("growth_factor", math.nan), ("backoff_factor", 1.5), ("backoff_factor", 0.0),
    ("growth_interval", 0), ("growth_interval", 2.5), ("growth_interval", True),
    ("_growth_tracker", -1), ("_growth_tracker", 10), ("_growth_tracker", 10**9), ("_growth_tracker", 1.5),
]


@pytest.mark.parametrize("key, value", BAD_ENTRIES, ids=[f"{k}={v!r}" for k, v in BAD_ENTRIES])
def test_a_refused_state_dict_changes_nothing(key, value):
    scaler, *_ = trained_scaler()
    before = scaler.state_dict()
    with pytest.raises(gc.InvalidArgument, match=f"state_dict\\['{key}'\\]"):
        scaler.load_state_dict({**GOOD, key: value})
    assert scaler.state_dict() == before
    fresh = gt.GradScaler(init_scale=8.0, growth_interval=4)
    with pytest.raises(gc.InvalidArgument):
        fresh.load_state_dict({**GOOD, key: value})
    assert fresh.get_scale() == 8.0 and fresh.get_growth_interval() == 4


def test_a_tracker_one_below_the_interval_is_accepted_and_grows_at_the_next_finite_step():
    scaler, model, opt, (x, y) = trained_scaler()
    scaler.load_state_dict({**GOOD, "_growth_tracker": 9})
    opt.zero_grad()
    scaler.scale(((model(x) - y) ** 2).mean()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2048.0 and scaler._get_growth_tracker() == 0


def test_tensor_entries_as_torch_saves_them_are_accepted():
    scaler = gt.GradScaler()
    scaler.load_state_dict({**GOOD, "scale": torch.tensor(512.0), "_growth_tracker": torch.tensor(3)})
    assert scaler.state_dict() == {**GOOD, "scale": 512.0, "_growth_tracker": 3}


# ---- pickle, deepcopy, torch.save ---------------------------------------------------------------

@pytest.mark.parametrize("how", ["pickle", "deepcopy", "torch.save"])
def test_a_scaler_that_has_stepped_round_trips(how):
    scaler, model, opt, (x, y) = trained_scaler()
    sd = scaler.state_dict()
    if how == "pickle":
        other = pickle.loads(pickle.dumps(scaler))
    elif how == "deepcopy":
        other = copy.deepcopy(scaler)
    else:
        f = io.BytesIO()
        torch.save({"scaler": scaler}, f)
        f.seek(0)
        other = torch.load(f, weights_only=False)["scaler"]  # a pickled object, not tensors
    assert other.state_dict() == sd
    # Both go on identically: the copy's device state is made at its first scale().
    for s in (scaler, other):
        opt.zero_grad()
        s.scale(((model(x) - y) ** 2).mean()).backward()
        s.unscale_(opt)
        s.update()
    assert other.state_dict() == scaler.state_dict()


def test_a_scaler_mid_iteration_refuses_to_pickle_as_torchs_does():
    scaler, model, opt, (x, y) = trained_scaler()
    opt.zero_grad()
    scaler.scale(((model(x) - y) ** 2).mean()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="may only be pickled"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    pickle.dumps(scaler)


def test_a_disabled_scaler_pickles():
    other = pickle.loads(pickle.dumps(gt.GradScaler(enabled=False)))
    assert not other.is_enabled() and other.state_dict() == {}


# ---- dropped at every point, in a subprocess -----------------------------------------------------

@pytest.mark.parametrize("point", ["after_scale", "after_unscale", "after_step", "after_update"])
def test_dropping_the_scaler_at_any_point_exits_cleanly(point):
    code = textwrap.dedent(f"""
        import gc as pygc, torch
        import gpucloud.torch as gt
        model = torch.nn.Linear(8, 1)
        opt = gt.optim.AdamW(model.parameters())
        scaler = gt.GradScaler()
        loss = scaler.scale(model(torch.randn(4, 8)).sum())
        points = ["after_scale", "after_unscale", "after_step", "after_update"]
        stop = points.index({point!r})
        loss.backward()
        if stop >= 1: scaler.unscale_(opt)
        if stop >= 2: scaler.step(opt)
        if stop >= 3: scaler.update()
        del scaler
        pygc.collect()
        opt.zero_grad()
        print("EXITED", float(next(model.parameters()).sum()) == float(next(model.parameters()).sum()))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "EXITED True" in r.stdout, r.stdout + r.stderr
