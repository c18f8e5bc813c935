#!/usr/bin/env bash
# Daemon benchmarks (issue 5): acquire latency p50/p99 with 1 and 32 clients and acquires/s
# on a cache hit, startup to READY with 1,000 cache entries, idle RSS with 1,000 entries, and a
# consumer's time to first inference through trtcache vs building its own session.
# Medians of RUNS (default 5) runs. Usage: benches/daemon.sh [RUNS] [first]
# (`first`: only the time-to-first-inference measurement).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
ONLY=${2:-all}
eval "$(scripts/ort-env.sh)"
cargo build --release --quiet --bin trtcache --example bench_daemon
T=$PWD/target/release/trtcache
B=$PWD/target/release/examples/bench_daemon
W=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
PY=${TRTCACHE_PYTHON:-python3}
# Median over runs of each run's own/via ratio (paired: both measured in the same process).
pratio() { "$PY" -c 'import sys,json,statistics as s; print(round(s.median(json.loads(l)["own_session_ms"]/json.loads(l)["via_trtcache_ms"] for l in sys.stdin if l.strip()),2))'; }
median() { "$PY" -c 'import sys,json,statistics as s; k=sys.argv[1]; v=[json.loads(l)[k] for l in sys.stdin if l.strip()]; print(round(s.median(v),1))' "$1"; }

mkdir -p "$W/models" "$W/cache" "$W/big/models"
if [ "$ONLY" != first ]; then
"$B" models "$W/models" 1000
cat > "$W/config.toml" <<TOML
models = "$W/models"
cache_dir = "$W/cache"
socket = "$W/cache/trtcache.sock"
[limits]
build_concurrency = 2
TOML

echo "== first start: builds 1,000 artifacts (not timed)" >&2
"$B" startup "$T" "$W/config.toml" "$W/cache/trtcache.sock" >&2
echo "== startup to READY and idle RSS with 1,000 cache entries, $RUNS runs" >&2
: > "$W/startup.jsonl"
for _ in $(seq "$RUNS"); do "$B" startup "$T" "$W/config.toml" "$W/cache/trtcache.sock" | tee -a "$W/startup.jsonl" >&2; done

echo "== acquire latency on a cache hit" >&2
"$T" serve --config "$W/config.toml" 2>/dev/null & PID=$!
until [ -S "$W/cache/trtcache.sock" ]; do sleep 0.05; done
"$T" warm --config "$W/config.toml" >/dev/null 2>&1
: > "$W/lat1.jsonl"; : > "$W/lat32.jsonl"
for _ in $(seq "$RUNS"); do "$B" latency "$W/cache/trtcache.sock" m0000 1 20000 | tee -a "$W/lat1.jsonl" >&2; done
# 32 connections three ways (see examples/bench_daemon.rs): a thread each, saturating; one
# poll(2) thread, saturating; a thread each at 10,000 acquires/s in total (the issue's rate).
: > "$W/lat32poll.jsonl"; : > "$W/lat32paced.jsonl"
for _ in $(seq "$RUNS"); do
  "$B" latency "$W/cache/trtcache.sock" m0001 32 1000 | tee -a "$W/lat32.jsonl" >&2
  "$B" latency "$W/cache/trtcache.sock" m0001 32 1000 poll | tee -a "$W/lat32poll.jsonl" >&2
  "$B" latency "$W/cache/trtcache.sock" m0001 32 300 paced:10000 | tee -a "$W/lat32paced.jsonl" >&2
done
echo "== file stable -> build queued (debounce_ms = 500)" >&2
"$B" stable-to-queued "$W/cache/trtcache.sock" "$W/models" "$RUNS" | tee "$W/stq.jsonl" >&2
kill "$PID"; wait "$PID" || true; PID=
fi

