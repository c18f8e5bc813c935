#!/usr/bin/env python3
"""Time to first inference per model of the real-world corpus (scripts/corpus/realworld.py):
through trtcache against a fresh raw ONNX Runtime session, side by side in one run.

    benches/first_realworld.py CORPUS [--trtcache target/release/trtcache] [--runs 7]
        [--core 0] [--only REGEX] [--client clients/python] [--golden] [--json OUT.json]

Serves a copy of every CORPUS/<name>/model.onnx from one `trtcache serve` (defaults: no
sidecar, backend ort-cpu; with `--golden`, a sidecar per model naming its corpus feed as
golden inputs, `[golden] npz`, so validation and the build's thread probe run on the inputs
the consumers feed) on temp folders, warms them, then per model and run starts one
fresh consumer process per way, pinned to one core (`taskset -c CORE`; ONNX Runtime sets its
intra-op pool threads' own affinities, so parallel kernels still use the other cores, both
ways alike), alternating which way goes first:

- `own`: `onnxruntime.InferenceSession(model.onnx)` with ONNX Runtime's defaults
  (ORT_ENABLE_ALL, CPU) and one run on the corpus feed;
- `via`: import the Python client, connect, acquire, `Artifact.session()` with the client's
  defaults, one run on the same feed. With the daemon's ready index (docs/protocol.md) the
  acquire opens the published artifact without the socket (`connect` is then 0: the client
  connects only when a call needs the socket); the table marks such models `[index]`.
- `sock` (with `--compare-socket`): the same as `via` with `Client(ready_index=False)`, every
  acquire over the socket as before the ready index: the index's own effect, same run.

Both processes import numpy and onnxruntime, create ONNX Runtime's environment and load the
feed before the clock starts (every consumer pays that alike); the client's import is inside
the clock, of the client as `pip install clients/python` installs it (into a temp folder,
with its bytecode compiled: a source tree under PYTHONDONTWRITEBYTECODE would be compiled at
every import; the folder on PYTHONPATH from the process's start, as site-packages is). First, the same for a 1-node Identity graph (`floor`): ONNX Runtime's fixed
cost of a process's first session, which both ways pay. The table also shows `total` without the import (connect + acquire + session
+ run, what a process that imported the client at start-up waits for). Prints per model the median of each way's total and parts, and the ratio
own / via (> 1: trtcache is faster); then the geometric mean of the ratios.

Which reading issue 14's targets use: the one with the client imported at start-up. The issue
times "a fresh raw session" against trtcache's path and names that path's overhead as
"connect + acquire"; the client's import is a once-per-process cost of the same kind as
`import onnxruntime`, which neither way's clock holds. The reading with the import in the
clock is printed too, as the stricter one (BENCHMARKS.md "Time to first inference").
"""
import argparse
import json
import math
import os
import pickle
import re
import shutil
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def child(sock, name, raw, feed_path, way, client_dir):
    """One consumer process: prints one JSON line."""
    import numpy as np  # numpy's import is every consumer's
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # creates the environment, as a consumer's set-up would
    feed = pickle.load(open(feed_path, "rb"))
    p = ["CPUExecutionProvider"]
    t = time.perf_counter()
    acquired = imported = connected = t
    hint = None
    if way == "floor":
        # ONNX Runtime's fixed cost of a process's first session: a 1-node graph.
        sess = ort.InferenceSession(raw, providers=p)
        opened = time.perf_counter()
        sess.run(None, {"x": np.zeros((1,), np.float32)})
        done = time.perf_counter()
        print(json.dumps({"way": way, "total": round((done - t) * 1e3, 3),
                          "session": round((opened - t) * 1e3, 3), "run": round((done - opened) * 1e3, 3)}))
        return
    index = None
    if way in ("via", "sock"):
        # The client's folder is on PYTHONPATH from the process's start, as a pip-installed
        # client is on sys.path (see main).
        from trtcache_client import Client

        imported = time.perf_counter()
        c = Client(sock, ready_index=False) if way == "sock" else Client(sock)
        connected = time.perf_counter()
        art = c.acquire(name)
        acquired = time.perf_counter()
        sess = art.session(providers=p)
        index = getattr(art, "from_index", False)
    else:
        sess = ort.InferenceSession(raw, providers=p)
    opened = time.perf_counter()
    names = {i.name for i in sess.get_inputs()}
    sess.run(None, {k: v for k, v in feed.items() if k in names})
    done = time.perf_counter()
    if index is not None:
        # Read after the clock: from the index the metadata (JSON) is parsed on first use,
        # which a consumer's first inference does not need (it imports `json`: 0.3-0.4 ms).
        hint = (art.metadata.get("session_hints") or {}).get("intra_op_num_threads")
    ms = lambda a, b: round((b - a) * 1e3, 3)  # noqa: E731
    print(json.dumps({"way": way, "total": ms(t, done), "acquire": ms(t, acquired),
                      "import": ms(t, imported), "connect": ms(imported, connected),
                      "session": ms(acquired, opened), "run": ms(opened, done), "threads": hint,
                      "index": index}))


