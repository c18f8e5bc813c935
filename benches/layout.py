"""Where the ort-cpu artifact should split initializers between its graph file and its data file.

Usage: layout.py RAW_MODEL [RUNS]. Writes ONNX Runtime's optimized model (level All, as the
ort-cpu backend does) in several layouts: initializers of at least 1 KiB (ORT's default),
64 KiB, 256 KiB (trtcache's default) or 1 MiB in the data file and the rest inline, all
inline; prepacked weights saved as trtcache does, and 256 KiB without them. Then times session
creation at optimizations off for each, interleaved with the raw model at ORT_ENABLE_ALL, and
measures the private (anonymous) and file-backed memory of a process after one session and one
inference. Prints a Markdown table of medians in ms.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnxruntime as ort

raw = sys.argv[1]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 9
P = ["CPUExecutionProvider"]
out = tempfile.mkdtemp(prefix="trtcache-layout-")


def write(name, min_bytes, prepacked):
    d = os.path.join(out, name)
    os.makedirs(d)
    p = os.path.join(d, "model.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.optimized_model_filepath = p
    if min_bytes is not None:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "model.onnx.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(min_bytes))
        if prepacked:
            so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    ort.InferenceSession(raw, so, providers=P)
    return p


variants = {
    "1 KiB (ORT's default), prepacked": write("a", 1024, True),
    "64 KiB, prepacked": write("b", 64 << 10, True),
    "256 KiB, prepacked (trtcache's default)": write("c", 256 << 10, True),
    "1 MiB, prepacked": write("d", 1 << 20, True),
    "256 KiB, no prepacked copies": write("e", 256 << 10, False),
    "all inline": write("f", None, False),
}


def session(path, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    t = time.perf_counter()
    ort.InferenceSession(path, so, providers=P)
    return (time.perf_counter() - t) * 1e3


MEM = r"""
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.log_severity_level = 3
def mem():
    v = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(('RssAnon', 'RssFile'))}
    return v['RssAnon'], v['RssFile']
a0, f0 = mem()
s = ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])
feeds = {}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else (1 if k == 0 else 16) for k, d in enumerate(i.shape)]
    feeds[i.name] = np.ones(shape, dtype=np.int64 if 'int64' in i.type else np.float32)
s.run(None, feeds)
a1, f1 = mem()
print((a1 - a0) / 1024, (f1 - f0) / 1024)
"""

times = {k: [] for k in variants}
times["raw model, ORT_ENABLE_ALL"] = []
for k, p in variants.items():
    session(p, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)  # page cache, lazy init
for _ in range(runs):
    for k, p in variants.items():
        times[k].append(session(p, ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
    times["raw model, ORT_ENABLE_ALL"].append(session(raw, ort.GraphOptimizationLevel.ORT_ENABLE_ALL))

raw_ms = statistics.median(times["raw model, ORT_ENABLE_ALL"])
print(f"model: {raw} ({runs} interleaved runs)\n")
print("| layout | files (MB) | session median ms | min ms | raw All / this | private MB | file-backed MB |")
print("|---|---|---:|---:|---:|---:|---:|")
for k, v in times.items():
    med = statistics.median(v)
    if k in variants:
        d = os.path.dirname(variants[k])
        files = " + ".join(f"{os.path.getsize(os.path.join(d, f)) / 1e6:.1f}" for f in sorted(os.listdir(d)))
        anon, filed = subprocess.run([sys.executable, "-c", MEM, variants[k]], check=True,
                                     capture_output=True, text=True).stdout.split()
        print(f"| {k} | {files} | {med:.1f} | {min(v):.1f} | {raw_ms / med:.2f}x | {float(anon):.1f} | {float(filed):.1f} |")
    else:
        print(f"| {k} | | {med:.1f} | {min(v):.1f} | 1.00x | | |")
