"""gpucloud.torch: GradScaler and optim.AdamW/Adam/SGD as drop-ins for torch's, trained against
torch's own on the same model, data and seed (CPU; torch's GradScaler needs CUDA in 1.13, so its
rule is written out here). Skipped where torch is not importable (CI's interop configuration has
Debian's python3-torch)."""
import math
import os
import shutil
import subprocess
import sys

import pytest

import gpucloud as gc

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
import gpucloud.torch as gt  # noqa: E402
from ports import free_port  # noqa: E402

STEPS = 50


def torch_sgd_keeps_empty_state():
    """torch 1.13's SGD keeps {'momentum_buffer': None} for a parameter stepped without momentum;
    torch 2's keeps no entry."""
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.zeros(1)
    opt = torch.optim.SGD([p], lr=0.1)
    opt.step()
    return bool(opt.state_dict()["state"])


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Tanh(),
                            torch.nn.Linear(4, 1))
    return m.to(dtype)


def data(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)


def groups(model, **second):
    """Two parameter groups: the first layer with the defaults, the rest with ``second``'s settings."""
    params = list(model.parameters())
    return [{"params": params[:2]}, {"params": params[2:], **second}]


def flat(model):
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


def train(model, opt, steps=STEPS, sched=None, set_to_none=True, x_y=None):
    x, y = x_y or data()
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return flat(model)


OPTIMIZERS = [
    ("AdamW", dict(lr=1e-2), dict(lr=3e-3, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, weight_decay=1e-3), dict(betas=(0.8, 0.99), eps=1e-6)),
    ("Adam", dict(lr=1e-2, amsgrad=True), dict(weight_decay=0.05)),
    ("SGD", dict(lr=0.05, momentum=0.9), dict(lr=0.01, nesterov=True, weight_decay=1e-3)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1), dict(weight_decay=1e-2)),
    ("SGD", dict(lr=0.05), dict(lr=0.02)),
]


@pytest.mark.parametrize("name, kwargs, second", OPTIMIZERS)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_each_optimizer_follows_torch_with_groups_and_a_scheduler(name, kwargs, second, set_to_none):
    ref_model, our_model = make_model(), make_model()
    ref = getattr(torch.optim, name)(groups(ref_model, **second), **kwargs)
    ours = getattr(gt.optim, name)(groups(our_model, **second), **kwargs)
    assert isinstance(ours, torch.optim.Optimizer)
    ref_w = train(ref_model, ref, sched=torch.optim.lr_scheduler.ExponentialLR(ref, 0.97), set_to_none=set_to_none)
    our_w = train(our_model, ours, sched=torch.optim.lr_scheduler.ExponentialLR(ours, 0.97), set_to_none=set_to_none)
    assert not torch.equal(our_w, flat(make_model())), "the weights must move"
    assert torch.allclose(our_w, ref_w, rtol=1e-5, atol=1e-5), (our_w - ref_w).abs().max()
    assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in ref.param_groups]


def test_defaults_are_torchs():
    p = [torch.nn.Parameter(torch.zeros(3))]
    assert gt.optim.AdamW(p).defaults["weight_decay"] == torch.optim.AdamW(p).defaults["weight_decay"] == 0.01
    assert gt.optim.Adam(p).defaults["weight_decay"] == 0.0
    for k in ("lr", "betas", "eps", "amsgrad"):
        assert gt.optim.AdamW(p).defaults[k] == torch.optim.AdamW(p).defaults[k], k


def test_hyperparameters_changed_between_steps_take_effect():
    ref_model, our_model = make_model(), make_model()
    ref, ours = torch.optim.AdamW(ref_model.parameters(), 1e-2), gt.optim.AdamW(our_model.parameters(), 1e-2)
    for opt in (ref, ours):
        train(ref_model if opt is ref else our_model, opt, steps=10)
        opt.param_groups[0]["betas"] = (0.5, 0.9)
        opt.param_groups[0]["weight_decay"] = 0.3
        opt.param_groups[0]["eps"] = 1e-4
    assert torch.allclose(train(our_model, ours, 10), train(ref_model, ref, 10), rtol=1e-5, atol=1e-5)


def test_add_param_group_and_a_closure():
    ref_model, our_model = make_model(), make_model()
    ref_p, our_p = list(ref_model.parameters()), list(our_model.parameters())
    ref, ours = torch.optim.Adam(ref_p[:2], 1e-2), gt.optim.Adam(our_p[:2], 1e-2)
    x, y = data()
    for model, opt, params in ((ref_model, ref, ref_p), (our_model, ours, our_p)):
        train(model, opt, 5)
        opt.add_param_group({"params": params[2:], "lr": 5e-3})

        def closure(model=model, opt=opt):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            return loss

        losses = [float(opt.step(closure).detach()) for _ in range(5)]
        assert losses[-1] < losses[0]
    assert torch.allclose(flat(our_model), flat(ref_model), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, kwargs", [("AdamW", dict(lr=1e-2)), ("Adam", dict(lr=1e-2, amsgrad=True)),
                                          ("SGD", dict(lr=0.05, momentum=0.9))])