def floor_ms(a, tmp, sock, client_dir):
    """Median time to first inference of a 1-node Identity graph in a fresh consumer (the
    same process set-up): ONNX Runtime's fixed per-process cost of a first session, which
    both ways pay and no artifact can save. None without the onnx package."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        return None
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor", [x], [y])
    path = os.path.join(tmp, "floor.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), path)
    feed = os.path.join(tmp, "floor.pkl")
    with open(feed, "wb") as f:
        pickle.dump({}, f)
    got = []
    for _ in range(a.runs):
        p = subprocess.run(["taskset", "-c", str(a.core), sys.executable, os.path.abspath(__file__),
                            "--child", sock, "floor", path, feed, "floor", client_dir],
                           capture_output=True, text=True, check=True)
        got.append(json.loads(p.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(x[k] for x in got) for k in ("total", "session", "run")}
    print(f"{'(floor: 1-node graph)':30} own {med['total']:7.1f} ms (session {med['session']:6.1f}, "
          f"run {med['run']:6.1f}): ONNX Runtime's fixed first-session cost, paid both ways", flush=True)
    return med


def wait_socket(path, proc, log):
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            sys.exit("trtcache serve exited: " + open(log).read()[-2000:])
        try:
            s = socketlib.socket(socketlib.AF_UNIX)
            s.connect(path)
            s.close()
            return
        except OSError:
            if time.monotonic() - t0 > 60:
                sys.exit("trtcache serve did not come up: " + open(log).read()[-2000:])
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--trtcache", default=os.path.join(REPO, "target", "release", "trtcache"))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--only")
    ap.add_argument("--client", default=os.path.join(REPO, "clients", "python"),
                    help="the Python client's source folder (another checkout's, to compare)")
    ap.add_argument("--golden", action="store_true",
                    help="validate on each model's corpus feed (a sidecar with [golden] npz)")
    ap.add_argument("--compare-socket", action="store_true",
                    help="also time the client with ready_index=False (every acquire on the socket)")
    ap.add_argument("--json")
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    names = sorted(
        d for d in os.listdir(a.corpus)
        if os.path.isfile(os.path.join(a.corpus, d, "model.onnx")) and (not only or only.search(d))
    )
    # Models ONNX Runtime itself cannot run (realworld.py keeps them with no expected
    # outputs, for trtcache to refuse) have no first inference to time either way.
    cannot = [n for n in names if not pickle.load(open(os.path.join(a.corpus, n, "expected.pkl"), "rb"))]
    if cannot:
        print(f"skipped (ONNX Runtime cannot run them): {', '.join(cannot)}", flush=True)
        names = [n for n in names if n not in cannot]
    # The corpus's layout (copy_model). Imported here, not at the top: a consumer child
    # process must not have run.py's imports (json, subprocess) loaded before its clock.
    sys.path.insert(0, os.path.join(REPO, "scripts", "corpus"))
    import run as corpus_run

    dylib = os.environ.get("ORT_DYLIB_PATH")
    if not dylib:
        sys.exit('ORT_DYLIB_PATH is not set: eval "$(scripts/ort-env.sh)"')
    tmp = tempfile.mkdtemp(prefix="trtcache-first-")
    serve = None
    try:
        models, cache = os.path.join(tmp, "models"), os.path.join(tmp, "cache")
        os.makedirs(models)
        os.makedirs(cache)
        for n in names:
            # NAME.onnx, or NAME/model.onnx with its external data beside it.
            corpus_run.copy_model(os.path.join(a.corpus, n), models, n)
            if a.golden:
                folder = os.path.isdir(os.path.join(models, n))
                at = os.path.join(models, n) if folder else models
                shutil.copy(os.path.join(a.corpus, n, "golden.npz"), os.path.join(at, n + ".golden.npz"))
                with open(os.path.join(at, "trtcache.toml" if folder else n + ".trtcache.toml"), "w") as f:
                    f.write(f'[golden]\nnpz = "{n}.golden.npz"\n')
        sock = os.path.join(tmp, "trtcache.sock")
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as f:
            f.write(f"models = {json.dumps(models)}\ncache_dir = {json.dumps(cache)}\n"
                    f"socket = {json.dumps(sock)}\nort_library = {json.dumps(dylib)}\n")
        client_dir = os.path.join(tmp, "client")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", client_dir, a.client], check=True)
        log = os.path.join(tmp, "serve.log")
        serve = subprocess.Popen([a.trtcache, "serve", "--config", config],
                                 stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        wait_socket(sock, serve, log)
        w = subprocess.run([a.trtcache, "warm", "--config", config], capture_output=True, text=True)
        if w.returncode != 0:
            sys.exit("warm failed:\n" + w.stdout + w.stderr)
        # The installed client on sys.path from the start (PYTHONPATH), as a client pip put in
        # site-packages is: the import inside the clock is then the module's own, not also the
        # directory scan of a folder added at run time (0.05 ms, paid by no installed client).
        child_env = dict(os.environ, PYTHONPATH=client_dir)
        rows = []
        floor = floor_ms(a, tmp, sock, client_dir)
        for n in names:
            raw = os.path.join(a.corpus, n, "model.onnx")
            feed = os.path.join(a.corpus, n, "feed.pkl")
            ways = ("own", "via", "sock") if a.compare_socket else ("own", "via")
            got = {w: [] for w in ways}
            for r in range(a.runs):
                # Each way goes first as often as the others.
                for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                    p = subprocess.run(
                        ["taskset", "-c", str(a.core), sys.executable, os.path.abspath(__file__),
                         "--child", sock, n, raw, feed, way, client_dir],
                        capture_output=True, text=True, env=child_env)
                    if p.returncode != 0:
                        sys.exit(f"{n} {way}: {p.stderr[-2000:]}")
                    got[way].append(json.loads(p.stdout.strip().splitlines()[-1]))
            med = {w: {k: statistics.median(x[k] for x in v) for k in v[0] if k not in ("way", "threads", "index")}
                   for w, v in got.items()}
            index = all(x.get("index") for x in got["via"])
            threads = got["via"][0].get("threads")  # the metadata's session_hints
            ratio = med["own"]["total"] / med["via"]["total"]
            # Without the client's import: per run, then the median.
            after = statistics.median(x["total"] - x["import"] for x in got["via"])
            ratio_imported = med["own"]["total"] / after
            row = {"model": n, "own": med["own"], "via": med["via"], "ratio": round(ratio, 2), "threads": threads,
                   "via_after_import": after, "ratio_after_import": round(ratio_imported, 2), "index": index,
                   "runs": got}
            if a.compare_socket:
                row["sock"] = med["sock"]
                row["ratio_socket"] = round(med["own"]["total"] / med["sock"]["total"], 2)
                row["ratio_socket_after_import"] = round(
                    med["own"]["total"] / statistics.median(x["total"] - x["import"] for x in got["sock"]), 2)
            rows.append(row)
            o, v = med["own"], med["via"]
            print(f"{n:30} own {o['total']:7.1f} ms (session {o['session']:6.1f}, run {o['run']:6.1f})  "
                  f"via {v['total']:6.1f} ms (import {v['import']:4.1f}, connect {v['connect']:4.1f}, "
                  f"acquire {v['acquire'] - v['import'] - v['connect']:4.1f}, session {v['session']:6.1f}, "
                  f"run {v['run']:6.1f})  {ratio:5.2f}x  (imported: {ratio_imported:5.2f}x)"
                  + (f"  socket: {row['ratio_socket']:5.2f}x ({row['ratio_socket_after_import']:5.2f}x)"
                     if a.compare_socket else "")
                  + ("  [index]" if index else "") + ("  [1 thread]" if threads == 1 else ""), flush=True)
        def summary(key):
            """Min, max and geometric mean of one ratio column, and how many are under 0.95."""
            xs = [r[key] for r in rows]
            return min(xs), max(xs), math.exp(sum(map(math.log, xs)) / len(xs)), sum(x < 0.95 for x in xs)

        lo, hi, gm, under = summary("ratio")
        loi, _, gmi, underi = summary("ratio_after_import")
        print(f"\n{len(rows)} models, {a.runs} runs each, core {a.core}: ratio own/via "
              f"min {lo:.2f}x, max {hi:.2f}x, geometric mean {gm:.3f}x; client imported before (issue 14's reading): min "
              f"{loi:.2f}x, geometric mean {gmi:.3f}x; under 0.95x: {under} ({underi} imported); "
              f"from the ready index: {sum(bool(r['index']) for r in rows)}")
        if a.compare_socket:
            los, _, gs, unders = summary("ratio_socket")
            losi, _, gsi, undersi = summary("ratio_socket_after_import")
            print(f"every acquire on the socket (ready_index=False), same run: min {los:.2f}x, geometric "
                  f"mean {gs:.3f}x; client imported before: min {losi:.2f}x, geometric mean {gsi:.3f}x; "
                  f"under 0.95x: {unders} ({undersi} imported)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rows": rows, "floor": floor, "geomean": gm, "geomean_after_import": gmi, "core": a.core,
                           "runs": a.runs, "golden": a.golden}, f, indent=1)
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:8])
    else:
        main()
