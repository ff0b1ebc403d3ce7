#!/usr/bin/env python3
"""Faults against a supervised training job (run by CTest for the C++ example and by pytest for
the Python one): every trial must end with the uninterrupted run's final weights, bit for bit.

    fault_trials.py MODE --work DIR --np N [--trials T] [--per-job P] [--supervisor CMD] -- RANK_COMMAND...

MODE
  kill     SIGKILL of a random rank at a random moment of a step, a collective or a background save;
           gpucloud-run restarts the job from its newest valid checkpoint (P kills per job).
  preempt  SIGTERM or SIGUSR1 to gpucloud-run at a random moment: the ranks agree on a step, commit
           its checkpoint and exit 75, and so does gpucloud-run; relaunched (as Slurm's requeue
           would), the job resumes at exactly that step: 0 steps lost.
  hang     SIGSTOP of a random rank: the others' collectives time out (GPUCLOUD_COMM_TIMEOUT), the
           job fails, gpucloud-run ends the stopped rank and restarts.

RANK_COMMAND is what mpirun starts on each rank (the C++ binary, or python examples/train_mlp.py);
the driver adds the training, checkpoint and --dump options.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
PREEMPTED = 75


def _load_supervisor():
    """gpucloud-run's module, from the source tree (it needs only the standard library)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "gpucloud", "run.py")
    spec = importlib.util.spec_from_file_location("gpucloud_run_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


read_heartbeats = _load_supervisor().read_heartbeats


def heartbeats(attempt_dir):
    """{rank: (first step, latest step, pid)} of the ranks beating in ``attempt_dir``."""
    return {rank: (b.first, b.latest, b.pid) for rank, b in read_heartbeats(attempt_dir).items()}


def _descendants(root):
    """Every process under ``root``, read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def job_stacks(root):
    """A stuck job, described: each process's command line, state and wait channel, and with gdb
    every thread's backtrace."""
    out = []
    for pid in [root, *_descendants(root)]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
        except OSError:
            continue
        out.append(f"pid {pid} state {state} wchan {wchan}: {cmd}")
        if shutil.which("gdb") and state != "Z":
            try:
                r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                                   capture_output=True, text=True, timeout=60)
                out += [line for line in r.stdout.splitlines() if line.startswith(("#", "Thread"))]
            except subprocess.TimeoutExpired:
                out.append("(gdb did not attach within 60 s)")
    return "\n".join(out)


def same_weights(a, b):
    if a.endswith(".pt"):  # the torch examples' flat weight tensor
        import torch

        return torch.equal(torch.load(a), torch.load(b))
    if a.endswith(".npz"):
        import numpy as np

        with np.load(a) as x, np.load(b) as y:
            return sorted(x.files) == sorted(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)
    with open(a, "rb") as x, open(b, "rb") as y:
        return x.read() == y.read()


