"""gpucloud.torch.Checkpointer: a torch job's whole state (model, gpucloud's and torch's optimizers,
GradScaler, lr scheduler, plain data, tensors of every dtype) one call each way; training resumed
from it goes on bit for bit as the uninterrupted run; asynchronous saves snapshot before later
steps; the files load with torch and safetensors alone (the snippet in docs/torch.md, run without
gpucloud importable); saved on 2 ranks and loaded on 1; bad state and foreign or damaged
checkpoints refused with nothing changed."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import gpucloud as gc
from gpucloud import checkpoint as ck

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")
import gpucloud.torch as gt  # noqa: E402
from ports import free_port  # noqa: E402

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "torch.md")


def make_job(seed=0, torch_optimizer=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    model.register_buffer("mask", torch.arange(5) % 2 == 0)  # bool: stored as its bytes
    model.register_buffer("codes", torch.arange(4, dtype=torch.int8) - 2)
    opt = (torch.optim.AdamW if torch_optimizer else gt.optim.AdamW)(model.parameters(), 1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 4, 0.5)
    scaler = gt.GradScaler(init_scale=2.0**10, growth_interval=3)
    return model, opt, sched, scaler


def steps(job, first, last):
    model, opt, sched, scaler = job
    for step in range(first, last):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 6, generator=g), torch.randn(32, 1, generator=g)
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        scaler.scale(loss * (float("inf") if step == 6 else 1.0)).backward()  # one overflow: skipped
        scaler.step(opt)
        scaler.update()
        sched.step()


def state_of(job, extra=None):
    model, opt, sched, scaler = job
    return {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler, "extra": extra}


def weights(job):
    return {k: v.clone() for k, v in job[0].state_dict().items()}


@pytest.mark.parametrize("torch_optimizer", [False, True])
def test_a_resumed_job_goes_on_bit_for_bit_as_the_uninterrupted_one(tmp_path, torch_optimizer):
    whole = make_job(torch_optimizer=torch_optimizer)
    steps(whole, 0, 12)
    first = make_job(torch_optimizer=torch_optimizer)
    steps(first, 0, 5)
    extra = {"epoch": 2, "position": (5, "shard-3"), "rng": torch.get_rng_state(), "by_id": {7: [1.5, None, True]}}
    gt.Checkpointer(tmp_path).save(5, state_of(first, extra))
    resumed = make_job(seed=1, torch_optimizer=torch_optimizer)  # other weights until it loads
    state = state_of(resumed)
    assert gt.Checkpointer(tmp_path).load(state) == 5
    assert state["extra"]["epoch"] == 2 and state["extra"]["position"] == (5, "shard-3")
    assert state["extra"]["by_id"] == {7: [1.5, None, True]} and torch.equal(state["extra"]["rng"], extra["rng"])
    assert resumed[2].state_dict() == first[2].state_dict() and resumed[3].state_dict() == first[3].state_dict()
    steps(resumed, 5, 12)
    for k, v in weights(whole).items():
        assert torch.equal(weights(resumed)[k], v), k


def test_an_asynchronous_save_holds_the_state_of_its_step(tmp_path):
    job = make_job()
    steps(job, 0, 3)
    at_3 = weights(job)
    writer = gt.Checkpointer(tmp_path, keep_last=0)
    pending = writer.save_async(3, state_of(job))
    steps(job, 3, 6)  # training goes on while it writes
    pending.wait()
    other = make_job(seed=2)
    assert writer.load(state_of(other), os.path.join(tmp_path, ck.directory_name(3))) == 3
    for k, v in at_3.items():
        assert torch.equal(weights(other)[k], v), k
    writer.save(6, state_of(job))
    assert writer.load(state_of(other)) == 6  # the newest
    third = make_job(seed=3)
    assert writer.load(state_of(third), verify="while_copying") == 6  # checksums checked as it copies
    for k, v in weights(other).items():
        assert torch.equal(weights(third)[k], v), k


def test_tensors_of_every_dtype_and_plain_tensors_are_loaded_in_place(tmp_path):
    saved = {"f16": torch.randn(3).half(), "bf16": torch.randn(2, 2).bfloat16(), "f64": torch.randn(2).double(),
             "i16": torch.tensor([-3, 300], dtype=torch.int16), "c64": torch.randn(2, dtype=torch.complex64),
             "scalar": torch.tensor(7), "empty": torch.zeros(0, 3), "strided": torch.randn(4, 3).t()}
    gt.Checkpointer(tmp_path).save(1, saved)
    into = {k: torch.zeros_like(v) for k, v in saved.items()}
    addresses = {k: v.data_ptr() for k, v in into.items()}
    assert gt.Checkpointer(tmp_path).load(into) == 1
    for k, v in saved.items():
        assert torch.equal(into[k], v) and into[k].data_ptr() == addresses[k], k


def test_a_modules_parameters_and_buffers_are_loaded_into_themselves(tmp_path, monkeypatch):
    # One copy, not two: the C++ load writes the parameters and buffers themselves (nothing is
    # allocated for those of a dtype the format keeps), load_state_dict's copy of each onto itself changes nothing, and the
    # optimizer's state, which has no live tensors of its own to load into here, is allocated.
    job = make_job(torch_optimizer=True)
    steps(job, 0, 3)
    gt.Checkpointer(tmp_path).save(3, state_of(job))
    saved = weights(job)
    fresh = make_job(seed=5, torch_optimizer=True)
    params = {k: (v, v.data_ptr()) for k, v in fresh[0].state_dict(keep_vars=True).items()}
    allocated = []
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):
        allocated.append(args)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", counting_empty)
    assert gt.Checkpointer(tmp_path).load({"model": fresh[0]}) == 3
    assert sorted(allocated) == [((4,),), ((5,),)]  # only the int8 and bool buffers, stored as their bytes
    for k, (t, address) in params.items():
        assert fresh[0].state_dict(keep_vars=True)[k] is t and t.data_ptr() == address, k
        assert torch.equal(t, saved[k]), k
    allocated.clear()
    assert gt.Checkpointer(tmp_path).load(state_of(fresh)) == 3
    # the two byte-stored buffers, and every tensor of the optimizer's (and scaler's, scheduler's) state
    def tensors(value):
        if isinstance(value, torch.Tensor):
            return 1
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        return sum(tensors(v) for v in items)

    assert len(allocated) == 2 + sum(tensors(x.state_dict()) for x in job[1:]) > 2, allocated
    steps(job, 3, 5)
    steps(fresh, 3, 5)
    for k, v in weights(job).items():
        assert torch.equal(weights(fresh)[k], v), k
    # A module whose keys differ from the saved ones loads through load_state_dict as before: its error.
    other = torch.nn.Sequential(torch.nn.Linear(6, 16))
    with pytest.raises(RuntimeError, match="Missing key|Unexpected key"):
        gt.Checkpointer(tmp_path).load({"model": other})


def test_the_files_load_with_torch_and_safetensors_alone(tmp_path):
    pytest.importorskip("safetensors.torch")
    job = make_job()
    steps(job, 0, 3)
    gt.Checkpointer(tmp_path).save(3, state_of(job, {"epoch": 1}))
    with open(DOCS) as f:
        docs = f.read()
    snippet = re.search(r"```python\n(import json, os\nimport torch\nfrom safetensors.torch import load_file.*?)```",
                        docs, re.S).group(1)
    script = tmp_path / "plain.py"
    script.write_text("import sys\nsys.modules['gpucloud'] = None  # not importable\n" + snippet + f"""
