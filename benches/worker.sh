#!/usr/bin/env bash
# Benchmark: what the bounded build worker costs (issue: a hostile model can never take the
# daemon down). One run, interleaved, medians:
#  1. `trtcache build --force` of a small model (the tiny encoder, tens of ms to build and
#     validate) in the worker process (the default) against `--in-process` (no bounds);
#  2. the same with BertConfig::small (44 MB);
#  3. a cache hit, which never starts a worker, for scale.
# Usage: benches/worker.sh [RUNS]   (default 11; needs scripts/setup-python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-11}
scripts/setup-python.sh >/dev/null
cargo build --release --quiet --bin trtcache --example make_models
eval "$(scripts/ort-env.sh)"
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
./target/release/examples/make_models "$DIR" --bert-small >/dev/null
BIN=./target/release/trtcache
PY=.venv/bin/python
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for m in tiny_encoder bert_small; do
  [ -f "$DIR/$m.onnx" ] || continue
  echo
  echo "model: $m.onnx ($(du -h "$DIR/$m.onnx" | cut -f1))"
  $BIN build "$DIR/$m.onnx" --cache-dir "$DIR/cache" >/dev/null 2>&1
  $PY benches/timeit.py --runs "$RUNS" \
    "build --force, in-process=$BIN build $DIR/$m.onnx --cache-dir $DIR/cache --force --in-process" \
    "build --force, worker=$BIN build $DIR/$m.onnx --cache-dir $DIR/cache --force" \
    "cache hit (no worker)=$BIN build $DIR/$m.onnx --cache-dir $DIR/cache"
done
