"""gpucloud.checkpoint at the edges faults reach: a run restarted from an older step, steps of
every width, latest()'s fallback and its warning, hostile files (each in its own process: a crash
or a hang fails one case), paths (bytes, os.PathLike, names that are not UTF-8, a NUL),
non-contiguous arrays and tensors, and the writer's progress."""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import gpucloud as gc
from gpucloud import checkpoint as ck


@pytest.fixture
def stream():
    return gc.Stream()


def committed(root):
    return sorted(p.name for p in pathlib.Path(root).iterdir() if "." not in p.name)


def value_of(directory, stream):
    w = np.zeros(8, np.float32)
    ck.load(directory, {"w": w}, stream)
    return float(w[0])


def save_steps(root, steps, stream, keep_last=0):
    with ck.Checkpointer(root, keep_last=keep_last) as writer:
        for step in steps:
            writer.save(step, {"w": np.full(8, float(step), np.float32)}, stream)


# ---- directory rules ----------------------------------------------------------------------------

def test_a_restart_from_an_older_step_keeps_what_it_writes_and_supersedes_the_newer(tmp_path, stream):
    save_steps(tmp_path, [10, 20], stream, keep_last=2)
    save_steps(tmp_path, [5], stream, keep_last=2)  # the run restarted from step 5
    assert committed(tmp_path) == ["step-000000000005"]
    assert ck.latest(tmp_path) == str(tmp_path / "step-000000000005")
    superseded = sorted(p.name for p in tmp_path.iterdir() if ".superseded-" in p.name)
    assert [n.split(".")[0] for n in superseded] == ["step-000000000010", "step-000000000020"]
    assert value_of(tmp_path / superseded[1], stream) == 20.0  # still loadable by its directory
    save_steps(tmp_path, [6, 7], stream, keep_last=2)
    assert committed(tmp_path) == ["step-000000000006", "step-000000000007"]
    assert value_of(ck.latest(tmp_path), stream) == 7.0


@pytest.mark.parametrize("step", [0, 10**12 - 1, 10**12, 2**62, 2**63 - 1])
def test_every_int64_step_is_found_by_latest(tmp_path, stream, step):
    save_steps(tmp_path, [1, step] if step > 1 else [step], stream, keep_last=1)
    assert ck.latest(tmp_path) == str(tmp_path / ck.directory_name(step))
    assert ck.read_manifest(ck.latest(tmp_path)).step == step
    assert committed(tmp_path) == [ck.directory_name(step)]


def test_a_step_beyond_int64_is_refused(tmp_path, stream):
    with ck.Checkpointer(tmp_path) as writer:
        with pytest.raises((gc.InvalidArgument, OverflowError, TypeError)):
            writer.save(2**63, {"w": np.zeros(2, np.float32)}, stream)


# ---- latest(): fallback and warning ---------------------------------------------------------------

