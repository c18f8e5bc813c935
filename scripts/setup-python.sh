#!/usr/bin/env bash
# Creates the project-local Python environment (.venv) with pinned ONNX Runtime, onnx and
# numpy from PyPI. trtcache loads ONNX Runtime's shared library from it at run time
# (.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*); the tests use
# onnx as the reference implementation. Idempotent: does nothing when the pins are present.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REQ=scripts/requirements.txt
if [ -f .venv/.installed ] && cmp -s "$REQ" .venv/.installed; then
  exit 0
fi
"$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -r "$REQ"
cp "$REQ" .venv/.installed
echo "setup-python: .venv ready ($(.venv/bin/python -c 'import onnxruntime; print("onnxruntime", onnxruntime.__version__)'))"
