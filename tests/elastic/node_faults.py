#!/usr/bin/env python3
"""A node lost under a supervised job, with network namespaces as nodes (scripts/netns-nodes.sh):
gpucloud-run --nodes/--min-nodes restarts the job on the nodes that remain, from its newest valid
checkpoint (written on the old world size, loaded resharded on the new one), and a node that answers
again rejoins at the next restart. Passes when the job finishes by itself on the expected nodes at
every launch and its final weights equal, bit for bit, those of an uninterrupted run on the last
launch's nodes from the checkpoint that launch resumed from.

    node_faults.py MODE --work DIR -- RANK_COMMAND...

RANK_COMMAND: the C++ example's binary, or python examples/train_mlp.py.

MODE
  kill  every process of node 2 is SIGKILLed and the node removed mid-run: the job restarts on
        node 1 alone (2 ranks instead of 4) and finishes there.
  cut   node 2's link goes down mid-run (its ranks keep running, cut off; mpirun waits for its
        daemon there): the job restarts on node 1; once it has written a checkpoint there, the
        link comes back and a rank is killed: the next launch runs on both nodes again.

Needs root (network namespaces); the nodes are gcel1 and gcel2 on 10.79.0.0/24, made and removed
here (GPUCLOUD_NETNS_PREFIX/SUBNET), so the test runs beside the netns_nodes fixture's nodes.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
NETNS = os.path.join(ROOT, "scripts", "netns-nodes.sh")
PREFIX, SUBNET = "gcel", "10.79.0"
ENV = dict(os.environ, GPUCLOUD_NETNS_PREFIX=PREFIX, GPUCLOUD_NETNS_SUBNET=SUBNET, GPUCLOUD_COMM_TIMEOUT="4",
           OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
sys.path.insert(0, HERE)
from fault_trials import read_heartbeats, same_weights  # noqa: E402


def node_pids(node):
    r = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


class NodeFault:
    def __init__(self, args, rank_command):
        self.args = args
        self.rank_command = rank_command
        self.rng = random.Random(args.seed)
        self.work = os.path.abspath(args.work)
        self.run_dir = os.path.join(self.work, "run")
        self.log_path = os.path.join(self.work, "gpucloud-run.log")
        self.ext = ".npz" if any(c.endswith(".py") for c in rank_command) else ".bin"  # the Python example's
        self.train = ["--steps", str(args.steps), "--log-every", str(args.steps), "--checkpoint-every",
                      str(args.checkpoint_every), "--keep-last", "0", "--dtype", "fp32", "--resume"]

    def fail(self, why):
        try:
            with open(self.log_path) as f:
                out = f.read()[-8000:]
        except OSError:
            out = ""
        sys.exit(f"NODE FAULT TEST FAILED: {why}\n--- gpucloud-run's output:\n{out}")

    def wait_for(self, attempt, ranks, beyond, proc):
        """The beats of launch ``attempt`` once its ``ranks`` ranks are all ``beyond`` steps past
        where it began (so it has committed a checkpoint of its own when beyond > checkpoint_every)."""
        attempt_dir = os.path.join(self.run_dir, f"attempt-{attempt}")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.fail(f"gpucloud-run ended (exit {proc.returncode}) while launch {attempt} was awaited")
            beats = read_heartbeats(attempt_dir)
            if len(beats) > ranks:
                self.fail(f"launch {attempt} has {len(beats)} ranks, {ranks} expected")
            if len(beats) == ranks and all(b.state == "r" for b in beats.values()):
                first = min(b.first for b in beats.values())
                if min(b.latest for b in beats.values()) >= first + beyond:
                    return beats
            time.sleep(0.01)
        self.fail(f"launch {attempt} never got {beyond} steps in on {ranks} ranks")

    def run(self):
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        subprocess.run([NETNS, "up", "2"], env=ENV, check=True)
        try:
            self.job()
        finally:
            subprocess.run([NETNS, "down"], env=ENV)

    def job(self):
        ck, dump = os.path.join(self.work, "ck"), os.path.join(self.work, "final" + self.ext)
        command = [sys.executable, os.path.join(ROOT, "python", "gpucloud", "run.py"), "--run-dir", self.run_dir,
                   "--nodes", f"{PREFIX}1:2,{PREFIX}2:2", "--min-nodes", "1", "--node-check",
                   f"{NETNS} probe {{node}}", "--node-wait", "20", "--backoff", "0.1", "--grace", "3",
                   "--max-restarts", "3", "--", NETNS, "mpirun-on", "{hosts}", *self.rank_command, *self.train,
                   "--checkpoint-dir", ck, "--dump", dump]
        began = time.monotonic()
        with open(self.log_path, "w") as log:
            proc = subprocess.Popen(command, env=ENV, stdout=log, stderr=subprocess.STDOUT)
            try:
                self.faults(proc)
                code = proc.wait(timeout=600)
            finally:
                if proc.poll() is None:
                    proc.kill()
        if code != 0:
            self.fail(f"gpucloud-run exited {code}")
        with open(os.path.join(self.run_dir, "status.json")) as f:
            launches = json.load(f)["launches"]
        nodes = [launch["nodes"] for launch in launches]
        expected = {"kill": [["gcel1", "gcel2"], ["gcel1"]],
                    "cut": [["gcel1", "gcel2"], ["gcel1"], ["gcel1", "gcel2"]]}[self.args.mode]
        if nodes != expected:
            self.fail(f"the launches ran on {nodes}, not {expected}")
        if "gcel2" not in launches[1]["left_out"]:
            self.fail(f"launch 1 does not say why gcel2 was left out: {launches[1]}")
        for n, launch in enumerate(launches):
            hosts = {b.host for b in read_heartbeats(os.path.join(self.run_dir, f"attempt-{n}")).values()}
            if hosts != set(launch["nodes"]):
                self.fail(f"launch {n}'s ranks beat from {sorted(hosts)}, not from {launch['nodes']}")
        # The reference: the last launch's nodes, from the checkpoint it resumed from, uninterrupted.
        last = launches[-1]
        resumed = last["first_step"] - 1
        ref_ck, ref_dump = os.path.join(self.work, "reference-ck"), os.path.join(self.work, "reference" + self.ext)
        shutil.copytree(os.path.join(ck, f"step-{resumed:012d}"), os.path.join(ref_ck, f"step-{resumed:012d}"))
        hosts = ",".join(f"{node}:2" for node in last["nodes"])
        r = subprocess.run([NETNS, "mpirun-on", hosts, *self.rank_command, *self.train, "--checkpoint-dir", ref_ck,
                            "--dump", ref_dump], env=ENV, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            self.fail(f"the reference run exited {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        if not same_weights(dump, ref_dump):
            self.fail(f"the final weights differ from an uninterrupted run on {hosts} from step {resumed}")
        with open(self.log_path) as f:
            summary = [line.strip() for line in f if line.startswith("gpucloud-run: finished")]
        print(f"{self.args.mode}: launches on {nodes}; the last resumed from step {resumed} on {last['np']} ranks; "
              f"{time.monotonic() - began:.0f} s; {summary[-1] if summary else ''}")
        print("its final weights equal an uninterrupted run's from that checkpoint on those nodes, bit for bit")
        print("NODE FAULT TEST PASSED")

    def faults(self, proc):
        every = self.args.checkpoint_every
        self.wait_for(0, 4, every + self.rng.randint(every, 3 * every), proc)
        time.sleep(self.rng.uniform(0.0, 0.02))
        if self.args.mode == "kill":
            for pid in node_pids(f"{PREFIX}2"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", f"{PREFIX}2"], check=True)
            return
        subprocess.run(["ip", "link", "set", f"{PREFIX}v2", "down"], check=True)
        beats = self.wait_for(1, 2, every + self.rng.randint(every, 2 * every), proc)
        subprocess.run(["ip", "link", "set", f"{PREFIX}v2", "up"], check=True)
        deadline = time.monotonic() + 10  # the link carries again before the kill that brings node 2 back
        while subprocess.run([NETNS, "probe", f"{PREFIX}2"], env=ENV).returncode != 0:
            if time.monotonic() > deadline:
                self.fail("node 2's link does not carry a ping after it came back up")
        os.kill(beats[self.rng.randrange(2)].pid, signal.SIGKILL)
        self.wait_for(2, 4, 1, proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["kill", "cut"])
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("GPUCLOUD_FAULT_SEED", "35")))
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("-- RANK_COMMAND is missing")
    split = argv.index("--")
    args = ap.parse_args(argv[:split])
    NodeFault(args, argv[split + 1:]).run()


if __name__ == "__main__":
    main()
