#!/usr/bin/env python3
"""ONNX Runtime's ConvInteger by weight type: one node with int8 weights, the same with
uint8 weights, and a float Conv of the same shape, each in its own session (ORT's
defaults), on a few shapes from real quantized models. The measurement behind the
`conv-integer-uint8` rewrite (docs/cache.md "Graph rewrites").

    benches/conv_integer.py [--runs 15]

Prints per shape the median run of each, in ms.
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

# (input channels, output channels, height, width, kernel): a CRNN's 3x3, a 1-D vocoder conv
# (HiFi-GAN, kernel 11 over 2,048 samples), ResNet-style 3x3s.
SHAPES = [(48, 192, 16, 40, 3), (64, 64, 1, 2048, 11), (64, 64, 56, 56, 3), (128, 128, 28, 28, 3)]


def median_run(model, feed, runs):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, feed)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, feed)
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    ort.set_default_logger_severity(3)
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}")
    for c, m, hh, w, k in SHAPES:
        x = rng.integers(0, 255, (1, c, hh, w)).astype(np.uint8)
        ks, pads = ([1, k], [0, k // 2, 0, k // 2]) if hh == 1 else ([k, k], [k // 2] * 4)
        got = []
        for wt, dt, lo in ((T.INT8, np.int8, -100), (T.UINT8, np.uint8, 0)):
            wq = rng.integers(lo, 100, (m, c, *ks)).astype(dt)
            g = h.make_graph([h.make_node("ConvInteger", ["x", "w"], ["y"], pads=pads)], "g",
                             [h.make_tensor_value_info("x", T.UINT8, [1, c, hh, w])],
                             [h.make_tensor_value_info("y", T.INT32, None)], initializer=[nh.from_array(wq, "w")])
            got.append(median_run(h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8), {"x": x}, a.runs))
        wf = rng.standard_normal((m, c, *ks)).astype(np.float32)
        g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], pads=pads)], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, c, hh, w])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)], initializer=[nh.from_array(wf, "w")])
        got.append(median_run(h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8),
                              {"x": x.astype(np.float32)}, a.runs))
        print(f"[{m}, {c}, {'x'.join(map(str, ks))}] on {hh}x{w}: ConvInteger int8 weights {got[0]:.3f} ms, "
              f"uint8 weights {got[1]:.3f} ms ({got[0] / got[1]:.1f}x), float Conv {got[2]:.3f} ms")


if __name__ == "__main__":
    main()
