"""Does the ort-cpu artifact's saved prepacked weights make session creation cheaper?

Usage: prepack.py RAW_MODEL ARTIFACT_DIR [RUNS]. Writes a plain optimized model (ONNX
Runtime's own, no prepacked copies) next to a temp dir, then times, interleaved, session
creation at optimizations off for: the trtcache artifact, the plain optimized model, each with
`session.disable_prepacking=1`, and the raw model at ORT_ENABLE_ALL (what a user would do);
plus the first and the steady (mean of 20) inference time of each session. Prints medians and
minimums in ms.
"""
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

raw, art_dir = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 15
art = os.path.join(art_dir, "model.onnx")
plain_dir = tempfile.mkdtemp(prefix="trtcache-plain-")
plain = os.path.join(plain_dir, "model.onnx")

so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.log_severity_level = 3
so.optimized_model_filepath = plain
so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "model.onnx.data")
so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])

DISABLE = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
NOPREPACK = {"session.disable_prepacking": "1"}


def measure(path, level, config):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    t0 = time.perf_counter()
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    session = time.perf_counter() - t0
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if len(shape) >= 2 and not isinstance(i.shape[1], int):
            shape[1] = 16
        feeds[i.name] = np.ones(shape, dtype=np.int64 if "int64" in i.type else np.float32)
    t0 = time.perf_counter()
    s.run(None, feeds)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(20):
        s.run(None, feeds)
    steady = (time.perf_counter() - t0) / 20
    return session * 1e3, first * 1e3, steady * 1e3


cases = {
    "raw model, ORT_ENABLE_ALL": (raw, ALL, {}),
    "trtcache artifact (prepacked), off": (art, DISABLE, {}),
    "plain optimized model, off": (plain, DISABLE, {}),
    "trtcache artifact, off, disable_prepacking": (art, DISABLE, NOPREPACK),
    "plain optimized model, off, disable_prepacking": (plain, DISABLE, NOPREPACK),
}
res = {k: [] for k in cases}
for _ in range(runs):
    for k, c in cases.items():
        res[k].append(measure(*c))
print(f"| session from | session median ms | session min ms | first run ms | steady run ms |")
print("|---|---:|---:|---:|---:|")
for k, v in res.items():
    med = lambda j: statistics.median(x[j] for x in v)
    print(f"| {k} | {med(0):.1f} | {min(x[0] for x in v):.1f} | {med(1):.2f} | {med(2):.2f} |")
print(f"\nartifact data {os.path.getsize(art + '.data') / 2**20:.1f} MiB, plain optimized data "
      f"{os.path.getsize(plain + '.data') / 2**20:.1f} MiB")
