#!/usr/bin/env bash
# Reliability run: one daemon across N build workers that crash (issue 13). N distinct models
# whose validation allocates 1 GB, beside one good model, with workers bounded to 512 MiB: every
# one of the N builds ends with its worker killed by SIGABRT. Prints whether the daemon is the
# same process afterwards, answers `status`, serves the good model, has no worker left, and its
# RSS and descriptors before and after.
# Usage: benches/crash_uptime.sh [N]   (default 100; needs scripts/setup-python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100}
cargo build --quiet --bin trtcache --bench crash_uptime
DRIVER=$(ls -t target/debug/deps/crash_uptime-* | grep -v '\.d$' | head -1)
eval "$(scripts/ort-env.sh)"
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
"$DRIVER" ./target/debug/trtcache "$ORT_DYLIB_PATH" "$DIR" "$N"
