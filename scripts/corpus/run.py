#!/usr/bin/env python3
"""Runs a corpus written by `node_tests.py` or `realworld.py` through trtcache and writes a
summary by failure class.

    scripts/corpus/run.py CORPUS [--trtcache target/release/trtcache] [--only REGEX]
        [--defaults] [--no-export | --export-only] [--json OUT.json] [--cache-dir DIR]

Per test (a folder with model.onnx, feed.pkl, expected.pkl, optionally golden.npz):
  1. reference: ONNX Runtime CPU, optimizations off, runs the model on the feed and matches
     expected.pkl; a test it cannot load, run or match is counted as `ort-cannot` and left
     out of the rates (the suite's denominator is "the tests ORT runs");
  2. `trtcache build --backend ort-cpu --json` (with `--golden golden.npz` unless
     --defaults, which checks the default validation inputs) must store a validated,
     servable artifact;
  3. the artifact, opened as the clients open it (optimizations off), reproduces
     expected.pkl on the feed;
  4. `trtcache inspect --export-subgraphs`: the partitions, run one after another in the
     manifest's order, reproduce expected.pkl, and every partition output's declared shape
     (the analysis's inference) matches the shape ONNX Runtime produced (`shape-mismatch`
     otherwise). --export-only runs only this step after the reference.
Floats compare with |a - e| <= atol + rtol |e| (default atol 1e-4, rtol 1e-3, trtcache's
fp32 tolerance), and float16/bfloat16 outputs (or float32 ones a Cast makes from them) also
within --ulps (8) steps of their type at max(|e|, rms(e)), trtcache's rule for them (float outputs
of activations quantized at run time: --ulps steps of (max(e) - min(e)) / 255); integers, bools and strings exactly; maps key by key; sequences item by
item. Exit status 0 when every test ORT runs passes every step.
"""
import argparse
import collections
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ort.set_default_logger_severity(4)
ENV = dict(os.environ, NO_COLOR="1", RUST_LOG="error")


def session(path, opt=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = opt
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ortify(v):
    """bfloat16 arrays (ml_dtypes) as OrtValues: numpy has no bfloat16 of its own, so ONNX
    Runtime's Python binding cannot take them as arrays."""
    if isinstance(v, np.ndarray) and v.dtype.name == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(v).view(np.uint16), 16)
    return v


def feed_for(sess, feed):
    names = {i.name for i in sess.get_inputs()}
    return {k: ortify(v) for k, v in feed.items() if k in names}


ULPS = 8  # trtcache's default `ulps` (src/spec.rs DEFAULT_HALF_ULPS)


def float_step(elem, mag):
    """One step of a float16/bfloat16 value of magnitude `mag` (src/spec.rs `float_step`)."""
    mant, min_exp = {"float16": (10, -14), "bfloat16": (7, -126)}[elem]
    m = abs(mag)
    e = int(np.floor(np.log2(m))) if np.isfinite(m) and m > 0 else min_exp
    return 2.0 ** (max(e, min_exp) - mant)


def half_outputs(path):
    """src/onnx/resolution.rs `half_outputs`: output -> float16/bfloat16 when the output is
    one, or a float32/float64 output a Cast makes from one."""
    import onnx
    from onnx import TensorProto as T

    g = onnx.load(path, load_external_data=False).graph
    types = {}
    for v in list(g.value_info) + list(g.input):
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    prod = {o: n for n in g.node for o in n.output}
    half = {T.FLOAT16: "float16", T.BFLOAT16: "bfloat16"}
    out = {}
    for o in g.output:
        et = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
        if et in half:
            out[o.name] = half[et]
            continue
        if et not in (T.FLOAT, T.DOUBLE):
            continue
        n = prod.get(o.name)
        if n is None or n.op_type != "Cast" or n.domain not in ("",) or not n.input:
            continue
        src = n.input[0]
        code = types.get(src)
        if code is None:
            p = prod.get(src)
            if p is not None and p.op_type == "Cast" and p.domain == "":
                code = next((a.i for a in p.attribute if a.name == "to"), None)
        if code in half:
            out[o.name] = half[code]
    # src/onnx/resolution.rs `dynamic_int8_outputs`: float outputs an activation quantized
    # at run time reaches are compared in int8 steps of their range.
    dynamic = {("", "DynamicQuantizeLinear"), ("ai.onnx", "DynamicQuantizeLinear"),
               ("com.microsoft", "DynamicQuantizeMatMul"), ("com.microsoft", "DynamicQuantizeLSTM")}
    reached = set()
    while True:
        before = len(reached)
        for n in g.node:
            if (n.domain, n.op_type) in dynamic or any(i in reached for i in n.input):
                reached.update(o for o in n.output if o)
        if len(reached) == before:
            break
    for o in g.output:
        et = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
        if o.name in reached and et in (T.FLOAT, T.DOUBLE) and o.name not in out:
            out[o.name] = "int8-dynamic"
    return out


