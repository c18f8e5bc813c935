#!/usr/bin/env bash
# Creates the project-local Python environment (.venv) with pinned ONNX Runtime, onnx and
# numpy from PyPI. trtcache loads ONNX Runtime's shared library from it at run time
# (.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*); the tests use
# onnx as the reference implementation. Idempotent: does nothing when the pins are present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REQ=scripts/requirements.txt
# A second ONNX Runtime, each in a folder of its own (.venv/runtimes/onnxruntime-VERSION/,
# `pip install --target`, no dependencies): the "incoming runtime" of the runtime-upgrade
# tests and benches (docs/daemon.md, "Upgrading the runtime"). Its library is
# .venv/runtimes/onnxruntime-VERSION/onnxruntime/capi/libonnxruntime.so.VERSION; a Python
# consumer on it runs with PYTHONPATH=.venv/runtimes/onnxruntime-VERSION.
INCOMING_ORT=${INCOMING_ORT:-1.32.0}
incoming() {
  local dir=.venv/runtimes/onnxruntime-$INCOMING_ORT
  [ -f "$dir/onnxruntime/capi/libonnxruntime.so.$INCOMING_ORT" ] && return 0
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps --target "$dir" \
    "onnxruntime==$INCOMING_ORT"
  echo "setup-python: incoming runtime onnxruntime $INCOMING_ORT in $dir"
}
if [ -f .venv/.installed ] && cmp -s "$REQ" .venv/.installed; then
  incoming
  exit 0
fi
"$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -r "$REQ"
cp "$REQ" .venv/.installed
incoming
echo "setup-python: .venv ready ($(.venv/bin/python -c 'import onnxruntime; print("onnxruntime", onnxruntime.__version__)'))"