class Trials:
    def __init__(self, args, rank_command):
        self.args = args
        self.rank_command = rank_command
        self.rng = random.Random(args.seed)
        scripts = [os.path.basename(c) for c in rank_command if c.endswith(".py")]
        self.ext = ".bin" if not scripts else ".pt" if scripts[0].startswith("torch_") else ".npz"
        self.train = ["--steps", str(args.steps), "--log-every", str(args.steps), "--checkpoint-every",
                      str(args.checkpoint_every), "--keep-last", "2"]
        if self.ext != ".pt":  # the torch examples train in fp32 (with torch's GradScaler rule)
            self.train += ["--dtype", "fp32"]

    def job(self, ck, dump, extra=()):
        return [*MPIRUN, "-np", str(self.args.np), *self.rank_command, *self.train, "--checkpoint-dir", ck,
                "--resume", "--dump", dump, *extra]

    def reference(self):
        dump = os.path.join(self.args.work, "reference" + self.ext)
        r = subprocess.run(self.job(os.path.join(self.args.work, "reference-ck"), dump), env=ENV, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"FAILED: the uninterrupted run: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return dump

    def supervised(self, run_dir, ck, dump, max_restarts, extra_env=None):
        command = [*self.args.supervisor, "--run-dir", run_dir, "--backoff", "0.1", "--max-restarts",
                   str(max_restarts), "--grace", "5", "--", *self.job(ck, dump)]
        log = open(os.path.join(run_dir + ".log"), "w")
        return subprocess.Popen(command, env=dict(ENV, **(extra_env or {})), stdout=log, stderr=subprocess.STDOUT), log

    def wait_for_training(self, attempt_dir, proc, faults_left):
        """Until the launch's ranks have run a random number of steps, drawn so that the faults
        still to come fit in the steps left; then a random few milliseconds more, so the fault lands
        anywhere in a step, its collectives or a background save. None when the job ended first."""
        target = None
        while proc.poll() is None:
            beats = heartbeats(attempt_dir)
            if len(beats) == self.args.np:
                first = min(b[0] for b in beats.values())
                if target is None:
                    span = max(4, (self.args.steps - first) // (faults_left + 1))
                    target = first + self.rng.randint(2, span)
                if min(b[1] for b in beats.values()) >= target:
                    time.sleep(self.rng.uniform(0.0, 0.02))
                    return beats
            time.sleep(0.002)
        return None

    def fail(self, why, run_dir, more=""):
        with open(run_dir + ".log") as f:
            sys.exit(f"FAILED: {why}\n--- gpucloud-run's output:\n{f.read()[-6000:]}{more}")

    def wait(self, proc, log, run_dir, timeout):
        """gpucloud-run's exit status; after ``timeout`` s, fails with what every process of the job
        was doing (its state, kernel wait channel and, where gdb is installed, every thread's stack)."""
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = job_stacks(proc.pid)
            proc.kill()
            for pid in _descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            log.close()
            self.fail(f"the job did not end within {timeout} s", run_dir, "\n--- its processes:\n" + stacks)

    def run(self):
        shutil.rmtree(self.args.work, ignore_errors=True)
        os.makedirs(self.args.work)
        reference = self.reference()
        done, job, started = 0, 0, time.monotonic()
        while done < self.args.trials:
            run_dir = os.path.join(self.args.work, f"job-{job}")
            ck, dump = run_dir + "-ck", run_dir + self.ext
            faults = min(self.args.per_job, self.args.trials - done)
            done += getattr(self, "job_" + self.args.mode)(run_dir, ck, dump, faults)
            if not same_weights(reference, dump):
                self.fail(f"job {job}: the final weights differ from the uninterrupted run's", run_dir)
            job += 1
        print(f"{self.args.mode}: {done} trials in {job} jobs on {self.args.np} ranks, {time.monotonic() - started:.0f} s: "
              "every job ended with the uninterrupted run's weights, bit for bit")
        print("FAULT TRIALS PASSED")

    def job_kill(self, run_dir, ck, dump, kills):
        proc, log = self.supervised(run_dir, ck, dump, max_restarts=kills)
        for attempt in range(kills):
            beats = self.wait_for_training(os.path.join(run_dir, f"attempt-{attempt}"), proc, kills - attempt)
            if beats is None:
                self.fail(f"the job ended before kill {attempt + 1} of {kills}", run_dir)
            rank = self.rng.randrange(self.args.np)
            try:
                os.kill(beats[rank][2], signal.SIGKILL)
            except ProcessLookupError:
                self.fail("the rank to kill had ended: it ended before its kill", run_dir)
        code = self.wait(proc, log, run_dir, 600)
        log.close()
        if code != 0:
            self.fail(f"gpucloud-run exited {code} after {kills} kills", run_dir)
        with open(run_dir + ".log") as f:
            out = f.read()
        if out.count("resumed from") < kills and out.count("restart ") < kills:
            self.fail("fewer restarts than kills", run_dir)
        return kills

    def job_preempt(self, run_dir, ck, dump, preemptions):
        stopped_at = None
        for n in range(preemptions + 1):
            launch_dir = f"{run_dir}.{n}"
            proc, log = self.supervised(launch_dir, ck, dump, max_restarts=0)
            if n < preemptions:
                if self.wait_for_training(os.path.join(launch_dir, "attempt-0"), proc, preemptions - n) is None:
                    self.fail("the job ended before its preemption", launch_dir)
                signo = self.rng.choice([signal.SIGTERM, signal.SIGUSR1])
                proc.send_signal(signo)
                if self.rng.random() < 0.3:  # a second notice during the save: the save still commits
                    time.sleep(self.rng.uniform(0.0, 0.05))
                    proc.send_signal(signo)
            code = self.wait(proc, log, launch_dir, 600)
            log.close()
            with open(launch_dir + ".log") as f:
                out = f.read()
            if stopped_at is not None:  # 0 steps lost: this launch began where the last one stopped
                resumed = re.findall(r"resumed from (?:\S+ at )?step (\d+)", out)
                if resumed != [str(stopped_at)]:
                    self.fail(f"resumed at {resumed}, not at the stop step {stopped_at}", launch_dir)
            if n == preemptions:
                if code != 0:
                    self.fail(f"the last launch exited {code}", launch_dir)
                break
            if code != PREEMPTED:
                self.fail(f"a preempted job exited {code}, not {PREEMPTED}", launch_dir)
            stopped = set(re.findall(r"preempted by .* at step (\d+): checkpoint at step \d+ committed", out))
            if len(stopped) != 1:
                self.fail(f"the ranks reported stop steps {sorted(stopped)}: one expected", launch_dir)
            stopped_at = int(stopped.pop())
            if not os.path.isdir(os.path.join(ck, f"step-{stopped_at:012d}")):
                self.fail(f"no checkpoint at the stop step {stopped_at}", launch_dir)
        return preemptions

    def job_hang(self, run_dir, ck, dump, hangs):
        proc, log = self.supervised(run_dir, ck, dump, max_restarts=hangs,
                                    extra_env={"GPUCLOUD_COMM_TIMEOUT": str(self.args.comm_timeout)})
        for attempt in range(hangs):
            beats = self.wait_for_training(os.path.join(run_dir, f"attempt-{attempt}"), proc, hangs - attempt)
            if beats is None:
                self.fail(f"the job ended before hang {attempt + 1} of {hangs}", run_dir)
            os.kill(beats[self.rng.randrange(self.args.np)][2], signal.SIGSTOP)
        code = self.wait(proc, log, run_dir, 300)
        log.close()
        if code != 0:
            self.fail(f"gpucloud-run exited {code} after {hangs} hangs", run_dir)
        return hangs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["kill", "preempt", "hang"])
    ap.add_argument("--work", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--trials", type=int, default=20, help="faults in all (GPUCLOUD_FAULT_TRIALS caps it)")
    ap.add_argument("--per-job", type=int, default=5, help="faults per job (each job compared to the reference)")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--checkpoint-every", type=int, default=40)
    ap.add_argument("--comm-timeout", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("GPUCLOUD_FAULT_SEED", "35")))
    ap.add_argument("--supervisor", default=None,
                    help="the supervisor command, space-separated (default: python3 python/gpucloud/run.py)")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("-- RANK_COMMAND is missing")
    split = argv.index("--")
    args = ap.parse_args(argv[:split])
    rank_command = argv[split + 1:]
    if os.environ.get("GPUCLOUD_FAULT_TRIALS"):
        args.trials = min(args.trials, int(os.environ["GPUCLOUD_FAULT_TRIALS"]))
    here = os.path.dirname(os.path.abspath(__file__))
    args.supervisor = (args.supervisor.split() if args.supervisor else
                       [sys.executable, os.path.join(here, "..", "..", "python", "gpucloud", "run.py")])
    Trials(args, rank_command).run()


if __name__ == "__main__":
    main()
