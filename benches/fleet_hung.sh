#!/usr/bin/env bash
# What a hung S3 endpoint (accepts TCP, never answers) adds to local builds (issue 39): the
# daemon settles three small fixture models with no [remote] section, then with one whose
# endpoint is such a listener, default limits; RUNS of each, alternating, median printed.
#   benches/fleet_hung.sh [DIR]        # BIN=target/release/trtcache to time a release build
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/bench-fleet-hung}
RUNS=${RUNS:-3}
BIN=${BIN:-target/debug/trtcache}
PY=.venv/bin/python
eval "$(scripts/ort-env.sh)"
[ -x "$BIN" ] || cargo build --bin trtcache >&2
MAKE=$(ls target/debug/examples/make_models 2>/dev/null || true)
[ -n "$MAKE" ] || { cargo build --example make_models >&2; MAKE=target/debug/examples/make_models; }
rm -rf "$DIR" && mkdir -p "$DIR/all"
"$MAKE" "$DIR/all" >/dev/null
mkdir -p "$DIR/models"
for m in tiny_encoder tiny_encoder_static if_loop; do cp "$DIR/all/$m.onnx" "$DIR/models/"; done
# The silent endpoint: accepts and holds every connection.
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$PY -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(512); held = []
while True: held.append(s.accept()[0])
' "$PORT" &
SILENT=$!
DAEMON=
trap 'kill $SILENT 2>/dev/null || true; [ -n "$DAEMON" ] && kill $DAEMON 2>/dev/null || true' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench
settle() { # $1: extra config; prints seconds from start to every model ready
  local c="$DIR/run" && rm -rf "$c" && mkdir -p "$c/cache"
  printf 'models = "%s"\ncache_dir = "%s"\nsocket = "%s"\n%s\n' \
    "$PWD/$DIR/models" "$PWD/$c/cache" "$PWD/$c/cache/s.sock" "$1" >"$c/config.toml"
  local t0; t0=$(date +%s.%N)
  "$BIN" serve --config "$c/config.toml" 2>"$c/daemon.log" & DAEMON=$!
  "$BIN" health --config "$c/config.toml" --ready --wait 900 >/dev/null 2>&1
  local t1; t1=$(date +%s.%N)
  kill $DAEMON; wait $DAEMON 2>/dev/null || true; DAEMON=
  $PY -c "print(f'{$t1-$t0:.2f}')"
}
base=() hung=()
for _ in $(seq "$RUNS"); do
  base+=("$(settle '')")
  hung+=("$(settle "[remote]
url = \"s3://fleet/bench\"
endpoint = \"http://127.0.0.1:$PORT\"")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "no remote:     ${base[*]} s (median $(median "${base[@]}") s)"
echo "hung endpoint: ${hung[*]} s (median $(median "${hung[@]}") s)"