s = load_gpucloud_torch_checkpoint({str(tmp_path / ck.directory_name(3))!r})
torch.save({{"model": s["model"], "step": s["optimizer"]["state"][0]["step"], "epoch": s["extra"]["epoch"],
            "lr": s["optimizer"]["param_groups"][0]["lr"]}}, {str(tmp_path / "out.pt")!r})
""")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=False)
    assert out["epoch"] == 1 and float(out["step"]) == 3.0 and out["lr"] == job[1].param_groups[0]["lr"]
    for k, v in job[0].state_dict().items():
        assert torch.equal(out["model"][k], v), k


def test_bad_state_is_refused_by_name_before_anything_is_written(tmp_path):
    writer = gt.Checkpointer(tmp_path)
    job = make_job()
    with pytest.raises(TypeError, match="expected a dict"):
        writer.save(1, [job[0]])
    with pytest.raises(gc.InvalidArgument, match="key 'a/b'"):
        writer.save(1, {"a/b": 1})
    with pytest.raises(gc.InvalidArgument, match=r"state\['extra'\]\['f'\]: a builtin_function_or_method cannot be stored"):
        writer.save(1, {"model": job[0], "extra": {"f": len}})
    with pytest.raises(gc.InvalidArgument, match=r"state\['extra'\]: a key of type tuple"):
        writer.save(1, {"extra": {(1, 2): 3}})
    assert not os.listdir(tmp_path)


def test_a_missing_entry_a_foreign_or_a_damaged_checkpoint_changes_nothing(tmp_path):
    job = make_job()
    steps(job, 0, 2)
    writer = gt.Checkpointer(tmp_path / "torch")
    assert writer.load(state_of(job)) is None  # nothing saved yet
    writer.save(2, {"model": job[0]})
    before = weights(job)
    with pytest.raises(ck.CheckpointMismatch, match=r"state\['optimizer'\] is not in the checkpoint"):
        writer.load(state_of(make_job(seed=3)))
    native = tmp_path / "native"
    with ck.Checkpointer(native) as w:
        w.save(1, {"w": torch.zeros(2)}, gc.Stream())
    with pytest.raises(ck.CheckpointError, match="not a gpucloud.torch checkpoint"):
        gt.Checkpointer(native).load({"model": job[0]})
    directory = tmp_path / "torch" / ck.directory_name(2)
    data = os.path.join(directory, "rank-00000.safetensors")
    with open(data, "r+b") as f:  # a flipped byte in the tensor data
        f.seek(os.path.getsize(data) - 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ck.CheckpointError):
        writer.load({"model": job[0]}, str(directory))
    for k, v in before.items():
        assert torch.equal(weights(job)[k], v), k


def test_saved_on_two_ranks_loaded_on_one(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    script = tmp_path / "save.py"
    script.write_text(f"""
