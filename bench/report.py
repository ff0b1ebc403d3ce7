#!/usr/bin/env python3
"""Turn benchmark runs (Google Benchmark JSON from bench_*) into a Markdown report, and PNG plots
when matplotlib is installed, placing each measured figure next to the GPU spec table.

    python bench/report.py RESULTS_DIR [--out report.md] [--plots DIR] [--gpu "NVIDIA H200"]

RESULTS_DIR holds *.json files written with --benchmark_out=F --benchmark_out_format=json
(scripts/gpu-check.sh writes them), and those of bench/collectives_busy_node.py --json. The GPU's spec row comes from --gpu, or from the runs'
labels; without one the percentages of peak are left out.
"""
import argparse
import json
import re
import sys
from pathlib import Path


def _gc():
    """The gpucloud package, for the GPU spec figures: imported only by the tables that need them,
    so the other tables (bench/netns_allreduce.sh prints one) work without it installed."""
    import gpucloud

    return gpucloud


PCIE_GBS = {3: 16.0, 4: 32.0, 5: 64.0}  # x16, per direction, before protocol overhead


def load_runs(folder):
    runs = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        for b in data.get("benchmarks", []) if isinstance(data, dict) else []:
            if b.get("run_type", "iteration") == "iteration" and "error_occurred" not in b:
                b["_file"] = path.name
                runs.append(b)
    return runs


