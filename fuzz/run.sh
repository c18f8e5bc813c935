#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), seeding the ONNX target from the
# example models and the ONNX backend test corpus. Needs cargo-fuzz (`cargo install
# cargo-fuzz`); RUSTC_BOOTSTRAP lets the stable toolchain take the sanitizer flags.
# Findings land in fuzz/artifacts/TARGET/; keep each as a regression test.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH=${1:-60}
export RUSTC_BOOTSTRAP=1
mkdir -p corpus/onnx_inspect corpus/protocol_request corpus/sidecar
cp ../examples/models/*.onnx corpus/onnx_inspect/ 2>/dev/null || true
if [ -x ../.venv/bin/python ]; then
  data=$(../.venv/bin/python -c 'import onnx,os;print(os.path.join(os.path.dirname(onnx.__file__),"backend","test","data"))')
  find "$data" -name model.onnx | while read -r f; do cp "$f" "corpus/onnx_inspect/$(echo "$f" | sha1sum | cut -c1-12).onnx"; done
fi
printf '{"op":"hello","version":1,"client":"fuzz"}' > corpus/protocol_request/hello
printf '{"op":"acquire","model":"tiny_encoder","wait":true,"timeout_ms":1000}' > corpus/protocol_request/acquire
printf '[profiles.default]\nmin = { x = [1, 1, 64] }\nopt = { x = [2, 16, 64] }\nmax = { x = [8, 128, 64] }\n' > corpus/sidecar/basic.toml
cargo fuzz build -O
for t in onnx_inspect protocol_request sidecar; do
  cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -max_len=65536 2>&1 | grep -E '^Done|SUMMARY|ERROR' || true
done
