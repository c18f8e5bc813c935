#!/usr/bin/env bash
# A/B of the acquire path: two builds (e.g. an older commit's target/release and this one),
# the same 4 models, a cache each, alternating rounds; prints benches/daemon.rs's latency JSON
# for 32 saturating client threads and for 1 client. Each dir needs trtcache and the daemon
# driver (`cargo build --release --bin trtcache --bench daemon`: deps/daemon-<hash>).
set -euo pipefail
OLD=${1:?usage: benches/ab_acquire.sh OLD_RELEASE_DIR [NEW_RELEASE_DIR]}; NEW=${2:-$PWD/target/release}
W=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf $W' EXIT
driver() { ls -t "$1"/deps/daemon-* | grep -v '\.d$' | head -1; }
$(driver $NEW) models $W/models 4 >/dev/null
for v in old new; do
  mkdir -p $W/$v/cache
  printf 'models = "%s"\ncache_dir = "%s"\nsocket = "%s"\n' $W/models $W/$v/cache $W/$v/cache/s.sock > $W/$v/config.toml
done
run() { # v bin
  local v=$1 T=$2/trtcache B; B=$(driver $2)
  $T serve --config $W/$v/config.toml 2>/dev/null & local pid=$!
  until [ -S $W/$v/cache/s.sock ]; do sleep 0.05; done
  $T warm --config $W/$v/config.toml >/dev/null 2>&1
  $B latency $W/$v/cache/s.sock m0001 32 1000 | sed "s/^/$v 32t /"
  $B latency $W/$v/cache/s.sock m0001 1 20000 | sed "s/^/$v 1c /"
  kill $pid; wait $pid 2>/dev/null || true
}
for r in 1 2 3; do run old $OLD; run new $NEW; done
