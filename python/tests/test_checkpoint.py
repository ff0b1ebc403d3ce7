"""gpucloud.checkpoint: round trips, damage and mismatch, optimizer state, safetensors and torch
readers, a real full disk, and objects dropped while a save is in flight (in subprocesses)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpucloud as gc
from gpucloud import checkpoint as ck


@pytest.fixture
def stream():
    return gc.Stream()


def state_of_every_dtype():
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": rng.standard_normal(7),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "i32": rng.integers(-(2**31), 2**31 - 1, 11, dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, 4, dtype=np.int64),
        "u8": rng.integers(0, 255, 9, dtype=np.uint8),
        "empty": np.zeros((0, 3), np.float32),
    }


@pytest.mark.parametrize("verify", ["before_writing", "while_copying"])
def test_round_trip_of_numpy_arrays_and_gpucloud_buffers(tmp_path, stream, verify):
    state = state_of_every_dtype()
    bf16 = gc.Buffer((4, 6), "bfloat16")
    gc.fill(bf16, 1.5, stream)
    fp8 = gc.Buffer(5, "float8_e4m3")
    gc.fill(fp8, -2.0, stream)
    state["bf16"], state["fp8"] = bf16, fp8
    with ck.Checkpointer(str(tmp_path)) as writer:
        pending = writer.save_async(12, state, stream, metadata={"loader": json.dumps({"epoch": 3})})
        assert pending.step == 12 and pending.directory.endswith("step-000000000012")
    assert pending.done() and pending.seconds > 0
    latest = ck.latest(str(tmp_path))
    assert latest == pending.directory
    into = {k: (np.zeros_like(v) if isinstance(v, np.ndarray) else None) for k, v in state.items()}
    into["bf16"] = gc.Buffer((4, 6), "bfloat16")
    into["fp8"] = gc.Buffer(5, "float8_e4m3")
    m = ck.load(latest, into, stream, verify=verify)
    assert m.step == 12 and m.world_size == 1 and json.loads(m.metadata["loader"]) == {"epoch": 3}
    assert m.tensors["f16"].shape == [2, 2, 2] and m.tensors["f16"].dtype == gc.DType.float16
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(into[k], v, err_msg=k)
    f32 = gc.Buffer((4, 6), "float32")
    gc.cast(f32, into["bf16"], stream)
    stream.synchronize()
    np.testing.assert_array_equal(np.asarray(f32), np.full((4, 6), 1.5, np.float32))


def test_keep_last_and_the_latest(tmp_path, stream):
    w = np.ones(10, np.float32)
    writer = ck.Checkpointer(str(tmp_path), keep_last=2)
    for step in (1, 2, 3, 4):
        w[:] = step
        writer.save(step, {"w": w}, stream)
    assert sorted(os.listdir(tmp_path)) == ["step-000000000003", "step-000000000004"]
    out = np.zeros(10, np.float32)
    assert ck.load(ck.latest(str(tmp_path)), {"w": out}, stream).step == 4
    assert (out == 4).all()
    assert ck.latest(str(tmp_path / "none")) is None


@pytest.fixture
def saved(tmp_path, stream):
    w = np.arange(100, dtype=np.float32).reshape(10, 10)
    b = np.arange(7, dtype=np.float16)
    ck.Checkpointer(str(tmp_path)).save(5, {"layer.w": w, "layer.b": b}, stream)
    return ck.latest(str(tmp_path))


def sentinel_into():
    return {"layer.w": np.full((10, 10), -1, np.float32), "layer.b": np.full(7, -1, np.float16)}


def expect_untouched(into):
    for v in into.values():
        assert (v == -1).all(), "the caller's array was written"


@pytest.mark.parametrize("verify", ["before_writing", "while_copying"])
@pytest.mark.parametrize("damage", ["truncate", "flip-data", "flip-header", "flip-manifest", "delete-file",
                                    "delete-manifest", "empty-file"])
def test_damage_is_a_checkpoint_error_and_writes_nothing(saved, stream, damage, verify):
    f = os.path.join(saved, "rank-00000.safetensors")
    manifest = os.path.join(saved, "manifest.json")
    if damage == "truncate":
        os.truncate(f, os.path.getsize(f) - 5)
    elif damage in ("flip-data", "flip-header", "flip-manifest"):
        path = manifest if damage == "flip-manifest" else f
        data = bytearray(pathlib.Path(path).read_bytes())
        at = {"flip-data": len(data) - 3, "flip-header": 20, "flip-manifest": len(data) // 2}[damage]
        data[at] ^= 0x04
        pathlib.Path(path).write_bytes(bytes(data))
    elif damage == "delete-file":
        os.remove(f)
    elif damage == "delete-manifest":
        os.remove(manifest)
    else:
        pathlib.Path(f).write_bytes(b"")
    into = sentinel_into()
    with pytest.raises(gc.CheckpointError) as e:
        ck.load(saved, into, stream, verify=verify)
    assert not isinstance(e.value, gc.CheckpointMismatch)
    assert ("manifest.json" if "manifest" in damage else "rank-00000.safetensors") in str(e.value)
    if damage == "flip-data":
        assert "fails its checksum" in str(e.value)
    if damage != "flip-data" or verify == "before_writing":  # found while copying: written in part
        expect_untouched(into)


def test_mismatches_name_the_tensor(saved, stream):
    cases = [
        ({"layer.w": np.zeros((10, 10), np.float64), "layer.b": np.zeros(7, np.float16)}, "layer.w"),
        ({"layer.w": np.zeros((5, 20), np.float32), "layer.b": np.zeros(7, np.float16)}, "[5, 20]"),
        ({"layer.w": np.zeros((10, 10), np.float32)}, "layer.b"),
        ({**sentinel_into(), "layer.c": np.zeros(1, np.float32)}, "layer.c"),
    ]
    for into, word in cases:
        before = {k: v.copy() for k, v in into.items()}
        with pytest.raises(gc.CheckpointMismatch, match=word.replace("[", r"\[")):
            ck.load(saved, into, stream)
        assert all((into[k] == before[k]).all() for k in into)
    into = {"layer.w": np.zeros((10, 10), np.float32)}
    ck.load(saved, into, stream, strict=False)
    assert into["layer.w"][9, 9] == 99
    assert issubclass(gc.CheckpointMismatch, ValueError)


def test_bad_arguments(tmp_path, stream):
    writer = ck.Checkpointer(str(tmp_path))
    w = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="tensors"):
        writer.save(1, [w], stream)
    with pytest.raises(TypeError, match="names must be str"):
        writer.save(1, {3: w}, stream)
    with pytest.raises(TypeError, match="metadata"):
        writer.save(1, {"w": w}, stream, metadata={"k": 3})
    with pytest.raises(TypeError, match="step"):
        writer.save(1.5, {"w": w}, stream)
    with pytest.raises(gc.InvalidArgument, match="step"):
        writer.save(-1, {"w": w}, stream)
    with pytest.raises(gc.InvalidArgument, match="reserved"):
        writer.save(1, {"w": w}, stream, metadata={"gpucloud.run": "x"})
    with pytest.raises(gc.InvalidArgument, match="keep_last"):
        ck.Checkpointer(str(tmp_path), keep_last=-1)
    with pytest.raises(TypeError, match="comm"):
        ck.Checkpointer(str(tmp_path), comm="world")
    assert os.listdir(tmp_path) == []
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    writer.save(2, {"w": w}, stream)
    with pytest.raises(gc.InvalidArgument, match="read-only"):
        ck.load(ck.latest(str(tmp_path)), {"w": ro}, stream)
    with pytest.raises(gc.InvalidArgument, match="verify: 'after'"):
        ck.load(ck.latest(str(tmp_path)), {"w": w}, stream, verify="after")


def train(steps, stream, resume_from=None, save_to=None, save_at=None):
    """A few AdamW steps on fp16 weights with a loss scaler and a forced overflow at step 2."""
    w = np.linspace(-1, 1, 301).astype(np.float16)
    g = np.zeros_like(w)
    adam = gc.FusedAdam([(w, g)], stream, lr=1e-2, weight_decay=0.01, amsgrad=True)
    scaler = gc.LossScaler("host", stream, init_scale=1024.0, growth_interval=2)
    start = 0
    if resume_from:
        state = {"w": w, **{"opt." + k: v for k, v in adam.state_dict().items()},
                 **{"scaler." + k: v for k, v in scaler.state_dict().items()}}
        m = ck.load(ck.latest(resume_from), state, stream)
        adam.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("opt.")}, stream)
        scaler.load_state_dict({k[7:]: v for k, v in state.items() if k.startswith("scaler.")}, stream)
        start = m.step
    writer = ck.Checkpointer(save_to) if save_to else None
    for step in range(start, steps):
        stream.synchronize()  # the host writes g and reads w below
        g[:] = np.float16(0.01 * (step + 1)) * np.sign(w + 0.1).astype(np.float16)
        if step == 2:
            g[5] = np.inf
        scaler.unscale([g], stream)
        adam.step(stream, scaler)
        scaler.update(stream)
        if writer and step + 1 == save_at:
            state = {"w": w, **{"opt." + k: v for k, v in adam.state_dict().items()},
                     **{"scaler." + k: v for k, v in scaler.state_dict().items()}}
            writer.save_async(step + 1, state, stream).wait()
    stream.synchronize()
    return np.asarray(adam.master(0)).copy(), scaler.state(stream).scale, adam.step_count(stream)


def test_resumed_training_matches_the_uninterrupted_run_bit_for_bit(tmp_path, stream):
    straight = train(8, stream, save_to=str(tmp_path), save_at=4)
    resumed = train(8, stream, resume_from=str(tmp_path))
    np.testing.assert_array_equal(straight[0], resumed[0])
    assert straight[1:] == resumed[1:] and straight[2] == 7  # one step skipped


def test_state_dict_views_are_the_live_state(stream):
    w = np.zeros(5, np.float32)
    g = np.ones(5, np.float32)
    sgd = gc.FusedSGD([(w, g)], stream, lr=0.5, momentum=0.9)
    sgd.step(stream)
    sd = sgd.state_dict()
    assert sorted(sd) == ["state.0.momentum_buffer", "step"]
    np.testing.assert_array_equal(np.asarray(sd["state.0.momentum_buffer"]), np.ones(5, np.float32))
    assert int(np.asarray(sd["step"])[0]) == 1
    with pytest.raises(gc.InvalidArgument, match="state.0.momentum_buffer"):
        sgd.load_state_dict({"step": np.array([3], np.int64)}, stream)
    with pytest.raises(gc.InvalidArgument, match="negative"):
        sgd.load_state_dict({"step": np.array([-3], np.int64), "state.0.momentum_buffer": np.zeros(5, np.float32)},
                            stream)
    assert sgd.step_count(stream) == 1


# ---- other readers ----------------------------------------------------------------------------

def test_safetensors_numpy_reads_the_files(saved):
    numpy_loader = pytest.importorskip("safetensors.numpy")
    tensors = numpy_loader.load_file(os.path.join(saved, "rank-00000.safetensors"))
    np.testing.assert_array_equal(tensors["layer.w"], np.arange(100, dtype=np.float32).reshape(10, 10))
    np.testing.assert_array_equal(tensors["layer.b"], np.arange(7, dtype=np.float16))


def test_safetensors_torch_reads_every_dtype(tmp_path, stream):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    state = state_of_every_dtype()
    bf = torch.linspace(-3, 3, 24, dtype=torch.bfloat16).reshape(4, 6)
    state["bf16"] = bf
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1 (Debian 12's 1.13 has no fp8)
        state["e4m3"] = torch.tensor([0.5, -1.0, 448.0], dtype=torch.float32).to(torch.float8_e4m3fn)
        state["e5m2"] = torch.tensor([0.25, -2.0], dtype=torch.float32).to(torch.float8_e5m2)
    ck.Checkpointer(str(tmp_path)).save(1, state, stream)
    files = ck.read_manifest(ck.latest(str(tmp_path))).files
    loaded = {}
    for f in files:
        loaded.update(st_torch.load_file(os.path.join(ck.latest(str(tmp_path)), f)))
    assert set(loaded) == set(state)
    for k, v in state.items():
        want = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))
        assert loaded[k].dtype == want.dtype, k
        assert loaded[k].shape == want.shape, k
        if want.numel():
            assert torch.equal(loaded[k].reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k


# ---- a real full disk, and objects dropped mid-save, each in its own interpreter ---------------

def run_script(body, timeout=120, prefix=()):
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "terminate called" not in r.stderr and "AddressSanitizer" not in r.stderr, r.stderr
    return r.stdout


def can_mount_a_tmpfs():
    """Whether this machine allows a private mount namespace (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not can_mount_a_tmpfs(), reason="no private mount namespaces here (unshare -rm + mount)")
