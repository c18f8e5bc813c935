#!/usr/bin/env python3
"""A graph rewrite's effect on a model's runs: the raw model at ONNX Runtime's defaults
(ORT_ENABLE_ALL) against its `ort-cpu` artifact built with the rewrites and with
`--no-rewrite`, the artifacts opened as the Python client opens them (optimizations off).
Steady runs in one process per model, the three sessions alternating run by run.

    benches/rewrite_ab.py CORPUS [--only REGEX] [--trtcache target/release/trtcache]
        [--runs 30] [--core 0]

CORPUS: a folder of `<name>/model.onnx` + `feed.pkl` (scripts/corpus/realworld.py). Prints
per model the median run of each (the first 5 runs of each session left out) and the
ratios no-rewrite / rewritten and raw / rewritten, with the rewrites the build applied.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = r"""
import sys, time, pickle, statistics, json
import onnxruntime as ort
ort.set_default_logger_severity(3)
feed = pickle.load(open(sys.argv[1], "rb"))
runs = int(sys.argv[2])
ss = []
for i, p in enumerate(sys.argv[3:]):
    so = ort.SessionOptions()
    if i > 0:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
    s = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    names = {x.name for x in s.get_inputs()}
    ss.append((s, {k: v for k, v in feed.items() if k in names}))
ts = [[] for _ in ss]
for r in range(runs):
    for i, (s, f) in enumerate(ss):
        t = time.perf_counter(); s.run(None, f); ts[i].append((time.perf_counter() - t) * 1e3)
print(json.dumps([statistics.median(t[5:]) for t in ts]))
"""


def build(trtcache, model, cache, extra):
    out = subprocess.run([trtcache, "build", model, "--cache-dir", cache, "--json", *extra],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "build failed")
    j = json.loads(out.stdout)
    return j["artifact"]["entry"], j["record"]["validation"].get("rewrites") or []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--only")
    ap.add_argument("--trtcache", default=os.path.join(REPO, "target", "release", "trtcache"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--core", type=int, default=0)
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    with tempfile.TemporaryDirectory(prefix="trtcache-rewrite-ab-") as tmp:
        for name in sorted(os.listdir(a.corpus)):
            model = os.path.join(a.corpus, name, "model.onnx")
            if (only and not only.search(name)) or not os.path.exists(model):
                continue
            os.makedirs(os.path.join(tmp, name))
            try:
                rw, applied = build(a.trtcache, model, os.path.join(tmp, name, "rw"), [])
                if not applied:
                    print(f"{name:28} no rewrite applies", flush=True)
                    continue
                no, _ = build(a.trtcache, model, os.path.join(tmp, name, "no"), ["--no-rewrite"])
            except RuntimeError as e:
                print(f"{name:28} build failed: {e}", flush=True)
                continue
            p = subprocess.run(["taskset", "-c", str(a.core), sys.executable, "-c", CHILD,
                                os.path.join(a.corpus, name, "feed.pkl"), str(a.runs), model, rw, no],
                               capture_output=True, text=True, check=True)
            raw, r, n = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"{name:28} raw {raw:8.2f} ms  rewritten {r:8.2f} ms  no-rewrite {n:8.2f} ms  "
                  f"no-rewrite/rewritten {n / r:5.2f}x  raw/rewritten {raw / r:5.2f}x  "
                  f"({'; '.join(' '.join(x.split(' ')[:2]) for x in applied)})", flush=True)


if __name__ == "__main__":
    main()
