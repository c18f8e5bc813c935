#!/usr/bin/env bash
# Prints `export` lines pointing trtcache and the tests at the project's .venv:
#   eval "$(scripts/ort-env.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
lib=$(ls -1 "$PWD"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n1)
if [ -z "$lib" ]; then
  echo "echo 'no .venv ONNX Runtime: run scripts/setup-python.sh' >&2; false"
  exit 0
fi
echo "export ORT_DYLIB_PATH='$lib'"
echo "export TRTCACHE_PYTHON='$PWD/.venv/bin/python'"
