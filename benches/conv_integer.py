#!/usr/bin/env python3
"""ONNX Runtime's ConvInteger by weight type: one node with int8 weights, the same with
uint8 weights, and a float Conv of the same shape, each in its own session (ORT's
defaults), on a few shapes from real quantized models. The measurement behind the
`conv-integer-uint8` rewrite (docs/cache.md "Graph rewrites"). With `--grouped`, grouped and
depthwise shapes instead (MobileNetV3's and EfficientNet's depthwise convs, a ResNeXt-style
group of 4 channels, and a plain conv for contrast): `ConvInteger` with uint8 weights against
`conv-integer-depthwise-float`'s form, `DequantizeLinear(x, 1, x_zp) → Conv → Cast(int32)`,
checking the two give the same int32s.

    benches/conv_integer.py [--runs 15] [--grouped] [--threads N]

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


THREADS = 0  # --threads: ONNX Runtime's intra-op threads (0: its default pool)


def session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def median_run(model, feed, runs):
    s = session(model)
    for _ in range(3):
        s.run(None, feed)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, feed)
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[len(ts) // 2]


# (channels, group, height, width, kernel, stride): depthwise 3x3 and 5x5 from MobileNetV3-S
# and EfficientNet-B0, ResNeXt-style groups of 4 channels, and group 1 for contrast.
GROUPED = [(16, 16, 112, 112, 3, 1), (72, 72, 56, 56, 3, 2), (96, 96, 28, 28, 5, 1), (240, 240, 14, 14, 5, 1),
           (576, 576, 7, 7, 5, 1), (128, 32, 28, 28, 3, 1), (64, 1, 56, 56, 3, 1)]


def model(nodes, x_type, inits):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", x_type, None)],
                     [h.make_tensor_value_info("y", T.INT32, None)], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


def median_and_output(m, feed, runs):
    return median_run(m, feed, runs), session(m).run(None, feed)[0]


def grouped(a, rng):
    for c, grp, hh, w, k, st in GROUPED:
        x = rng.integers(0, 256, (1, c, hh, w)).astype(np.uint8)
        wq = rng.integers(0, 256, (c, c // grp, k, k)).astype(np.uint8)
        attrs = dict(group=grp, pads=[k // 2] * 4, strides=[st, st], kernel_shape=[k, k])
        zps = [nh.from_array(np.array(117, np.uint8), "xzp")]
        integer = model([h.make_node("ConvInteger", ["x", "w", "xzp", "wzp"], ["y"], **attrs)], T.UINT8,
                        [nh.from_array(wq, "w"), nh.from_array(np.array(131, np.uint8), "wzp")] + zps)
        wf = wq.astype(np.float32) - 131
        floated = model([h.make_node("DequantizeLinear", ["x", "one", "xzp"], ["xf"]),
                         h.make_node("Conv", ["xf", "w"], ["yf"], **attrs),
                         h.make_node("Cast", ["yf"], ["y"], to=T.INT32)], T.UINT8,
                        [nh.from_array(wf, "w"), nh.from_array(np.array(1.0, np.float32), "one")] + zps)
        (ti, yi), (tf, yf) = (median_and_output(m, {"x": x}, a.runs) for m in (integer, floated))
        print(f"[{c}, {c // grp}, {k}x{k}] group {grp} stride {st} on {hh}x{w}: ConvInteger {ti:.3f} ms, "
              f"float form {tf:.3f} ms ({ti / tf:.2f}x), same int32s: {np.array_equal(yi, yf)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--grouped", action="store_true", help="grouped and depthwise shapes (the float form)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (default: ONNX Runtime's pool)")
    a = ap.parse_args()
    global THREADS
    THREADS = a.threads
    ort.set_default_logger_severity(3)
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}")
    if a.grouped:
        return grouped(a, rng)
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
