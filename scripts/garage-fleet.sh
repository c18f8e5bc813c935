#!/usr/bin/env bash
# The fleet tier on a real distributed store: a 3-node Garage cluster on loopback (crates.io
# `garage`, replication factor 3), three trtcache hosts that each sign with their own key and
# trust all three, each talking to a different Garage node. Every round, the hosts build the
# same model and push it at the same moment (Garage ignores `If-None-Match: *`, so all three
# manifest writes "succeed"); then each host pulls it into an empty cache, through its own
# node, and must accept it: one valid, signed manifest that every host takes. RELIABILITY.md
# quotes the last run.
#
#   scripts/garage-fleet.sh [ROUNDS]        (default 20; needs target/release/trtcache)
#
# Garage: $GARAGE, else `garage` on PATH, else target/tools/garage/bin/garage. Install it with
#   cargo install garage --locked --root target/tools/garage      (about an hour on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-20}
TRT=${TRTCACHE:-$PWD/target/release/trtcache}
GARAGE=${GARAGE:-$(command -v garage || echo "$PWD/target/tools/garage/bin/garage")}
[ -x "$TRT" ] || { echo "no $TRT: cargo build --release" >&2; exit 2; }
[ -x "$GARAGE" ] || { echo "no garage binary: cargo install garage --locked --root target/tools/garage (or set GARAGE)" >&2; exit 2; }
eval "$(scripts/ort-env.sh)"
PY=.venv/bin/python
W=$(mktemp -d /tmp/garage-fleet.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
secret=$($PY -c 'import secrets; print(secrets.token_hex(32))')
g() { local n=$1; shift; "$GARAGE" -c "$W/n$n/garage.toml" "$@"; }

echo "garage-fleet: $("$GARAGE" --version 2>/dev/null | head -1), trtcache $("$TRT" --version), $ROUNDS rounds, in $W"
for n in 1 2 3; do
  mkdir -p "$W/n$n/meta" "$W/n$n/data"
  cat > "$W/n$n/garage.toml" <<EOF
metadata_dir = "$W/n$n/meta"
data_dir = "$W/n$n/data"
db_engine = "sqlite"
replication_factor = 3
rpc_bind_addr = "127.0.0.1:39${n}1"
rpc_public_addr = "127.0.0.1:39${n}1"
rpc_secret = "$secret"
[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:39${n}0"
root_domain = ".s3.garage.localhost"
[admin]
api_bind_addr = "127.0.0.1:39${n}3"
admin_token = "trtcache-test"
EOF
  "$GARAGE" -c "$W/n$n/garage.toml" server > "$W/n$n/log" 2>&1 &
  pids+=($!)
done
for n in 1 2 3; do
  for _ in $(seq 100); do g "$n" node id -q > "$W/n$n/id" 2>/dev/null && break; sleep 0.2; done
done
for n in 2 3; do g 1 node connect "$(cat "$W/n$n/id")" > /dev/null; done
for n in 1 2 3; do g 1 layout assign -z "dc$n" -c 1G "$(cut -d@ -f1 "$W/n$n/id")" > /dev/null; done
g 1 layout apply --version 1 > /dev/null
for _ in $(seq 100); do g 1 bucket create trtcache > /dev/null 2>&1 && break; sleep 0.3; done
g 1 key create trtcache-key > "$W/key.txt"
KEY_ID=$(grep -i 'key id' "$W/key.txt" | awk '{print $NF}')
SECRET=$(grep -i 'secret key' "$W/key.txt" | awk '{print $NF}')
g 1 bucket allow --read --write --owner trtcache --key trtcache-key > /dev/null
export AWS_ACCESS_KEY_ID=$KEY_ID AWS_SECRET_ACCESS_KEY=$SECRET
echo "garage-fleet: cluster of 3 up (layout applied, bucket trtcache, key $KEY_ID)"

# Three hosts: own key, all three trusted, each on its own Garage node.
trusted=""
for h in 1 2 3; do
  mkdir -p "$W/h$h"
  "$TRT" keygen "$W/h$h/host$h" > /dev/null
  trusted="$trusted\"$W/h$h/host$h.pub\", "
done
for h in 1 2 3; do
  cat > "$W/h$h/config.toml" <<EOF
[remote]
url = "s3://trtcache/fleet"
endpoint = "http://127.0.0.1:39${h}0"
region = "garage"
mode = "read-write"
trusted_keys = [${trusted%, }]
signing_key = "$W/h$h/host$h.key"
EOF
done

accepted=0; refused=0; adopted=0; signers=""
mkdir -p "$W/models"
for r in $(seq "$ROUNDS"); do
  m="$W/models/m$r.onnx"
  # A new content every round (one weight scaled), so every round is a new key.
  $PY - "$m" "$r" <<'EOF'
import sys, onnx, numpy as np
from onnx import numpy_helper
m = onnx.load("examples/models/tiny_encoder_static.onnx")
init = m.graph.initializer[0]
a = numpy_helper.to_array(init).astype(np.float32) * (1 + int(sys.argv[2]) * 1e-3)
init.CopyFrom(numpy_helper.from_array(a.astype(numpy_helper.to_array(init).dtype), init.name))
onnx.save(m, sys.argv[1])
EOF
  for h in 1 2 3; do
    "$TRT" build "$m" --cache-dir "$W/h$h/cache" --json > "$W/h$h/build$r.json" 2> "$W/h$h/build$r.err"
  done
  # The race: three pushes of the same key at once, each through another node.
  for h in 1 2 3; do
    "$TRT" push --all --config "$W/h$h/config.toml" --cache-dir "$W/h$h/cache" --json > "$W/h$h/push$r.json" 2> "$W/h$h/push$r.err" &
  done
  wait_ok=0
  for j in $(jobs -p); do
    # (the Garage servers are not jobs of this subshell's `jobs -p` list past the first loop)
    if [[ " ${pids[*]} " == *" $j "* ]]; then continue; fi
    wait "$j" || wait_ok=$?
  done
  [ "$wait_ok" = 0 ] || { echo "round $r: a push failed ($wait_ok)"; cat "$W"/h*/push$r.err; exit 1; }
  key=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["key"])' "$W/h1/build$r.json")
  # This round's key only (push --all also lists the earlier rounds' keys, adopted since).
  adopted=$((adopted + $($PY -c 'import json,sys; k=sys.argv[1]; print(sum(1 for f in sys.argv[2:] for u in json.load(open(f))["uploaded"] if u.get("key") == k and u.get("adopted")))' "$key" "$W"/h*/push$r.json)))
  # Every host, from an empty cache, through its own node.
  for h in 1 2 3; do
    if out=$("$TRT" pull "$m" --config "$W/h$h/config.toml" --cache-dir "$W/h$h/fresh$r" --json 2> "$W/h$h/pull$r.err"); then
      origin=$(echo "$out" | $PY -c 'import json,sys; print(json.load(sys.stdin).get("origin"))')
      if [ "$origin" = remote ]; then accepted=$((accepted + 1)); else refused=$((refused + 1)); echo "round $r host $h: origin $origin"; fi
    else
      refused=$((refused + 1)); echo "round $r host $h: pull failed: $(tail -2 "$W/h$h/pull$r.err")"
    fi
  done
  signer=$($PY - "$key" <<'EOF'
import sys, os, json, boto3
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:3910", region_name="garage")
body = s3.get_object(Bucket="trtcache", Key=f"fleet/manifests/{sys.argv[1]}")["Body"].read()
env = json.loads(body)
sigs = env.get("signatures") or []
print(",".join(sorted(s["key"] for s in sigs)) or "unsigned")
EOF
)
  signers="$signers $signer"
done
total=$((ROUNDS * 3))
echo "garage-fleet: $ROUNDS rounds x 3 racing pushes of one key each; pushes that found another's manifest and adopted it: $adopted of $((ROUNDS * 3)) (a server honouring If-None-Match makes 2 of every 3 adopt: $((ROUNDS * 2)); the rest 'succeeded' in writing over each other)"
echo "garage-fleet: pulls accepted $accepted / $total, refused $refused"
echo "garage-fleet: the manifest every host read, by signer:$(printf '%s\n' $signers | sort | uniq -c | awk '{printf " %s×%s", $1, $2}')"
[ "$accepted" = "$total" ]