def same(a, e, atol, rtol, path="out", half=None, ulps=ULPS):
    """None when `a` matches `e`, else a short reason. A float16/bfloat16 output (or one
    `half` names: a float32 output a Cast makes from one) also passes within `ulps` steps of
    its half type at max(|e|, rms(e)), as trtcache's validation does (src/spec.rs
    `Tolerance::half_bound`)."""
    if e is None or a is None:
        return None if a is None and e is None else f"{path}: one side is None"
    if isinstance(e, dict):
        if not isinstance(a, dict):
            return f"{path}: map expected, got {type(a).__name__}"
        if set(a) != set(e):
            return f"{path}: keys differ"
        for k in e:
            r = same(a[k], e[k], atol, rtol, f"{path}[{k!r}]", half, ulps)
            if r:
                return r
        return None
    if isinstance(e, list):
        if not isinstance(a, list) or len(a) != len(e):
            return f"{path}: sequence length differs"
        for i, (x, y) in enumerate(zip(a, e)):
            r = same(x, y, atol, rtol, f"{path}[{i}]", half, ulps)
            if r:
                return r
        return None
    a = np.asarray(a)
    e = np.asarray(e)
    if a.shape != e.shape:
        return f"{path}: shape {a.shape} != expected {e.shape}"
    if e.dtype.kind in "fc":
        af = a.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
        ef = e.astype(af.dtype)
        np.seterr(all="ignore")
        both_nan = np.isnan(af) & np.isnan(ef)
        eq = af == ef
        bound = atol + rtol * np.abs(ef)
        half = half or {"float16": "float16", "bfloat16": "bfloat16"}.get(e.dtype.name)
        if half == "int8-dynamic" and ulps:
            # src/spec.rs `DYNAMIC_INT8`: steps of (max - min) / 255 of the reference.
            finite = ef[np.isfinite(ef)].real
            if finite.size:
                bound = np.maximum(bound, ulps * (float(finite.max()) - float(finite.min())) / 255.0)
        elif half and e.dtype.kind == "f" and ulps:
            finite = np.isfinite(ef)
            scale = float(np.sqrt(np.mean(ef[finite] ** 2))) if finite.any() else 0.0
            mag = np.maximum(np.where(finite, np.abs(ef), 0.0), scale)
            mant, min_exp = {"float16": (10, -14), "bfloat16": (7, -126)}[half]
            with np.errstate(divide="ignore"):
                exp = np.where(mag > 0, np.floor(np.log2(np.where(mag > 0, mag, 1.0))), min_exp)
            bound = np.maximum(bound, ulps * 2.0 ** (np.maximum(exp, min_exp) - mant))
        close = np.abs(af - ef) <= bound
        bad = ~(both_nan | eq | close)
        if bad.any():
            d = np.abs(af - ef)[bad]
            return f"{path}: {int(bad.sum())} of {e.size} elements off (max abs {float(np.nanmax(d.real)) if d.size else 0:.3g})"
        return None
    if a.dtype != e.dtype and not (a.dtype.kind in "OUS" and e.dtype.kind in "OUS"):
        return f"{path}: dtype {a.dtype} != expected {e.dtype}"
    if e.dtype.kind in "OUS":
        ok = [str(x) == str(y) for x, y in zip(a.ravel(), e.ravel())]
        return None if all(ok) else f"{path}: strings differ"
    return None if np.array_equal(a, e) else f"{path}: values differ"