echo "== time to first inference, BERT-sized encoder (BertConfig::small: 4 layers, hidden 256)" >&2
"$B" bert "$W/big/models"
# The same model served with a fixed-shape profile (the shape the consumer runs), which the
# ort-cpu backend bakes into the artifact.
cp "$W/big/models/bert.onnx" "$W/big/models/bert_fixed.onnx"
printf '[profiles.serve]\nopt = "input_ids:1x16,attention_mask:1x16"\n' > "$W/big/models/bert_fixed.trtcache.toml"
cat > "$W/big/config.toml" <<TOML
models = "$W/big/models"
cache_dir = "$W/big/cache"
socket = "$W/big/cache/trtcache.sock"
TOML
"$T" serve --config "$W/big/config.toml" 2>/dev/null & PID=$!
until [ -S "$W/big/cache/trtcache.sock" ]; do sleep 0.05; done
"$T" warm --config "$W/big/config.toml" >/dev/null 2>&1
: > "$W/first.jsonl"; : > "$W/fixed.jsonl"; : > "$W/py.jsonl"; : > "$W/pyfixed.jsonl"
for _ in $(seq "$RUNS"); do
  "$B" first-inference "$W/big/cache/trtcache.sock" bert "$W/big/models/bert.onnx" | tee -a "$W/first.jsonl" >&2
  "$B" first-inference "$W/big/cache/trtcache.sock" bert_fixed "$W/big/models/bert.onnx" | tee -a "$W/fixed.jsonl" >&2
  # The same through the Python client (its session defaults; see benches/consumer.py).
  "$PY" benches/first_inference.py "$W/big/cache/trtcache.sock" bert "$W/big/models/bert.onnx" | tee -a "$W/py.jsonl" >&2
  "$PY" benches/first_inference.py "$W/big/cache/trtcache.sock" bert_fixed "$W/big/models/bert.onnx" | tee -a "$W/pyfixed.jsonl" >&2
done
kill "$PID"; wait "$PID" || true; PID=

via=$(median via_trtcache_ms < "$W/first.jsonl"); own=$(median own_session_ms < "$W/first.jsonl")
files=$(median via_files_ms < "$W/first.jsonl")
fvia=$(median via_trtcache_ms < "$W/fixed.jsonl"); fown=$(median own_session_ms < "$W/fixed.jsonl")
pvia=$(median via_trtcache_ms < "$W/py.jsonl"); pown=$(median own_session_ms < "$W/py.jsonl")
pfvia=$(median via_trtcache_ms < "$W/pyfixed.jsonl"); pfown=$(median own_session_ms < "$W/pyfixed.jsonl")
PYROWS="| Python client: first inference via trtcache | $pvia ms | — |
| &nbsp;&nbsp;of which session from the artifact | $(median via_session_ms < "$W/py.jsonl") ms | — |
| Python: own session from the raw model (onnxruntime defaults) + first inference | $pown ms | — |
| Python client: ratio own / via trtcache | $("$PY" -c "print(round($pown/$pvia,2))")× | ≥ 3× |
| Python client: median of the per-run ratios | $(pratio < "$W/py.jsonl")× | ≥ 3× |
| Python client, profile fixed at [1, 16]: via trtcache | $pfvia ms | — |
| Python client, profile fixed at [1, 16]: ratio own / via trtcache | $("$PY" -c "print(round($pfown/$pfvia,2))")× | ≥ 3× |"
if [ "$ONLY" = first ]; then
cat <<MD
Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), no GPU; engine: CachedEngine (ort-cpu).
Command: benches/daemon.sh $RUNS first (medians of $RUNS runs).

