#!/usr/bin/env python3
"""Session creation and first run of ONNX models under chosen ONNX Runtime options, A/B in
fresh consumer processes pinned to one core (numpy and onnxruntime imported, the environment
created and the feed loaded before the clock, as `first_realworld.py`'s consumers), the
variants' order rotating each run.

    benches/session_variants.py [--runs 11] [--core 0] FEED.pkl VARIANT [VARIANT ...]

VARIANT: PATH[:OPTION...], where OPTION is one of
  dis      graph optimizations off (how the clients open an ort-cpu artifact)
  1t       one intra-op thread
  ppar     session.prepack.enable_parallel = 1
  nopack   session.disable_prepacking = 1
  noreuse  enable_mem_reuse off (the clients' choice for free dimensions)
  noarena  the CPU memory arena off
  ort      session.load_model_format = ORT (a `.ort` file; see --to-ort)
FEED.pkl: {input name: array}, e.g. a corpus folder's feed.pkl (scripts/corpus/realworld.py).

    benches/session_variants.py --to-ort MODEL.onnx OUT.ort

saves MODEL (an artifact's graph) in ONNX Runtime's own format, optimizations off.
Prints per variant the medians of session, first run and their total in ms.
"""
import argparse
import json
import statistics
import subprocess
import sys

CHILD = r'''
import json, pickle, sys, time
import numpy, onnxruntime as ort
ort.set_default_logger_severity(3)
feed = pickle.load(open(sys.argv[2], "rb"))
path, *opts = sys.argv[1].split(":")
t = time.perf_counter()
so = ort.SessionOptions()
if "dis" in opts: so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
if "1t" in opts: so.intra_op_num_threads = 1
if "ppar" in opts: so.add_session_config_entry("session.prepack.enable_parallel", "1")
if "nopack" in opts: so.add_session_config_entry("session.disable_prepacking", "1")
if "noreuse" in opts: so.enable_mem_reuse = False
if "noarena" in opts: so.enable_cpu_mem_arena = False
if "ort" in opts: so.add_session_config_entry("session.load_model_format", "ORT")
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
names = {i.name for i in s.get_inputs()}
s.run(None, {k: v for k, v in feed.items() if k in names})
t2 = time.perf_counter()
print(json.dumps([(t1 - t) * 1e3, (t2 - t1) * 1e3]))
'''


def to_ort(model, out):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = out
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--to-ort":
        return to_ort(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("feed")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--core", type=int, default=0)
    a = ap.parse_args()
    vs = a.variants
    got = {v: [] for v in vs}
    for r in range(a.runs):
        for v in vs[r % len(vs):] + vs[:r % len(vs)]:
            p = subprocess.run(["taskset", "-c", str(a.core), sys.executable, "-c", CHILD, v, a.feed],
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{v}: {p.stderr[-2000:]}")
            got[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
    for v in vs:
        xs = got[v]
        print(f"{v}: session {statistics.median(x[0] for x in xs):.3f} ms, first run "
              f"{statistics.median(x[1] for x in xs):.3f} ms, total {statistics.median(x[0] + x[1] for x in xs):.3f} ms "
              f"(medians of {a.runs})")


if __name__ == "__main__":
    main()
