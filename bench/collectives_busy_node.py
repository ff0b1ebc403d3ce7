#!/usr/bin/env python3
"""Collectives on a quiet and on a busy node, against the raw MPI calls, over several runs.

Runs `bench_collectives --loaded` (every benchmark quiet, then again beside one CPU-bound process
per core) under mpirun for each rank count, RUNS times, and prints per collective, size and
condition the ratio raw / gpucloud (above 1: faster than the raw call) as the median over the runs
with their range: of the per-call means (what a job pays over many calls; beside busy cores the
per-call times are bimodal, a call meets a scheduler tick or not) and of the medians; and the ratio
of the means pooled over every call of the runs, with its 95 % confidence interval over the runs
(how far the runs' counts of slow calls leave the true ratio open).

    python3 bench/collectives_busy_node.py --build build/host --ranks 2 4 --runs 3 \\
        --sizes 2097152,4194304,16777216 [--json busy.json]

The raw calls run with MPI's defaults on this machine (its single-copy mechanism when the kernel
allows it), the peer's fastest configuration here; gpucloud's routes are its defaults
(GPUCLOUD_COLLECTIVE_ROUTE unset: measured).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

KINDS = {0: "all-reduce", 2: "reduce-scatter", 3: "all-gather", 4: "broadcast"}


def one_run(build, ranks, sizes, kinds):
    bench = os.path.join(build, "bench", "bench_collectives")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    cmd += [bench, "--loaded", f"--sizes={sizes}", "--benchmark_format=json",
            "--benchmark_filter=kind:[" + "".join(str(k) for k in kinds) + "]/"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    rows = {}
    for b in json.loads(out)["benchmarks"]:
        parts = b["name"].split("/")
        kind = int(parts[1].split(":")[1])
        size = int(parts[2].split(":")[1])
        loaded = "loaded" in parts
        rows[(kind, size, loaded)] = b
    return rows


# Two-sided 95 % quantiles of Student's t by degrees of freedom, 1-30 (beyond: 2.04 up to 59, then 2.0).
T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11,
       2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04]


def t95(dof):
    return T95[dof - 1] if dof <= len(T95) else 2.04 if dof < 60 else 2.0


def pooled(rs):
    """Raw / gpucloud of the means over every call of the runs @p rs, with a 95 % confidence
    interval (low, high), or None with fewer than two runs or where the runs lack their call counts.
    Beside busy cores a call meets a scheduler tick or not, and each run (a fresh mpirun) has its
    own share of slow calls: runs differ by more than their calls' spread says, so the interval is
    over runs (each run's calls one cluster: R's error is about sum(raw_i - R ours_i) / sum(ours_i),
    its variance from the runs' sums, with Student's t for the runs' count). With three runs it is
    wide; more runs narrow it."""
    k = len(rs)
    if k < 2 or any("calls" not in r for r in rs):
        return None
    n = sum(r["calls"] for r in rs)
    ours = sum(r["calls"] * r["mean_us"] for r in rs) / n
    raw = sum(r["calls"] * r["raw_mean_us"] for r in rs) / n
    ratio = raw / ours
    residuals = sum((r["calls"] * (r["raw_mean_us"] - ratio * r["mean_us"])) ** 2 for r in rs)
    half = t95(k - 1) * math.sqrt(k / (k - 1) * residuals) / (n * ours)
    return ratio, ratio - half, ratio + half


def interval(p, none):
    """pooled()'s answer as "R (low-high)", or @p none."""
    return f"{p[0]:.2f} ({p[1]:.2f}-{p[2]:.2f})" if p else none


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build/host", help="build directory with bench/bench_collectives")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="2097152,4194304,16777216", help="bytes, comma-separated")
    ap.add_argument("--kinds", type=int, nargs="+", default=sorted(KINDS), help="0 all-reduce, 2, 3, 4")
    ap.add_argument("--json", help="write the per-run figures here (bench/report.py reads them)")
    args = ap.parse_args()
    results = []
    for run in range(args.runs):
        for ranks in args.ranks:  # alternating rank counts: a slow phase of the machine hits both
            print(f"run {run + 1}/{args.runs}, {ranks} ranks ...", file=sys.stderr, flush=True)
            for (kind, size, loaded), b in one_run(args.build, ranks, args.sizes, args.kinds).items():
                results.append({"ranks": ranks, "collective": KINDS[kind], "bytes": size,
                                "condition": "loaded" if loaded else "quiet", "run": run,
                                "mean_ratio_vs_raw": b["mean_ratio_vs_raw"], "ratio_vs_raw": b["ratio_vs_raw"],
                                "mean_us": b["mean_us"], "median_us": b["median_us"], "raw_us": b["raw_us"],
                                "raw_mean_us": b["raw_mean_us"], "calls": int(b["calls"]), "loadavg": b["loadavg"]})
    print(f"raw MPI time / gpucloud time, median over {args.runs} runs [range]; above 1: faster than raw;"
          " pooled: of the means over every call of the runs (95 % confidence interval over the runs)")
    print(f"{'ranks':>5} {'collective':<15} {'bytes':>9} {'condition':<9} {'of means':>20} {'of medians':>20} "
          f"{'pooled':>20}  load")
    keys = sorted({(r["ranks"], r["collective"], r["bytes"], r["condition"]) for r in results},
                  key=lambda k: (k[0], k[3], k[1], k[2]))
    for key in keys:
        rs = [r for r in results if (r["ranks"], r["collective"], r["bytes"], r["condition"]) == key]
        m = [r["mean_ratio_vs_raw"] for r in rs]
        d = [r["ratio_vs_raw"] for r in rs]
        load = statistics.median(r["loadavg"] for r in rs)
        p = pooled(rs)
        print(f"{key[0]:>5} {key[1]:<15} {key[2]:>9} {key[3]:<9} "
              f"{statistics.median(m):6.2f} [{min(m):.2f}-{max(m):.2f}] {statistics.median(d):6.2f} "
              f"[{min(d):.2f}-{max(d):.2f}] {interval(p, '-'):>20}  {load:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "collectives_busy_node", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
