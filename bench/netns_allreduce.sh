#!/usr/bin/env bash
# Flat against hierarchical all-reduce where the inter-node link is the bottleneck, as on a
# cluster: NODES network namespaces (scripts/netns-nodes.sh) with PPN ranks each, every node's
# link shaped to RATE with tc tbf, ranks within a node on shared memory. Runs bench_collectives
# --auto (the cost model measured on this job first, then flat, hierarchical and all_reduce_auto
# interleaved with raw MPI_Allreduce) and prints, per size, the three medians, the model's
# predictions, the form all_reduce_auto took (measured where the predictions tie) and whether
# it was the faster. Needs root.
#
#   bench/netns_allreduce.sh BUILD_DIR [NODES=2] [PPN=2] [RATE=1gbit] [OUT_JSON] [MAX_MIB=16]
#
# Sizes 512 B .. 16 MiB (x8); MAX_MIB=256 adds 64 and 256 MiB (5 timed calls each; minutes at 1 Gbit/s).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/netns_allreduce.sh BUILD_DIR [NODES] [PPN] [RATE] [OUT_JSON]}
nodes=${2:-2}
ppn=${3:-2}
rate=${4:-1gbit}
out=${5:-netns_allreduce_${nodes}x${ppn}_${rate}.json}
max_mib=${6:-16}
sizes="512|4096|32768|262144|2097152|16777216"
((max_mib >= 64)) && sizes="$sizes|67108864"
((max_mib >= 256)) && sizes="$sizes|268435456"
scripts/netns-nodes.sh up "$nodes" "$rate"
trap 'scripts/netns-nodes.sh down' EXIT
OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1 \
  scripts/netns-nodes.sh mpirun "$nodes" "$ppn" "$build/bench/bench_collectives" --auto --max-mib="$max_mib" \
  --benchmark_filter="kind:(0|1|5)/bytes:($sizes)/" \
  --benchmark_out="$out" --benchmark_out_format=json >/dev/null
python3 - "$out" "$nodes" "$ppn" "$rate" <<'PY'
import json, pathlib, sys
sys.path.insert(0, "bench")
from report import cost_model_table
runs = json.load(open(sys.argv[1]))["benchmarks"]
for r in runs:
    r["_file"] = pathlib.Path(sys.argv[1]).name
print(f"all-reduce on {sys.argv[2]} nodes x {sys.argv[3]} ranks, inter-node links shaped to {sys.argv[4]}: "
      "median µs per call (the model's prediction)")
print("\n".join(cost_model_table(runs)))
PY