def test_a_full_disk_fails_the_save_at_wait_and_keeps_the_previous_checkpoint(tmp_path):
    out = run_script(f"""
        import os, subprocess, numpy as np, gpucloud as gc
        from gpucloud import checkpoint as ck
        root = {str(tmp_path / "disk")!r}
        os.makedirs(root)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "none", root], check=True)
        s = gc.Stream()
        writer = ck.Checkpointer(root)
        writer.save(1, {{"w": np.ones(1000, np.float32)}}, s)
        pending = writer.save_async(2, {{"w": np.ones(1 << 20, np.float32)}}, s)
        try:
            pending.wait()
            print("NO ERROR")
        except gc.CheckpointError as e:
            print("ERROR", "No space left" in str(e))
        print("LATEST", os.path.basename(ck.latest(root)))
        writer.save(3, {{"w": np.ones(1000, np.float32)}}, s)
        print("LATEST", os.path.basename(ck.latest(root)))
    """, prefix=("unshare", "-rm"))
    assert "ERROR True" in out
    assert "LATEST step-000000000001\nLATEST step-000000000003" in out


def test_dropping_everything_while_a_save_is_in_flight_still_commits(tmp_path):
    out = run_script(f"""
        import numpy as np, gpucloud as gc
        from gpucloud import checkpoint as ck
        root = {str(tmp_path)!r}
        def start():
            s = gc.Stream()
            w = np.arange(1 << 22, dtype=np.float32)
            writer = ck.Checkpointer(root)
            writer.save_async(7, {{"w": w}}, s)
            gc.fill(w, -1.0, s)  # after the snapshot: not saved
            # the arrays, the stream and the checkpointer all go here
        start()
        import gc as pygc; pygc.collect()
        out = np.zeros(1 << 22, np.float32)
        ck.load(ck.latest(root), {{"w": out}}, gc.Stream())
        print("OK", out[12345] == 12345.0, out[-1] == (1 << 22) - 1)
    """)
    assert "OK True True" in out


