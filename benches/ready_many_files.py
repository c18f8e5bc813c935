"""The ready index against the socket for a model of many external-data files (the consumer
used to stat every file of the model on each acquire through the index).

    python benches/ready_many_files.py [--trtcache target/release/trtcache] [--files 3000]
        [--rounds 7] [--per-round 200] [--client clients/python] [--rust-bench DIR]

Writes `many/model.onnx` whose initializers sit in FILES files of their own (as torch and
onnx write per-tensor external data), serves it with `trtcache serve` on a temp socket,
waits for its ready pointer, then times the Python client's acquire (`Client.acquire`, the
artifact closed each time) through the index and over the socket (`ready_index=False`, one
connection kept), in alternating rounds of PER_ROUND acquires so that machine noise hits both
alike. Prints a Markdown table: median and spread of the per-round median per acquire, and
the index's time relative to the socket's. With `--rust-bench DIR` (a profile folder such
as target/release, holding the daemon driver `deps/daemon-<hash>` that `cargo build
--release --bench daemon` writes), the Rust client's `latency` mode runs too: `index` (the
ready index) and `threads` with one client (the socket).
"""

import argparse
import glob
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def write_model(folder: str, files: int) -> None:
    """A chain of FILES Adds over a [1, 8] input, each adding a constant from its own file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i in range(files):
        out = "y" if i + 1 == files else "h%d" % i
        inits.append(numpy_helper.from_array(np.full((8,), 0.001 * (i % 7), np.float32), "c%d" % i))
        nodes.append(helper.make_node("Add", [prev, "c%d" % i], [out]))
        prev = out
    g = helper.make_graph(
        nodes,
        "many",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save_model(m, os.path.join(folder, "model.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0)
    n = len([f for f in os.listdir(folder) if f != "model.onnx"])
    assert n == files, "%d external files, not %d" % (n, files)


def ort_dylib() -> str:
    if os.environ.get("ORT_DYLIB_PATH"):
        return os.environ["ORT_DYLIB_PATH"]
    libs = sorted(glob.glob(os.path.join(REPO, ".venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*")))
    if not libs:
        sys.exit("no ONNX Runtime: run scripts/setup-python.sh or set ORT_DYLIB_PATH")
    return libs[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trtcache", default=os.path.join(REPO, "target/release/trtcache"))
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--client", default=os.path.join(REPO, "clients/python"))
    ap.add_argument("--rust-bench", default=None)
    a = ap.parse_args()
    sys.path.insert(0, a.client)
    import trtcache_client as t

    w = tempfile.mkdtemp(prefix="trtcache-ready-many-")
    daemon = None
    try:
        os.makedirs(os.path.join(w, "models/many"))
        os.makedirs(os.path.join(w, "cache"))
        write_model(os.path.join(w, "models/many"), a.files)
        sock = os.path.join(w, "cache/s.sock")
        cfg = os.path.join(w, "config.toml")
        with open(cfg, "w") as f:
            f.write('models = "%s"\ncache_dir = "%s"\nsocket = "%s"\nort_dylib = "%s"\n'
                    % (os.path.join(w, "models"), os.path.join(w, "cache"), sock, ort_dylib()))
        log = open(os.path.join(w, "daemon.log"), "w")
        daemon = subprocess.Popen([a.trtcache, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log)
        t0 = time.time()
        while not os.path.exists(sock + ".ready/many"):
            if daemon.poll() is not None or time.time() - t0 > 600:
                sys.exit("no pointer for `many`:\n" + open(os.path.join(w, "daemon.log")).read()[-3000:])
            time.sleep(0.1)
        pointer_bytes = os.path.getsize(sock + ".ready/many")
        via_index, via_socket = t.Client(sock), t.Client(sock, ready_index=False)
        a0 = via_index.acquire("many")
        if not a0.from_index:
            sys.exit("the index was not used: " + open(os.path.join(w, "daemon.log")).read()[-3000:])
        a0.close()

        def per_acquire(c: "t.Client") -> float:
            ts = []
            for _ in range(a.per_round):
                s = time.perf_counter()
                c.acquire("many").close()
                ts.append(time.perf_counter() - s)
            return statistics.median(ts) * 1e3

        per_acquire(via_socket)  # warm-up: connection, imports
        per_acquire(via_index)
        times = {"index": [], "socket": []}
        for _ in range(a.rounds):
            times["index"].append(per_acquire(via_index))
            times["socket"].append(per_acquire(via_socket))
        base = statistics.median(times["socket"])
        print("model: %d external-data files; pointer %d bytes; python client %s" % (a.files, pointer_bytes, a.client))
        print("| path (Python client) | median ms/acquire | min | max | vs socket |")
        print("|---|---:|---:|---:|---:|")
        for name in ("index", "socket"):
            v = times[name]
            m = statistics.median(v)
            print("| %s | %.3f | %.3f | %.3f | %.2fx |" % (name, m, min(v), max(v), m / base))
        if a.rust_bench:
            drivers = [p for p in glob.glob(os.path.join(a.rust_bench, "deps", "daemon-*")) if not p.endswith(".d")]
            b = max(drivers, key=os.path.getmtime)
            for how in ("index", "threads"):
                out = subprocess.run([b, "latency", sock, "many", "1", str(a.per_round * a.rounds), how],
                                     capture_output=True, text=True)
                print("rust %s: %s" % (how, (out.stdout or out.stderr).strip()))
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(w, ignore_errors=True)


if __name__ == "__main__":
    main()