@pytest.mark.parametrize("direction", ["torch->gpucloud", "gpucloud->torch"])
def test_state_dicts_are_interchangeable_with_torchs(name, kwargs, direction, tmp_path):
    """Train 20 steps with one, save, resume with the other for 20: the weights of 40 steps with torch."""
    straight_model = make_model()
    straight = train(straight_model, getattr(torch.optim, name)(straight_model.parameters(), **kwargs), 40)
    first_cls, second_cls = ((getattr(torch.optim, name), getattr(gt.optim, name)) if direction == "torch->gpucloud"
                             else (getattr(gt.optim, name), getattr(torch.optim, name)))
    model = make_model()
    first = first_cls(model.parameters(), **kwargs)
    train(model, first, 20)
    torch.save({"model": model.state_dict(), "opt": first.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=False)
    resumed_model = make_model(seed=5)
    resumed_model.load_state_dict(ck["model"])
    second = second_cls(resumed_model.parameters(), **kwargs)
    second.load_state_dict(ck["opt"])
    resumed = train(resumed_model, second, 20)
    assert torch.allclose(resumed, straight, rtol=1e-5, atol=1e-5), (resumed - straight).abs().max()


def test_state_tensors_are_views_of_the_fused_state():
    model = make_model()
    opt = gt.optim.AdamW(model.parameters(), 1e-2)
    train(model, opt, 3)
    p = next(model.parameters())
    st = opt.state[p]
    assert st["exp_avg"].shape == p.shape and st["exp_avg"].dtype == torch.float32
    before = st["exp_avg"].clone()
    train(model, opt, 1)
    assert not torch.equal(before, st["exp_avg"]), "the view follows the fused optimizer's memory"
    assert float(opt.state_dict()["state"][0]["step"]) == 4.0


def test_a_foreign_or_wrong_state_dict_is_an_error_naming_the_key():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    train(model, sgd, 2)
    adam = gt.optim.AdamW(make_model().parameters())
    with pytest.raises(gc.InvalidArgument, match=r"param_groups\[0\]\['betas'\]: missing"):
        adam.load_state_dict(sgd.state_dict())
    sd = sgd.state_dict()
    sd["param_groups"][0].update(betas=(0.9, 0.999), eps=1e-8, amsgrad=False)
    with pytest.raises(gc.InvalidArgument, match=r"state\[0\]\['exp_avg'\]: missing"):
        adam.load_state_dict(sd)
    assert not adam.state, "nothing was loaded"
    with pytest.raises(gc.InvalidArgument, match="'state' and 'param_groups'"):
        adam.load_state_dict({"exp_avg": 1})
    with pytest.raises(ValueError, match="different number of parameter groups"):
        adam.load_state_dict({"state": {}, "param_groups": []})
    ref = torch.optim.AdamW(model.parameters())
    train(model, ref, 2)
    sd = ref.state_dict()
    sd["state"][1]["step"] = torch.tensor(7.0)  # per-parameter step counts, as torch keeps them
    loaded = gt.optim.AdamW(make_model().parameters())
    loaded.load_state_dict(sd)
    assert [float(v["step"]) for v in loaded.state_dict()["state"].values()] == [2.0, 7.0] + [2.0] * 4


def test_a_group_flag_the_kernels_cannot_follow_is_refused_at_the_step():
    model = make_model()
    opt = gt.optim.AdamW(model.parameters())
    opt.param_groups[0]["capturable"] = True
    with pytest.raises(gc.Unsupported, match="capturable"):
        train(model, opt, 1)
    opt.param_groups[0]["capturable"] = False
    train(model, opt, 1)
    with pytest.raises(ValueError, match="lr"):
        gt.optim.SGD(model.parameters(), lr=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        gt.optim.SGD(model.parameters(), nesterov=True)


def _gradient_schedule(model, opt, steps, swap_at=None):
    """Steps where the parameters getting a gradient change, as in real jobs: the last layer frozen
    for the first steps (unfrozen at step 3), the middle one without a gradient at steps 5-6, and
    (``swap_at``) the first weight's ``.data`` replaced by another tensor of the same values + 0.1,
    as weight tying, EMA swaps or fine-tuning code do."""
    params = list(model.parameters())
    x, y = data()
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        if i < 3:
            params[-1].grad = params[-2].grad = None
        if 5 <= i < 7:
            params[2].grad = params[3].grad = None
        if swap_at is not None and i == swap_at:
            with torch.no_grad():
                params[0].data = params[0].detach() + 0.1
        opt.step()
    return flat(model)


@pytest.mark.parametrize("name, kwargs, second", OPTIMIZERS)
def test_parameters_without_a_gradient_are_skipped_and_picked_up_later_as_torch(name, kwargs, second):
    ref_model, our_model = make_model(), make_model()
    ref = getattr(torch.optim, name)(groups(ref_model, **second), **kwargs)
    ours = getattr(gt.optim, name)(groups(our_model, **second), **kwargs)
    ref_w = _gradient_schedule(ref_model, ref, 12, swap_at=8)
    our_w = _gradient_schedule(our_model, ours, 12, swap_at=8)
    assert torch.allclose(our_w, ref_w, rtol=1e-5, atol=1e-5), (our_w - ref_w).abs().max()
    ref_sd, our_sd = ref.state_dict(), ours.state_dict()
    for pid, state in ref_sd["state"].items():  # per-parameter step counts and state, as torch's
        for key, value in state.items():
            mine = our_sd["state"][pid][key]
            if value is None:  # SGD without momentum keeps no buffer
                assert mine is None, (pid, key)
                continue
            assert torch.allclose(mine.float(), value.float(), rtol=1e-5, atol=1e-6), (pid, key)
    # The state dict of a job whose parameters stepped unevenly loads into both, and training goes on alike.
    ref2, ours2 = make_model(), make_model()
    ref2.load_state_dict(ref_model.state_dict())
    ours2.load_state_dict(ref_model.state_dict())
    a = getattr(torch.optim, name)(groups(ref2, **second), **kwargs)
    b = getattr(gt.optim, name)(groups(ours2, **second), **kwargs)
    a.load_state_dict(ref_sd)
    b.load_state_dict(ref_sd)
    assert torch.allclose(train(ours2, b, 5), train(ref2, a, 5), rtol=1e-5, atol=1e-5)


def test_a_parameter_whose_data_changes_size_is_refused_by_name():
    model = make_model()
    opt = gt.optim.AdamW(model.parameters())
    train(model, opt, 1)
    first = next(model.parameters())
    first.data = torch.zeros(3)
    model.zero_grad()
    first.grad = torch.ones(3)
    with pytest.raises(gc.InvalidArgument, match=r"param_groups\[0\]\['params'\]\[0\]: 3 elements"):
        opt.step()


@pytest.mark.parametrize("name, kwargs", [("AdamW", dict(lr=1e-2)), ("SGD", dict(lr=0.05, momentum=0.9))])
def test_non_contiguous_parameters_and_gradients_step_as_torch(name, kwargs):
    def run(cls):
        torch.manual_seed(3)
        w = torch.nn.Parameter(torch.randn(4, 8).t())  # 8x4, transposed storage: non-contiguous
        b = torch.nn.Parameter(torch.randn(4, 2)[:, 0])  # a strided column
        opt = cls([w, b], **kwargs)
        x, y = data()
        for _ in range(10):
            opt.zero_grad()
            ((torch.tanh(x @ w + b).sum(1, keepdim=True) - y) ** 2).mean().backward()
            assert not w.is_contiguous() and not b.is_contiguous()
            opt.step()
        return torch.cat([w.detach().flatten(), b.detach().flatten()])
    ours, ref = run(getattr(gt.optim, name)), run(getattr(torch.optim, name))
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-6), (ours - ref).abs().max()


def _mixed_parameters(seed=5, complex_dtypes=(torch.complex64, torch.complex128)):
    """float32 (the fused kernels), float64, complex64 and complex128 parameters (torch's math)."""
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(6, 8)), torch.nn.Parameter(torch.randn(6, 8, dtype=torch.float64)),
            torch.nn.Parameter(torch.randn(5, dtype=complex_dtypes[0])),
            torch.nn.Parameter(torch.randn(2, 3, dtype=complex_dtypes[1]))]