import sys, torch
sys.path.insert(0, {os.path.dirname(__file__)!r})
import gpucloud as gc, gpucloud.torch as gt
from test_torch_checkpoint import make_job, steps, state_of
comm = gc.Communicator.mpi_world()
job = make_job()
steps(job, 0, 4)
gt.Checkpointer({str(tmp_path / "ck")!r}, comm=comm).save(4, state_of(job, {{"ranks": comm.size}}))
if comm.rank == 0:  # what was saved, to compare the load with exactly
    torch.save({{"model": job[0].state_dict(), "optimizer": job[1].state_dict(), "scheduler": job[2].state_dict(),
                "scaler": job[3].state_dict()}}, {str(tmp_path / "saved.pt")!r})
""")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    directory = tmp_path / "ck" / ck.directory_name(4)
    assert sorted(f for f in os.listdir(directory) if f.endswith(".safetensors")) == [
        "rank-00000.safetensors", "rank-00001.safetensors"]  # a share each
    # Compared with the saving process's own state, exactly: a recomputation of the same steps here
    # need not give the same bits (torch 2's MKL products vary with the threads they get).
    saved = torch.load(tmp_path / "saved.pt", weights_only=False)
    other = make_job(seed=5)
    state = state_of(other)
    assert gt.Checkpointer(tmp_path / "ck").load(state) == 4 and state["extra"] == {"ranks": 2}
    for k, v in saved["model"].items():
        assert torch.equal(other[0].state_dict()[k], v), k
    loaded_opt = other[1].state_dict()
    assert loaded_opt["param_groups"] == saved["optimizer"]["param_groups"]
    for pid, entry in saved["optimizer"]["state"].items():
        for key, v in entry.items():
            assert torch.equal(torch.as_tensor(loaded_opt["state"][pid][key]), torch.as_tensor(v)), (pid, key)
    assert other[2].state_dict() == saved["scheduler"] and other[3].state_dict() == saved["scaler"]
    steps(other, 4, 8)  # and it goes on (bit for bit against an uninterrupted run: the one-process test)
    with open(directory / "manifest.json") as f:
        assert json.load(f)["body"]["world_size"] == 2
