#!/usr/bin/env bash
# Capability analysis benchmark: `trtcache inspect --json` (load + facts + capability analysis
# + JSON) on generated graphs of 10k, 20k and 40k nodes, median of RUNS runs each, against
# what a user would otherwise run to get shapes: python onnx's load + shape inference
# (in-process time, interpreter start-up excluded).
#
#   benches/capability.sh            # RUNS=7
#   RUNS=11 benches/capability.sh
#
# Graphs: `chain_N` = N elementwise nodes in a line (one TensorRT subgraph);
# `varied_N` = blocks of MatMul/Add/Relu/Shape/Reshape/Softmax/Add with a CPU-only
# CenterCropPad every 50 blocks (many subgraphs, boundaries, shape-derived values).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
PY=${TRTCACHE_PYTHON:-.venv/bin/python}
cargo build --release --quiet --bin trtcache --example make_models
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
target/release/examples/make_models "$OUT" --chain 10000 --chain 20000 --chain 40000 \
    --varied 10000 --varied 20000 --varied 40000 >/dev/null

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Wall time of one command in microseconds.
run_us() {
    local s e
    s=$(date +%s%N)
    "$@" >/dev/null
    e=$(date +%s%N)
    echo $(((e - s) / 1000))
}

echo "machine: $(nproc) cores, $(uname -m), no GPU; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "runs per point: $RUNS (median)"
printf '%-14s %8s %14s %16s %10s\n' model nodes "trtcache ms" "onnx-shape ms" "ratio"
declare -A T
for kind in chain varied; do
    for n in 10000 20000 40000; do
        m="$OUT/${kind}_$n.onnx"
        nodes=$(target/release/trtcache inspect --json "$m" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["model"]["node_count"])')
        t=$(for _ in $(seq "$RUNS"); do run_us target/release/trtcache inspect --json "$m"; done | median)
        py=$("$PY" - "$m" "$RUNS" <<'PYEOF'
import sys, time, statistics, onnx
path, runs = sys.argv[1], int(sys.argv[2])
ts = []
for _ in range(runs):
    s = time.perf_counter()
    onnx.shape_inference.infer_shapes(onnx.load(path))
    ts.append(time.perf_counter() - s)
print(int(statistics.median(ts) * 1e6))
PYEOF
)
        T[$kind$n]=$t
        printf '%-14s %8s %14.1f %16.1f %9.2fx\n' "${kind}_$n" "$nodes" "$(echo "$t/1000" | bc -l)" \
            "$(echo "$py/1000" | bc -l)" "$(echo "$py/$t" | bc -l)"
    done
done
for kind in chain varied; do
    printf '%s: 20k/10k = %.2f   40k/20k = %.2f\n' "$kind" \
        "$(echo "${T[${kind}20000]}/${T[${kind}10000]}" | bc -l)" \
        "$(echo "${T[${kind}40000]}/${T[${kind}20000]}" | bc -l)"
done