def _train_mixed(params, opt, steps, sched=None):
    x, _ = data()
    for _ in range(steps):
        opt.zero_grad()
        loss = (torch.tanh(x @ params[0].t()).sum() + torch.tanh(x.double() @ params[1].t()).sum().float()
                + torch.sin(params[2]).abs().sum() + (params[3] * params[3].conj()).real.sum().float())
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("name, kwargs, second", OPTIMIZERS)
def test_float64_and_complex_parameters_step_as_torch_in_the_same_groups_and_state_dict(name, kwargs, second):
    # torch's amsgrad takes no complex parameters (torch.maximum): float64 stands in for them there
    dtypes = (torch.float64, torch.float64) if kwargs.get("amsgrad") else (torch.complex64, torch.complex128)
    ref_p, our_p = _mixed_parameters(complex_dtypes=dtypes), _mixed_parameters(complex_dtypes=dtypes)
    ref = getattr(torch.optim, name)([{"params": ref_p[:2]}, {"params": ref_p[2:], **second}], **kwargs)
    ours = getattr(gt.optim, name)([{"params": our_p[:2]}, {"params": our_p[2:], **second}], **kwargs)
    ref_w = _train_mixed(ref_p, ref, 15, torch.optim.lr_scheduler.ExponentialLR(ref, 0.9))
    our_w = _train_mixed(our_p, ours, 15, torch.optim.lr_scheduler.ExponentialLR(ours, 0.9))
    assert not torch.equal(our_w[1], _mixed_parameters(complex_dtypes=dtypes)[1]), "the weights must move"
    assert torch.allclose(our_w[0], ref_w[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(our_w[1:], ref_w[1:]):  # torch's own math: the same numbers
        assert a.dtype == b.dtype and torch.equal(a, b), (a - b).abs().max()
    # One state dict: torch's loads into ours and ours into torch's, and both go on alike.
    ref_sd, our_sd = ref.state_dict(), ours.state_dict()
    # every parameter has stepped; torch 2's SGD without momentum keeps no entry for them (1.13: None)
    empty = name == "SGD" and not kwargs.get("momentum") and not torch_sgd_keeps_empty_state()
    assert sorted(our_sd["state"]) == sorted(ref_sd["state"]) == ([] if empty else [0, 1, 2, 3])
    for pid in sorted(ref_sd["state"])[1:]:
        for key, value in ref_sd["state"][pid].items():
            assert value is None and our_sd["state"][pid][key] is None or torch.equal(our_sd["state"][pid][key],
                                                                                      value), (pid, key)
    a_p, b_p = [p.detach().clone().requires_grad_() for p in ref_w], [p.detach().clone().requires_grad_()
                                                                      for p in ref_w]
    a = getattr(torch.optim, name)([{"params": a_p[:2]}, {"params": a_p[2:], **second}], **kwargs)
    b = getattr(gt.optim, name)([{"params": b_p[:2]}, {"params": b_p[2:], **second}], **kwargs)
    a.load_state_dict(our_sd)
    b.load_state_dict(ref_sd)
    a_w, b_w = _train_mixed(a_p, a, 5), _train_mixed(b_p, b, 5)
    assert torch.allclose(b_w[0], a_w[0], rtol=1e-5, atol=1e-5)
    for x, y in zip(b_w[1:], a_w[1:]):
        assert torch.allclose(x, y, rtol=1e-6, atol=1e-6), (x - y).abs().max()


@pytest.mark.parametrize("kwargs", [dict(lr=0.1), dict(lr=0.1, momentum=0.9, dampening=0.1),
                                    dict(lr=0.01, momentum=0.9, nesterov=True, maximize=True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sgd_takes_sparse_gradients_as_torch(kwargs, dtype):
    def run(cls):
        torch.manual_seed(7)
        emb = torch.nn.Embedding(20, 4, sparse=True).to(dtype)
        head = torch.nn.Linear(4, 1).to(dtype)
        start = emb.weight.detach().clone()
        opt = cls(list(emb.parameters()) + list(head.parameters()), **kwargs)
        g = torch.Generator().manual_seed(2)
        for _ in range(8):
            ids = torch.randint(0, 20, (6, 3), generator=g)  # repeated rows: uncoalesced gradients
            opt.zero_grad()
            head(emb(ids)).pow(2).mean().backward()
            assert emb.weight.grad.is_sparse
            opt.step()
        assert not torch.equal(emb.weight, start), "the weights must move"
        return emb.weight.detach().clone(), head.weight.detach().clone()
    ours, ref = run(gt.optim.SGD), run(torch.optim.SGD)
    for a, b in zip(ours, ref):
        assert a.dtype == dtype and torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_refuses_sparse_gradients_by_name_as_torch(name):
    emb = torch.nn.Embedding(5, 2, sparse=True)
    opt = getattr(gt.optim, name)(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    before = emb.weight.detach().clone()
    with pytest.raises(gc.InvalidArgument, match=rf"{name}.step: param_groups\[0\]\['params'\]\[0\]: a sparse "
                                                 "gradient"):
        opt.step()
    assert torch.equal(emb.weight, before)
    with pytest.raises(RuntimeError, match="sparse"):  # torch's own refuses too
        getattr(torch.optim, name)(emb.parameters()).step()


def test_parameters_an_optimizer_cannot_step_are_refused_by_name():
    opt = gt.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(gc.InvalidArgument, match=r"SGD: param_groups\[1\]\['params'\]\[1\]: torch.int64"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2)),
                                        torch.nn.Parameter(torch.ones(2, dtype=torch.int64), requires_grad=False)]})
    model = make_model()  # a fused parameter whose .data becomes float64: its fp32 state cannot follow
    opt = gt.optim.AdamW(model.parameters())
    train(model, opt, 2)
    first = next(model.parameters())
    first.data = first.detach().double()
    model.zero_grad()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(gc.Unsupported, match=r"AdamW: param_groups\[0\]\['params'\]\[0\]: torch.float64: its "
                                             r"\.data changed dtype"):
        opt.step()
    params = _mixed_parameters()  # and a float64 one (torch's optimizer) that becomes float32
    opt = gt.optim.SGD(params, lr=0.1, momentum=0.9)
    _train_mixed(params, opt, 2)
    params[1].data = params[1].detach().float()
    params[1].grad = torch.ones_like(params[1])
    with pytest.raises(gc.Unsupported, match=r"SGD: param_groups\[0\]\['params'\]\[1\]: torch.float32: its"):
        opt.step()


@pytest.mark.parametrize("name, kwargs, second", OPTIMIZERS)
def test_maximize_ascends_as_torch(name, kwargs, second):
    ref_model, our_model = make_model(), make_model()
    ref = getattr(torch.optim, name)(groups(ref_model, **second), maximize=True, **kwargs)
    ours = getattr(gt.optim, name)(groups(our_model, **second), maximize=True, **kwargs)
    ref_w, our_w = train(ref_model, ref, 20), train(our_model, ours, 20)
    assert torch.allclose(our_w, ref_w, rtol=1e-5, atol=1e-5), (our_w - ref_w).abs().max()
    ours.param_groups[1]["maximize"] = ref.param_groups[1]["maximize"] = False  # per group, between steps
    ref_w, our_w = train(ref_model, ref, 5), train(our_model, ours, 5)
    assert torch.allclose(our_w, ref_w, rtol=1e-5, atol=1e-5), (our_w - ref_w).abs().max()


def test_bf16_parameters_with_fp32_masters():
    model = make_model(dtype=torch.bfloat16)
    opt = gt.optim.AdamW(model.parameters(), 1e-2, master_weights=True)
    x, y = data()
    for _ in range(10):
        opt.zero_grad()
        ((model(x.bfloat16()) - y.bfloat16()).float() ** 2).mean().backward()
        opt.step()
    for p in model.parameters():
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32
        assert torch.equal(master.to(torch.bfloat16), p.detach()), "the weight is its master rounded"


# ---- GradScaler ---------------------------------------------------------------------------------


def reference_scaled_training(model, opt, steps, overflow_at, init_scale=2.0**10, growth_interval=4):
    """torch.cuda.amp.GradScaler's rule, written out for the CPU: scale, unscale, skip on inf, update."""
    x, y = data()
    scale, tracker, scales = init_scale, 0, []
    for i in range(steps):
        opt.zero_grad()
        (((model(x) - y) ** 2).mean() * scale).backward()
        if i in overflow_at:
            next(model.parameters()).grad.view(-1)[0] = math.inf
        found_inf = False
        for p in model.parameters():
            p.grad.mul_(1.0 / scale)  # torch multiplies by the reciprocal (fp32)
            found_inf |= not bool(torch.isfinite(p.grad).all())
        if not found_inf:
            opt.step()
            tracker += 1
            if tracker == growth_interval:
                scale, tracker = scale * 2.0, 0
        else:
            scale, tracker = scale * 0.5, 0
        scales.append(scale)
    return flat(model), scales


def scaled_training(model, opt, scaler, steps, overflow_at):
    x, y = data()
    scales = []
    for i in range(steps):
        opt.zero_grad()
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        if i in overflow_at:
            next(model.parameters()).grad.view(-1)[0] = math.inf
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return flat(model), scales


@pytest.mark.parametrize("optimizer", ["gpucloud", "torch"])
def test_grad_scaler_follows_torchs_rule_and_skips_overflow_steps(optimizer):
    overflow_at = {3, 11, 12, 30}
    ref_model = make_model()
    ref_w, ref_scales = reference_scaled_training(ref_model, torch.optim.AdamW(ref_model.parameters(), 1e-2), STEPS,
                                                  overflow_at)
    model = make_model()
    opt = (gt.optim.AdamW if optimizer == "gpucloud" else torch.optim.AdamW)(model.parameters(), 1e-2)
    scaler = gt.GradScaler(init_scale=2.0**10, growth_interval=4)
    w, scales = scaled_training(model, opt, scaler, STEPS, overflow_at)
    assert scales == ref_scales, (scales, ref_scales)
    assert max(scales) > 2.0**10 and min(scales) < 2.0**10, "it grew and backed off"
    assert torch.allclose(w, ref_w, rtol=1e-5, atol=1e-5), (w - ref_w).abs().max()
    if optimizer == "gpucloud":
        assert float(opt.state_dict()["state"][0]["step"]) == STEPS - len(overflow_at)


def test_grad_scaler_state_dict_is_torchs_format_both_ways():
    model = make_model()
    opt = gt.optim.SGD(model.parameters(), 0.05)
    scaler = gt.GradScaler(init_scale=256.0, growth_interval=3)
    scaled_training(model, opt, scaler, 5, overflow_at={1})  # 256, 128 (overflow), 3 finite steps: 256
    sd = scaler.state_dict()
    assert sd == {"scale": 256.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                  "_growth_tracker": 0}, sd
    # A torch GradScaler's state dict (what torch.cuda.amp.GradScaler.state_dict() returns on a GPU).
    torch_sd = {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.25, "growth_interval": 10,
                "_growth_tracker": 7}
    other = gt.GradScaler()
    other.load_state_dict(torch_sd)
    assert other.state_dict() == torch_sd
    scaler.load_state_dict(torch_sd)  # after use too
    assert scaler.state_dict() == torch_sd and scaler.get_backoff_factor() == 0.25
    with pytest.raises(RuntimeError, match="empty"):
        gt.GradScaler().load_state_dict({})
    with pytest.raises(gc.InvalidArgument, match="'_growth_tracker'"):
        gt.GradScaler().load_state_dict({k: v for k, v in torch_sd.items() if k != "_growth_tracker"})
    assert gt.GradScaler(enabled=False).state_dict() == {}


def test_grad_scaler_takes_torch_2s_device_first_spelling():
    """torch.amp.GradScaler("cuda", init_scale, ...) (torch 2) and torch.cuda.amp.GradScaler(init_scale,
    ...) (1.13) both construct it; the device must be the outputs'."""
    for scaler in (gt.GradScaler("cpu", 2.0**8, 3.0), gt.GradScaler(device="cpu", init_scale=2.0**8, growth_factor=3.0),
                   gt.GradScaler(2.0**8, 3.0), gt.GradScaler(torch.device("cpu"), init_scale=2.0**8, growth_factor=3.0)):
        assert scaler.get_scale() == 2.0**8 and scaler.get_growth_factor() == 3.0
        out = scaler.scale(torch.ones(2))
        assert out.tolist() == [256.0, 256.0]
    with pytest.raises(gc.InvalidArgument, match="outputs on cpu, a GradScaler\\('cuda'\\)"):
        gt.GradScaler("cuda").scale(torch.ones(1))
    with pytest.raises(gc.InvalidArgument, match="neither 'cuda' nor 'cpu'"):
        gt.GradScaler("meta")
    with pytest.raises(TypeError, match="at most 5 positional"):
        gt.GradScaler("cpu", 1.0, 2.0, 0.5, 10, True, 7)


def test_grad_scaler_misuse_is_torchs_errors():
    model = make_model()
    opt = gt.optim.AdamW(model.parameters())
    scaler = gt.GradScaler()
    x, y = data()
    scaler.scale(((model(x) - y) ** 2).mean()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    scaler.update()
    assert gt.GradScaler().get_scale() == 65536.0
    assert gt.GradScaler(enabled=False).scale(torch.ones(2)).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="growth_factor"):
        gt.GradScaler(growth_factor=1.0)
    with pytest.raises(TypeError, match="outputs"):
        scaler.scale("loss")


def test_grad_scaler_scales_nested_outputs_and_the_scale_reaches_the_gradients():
    scaler = gt.GradScaler(init_scale=8.0)
    w = torch.nn.Parameter(torch.ones(3))
    a, (b,) = scaler.scale([w.sum(), (2 * w.sum(),)])
    assert float(a.detach()) == 24.0 and float(b.detach()) == 48.0
    (a + b).backward()
    assert w.grad.tolist() == [24.0, 24.0, 24.0]


def test_importing_gpucloud_does_not_import_torch():
    code = "import sys, gpucloud; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_optimizers_and_scalers_dropped_anywhere_in_a_step_are_safe():
    code = """
import torch, gpucloud.torch as gt
m = torch.nn.Linear(4, 2)
opt, scaler = gt.optim.AdamW(m.parameters()), gt.GradScaler()
scaler.scale(m(torch.ones(3, 4)).sum()).backward()
scaler.step(opt)
del opt
scaler.update()
del scaler, m
opt = gt.optim.SGD(torch.nn.Linear(4, 2).parameters(), momentum=0.9)
print('ok')
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---- DDP communication hooks --------------------------------------------------------------------


def run_torch_mpi(script, ranks, local_size):
    env = {"GPUCLOUD_LOCAL_SIZE": str(local_size)} if local_size else {}
    return run_example(os.path.join(os.path.dirname(__file__), script), str(free_port()), ranks=ranks, env=env)


@pytest.mark.parametrize("ranks, local_size", [(2, None), (4, 2)])
def test_ddp_with_gpucloud_hooks_matches_ddp_with_gloo(ranks, local_size):
    out = run_torch_mpi("mpi_torch_ddp.py", ranks, local_size)
    nodes = ranks // local_size if local_size else 1
    assert f"torch ddp hooks on {ranks} ranks ({nodes} nodes): ok" in out, out


@pytest.mark.parametrize("ranks, local_size", [(2, None), (4, 2)])
def test_horovod_style_api_matches_ddp_with_gloo(ranks, local_size):
    out = run_torch_mpi("mpi_torch_horovod.py", ranks, local_size)
    nodes = ranks // local_size if local_size else 1
    assert f"torch horovod-style API on {ranks} ranks ({nodes} nodes): ok" in out, out


def test_init_process_group_takes_a_gpucloud_communicator():
    with pytest.raises(TypeError, match="comm: expected a gpucloud.Communicator"):
        gt.init_process_group("tcp://x:1")


SETTLED = r"""
import sys, time
import torch, torch.distributed as dist
import gpucloud as gc, gpucloud.torch as gt
from gpucloud.torch.process_group import _cxx_owners_hold_a_python_reference

comm = gc.Communicator.mpi_world()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=comm.rank, world_size=comm.size)
waits = _cxx_owners_hold_a_python_reference()  # torch 2.15; 1.13 keeps the tensors referenced instead
assert waits == hasattr(torch.Tensor, "_use_count"), torch.__version__  # the two torch versions tested


def references(tensors):
    return [sys.getrefcount(t) for t in tensors]


held = 0  # calls after which gloo still held a tensor: what settled() waits out
for i in range(300):
    w = torch.full((257,), float(comm.rank + i))
    everyone = [torch.empty_like(w) for _ in range(comm.size)]
    tensors = [w, *everyone]
    before = references(tensors)
    if i % 2:
        with gt.settled(everyone, w):
            dist.all_gather(everyone, w)
        if waits:  # no C++ owner left but the Python object
            assert references(tensors) == before, (i, references(tensors), before)
            assert all(t._use_count() == 1 for t in tensors), [t._use_count() for t in tensors]
    else:
        dist.all_gather(everyone, w)
        held += references(tensors) != before
        while references(tensors) != before:  # the unsettled call's release, before the next one
            time.sleep(0)
    assert all(torch.equal(e, torch.full((257,), float(r + i))) for r, e in enumerate(everyone))
w = torch.ones(3)
if waits:
    with gt.settled(w):
        dist.all_reduce(w, async_op=True)  # its Work dropped unwaited: settled() waits for the collective
    assert torch.equal(w, torch.full((3,), float(comm.size))), w
    try:
        with gt.settled(w, timeout=0.05):
            kept = w  # a reference the block keeps: never settles
        raise AssertionError("settled() returned with a new reference held")
    except gc.CommunicationError as e:
        assert "tensors [0]" in str(e) and "kept a reference" in str(e), e
    del kept
dist.barrier()
dist.destroy_process_group()
print(f"rank {comm.rank}: settled (waits: {waits}); gloo still held tensors after {held} of 150 unsettled calls",
      flush=True)
"""


def test_settled_returns_once_gloo_has_let_go_of_a_collectives_tensors(tmp_path):
    script = tmp_path / "settled.py"
    script.write_text(SETTLED)
    out = run_example(str(script), str(free_port()))
    assert "rank 0: settled (waits: " in out and "rank 1: settled (waits: " in out, out


def test_settled_checks_its_arguments():
    with pytest.raises(TypeError, match="argument 1: expected a tensor or a list of tensors, got int"):
        with gt.settled(torch.ones(2), [3]):
            pass
    with pytest.raises(gc.InvalidArgument, match="timeout must be > 0"):
        with gt.settled(torch.ones(2), timeout=0):
            pass


def test_hook_state_is_checked():
    with pytest.raises(TypeError, match="comm"):
        gt.ddp.HookState("comm")


class _Bucket:
    """What DDP hands a hook: a flat buffer of gradients."""

    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor


def test_the_hook_returns_before_its_all_reduce_and_completes_when_it_finishes():
    """The hook does not wait: work ahead of it on the stream (here a host function that sleeps)
    delays the future, not the hook's return; the future then holds the averaged bucket."""
    import threading
    import time

    from gpucloud.torch._streams import stream_for

    comm = gc.Communicator.mpi_world()
    stream = stream_for(torch.device("cpu"))
    gate = threading.Event()
    gc.launch_host_func(stream, lambda: gate.wait(30))
    bucket = torch.arange(8, dtype=torch.float32)
    start = time.monotonic()
    future = gt.ddp.allreduce_hook(gt.ddp.HookState(comm, wire_dtype=torch.bfloat16), _Bucket(bucket))
    assert time.monotonic() - start < 5 and not future.done()
    gate.set()
    assert future.wait() is bucket and bucket.tolist() == list(range(8))  # one rank: the average is itself
    stream.synchronize()


def test_a_failure_ahead_of_the_hook_completes_its_future_with_the_error():
    """An error the stream's earlier work raised reaches DDP through the future (raised from
    backward()), instead of being lost or hanging the reducer."""
    from gpucloud.torch._streams import stream_for

    comm = gc.Communicator.mpi_world()
    stream = stream_for(torch.device("cpu"))

    def fail():
        raise gc.CommunicationError("all_reduce: peer gone (simulated)")

    gc.launch_host_func(stream, fail)
    future = gt.ddp.allreduce_hook(gt.ddp.HookState(comm), _Bucket(torch.ones(4)))
    with pytest.raises(gc.CommunicationError, match="peer gone"):
        future.wait()
    stream.synchronize()  # taken over by the future: the stream is clean again


def test_distributed_optimizer_on_one_rank_and_its_errors():
    """One rank (mpi_world without mpirun): the average is the gradient itself, so it trains as the
    plain optimizer; misuse is a typed error."""
    comm = gc.Communicator.mpi_world()
    ref_model, model = make_model(), make_model()
    ref = train(ref_model, torch.optim.AdamW(ref_model.parameters(), 1e-2), 10)
    opt = gt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), 1e-2), comm)
    assert isinstance(opt, torch.optim.AdamW) and type(opt).__name__ == "AdamW"
    assert torch.allclose(train(model, opt, 10), ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(gc.InvalidArgument, match="already distributed"):
        gt.DistributedOptimizer(opt, comm)
    with pytest.raises(gc.Unsupported, match="closure"):
        opt.step(lambda: 0.0)
    x, y = data()
    ((model(x) - y) ** 2).mean().backward()
    with pytest.raises(gc.InvalidArgument, match="computed again after its average.*backward_passes_per_step"):
        ((model(x) - y) ** 2).mean().backward()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(gc.InvalidArgument, match="backward_passes_per_step"):
            gt.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), 0.1), comm,
                                    backward_passes_per_step=bad)
    plain = torch.optim.SGD(make_model().parameters(), 0.1)
    torch.optim.lr_scheduler.StepLR(plain, 1)
    with pytest.raises(gc.InvalidArgument, match="create schedulers after"):
        gt.DistributedOptimizer(plain, comm)
    with pytest.raises(TypeError, match="comm"):
        gt.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), 0.1), "comm")
    m = make_model()
    with pytest.raises(gc.InvalidArgument, match="not among them"):
        gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), 0.1), comm,
                                named_parameters=list(m.named_parameters())[:2])
    del opt, model  # no cycle keeps it: freed here, and the hooks left on the graph do nothing
    w = torch.nn.Parameter(torch.ones(2))
    gt.broadcast_parameters([w], comm, root=0)
    assert w.tolist() == [1.0, 1.0]
    with pytest.raises(gc.InvalidArgument, match="root"):
        gt.broadcast_parameters([w], comm, root=1)


