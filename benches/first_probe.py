"""Where a consumer's first artifact session goes, and why the stop-9 measurement misled.

Usage: first_probe.py SOCKET MODEL RAW_MODEL CASE [ARG]. One case per process, one JSON line
(benches/daemon.sh RUNS probe runs each case RUNS times and summarizes):

- `session OPTION`: one session from MODEL's artifact (path resolved through the client's
  directory descriptor to the blob) with the Python client's options plus OPTION, after ONNX
  Runtime's set-up on an unrelated model (examples/models/tiny_encoder.onnx); times the
  session, the first run and the median of 20 later runs ([1, 16] inputs). OPTION: `base`,
  `disable_prepacking`, `parallel_executor`, `no_spinning`, `device_allocator_initializers`,
  `initializers_from_memory` (the data file mapped by this process and handed over with
  add_external_initializers_from_files_in_memory), `ort_format` (the raw model saved in ONNX
  Runtime's format at All with the same free-dimension handling, opened by path).
- `sessions_in_a_process`: four artifact sessions in one process, each kept open, timed.
- `raw_sessions_in_a_process`: three sessions on RAW_MODEL in one process (run it with and
  without MALLOC_MMAP_THRESHOLD_ to see glibc's heap carry pages from one to the next).
- `compute`: a pure-Python loop and a 200 MB copy (the per-core control).
"""
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from trtcache_client import Client  # noqa: E402

P = ["CPUExecutionProvider"]
TINY = os.path.join(os.path.dirname(__file__), "..", "examples", "models", "tiny_encoder.onnx")
socket, model, raw, case = sys.argv[1:5]
arg = sys.argv[5] if len(sys.argv) > 5 else None
ms = lambda t: round((time.perf_counter() - t) * 1e3, 2)  # noqa: E731


def feeds(sess):
    return {i.name: np.ones((1, 16), dtype=np.int64) for i in sess.get_inputs()}


def warm_up():
    s = ort.InferenceSession(TINY, providers=P)
    s.run(None, {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape],
                                 dtype=np.float32) for i in s.get_inputs()})


def artifact():
    """The artifact's graph path in the cache (the blob), and the client's session options."""
    art = Client(socket).acquire(model)
    path = os.path.realpath(art.dir_graph_path())
    so = art._ort_defaults({})["sess_options"]
    art.close()
    return path, so


ort.set_default_logger_severity(3)
out = {"case": case, "arg": arg}
if os.environ.get("PROBE_PINNED"):  # set by benches/daemon.sh for its per-core runs
    out["pinned"] = int(os.environ["PROBE_PINNED"])
if case == "session":
    warm_up()
    path, so = artifact()
    keep = None
    if arg == "disable_prepacking":
        so.add_session_config_entry("session.disable_prepacking", "1")
    elif arg == "parallel_executor":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    elif arg == "no_spinning":
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif arg == "device_allocator_initializers":
        so.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    elif arg == "ort_format":
        conv = ort.SessionOptions()
        conv.optimized_model_filepath = path + ".probe.ort"
        conv.add_session_config_entry("session.save_model_format", "ORT")
        if model.endswith("_fixed"):  # the artifact's fixed [1, 16] profile, as its build does
            conv.add_free_dimension_override_by_name("batch", 1)
            conv.add_free_dimension_override_by_name("seq", 16)
        ort.InferenceSession(raw, conv, providers=P)
        path = conv.optimized_model_filepath
    t = time.perf_counter()
    if arg == "initializers_from_memory":
        fd = os.open(path + ".data", os.O_RDONLY)
        keep = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        so.add_external_initializers_from_files_in_memory(
            ["model.onnx.data"], [np.frombuffer(keep, dtype=np.uint8)], [len(keep)])
    s = ort.InferenceSession(path, so, providers=P)
    out["session_ms"] = ms(t)
    f = feeds(s)
    t = time.perf_counter()
    s.run(None, f)
    out["first_run_ms"] = ms(t)
    runs = []
    for _ in range(20):
        t = time.perf_counter()
        s.run(None, f)
        runs.append(ms(t))
    out["steady_run_ms"] = statistics.median(runs)
    if arg == "ort_format":
        os.remove(path)
elif case == "sessions_in_a_process":
    warm_up()
    path, so = artifact()
    kept, times = [], []
    for _ in range(4):
        t = time.perf_counter()
        kept.append(ort.InferenceSession(path, so, providers=P))
        times.append(ms(t))
    out["sessions_ms"] = times
elif case == "raw_sessions_in_a_process":
    times = []
    for _ in range(3):
        t = time.perf_counter()
        s = ort.InferenceSession(raw, providers=P)
        times.append(ms(t))
        del s
    out["sessions_ms"] = times
    out["malloc_mmap_threshold"] = os.environ.get("MALLOC_MMAP_THRESHOLD_")
elif case == "compute":
    t = time.perf_counter()
    sum(range(10 ** 7))
    out["loop_ms"] = ms(t)
    b = bytearray(200 << 20)
    t = time.perf_counter()
    bytes(b)
    out["copy_200mb_ms"] = ms(t)
else:
    sys.exit("case %r" % case)
with open("/proc/self/stat") as f:
    out["cpu"] = int(f.read().rsplit(")", 1)[1].split()[36])
print(json.dumps(out))
