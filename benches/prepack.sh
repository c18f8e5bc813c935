#!/usr/bin/env bash
# Whether the ort-cpu artifact's prepacked weights pay off at session creation (BENCHMARKS.md,
# "Where the weights live"): builds the BERT-sized encoder's artifact, then runs benches/prepack.py.
# Usage: benches/prepack.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/ort-env.sh)"
cargo build --release --quiet --bin trtcache --bench daemon
B=$(ls -t target/release/deps/daemon-* | grep -v '\.d$' | head -1)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$B" bert "$W/models"
target/release/trtcache build "$W/models/bert.onnx" --cache-dir "$W/cache" --json >/dev/null
ART=$(dirname "$(find "$W/cache/blobs" -name model.onnx | head -1)")
"${TRTCACHE_PYTHON:-python3}" benches/prepack.py "$W/models/bert.onnx" "$ART" "${1:-15}"