def test_the_torch_examples_train_checkpoint_and_resume_across_each_other(tmp_path):
    """examples/torch_horovod_style.py runs 200 steps and checkpoints; examples/torch_ddp.py resumes
    from it to 300 and ends bit-identical to an uninterrupted torch_ddp.py run."""
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")

    def example(name, *args):
        return run_example(os.path.join(examples, name), *args)

    straight = example("torch_ddp.py", "--steps", "300", "--checkpoint-dir", str(tmp_path / "a"), "--dump",
                       str(tmp_path / "straight.pt"))
    assert "overflow: skipped on every rank, scale 65536 -> 32768" in straight, straight
    assert "ranks agree: NO" not in straight and "ranks agree: yes" in straight
    loss = [float(x) for x in __import__("re").findall(r"loss (\d+\.\d+)  scale", straight)]
    assert loss[-1] < 0.75 * loss[0], loss
    first = example("torch_horovod_style.py", "--steps", "200", "--checkpoint-dir", str(tmp_path / "b"))
    assert "final: steps 200" in first and "ranks agree: yes" in first, first
    resumed = example("torch_ddp.py", "--steps", "300", "--checkpoint-dir", str(tmp_path / "b"), "--resume", "--dump",
                      str(tmp_path / "resumed.pt"))
    assert "resumed from step 200" in resumed, resumed
    a = torch.load(tmp_path / "straight.pt", weights_only=False)  # files of this test: trusted
    b = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert torch.equal(a, b), (a - b).abs().max()


