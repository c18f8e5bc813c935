#!/usr/bin/env bash
# Benchmark: `trtcache key` digest of a ~400 MB model against sha256sum and openssl on the
# same file, cold (memo disabled) and remembered (digest memo hit). Medians of RUNS rounds,
# interleaved so background load hits every command alike.
#
#   benches/key.sh [DIR]            # DIR holds/gets big_weights.onnx (default target/bench-keys)
#   RUNS=7 SKIP_BUILD=1 benches/key.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-target/bench-keys}
RUNS=${RUNS:-7}
if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build --release --bin trtcache --example make_models >&2
fi
BIN=target/release/trtcache
M="$DIR/big_weights.onnx"
if [[ ! -f "$M" ]]; then
  target/release/examples/make_models "$DIR" --big-layers 25 >&2
fi
eval "$(scripts/ort-env.sh)"
export ORT_DYLIB_PATH
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
SIZE=$(stat -c %s "$M")
cat "$M" > /dev/null   # page cache warm for every contender

# Remember once (memo written after a cold hash; the racy margin is waited out first).
sleep 0.2
$BIN key "$M" --cache-dir "$CACHE" --json > /dev/null
# Wall time and CPU time (user+sys of the child) per command; the digest part from --json.
python3 - "$M" "$BIN" "$CACHE" "$RUNS" "$SIZE" <<'PY'
import json, resource, statistics, subprocess, sys, time
m, binary, cache, runs, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cmds = [
    ("sha256sum FILE", "sha256sum", ["sha256sum", m]),
    ("openssl dgst -sha256 FILE", "openssl", ["openssl", "dgst", "-sha256", m]),
    ("trtcache key FILE --no-memo (all cores)", "key_cold", [binary, "key", m, "--no-memo", "--json"]),
    ("trtcache key FILE --no-memo --threads 1", "key_1t", [binary, "key", m, "--no-memo", "--threads", "1", "--json"]),
    ("trtcache key FILE (digest remembered)", "key_memo", [binary, "key", m, "--cache-dir", cache, "--json"]),
]
wall, cpu, dig = {}, {}, {}
for _ in range(runs):
    for name, k, argv in cmds:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True).stdout
        t = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall.setdefault(k, []).append(t)
        cpu.setdefault(k, []).append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
        if k.startswith("key"):
            d = json.loads(out)["digest"]
            if k == "key_memo":
                assert d["memo_hits"] == d["files"], d
            dig.setdefault(k, []).append(d["seconds"])
med = lambda v: statistics.median(v)
base_w, base_c = med(wall["openssl"]), med(cpu["openssl"])
print(f"file: {size} bytes; {runs} interleaved rounds; medians (min..max)\n")
print("| command | wall | digest part (from --json) | CPU user+sys | MB/s (wall) | openssl wall / this |")
print("|---|---:|---:|---:|---:|---:|")
for name, k, _ in cmds:
    w = wall[k]
    d = f"{med(dig[k])*1e3:.3f} ms ({min(dig[k])*1e3:.3f}..{max(dig[k])*1e3:.3f})" if k in dig else "-"
    mbs = "-" if k == "key_memo" else f"{size / med(w) / 1e6:.0f}"
    print(f"| `{name}` | {med(w)*1e3:.1f} ms ({min(w)*1e3:.1f}..{max(w)*1e3:.1f}) | {d} | {med(cpu[k])*1e3:.0f} ms | {mbs} | {base_w / med(w):.2f}x |")
PY
echo
echo "machine: $(nproc) cores, $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | xargs), sha_ni: $(grep -c sha_ni /proc/cpuinfo) of $(nproc) cpus; load average after: $(cut -d" " -f1-3 /proc/loadavg)"
echo "versions: $(sha256sum --version | head -1), $(openssl version)"
