#!/usr/bin/env bash
# A deploy that upgrades the ONNX Runtime of N models (issue 43): time from the switch (the
# daemon restarted with the new library as ort_library) to every model served to a consumer
# on the new runtime, with and without pre-warm, side by side.
#   cold:     the daemon ran on the old runtime only; after the switch every model builds on
#             first traffic (what every runtime upgrade is without trtcache's pre-warm).
#   prewarm:  the daemon ran with the new runtime in [runtimes] onnxruntime and built every
#             model for it in the background before the switch; after it, nothing builds.
# The consumer is the Python client on the new onnxruntime (PYTHONPATH=.venv/runtimes/…),
# acquiring each model (waiting for builds) and running one inference.
#   benches/runtime_upgrade.sh [N] [ROUNDS]     # BIN=target/release/trtcache for a release build
#   MODEL=bert_small benches/runtime_upgrade.sh 4 3   # N copies of make_models' bert_small (44 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
ROUNDS=${2:-3}
DIR=${DIR:-target/bench-runtime-upgrade}
BIN=${BIN:-target/debug/trtcache}
PY=.venv/bin/python
eval "$(scripts/ort-env.sh)"
OLD_LIB=$ORT_DYLIB_PATH
NEW_DIR=$(ls -d .venv/runtimes/onnxruntime-* | head -1)
NEW_LIB=$(ls "$NEW_DIR"/onnxruntime/capi/libonnxruntime.so.* | head -1)
[ -x "$BIN" ] || cargo build --bin trtcache >&2
MAKE=$(ls target/debug/examples/make_models 2>/dev/null || true)
[ -n "$MAKE" ] || { cargo build --example make_models >&2; MAKE=target/debug/examples/make_models; }
rm -rf "$DIR" && mkdir -p "$DIR/all" "$DIR/models"
MODEL=${MODEL:-tiny_encoder}
if [ "$MODEL" = bert_small ]; then "$MAKE" "$DIR/all" --bert-small >/dev/null; else "$MAKE" "$DIR/all" >/dev/null; fi
# N distinct models (distinct content, so distinct keys): tiny_encoder with one weight moved.
$PY - "$DIR/all/$MODEL.onnx" "$DIR/models" "$N" <<'PY'
import sys, onnx, numpy as np
from onnx import numpy_helper
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    m = onnx.load(src)
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size > 1:
            a = a.copy(); a.flat[0] += 1e-3 * (i + 1)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
            break
    onnx.save(m, f"{out}/m{i:03d}.onnx")
PY
DAEMON=
trap '[ -n "$DAEMON" ] && kill $DAEMON 2>/dev/null || true' EXIT
config() { # $1: library, $2: extra lines
  printf 'models = "%s"\ncache_dir = "%s"\nsocket = "%s"\nort_library = "%s"\n%s\n' \
    "$PWD/$DIR/models" "$PWD/$DIR/run/cache" "$PWD/$DIR/run/cache/s.sock" "$1" "$2" >"$DIR/run/config.toml"
}
start() { "$BIN" serve --config "$DIR/run/config.toml" 2>>"$DIR/run/daemon.log" & DAEMON=$!; }
stop() { kill $DAEMON; wait $DAEMON 2>/dev/null || true; DAEMON=; }
# Every variant of every model ready (the incoming runtime's too), per `status --json`.
all_ready() {
  "$BIN" status --json --config "$DIR/run/config.toml" 2>/dev/null | $PY -c '
import json, sys
ms = json.load(sys.stdin)
ms = ms if isinstance(ms, list) else ms.get("models", [])
ok = len(ms) >= int(sys.argv[1]) and all(v["state"] == "ready" for m in ms for v in m["variants"])
sys.exit(0 if ok else 1)' "$N"
}
serve_all() { # a consumer on the new runtime acquires every model and runs it
  PYTHONPATH="$NEW_DIR" $PY - "$DIR/run/cache/s.sock" "$N" <<'PY'
import sys
sys.path.insert(0, "clients/python")
import numpy as np, trtcache_client as t
c = t.Client(sys.argv[1])
for i in range(int(sys.argv[2])):
    a = c.acquire(f"m{i:03d}", timeout=900)
    assert a.metadata["runtime"]["onnxruntime"] == __import__("onnxruntime").__version__
    s = a.session()
    kind = lambda t: np.int64 if "int64" in t else (np.int32 if "int32" in t else np.float32)
    feed = {x.name: np.ones([d if isinstance(d, int) else 2 for d in x.shape], kind(x.type)) for x in s.get_inputs()}
    s.run(None, feed)
PY
}
round() { # $1: cold | prewarm; prints seconds from the switch to every model served
  rm -rf "$DIR/run" && mkdir -p "$DIR/run/cache"
  if [ "$1" = prewarm ]; then
    config "$OLD_LIB" "[runtimes]
onnxruntime = [\"$PWD/$NEW_LIB\"]"
  else
    config "$OLD_LIB" ""
  fi
  start
  until [ -S "$DIR/run/cache/s.sock" ]; do sleep 0.01; done
  until all_ready; do sleep 0.2; done
  stop
  config "$PWD/$NEW_LIB" ""
  local t0 t1
  t0=$(date +%s.%N)
  start
  until [ -S "$DIR/run/cache/s.sock" ]; do sleep 0.01; done
  serve_all
  t1=$(date +%s.%N)
  local builds
  builds=$("$BIN" stats --json --config "$DIR/run/config.toml" | $PY -c 'import json,sys; print(json.load(sys.stdin)["builds"])')
  stop
  echo "$1 $(echo "$t1 - $t0" | bc) $builds"
}
echo "# $N x $MODEL, $ROUNDS rounds; old $(basename "$OLD_LIB"), new $(basename "$NEW_LIB"); $BIN" >&2
for r in $(seq "$ROUNDS"); do
  round cold
  round prewarm
done | tee "$DIR/rounds.txt"
$PY - "$DIR/rounds.txt" "$N" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {m: statistics.median(float(r[1]) for r in rows if r[0] == m) for m in ("cold", "prewarm")}
builds = {m: statistics.median(int(r[2]) for r in rows if r[0] == m) for m in ("cold", "prewarm")}
print(f"models: {sys.argv[2]}; rounds: {len(rows)//2}")
print(f"switch to every model served, cold (no pre-warm): {med['cold']:.2f} s median, {builds['cold']:.0f} builds after the switch")
print(f"switch to every model served, pre-warmed:         {med['prewarm']:.2f} s median, {builds['prewarm']:.0f} builds after the switch")
print(f"ratio cold / pre-warmed: {med['cold'] / med['prewarm']:.1f}x")
PY