def test_the_torch_examples_serve_metrics_while_they_train():
    """--metrics-port 0: each rank's /metrics endpoint counts steps, samples, the collectives' time
    and the loss scale, as the C++ and NumPy examples' do."""
    import signal
    import time
    import urllib.request

    mpirun = shutil.which("mpirun")
    if mpirun is None or not torch.distributed.is_gloo_available():
        pytest.skip("needs mpirun and torch's gloo")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_ddp.py")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    p = subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                          sys.executable, example, "--steps", "1000000", "--log-every", "100000", "--metrics-port", "0"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        ports, seen = [], ""
        for line in p.stdout:  # mpirun may join the two ranks' lines into one
            seen += line
            ports = __import__("re").findall(r"rank \d: metrics at http://[^:]+:(\d+)/metrics", seen)
            if len(ports) == 2:
                break
        assert len(ports) == 2, seen
        deadline, text, values = time.monotonic() + 120, "", {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5) as r:
                text = r.read().decode()
            values = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("gpucloud_") and "{" in line}
            if values.get("gpucloud_steps_total", 0) >= 20:
                break
            time.sleep(0.2)
        assert values.get("gpucloud_steps_total", 0) >= 20, text
        assert values["gpucloud_samples_total"] == 64 * values["gpucloud_steps_total"], text
        scale = values["gpucloud_loss_scale"]
        assert scale > 0 and math.frexp(scale)[0] == 0.5 and values["gpucloud_comm_seconds_total"] > 0, text
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()


