#!/usr/bin/env bash
# The daemon's CPU time per build against the number of models in its folder and entries in
# its cache (issue 39; benches/build_scale.rs says what is measured and how the N are made).
# Medians over ROUNDS rounds of 4 builds per size, on a tmpfs (the store's fsyncs are not the daemon's CPU).
# Usage: benches/build_scale.sh [SIZES] [ROUNDS] [PROFILE] [BIN]
#   SIZES default 100,1000,10000,100000; ROUNDS default 8; PROFILE debug or release (the
#   daemon binary and the driver); BIN another daemon binary to measure (e.g. main's, for a
#   before/after on the same machine).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-100,1000,10000,100000}
ROUNDS=${2:-8}
PROFILE=${3:-debug}
eval "$(scripts/ort-env.sh)"
if [ "$PROFILE" = release ]; then
  cargo build --release --quiet --bin trtcache --bench build_scale
else
  cargo build --quiet --bin trtcache --bench build_scale
fi
BIN=${4:-$PWD/target/$PROFILE/trtcache}
DRIVER=$(ls -t target/$PROFILE/deps/build_scale-* | grep -v '\.d$' | head -1)
BASE=/dev/shm
[ -d "$BASE" ] || BASE=${TMPDIR:-/tmp}
DIR=$(mktemp -d "$BASE/build_scale.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); daemon $BIN ($PROFILE)"
"$DRIVER" "$BIN" "$DIR" "$SIZES" "$ROUNDS"
