#!/usr/bin/env python3
"""Small models with the structure of the real models that failed trtcache's defaults (issue
14), one per failure class, in the corpus layout `scripts/corpus/run.py` reads. The test suite
(tests/it/corpus.rs) builds them; needs only numpy, onnx and onnxruntime.

    scripts/corpus/classes.py DEST

Validation inputs (class 1): strided pooling + upsampling that needs even spatial sizes
(YOLO's stride), a reflect pad that needs more samples than it pads (silero VAD), a KV cache
whose mask length is `past_sequence + sequence` (GPT-2 with past key values), and unnamed
batch axes that two inputs share. Element types (class 2): float16 in and out, int16 and
uint64, a LabelEncoder to strings, ZipMap's seq(map(int64, float)), a sequence output.
strings in (unicode and object arrays). IR < 4 (class 3): initializers listed as graph inputs, one of them a Reshape's shape.
A dynamically quantized layer (class 4: ops without a rule, a contrib op). madmom-like free
axes that only the weights size (an LSTM's input size), and a time axis at position 0 that
a Conv kernel needs 5 of.
One-hot encoders that refuse categories they do not list (string and integer inputs), a
DictVectorizer's map input, and a sequence length an exporter kept in a Reshape.
`impossible` needs a size no default tries, `missing_locale` a locale no machine has; the
tests check their errors instead.
"""
import os
import pickle
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def vi(name, ty, dims):
    return h.make_tensor_value_info(name, ty, dims)


def model(nodes, inputs, outputs, inits=(), opset=17, ir=8, ml=False):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    m = h.make_model(g, opset_imports=ops)
    m.ir_version = ir
    return m


