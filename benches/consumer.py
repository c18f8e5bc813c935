"""What the Python client's session defaults buy a consumer, on real trtcache artifacts.

Usage: consumer.py RAW_MODEL ARTIFACT_GRAPH [RUNS]. Times, interleaved, session creation from
the artifact with: optimizations off only; plus `session.prepack.enable_parallel=1`; plus
`enable_mem_reuse=False` (what `Artifact.session()` uses when an input has a free dimension);
and from the raw model at ORT_ENABLE_ALL with the defaults (what a user would otherwise do) and
with the same two options (to show what they do for the raw model). Then, for the defaults and
the client's options, the first and the median of 10 inferences at [1, 16] and [8, 128] and the
process's peak RSS (each in a fresh process). Prints Markdown tables; medians in ms.
"""
import json
import statistics
import subprocess
import sys
import time

import onnxruntime as ort

raw, art = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 7
D, A = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def options(level, parallel, reuse):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if parallel:
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
    so.enable_mem_reuse = reuse
    return so


def session(path, so):
    t = time.perf_counter()
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return (time.perf_counter() - t) * 1e3


cases = {
    "artifact, optimizations off": (art, D, False, True),
    "artifact, + parallel prepacking": (art, D, True, True),
    "artifact, + no memory-reuse plan (the Python client)": (art, D, True, False),
    "raw model, ORT_ENABLE_ALL (defaults)": (raw, A, False, True),
    "raw model, ORT_ENABLE_ALL, + both options": (raw, A, True, False),
}
times = {k: [] for k in cases}
for _ in range(runs):
    for k, (p, lvl, par, reuse) in cases.items():
        times[k].append(session(p, options(lvl, par, reuse)))
base = statistics.median(times["raw model, ORT_ENABLE_ALL (defaults)"])
print(f"raw: {raw}\nartifact: {art}\n{runs} interleaved runs\n")
print("| session from | median ms | min ms | raw (defaults) / this |")
print("|---|---:|---:|---:|")
for k, v in times.items():
    print(f"| {k} | {statistics.median(v):.1f} | {min(v):.1f} | {base / statistics.median(v):.2f}x |")

RUN = r"""
import json, resource, statistics, sys, time, numpy as np, onnxruntime as ort
art, reuse, b, s = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.log_severity_level = 3; so.enable_mem_reuse = reuse
if not reuse: so.add_session_config_entry("session.prepack.enable_parallel", "1")
sess = ort.InferenceSession(art, so, providers=["CPUExecutionProvider"])
feeds = {i.name: np.ones((b, s), dtype=np.int64) for i in sess.get_inputs()}
t = []
for _ in range(11):
    t0 = time.perf_counter(); sess.run(None, feeds); t.append((time.perf_counter() - t0) * 1e3)
print(json.dumps([t[0], statistics.median(t[1:]), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))
"""
print("\n| artifact opened with | input | first run ms | median run ms | peak RSS MB |")
print("|---|---|---:|---:|---:|")
for b, s in [(1, 16), (8, 128)]:
    for label, reuse in [("optimizations off", "1"), ("the Python client's options", "0")]:
        out = subprocess.run([sys.executable, "-c", RUN, art, reuse, str(b), str(s)],
                             check=True, capture_output=True, text=True).stdout
        first, med, peak = json.loads(out)
        print(f"| {label} | [{b}, {s}] | {first:.1f} | {med:.2f} | {peak:.0f} |")
