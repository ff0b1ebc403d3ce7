#!/usr/bin/env python3
"""Time from a rank's death to the job's first step after its restart: gpucloud-run (mpirun below
it) against torchrun's elastic agent (--max_restarts, its fastest --monitor_interval), on the same
trainer (examples/train_mlp.py; under torchrun its collectives go through gloo), and gpucloud-run
with the C++ example. torchrun runs twice: with the trainer catching SIGTERM (as the examples do,
to save on a preemption), and with GPUCLOUD_STOP_SIGNALS=USR1 (SIGTERM left to end the process,
torchrun's fastest teardown). Trials interleave the configurations; each kills a random rank with SIGKILL a
random number of steps into the run, lets the job finish, and checks its final weights against the
uninterrupted run's (bit for bit) before its times count.

    bench_recovery.py [--train-mlp build/host/examples/train_mlp] [--python PY] [--np 2 4] [--trials 5]

gpucloud-run's time is split by its status.json and the trainer's log: detection (the kill to the
launcher's exit), teardown (every process of the launch gone), backoff, start (the new processes
to their checkpoint loaded: interpreter, MPI, communicator), load (the checkpoint's, as the trainer
reports it) and the first step. torchrun gives no such split: its total is measured from the
heartbeat files the workers write (GPUCLOUD_RUN_DIR), as gpucloud-run's is.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_mlp.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")


def _read_heartbeats():
    """gpucloud-run's heartbeat reader, from the source tree (standard library only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpucloud_run_source", os.path.join(ROOT, "python", "gpucloud",
                                                                                      "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_heartbeats


read_heartbeats = _read_heartbeats()


def beats(directory):
    """{rank: (first step, latest step, first time, latest time, pid)}."""
    return {r: (b.first, b.latest, b.first_time, b.latest_time, b.pid) for r, b in read_heartbeats(directory).items()}


def same(a, b):
    import numpy as np

    if a.endswith(".npz"):
        with np.load(a) as x, np.load(b) as y:
            return all(np.array_equal(x[k], y[k]) for k in x.files)
    with open(a, "rb") as x, open(b, "rb") as y:
        return x.read() == y.read()


