#!/usr/bin/env bash
# What the Python client's session defaults buy a consumer (BENCHMARKS.md, session section):
# writes the BERT-sized encoder and the ~20,000-node export-style encoder with dynamic axes,
# builds each one's ort-cpu artifact with `trtcache build`, then runs benches/consumer.py on
# the pair. Usage: benches/consumer.sh [RUNS]   (the 20k raw model takes ~17 s per session)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/ort-env.sh)"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
PY=${TRTCACHE_PYTHON:-python3}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), no GPU"
cargo build --release --quiet --bin trtcache --example make_models
target/release/examples/make_models "$W" --bert-small --bert-exported 270 >/dev/null
for m in bert_small bert_exported_270; do
  entry=$(target/release/trtcache build "$W/$m.onnx" --cache-dir "$W/cache" --json \
    | "$PY" -c 'import sys, json; print(json.load(sys.stdin)["artifact"]["entry"])')
  "$PY" benches/consumer.py "$W/$m.onnx" "$entry" "${1:-7}"
  echo
done
