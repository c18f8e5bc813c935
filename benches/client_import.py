#!/usr/bin/env python3
"""Import time of the Python client, A/B: one or more client source trees, each installed
with pip (bytecode compiled) into a temp folder, imported in fresh processes pinned to one
core after numpy and onnxruntime (what a consumer has loaded before), the trees alternating.

    benches/client_import.py [--runs 21] [--core 0] [--no-gc] TREE [TREE ...]

TREE: a folder holding the client's pyproject.toml (`clients/python`, or another checkout's,
e.g. `git worktree add /tmp/old HEAD~1` then `/tmp/old/clients/python`). Prints per tree the
median and minimum import time in ms, and the ratio of each tree's median to the first's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import os, sys, time
import numpy, onnxruntime
if sys.argv[2] == "1":
    import gc
    gc.disable()
sys.path.insert(0, sys.argv[1])
t = time.perf_counter()
import trtcache_client
print((time.perf_counter() - t) * 1e3)
os._exit(0)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--no-gc", action="store_true",
                    help="Python's garbage collector off before the import (what a collection adds)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trtcache-import-") as tmp:
        dirs = []
        for i, tree in enumerate(a.trees):
            d = os.path.join(tmp, str(i))
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", d, tree], check=True)
            dirs.append(d)
        got = [[] for _ in dirs]
        for r in range(a.runs):
            order = range(len(dirs)) if r % 2 == 0 else reversed(range(len(dirs)))
            for i in order:
                p = subprocess.run(["taskset", "-c", str(a.core), sys.executable, "-c", CHILD, dirs[i], "1" if a.no_gc else "0"],
                                   capture_output=True, text=True, check=True)
                got[i].append(float(p.stdout.strip().splitlines()[-1]))
        base = statistics.median(got[0])
        for tree, ms in zip(a.trees, got):
            med = statistics.median(ms)
            print(f"{tree}: import median {med:.2f} ms, min {min(ms):.2f} ms over {a.runs} processes "
                  f"({med / base:.2f}x the first tree's median)")


if __name__ == "__main__":
    main()
