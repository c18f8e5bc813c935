#!/usr/bin/env bash
# Benchmark: what storing one artifact costs against the number of entries already in the
# cache (issue 13: it used to grow with every entry). Fills a cache through the real store API
# (`SledStore::put` of a small staged artifact, then the digest memo's open + insert + save, as
# a build does) and at each size times 200 more stores, under the size limit and at it (every
# store then evicts the least recently used entry). On a tmpfs, so the numbers are the store's
# own work and not the disk's fsync latency.
# Usage: benches/store_scale.sh [SIZES] [PROFILE]   (default 10,1000,10000,100000, debug)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-10,1000,10000,100000}
PROFILE=${2:-debug}
if [ "$PROFILE" = release ]; then
  cargo build --release --quiet --bench store_scale
else
  cargo build --quiet --bench store_scale
fi
DRIVER=$(ls -t target/$PROFILE/deps/store_scale-* | grep -v '\.d$' | head -1)
BASE=/dev/shm
[ -d "$BASE" ] || BASE=${TMPDIR:-/tmp}
DIR=$(mktemp -d "$BASE/store_scale.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); cache on $BASE"
"$DRIVER" "$DIR" "$SIZES" 200
