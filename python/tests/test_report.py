"""bench/report.py turns Google Benchmark JSON into a Markdown report next to the spec table."""
import json
import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "bench" / "report.py"


def test_report_places_figures_next_to_the_spec_sheet(tmp_path):
    runs = {"benchmarks": [
        {"name": "BM_Gemm/device:1/precision:3/m:8192/n:8192/k:8192/batch:1/manual_time", "run_type": "iteration",
         "TFLOPs": 791.2, "watts": 652.0, "GFLOPs_per_J": 1213.5, "label": "cuda:0 bf16 -> bfloat16"},
        {"name": "BM_Gemm/device:0/precision:0/m:512/n:512/k:512/batch:1/manual_time", "run_type": "iteration",
         "TFLOPs": 0.2, "ratio_vs_openblas": 1.01, "label": "host fp32 -> float32"},
        {"name": "BM_AdamWStep/device:1/layers:24/manual_time", "run_type": "iteration", "bytes_per_second": 3.9e12,
         "params_M": 355.0, "launches": 40, "label": "cuda:0 fp16 weights, fp32 masters"},
        {"name": "BM_Collective/kind:0/bytes:4096/iterations:20/manual_time", "run_type": "iteration",
         "algbw_GBs": 1.5, "busbw_GBs": 2.25, "label": "all_reduce flat, 4 ranks, 2 node(s)"},
        {"name": "BM_GemmVsTorch/qkv/m:2048/n:3072/k:1024/batch:1", "run_type": "iteration", "label": "host bf16",
         "TFLOPs": 0.411, "torch_TFLOPs": 0.412, "ratio_vs_torch": 1.0},
        {"name": "checkpoint/load (cached)/vs safetensors", "run_type": "iteration", "gpucloud_GBps": 10.79,
         "peer": "safetensors", "peer_GBps": 10.85, "ratio_vs_peer": 0.99, "ratio_min": 0.92, "ratio_max": 1.15,
         "rounds": 5},
    ]}
    (tmp_path / "run.json").write_text(json.dumps(runs))
    busy = {"benchmark": "collectives_busy_node", "results": [
        {"ranks": 2, "collective": "broadcast", "bytes": 2097152, "condition": "loaded", "run": run,
         "mean_ratio_vs_raw": ratio, "ratio_vs_raw": ratio + 0.1, "loadavg": 4.0}
        for run, ratio in enumerate((0.8, 0.6, 0.9))] + [
        # with their call counts: pooled over the 300 calls, raw 766.7 / 1000 µs; the interval over the 3 runs
        {"ranks": 2, "collective": "all-gather", "bytes": 2097152, "condition": "loaded", "run": run,
         "mean_ratio_vs_raw": raw / 1000.0, "ratio_vs_raw": 1.0, "loadavg": 4.0, "calls": 100, "mean_us": 1000.0,
         "raw_mean_us": raw}
        for run, raw in enumerate((800.0, 600.0, 900.0))]}
    (tmp_path / "busy.json").write_text(json.dumps(busy))
    out = subprocess.run([sys.executable, str(REPORT), str(tmp_path), "--gpu", "NVIDIA H200"], capture_output=True,
                         text=True, check=True).stdout
    assert "GPU spec row: H200 SXM" in out
    assert "| 8192×8192×8192×1 | cuda:0 bf16 -> bfloat16 | 791.200 | 80 % | – | 652 | 1213.5 |" in out  # of 989
    assert "| 1.01 | – | – |" in out  # no power figures on the host
    assert "81 %" in out  # 3900 GB/s of 4800
    assert "| all_reduce flat, 4 ranks, 2 node(s) | 4096 | 1.500 | 2.250 |" in out
    assert "| GemmVsTorch/qkv/m:2048/n:3072/k:1024/batch:1 | host bf16 | 0.411 | 0.412 | 1.00 |" in out
    assert "2048×3072×1024" not in out  # not in the GEMM table as well
    assert "| checkpoint/load (cached)/vs safetensors | 10.79 | 10.85 | 0.99 | 0.92-1.15 | 5 |" in out
    assert "V100 SXM2 32GB (needs CUDA 12)" in out
    assert "| 2 | broadcast | 2097152 | loaded | 0.80 [0.60-0.90] | 0.90 [0.70-1.00] | – | 3 | 4.0 |" in out
    assert "| 2 | all-gather | 2097152 | loaded | 0.80 [0.60-0.90] | 1.00 [1.00-1.00] | 0.77 (0.39-1.15) | 3 | 4.0 |" in out
