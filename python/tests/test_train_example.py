"""The Python training example runs, its loss falls, a forced overflow is skipped and logged, it
runs data-parallel under mpirun to the one-rank weights, and a resumed run continues from its checkpoint
to the uninterrupted run's weights."""
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import gpucloud as gc

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
ARGS = ["--steps", "120", "--log-every", "40", "--overflow-at", "50"]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def losses(out):
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)\s+scale", out)]


def worst_difference(a, b):
    """The largest relative difference between two --dump files' weights."""
    import numpy as np

    with np.load(a) as x, np.load(b) as y:
        assert sorted(x.files) == sorted(y.files)
        return max(float(np.max(np.abs(x[k] - y[k])) / max(float(np.max(np.abs(x[k]))), 1e-30)) for k in x.files)


def test_single_process_trains_and_skips_the_forced_overflow(tmp_path):
    whole = str(tmp_path / "whole.npz")
    out = run([sys.executable, str(EXAMPLE), *ARGS, "--dump", whole])
    l = losses(out)
    assert l[-1] < 0.5 * l[0], l
    assert re.search(r"step +51 .* skipped [1-9]", out), out
    assert re.search(r"device host: \d+ readings", out), out  # the monitor's summary
    ck = str(tmp_path / "ck")
    first_half = run([sys.executable, str(EXAMPLE), *ARGS[2:], "--steps", "60", "--checkpoint-dir", ck,
                      "--checkpoint-every", "30"])
    assert "checkpoint: step 60" in first_half
    assert sorted(os.listdir(ck)) == ["step-000000000030", "step-000000000060"]
    resumed_dump = str(tmp_path / "resumed.npz")
    resumed = run([sys.executable, str(EXAMPLE), *ARGS, "--checkpoint-dir", ck, "--resume", "--dump", resumed_dump])
    assert "resumed from" in resumed and "at step 60" in resumed
    assert abs(losses(resumed)[-1] - l[-1]) < 1e-3 * l[0], (losses(resumed), l)  # the same trajectory
    assert worst_difference(whole, resumed_dump) == 0.0  # and exactly the same weights


def test_two_ranks_under_mpirun_match_one_rank(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    fp32 = [*ARGS, "--dtype", "fp32"]
    one, two = str(tmp_path / "one.npz"), str(tmp_path / "two.npz")
    run([sys.executable, str(EXAMPLE), *fp32, "--dump", one])
    out = run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable,
               str(EXAMPLE), *fp32, "--dump", two], env=env)
    assert "2 rank(s)" in out
    l = losses(out)
    assert l[-1] < 0.5 * l[0], l
    # The same global batch split over two ranks ends with the one-rank weights, within rounding
    # (the gradient average sums in another order).
    assert worst_difference(one, two) < 1e-5
    # Resumed on another world size: two ranks checkpoint at step 60, one rank finishes the run.
    ck = str(tmp_path / "ck")
    run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable,
         str(EXAMPLE), *fp32, "--steps", "60", "--checkpoint-dir", ck, "--checkpoint-every", "60"], env=env)
    assert gc.checkpoint.read_manifest(gc.checkpoint.latest(ck)).world_size == 2
    resumed = str(tmp_path / "resumed.npz")
    out = run([sys.executable, str(EXAMPLE), *fp32, "--checkpoint-dir", ck, "--resume", "--dump", resumed])
    assert "at step 60 (written by 2 rank(s))" in out, out
    assert worst_difference(one, resumed) < 1e-5


def test_two_ranks_under_torchrun_match_one_rank(tmp_path):
    """What deploy/k8s/train-mlp.yaml runs on each pod: the example under the real torchrun, its
    host collectives through gloo (NCCL through torchrun's store on GPUs), ending with the one-rank
    weights. Debian's torch 1.13 under Python 3.11 needs -r/-t as per-rank maps."""
    pytest.importorskip("torch")
    from ports import free_port

    fp32 = [*ARGS, "--dtype", "fp32"]
    one, two = str(tmp_path / "one.npz"), str(tmp_path / "two.npz")
    run([sys.executable, str(EXAMPLE), *fp32, "--dump", one])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    out = run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0",
               "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-r", "0:1,1:1", "-t", "0:1,1:1", "--log_dir", str(tmp_path / "logs"), str(EXAMPLE), *fp32,
               "--dump", two], env=env)
    assert "train_mlp.py: 2 rank(s)" in out, out
    assert worst_difference(one, two) < 1e-5


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_cnn_twin_reaches_its_accuracy_and_skips_the_forced_overflow(dtype):
    cnn = EXAMPLE.with_name("train_cnn.py")
    out = run([sys.executable, str(cnn), "--steps", "250", "--overflow-at", "120", "--dtype", dtype])
    assert "target 0.95: reached" in out, out
    assert re.search(r"step +121 .* skipped 1", out), out


def test_metrics_are_served_while_it_trains():
    p = subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", "100000", "--log-every", "1000", "--metrics-port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in p.stdout:
            m = re.search(r"metrics at http://[^:]+:(\d+)/metrics", line)
            if m:
                break
        assert m, "no metrics line"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=5) as r:
                text = r.read().decode()
            steps = [float(l.split()[-1]) for l in text.splitlines() if l.startswith("gpucloud_steps_total{")]
            if steps and steps[0] >= 20:
                break
            time.sleep(0.2)
        assert steps and steps[0] >= 20, text
        assert "gpucloud_host_memory_used_bytes{" in text and 'rank="0"' in text
    finally:
        p.kill()
        p.wait()
        p.stdout.close()


def test_the_cnn_twin_resumes_from_its_checkpoint(tmp_path):
    cnn = EXAMPLE.with_name("train_cnn.py")
    ck = str(tmp_path / "ck")
    first = run([sys.executable, str(cnn), "--steps", "120", "--target", "0.01", "--checkpoint-dir", ck,
                 "--checkpoint-every", "60", "--keep-last", "1"])
    assert "checkpoint: step 120" in first and os.listdir(ck) == ["step-000000000120"]
    out = run([sys.executable, str(cnn), "--steps", "250", "--overflow-at", "200", "--checkpoint-dir", ck, "--resume"])
    assert "at step 120" in out and "target 0.95: reached" in out, out


@pytest.mark.parametrize("script, args, named", [
    ("train_mlp.py", ["--log-every", "0"], "--log-every"),
    ("train_mlp.py", ["--checkpoint-every", "0"], "--checkpoint-every"),
    ("train_mlp.py", ["--steps", "abc"], "--steps"),
    ("train_mlp.py", ["--dtype", "fp64"], "--dtype"),
    ("train_mlp.py", ["--lr", "inf"], "--lr"),
    ("train_mlp.py", ["--resume"], "--resume"),
    ("train_cnn.py", ["--resume"], "--resume"),
    ("train_cnn.py", ["--metrics-port", "x"], "--metrics-port"),
    ("train_mlp.py", ["--keep-last", "-1"], "--keep-last"),
    ("train_mlp.py", ["--metrics-port", "x"], "--metrics-port"),
    ("train_cnn.py", ["--noise", "nan"], "--noise"),
    ("train_cnn.py", ["--target", "1.5"], "--target"),
])
def test_bad_options_are_refused_naming_the_option(script, args, named):
    r = subprocess.run([sys.executable, str(EXAMPLE.with_name(script)), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and named in r.stderr, r.stdout + r.stderr


def test_a_global_batch_that_does_not_divide_over_the_ranks_is_refused():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, str(EXAMPLE), "--batch", "3", "--steps", "5"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode != 0 and "--batch: 3 does not divide over 2 ranks" in r.stderr, r.stdout + r.stderr