def run_example(path, *args, ranks=2, env=None):
    """``path`` run by ``sys.executable`` under mpirun on ``ranks`` ranks; its stdout."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo process group")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
               **(env or {}))
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
                        sys.executable, path, *args], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("example", ["torch_ddp.py", "torch_horovod_style.py"])
def test_a_rank_slowed_in_a_synchronous_torch_loop_is_named_a_straggler(example):
    """Every step waits for its gradients' all-reduce, so every rank's wall step is the slowest's;
    the detection compares the ranks' own work (the step less its collectives) and names rank 1."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", example)
    out = run_example(path, "--steps", "80", "--log-every", "1000", "--overflow-at", "-1", "--metrics-port", "0",
                      "--slow-rank", "1", "--slow-ms", "30")
    found = __import__("re").findall(r"straggler: rank (\d) works ([\d.]+) ms per step, the median ([\d.]+) ms", out)
    assert found and found[0][0] == "1", out
    assert float(found[0][1]) >= 30.0 > float(found[0][2]) - 15.0, out  # its 30 ms of sleep is its own work
    clean = run_example(path, "--steps", "80", "--log-every", "1000", "--overflow-at", "-1", "--metrics-port", "0")
    assert "straggler" not in clean, clean


def test_update_with_a_new_scale_keeps_the_growth_tracker_as_torch():
    model = make_model()
    opt = gt.optim.SGD(model.parameters(), 0.01)
    scaler = gt.GradScaler(init_scale=4.0, growth_interval=10)
    scaled_training(model, opt, scaler, 3, overflow_at=set())
    scaler.update(new_scale=torch.tensor(64.0))
    assert scaler.get_scale() == 64.0 and scaler.state_dict()["_growth_tracker"] == 3
    with pytest.raises(gc.InvalidArgument, match="new_scale"):
        scaler.update(new_scale=0.0)


