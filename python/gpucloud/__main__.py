"""python -m gpucloud: the build configuration and the devices this process sees."""

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
    if gpucloud.cuda_device_count() > 0 and gpucloud.nvml_unavailable_reason():
        print(f"  NVML: {gpucloud.nvml_unavailable_reason()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
