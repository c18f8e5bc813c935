"""A Python consumer's time to first inference through trtcache against its own session.

Usage: first_inference.py SOCKET MODEL RAW_MODEL. In one process, after an untimed session on
the raw model (ONNX Runtime's one-off set-up; both files in the page cache): "via" = connect,
acquire, `Artifact.session()` with the client's defaults, one inference at [1, 16]; "own" =
`onnxruntime.InferenceSession(RAW_MODEL)` with ONNX Runtime's defaults (ORT_ENABLE_ALL), one
inference. Order A B B A; prints one JSON line with the means of each pair (ms), like
examples/bench_daemon.rs's first-inference mode.
"""
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from trtcache_client import Client  # noqa: E402

socket, model, raw = sys.argv[1], sys.argv[2], sys.argv[3]
P = ["CPUExecutionProvider"]


def feeds(sess):
    return {i.name: np.ones((1, 16), dtype=np.int64) for i in sess.get_inputs()}


def via():
    t = time.perf_counter()
    art = Client(socket).acquire(model)
    acquired = time.perf_counter()
    sess = art.session(providers=P)
    opened = time.perf_counter()
    sess.run(None, feeds(sess))
    done = time.perf_counter()
    art.close()
    return (done - t) * 1e3, (acquired - t) * 1e3, (opened - acquired) * 1e3, (done - opened) * 1e3


def own():
    t = time.perf_counter()
    sess = ort.InferenceSession(raw, providers=P)
    opened = time.perf_counter()
    sess.run(None, feeds(sess))
    done = time.perf_counter()
    return (done - t) * 1e3, (opened - t) * 1e3


so = ort.SessionOptions()
so.log_severity_level = 3
ort.InferenceSession(raw, so, providers=P)
v1, o1 = via(), own()
o2, v2 = own(), via()
avg = lambda a, b: round((a + b) / 2, 2)  # noqa: E731
print(json.dumps({
    "via_trtcache_ms": avg(v1[0], v2[0]), "via_acquire_ms": avg(v1[1], v2[1]),
    "via_session_ms": avg(v1[2], v2[2]), "via_run_ms": avg(v1[3], v2[3]),
    "own_session_ms": avg(o1[0], o2[0]), "own_session_only_ms": avg(o1[1], o2[1]),
}))
