#!/usr/bin/env bash
# The fleet tier's numbers (BENCHMARKS.md, "Fleet"): a pull of a big artifact from a
# local S3 server (moto) against copying the same files on local disk, and what the tier adds
# to a local cache hit (nothing: a hit never opens the tier, shown with a dead endpoint).
#   benches/fleet.sh [DIR] [LAYERS]   # LAYERS of 2048x2048 fp32 weights: 25 = ~400 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/bench-fleet}
LAYERS=${2:-25}
RUNS=${RUNS:-3}
eval "$(scripts/ort-env.sh)"
BIN=target/release/trtcache
PY=.venv/bin/python
[ -x target/release/examples/make_models ] || cargo build --release --bin trtcache --example make_models >&2
mkdir -p "$DIR/models"
M="$DIR/models/big_weights.onnx"
[ -f "$M" ] || target/release/examples/make_models "$DIR/models" --big-layers "$LAYERS" >&2
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$PY -m moto.server -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -fs "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
curl -fs -X PUT "http://127.0.0.1:$PORT/fleet" >/dev/null
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
W="$DIR/writer" R="$DIR/reader"
rm -rf "$W" "$R" "$DIR/keys" && mkdir -p "$W" "$R" "$DIR/keys"
$BIN keygen "$DIR/keys/bench-builder" >/dev/null
common="url = \"s3://fleet/bench\"
endpoint = \"http://127.0.0.1:$PORT\"
trusted_keys = [\"$PWD/$DIR/keys/bench-builder.pub\"]"
printf '[remote]\n%s\nmode = "read-write"\nsigning_key = "%s"\n' "$common" "$PWD/$DIR/keys/bench-builder.key" >"$W/config.toml"
printf '[remote]\n%s\n' "$common" >"$R/config.toml"
now() { date +%s.%N; }
t0=$(now)
$BIN build "$M" --cache-dir "$W/cache" --json >"$W/build.json"
t1=$(now)
$BIN push --all --cache-dir "$W/cache" --config "$W/config.toml" --json >"$W/push.json"
t2=$(now)
bytes=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["record"]["artifact"]["bytes"])' "$W/build.json")
blobdir=$($PY -c 'import json,os,sys; print(os.path.dirname(json.load(open(sys.argv[1]))["artifact"]["entry"]))' "$W/build.json")
echo "artifact: $bytes bytes; build+validate $(echo "$t1 - $t0" | bc) s; push (signed, multipart) $(echo "$t2 - $t1" | bc) s"
for i in $(seq "$RUNS"); do
  rm -rf "$R/cache" "$DIR/copy"
  # The key (model hash) is not part of the fetch: pull's `seconds` starts after keying.
  $BIN pull "$M" --cache-dir "$R/cache" --config "$R/config.toml" --json >"$R/pull.json"
  pull_s=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$R/pull.json")
  sync; c0=$(now)
  mkdir -p "$DIR/copy" && cp "$blobdir"/* "$DIR/copy/" && sync -f "$DIR/copy"
  c1=$(now)
  copy_s=$(echo "$c1 - $c0" | bc)
  $PY - "$bytes" "$pull_s" "$copy_s" <<'PYEOF'
import sys
b, p, c = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
mib = b / 2**20
print(f"run: pull {p:.2f} s ({mib/p:.0f} MiB/s; download + SHA-256 + session open + store) vs cp+sync {c:.2f} s ({mib/c:.0f} MiB/s): {p/c:.1f}x")
PYEOF
done
# A local hit with the endpoint dead: same answer, no network (the tier is never opened).
printf '[remote]\nurl = "s3://fleet/bench"\nendpoint = "http://127.0.0.1:9"\n' >"$R/dead.toml"
h0=$(now)
$BIN pull "$M" --cache-dir "$R/cache" --config "$R/dead.toml" --json >"$R/hit.json"
h1=$(now)
$BIN build "$M" --cache-dir "$R/cache" --json >/dev/null
h2=$(now)
echo "local hit: pull (endpoint dead) $(echo "$h1 - $h0" | bc) s, origin $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["origin"])' "$R/hit.json"); build (no tier) $(echo "$h2 - $h1" | bc) s"