class Config:
    def __init__(self, name, args, ranks):
        self.name, self.args, self.np = name, args, ranks
        self.python = args.python
        self.ext = ".bin" if name == "gpucloud-run C++" else ".npz"

    def env(self, base):
        """torchrun's workers must not see an MPI launch's variables (mpirun's, srun's)."""
        if not self.name.startswith("torchrun"):
            return base
        env = {k: v for k, v in base.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))}
        if self.name.endswith("USR1"):  # the trainer leaves SIGTERM to torchrun: its fastest teardown
            env["GPUCLOUD_STOP_SIGNALS"] = "USR1"
        return env

    def trainer(self):
        if self.name == "gpucloud-run C++":
            return [self.args.train_mlp, "--dtype", "fp32"]
        return [self.python, EXAMPLE, "--dtype", "fp32"]

    def options(self, ck, dump):
        return ["--steps", str(self.args.steps), "--log-every", str(self.args.steps), "--checkpoint-every",
                str(self.args.every), "--keep-last", "2", "--checkpoint-dir", ck, "--resume", "--dump", dump]

    def command(self, work, ck, dump):
        if self.name.startswith("torchrun"):
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            every_rank = ",".join(f"{r}:1" for r in range(self.np))
            return [self.python, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0", "--nproc_per_node",
                    str(self.np), "--master_addr", "127.0.0.1", "--master_port", str(port), "--max_restarts", "3",
                    "--monitor_interval", "0.1", "-r", every_rank, "-t", every_rank, "--log_dir",
                    os.path.join(work, "torchrun-logs"), EXAMPLE, "--dtype", "fp32", *self.options(ck, dump)]
        return [self.python, os.path.join(ROOT, "python", "gpucloud", "run.py"), "--backoff", "0", "--max-restarts",
                "3", "--run-dir", os.path.join(work, "run"), "--", *MPIRUN, "-np", str(self.np), *self.trainer(),
                *self.options(ck, dump)]

    def reference(self, work):
        dump = os.path.join(work, "reference" + self.ext)
        cmd = [*MPIRUN, "-np", str(self.np), *self.trainer(), *self.options(os.path.join(work, "ref-ck"), dump)]
        if self.name.startswith("torchrun"):
            cmd = self.command(work, os.path.join(work, "ref-ck"), dump)
        subprocess.run(cmd, env=self.env(ENV), check=True, capture_output=True, timeout=900)
        return dump

    def trial(self, work, reference, rng):
        ck, dump = os.path.join(work, "ck"), os.path.join(work, "out" + self.ext)
        for path in (ck, dump, os.path.join(work, "run"), os.path.join(work, "beats")):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else None
        beat_dir = os.path.join(work, "beats") if self.name.startswith("torchrun") else os.path.join(work, "run",
                                                                                                   "attempt-0")
        os.makedirs(os.path.join(work, "beats"), exist_ok=True)
        env = self.env(dict(ENV, GPUCLOUD_RUN_DIR=os.path.join(work, "beats")))
        log = open(os.path.join(work, "log"), "w")
        p = subprocess.Popen(self.command(work, ck, dump), env=env, stdout=log, stderr=subprocess.STDOUT)
        target = rng.randint(self.args.every + 2, self.args.steps // 2)
        while True:
            b = beats(beat_dir)
            if len(b) == self.np and min(x[1] for x in b.values()) >= target:
                break
            if p.poll() is not None:
                raise SystemExit(f"{self.name}: the job ended before its kill:\n" + open(log.name).read()[-3000:])
            time.sleep(0.002)
        killed_at = time.time()
        os.kill(b[rng.randrange(self.np)][4], signal.SIGKILL)
        total = None
        while p.poll() is None or total is None:
            after = beats(os.path.join(work, "run", "attempt-1") if not self.name.startswith("torchrun") else beat_dir)
            fresh = [x for x in after.values() if x[2] > killed_at]
            if total is None and len(fresh) == self.np:
                total = max(x[2] for x in fresh) - killed_at
            if p.poll() is not None and total is None:
                raise SystemExit(f"{self.name}: no first step after the restart:\n" + open(log.name).read()[-3000:])
            time.sleep(0.002)
        log.close()
        text = open(log.name).read()
        if p.returncode != 0 or not same(reference, dump):
            keep = tempfile.mkdtemp(prefix="bench_recovery.failed.")
            shutil.copytree(work, keep, dirs_exist_ok=True)
            raise SystemExit(f"{self.name}: exit {p.returncode}, or its weights differ from the uninterrupted run's "
                             f"(kept in {keep}):\n" + text[-3000:])
        split = {"total": total}
        if not self.name.startswith("torchrun"):
            status = json.load(open(os.path.join(work, "run", "status.json")))["launches"]
            first, second = status[0], status[1]
            loads = [float(x) for x in re.findall(r"resumed from .* in (\d+\.\d+) s", text)]
            load = loads[-1] if loads else 0.0
            split.update(detection=first["ended_at"] - killed_at, teardown=first["torn_down_at"] - first["ended_at"],
                         backoff=second["launched_at"] - first["torn_down_at"],
                         start=second["first_step_at"] - second["launched_at"] - load, load=load)
        return split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-mlp", help="the C++ example (build/host/examples/train_mlp)")
    ap.add_argument("--python", default=sys.executable, help="an interpreter with gpucloud (and torch for torchrun)")
    ap.add_argument("--np", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--seed", type=int, default=35)
    args = ap.parse_args()
    has_torch = subprocess.run([args.python, "-c", "import torch.distributed.run"], capture_output=True).returncode == 0
    names = ["gpucloud-run Python"] + (["torchrun Python", "torchrun Python USR1"] if has_torch else []) + \
        (["gpucloud-run C++"] if args.train_mlp else [])
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="bench_recovery.")
    print(f"commit {subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}; "
          f"{args.trials} trials per configuration, {args.steps} steps, a checkpoint every {args.every}; "
          f"torch {'found' if has_torch else 'not found: no torchrun'}", flush=True)
    try:
        for ranks in args.np:
            configs = [Config(n, args, ranks) for n in names]
            refs = {}
            dirs = {c.name: os.path.join(work, f"{ranks}-ranks", c.name.replace(" ", "_")) for c in configs}
            for c in configs:
                os.makedirs(dirs[c.name])
                refs[c.name] = c.reference(dirs[c.name])
            results = {c.name: [] for c in configs}
            for t in range(args.trials):
                for c in configs if t % 2 == 0 else reversed(configs):
                    results[c.name].append(c.trial(dirs[c.name], refs[c.name], rng))
            print(f"\n{ranks} ranks: median seconds from SIGKILL of a rank to every rank's first step after the restart")
            print(f"  {'configuration':22s} {'total':>7s} {'detect':>7s} {'teardown':>8s} {'backoff':>7s} {'start':>7s} "
                  f"{'load':>7s}")
            base = statistics.median(r["total"] for r in results["gpucloud-run Python"])
            for c in configs:
                rs = results[c.name]
                med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                cols = "".join(f" {med[k]:7.2f}" if k in med else "       -" for k in
                               ("detection", "teardown", "backoff", "start", "load"))
                print(f"  {c.name:22s} {med['total']:7.2f}{cols}   x{med['total'] / base:.2f} of gpucloud-run Python")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
