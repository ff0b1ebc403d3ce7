#!/usr/bin/env python3
"""A real Prometheus server scraping a 2-rank train_mlp under mpirun (run by CTest).

    prometheus_e2e.py TRAIN_MLP_BINARY WORK_DIR

Starts train_mlp with --metrics-port on two free ports, a Prometheus (Debian's `prometheus`) on a
loopback port with a generated config (1 s scrapes, honor_labels, deploy/prometheus/alerts.yml as
its rules), then asks Prometheus's HTTP API for each rank's step-time series, the device metrics
and the rules, and stops both. Fails, saying what to install, when Prometheus is missing.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_ports(n):
    """n consecutive free loopback ports."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", p))
                except OSError:
                    ok = False
        if ok:
            return base
    sys.exit("FAILED: no free ports")


def query(port, promql):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=30) as r:  # a loaded machine answers slowly
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def main():
    binary, work = sys.argv[1], sys.argv[2]
    prometheus, mpirun = shutil.which("prometheus"), shutil.which("mpirun")
    if prometheus is None:
        sys.exit("FAILED: the prometheus server is not installed (Debian package `prometheus`; scripts/setup.sh installs it)")
    if mpirun is None:
        sys.exit("FAILED: mpirun is not installed (Debian package `openmpi-bin`)")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    metrics_port = free_ports(2)
    prom_port = free_ports(1)
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{ROOT}/deploy/prometheus/alerts.yml"]
scrape_configs:
  - job_name: gpucloud
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}", "127.0.0.1:{metrics_port + 1}"]
        labels: {{gpucloud: "true"}}
""")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
               GPUCLOUD_JOB="e2e")
    train = subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2", binary,
                              "--steps", "1000000", "--log-every", "2000", "--overflow-at", "-1",
                              "--metrics-port", str(metrics_port)],
                             env=env, stdout=open(os.path.join(work, "train.log"), "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    server = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        found = {}
        while time.monotonic() < deadline:
            time.sleep(1)
            if train.poll() is not None or server.poll() is not None:
                break
            try:
                steps = query(prom_port, 'gpucloud_step_seconds_count{job="e2e"}')
                device = query(prom_port, 'gpucloud_host_memory_used_bytes{job="e2e"}')
                up = query(prom_port, 'up{gpucloud="true"}')
            except OSError:
                continue  # Prometheus still starting
            found = {
                "steps": {r["metric"]["rank"]: float(r["value"][1]) for r in steps},
                "device": {r["metric"]["rank"]: float(r["value"][1]) for r in device},
                "up": sorted(float(r["value"][1]) for r in up),
            }
            if (set(found["steps"]) == {"0", "1"} and all(v > 0 for v in found["steps"].values())
                    and set(found["device"]) == {"0", "1"} and found["up"] == [1.0, 1.0]):
                break
        print("found:", found)
        assert set(found.get("steps", {})) == {"0", "1"}, f"each rank's step series: {found}"
        assert all(v > 0 for v in found["steps"].values()), found
        assert set(found["device"]) == {"0", "1"} and all(v > 0 for v in found["device"].values()), found
        assert found["up"] == [1.0, 1.0], found
        labels = query(prom_port, 'gpucloud_steps_total{job="e2e",rank="1"}')[0]["metric"]
        assert labels["local_rank"] == "1" and labels["node"], labels
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=5) as r:
            rules = [rule["name"] for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
        print("rules loaded:", rules)
        # Every alert and recording rule the shipped file defines ("- alert: NAME", "- record: NAME"),
        # loaded by the real server.
        with open(f"{ROOT}/deploy/prometheus/alerts.yml", encoding="utf-8") as f:
            shipped = [line.split(":", 1)[1].strip() for line in f
                       if line.strip().startswith(("- alert:", "- record:"))]
        assert sorted(rules) == sorted(shipped) and "GpuTooHot" in rules, (rules, shipped)
        print("PROMETHEUS E2E PASSED")
    finally:
        os.killpg(train.pid, signal.SIGTERM)
        server.terminate()
        for p in (train, server):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for name in ("train.log", "prometheus.log"):
            with open(os.path.join(work, name)) as f:
                tail = f.read()[-1500:]
            print(f"--- {name} (tail)\n{tail}")


if __name__ == "__main__":
    main()
