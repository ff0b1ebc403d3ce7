#!/usr/bin/env python3
"""Data-parallel scaling of the training example: train_mlp's samples/s on 1 rank and on N ranks
(mpirun, the same global batch), interleaved round by round, with each run's time split as the
example reports it: waiting for data (the prefetcher), communication (the communicator's own
busy time, measured around its collectives on the stream) and compute with the rest.

    bench_train_scaling.py TRAIN_MLP [--ranks 2] [--steps 1500] [--batch 256] [--dtype fp16] [--rounds 3]

Prints every run and the median samples/s of each size and their ratio (N ranks / 1 rank). On a
machine with fewer cores than ranks x threads the ranks share cores: the ratio then measures the
overhead of data parallelism, not a speed-up.
"""
import argparse
import os
import re
import statistics
import subprocess

TIME = re.compile(r"time: ([\d.]+) s for (\d+) steps, (\d+) samples/s \((\d+) ranks?\); data wait ([\d.]+) s "
                  r"\(([\d.]+) %\), communication ([\d.]+) s \(([\d.]+) %\), compute and the rest ([\d.]+) s "
                  r"\(([\d.]+) %\)")


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    m = TIME.search(out.stdout)
    if not m:
        raise SystemExit(f"no 'time:' line in the output of {' '.join(cmd)}:\n{out.stdout}")
    v = [float(g) for g in m.groups()]
    return {"seconds": v[0], "samples_per_s": v[2], "ranks": int(v[3]), "data_pct": v[5], "comm_pct": v[7],
            "compute_pct": v[9]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train_mlp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    common = [args.train_mlp, "--steps", str(args.steps), "--batch", str(args.batch), "--dtype", args.dtype,
              "--log-every", str(args.steps), "--overflow-at", "-1"]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(args.ranks)]
    print(f"train_mlp scaling: {args.steps} steps, global batch {args.batch}, {args.dtype}, 1 vs {args.ranks} ranks, "
          f"{os.cpu_count()} cores, OPENBLAS_NUM_THREADS={env.get('OPENBLAS_NUM_THREADS', 'default')}")
    results = {1: [], args.ranks: []}
    for r in range(args.rounds):
        for ranks, cmd in ((1, common), (args.ranks, mpirun + common)):
            res = run(cmd, env)
            results[ranks].append(res)
            print(f"  round {r + 1}: {ranks} rank(s): {res['samples_per_s']:8.0f} samples/s in {res['seconds']:.2f} s; "
                  f"data wait {res['data_pct']:.1f} %, communication {res['comm_pct']:.1f} %, "
                  f"compute and the rest {res['compute_pct']:.1f} %")
    med = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in results.items()}
    comm = statistics.median(x["comm_pct"] for x in results[args.ranks])
    print(f"median: 1 rank {med[1]:.0f} samples/s, {args.ranks} ranks {med[args.ranks]:.0f} samples/s, "
          f"ratio {med[args.ranks] / med[1]:.2f}; communication {comm:.1f} % of the {args.ranks}-rank run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