def compare_all(got, expected, atol, rtol, halves=None, ulps=ULPS):
    """`halves`: per output, the half type whose resolution it has (`half_outputs`), or None."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        r = same(g, e, atol, rtol, f"output {i}", (halves or [None] * len(expected))[i], ulps)
        if r:
            return r
    return None


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def stft_exact(model, artifact, feed, out_names, got, expected, atol, rtol):
    """For an artifact whose build rewrote the model's STFTs as Convs (trtcache's
    `stft-as-conv`, docs/cache.md "Graph rewrites": the model has STFT nodes, the artifact
    none), whose outputs `got` miss ONNX Runtime's `expected`: compares them with the model
    whose STFTs compute in float64 (signal and window cast to double, the result cast back,
    as trtcache's validation does), where ORT's float32 direct DFT is the less exact. A
    sentence saying both distances when the artifact matches that reference, else None."""
    import onnx
    from onnx import helper, TensorProto

    m = onnx.load(model)
    if not any(n.op_type == "STFT" for n in m.graph.node):
        return None
    if any(n.op_type == "STFT" for n in onnx.load(artifact, load_external_data=False).graph.node):
        return None
    nodes = []
    for i, n in enumerate(m.graph.node):
        if n.op_type != "STFT":
            nodes.append(n)
            continue
        p = f"__exact{i}"
        nodes.append(helper.make_node("Cast", [n.input[0]], [p + "_signal"], to=TensorProto.DOUBLE))
        ins = [p + "_signal"] + list(n.input[1:])
        if len(n.input) > 2 and n.input[2]:
            nodes.append(helper.make_node("Cast", [n.input[2]], [p + "_window"], to=TensorProto.DOUBLE))
            ins[2] = p + "_window"
        stft = onnx.NodeProto()
        stft.CopyFrom(n)
        del stft.input[:]
        stft.input.extend(ins)
        stft.output[0] = p + "_spectrum"
        nodes.append(stft)
        nodes.append(helper.make_node("Cast", [p + "_spectrum"], [n.output[0]], to=TensorProto.FLOAT))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    exact = ref.run(None, feed_for(ref, feed))
    names = [o.name for o in ref.get_outputs()]
    exact = [exact[names.index(n)] for n in out_names]
    if compare_all(got, exact, atol, rtol):
        return None
    return (f"rewritten STFT: matches the float64 STFT; ONNX Runtime's own float32 STFT is off it by "
            f"{compare_all(expected, exact, atol, rtol) or 'nothing over the tolerance'}")


CORPUS_FILES = {"model.onnx", "feed.pkl", "expected.pkl", "golden.npz"}


def external_files(test_dir):
    """The files next to a corpus model that are not the corpus's own: its external data."""
    return sorted(f for f in os.listdir(test_dir) if f not in CORPUS_FILES and not f.endswith(".txt"))


def copy_model(test_dir, models, name):
    """Puts a corpus model in a daemon's model folder: NAME.onnx, or NAME/model.onnx with
    its external data files beside it (data resolves next to the graph)."""
    extra = external_files(test_dir)
    if not extra:
        shutil.copy(os.path.join(test_dir, "model.onnx"), os.path.join(models, name + ".onnx"))
        return
    os.makedirs(os.path.join(models, name))
    for f in ["model.onnx", *extra]:
        shutil.copy(os.path.join(test_dir, f), os.path.join(models, name, f))


def first_line(s, n=400):
    """The error line of a trtcache stderr (or an exception's first line)."""
    lines = [ANSI.sub("", x).strip() for x in (s or "").splitlines()]
    lines = [x for x in lines if x]
    for x in lines:
        if x.startswith("error:"):
            return x[:n]
    return (lines[0] if lines else "")[:n]


def serve_args(ap, here):
    """The options `daemon.py` and `mutate.py` share: the corpus, the binary, a filter, the
    warm timeout, a JSON report and the float tolerance."""
    ap.add_argument("corpus")
    ap.add_argument("--trtcache", default=os.path.join(here, "../../target/release/trtcache"))
    ap.add_argument("--only")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)


def start_serve(trtcache, args, sock, log_path):
    """`trtcache serve ARGS` (output to LOG_PATH), once SOCK exists; exits the script when
    it does not come up within 60 s."""
    log = open(log_path, "w")
    serve = subprocess.Popen([trtcache, "serve", *args], stdout=log, stderr=subprocess.STDOUT, env=ENV)
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if serve.poll() is not None or time.monotonic() > deadline:
            serve.kill()
            sys.exit(f"trtcache serve did not start; see {log_path}")
        time.sleep(0.05)
    return serve


