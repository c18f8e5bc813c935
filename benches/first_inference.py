"""One Python consumer process's time to its first inference, through trtcache or on its own.

Usage: first_inference.py SOCKET MODEL RAW_MODEL WARM WAY (run it once per process).
WAY `via` = connect, acquire MODEL, `Artifact.session()` with the client's defaults, one
inference at [1, 16]; `own` = `onnxruntime.InferenceSession(RAW_MODEL)` with ONNX Runtime's
defaults (ORT_ENABLE_ALL), one inference. ONNX Runtime's environment is created before the
clock starts (both ways pay it alike). WARM is what the process did before, untimed: `none`,
or a path: a session + run on that model. Prints one JSON line, like benches/daemon.rs's
first-inference mode.
"""
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
from trtcache_client import Client  # noqa: E402

socket, model, raw, warm, way = sys.argv[1:6]
P = ["CPUExecutionProvider"]


def feeds(sess):
    return {i.name: np.ones((1, 16), dtype=np.int64) for i in sess.get_inputs()}


ort.set_default_logger_severity(3)  # creates the environment, as a consumer's set-up would
if warm != "none":
    s = ort.InferenceSession(warm, providers=P)
    s.run(None, {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape],
                                 dtype=np.int64 if "int64" in i.type else np.float32)
                 for i in s.get_inputs()})
    del s

t = time.perf_counter()
acquired = t
if way == "via":
    art = Client(socket).acquire(model)
    acquired = time.perf_counter()
    sess = art.session(providers=P)
elif way == "own":
    sess = ort.InferenceSession(raw, providers=P)
else:
    sys.exit("way %r: via or own" % way)
opened = time.perf_counter()
sess.run(None, feeds(sess))
done = time.perf_counter()
with open("/proc/self/stat") as f:  # the core the process ended on (field 39)
    cpu = int(f.read().rsplit(")", 1)[1].split()[36])
print(json.dumps({
    "way": way, "model": model, "total_ms": round((done - t) * 1e3, 2),
    "acquire_ms": round((acquired - t) * 1e3, 2), "session_ms": round((opened - acquired) * 1e3, 2),
    "run_ms": round((done - opened) * 1e3, 2), "cpu": cpu,
}))
