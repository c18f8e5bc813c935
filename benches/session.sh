#!/usr/bin/env bash
# Session creation from the cached ort-cpu artifact vs from the raw model at full
# optimization. Usage: benches/session.sh [--runs N] [--base] [--threads N]
# [--opt-level extended,all] [--cases bert,base,chain,bert20k,bert20k-static] [--bert-nodes N]
# (the dynamic-shape ~20k-node transformer alone takes several minutes per opt level).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/ort-env.sh)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), no GPU"
cargo bench --bench session -- --bench "$@"
