#!/usr/bin/env bash
# Fleet simulation (BENCHMARKS.md, "Fleet"): HOSTS hosts, each with its own cache, run the
# deploy step (`trtcache warm`, here without a daemon: the same engine) on the same 5 models
# (4 small fixtures and big_weights.onnx of BIG_LAYERS 2048x2048 fp32 layers: 7 = 112 MiB) at
# the same time: once sharing one bucket on a local moto S3 server, once each building alone.
# Prints wall time until all hosts are ready and how many models were built vs fetched.
#   benches/fleet_sim.sh [DIR] [HOSTS] [BIG_LAYERS]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/bench-fleet-sim}
HOSTS=${2:-4}
BIG=${3:-7}
eval "$(scripts/ort-env.sh)"
BIN=$PWD/target/release/trtcache
PY=.venv/bin/python
[ -x target/release/examples/make_models ] || cargo build --release --bin trtcache --example make_models >&2
mkdir -p "$DIR/src"
[ -f "$DIR/src/big_weights.onnx" ] || target/release/examples/make_models "$DIR/src" --big-layers "$BIG" >&2
rm -f "$DIR/src/custom_domain.onnx"   # ONNX Runtime cannot run its op: an inspect example
ls "$DIR/src"/*.onnx >&2
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$PY -m moto.server -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -fs "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
curl -fs -X PUT "http://127.0.0.1:$PORT/fleet" >/dev/null
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
rm -rf "$DIR/keys" && mkdir -p "$DIR/keys" && $BIN keygen "$DIR/keys/fleet" >/dev/null
run() { # $1 = shared|alone
  local mode=$1 t0 t1 i
  for i in $(seq "$HOSTS"); do
    local h="$DIR/$mode/host$i"
    rm -rf "$h" && mkdir -p "$h/models" "$h/cache"
    cp "$DIR/src"/*.onnx "$h/models/" && cp -r "$DIR/src/tiny_encoder_external" "$h/models/"
    printf 'models = "%s"\ncache_dir = "%s"\nsocket = "%s"\n' "$PWD/$h/models" "$PWD/$h/cache" "$PWD/$h/cache/s.sock" >"$h/config.toml"
    if [ "$mode" = shared ]; then
      printf '[remote]\nurl = "s3://fleet/sim"\nendpoint = "http://127.0.0.1:%s"\nmode = "read-write"\nsigning_key = "%s"\ntrusted_keys = ["%s"]\nlease_poll_ms = 200\n' \
        "$PORT" "$PWD/$DIR/keys/fleet.key" "$PWD/$DIR/keys/fleet.pub" >>"$h/config.toml"
    fi
  done
  t0=$(date +%s.%N)
  local pids=()
  for i in $(seq "$HOSTS"); do
    $BIN -v warm --config "$DIR/$mode/host$i/config.toml" --json >"$DIR/$mode/host$i/warm.json" 2>"$DIR/$mode/host$i/warm.log" &
    pids+=($!)
  done
  wait "${pids[@]}"   # not moto
  t1=$(date +%s.%N)
  local fetched n
  fetched=$(cat "$DIR/$mode"/host*/warm.log | grep -c "fetched from the remote tier" || true)
  n=$(( $(ls "$DIR/src"/*.onnx | wc -l) + 1 ))
  echo "$mode: $HOSTS hosts x $n models ready in $(echo "$t1 - $t0" | bc) s; fetched from the bucket: $fetched; built: $((HOSTS * n - fetched))"
}
run alone
run shared
manifests=$(curl -fs "http://127.0.0.1:$PORT/fleet?list-type=2" -H "Authorization: AWS4-HMAC-SHA256 Credential=bench/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0" | grep -o '<Key>sim/manifests/' | wc -l)
echo "manifests in the bucket (= builds in the fleet): $manifests"
