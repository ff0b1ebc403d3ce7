#!/usr/bin/env python3
"""A real Prometheus server finding and scraping a Slurm job's ranks (run by CTest on the test
Slurm cluster, fixture slurm_cluster).

    prometheus_slurm_e2e.py TRAIN_MLP_BINARY WORK_DIR NODES

Submits deploy/slurm/train_mlp_cpu.sbatch with METRICS_PORT and PROMETHEUS_TARGETS_DIR: each of the
4 tasks, on its own node (network namespace), serves /metrics and writes its file_sd target. A
Prometheus (Debian's `prometheus`) with a file_sd_configs over that directory must find all 4
ranks on their nodes, with the Slurm job id as `job`; after scancel the targets must be gone.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prometheus_e2e import ROOT, free_ports, query  # noqa: E402

CLUSTER = os.path.join(ROOT, "scripts", "slurm-cluster.sh")


def slurm(*args, env=None):
    return subprocess.run([CLUSTER, "run", *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=env or os.environ)


def main():
    binary, work, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("FAILED: the prometheus server is not installed (Debian package `prometheus`; scripts/setup.sh installs it)")
    shutil.rmtree(work, ignore_errors=True)
    targets = os.path.join(work, "targets")
    os.makedirs(targets)
    prom_port = free_ports(1)
    metrics_port = 9400  # on each node (its own network namespace)
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpucloud
    honor_labels: true
    file_sd_configs:
      - files: ["{targets}/*.json"]
        refresh_interval: 1s
""")
    server = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
    env = dict(os.environ, TRAINER=binary, CHECKPOINT_DIR=os.path.join(work, "checkpoints"),
               METRICS_PORT=str(metrics_port), PROMETHEUS_TARGETS_DIR=targets, PROMETHEUS_TARGET_HOST="address")
    log = os.path.join(work, "job.log")
    job = None
    try:
        r = slurm("sbatch", "-N", nodes, "--ntasks-per-node", 4 // nodes,
                  "-o", log, os.path.join(ROOT, "deploy", "slurm", "train_mlp_cpu.sbatch"),
                  "--steps", 1000000, "--log-every", 2000, "--overflow-at", -1, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        job = re.search(r"Submitted batch job (\d+)", r.stdout).group(1)
        deadline = time.monotonic() + 120
        found = {}
        while time.monotonic() < deadline:
            time.sleep(1)
            if server.poll() is not None:
                break
            try:
                steps = query(prom_port, f'gpucloud_step_seconds_count{{job="{job}"}}')
                up = query(prom_port, 'up{job="gpucloud"}')
            except OSError:
                continue  # Prometheus still starting
            found = {
                "steps": {r["metric"]["rank"]: (r["metric"]["node"], float(r["value"][1])) for r in steps},
                "up": sorted(float(r["value"][1]) for r in up),
                "targets": sorted(os.listdir(targets)),
            }
            if (set(found["steps"]) == {"0", "1", "2", "3"} and all(v > 0 for _, v in found["steps"].values())
                    and found["up"] == [1.0] * 4):
                break
        print("found:", found)
        assert found.get("targets") == [f"{job}-{t}.json" for t in range(4)], found
        assert set(found.get("steps", {})) == {"0", "1", "2", "3"}, f"each rank's step series: {found}"
        assert all(v > 0 for _, v in found["steps"].values()), found
        assert found["up"] == [1.0] * 4, found
        want_nodes = {f"gcsl{i}" for i in range(1, nodes + 1)} if nodes > 1 else None
        seen_nodes = {node for node, _ in found["steps"].values()}
        assert want_nodes is None or seen_nodes == want_nodes, f"ranks on nodes {seen_nodes}, expected {want_nodes}"
        with open(os.path.join(targets, f"{job}-3.json")) as f:
            print("rank 3's target:", json.load(f))
        # The job ends: every task removes its target, so Prometheus stops scraping it.
        slurm("scancel", job)
        for _ in range(60):
            if not os.listdir(targets) and job not in slurm("squeue", "-h", "-o", "%i").stdout.split():
                break
            time.sleep(0.5)
        left = os.listdir(targets)
        assert not left, f"targets left after the job ended: {left}"
        print("PROMETHEUS SLURM E2E PASSED")
    finally:
        if job is not None:
            slurm("scancel", job)
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        for name in ("job.log", "prometheus.log"):
            path = os.path.join(work, name)
            if os.path.exists(path):
                with open(path) as f:
                    print(f"--- {name} (tail)\n{f.read()[-1500:]}")


if __name__ == "__main__":
    main()