def test_the_interpreter_exiting_with_a_save_in_flight_commits_it(tmp_path):
    run_script(f"""
        import numpy as np, gpucloud as gc
        from gpucloud import checkpoint as ck
        s = gc.Stream()
        writer = ck.Checkpointer({str(tmp_path)!r})
        writer.save_async(3, {{"w": np.ones(1 << 22, np.float32)}}, s)
        # exits here, the save in flight
    """)
    assert ck.latest(str(tmp_path)).endswith("step-000000000003")
    out = np.zeros(1 << 22, np.float32)
    ck.load(ck.latest(str(tmp_path)), {"w": out}, gc.Stream())
    assert (out == 1).all()


def test_arrays_given_to_load_state_dict_may_be_dropped_at_once():
    out = run_script("""
        import gc as pygc, numpy as np, gpucloud as gc
        s = gc.Stream()
        w, g = np.zeros(1 << 16, np.float16), np.zeros(1 << 16, np.float16)
        adam = gc.FusedAdam([(w, g)], s)
        names = {k: (v.shape, v.dtype) for k, v in adam.state_dict().items()}
        def fresh(name):
            shape, dtype = names[name]
            return np.full(shape, 3, np.int64) if name == "step" else np.full(shape, 0.5, np.float32)
        adam.load_state_dict({k: fresh(k) for k in names}, s)   # the arrays go at once
        pygc.collect()
        junk = [np.full(1 << 16, 7.0, np.float32) for _ in range(32)]   # reuse their memory
        s.synchronize()
        print("OK", float(np.asarray(adam.master(0))[123]), adam.step_count(s), float(w[5]))
    """)
    assert "OK 0.5 3 0.5" in out, out
