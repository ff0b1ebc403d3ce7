"""The deployment files as shipped: the Kubernetes manifests validate against the Kubernetes
schemas (kubernetes-validate, strict) and agree with the Slurm launcher and the image (the same
trainer, arguments, ports and working directory; one pod per node, a GPU per rank); the
Dockerfile passes hadolint. No cluster or Docker daemon is reachable here: these are the checks
that run without one."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s" / "train-mlp.yaml"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
LAUNCH = ROOT / "deploy" / "slurm" / "launch.sh"


def tool(name):
    """A console script of this environment (pip installs them beside the interpreter)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (python/requirements-test.txt)")
    return found


def clean_env():
    """The environment without a preloaded sanitizer runtime (python-asan preloads one for the
    bindings; these tools are not instrumented)."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def documents():
    yaml = pytest.importorskip("yaml")
    return {d["kind"]: d for d in yaml.safe_load_all(K8S.read_text())}


def test_the_manifests_validate_strictly_and_a_broken_one_does_not(tmp_path):
    validate = tool("kubernetes-validate")
    ok = subprocess.run([validate, "--strict", str(K8S)], capture_output=True, text=True, timeout=300, env=clean_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("passed") == 4, ok.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text(K8S.read_text().replace("completions: 2", "completions: two", 1))
    bad = subprocess.run([validate, "--strict", str(broken)], capture_output=True, text=True, timeout=300,
                         env=clean_env())
    assert bad.returncode != 0, bad.stdout  # the validator does check


def test_the_job_runs_the_slurm_launchers_trainer_and_arguments():
    docs = documents()
    job, service, pdb = docs["Job"], docs["Service"], docs["PodDisruptionBudget"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    torchrun = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}
    trainer = args[args.index("examples/train_mlp.py") + 1:]
    nodes = int(torchrun["--nnodes"])
    # One pod per node, all of them at once, all protected from drains.
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes == pdb["spec"]["minAvailable"]
    # A rank per GPU, rendezvous on pod 0 through the headless Service.
    assert int(torchrun["--nproc-per-node"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    assert torchrun["--master-addr"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert torchrun["--node-rank"] == "$(NODE_RANK)"
    # The options deploy/slurm/launch.sh gives the trainer, with the GPU and metrics set.
    launch = LAUNCH.read_text()
    for option in re.findall(r'(--device|--checkpoint-dir|--resume|--metrics-port) ', launch):
        assert option in trainer, (option, trainer)
    assert trainer[trainer.index("--device") + 1] == "cuda"
    assert trainer[trainer.index("--checkpoint-dir") + 1].startswith(
        container["volumeMounts"][0]["mountPath"] + "/")
    metrics = trainer[trainer.index("--metrics-port") + 1]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == metrics
    assert {p["containerPort"] for p in container["ports"]} == {int(metrics), int(torchrun["--master-port"])}
    # Every trainer option exists.
    help_text = subprocess.run([sys.executable, str(ROOT / "examples" / "train_mlp.py"), "--help"],
                               capture_output=True, text=True, timeout=120).stdout
    for option in (a for a in trainer if a.startswith("--")):
        assert option in help_text, option
    # The image's working directory holds examples/ and deploy/.
    dockerfile = DOCKERFILE.read_text()
    assert container["workingDir"] == re.findall(r"^WORKDIR (\S+)", dockerfile, re.M)[-1]
    assert "COPY examples/ examples/" in dockerfile and "COPY deploy/ deploy/" in dockerfile


def test_the_dockerfile_passes_hadolint(tmp_path):
    hadolint = tool("hadolint")
    ok = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120, env=clean_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("WORKDIR /src", "RUN cd /src", 1))
    flagged = subprocess.run([hadolint, str(bad)], capture_output=True, timeout=120, env=clean_env())
    assert flagged.returncode != 0  # it does check
