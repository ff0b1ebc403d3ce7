#!/usr/bin/env python3
"""What serving metrics costs the training loop: train_mlp's wall time with --metrics-port (every
step recorded, the device monitor running, /metrics scraped every second as Prometheus would) vs
without metrics, interleaved round by round (target: within 2 %).

    bench_telemetry_train.py TRAIN_MLP [--steps 2000] [--rounds 3] [--scrape-interval 1.0]
"""
import argparse
import os
import re
import statistics
import subprocess
import threading
import time
import urllib.request


def run(cmd, scrape_interval):
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, scrapes = threading.Event(), [0]

    def scraper(port):
        while not stop.wait(scrape_interval):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                scrapes[0] += 1
            except OSError:
                pass

    thread = None
    for line in p.stdout:
        m = re.search(r"metrics at http://[^:]+:(\d+)/metrics", line)
        if m and thread is None:
            thread = threading.Thread(target=scraper, args=(int(m.group(1)),))
            thread.start()
    p.wait()
    elapsed = time.perf_counter() - t
    stop.set()
    if thread:
        thread.join()
    assert p.returncode == 0
    return elapsed, scrapes[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_mlp")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    args = ap.parse_args()
    common = [args.train_mlp, "--steps", str(args.steps), "--log-every", str(args.steps), "--overflow-at", "-1"]
    variants = {"none": common, "metrics": common + ["--metrics-port", "0"]}
    times = {k: [] for k in variants}
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            elapsed, scrapes = run(variants[name], args.scrape_interval)
            times[name].append(elapsed)
            print(f"round {r} {name:7s} {elapsed:.3f} s" + (f" ({scrapes} scrapes)" if name == "metrics" else ""))
    base = statistics.median(times["none"])
    m = statistics.median(times["metrics"])
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(default)')}; train_mlp {args.steps} steps: "
          f"none {base:.3f} s, metrics served and scraped every {args.scrape_interval:g} s {m:.3f} s: {m / base - 1:+.1%}")


if __name__ == "__main__":
    main()
