#!/usr/bin/env bash
# Benchmark for `trtcache inspect --json` (issue: foundation):
#  1. a generated model with ~400 MB of weights against python `onnx.load` of the same file;
#  2. a generated graph of 20,000 nodes.
# Usage: benches/inspect.sh [RUNS]   (default 7; medians; needs scripts/setup-python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-7}
scripts/setup-python.sh
cargo build --release --quiet --bin trtcache --example make_models
DIR=${BENCH_DIR:-$(mktemp -d)}
./target/release/examples/make_models "$DIR" --big-layers 25 --chain 20000 >/dev/null
PY=.venv/bin/python
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "model: $(du -h "$DIR/big_weights.onnx" | cut -f1) big_weights.onnx (25 x 2048x2048 float32 MatMul weights)"
$PY benches/timeit.py --runs "$RUNS" \
  "trtcache inspect --json=./target/release/trtcache inspect --json $DIR/big_weights.onnx" \
  "python onnx.load=$PY -c 'import onnx; onnx.load(\"$DIR/big_weights.onnx\")'" \
  "python (interpreter + import onnx only)=$PY -c 'import onnx'"
echo
echo "graph: chain_20000.onnx (20,000 nodes)"
$PY benches/timeit.py --runs "$RUNS" \
  "trtcache inspect --json (20k nodes)=./target/release/trtcache inspect --json $DIR/chain_20000.onnx" \
  "python onnx.load (20k nodes)=$PY -c 'import onnx; onnx.load(\"$DIR/chain_20000.onnx\")'"
[ -n "${BENCH_DIR:-}" ] || rm -rf "$DIR"
