#!/usr/bin/env python3
"""The training example's checks (run by CTest): the loss falls, a forced overflow is skipped and
logged, a 2-rank run ends with the 1-rank run's weights (same global batch), and a run killed
with SIGKILL 50 times at random moments while it checkpoints, resumed each time, ends with the
uninterrupted run's weights.

    train_mlp_checks.py TRAIN_MLP_BINARY WORK_DIR
"""
import array
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time


def run(cmd, env=None, expect_rc=0):
    """Runs cmd; prints the command and its last lines (all of them when it fails)."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    print("$", " ".join(cmd))
    if r.returncode != expect_rc:
        sys.exit(f"FAILED: exit code {r.returncode}, expected {expect_rc}:\n{out}")
    lines = out.splitlines()
    print("\n".join(("  [...]", *lines[-4:]) if len(lines) > 4 else lines))
    return out


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

    # Killed with SIGKILL at random moments, many times, while it checkpoints every 5 steps in the
    # background (so most kills land during a save); every restart resumes from the latest
    # checkpoint, which load() verifies in full (manifest, headers, checksums) or the run fails.
    # The chain of killed runs must end with exactly the weights of one uninterrupted run.
    # Each run is killed a random moment after it has started its 1st, 2nd or 3rd save of this run:
    # counted in its own output, not in seconds, so the chain progresses however slow the machine
    # (a save starts only once the one before it has committed, so from the 2nd on there is one).
    ck_args = [*common[:1], "800", *common[2:], "--checkpoint-every", "5", "--keep-last", "2"]
    run([binary, *ck_args, "--checkpoint-dir", f"{work}/straight", "--dump", f"{work}/straight.bin"])
    ckdir = f"{work}/killed"
    rng = random.Random(int(os.environ.get("GPUCLOUD_KILL_SEED", "16")))
    kills, resumes, started = 0, 0, time.monotonic()
    for _ in range(int(os.environ.get("GPUCLOUD_KILLS", "50"))):
        p = subprocess.Popen([binary, *ck_args, "--checkpoint-dir", ckdir, "--resume"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        saves_before_kill, saves, out = rng.choice([1, 2, 2, 3]), 0, ""
        for line in p.stdout:
            out += line
            resumes += line.startswith("resumed from")
            saves += line.startswith("checkpoint: step")
            if saves == saves_before_kill:
                break
        time.sleep(rng.uniform(0.0, 0.05))
        if p.poll() is None:
            p.kill()
            kills += 1
        rest, _ = p.communicate()
        out += rest
        if p.returncode not in (0, -signal.SIGKILL):
            sys.exit(f"FAILED: a restarted run exited with {p.returncode}:\n{out}")
    final = run([binary, *ck_args, "--checkpoint-dir", ckdir, "--resume", "--dump", f"{work}/resumed.bin"])
    print(f"{kills} runs killed with SIGKILL, {resumes} resumed from a checkpoint, in {time.monotonic() - started:.1f} s")
    assert kills >= 10 and resumes >= 10, (kills, resumes)
    leftovers = [n for n in os.listdir(ckdir) if not re.fullmatch(r"step-\d{12}", n)]
    assert not leftovers, f"interrupted saves were not cleaned up: {leftovers}"
    # --keep-last 2, plus one when a run was killed between a commit and its clean-up
    assert len(os.listdir(ckdir)) <= 3, os.listdir(ckdir)
    a, c = weights(f"{work}/straight.bin"), weights(f"{work}/resumed.bin")
    worst = max(abs(x - y) for x, y in zip(a, c))
    print(f"uninterrupted vs killed {kills} times and resumed: worst weight difference {worst:.2e}")
    assert len(a) == len(c) and worst == 0.0, worst
    assert "resumed from" in final or "steps done" in final
    # A checkpoint of another model (here another dtype) is refused by name, before any training.
    other = subprocess.run([binary, *ck_args, "--dtype", "bf16", "--checkpoint-dir", ckdir, "--resume"],
                           capture_output=True, text=True, timeout=600)
    print(other.stderr)
    assert other.returncode == 1, other.returncode
    assert "'model.layer" in other.stderr and "float32 in the checkpoint, bfloat16" in other.stderr, other.stderr
    print("train_mlp checks passed")


if __name__ == "__main__":
    main()