| measure | median | target |
|---|---|---|
| first inference via trtcache (connect+acquire+session+run), BERT small | $via ms | — |
| &nbsp;&nbsp;of which connect + acquire | $(median via_acquire_ms < "$W/first.jsonl") ms | — |
| &nbsp;&nbsp;of which session from the artifact (in place, directory descriptor) | $(median via_session_ms < "$W/first.jsonl") ms | — |
| &nbsp;&nbsp;of which first run | $(median via_run_ms < "$W/first.jsonl") ms | — |
| first inference via trtcache, per-file descriptors (symlinks) | $files ms | — |
| first inference, own session from the raw model (optimization All) | $own ms | — |
| &nbsp;&nbsp;of which session | $(median own_session_only_ms < "$W/first.jsonl") ms | — |
| ratio own / via trtcache | $("$PY" -c "print(round($own/$via,2))")× | ≥ 3× |
| median of the per-run ratios own / via trtcache | $(pratio < "$W/first.jsonl")× | ≥ 3× |
| ratio own / via trtcache, per-file descriptors | $("$PY" -c "print(round($own/$files,2))")× | — |
| first inference via trtcache, profile fixed at [1, 16] | $fvia ms | — |
| &nbsp;&nbsp;of which session from the artifact | $(median via_session_ms < "$W/fixed.jsonl") ms | — |
| first inference, own session from the raw model, same run | $fown ms | — |
| ratio own / via trtcache, profile fixed at [1, 16] | $("$PY" -c "print(round($fown/$fvia,2))")× | ≥ 3× |
| median of the per-run ratios, profile fixed at [1, 16] | $(pratio < "$W/fixed.jsonl")× | ≥ 3× |
$PYROWS
MD
exit 0
fi
cat <<MD
Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), no GPU; engine: CachedEngine (ort-cpu).
Command: benches/daemon.sh $RUNS (medians of $RUNS runs).

| measure | median | target |
|---|---|---|
| startup to READY, 1,000 cache entries | $(median ready_ms < "$W/startup.jsonl") ms | < 300 ms |
| startup to all 1,000 models ready (hashing + lookups) | $(median settled_ms < "$W/startup.jsonl") ms | — |
| idle RSS, 1,000 entries | $(median idle_rss_mb < "$W/startup.jsonl") MB | < 64 MB |
| acquire p50, 1 client | $(median p50_us < "$W/lat1.jsonl") µs | — |
| acquire p99, 1 client | $(median p99_us < "$W/lat1.jsonl") µs | — |
| acquires/s, 1 client | $(median acquires_per_s < "$W/lat1.jsonl") | — |
| acquire p50, 32 clients, a thread each, saturating | $(median p50_us < "$W/lat32.jsonl") µs | — |
| acquire p99, 32 clients, a thread each, saturating | $(median p99_us < "$W/lat32.jsonl") µs | < 1 ms |
| acquires/s, 32 clients, a thread each | $(median acquires_per_s < "$W/lat32.jsonl") | ≥ 10,000 |
| acquire p50, 32 connections, one poll thread, saturating | $(median p50_us < "$W/lat32poll.jsonl") µs | — |
| acquire p99, 32 connections, one poll thread, saturating | $(median p99_us < "$W/lat32poll.jsonl") µs | < 1 ms |
| acquires/s, 32 connections, one poll thread | $(median acquires_per_s < "$W/lat32poll.jsonl") | ≥ 10,000 |
| acquire p50, 32 clients at 10,000/s in total | $(median p50_us < "$W/lat32paced.jsonl") µs | — |
| acquire p99, 32 clients at 10,000/s in total | $(median p99_us < "$W/lat32paced.jsonl") µs | < 1 ms |
| file stable → listed and queued (debounce 500 ms) | $(median stable_to_queued_ms < "$W/stq.jsonl") ms | debounce + < 100 ms |
| first inference via trtcache (connect+acquire+session+run) | $via ms | — |
| first inference, own session from the raw model | $own ms | — |
| ratio own / via trtcache | $("$PY" -c "print(round($own/$via,2))")× | ≥ 3× |
| first inference via trtcache, profile fixed at [1, 16] | $fvia ms | — |
| ratio own / via trtcache, profile fixed at [1, 16] | $("$PY" -c "print(round($fown/$fvia,2))")× | ≥ 3× |
$PYROWS
MD
