#!/usr/bin/env python3
"""The Grafana dashboard is valid JSON, every panel has a query, and every metric a query names is
one gpucloud exports (an exposition from a real Exporter, the second argument's file) or a
DCGM name the exporter serves on GPUs. Run by CTest.

    check_dashboard.py DASHBOARD_JSON EXPOSITION_FILE   (print_exposition's output)
"""
import json
import re
import sys

DCGM = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"}
# Series that appear once straggler detection is on and an exchange has run (it needs a
# communicator; tested under mpirun).
AFTER_EXCHANGE = {"gpucloud_rank_step_seconds", "gpucloud_straggler", "gpucloud_straggler_rank"}
FUNCTIONS = {"histogram_quantile", "sum", "by", "rate", "max", "increase", "le", "rank", "job", "node", "gpu"}


def main():
    dash = json.load(open(sys.argv[1]))
    exported = set(re.findall(r"^# TYPE (\w+) (\w+)", open(sys.argv[2]).read(), flags=re.M))
    names = set()
    for name, kind in exported:
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    names |= DCGM | AFTER_EXCHANGE
    assert dash["panels"], "no panels"
    for p in dash["panels"]:
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            expr = re.sub(r"\{[^}]*\}", "", t["expr"])   # label matchers
            expr = re.sub(r"\[[^\]]*\]", "", expr)        # ranges
            for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr):
                if word in FUNCTIONS:
                    continue
                assert word in names, f"panel {p['title']!r}: {word} is not a metric gpucloud exports"
    print(f"dashboard ok: {len(dash['panels'])} panels, every metric exported")


if __name__ == "__main__":
    main()
