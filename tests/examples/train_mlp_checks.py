#!/usr/bin/env python3
"""The training example's checks (run by CTest): the loss falls, a forced overflow is skipped and
logged, a 2-rank run ends with the 1-rank run's weights (same global batch), and a run killed after
a checkpoint and resumed ends with the uninterrupted run's weights.

    train_mlp_checks.py TRAIN_MLP_BINARY WORK_DIR
"""
import array
import os
import re
import shutil
import subprocess
import sys


def run(cmd, env=None, expect_rc=0):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    print("$", " ".join(cmd))
    print(r.stdout + r.stderr)
    if r.returncode != expect_rc:
        sys.exit(f"FAILED: exit code {r.returncode}, expected {expect_rc}")
    return r.stdout


def weights(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def main():
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    common = ["--steps", "200", "--log-every", "50", "--overflow-at", "60", "--dtype", "fp32"]
    one = run([binary, *common, "--dump", f"{work}/one.bin"])
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)\s+scale", one)]
    assert len(losses) >= 4 and losses[-1] < 0.5 * losses[0], f"the loss must fall: {losses}"
    assert "overflow: 1 step(s) skipped" in one, "the forced overflow must be skipped and logged"
    assert "steps done 199" in one

    mpirun = shutil.which("mpirun")
    if mpirun:
        env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
        two = run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", binary, *common,
                   "--dump", f"{work}/two.bin"], env=env)
        assert "2 rank(s)" in two
        a, b = weights(f"{work}/one.bin"), weights(f"{work}/two.bin")
        worst = max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(a, b))
        print(f"1 rank vs 2 ranks: worst relative weight difference {worst:.2e}")
        assert len(a) == len(b) and worst < 1e-3, worst
    else:
        print("mpirun not installed: the 2-rank comparison is skipped")

    ckpt = f"{work}/ckpt.bin"
    crashed = run([binary, *common, "--checkpoint", ckpt, "--checkpoint-every", "100", "--crash-after", "100"], expect_rc=3)
    assert "crashing on purpose after step 100" in crashed and os.path.exists(ckpt)
    resumed = run([binary, *common, "--checkpoint", ckpt, "--checkpoint-every", "100", "--resume", "--dump",
                   f"{work}/resumed.bin"])
    assert "resumed from" in resumed and "at step 100" in resumed
    a, c = weights(f"{work}/one.bin"), weights(f"{work}/resumed.bin")
    worst = max(abs(x - y) for x, y in zip(a, c))
    print(f"uninterrupted vs resumed: worst weight difference {worst:.2e}")
    assert worst == 0.0, worst
    print("train_mlp checks passed")


if __name__ == "__main__":
    main()
