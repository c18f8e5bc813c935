#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60): `fuzz/run.sh [SECONDS] [TARGET...]`.
# Seeds: the example models and the ONNX backend test corpus (onnx_inspect), the kept
# regression inputs (fuzz/regressions/TARGET, all targets) and a few hand-written requests and
# sidecars. Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP lets the stable
# toolchain take the sanitizer flags. Exits non-zero when any target finds a crash, hang or
# out-of-memory; findings land in fuzz/artifacts/TARGET/: fix each and keep it in
# fuzz/regressions/TARGET/ (replayed by `cargo test --test it fuzz_regressions`).
#
# FUZZ_BUILD picks the build: `asan` (default: release, AddressSanitizer) or `smoke` (debug,
# no sanitizer: overflow checks and debug assertions on, a third of the build time; what CI's
# 15-second runs use, where the build is most of the cost; the fuzzed paths are safe Rust).
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(onnx_inspect protocol_request sidecar)
export RUSTC_BOOTSTRAP=1
for t in onnx_inspect protocol_request sidecar; do
  mkdir -p "corpus/$t" "artifacts/$t"
  cp regressions/"$t"/* "corpus/$t/" 2>/dev/null || true
done
cp ../examples/models/*.onnx corpus/onnx_inspect/ 2>/dev/null || true
if [ -x ../.venv/bin/python ]; then
  data=$(../.venv/bin/python -c 'import onnx,os;print(os.path.join(os.path.dirname(onnx.__file__),"backend","test","data"))')
  find "$data" -name model.onnx | while read -r f; do cp "$f" "corpus/onnx_inspect/$(echo "$f" | sha1sum | cut -c1-12).onnx"; done
fi
printf '{"op":"hello","version":1,"client":"fuzz"}' > corpus/protocol_request/hello
printf '{"op":"acquire","model":"tiny_encoder","wait":true,"timeout_ms":1000}' > corpus/protocol_request/acquire
printf '[profiles.default]\nmin = { x = [1, 1, 64] }\nopt = { x = [2, 16, 64] }\nmax = { x = [8, 128, 64] }\n' > corpus/sidecar/basic.toml
case "${FUZZ_BUILD:-asan}" in
  asan) build=(-O) ;;
  smoke) build=(--dev -s none) ;;
  *) echo "fuzz/run.sh: FUZZ_BUILD must be asan or smoke, not ${FUZZ_BUILD}" >&2; exit 2 ;;
esac
cargo fuzz build "${build[@]}"
failed=()
for t in "${TARGETS[@]}"; do
  log=$(mktemp)
  set +e
  cargo fuzz run "${build[@]}" "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 \
    -timeout=10 -max_len=65536 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  if [ $rc -eq 0 ]; then
    echo "fuzz $t: ${SECONDS_EACH}s, $runs executions, nothing found"
  else
    echo "fuzz $t: FOUND a problem (exit $rc) after $runs executions:"
    grep -E 'ERROR|SUMMARY|panicked|Test unit written|Base64' "$log" | head -20
    failed+=("$t")
  fi
  rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}; see fuzz/artifacts/" >&2
  exit 1
fi