def models():
    g = np.random.default_rng(0)
    f32 = lambda *s: g.random(s).astype(np.float32)  # noqa: E731
    out = {}
    # YOLO-like: MaxPool stride 2, Resize x2, Concat with the input: height and width must
    # be even (YOLO's "Shape mismatch … Resize/Concat" at size 1).
    out["stride_pool_resize"] = (
        model(
            [
                h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                h.make_node("Resize", ["p", "", "scales"], ["r"], mode="nearest"),
                h.make_node("Concat", ["x", "r"], ["y"], axis=1),
            ],
            [vi("x", T.FLOAT, ["batch", 3, "height", "width"])],
            [vi("y", T.FLOAT, ["batch", 6, "height", "width"])],
            [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
        ),
        {"x": f32(1, 3, 64, 96)},
    )
    # silero-like: reflect pad of 3 needs at least 4 samples.
    out["reflect_pad"] = (
        model(
            [h.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")],
            [vi("x", T.FLOAT, ["batch", "samples"])],
            [vi("y", T.FLOAT, ["batch", None])],
            [nh.from_array(np.array([0, 3, 0, 3], np.int64), "pads")],
        ),
        {"x": f32(1, 512)},
    )
    # GPT-2-like KV cache: the mask spans past + current tokens (a Concat needs the lengths
    # to agree exactly, no broadcasting).
    out["kv_cache_mask"] = (
        model(
            [
                h.make_node("Concat", ["past", "cur"], ["kv"], axis=2),
                h.make_node("Cast", ["mask"], ["m"], to=T.FLOAT),
                h.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
                h.make_node("Concat", ["kv", "m3"], ["y"], axis=1),
            ],
            [
                vi("past", T.FLOAT, ["batch", 4, "past_sequence"]),
                vi("cur", T.FLOAT, ["batch", 4, "sequence"]),
                vi("mask", T.INT64, ["batch", "past_sequence + sequence"]),
            ],
            [vi("y", T.FLOAT, ["batch", 5, "past_sequence + sequence"])],
            [nh.from_array(np.array([1], np.int64), "axes")],
        ),
        {"past": f32(1, 4, 5), "cur": f32(1, 4, 2), "mask": np.ones((1, 7), np.int64)},
    )
    # Unnamed batch in two inputs (silero's input [?, ?] and state [2, ?, 128]).
    out["unnamed_shared_batch"] = (
        model(
            [
                h.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
                h.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
                h.make_node("Unsqueeze", ["m", "ax0"], ["m3"]),
                h.make_node("Add", ["state", "m3"], ["y"]),
            ],
            [vi("x", T.FLOAT, [None, None]), vi("state", T.FLOAT, [2, None, 8])],
            [vi("y", T.FLOAT, [2, None, 8])],
            [
                nh.from_array(np.array([0, 3, 0, 3], np.int64), "pads"),
                nh.from_array(np.array([1], np.int64), "axes"),
                nh.from_array(np.array([0], np.int64), "ax0"),
            ],
            opset=18,
        ),
        {"x": f32(1, 64), "state": np.zeros((2, 1, 8), np.float32)},
    )
    out["fp16_io"] = (
        model(
            [h.make_node("Add", ["x", "b"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
            [vi("x", T.FLOAT16, ["batch", 4])],
            [vi("y", T.FLOAT16, ["batch", 4])],
            [nh.from_array(np.array([0.5, -0.25, 0.125, 1], np.float16), "b")],
        ),
        {"x": f32(3, 4).astype(np.float16)},
    )
    out["int16_uint64"] = (
        model(
            [h.make_node("Add", ["a", "a"], ["y"]), h.make_node("Add", ["u", "u"], ["z"])],
            [vi("a", T.INT16, ["n"]), vi("u", T.UINT64, ["n"])],
            [vi("y", T.INT16, ["n"]), vi("z", T.UINT64, ["n"])],
        ),
        {"a": np.array([1, -2, 300], np.int16), "u": np.array([1, 2, 2**40], np.uint64)},
    )
    out["label_encoder_strings"] = (
        model(
            [h.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_int64s=[0, 1, 2], values_strings=["cat", "dog", "eel"], default_string="none")],
            [vi("x", T.INT64, ["n"])],
            [vi("y", T.STRING, ["n"])],
            ml=True,
        ),
        {"x": np.array([0, 2, 1, 5], np.int64)},
    )
    # String inputs: a fixed-width unicode array and an object array (pickled in the .npy).
    out["string_inputs"] = (
        model(
            [h.make_node("StringConcat", ["a", "b"], ["y"])],
            [vi("a", T.STRING, ["n"]), vi("b", T.STRING, ["n"])],
            [vi("y", T.STRING, ["n"])],
            opset=20,
        ),
        {"a": np.array(["ab", "c", ""]), "b": np.array(["x", "yz", "é"], dtype=object)},
    )
    zipmap_out = h.make_value_info(
        "probs", h.make_sequence_type_proto(h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))
    )
    out["zipmap"] = (
        model(
            [h.make_node("Softmax", ["x"], ["p"], axis=1), h.make_node("ZipMap", ["p"], ["probs"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])],
            [vi("x", T.FLOAT, ["n", 3])],
            [zipmap_out],
            ml=True,
        ),
        {"x": f32(2, 3)},
    )
    seq_out = h.make_value_info("s", h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None)))
    out["sequence_output"] = (
        model(
            [h.make_node("Neg", ["x"], ["n"]), h.make_node("SequenceConstruct", ["x", "n"], ["s"])],
            [vi("x", T.FLOAT, ["n", 2])],
            [seq_out],
        ),
        {"x": f32(3, 2)},
    )
    # IR 3: every initializer is also a graph input (old Caffe2/PyTorch exports). As in the
    # onnx `light` models, a weight is made by ConstantOfShape from a `…__SHAPE` initializer.
    shape = nh.from_array(np.array([3, 4], np.int64), "shape")
    wshape = nh.from_array(np.array([3, 4], np.int64), "w__SHAPE")
    out["ir3_initializers_as_inputs"] = (
        model(
            [
                h.make_node("Reshape", ["x", "shape"], ["r"]),
                h.make_node("ConstantOfShape", ["w__SHAPE"], ["w"], value=nh.from_array(np.array([0.5], np.float32))),
                h.make_node("Add", ["r", "w"], ["y"]),
            ],
            [vi("x", T.FLOAT, [2, 6]), vi("shape", T.INT64, [2]), vi("w__SHAPE", T.INT64, [2])],
            [vi("y", T.FLOAT, [3, 4])],
            [shape, wshape],
            opset=9,
            ir=3,
        ),
        {"x": f32(2, 6)},
    )
    # Class 4, ops without a rule: a dynamically quantized layer as ONNX Runtime's
    # quantize_dynamic writes it (ddddocr's common_old.onnx): DynamicQuantizeLinear,
    # MatMulInteger and ConvInteger (int32 out), and a com.microsoft contrib op, whose
    # outputs cross partition boundaries (TensorRT takes the Cast/Mul/Add around them).
    rs = np.random.default_rng(3)
    wq = nh.from_array(rs.integers(0, 255, (4, 3)).astype(np.uint8), "wq")
    wzp = nh.from_array(np.array(128, np.uint8), "wzp")
    cw = nh.from_array(rs.integers(0, 255, (2, 1, 3, 3)).astype(np.uint8), "cw")
    ws = nh.from_array(np.array(0.01, np.float32), "ws")
    bias = nh.from_array(rs.random(3).astype(np.float32), "bias")
    dq = model(
        [
            h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
            h.make_node("MatMulInteger", ["xq", "wq", "xzp", "wzp"], ["mi"]),
            h.make_node("Cast", ["mi"], ["mf"], to=T.FLOAT),
            h.make_node("Mul", ["xs", "ws"], ["scale"]),
            h.make_node("Mul", ["mf", "scale"], ["deq"]),
            h.make_node("Add", ["deq", "bias"], ["y"]),
            h.make_node("DynamicQuantizeMatMul", ["y", "wq2", "ws", "wzp"], ["z"], domain="com.microsoft"),
            h.make_node("Relu", ["z"], ["out"]),
            h.make_node("DynamicQuantizeLinear", ["img"], ["iq", "is", "izp"]),
            h.make_node("ConvInteger", ["iq", "cw", "izp"], ["ci"]),
            h.make_node("Cast", ["ci"], ["cf"], to=T.FLOAT),
            h.make_node("Mul", ["cf", "is"], ["conv"]),
        ],
        [vi("x", T.FLOAT, ["n", 4]), vi("img", T.FLOAT, [1, 1, 6, 6])],
        [vi("out", T.FLOAT, ["n", 2]), vi("conv", T.FLOAT, [1, 2, 4, 4])],
        [wq, wzp, cw, ws, bias, nh.from_array(rs.integers(0, 255, (3, 2)).astype(np.uint8), "wq2")],
        opset=13,
    )
    dq.opset_import.append(h.make_opsetid("com.microsoft", 1))
    out["dynamic_quantized"] = (dq, {"x": f32(3, 4), "img": f32(1, 1, 6, 6)})
    # madmom-like (class 1, the weights fix a free axis): `[time, features]` with both axes
    # unnamed-free; features reach an LSTM whose weights take 37 of them (Unsqueeze to
    # [time, 1, features]), so no size the search tries fits; and a Conv over time whose
    # kernel needs 5 frames where axis 0, taken for a batch, stays 1.
    hs = 3
    out["weights_fix_the_features"] = (
        model(
            [
                h.make_node("Unsqueeze", ["x", "ax1"], ["xu"]),
                h.make_node("LSTM", ["xu", "W", "R"], ["seq"], hidden_size=hs),
                h.make_node("Squeeze", ["seq", "ax1"], ["y"]),
            ],
            [vi("x", T.FLOAT, [None, None])],
            [vi("y", T.FLOAT, [None, 1, hs])],
            [nh.from_array(np.array([1], np.int64), "ax1"),
             nh.from_array(f32(1, 4 * hs, 37), "W"), nh.from_array(f32(1, 4 * hs, hs), "R")],
        ),
        {"x": f32(20, 37)},
    )
    out["time_is_axis_0"] = (
        model(
            [
                h.make_node("Unsqueeze", ["x", "ax01"], ["xu"]),
                h.make_node("Conv", ["xu", "K"], ["y"]),
            ],
            [vi("x", T.FLOAT, [None, None])],
            [vi("y", T.FLOAT, [1, 2, None, None])],
            [nh.from_array(np.array([0, 1], np.int64), "ax01"), nh.from_array(f32(2, 1, 5, 3), "K")],
        ),
        {"x": f32(20, 8)},
    )
    # scikit-learn's OneHotEncoder(handle_unknown="error") through skl2onnx (class 1, values
    # the graph names): ONNX-ML's OneHotEncoder with zeros=0 refuses any category it does not
    # list ("Unknown Category"), for strings and for integers alike.
    out["one_hot_known_categories"] = (
        model(
            [
                h.make_node("OneHotEncoder", ["colour"], ["c"], domain="ai.onnx.ml",
                            cats_strings=["blue", "green", "red"], zeros=0),
                h.make_node("OneHotEncoder", ["code"], ["k"], domain="ai.onnx.ml", cats_int64s=[3, 5, 7], zeros=0),
            ],
            [vi("colour", T.STRING, ["n", 1]), vi("code", T.INT64, ["n"])],
            [vi("c", T.FLOAT, ["n", 1, 3]), vi("k", T.FLOAT, ["n", 3])],
            ml=True,
        ),
        {"colour": np.array([["red"], ["blue"]], dtype=object), "code": np.array([7, 3], np.int64)},
    )
    # scikit-learn's DictVectorizer (class 2, a map input): feature name -> value, whose keys
    # the graph's vocabulary names.
    feats = h.make_value_info("features", h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(T.FLOAT, [])))
    out["map_input"] = (
        model(
            [h.make_node("DictVectorizer", ["features"], ["y"], domain="ai.onnx.ml",
                         string_vocabulary=["age", "height", "weight"])],
            [feats],
            [vi("y", T.FLOAT, [1, 3])],
            ml=True,
        ),
        {"features": {"age": 0.25, "height": 0.5, "weight": 0.75}},
    )
    # torch's legacy export of nn.MultiheadAttention (class 1, a size the graph records): the
    # traced sequence length (10) kept in a Reshape's shape although the axis is declared
    # dynamic; no size the search tries fits, 10 does.
    out["traced_sequence_length"] = (
        model(
            [
                h.make_node("Concat", ["seq", "heads_dim"], ["shape"], axis=0),
                h.make_node("Reshape", ["x", "shape"], ["r"]),
                h.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2]),
            ],
            [vi("x", T.FLOAT, ["batch", "sequence", 16])],
            [vi("y", T.FLOAT, [2, 10, 8])],
            [nh.from_array(np.array([10], np.int64), "seq"), nh.from_array(np.array([2, 8], np.int64), "heads_dim")],
        ),
        {"x": f32(1, 10, 16)},
    )
    return out


