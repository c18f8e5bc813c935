"""Writes the ONNX backend test corpus and python onnx's view of every model in it.

The onnx wheel ships only the `real`/`simple`/`pytorch-*` models of its backend test data;
the 1,000+ node test models are generated from `onnx.backend.test.case.node`, exactly as
the onnx repo's own `generate-data` step does. Usage:

    python onnx_corpus.py OUT_DIR

writes OUT_DIR/models/<kind>/<name>/model.onnx and OUT_DIR/expected.json, a list of
{path, ir_version, opset_imports, node_count, inputs, outputs} as `trtcache inspect` reports
them (dtype names and shapes in trtcache's notation).
"""
import contextlib
import io
import json
import os
import shutil
import sys
import warnings

import onnx
from onnx import TensorProto

NAMES = {
    "FLOAT": "float32",
    "DOUBLE": "float64",
}


def dtype(code):
    try:
        name = TensorProto.DataType.Name(code)
    except ValueError:
        return f"type{code}"
    return NAMES.get(name, name.lower())


def type_name(t):
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return dtype(t.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse({dtype(t.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        inner = t.sequence_type
        return f"seq({type_name(inner.elem_type) if inner.HasField('elem_type') else 'unknown'})"
    if kind == "optional_type":
        inner = t.optional_type
        return f"optional({type_name(inner.elem_type) if inner.HasField('elem_type') else 'unknown'})"
    if kind == "map_type":
        m = t.map_type
        value = type_name(m.value_type) if m.HasField("value_type") else "unknown"
        return f"map({dtype(m.key_type)},{value})"
    if kind == "opaque_type":
        return f"opaque({t.opaque_type.domain}.{t.opaque_type.name})"
    return "unknown"


def shape(v):
    t = v.type
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        tt = t.tensor_type
    elif kind == "sparse_tensor_type":
        tt = t.sparse_tensor_type
    else:
        return None
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def facts(path):
    m = onnx.load(path, load_external_data=False)
    g = m.graph
    inits = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
    opsets = {}
    for o in m.opset_import:
        opsets["" if o.domain == "ai.onnx" else o.domain] = o.version
    value = lambda v: {"name": v.name, "dtype": type_name(v.type), "shape": shape(v)}
    return {
        "path": path,
        "ir_version": m.ir_version,
        "opset_imports": opsets,
        "node_count": len(g.node),
        "inputs": [value(v) for v in g.input if v.name not in inits],
        "outputs": [value(v) for v in g.output],
    }


def main():
    out = sys.argv[1]
    models = os.path.join(out, "models")
    shutil.rmtree(models, ignore_errors=True)
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    for root, _, files in os.walk(data):
        if "model.onnx" in files:
            rel = os.path.relpath(root, data)
            os.makedirs(os.path.join(models, rel), exist_ok=True)
            shutil.copy(os.path.join(root, "model.onnx"), os.path.join(models, rel, "model.onnx"))
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
    for case in cases:
        d = os.path.join(models, case.kind, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
    expected = []
    for root, _, files in sorted(os.walk(models)):
        if "model.onnx" in files:
            expected.append(facts(os.path.join(root, "model.onnx")))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    print(len(expected))


if __name__ == "__main__":
    main()