def test_a_peer_that_stops_answering_is_an_exception_from_ddps_backward_not_a_hang(tmp_path):
    """Rank 1 stops after three good steps: rank 0's hook all-reduce times out and backward()
    raises gpucloud.CommunicationError itself (not DDP's "Unable to cast"), and the job ends."""
    script = tmp_path / "peer_dies.py"
    script.write_text('''
import sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import gpucloud as gc
import gpucloud.torch as gt
comm = gc.Communicator.mpi_world()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=comm.rank, world_size=comm.size)
model = DDP(torch.nn.Linear(8, 1))
model.register_comm_hook(gt.ddp.HookState(comm), gt.ddp.allreduce_hook)
x = torch.ones(4, 8)
for _ in range(3):  # good steps (DDP rebuilds its buckets over gloo at the second)
    model(x).sum().backward()
if comm.rank == 1:
    time.sleep(120)
try:
    model(x).sum().backward()
    print("rank 0: no error", flush=True)
except gc.CommunicationError as e:
    print("rank 0 backward raised CommunicationError:", "waited" in str(e), repr(str(e)[:300]), flush=True)
except Exception as e:
    print("rank 0 backward raised", type(e).__name__, repr(str(e)[:300]), flush=True)
''')
    mpirun = shutil.which("mpirun")
    if mpirun is None or not torch.distributed.is_gloo_available():
        pytest.skip("needs mpirun and torch's gloo")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
               GPUCLOUD_COMM_TIMEOUT="2")
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, str(script), str(free_port())], env=env, capture_output=True, text=True,
                       timeout=100)
    assert "rank 0 backward raised CommunicationError: True" in r.stdout, r.stdout + r.stderr
    assert r.returncode != 0 and "gpucloud: ending the job" in r.stderr, r.stdout + r.stderr


