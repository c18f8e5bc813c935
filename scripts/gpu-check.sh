#!/usr/bin/env bash
# The GPU check (issue 19): one prepared run on a GPU host (an H200, no network, nothing
# installed for us) of every GPU path trtcache has, in under 8 minutes. Everything it finds
# goes under $OUT; $OUT/summary.txt has one line per step:
#
#   step 0 probe: ...                      what the image has (nvidia-smi, driver, onnxruntime,
#                                          TensorRT)
#   step 1 sku: ok|FAILED|not available: WHY          `trtcache sku --json` (cudarc)
#   step 2 key-ort-cuda: ...                          `trtcache key --backend ort-cuda`
#   step 3 build-ort-cuda: ...                        build + validate + a consumer on the GPU
#   step 4 build-ort-tensorrt: ...                    the same with ONNX Runtime's TensorRT EP
#   step 5 trt-native: ...                            the shim: parse, supports, build, run,
#                                                     compare with ONNX Runtime CPU
#   step 6 trt-backend: ...                           build --backend trt, inspect --trt,
#                                                     export --triton-repo, deserialize
#
#   OUT=DIR scripts/gpu-check.sh [--bin TRTCACHE] [--models DIR] [--python PY]
#
# Exit 0 when every step either passed or said precisely why it is not available; 1 when a
# step that could run failed; 2 on bad usage. Inputs: the trtcache binary (default
# target/release/trtcache), the example models (examples/models), a Python for the consumer
# and the shim driver (PYTHON, else python3), the ONNX Runtime it has (or ORT_DYLIB_PATH), the
# shim (TRTCACHE_TRT_SHIM, else libtrtcache_trt.so next to the binary) and TensorRT
# (TENSORRT_ROOT or the loader's path). docs/trt.md says how to prepare a run.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$here/target/release/trtcache"
MODELS="$here/examples/models"
PY="${PYTHON:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "${OUT:-}" ] || { echo "gpu-check: set OUT to the folder results go to" >&2; exit 2; }
[ -x "$BIN" ] || { echo "gpu-check: $BIN is not an executable trtcache" >&2; exit 2; }
[ -d "$MODELS" ] || { echo "gpu-check: $MODELS is not a folder" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
if [ -z "$PY" ]; then PY="$(command -v python3 || true)"; fi
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
WORK="$(mktemp -d)"
SERVE_PID=""
cleanup() { [ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
failed=0
say() { echo "$*" | tee -a "$SUMMARY"; }
join() { local out="$1"; shift; for w in "$@"; do out+="; $w"; done; echo "$out"; }
ok() { say "step $1 $2: ok${3:+ ($3)}"; }
na() { say "step $1 $2: not available: $3"; }
bad() { say "step $1 $2: FAILED: $3"; failed=1; }
# Runs a command with a deadline, output to a log file under $OUT.
run() { local secs="$1" log="$2"; shift 2; timeout --kill-after=5 "$secs" "$@" >"$OUT/$log" 2>&1; }
# As `run`, stdout alone into $OUT/NAME.json and stderr into $OUT/NAME.log.
runj() { local secs="$1" name="$2"; shift 2; timeout --kill-after=5 "$secs" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"; }

# --- step 0: what the image has ------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -a)"; echo "trtcache: $("$BIN" --version 2>&1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  if [ -n "$PY" ]; then
    echo "python: $PY ($("$PY" --version 2>&1))"
    "$PY" - <<'EOF' 2>&1
try:
    import onnxruntime as ort
    print("onnxruntime", ort.__version__, ort.__file__, "providers:", ort.get_available_providers())
except Exception as e:
    print("onnxruntime: not importable:", e)
try:
    import tensorrt
    print("tensorrt (python):", tensorrt.__version__)
except Exception as e:
    print("tensorrt (python): not importable:", e)
EOF
  else
    echo "python: none (set PYTHON)"
  fi
  echo "TensorRT libraries:"; (ldconfig -p 2>/dev/null | grep -E 'libnvinfer\.so|libnvonnxparser\.so|libcudart\.so' || echo "  none in the ldconfig cache")
  [ -n "${TENSORRT_ROOT:-}" ] && ls -l "$TENSORRT_ROOT"/lib 2>&1 | grep -E 'nvinfer|nvonnx' | head
  echo "CUDA driver library:"; (ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' || echo "  none in the ldconfig cache")
} >"$OUT/0-probe.txt" 2>&1
gpu_line="$(grep -m1 -E '^[^,]+, [0-9.]+, [0-9.]+' "$OUT/0-probe.txt" || true)"
say "step 0 probe: ${gpu_line:-no nvidia-smi GPU line}; $(grep -m1 '^onnxruntime' "$OUT/0-probe.txt" || echo 'no python onnxruntime')"

# A JSON field through python when there is one, else a crude grep.
json_get() { # FILE EXPR (python expression over `d`)
  if [ -n "$PY" ]; then "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); v=($2); print('' if v is None else v)" "$1" 2>/dev/null
  else grep -o "\"$2\": *\"[^\"]*\"" "$1" | head -1 | sed 's/.*: *"//; s/"$//'; fi
}

# --- step 1: sku through cudarc --------------------------------------------------------------
GPU=0
if run 60 1-sku.json "$BIN" sku --json; then
  n="$(json_get "$OUT/1-sku.json" "len(d.get('gpus', []))")"
  if [ "${n:-0}" -gt 0 ] 2>/dev/null; then
    GPU=1; ok 1 sku "$n GPU(s): $(json_get "$OUT/1-sku.json" "d['sku']['name'] + ' cc ' + str(d['sku'].get('compute_capability'))")"
  else
    why="$(json_get "$OUT/1-sku.json" "d.get('gpu_unavailable')")"
    na 1 sku "no GPU through the CUDA driver (${why:-no reason given})"
  fi
else
  bad 1 sku "trtcache sku --json exited $? (see 1-sku.json)"
fi
NO_GPU="no GPU (step 1)"

# --- step 2: keys for ort-cuda ---------------------------------------------------------------
models=("$MODELS"/*.onnx)
if [ "$GPU" = 1 ]; then
  k=0; kf=0
  for m in "${models[@]}"; do
    b="$(basename "$m" .onnx)"
    if run 60 "2-key-$b.json" "$BIN" key --backend ort-cuda --json "$m"; then k=$((k + 1)); else kf=$((kf + 1)); fi
  done
  if [ "$kf" = 0 ]; then ok 2 key-ort-cuda "$k models"; else bad 2 key-ort-cuda "$kf of ${#models[@]} failed (2-key-*.json)"; fi
else
  na 2 key-ort-cuda "$NO_GPU"
fi

# ONNX Runtime: the Python package's library, unless ORT_DYLIB_PATH is set.
providers=""
if [ -n "$PY" ]; then
  providers="$("$PY" -c 'import onnxruntime as o; print(",".join(o.get_available_providers()))' 2>/dev/null || true)"
  if [ -z "${ORT_DYLIB_PATH:-}" ]; then
    lib="$("$PY" -c 'import onnxruntime,os,glob; d=os.path.join(os.path.dirname(onnxruntime.__file__),"capi"); print(sorted(glob.glob(d+"/libonnxruntime.so.*"))[0])' 2>/dev/null || true)"
    [ -n "$lib" ] && export ORT_DYLIB_PATH="$lib"
  fi
fi

# Builds every example with BACKEND, then serves them and has a consumer acquire one and run
# it on the GPU provider.
build_and_consume() { # STEP NAME BACKEND PROVIDER SECONDS
  local step="$1" name="$2" backend="$3" provider="$4" secs="$5" b m nb=0 nf=0
  local cache="$WORK/cache-$backend"
  for m in "${models[@]}"; do
    b="$(basename "$m" .onnx)"
    if run "$secs" "$step-build-$b.json" "$BIN" build --backend "$backend" --cache-dir "$cache" --json "$m"; then nb=$((nb + 1)); else nf=$((nf + 1)); fi
  done
  if [ "$nf" != 0 ]; then bad "$step" "$name" "$nf of ${#models[@]} builds failed ($step-build-*.json)"; return; fi
  cat >"$WORK/$backend.toml" <<EOF
models = "$MODELS"
cache_dir = "$cache"
socket = "$WORK/$backend.sock"
backends = ["$backend"]
EOF
  "$BIN" serve --config "$WORK/$backend.toml" >"$OUT/$step-serve.log" 2>&1 &
  SERVE_PID=$!
  if ! run "$secs" "$step-warm.json" "$BIN" warm --config "$WORK/$backend.toml" --json --timeout "$secs"; then
    bad "$step" "$name" "$nb built, but warm through the daemon failed ($step-warm.json, $step-serve.log)"
  elif PYTHONPATH="$here/clients/python" run 120 "$step-consumer.txt" "$PY" - "$WORK/$backend.sock" "$provider" <<'EOF'
import sys, numpy as np
from trtcache_client import Client
sock, provider = sys.argv[1], sys.argv[2]
art = Client(sock).acquire("tiny_encoder_static")
sess = art.session(providers=[provider, "CPUExecutionProvider"])
print("key", art.metadata["key"], "providers", sess.get_providers())
assert sess.get_providers()[0] == provider, "the session fell back to " + sess.get_providers()[0]
feeds = {i.name: np.ones([d if isinstance(d, int) and d > 0 else 1 for d in i.shape], np.float32) for i in sess.get_inputs()}
out = sess.run(None, feeds)
print("ran:", [o.shape for o in out])
EOF
  then
    ok "$step" "$name" "$nb models built and validated; a consumer ran tiny_encoder_static on $provider"
  else
    bad "$step" "$name" "$nb built and served, the consumer failed ($step-consumer.txt)"
  fi
  kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=""
}

# --- step 3: ort-cuda ------------------------------------------------------------------------
# Each step lists everything it lacks, not just the first thing.
why=()
[ "$GPU" != 1 ] && why+=("$NO_GPU")
[ -z "$PY" ] && why+=("no python for the consumer (set PYTHON)")
[ -n "$PY" ] && [[ ",$providers," != *",CUDAExecutionProvider,"* ]] && why+=("the image's onnxruntime has no CUDAExecutionProvider (providers: ${providers:-none})")
if [ ${#why[@]} -gt 0 ]; then na 3 build-ort-cuda "$(join "${why[@]}")"
else build_and_consume 3 build-ort-cuda ort-cuda CUDAExecutionProvider 150
fi

# TensorRT's library, as the loader would find it.
trt_lib=""
for d in ${TENSORRT_ROOT:+"$TENSORRT_ROOT/lib"} ${TENSORRT_ROOT:+"$TENSORRT_ROOT"}; do
  [ -e "$d/libnvinfer.so.10" ] && trt_lib="$d/libnvinfer.so.10" && break
done
[ -z "$trt_lib" ] && ldconfig -p 2>/dev/null | grep -q 'libnvinfer\.so\.10 ' && trt_lib="libnvinfer.so.10 (ldconfig)"
NO_TRT="no TensorRT: libnvinfer.so.10 neither in \$TENSORRT_ROOT/lib (${TENSORRT_ROOT:-unset}) nor in the ldconfig cache"

# --- step 4: ort-tensorrt --------------------------------------------------------------------
why=()
[ "$GPU" != 1 ] && why+=("$NO_GPU")
[ -z "$trt_lib" ] && why+=("$NO_TRT")
[ -z "$PY" ] && why+=("no python for the consumer (set PYTHON)")
[ -n "$PY" ] && [[ ",$providers," != *",TensorrtExecutionProvider,"* ]] && why+=("the image's onnxruntime has no TensorrtExecutionProvider (providers: ${providers:-none})")
if [ ${#why[@]} -gt 0 ]; then na 4 build-ort-tensorrt "$(join "${why[@]}")"
else
  [ -n "${TENSORRT_ROOT:-}" ] && export LD_LIBRARY_PATH="$TENSORRT_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  build_and_consume 4 build-ort-tensorrt ort-tensorrt TensorrtExecutionProvider 200
fi

# --- step 5: the native shim -----------------------------------------------------------------
shim="${TRTCACHE_TRT_SHIM:-$(dirname "$BIN")/libtrtcache_trt.so}"
why=()
[ "$GPU" != 1 ] && why+=("$NO_GPU")
[ -z "$trt_lib" ] && why+=("$NO_TRT")
[ ! -f "$shim" ] && why+=("no shim at $shim (set TRTCACHE_TRT_SHIM, or see docs/trt.md to build one)")
[ -z "$PY" ] && why+=("no python to drive the shim (set PYTHON)")
if [ ${#why[@]} -gt 0 ]; then na 5 trt-native "$(join "${why[@]}")"
else
  [ -n "${TENSORRT_ROOT:-}" ] && export LD_LIBRARY_PATH="$TENSORRT_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The shim's C API driven through ctypes: parse, supports, build with a timing cache, a
  # second build from that cache, load, inspect, run, compare with ONNX Runtime CPU.
  if run 150 5-trt-native.txt "$PY" - "$shim" "$MODELS/tiny_encoder_static.onnx" "$OUT/5-inspect.json" <<'EOF'
import ctypes as C, json, os, sys, time
import numpy as np
shim, model_path, inspect_out = sys.argv[1], sys.argv[2], sys.argv[3]
dev = int(os.environ.get("TRTCACHE_DEVICE", "0"))
L = C.CDLL(shim)
class Bytes(C.Structure): _fields_ = [("data", C.POINTER(C.c_uint8)), ("len", C.c_size_t)]
class Opts(C.Structure): _fields_ = [("precision_flags", C.c_uint32), ("workspace_bytes", C.c_uint64),
    ("builder_optimization_level", C.c_int32), ("hardware_compatibility_level", C.c_int32),
    ("profiles", C.c_void_p), ("nb_profiles", C.c_size_t), ("timing_cache", C.c_void_p), ("timing_cache_len", C.c_size_t)]
class Tensor(C.Structure): _fields_ = [("name", C.c_char_p), ("dtype", C.c_int32), ("nb_dims", C.c_int32),
    ("dims", C.c_int64 * 8), ("data", C.c_void_p), ("bytes", C.c_size_t)]
P, VP, SZ = C.POINTER, C.c_void_p, C.c_size_t
for name, res, args in [
    ("last_error", C.c_char_p, []), ("abi_version", C.c_uint32, []), ("library_version", C.c_int32, []),
    ("compiled_version", C.c_int32, []), ("bytes_free", None, [P(Bytes)]),
    ("parse", C.c_int, [C.c_char_p, SZ, C.c_char_p, C.c_int32, P(VP)]), ("network_free", None, [VP]),
    ("supports", C.c_int, [C.c_char_p, SZ, C.c_char_p, C.c_int32, P(Bytes)]),
    ("build", C.c_int, [VP, P(Opts), P(Bytes), P(Bytes)]),
    ("engine_load", C.c_int, [C.c_char_p, SZ, C.c_int32, P(VP)]), ("engine_free", None, [VP]),
    ("engine_io_json", C.c_int, [VP, P(Bytes)]), ("engine_inspect_json", C.c_int, [VP, P(Bytes)]),
    ("engine_run", C.c_int, [VP, C.c_int32, P(Tensor), SZ, P(VP)]),
    ("outputs_count", SZ, [VP]), ("outputs_get", P(Tensor), [VP, SZ]), ("outputs_free", None, [VP])]:
    f = getattr(L, "trtcache_trt_" + name); f.restype = res; f.argtypes = args
def check(st, what):
    if st != 0: raise SystemExit(f"{what}: status {st}: {L.trtcache_trt_last_error().decode()}")
def take(b):
    v = bytes(C.string_at(b.data, b.len)) if b.len else b""
    L.trtcache_trt_bytes_free(C.byref(b)); return v
print("abi", L.trtcache_trt_abi_version(), "TensorRT", L.trtcache_trt_library_version(), "compiled against", L.trtcache_trt_compiled_version(), "device", dev)
model = open(model_path, "rb").read()
b = Bytes(); check(L.trtcache_trt_supports(model, len(model), None, dev, C.byref(b)), "supports")
print("supports:", take(b).decode()[:2000])
cache = b""
for run in (1, 2):
    net = C.c_void_p(); check(L.trtcache_trt_parse(model, len(model), None, dev, C.byref(net)), "parse")
    cbuf = C.create_string_buffer(cache, len(cache)) if cache else None
    o = Opts(0, 0, -1, 0, None, 0, C.cast(cbuf, C.c_void_p) if cbuf else None, len(cache))
    plan, tc = Bytes(), Bytes(); t0 = time.time()
    check(L.trtcache_trt_build(net, C.byref(o), C.byref(plan), C.byref(tc)), "build")
    print(f"build {run}: {time.time() - t0:.1f}s, timing cache in {len(cache)} bytes")
    plan_bytes, cache = take(plan), take(tc)
    print(f"  plan {len(plan_bytes)} bytes, timing cache out {len(cache)} bytes")
    L.trtcache_trt_network_free(net)
eng = C.c_void_p(); check(L.trtcache_trt_engine_load(plan_bytes, len(plan_bytes), dev, C.byref(eng)), "engine_load")
b = Bytes(); check(L.trtcache_trt_engine_io_json(eng, C.byref(b)), "engine_io_json"); io = json.loads(take(b)); print("io:", io)
b = Bytes(); check(L.trtcache_trt_engine_inspect_json(eng, C.byref(b)), "engine_inspect_json"); open(inspect_out, "wb").write(take(b))
rng = np.random.default_rng(0); feeds = {}; tensors = []
for i in io["inputs"]:
    x = rng.standard_normal([d if d > 0 else 1 for d in i["shape"]]).astype(np.float32); feeds[i["name"]] = x
    t = Tensor(i["name"].encode(), 0, x.ndim); t.dims[:x.ndim] = x.shape; t.data = x.ctypes.data; t.bytes = x.nbytes; tensors.append(t)
arr = (Tensor * len(tensors))(*tensors); outs = C.c_void_p()
check(L.trtcache_trt_engine_run(eng, 0, arr, len(tensors), C.byref(outs)), "engine_run")
import onnxruntime as ort
so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ref = dict(zip([o.name for o in ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"]).get_outputs()],
               ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"]).run(None, feeds)))
worst = 0.0
for k in range(L.trtcache_trt_outputs_count(outs)):
    t = L.trtcache_trt_outputs_get(outs, k).contents
    got = np.frombuffer(C.string_at(t.data, t.bytes), np.float32).reshape(list(t.dims[:t.nb_dims]))
    want = ref[t.name.decode()]; err = float(np.max(np.abs(got - want))); worst = max(worst, err)
    ok = np.allclose(got, want, atol=1e-4, rtol=1e-3)
    print(f"output {t.name.decode()} {got.shape}: max abs error {err:.3g} against ONNX Runtime CPU, within fp32 tolerance: {ok}")
    if not ok: raise SystemExit("over tolerance")
L.trtcache_trt_outputs_free(outs); L.trtcache_trt_engine_free(eng)
print("worst", worst)
EOF
  then
    ok 5 trt-native "$(grep -m1 '^build 2' "$OUT/5-trt-native.txt"); $(grep -m1 '^worst' "$OUT/5-trt-native.txt")"
  else
    bad 5 trt-native "$(tail -1 "$OUT/5-trt-native.txt")"
  fi
fi

# --- step 6: the trt backend through trtcache -------------------------------------------------
# Same needs as step 5. build --backend trt (validated against ONNX Runtime CPU), the same
# build again (a cache hit), inspect --trt (the parser's verdict beside the table's), export
# --triton-repo, and the plan deserialized by TensorRT's own Python runtime when the image
# has the `tensorrt` package.
if [ ${#why[@]} -gt 0 ]; then na 6 trt-backend "$(join "${why[@]}")"
else
  export TRTCACHE_TRT_SHIM="$shim"
  c6="$WORK/cache-trt"; m6="$MODELS/tiny_encoder_static.onnx"
  if ! runj 300 6-build-trt "$BIN" build --backend trt --cache-dir "$c6" --json "$m6"; then
    bad 6 trt-backend "trtcache build --backend trt failed ($(tail -1 "$OUT/6-build-trt.log"))"
  elif ! runj 120 6-build-trt-again "$BIN" build --backend trt --cache-dir "$c6" --json "$m6" \
      || [ "$(json_get "$OUT/6-build-trt-again.json" 'd["cache_hit"]')" != True ]; then
    bad 6 trt-backend "the second build was not a cache hit (6-build-trt-again.json)"
  elif ! runj 120 6-inspect-trt "$BIN" inspect --trt --json "$m6"; then
    bad 6 trt-backend "inspect --trt failed ($(tail -1 "$OUT/6-inspect-trt.log"))"
  elif ! run 60 6-export.txt "$BIN" export --triton-repo "$OUT/6-triton" --cache-dir "$c6"; then
    bad 6 trt-backend "export --triton-repo failed ($(tail -1 "$OUT/6-export.txt"))"
  else
    plan="$(json_get "$OUT/6-build-trt.json" 'd["artifact"]["entry"]')"
    err="$(json_get "$OUT/6-build-trt.json" 'max(o["max_abs"] for o in d["record"]["validation"]["outputs"])')"
    dis="$(json_get "$OUT/6-inspect-trt.json" 'd["parser"]["disagreements"]')"
    deser="no tensorrt Python package to deserialize with"
    if "$PY" -c 'import tensorrt' 2>/dev/null; then
      if run 120 6-deserialize.txt "$PY" - "$plan" <<'EOF'
import sys, tensorrt as trt
engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(open(sys.argv[1], "rb").read())
if engine is None: raise SystemExit("deserialize_cuda_engine returned None")
print("deserialized by tensorrt", trt.__version__, "with", engine.num_io_tensors, "I/O tensors")
EOF
      then deser="$(tail -1 "$OUT/6-deserialize.txt")"
      else deser="FAILED to deserialize: $(tail -1 "$OUT/6-deserialize.txt")"; failed=1
      fi
    fi
    ok 6 trt-backend "built and validated (max abs error $err), cache hit, inspect --trt: $dis disagreement(s), exported to 6-triton; $deser"
  fi
fi

say "gpu-check: $( [ "$failed" = 0 ] && echo 'no step failed' || echo 'some steps FAILED' ) (results in $OUT)"
exit "$failed"
