#!/usr/bin/env python3
"""A/B of two `trtcache build` flag sets on corpus models: the artifacts' consumer session
and first run against the raw model's, in fresh processes, side by side in one run.

    benches/build_ab.py CORPUS [--a ''] [--b '--no-rewrite'] [--only REGEX] [--runs 7]
        [--core 0] [--trtcache target/release/trtcache]

Per model (CORPUS/<name>/model.onnx with its feed.pkl, as scripts/corpus/realworld.py
writes them): builds it twice with `trtcache build --backend ort-cpu` and each flag set
(e.g. the defaults against `--no-rewrite`, or `--external-min-size 256K`), then per run
starts one fresh process per way, pinned to one core (`taskset -c CORE`), rotating which
goes first: `raw` (the model at ONNX Runtime's defaults, ORT_ENABLE_ALL), `a` and `b` (each
artifact opened as the Python client opens it: optimizations off, weights packed on the
pool, memory-reuse planning off where an input has a free dimension). Each process times
the session and one run on the corpus feed. Prints per model the medians and the ratios
raw / a, raw / b and b / a (> 1: `a` is faster), then the geometric means.
"""
import argparse
import json
import math
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(path, feed_path, way, free):
    """One fresh consumer process: prints `session_ms run_ms`."""
    import numpy as np  # noqa: F401  (every consumer imports it)
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    feed = pickle.load(open(feed_path, "rb"))
    t = time.perf_counter()
    if way == "raw":
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    else:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
        so.enable_mem_reuse = free != "1"
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    opened = time.perf_counter()
    names = {i.name for i in s.get_inputs()}
    s.run(None, {k: v for k, v in feed.items() if k in names})
    done = time.perf_counter()
    print(f"{(opened - t) * 1e3:.3f} {(done - opened) * 1e3:.3f}")


def free_dims(model):
    """Whether an input of the model (not an initializer) has a dimension without a size."""
    import onnx

    m = onnx.load(model, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return any(not d.HasField("dim_value") or d.dim_value < 0
               for i in m.graph.input if i.name not in inits for d in i.type.tensor_type.shape.dim)


def build(a, model, cache, flags):
    p = subprocess.run([a.trtcache, "build", "--backend", "ort-cpu", "--json", "--no-sidecar",
                        "--cache-dir", cache, *flags, model], capture_output=True, text=True)
    j = json.loads(p.stdout)
    if not j.get("servable"):
        sys.exit(f"{model}: build with {flags} failed: {p.stdout[-500:]}{p.stderr[-500:]}")
    v = (j.get("record") or {}).get("validation") or {}
    return j["artifact"]["entry"], v.get("rewrites") or []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--a", default="", help="flags of the first build (default: none)")
    ap.add_argument("--b", default="--no-rewrite", help="flags of the second build")
    ap.add_argument("--only")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--trtcache", default=os.path.join(os.path.dirname(HERE), "target", "release", "trtcache"))
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    names = sorted(d for d in os.listdir(a.corpus)
                   if os.path.isfile(os.path.join(a.corpus, d, "model.onnx")) and (not only or only.search(d)))
    ratios = {"raw/a": [], "raw/b": [], "b/a": []}
    print(f"a: `{a.a}`  b: `{a.b}`; {a.runs} fresh processes per way, core {a.core}; medians, ms (session + first run)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in names:
            model = os.path.join(a.corpus, n, "model.onnx")
            feed = os.path.join(a.corpus, n, "feed.pkl")
            (ea, ra), (eb, rb) = (build(a, model, os.path.join(tmp, w), f.split())
                                  for w, f in (("a", a.a), ("b", a.b)))
            paths = {"raw": model, "a": ea, "b": eb}
            free = "1" if free_dims(model) else "0"
            got = {w: [] for w in paths}
            ways = list(paths)
            for r in range(a.runs):
                for w in ways[r % 3:] + ways[:r % 3]:
                    p = subprocess.run(["taskset", "-c", str(a.core), sys.executable, os.path.abspath(__file__),
                                        "--child", paths[w], feed, w, free], capture_output=True, text=True, check=True)
                    got[w].append([float(x) for x in p.stdout.split()])
            med = {w: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
                       statistics.median(x[0] + x[1] for x in v)) for w, v in got.items()}
            row = {"raw/a": med["raw"][2] / med["a"][2], "raw/b": med["raw"][2] / med["b"][2],
                   "b/a": med["b"][2] / med["a"][2]}
            for k, v in row.items():
                ratios[k].append(v)
            fmt = lambda m: f"{m[2]:7.1f} ({m[0]:6.1f} + {m[1]:6.1f})"  # noqa: E731
            print(f"{n:28} raw {fmt(med['raw'])}  a {fmt(med['a'])}  b {fmt(med['b'])}  "
                  f"raw/a {row['raw/a']:5.2f}x  raw/b {row['raw/b']:5.2f}x  b/a {row['b/a']:5.2f}x"
                  + (f"  [a: {'; '.join(ra)}]" if ra else "") + (f"  [b: {'; '.join(rb)}]" if rb else ""),
                  flush=True)
    gm = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items() if v}
    print(f"\n{len(names)} models: geometric mean raw/a {gm['raw/a']:.2f}x, raw/b {gm['raw/b']:.2f}x, b/a {gm['b/a']:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
    else:
        main()