def stop_serve(serve):
    """SIGTERM, then SIGKILL after 30 s; the exit status."""
    serve.send_signal(signal.SIGTERM)
    try:
        return serve.wait(30)
    except subprocess.TimeoutExpired:
        serve.kill()
        return serve.wait()


def declared_shapes(path, outputs_only=True):
    """Value name -> declared dims (int, str or None; a negative dim_value is dynamic, as in
    ORT) as the file says: not ORT's session view, which merges in ORT's own inference."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    out = {}
    g = m.graph
    for o in list(g.output) + ([] if outputs_only else list(g.value_info) + list(g.input)):
        t = o.type
        if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
            continue
        out[o.name] = [
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in t.tensor_type.shape.dim
        ]
    return out


def shape_errors(path, outputs, values, original):
    """Declared (inferred) output shapes of a partition that the values ORT produced
    contradict: a different rank or a different fixed dimension. A declaration copied from
    the original model (`original`: its declared shapes) is the model's own, not an
    inference, and is left out (ORT does not enforce declared output shapes)."""
    bad = []
    declared = declared_shapes(path)
    for o, v in zip(outputs, values):
        want = declared.get(o.name)
        if want is None or not isinstance(v, np.ndarray) or original.get(o.name) == want:
            continue
        if len(want) != v.ndim or any(isinstance(w, int) and w != g for w, g in zip(want, v.shape)):
            bad.append(f"{os.path.basename(path)}: `{o.name}` declared {want}, ran {list(v.shape)}")
    return bad


def run_partitions(man_dir, feed, out_names, model):
    man = json.load(open(os.path.join(man_dir, "manifest.json")))
    original = declared_shapes(model, outputs_only=False)
    env = dict(feed)
    parts = {p["id"]: p for p in man["partitions"]}
    bad_shapes = []
    for pid in man["order"]:
        p = parts[pid]
        path = os.path.join(man_dir, p["file"])
        s = session(path)
        res = s.run(None, feed_for(s, env))
        bad_shapes += shape_errors(path, s.get_outputs(), res, original)
        for o, v in zip(s.get_outputs(), res):
            env[o.name] = v
    return [env[n] for n in out_names], bad_shapes


def one(t, a, cache):
    model = os.path.join(t, "model.onnx")
    feed = pickle.load(open(os.path.join(t, "feed.pkl"), "rb"))
    expected = pickle.load(open(os.path.join(t, "expected.pkl"), "rb"))
    res = {"test": os.path.basename(t)}
    try:
        ref = session(model)
        got = ref.run(None, feed_for(ref, feed))
    except Exception as e:
        res.update(cls="ort-cannot", why=first_line(str(e)))
        return res
    r = compare_all(got, expected, a.atol, a.rtol)
    if r:
        res.update(cls="ort-cannot", why=f"ORT's own outputs differ from expected: {r}")
        return res
    out_names = [o.name for o in ref.get_outputs()]
    if a.export_only:
        return export_step(res, model, feed, expected, out_names, a)
    cmd = [a.trtcache, "build", "--backend", "ort-cpu", "--json", "--no-sidecar", "--cache-dir", cache, "--threads", "1"]
    golden = os.path.join(t, "golden.npz")
    if not a.defaults and os.path.exists(golden):
        cmd += ["--golden", golden]
    t0 = time.monotonic()
    p = subprocess.run(cmd + [model], capture_output=True, text=True, timeout=a.timeout, env=ENV)
    res["build_s"] = round(time.monotonic() - t0, 3)
    try:
        j = json.loads(p.stdout)
    except ValueError:
        res.update(cls="build-error", why=first_line(p.stderr))
        return res
    if not j.get("servable"):
        v = (j.get("record") or {}).get("validation") or {}
        why = j.get("unservable") or first_line(p.stderr)
        res.update(cls="validation-failed" if v else "build-error", why=str(why)[:240])
        return res
    try:
        s = session(j["artifact"]["entry"])
        missing = [i.name for i in s.get_inputs() if i.name not in feed]
        extra = [n for n in (i.name for i in ref.get_inputs()) if n not in {i.name for i in s.get_inputs()}]
        if missing:
            res.update(cls="artifact-inputs", why=f"artifact demands inputs the original lacks: {missing}")
            return res
        got = s.run(None, feed_for(s, feed))
        names = [o.name for o in s.get_outputs()]
        got = [got[names.index(n)] if n in names else None for n in out_names]
    except Exception as e:
        res.update(cls="artifact-error", why=first_line(str(e)))
        return res
    halves = [half_outputs(model).get(n) for n in out_names]
    r = compare_all(got, expected, a.atol, a.rtol, halves, a.ulps)
    if r:
        exact = stft_exact(model, j["artifact"]["entry"], feed, out_names, got, expected, a.atol, a.rtol)
        if not exact:
            res.update(cls="artifact-mismatch", why=r)
            return res
        res["exact"] = f"{exact} (against ORT: {r})"
        print(f"{res['test']}: {res['exact']}", flush=True)
    if extra:
        res["note"] = f"artifact dropped optional inputs {extra}"
    if a.no_export:
        res["cls"] = "pass"
        return res
    return export_step(res, model, feed, expected, out_names, a)


def export_step(res, model, feed, expected, out_names, a):
    with tempfile.TemporaryDirectory() as ex:
        p = subprocess.run([a.trtcache, "inspect", "--export-subgraphs", ex, model], capture_output=True, text=True, timeout=a.timeout, env=ENV)
        if p.returncode != 0:
            res.update(cls="export-error", why=first_line(p.stderr))
            return res
        try:
            got, bad_shapes = run_partitions(ex, feed, out_names, model)
        except Exception as e:
            res.update(cls="partition-error", why=first_line(str(e)))
            return res
        halves = [half_outputs(model).get(n) for n in out_names]
        r = compare_all(got, expected, a.atol, a.rtol, halves, a.ulps)
        if r:
            res.update(cls="partition-mismatch", why=r)
            return res
        if bad_shapes:
            res.update(cls="shape-mismatch", why="; ".join(bad_shapes)[:400])
            return res
    res["cls"] = "pass"
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--trtcache", default=os.path.join(os.path.dirname(__file__), "../../target/release/trtcache"))
    ap.add_argument("--only")
    ap.add_argument("--defaults", action="store_true", help="validate on the default inputs, not golden.npz")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--export-only", action="store_true", help="skip build and artifact: only the exported partitions")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--cache-dir")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--ulps", type=float, default=ULPS,
                    help="float16/bfloat16 outputs also pass within this many steps of their type (trtcache's --ulps)")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    tests = sorted(
        os.path.join(a.corpus, d)
        for d in os.listdir(a.corpus)
        if os.path.isfile(os.path.join(a.corpus, d, "model.onnx")) and (not only or only.search(d))
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = a.cache_dir or os.path.join(tmp, "cache")
        for t in tests:
            try:
                r = one(t, a, cache)
            except subprocess.TimeoutExpired:
                r = {"test": os.path.basename(t), "cls": "timeout", "why": f"over {a.timeout}s"}
            results.append(r)
            if r["cls"] not in ("pass", "ort-cannot"):
                print(f"{r['test']}: {r['cls']}: {r.get('why', '')}", flush=True)
    by = collections.Counter(r["cls"] for r in results)
    ran = len(results) - by["ort-cannot"]
    print(f"\n{len(results)} tests; ONNX Runtime runs {ran} (ort-cannot: {by['ort-cannot']})")
    for cls, n in sorted(by.items(), key=lambda x: -x[1]):
        print(f"  {cls:20} {n}")
    if ran:
        print(f"pass rate: {by['pass']}/{ran} = {100 * by['pass'] / ran:.2f}%")
        exact = sum(1 for r in results if r.get("exact"))
        if exact:
            print(f"  of which {exact} match the float64 STFT their build's rewrite computes, "
                  f"not ONNX Runtime's float32 one (docs/cache.md \"Graph rewrites\")")
        built = ran - by["build-error"] - by["validation-failed"] - by["timeout"]
        print(f"build validates: {built}/{ran} = {100 * built / ran:.2f}%")
        print(f"artifact mismatches: {by['artifact-mismatch'] + by['artifact-error'] + by['artifact-inputs']}; "
              f"partition mismatches: {by['partition-mismatch'] + by['partition-error'] + by['export-error']}; "
              f"wrongly inferred output shapes: {by['shape-mismatch']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if by["pass"] == ran else 1)


if __name__ == "__main__":
    main()
