#!/usr/bin/env bash
# Benchmark: `trtcache key` digest of a ~400 MB model against sha256sum and openssl on the
# same file, cold (memo disabled) and remembered (digest memo hit). Medians of RUNS rounds,
# interleaved so background load hits every command alike.
#
#   benches/key.sh [DIR]            # DIR holds/gets big_weights.onnx (default target/bench-keys)
#   RUNS=7 SKIP_BUILD=1 benches/key.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/bench-keys}
RUNS=${RUNS:-7}
if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build --release --bin trtcache --example make_models >&2
fi
BIN=target/release/trtcache
M="$DIR/big_weights.onnx"
if [[ ! -f "$M" ]]; then
  target/release/examples/make_models "$DIR" --big-layers 25 >&2
fi
eval "$(scripts/ort-env.sh)"
export ORT_DYLIB_PATH
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
SIZE=$(stat -c %s "$M")
cat "$M" > /dev/null   # page cache warm for every contender

now() { date +%s%N; }
declare -A T
add() { T[$1]="${T[$1]:-} $2"; }
# Remember once (memo written after a cold hash; the racy margin is waited out first).
sleep 0.2
$BIN key "$M" --cache-dir "$CACHE" --json > /dev/null
for ((r = 0; r < RUNS; r++)); do
  s=$(now); sha256sum "$M" > /dev/null; add sha256sum $(( $(now) - s ))
  s=$(now); openssl dgst -sha256 "$M" > /dev/null; add openssl $(( $(now) - s ))
  s=$(now); out=$($BIN key "$M" --no-memo --json); add key_cold $(( $(now) - s ))
  add key_cold_digest "$(python3 -c 'import json,sys; print(int(json.load(sys.stdin)["digest"]["seconds"]*1e9))' <<< "$out")"
  s=$(now); out=$($BIN key "$M" --no-memo --threads 1 --json); add key_cold_1t $(( $(now) - s ))
  add key_cold_1t_digest "$(python3 -c 'import json,sys; print(int(json.load(sys.stdin)["digest"]["seconds"]*1e9))' <<< "$out")"
  s=$(now); out=$($BIN key "$M" --cache-dir "$CACHE" --json); add key_memo $(( $(now) - s ))
  add key_memo_digest "$(python3 -c 'import json,sys; d=json.load(sys.stdin)["digest"]; assert d["memo_hits"]==d["files"], d; print(int(d["seconds"]*1e9))' <<< "$out")"
done

{
  for k in "${!T[@]}"; do echo "$k ${T[$k]}"; done
} | python3 -c '
import sys, statistics
size = int(sys.argv[1]); runs = {}
for line in sys.stdin:
    k, *v = line.split(); runs[k] = [int(x) / 1e9 for x in v]
med = {k: statistics.median(v) for k, v in runs.items()}
base = med["openssl"]
rows = [
  ("sha256sum FILE", "sha256sum"),
  ("openssl dgst -sha256 FILE", "openssl"),
  ("trtcache key FILE --no-memo (2 threads), end to end", "key_cold"),
  ("  digest part of it", "key_cold_digest"),
  ("trtcache key FILE --no-memo --threads 1, end to end", "key_cold_1t"),
  ("  digest part of it", "key_cold_1t_digest"),
  ("trtcache key FILE (digest remembered), end to end", "key_memo"),
  ("  digest part of it (memo lookup)", "key_memo_digest"),
]
n = len(runs["openssl"]); print(f"file: {size} bytes, {n} runs each, medians\n")
print("| command | median | min..max | MB/s | openssl time / this |")
print("|---|---:|---:|---:|---:|")
for name, k in rows:
    v = runs[k]; m = med[k]
    mbs = f"{size / m / 1e6:.0f}" if "memo" not in k else "-"
    print(f"| {name} | {m*1e3:.3f} ms | {min(v)*1e3:.3f}..{max(v)*1e3:.3f} | {mbs} | {base / m:.2f}x |")
' "$SIZE"
echo
echo "machine: $(nproc) cores, $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | xargs), sha_ni: $(grep -c sha_ni /proc/cpuinfo) of $(nproc) cpus; load average: $(cut -d" " -f1-3 /proc/loadavg)"
echo "versions: $(sha256sum --version | head -1), $(openssl version)"
