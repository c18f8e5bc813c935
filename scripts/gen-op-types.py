#!/usr/bin/env python3
"""Writes src/analysis/data/ort-op-types.tsv: the output element-type rule of every operator
schema ONNX Runtime registers (ai.onnx, ai.onnx.ml, com.microsoft and its internal domains),
for the type inference's schema fall-back (src/analysis/infer/schema.rs).

    .venv/bin/python scripts/gen-op-types.py > src/analysis/data/ort-op-types.tsv

The schemas come from the installed onnxruntime wheel (`get_all_operator_schema()`, every
version of every op). Per output, the rule is what the schema alone fixes:
  =CODE      the output is a tensor of this TensorProto.DataType (a fixed `tensor(x)`, or a
             type constraint that allows one tensor type only);
  @I,J       the element type of formal input I (else J, ...), which share its constraint;
  ?          nothing the schema alone fixes (an attribute chooses it, or a non-tensor type).
A trailing `*` marks a variadic last output (every further output follows its rule).
"""
import sys

import onnx
import onnxruntime
from onnxruntime.capi import onnxruntime_pybind11_state as C

VARIADIC = "Variadic"


def code(type_str):
    """TensorProto code of `tensor(x)`, or None."""
    if not (type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    try:
        return onnx.TensorProto.DataType.Value(type_str[7:-1].upper())
    except ValueError:
        return None


def rule(schema, out, allowed):
    ts = out.typeStr
    c = code(ts)
    if c is not None:
        return "=%d" % c
    if ts not in allowed:
        return "?"
    codes = {code(t) for t in allowed[ts]}
    if len(codes) == 1 and None not in codes:
        return "=%d" % codes.pop()
    bound = []
    for i, inp in enumerate(schema.inputs):
        if inp.typeStr == ts:
            bound.append(str(i))
        if str(inp.option).endswith(VARIADIC):
            break  # positions after a variadic input are not fixed
    if bound and all(code(t) is not None for t in allowed[ts]):
        return "@" + ",".join(bound)
    return "?"


def main():
    rows = set()
    for s in C.get_all_operator_schema():
        allowed = {c.type_param_str: list(c.allowed_type_strs) for c in s.type_constraints}
        outs = []
        for k, o in enumerate(s.outputs):
            r = rule(s, o, allowed)
            if k == len(s.outputs) - 1 and str(o.option).endswith(VARIADIC):
                r += "*"
            outs.append(r)
        rows.add((s.domain or "ai.onnx", s.name, s.since_version, " ".join(outs)))
    w = sys.stdout.write
    w("# Output element-type rules of ONNX Runtime's operator schemas, by scripts/gen-op-types.py\n")
    w("# from onnxruntime %s (onnx %s). domain, op, since version, one rule per output:\n"
      % (onnxruntime.__version__, onnx.__version__))
    w("# =CODE a fixed TensorProto type; @I,J the type of formal input I (else J); ? not fixed;\n")
    w("# a trailing * repeats the last rule for every further (variadic) output.\n")
    for d, n, v, o in sorted(rows):
        w("%s\t%s\t%d\t%s\n" % (d, n, v, o))


if __name__ == "__main__":
    main()
