#!/usr/bin/env python3
"""Writes the ONNX backend test data (node, simple, pytorch-converted, pytorch-operator,
light) as a conformance corpus for `scripts/corpus/run.py`.

The data ships inside the onnx wheel up to 1.22 (later wheels drop it), so the wheel is
fetched with `pip download --no-deps onnx==1.22.*` (or given with --wheel) and unzipped;
nothing is downloaded from anywhere else.

    scripts/corpus/node_tests.py DEST [--wheel onnx-1.22.0-….whl] [--suites node,simple]
                                      [--only REGEX] [--limit N]

Each test becomes DEST/<suite>__<test>/ with
  model.onnx      the test's model
  feed.pkl        {input name: value} (numpy arrays; lists for sequences, dicts for maps,
                  None for an empty optional) from test_data_set_0
  expected.pkl    [output values] in graph-output order, from test_data_set_0
  golden.npz      the tensor inputs for `trtcache build --golden` (absent when an input is
                  not a tensor)
  meta.json       {"suite", "test", "source"}
"""
import argparse
import glob
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

SUITES = ["node", "simple", "pytorch-converted", "pytorch-operator", "light"]


def fetch_wheel(where):
    os.makedirs(where, exist_ok=True)
    have = glob.glob(os.path.join(where, "onnx-1.22.*.whl"))
    if have:
        return have[0]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", where, "onnx==1.22.*"],
        check=True,
    )
    return glob.glob(os.path.join(where, "onnx-1.22.*.whl"))[0]


def read_value(path, type_proto):
    """A .pb test value as Python data, by the model's declared type."""
    import onnx
    from onnx import numpy_helper

    data = open(path, "rb").read()
    which = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    if which == "sequence_type":
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return numpy_helper.to_list(p)
    if which == "map_type":
        p = onnx.MapProto()
        p.ParseFromString(data)
        return numpy_helper.to_dict(p)
    if which == "optional_type":
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        return numpy_helper.to_optional(p)
    p = onnx.TensorProto()
    p.ParseFromString(data)
    return numpy_helper.to_array(p)


def convert(src_dir, model_path, dest):
    import numpy as np
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    ins = [i for i in m.graph.input if i.name not in inits]
    outs = list(m.graph.output)
    ds = os.path.join(src_dir, "test_data_set_0")
    if not os.path.isdir(ds):
        return False
    feed = {}
    for k, vi in enumerate(ins):
        p = os.path.join(ds, f"input_{k}.pb")
        if not os.path.exists(p):
            break
        feed[vi.name] = read_value(p, vi.type)
    expected = []
    for k, vi in enumerate(outs):
        p = os.path.join(ds, f"output_{k}.pb")
        if not os.path.exists(p):
            return False
        expected.append(read_value(p, vi.type))
    os.makedirs(dest, exist_ok=True)
    shutil.copy(model_path, os.path.join(dest, "model.onnx"))
    with open(os.path.join(dest, "feed.pkl"), "wb") as f:
        pickle.dump(feed, f)
    with open(os.path.join(dest, "expected.pkl"), "wb") as f:
        pickle.dump(expected, f)
    if feed and all(isinstance(v, np.ndarray) for v in feed.values()):
        # bfloat16 (ml_dtypes) goes in as its raw bits, which trtcache takes for bfloat16
        # inputs; other ml_dtypes types (float8, int4, int2) have no numpy dtype to save.
        feed = {k: v.view(np.uint16) if v.dtype.name == "bfloat16" else v for k, v in feed.items()}
        if all(v.dtype.kind != "V" and v.dtype.type.__module__ == "numpy" for v in feed.values()):
            np.savez(os.path.join(dest, "golden.npz"), **feed)
    return True


def convert_light(model_path, dest):
    """`light_X.onnx` + `light_X_output_0.pb`: the input is onnx's dummy data
    (arange(n) / n, float32), as onnx's own backend runner feeds it."""
    import numpy as np
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    feed = {}
    for x in m.graph.input:
        if x.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feed[x.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    prefix = os.path.splitext(model_path)[0]
    expected = []
    for k, vi in enumerate(m.graph.output):
        p = f"{prefix}_output_{k}.pb"
        if not os.path.exists(p):
            return False
        expected.append(read_value(p, vi.type))
    os.makedirs(dest, exist_ok=True)
    shutil.copy(model_path, os.path.join(dest, "model.onnx"))
    with open(os.path.join(dest, "feed.pkl"), "wb") as f:
        pickle.dump(feed, f)
    with open(os.path.join(dest, "expected.pkl"), "wb") as f:
        pickle.dump(expected, f)
    np.savez(os.path.join(dest, "golden.npz"), **feed)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest")
    ap.add_argument("--wheel", help="an onnx 1.22 wheel (default: pip download into DEST/.wheels)")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--only", help="regex on <suite>__<test>")
    ap.add_argument("--limit", type=int, default=0, help="at most N tests per suite")
    a = ap.parse_args()
    wheel = a.wheel or fetch_wheel(os.path.join(a.dest, ".wheels"))
    only = re.compile(a.only) if a.only else None
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            members = [x for x in z.namelist() if x.startswith("onnx/backend/test/data/")]
            if not members:
                sys.exit(f"{wheel} has no onnx/backend/test/data (onnx >= 1.23 dropped it; use 1.22)")
            z.extractall(tmp, members)
        root = os.path.join(tmp, "onnx/backend/test/data")
        for suite in a.suites.split(","):
            sdir = os.path.join(root, suite)
            if not os.path.isdir(sdir):
                print(f"no suite {suite} in {wheel}", file=sys.stderr)
                continue
            count = 0
            for test in sorted(os.listdir(sdir)):
                tdir = os.path.join(sdir, test)
                light = suite == "light" and test.endswith(".onnx")
                model = tdir if light else os.path.join(tdir, "model.onnx")
                test = test[: -len(".onnx")] if light else test
                if not os.path.isfile(model):
                    continue
                name = f"{suite}__{test}"
                if only and not only.search(name):
                    continue
                if a.limit and count >= a.limit:
                    break
                dest = os.path.join(a.dest, name)
                try:
                    ok = convert_light(model, dest) if light else convert(tdir, model, dest)
                except Exception as e:  # a test whose data onnx itself cannot read
                    print(f"skip {name}: {e}", file=sys.stderr)
                    ok = False
                if ok:
                    with open(os.path.join(dest, "meta.json"), "w") as f:
                        json.dump({"suite": suite, "test": test, "source": os.path.basename(wheel)}, f)
                    count += 1
                    n += 1
    print(f"wrote {n} tests to {a.dest}")


if __name__ == "__main__":
    main()
