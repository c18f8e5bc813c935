#!/usr/bin/env bash
# Soak test (RELIABILITY.md, "Long runs and scale"): a release daemon on temp folders, client
# threads acquiring in a loop, churn adding/replacing/removing models, a table every
# interval (throughput, acquire p50/p99, daemon RSS and descriptors, builds) and a verdict.
# Not part of `make test`. Usage: benches/soak.sh [--minutes 10] [--clients 8] [--models 8]
#   [--interval 10] [--sample 25] [--cache-mib 128] [--keep DIR]   (see benches/soak.rs)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/ort-env.sh)"
cargo build --release --quiet --bin trtcache --bench soak
SOAK=$(ls -t target/release/deps/soak-* | grep -v '\.d$' | head -1)
exec "$SOAK" --trtcache target/release/trtcache "$@"