def missing_locale():
    """A StringNormalizer whose locale no machine has: ONNX Runtime cannot create it."""
    return model(
        [h.make_node("StringNormalizer", ["text"], ["y"], case_change_action="LOWER", locale="xx_XX.UTF-8")],
        [vi("text", T.STRING, ["n"])],
        [vi("y", T.STRING, ["n"])],
    )


def impossible():
    """A model whose only size is 7: no default candidate tries it (the shape is computed,
    so 7 is not among the sizes the graph records)."""
    return model(
        [h.make_node("Add", ["a", "b"], ["shape"]), h.make_node("Reshape", ["x", "shape"], ["y"])],
        [vi("x", T.FLOAT, ["n"])],
        [vi("y", T.FLOAT, [7, 1])],
        [nh.from_array(np.array([3, 0], np.int64), "a"), nh.from_array(np.array([4, 1], np.int64), "b")],
    )


def main():
    dest = sys.argv[1]
    for name, (m, feed) in models().items():
        onnx.checker.check_model(m)
        d = os.path.join(dest, name)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "model.onnx")
        onnx.save(m, p)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        expected = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"]).run(None, feed)
        pickle.dump(feed, open(os.path.join(d, "feed.pkl"), "wb"))
        pickle.dump(expected, open(os.path.join(d, "expected.pkl"), "wb"))
        if all(isinstance(v, np.ndarray) for v in feed.values()):
            # (A map input has no .npz form: its build validates on the default inputs.)
            np.savez_compressed(os.path.join(d, "golden.npz"), **feed)
    os.makedirs(os.path.join(dest, "_impossible"), exist_ok=True)
    onnx.save(impossible(), os.path.join(dest, "_impossible", "impossible.onnx"))
    onnx.save(missing_locale(), os.path.join(dest, "_impossible", "missing_locale.onnx"))
    print(f"wrote {len(models())} models to {dest}")


if __name__ == "__main__":
    main()
