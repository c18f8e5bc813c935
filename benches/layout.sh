#!/usr/bin/env bash
# Where the ort-cpu artifact splits initializers between graph and data file (BENCHMARKS.md,
# session section): writes the 4-layer BERT and the ~20,000-node static export (through the
# session bench, one run), then runs benches/layout.py on each.
# Usage: benches/layout.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/ort-env.sh)"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), no GPU"
cargo bench --quiet --bench session -- --bench --runs 1 --cases bert,bert20k-static --dir "$W" >/dev/null
for m in bert_small.onnx bert_exported_20k_static.onnx; do
  "${TRTCACHE_PYTHON:-python3}" benches/layout.py "$W/$m" "${1:-9}"
  echo
done
