"""python -m gpucloud: the build configuration and the devices this process sees.

    python -m gpucloud                        the build and the devices
    python -m gpucloud topo [--local-size N]  the machine's topology (CPUs, NUMA nodes, GPUs and
                                              their links, as nvidia-smi topo -m) and where each of
                                              N local ranks' threads belong
"""

import argparse
import sys

import gpucloud


def main() -> int:
    info = gpucloud.build_info()
    print(f"gpucloud {info.version}")
    if info.cuda:
        print(f"  CUDA backend: built (runtime {info.cuda_runtime_version}, architectures {info.cuda_architectures})")
    else:
        print("  CUDA backend: not built")
    parts = {"NCCL": info.nccl, "cuDNN": info.cudnn, "MPI": info.mpi, "Prometheus telemetry": info.telemetry}
    print("  with: " + ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in parts.items())
          + f"; host GEMM through {info.host_blas}, bf16 {info.host_bf16_gemm}; host convolutions {info.host_conv}")
    if gpucloud.cuda_device_count() == 0:
        print(f"  no CUDA device: {gpucloud.cuda_unavailable_reason()}")
    print("devices:")
    for device in gpucloud.available_devices():
        p = gpucloud.device_properties(device)
        mem = gpucloud.memory_info(device)
        cc = f"compute capability {p.compute_capability_major}.{p.compute_capability_minor}, " if device.is_cuda else ""
        print(
            f"  {device}: {p.name} [{p.backend}] {cc}"
            f"{mem.free / 2**30:.1f} of {mem.total / 2**30:.1f} GiB free, {p.multiprocessor_count} "
            f"{'SMs' if device.is_cuda else 'hardware threads'}"
        )
        m = gpucloud.read_metrics(device)
        figures = [f"{name} {value:.0f}{unit}" for name, value, unit in (
            ("util", m.utilization, "%"), ("temperature", m.temperature_c, " C"), ("power", m.power_w, " W"),
            ("power limit", m.power_limit_w, " W"), ("clock", m.clock_mhz, " MHz")) if value is not None]
        print(f"    now ({m.source}): {', '.join(figures) or 'no load figures'}")
        if device.is_cuda:
            health = {k: v for k, v in m.as_dict().items() if k in (
                "xid", "ecc_dbe_volatile", "ecc_sbe_volatile", "remapped_rows_uncorrectable", "row_remap_failure",
                "pcie_replay_counter", "throttle_reasons")}
            print(f"    health: {', '.join(f'{k} {v:g}' for k, v in health.items()) or 'not reported'}")
    if gpucloud.cuda_device_count() > 0 and gpucloud.nvml_unavailable_reason():
        print(f"  NVML: {gpucloud.nvml_unavailable_reason()}")
    return 0


def _cpus(cpus):
    """A CPU list as Linux writes it: "0-3,8"."""
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out) or "-"


def topo(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpucloud topo", description="The machine's topology.")
    launch = gpucloud.launch_info_from_environment()
    ap.add_argument("--local-size", type=int, default=0,
                    help="local ranks to advise (default: the launcher's, else one per GPU, else 1)")
    args = ap.parse_args(argv)
    t = gpucloud.topology()
    print(f"machine ({t.source}): {t.packages} package(s), {t.cores} cores, {t.hardware_threads} hardware threads; "
          f"this process may run on {len(t.allowed_cpus)}: {_cpus(t.allowed_cpus)}")
    for n in t.numa_nodes:
        print(f"  NUMA node {n.index}: CPUs {_cpus(n.cpus)}, {n.memory_bytes / 2**30:.1f} GiB")
    if t.gpus:
        names = [f"GPU{g.index}" for g in t.gpus]
        print("\n" + "\t".join([""] + names + ["CPU Affinity", "NUMA Affinity", "PCI"]))
        for i, g in enumerate(t.gpus):
            links = t.gpu_links[i] if t.gpu_links else ["X" if j == i else "?" for j in range(len(t.gpus))]
            numa = str(g.numa_node) if g.numa_node >= 0 else "N/A"
            print("\t".join([names[i]] + links + [_cpus(g.cpus), numa, g.pci_bus_id]))
        if not t.gpu_links:
            print(f"(links: NVML unavailable: {gpucloud.nvml_unavailable_reason()})")
    for m in gpucloud.mig_instances():
        print(f"  MIG {m.uuid} on GPU {m.gpu}: GPU instance {m.gpu_instance_id}, compute instance "
              f"{m.compute_instance_id}, {m.multiprocessors} SMs, {m.memory_bytes / 2**30:.1f} GiB")
    size = args.local_size or (launch.local_size if launch.launcher != "none" else 0) or len(t.gpus) or 1
    print(f"\nbinding advice for {size} local rank(s)" + (" (GPU r % GPUs for rank r)" if t.gpus else "") + ":")
    for r in range(size):
        a = gpucloud.binding_advice(t, r, size, r % len(t.gpus) if t.gpus else -1)
        print(f"  local rank {r}: CPUs {_cpus(a.cpus)}  ({a.reason})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["topo"]:
        raise SystemExit(topo(sys.argv[2:]))
    raise SystemExit(main())