def load_busy_node(folder):
    """The per-run figures bench/collectives_busy_node.py --json wrote."""
    results = []
    for path in sorted(Path(folder).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("benchmark") == "collectives_busy_node":
            results += data["results"]
    return results


def busy_node_table(results):
    """Raw MPI time / gpucloud time per collective, size and condition: median over runs [range],
    and pooled over every call of the runs (95 % confidence interval over the runs)."""
    from collectives_busy_node import interval, pooled  # (beside this file)

    rows = ["| ranks | collective | bytes | condition | raw / gpucloud, means | of medians | pooled (95 % CI) | runs "
            "| load avg |",
            "|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in results:
        groups.setdefault((r["ranks"], r["condition"], r["collective"], r["bytes"]), []).append(r)
    for (ranks, condition, collective, size), rs in sorted(groups.items()):
        means = sorted(r["mean_ratio_vs_raw"] for r in rs)
        medians = sorted(r["ratio_vs_raw"] for r in rs)
        loads = sorted(r["loadavg"] for r in rs)
        p = pooled(rs)
        rows.append(f"| {ranks} | {collective} | {size} | {condition} | {means[len(means) // 2]:.2f} "
                    f"[{means[0]:.2f}-{means[-1]:.2f}] | {medians[len(medians) // 2]:.2f} "
                    f"[{medians[0]:.2f}-{medians[-1]:.2f}] | {interval(p, '–')} | {len(rs)} | "
                    f"{loads[len(loads) // 2]:.1f} |")
    return rows


def spec_for(name):
    return _gc().find_gpu_spec(name) if name else None


def pct(value, peak):
    return f"{100.0 * value / peak:.0f} %" if peak else "–"


def power(r):
    """The board's mean watts and GFLOP per joule while a run's iterations ran (GPU runs), or dashes."""
    if "watts" not in r:
        return "– | –"
    efficiency = f"{r['GFLOPs_per_J']:.1f}" if "GFLOPs_per_J" in r else "–"
    return f"{r['watts']:.0f} | {efficiency}"


def gemm_table(runs, spec):
    rows = ["| shape (m×n×k×batch) | precision | TFLOP/s | % of peak | vs direct OpenBLAS / cuBLAS | W | GFLOP/J |",
            "|---|---|---|---|---|---|---|"]
    for r in runs:
        if "ratio_vs_torch" in r:  # the PyTorch comparisons have their own table
            continue
        m = re.search(r"m:(\d+)/n:(\d+)/k:(\d+)/batch:(\d+)", r["name"])
        label = r.get("label", "")
        prec = re.search(r"(fp32|tf32|fp16|bf16|fp8)", label)
        if not m or not prec:
            continue
        peak = _gc().peak_tflops(spec, getattr(_gc().Precision, prec.group(1))) if spec and "cuda" in label else 0
        direct = r.get("ratio_vs_openblas", r.get("ratio_vs_cublas"))
        ratio = f"{direct:.2f}" if direct is not None else "–"
        rows.append(f"| {'×'.join(m.groups())} | {label} | {r['TFLOPs']:.3f} | {pct(r['TFLOPs'], peak)} | {ratio} | "
                    f"{power(r)} |")
    return rows


def conv_table(runs, spec):
    rows = ["| layer, pass | run | TFLOP/s | % of peak | vs direct cuDNN | W | GFLOP/J |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        if not r["name"].startswith("BM_Conv/"):
            continue
        label = r.get("label", "")
        dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(label.split(" ")[1] if " " in label else "")
        peak = _gc().peak_tflops(spec, getattr(_gc().Precision, dtype)) if spec and dtype and "cuda" in label else 0
        ratio = f"{r['ratio_vs_cudnn']:.2f}" if "ratio_vs_cudnn" in r else "–"
        batch = re.search(r"batch:(\d+)", r["name"])
        rows.append(f"| {label} | batch {batch.group(1) if batch else '?'} | {r['TFLOPs']:.3f} | "
                    f"{pct(r['TFLOPs'], peak)} | {ratio} | {power(r)} |")
    return rows


def copy_table(runs, spec):
    rows = ["| run | GB/s | % of PCIe peak |", "|---|---|---|"]
    for r in runs:
        if "BM_Copy" not in r["name"]:
            continue
        gbs = r.get("bytes_per_second", 0) / 1e9
        peak = PCIE_GBS.get(spec.pcie_gen) if spec and "cuda" in r.get("label", "") else None
        rows.append(f"| {r.get('label', r['name'])} {r['name'].split('bytes:')[1].split('/')[0]} B | {gbs:.2f} | {pct(gbs, peak)} |")
    for r in runs:
        if "BM_PipelineOverlap" in r["name"]:
            rows.append(f"| overlap {r.get('label', '')} {r['name'].split('bytes:')[1].split('/')[0]} B | efficiency "
                        f"{r['overlap_efficiency']:.2f} of 2, {r['speedup_vs_serial']:.2f}x vs serial | |")
    return rows


def bandwidth_table(runs, spec):
    rows = ["| run | GB/s moved | % of memory bandwidth | launches |", "|---|---|---|---|"]
    for r in runs:
        if not any(k in r["name"] for k in ("BM_Unscale", "BM_AdamWStep")):
            continue
        gbs = r.get("bytes_per_second", 0) / 1e9
        peak = spec.memory_bw_gbs if spec and "cuda" in r.get("label", "") else None
        rows.append(f"| {r['name'].split('/')[0]} {r.get('label', '')} ({r.get('params_M', 0):.0f}M params) | {gbs:.2f} | "
                    f"{pct(gbs, peak)} | {r.get('launches', 0):.0f} |")
    return rows


def collectives_table(runs):
    rows = ["| operation | bytes | algbw GB/s | busbw GB/s | median µs | raw call µs | raw / gpucloud | overhead µs |",
            "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "BM_Collective" not in r["name"]:
            continue
        size = r["name"].split("bytes:")[1].split("/")[0]
        raw = (f"{r['raw_us']:.1f} | {r['ratio_vs_raw']:.2f} | {r['overhead_us']:.1f}" if "ratio_vs_raw" in r
               else "– | – | –")
        rows.append(f"| {r.get('label', '')} | {size} | {r['algbw_GBs']:.3f} | {r['busbw_GBs']:.3f} | "
                    f"{r.get('median_us', 0):.1f} | {raw} |")
    return rows


def cost_model_table(runs):
    """bench_collectives --auto: flat, hierarchical and all_reduce_auto per size, beside the model's
    predictions; auto's form is the model's pick, or measured where the predictions tie. Where the
    run timed both forms interleaved with auto (interleaved_*_us), those are the figures compared;
    older runs compare the rows of each form, measured at other moments."""
    by_size = {}
    for r in runs:
        m = re.search(r"BM_Collective/kind:(\d)/bytes:(\d+)", r["name"])
        if m and m.group(1) in "015":
            by_size.setdefault((r["_file"], int(m.group(2))), {})[int(m.group(1))] = r
    rows = ["| run | bytes | flat µs (predicted) | hierarchical µs (predicted) | auto µs (its form, how chosen) "
            "| auto / the faster form |", "|---|---|---|---|---|---|"]
    for (file, size), k in sorted(by_size.items()):
        if 5 not in k or "model_picks_hier" not in k[5]:
            continue
        auto = k[5]
        if "interleaved_flat_us" in auto:
            flat, hier = auto["interleaved_flat_us"], auto["interleaved_hier_us"]
        elif {0, 1} <= set(k):
            flat, hier = k[0]["median_us"], k[1]["median_us"]
        else:
            continue
        form = auto.get("auto_form", auto["model_picks_hier"])  # runs from before auto_form: the model's pick
        pick = ["flat", "hierarchical", "measuring"][int(form)]
        how = "measured" if auto.get("model_ties") else "model"
        rows.append(f"| {file} | {size} | {flat:.0f} ({auto['predicted_flat_us']:.0f}) | {hier:.0f} "
                    f"({auto['predicted_hier_us']:.0f}) | {auto['median_us']:.0f} ({pick}, {how}) | "
                    f"{auto['median_us'] / min(flat, hier):.2f} |")
    return rows if len(rows) > 2 else []


def torch_table(runs):
    """The same operation through gpucloud and PyTorch in one process (bench/bench_gemm_torch.py,
    bench/bench_conv_torch.py --json): torch's time / gpucloud's, above 1 when gpucloud is faster."""
    rows = ["| benchmark | run | gpucloud TFLOP/s | torch TFLOP/s | torch / gpucloud |", "|---|---|---|---|---|"]
    for r in runs:
        if "ratio_vs_torch" not in r:
            continue
        name = r["name"].removeprefix("BM_")
        rows.append(f"| {name} | {r.get('label', '')} | {r.get('TFLOPs', 0):.3f} | {r.get('torch_TFLOPs', 0):.3f} | "
                    f"{r['ratio_vs_torch']:.2f} |")
    return rows


def peer_table(runs):
    """Python benchmarks against a named peer on the same inputs (bench/bench_checkpoint_torch.py
    --json): the peer's time / gpucloud's, median and range over interleaved rounds."""
    rows = ["| comparison | gpucloud GB/s | peer GB/s | peer / gpucloud (median) | range | rounds |",
            "|---|---|---|---|---|---|"]
    for r in runs:
        if "ratio_vs_peer" not in r:
            continue
        rows.append(f"| {r['name']} | {r['gpucloud_GBps']:.2f} | {r['peer_GBps']:.2f} | {r['ratio_vs_peer']:.2f} | "
                    f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {r['rounds']} |")
    return rows


def train_step_table(runs):
    rows = ["| trainer | run | samples/s | gpucloud / torch |", "|---|---|---|---|"]
    for r in runs:
        if not r["name"].startswith("BM_TrainStep/"):
            continue
        ratio = f"{r['ratio_to_torch']:.2f}" if "ratio_to_torch" in r else ""
        rows.append(f"| {r['name'].split('/')[1]} | {r.get('label', '')} {'/'.join(r['name'].split('/')[2:])} | "
                    f"{r['items_per_second']:.0f} | {ratio} |")
    return rows


def spec_table():
    rows = ["| GPU | fp16 | bf16 | tf32 | fp32 | fp8 | memory | mem BW | NVLink | PCIe |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in _gc().gpu_specs():
        note = " (needs CUDA 12)" if s.needs_cuda12 else ""
        rows.append(f"| {s.name}{note} | {s.fp16_tflops:g} | {s.bf16_tflops:g} | {s.tf32_tflops:g} | {s.fp32_tflops:g} | "
                    f"{s.fp8_tflops:g} | {s.memory_gb:g} GB | {s.memory_bw_gbs:g} GB/s | {s.nvlink_gbs:g} GB/s | Gen{s.pcie_gen} |")
    return rows


def plots(runs, folder):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["(matplotlib is not installed: no plots)"]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    coll = [r for r in runs if "BM_Collective" in r["name"]]
    if coll:
        fig, ax = plt.subplots()
        for label in sorted({r["label"] for r in coll}):
            pts = sorted((int(r["name"].split("bytes:")[1].split("/")[0]), r["busbw_GBs"]) for r in coll if r["label"] == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw GB/s")
        ax.legend(fontsize=6)
        fig.savefig(folder / "collectives_busbw.png", dpi=120)
        made.append(f"![busbw]({folder / 'collectives_busbw.png'})")
    gemm = [r for r in runs if "TFLOPs" in r]
    if gemm:
        fig, ax = plt.subplots()
        ax.barh([r["name"].replace("BM_Gemm/", "")[:48] + " " + r.get("label", "") for r in gemm], [r["TFLOPs"] for r in gemm])
        ax.set_xlabel("TFLOP/s")
        ax.tick_params(axis="y", labelsize=5)
        fig.tight_layout()
        fig.savefig(folder / "gemm_tflops.png", dpi=120)
        made.append(f"![gemm]({folder / 'gemm_tflops.png'})")
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--out")
    ap.add_argument("--plots")
    ap.add_argument("--gpu", help="device name for the spec row, e.g. 'NVIDIA H200'")
    args = ap.parse_args()
    runs = load_runs(args.results)
    spec = spec_for(args.gpu)
    lines = [f"# gpucloud benchmark report ({len(runs)} runs from {args.results})", ""]
    lines += [f"GPU spec row: {spec.name}" if spec else "GPU spec row: none (host runs, or pass --gpu)", ""]
    for title, table in (("GEMM", gemm_table(runs, spec)), ("Convolution", conv_table(runs, spec)),
                         ("Data movement", copy_table(runs, spec)),
                         ("Mixed-precision steps", bandwidth_table(runs, spec)), ("Collectives", collectives_table(runs)),
                         ("Flat vs hierarchical: the cost model against what was measured", cost_model_table(runs)),
                         ("Training step vs PyTorch", train_step_table(runs)),
                         ("Against PyTorch in the same process", torch_table(runs)),
                         ("Against a peer library on the same inputs", peer_table(runs)),
                         ("Collectives on a quiet and a busy node", busy_node_table(load_busy_node(args.results)))):
        if len(table) > 2:
            lines += [f"## {title}", "", *table, ""]
    lines += ["## GPU spec table (dense)", "", *spec_table(), ""]
    if args.plots:
        lines += ["## Plots", "", *plots(runs, args.plots), ""]
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