def test_the_drop_ins_stream_is_public_and_checked():
    import gpucloud.torch._streams as streams

    s = gt.stream("cpu")
    assert s is gt.stream(torch.device("cpu")) is streams.stream_for(torch.device("cpu"))
    assert s.device == gc.Device("host")
    with pytest.raises(gc.InvalidArgument, match="neither a CUDA device nor the CPU"):
        gt.stream("meta")


@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD"])
def test_torchs_flags_are_accepted_where_the_kernels_follow_them_and_refused_by_name_elsewhere(name):
    model = torch.nn.Linear(4, 2)
    cls = getattr(gt.optim, name)
    # torch's defaults, and its implementation choices (any of them gives the same update).
    for flags in ({}, dict(foreach=None, maximize=False, capturable=False, differentiable=False, fused=None),
                  dict(foreach=True), dict(foreach=False), dict(fused=True), dict(fused=False)):
        opt = cls(model.parameters(), lr=0.1, **flags)
        for k, v in flags.items():
            assert opt.param_groups[0][k] == v
        model(torch.ones(3, 4)).sum().backward()
        opt.step()  # a group saying foreach/fused steps like any other
        opt.zero_grad()
    for k, v in (("capturable", True), ("differentiable", True)):
        with pytest.raises(gc.Unsupported, match=f"{name}: {k}=True: the fused kernels run only with {k}=False"):
            cls(model.parameters(), lr=0.1, **{k: v})
    with pytest.raises(TypeError, match="foreach: expected None or a bool"):
        cls(model.parameters(), lr=0.1, foreach="yes")
    with pytest.raises(TypeError, match="maximize: expected a bool"):
        cls(model.parameters(), lr=0.1, maximize=None)