def test_latest_falls_back_to_the_newest_valid_checkpoint_with_a_warning(tmp_path, stream):
    save_steps(tmp_path, [1, 2, 3], stream)
    (tmp_path / "step-000000000003" / "manifest.json").write_text("{ junk")
    with pytest.warns(ck.CheckpointWarning, match=r"skips .*step-000000000003: .*not JSON"):
        found = ck.latest(tmp_path)
    assert found == str(tmp_path / "step-000000000002")
    scan = ck.find_latest(tmp_path)
    assert scan.directory == found
    assert [(pathlib.Path(d).name, "not JSON" in why) for d, why in scan.skipped] == [("step-000000000003", True)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ck.find_latest(tmp_path)  # find_latest reports, never warns


def test_latest_of_nothing_valid_is_none(tmp_path):
    (tmp_path / "step-000000000001").mkdir()
    with pytest.warns(ck.CheckpointWarning, match="missing"):
        assert ck.latest(tmp_path) is None
    assert ck.latest(tmp_path / "absent") is None


# ---- hostile files, each in its own process ------------------------------------------------------

HOSTILE = {
    "nested_manifest": "(d / 'manifest.json').write_text('[' * 200000 + ']' * 200000)",
    "nested_objects": "(d / 'manifest.json').write_text('{\"body\": ' + '{\"a\":' * 5000 + '1' + '}' * 5000 + '}')",
    "fifo_manifest": "(d / 'manifest.json').unlink(); os.mkfifo(d / 'manifest.json')",
    "fifo_tensor_file": "(d / 'rank-00000.safetensors').unlink(); os.mkfifo(d / 'rank-00000.safetensors')",
    "device_manifest": "(d / 'manifest.json').unlink(); os.symlink('/dev/zero', d / 'manifest.json')",
    "nested_safetensors_header": (
        "h = b'[' * 100000 + b']' * 100000; (d / 'rank-00000.safetensors').write_bytes(len(h).to_bytes(8, 'little') + h)"
    ),
    "huge_sparse_manifest": "os.truncate(d / 'manifest.json', (1 << 28) + 1)",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_refused_typed_and_latest_falls_back(tmp_path, case):
    code = textwrap.dedent(f"""
        import os, pathlib, warnings
        import numpy as np
        import gpucloud as gc
        from gpucloud import checkpoint as ck
        root = pathlib.Path({str(tmp_path)!r})
        s = gc.Stream()
        with ck.Checkpointer(root) as w:
            for step in (1, 2):
                w.save(step, {{"w": np.full(8, float(step), np.float32)}}, s)
        d = root / "step-000000000002"
        {HOSTILE[case]}
        into = np.zeros(8, np.float32)
        try:
            ck.load(d, {{"w": into}}, s)
            print("LOADED")
        except ck.CheckpointError as e:
            assert not into.any(), "written before the error"
            print("REFUSED", type(e).__name__)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            found = ck.latest(root)
        assert found == str(root / "step-000000000001"), found
        assert [w.category for w in seen] == [ck.CheckpointWarning], seen
        print("FELL BACK")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "REFUSED CheckpointError" in r.stdout and "FELL BACK" in r.stdout, r.stdout + r.stderr


# ---- paths ------------------------------------------------------------------------------------------

def test_paths_are_str_bytes_or_pathlike(tmp_path, stream):
    save_steps(os.fsencode(tmp_path / "b"), [1], stream)
    save_steps(tmp_path / "p", [2], stream)
    assert ck.latest(os.fsencode(tmp_path / "b")) == str(tmp_path / "b" / "step-000000000001")
    assert ck.read_manifest(ck.latest(tmp_path / "p")).step == 2
    with ck.Checkpointer(tmp_path / "p") as writer:
        assert writer.root == str(tmp_path / "p")
    with pytest.raises(TypeError, match="root: expected a path"):
        ck.Checkpointer(12)


def test_a_name_that_is_not_utf8_round_trips(tmp_path, stream):
    root = os.fsencode(tmp_path) + b"/caf\xe9"
    save_steps(root, [3], stream)
    found = ck.latest(root)
    assert isinstance(found, str) and os.fsencode(found) == root + b"/step-000000000003"
    assert value_of(found, stream) == 3.0
    m = ck.read_manifest(found)
    assert os.fsencode(m.directory) == root + b"/step-000000000003"


@pytest.mark.parametrize("call", ["Checkpointer", "latest", "find_latest", "read_manifest", "load"])
def test_a_nul_in_a_path_is_refused_by_name(tmp_path, stream, call):
    bad = str(tmp_path / "a\0b")
    fn = {
        "Checkpointer": lambda: ck.Checkpointer(bad),
        "latest": lambda: ck.latest(bad),
        "find_latest": lambda: ck.find_latest(bad),
        "read_manifest": lambda: ck.read_manifest(bad),
        "load": lambda: ck.load(bad, {"w": np.zeros(2, np.float32)}, stream),
    }[call]
    with pytest.raises((gc.InvalidArgument, ValueError), match="NUL|null"):
        fn()
    assert list(tmp_path.iterdir()) == []


# ---- non-contiguous arrays and tensors ----------------------------------------------------------

def test_non_contiguous_numpy_arrays_save_their_values_and_load_in_place(tmp_path, stream):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base.T  # (6, 4), Fortran order
    strided = np.arange(20, dtype=np.float64)[::2]
    with ck.Checkpointer(tmp_path) as writer:
        writer.save(1, {"t": view, "s": strided}, stream)
    target_base = np.zeros((4, 6), np.float32)
    into = {"t": target_base.T, "s": np.zeros(20)[::2]}
    ck.load(ck.latest(tmp_path), into, stream)
    np.testing.assert_array_equal(into["t"], view)
    np.testing.assert_array_equal(target_base, base)  # written through the view
    np.testing.assert_array_equal(into["s"], strided)


def test_non_contiguous_torch_tensors_channels_last_and_transposed(tmp_path, stream):
    torch = pytest.importorskip("torch")
    w = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5).to(memory_format=torch.channels_last)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not w.is_contiguous() and not t.is_contiguous()
    with ck.Checkpointer(tmp_path) as writer:
        writer.save(1, {"w": w, "t": t}, stream)
    into = {"w": torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last), "t": torch.zeros(3, 4).t()}
    ck.load(ck.latest(tmp_path), into, stream)
    assert torch.equal(into["w"], w) and into["w"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(into["t"], t)


# ---- the writer's progress ----------------------------------------------------------------------

def test_progress_reports_the_last_commit_and_failures(tmp_path, stream):
    writer = ck.Checkpointer(tmp_path / "r")
    p = writer.progress
    assert p.writing_step is None and p.committed_step is None and p.saves_committed == 0
    writer.save_async(4, {"w": np.ones(8, np.float32)}, stream).wait()
    p = writer.progress
    assert p.committed_step == 4 and p.writing_step is None and p.saves_committed == 1
    assert p.seconds_since_commit >= 0 and p.committed_unix_time > 1.6e9 and p.last_save_seconds > 0
    shutil.rmtree(tmp_path / "r")
    (tmp_path / "r").write_text("not a directory")
    with pytest.raises(ck.CheckpointError):
        writer.save(5, {"w": np.ones(8, np.float32)}, stream)
    p = writer.progress
    assert p.saves_failed == 1 and p.committed_step == 4


def test_a_non_contiguous_array_dropped_while_its_save_is_in_flight(tmp_path):
    # The contiguous copy made for the save is held by the save itself: the caller may drop the
    # view and its base at once (in a subprocess: a use after free would crash one case).
    code = textwrap.dedent(f"""
        import gc as pygc, time, numpy as np, gpucloud as gc
        from gpucloud import checkpoint as ck
        s = gc.Stream()
        gc.launch_host_func(s, lambda: time.sleep(0.3))   # the snapshot runs later
        w = ck.Checkpointer({str(tmp_path)!r})
        base = np.arange(24, dtype=np.float32).reshape(4, 6)
        pending = w.save_async(1, {{"t": base.T}}, s)
        del base
        for _ in range(3):
            pygc.collect()
        junk = [np.full(4096, -1.0, np.float32) for _ in range(64)]
        pending.wait()
        into = np.zeros((6, 4), np.float32)
        ck.load(ck.latest({str(tmp_path)!r}), {{"t": into}}, s)
        assert (into == np.arange(24, dtype=np.float32).reshape(4, 6).T).all(), into
        print("OK")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
