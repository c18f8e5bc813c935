#!/usr/bin/env bash
# The GPU check (issues 19, 40): one prepared run on a GPU host (an H200, no network, nothing
# installed for us) of every GPU path trtcache has, in under 8 minutes. It needs only the
# trtcache binary and this script (`make gpu-bundle` carries both, with the models): Python,
# ONNX Runtime, TensorRT and the CUDA libraries are used when the image has them. Everything
# goes under $OUT; $OUT/summary.txt has one line per step, each exactly one of `ok (…)`,
# `FAILED: why` or `not available: why` (everything the step lacks):
#
#   step 0 probe              what the image has (nvidia-smi, onnxruntime, TensorRT, python)
#   step 1 sku                `trtcache sku --json` against nvidia-smi's GPU list
#   step 2 key-ort-cuda       `trtcache key --backend ort-cuda` on the examples
#   step 3 build-ort-cuda     build + validate the examples, serve and warm them
#   step 3c consume-ort-cuda  a Python consumer runs one on CUDAExecutionProvider
#   step 4 / 4c               the same with ONNX Runtime's TensorRT EP
#   step 5 trt-native         the shim through Python ctypes: parse, supports, build, run,
#                             compare with ONNX Runtime CPU
#   step 6 trt-backend        build --backend trt, the cache hit, inspect --trt, export
#   step 6d trt-deserialize   the plan deserialized by TensorRT's Python runtime
#
#   OUT=DIR scripts/gpu-check.sh [--bin TRTCACHE] [--models DIR] [--python PY] [--site DIR]...
#
# Exit 0 when every step passed or said why it is not available; 1 when a step that could run
# failed; 2 on bad usage. Inputs: the trtcache binary (default: `trtcache` beside scripts/, as
# in the bundle, else target/release/trtcache), the example models (examples/models), a Python
# (PYTHON, else python3; optional), ONNX Runtime (ORT_DYLIB_PATH, else the onnxruntime wheel
# in a site-packages folder), TensorRT (TENSORRT_ROOT, the pip `tensorrt_libs` wheel layout, or
# the loader's cache), the pip CUDA wheels (site-packages/nvidia/*/lib), and the shim
# (TRTCACHE_TRT_SHIM, else libtrtcache_trt.so beside the binary). The site-packages folders
# searched: --site / SITE_PACKAGES (colon-separated; when given, the only ones besides the
# Python's own), else the Python's own, $VIRTUAL_ENV's, ./.venv's and the usual system ones.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$here/target/release/trtcache"
[ -x "$here/trtcache" ] && [ ! -d "$here/trtcache" ] && BIN="$here/trtcache"
MODELS="$here/examples/models"
PY="${PYTHON:-}"
SITES="${SITE_PACKAGES:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --models) MODELS="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --site) SITES="${SITES:+$SITES:}$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "${OUT:-}" ] || { echo "gpu-check: set OUT to the folder results go to" >&2; exit 2; }
[ -x "$BIN" ] || { echo "gpu-check: $BIN is not an executable trtcache" >&2; exit 2; }
[ -d "$MODELS" ] || { echo "gpu-check: $MODELS is not a folder" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
if [ -z "$PY" ]; then PY="$(command -v python3 || true)"; fi
if [ -n "$PY" ] && ! "$PY" -c 'import sys' >/dev/null 2>&1; then PY_BROKEN="$PY"; PY=""; fi
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
# JSON fields without Python (trtcache's own, pretty-printed output): the first string value
# of KEY, whether KEY is true anywhere, the largest number under KEY.
jstr() { grep -o "\"$2\": *\"\([^\"\\\\]\|\\\\.\)*\"" "$1" 2>/dev/null | head -1 | sed 's/^"[^"]*": *"//; s/"$//; s/\\"/"/g; s/\\\\/\\/g'; }
jlaststr() { grep -o "\"$2\": *\"\([^\"\\\\]\|\\\\.\)*\"" "$1" 2>/dev/null | tail -1 | sed 's/^"[^"]*": *"//; s/"$//; s/\\"/"/g; s/\\\\/\\/g'; }
jtrue() { grep -q "\"$2\": *true" "$1" 2>/dev/null; }
jmax() { grep -o "\"$2\": *[-0-9.eE+]*" "$1" 2>/dev/null | sed 's/.*: *//' | awk 'BEGIN{m=""} {if (m=="" || $1+0>m+0) m=$1} END{print m}'; }
jcount() { grep -c "\"$2\":" "$1" 2>/dev/null || true; }
# Whether the Python can import every module named.
py_has() { [ -n "$PY" ] && "$PY" -c "import $1" >/dev/null 2>&1; }

# --- where the wheels are: site-packages folders, without needing Python -----------------------
sites=()
add_site() { local d; for d in "$@"; do [ -d "$d" ] && [[ " ${sites[*]:-} " != *" $d "* ]] && sites+=("$d"); done; }
if [ -n "$PY" ]; then
  while IFS= read -r d; do add_site "$d"; done < <("$PY" -c 'import site,sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")]))' 2>/dev/null)
fi
if [ -n "$SITES" ]; then
  IFS=: read -r -a given <<<"$SITES"; add_site "${given[@]}"
else
  shopt -s nullglob
  add_site ${VIRTUAL_ENV:+"$VIRTUAL_ENV"/lib/python3*/site-packages} "$here"/.venv/lib/python3*/site-packages \
    /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages /usr/lib/python3/dist-packages \
    /usr/lib/python3*/site-packages /opt/conda/lib/python3*/site-packages "${HOME:-/nonexistent}"/.local/lib/python3*/site-packages
  shopt -u nullglob
fi
# ONNX Runtime: ORT_DYLIB_PATH, else the first onnxruntime wheel's library.
if [ -z "${ORT_DYLIB_PATH:-}" ]; then
  for s in "${sites[@]}"; do
    for f in "$s"/onnxruntime/capi/libonnxruntime.so.*; do [ -f "$f" ] && export ORT_DYLIB_PATH="$f" && break 2; done
  done
fi
ORT_DIR=""; ORT_VERSION=""
if [ -n "${ORT_DYLIB_PATH:-}" ] && [ -f "$ORT_DYLIB_PATH" ]; then
  ORT_DIR="$(dirname "$ORT_DYLIB_PATH")"
  ORT_VERSION="$(basename "$ORT_DYLIB_PATH" | sed -n 's/^libonnxruntime\.so\.\([0-9.]*\)$/\1/p')"
fi
NO_ORT="no ONNX Runtime library (ORT_DYLIB_PATH ${ORT_DYLIB_PATH:-unset}; no onnxruntime/capi/libonnxruntime.so.* in ${sites[*]:-no site-packages folder})"
[ -n "$ORT_DIR" ] || unset ORT_DYLIB_PATH
# The pip TensorRT and CUDA wheels keep their libraries in site-packages: put them on the
# loader's path (TENSORRT_ROOT first).
libdirs=()
[ -n "${TENSORRT_ROOT:-}" ] && libdirs+=("$TENSORRT_ROOT/lib" "$TENSORRT_ROOT")
for s in "${sites[@]}"; do
  for d in "$s"/tensorrt_libs "$s"/tensorrt_cu*_libs "$s"/nvidia/*/lib "$s"/nvidia/*/*/lib; do
    [ -d "$d" ] && libdirs+=("$d")
  done
done
for d in "${libdirs[@]}"; do LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
# TensorRT's library, as the loader would find it.
trt_lib=""
for d in "${libdirs[@]}"; do
  for v in 10 11; do [ -z "$trt_lib" ] && [ -e "$d/libnvinfer.so.$v" ] && trt_lib="$d/libnvinfer.so.$v"; done
done
[ -z "$trt_lib" ] && trt_lib="$(ldconfig -p 2>/dev/null | grep -o -m1 'libnvinfer\.so\.1[01] ' | sed 's/ $/ (ldconfig)/')"
NO_TRT="no TensorRT: libnvinfer.so.10 or .11 neither in \$TENSORRT_ROOT/lib (${TENSORRT_ROOT:-unset}), a pip tensorrt_libs folder, nor the ldconfig cache"
NO_PY="no python3 (set PYTHON or --python)${PY_BROKEN:+: $PY_BROKEN does not run}"

# --- step 0: what the image has ------------------------------------------------------------
smi_gpus=0
{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -a)"; echo "trtcache: $("$BIN" --version 2>&1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
    echo "nvidia-smi -L:"; nvidia-smi -L 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  echo "python: ${PY:-none} ${PY:+($("$PY" --version 2>&1))}"
  echo "site-packages searched: ${sites[*]:-none}"
  echo "onnxruntime library: ${ORT_DYLIB_PATH:-none}"
  [ -n "$ORT_DIR" ] && ls -l "$ORT_DIR" 2>&1 | grep -E 'libonnxruntime'
  echo "library folders put on LD_LIBRARY_PATH: ${libdirs[*]:-none}"
  echo "TensorRT library: ${trt_lib:-none}"
  command -v ldd >/dev/null || echo "ldd: not found (provider libraries are then checked by a Python session, or by the build, which registers providers with error_on_failure)"
  echo "ldconfig cache:"; (ldconfig -p 2>/dev/null | grep -E 'libnvinfer\.so|libnvonnxparser\.so|libcudart\.so|libcuda\.so' || echo "  none of libnvinfer, libnvonnxparser, libcudart, libcuda")
} >"$OUT/0-probe.txt" 2>&1
command -v nvidia-smi >/dev/null && smi_gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU [0-9]')"
smi_names="$(nvidia-smi -L 2>/dev/null | grep '^GPU [0-9]' | sed 's/^GPU [0-9]*: //; s/ (UUID.*//' | sort | uniq -c | sed 's/^ *//' | tr '\n' ',' | sed 's/,$//')"
ok 0 probe "nvidia-smi: $( [ "$smi_gpus" -gt 0 ] 2>/dev/null && echo "$smi_gpus GPU(s) ($smi_names)" || { command -v nvidia-smi >/dev/null && echo "no GPU listed" || echo "not found"; })\
; $( [ -n "$ORT_DIR" ] && echo "onnxruntime ${ORT_VERSION:-?} at $ORT_DYLIB_PATH" || echo "no onnxruntime library")\
; TensorRT: ${trt_lib:-none}; python: ${PY:-none}"

# --- step 1: the GPUs through trtcache (cudarc), against nvidia-smi's ---------------------------
GPU=0
if run 60 1-sku.json "$BIN" sku --json; then
  n="$(jcount "$OUT/1-sku.json" uuid)"
  if [ "${n:-0}" -gt 0 ] 2>/dev/null; then
    GPU=1
    note=""; [ "$smi_gpus" != "$n" ] && note="; nvidia-smi lists $smi_gpus"
    ok 1 sku "$n GPU(s): $(jlaststr "$OUT/1-sku.json" name) cc $(jlaststr "$OUT/1-sku.json" compute_capability)$note"
  else
    why="$(jstr "$OUT/1-sku.json" gpu_unavailable)"
    if [ "$smi_gpus" -gt 0 ] 2>/dev/null; then
      bad 1 sku "nvidia-smi lists $smi_gpus GPU(s) but trtcache sees none through the CUDA driver (${why:-no reason given})"
    else
      na 1 sku "no GPU through the CUDA driver (${why:-no reason given})"
    fi
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

# Whether ONNX Runtime's provider PROVIDER (library libonnxruntime_providers_LIB.so) can load:
# the library beside libonnxruntime, every library it needs found by the loader (ldd), and,
# when the Python has onnxruntime, a session that really has the provider. Prints why not.
provider_problem() { # PROVIDER LIB
  local p="$1" lib="$ORT_DIR/libonnxruntime_providers_$2.so" missing
  [ -n "$ORT_DIR" ] || { echo "$NO_ORT"; return; }
  [ -f "$lib" ] || { echo "the image's onnxruntime has no $p (no $(basename "$lib") beside $ORT_DYLIB_PATH)"; return; }
  if command -v ldd >/dev/null; then
    missing="$(LD_LIBRARY_PATH="$ORT_DIR:$LD_LIBRARY_PATH" ldd "$lib" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//; s/ =>.*//' | sort -u | tr '\n' ' ' | sed 's/ $//')"
    [ -n "$missing" ] && { echo "$p cannot load: $(basename "$lib") needs $missing (not found by the loader; LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"; return; }
  fi
  if py_has onnxruntime && [ "$GPU" = 1 ]; then
    run 300 "provider-$2.txt" "$PY" - "$p" "$MODELS/tiny_encoder_static.onnx" <<'PYEOF' || { echo "$p does not start in an ONNX Runtime session: $(tail -1 "$OUT/provider-$2.txt")"; return; }
import sys, onnxruntime as ort
p, model = sys.argv[1], sys.argv[2]
s = ort.InferenceSession(model, providers=[p])
print("session providers:", s.get_providers())
if p not in s.get_providers(): raise SystemExit(f"the session has {s.get_providers()}, not {p}")
PYEOF
  fi
}

# Builds every example with BACKEND, then serves them and warms them through the daemon (step
# STEP), then has a Python consumer acquire one and run it on PROVIDER (step STEPc).
build_and_consume() { # STEP NAME BACKEND PROVIDER SECONDS
  local step="$1" name="$2" backend="$3" provider="$4" secs="$5" b m nb=0 nf=0
  local cache="$WORK/cache-$backend" cname="consume-$backend"
  for m in "${models[@]}"; do
    b="$(basename "$m" .onnx)"
    if run "$secs" "$step-build-$b.json" "$BIN" build --backend "$backend" --cache-dir "$cache" --json "$m"; then nb=$((nb + 1)); else nf=$((nf + 1)); fi
  done
  if [ "$nf" != 0 ]; then
    bad "$step" "$name" "$nf of ${#models[@]} builds failed ($step-build-*.json)"
    na "${step}c" "$cname" "step $step failed"; return
  fi
  cat >"$WORK/$backend.toml" <<TOML
models = "$MODELS"
cache_dir = "$cache"
socket = "$WORK/$backend.sock"
backends = ["$backend"]
TOML
  "$BIN" serve --config "$WORK/$backend.toml" >"$OUT/$step-serve.log" 2>&1 &
  SERVE_PID=$!
  if ! run "$secs" "$step-warm.json" "$BIN" warm --config "$WORK/$backend.toml" --json --timeout "$secs"; then
    bad "$step" "$name" "$nb built, but warm through the daemon failed ($step-warm.json, $step-serve.log)"
    na "${step}c" "$cname" "step $step failed"
  else
    ok "$step" "$name" "$nb models built and validated, served and warmed"
    if ! py_has "numpy, onnxruntime"; then
      na "${step}c" "$cname" "$( [ -n "$PY" ] && echo "$PY has no onnxruntime or numpy" || echo "$NO_PY")"
    elif PYTHONPATH="$here/clients/python" run 120 "${step}c-consumer.txt" "$PY" - "$WORK/$backend.sock" "$provider" <<'PYEOF'
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
PYEOF
    then
      ok "${step}c" "$cname" "a consumer ran tiny_encoder_static on $provider"
    else
      bad "${step}c" "$cname" "the consumer failed: $(tail -1 "$OUT/${step}c-consumer.txt")"
    fi
  fi
  kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=""
}

# --- steps 3 and 3c: ort-cuda ----------------------------------------------------------------
# Each step lists everything it lacks, not just the first thing.
why=()
[ "$GPU" != 1 ] && why+=("$NO_GPU")
p="$(provider_problem CUDAExecutionProvider cuda)"; [ -n "$p" ] && why+=("$p")
if [ ${#why[@]} -gt 0 ]; then
  na 3 build-ort-cuda "$(join "${why[@]}")"; na 3c consume-ort-cuda "step 3 did not run"
else build_and_consume 3 build-ort-cuda ort-cuda CUDAExecutionProvider 150
fi

# --- steps 4 and 4c: ort-tensorrt -------------------------------------------------------------
why=()
[ "$GPU" != 1 ] && why+=("$NO_GPU")
[ -z "$trt_lib" ] && why+=("$NO_TRT")
p="$(provider_problem TensorrtExecutionProvider tensorrt)"; [ -n "$p" ] && why+=("$p")
if [ ${#why[@]} -gt 0 ]; then
  na 4 build-ort-tensorrt "$(join "${why[@]}")"; na 4c consume-ort-tensorrt "step 4 did not run"
else build_and_consume 4 build-ort-tensorrt ort-tensorrt TensorrtExecutionProvider 200
fi

# --- step 5: the native shim -----------------------------------------------------------------
shim="${TRTCACHE_TRT_SHIM:-$(dirname "$BIN")/libtrtcache_trt.so}"
shim_why=()
[ "$GPU" != 1 ] && shim_why+=("$NO_GPU")
[ -z "$trt_lib" ] && shim_why+=("$NO_TRT")
[ ! -f "$shim" ] && shim_why+=("no shim at $shim (set TRTCACHE_TRT_SHIM, or see docs/trt.md to build one)")
why=("${shim_why[@]}")
if [ -z "$PY" ]; then why+=("$NO_PY: nothing to drive the shim")
elif ! py_has "numpy, onnxruntime"; then why+=("$PY has no numpy or onnxruntime to drive the shim and compare")
fi
if [ ${#why[@]} -gt 0 ]; then na 5 trt-native "$(join "${why[@]}")"
else
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

# --- steps 6 and 6d: the trt backend through trtcache -------------------------------------------
# No Python needed: build --backend trt (validated against ONNX Runtime CPU), the same build
# again (a cache hit), inspect --trt (the parser's verdict beside the table's), export
# --triton-repo; then (6d) the plan deserialized by TensorRT's own Python runtime.
why=("${shim_why[@]}")
[ -z "$ORT_DIR" ] && why+=("$NO_ORT (the build validates against ONNX Runtime CPU)")
step6=0
if [ ${#why[@]} -gt 0 ]; then na 6 trt-backend "$(join "${why[@]}")"
else
  export TRTCACHE_TRT_SHIM="$shim"
  c6="$WORK/cache-trt"; m6="$MODELS/tiny_encoder_static.onnx"
  if ! runj 300 6-build-trt "$BIN" build --backend trt --cache-dir "$c6" --json "$m6"; then
    bad 6 trt-backend "trtcache build --backend trt failed ($(tail -1 "$OUT/6-build-trt.log"))"
  elif ! runj 120 6-build-trt-again "$BIN" build --backend trt --cache-dir "$c6" --json "$m6" \
      || ! jtrue "$OUT/6-build-trt-again.json" cache_hit; then
    bad 6 trt-backend "the second build was not a cache hit (6-build-trt-again.json)"
  elif ! runj 120 6-inspect-trt "$BIN" inspect --trt --json "$m6"; then
    bad 6 trt-backend "inspect --trt failed ($(tail -1 "$OUT/6-inspect-trt.log"))"
  elif ! run 60 6-export.txt "$BIN" export --triton-repo "$OUT/6-triton" --cache-dir "$c6"; then
    bad 6 trt-backend "export --triton-repo failed ($(tail -1 "$OUT/6-export.txt"))"
  else
    step6=1
    ok 6 trt-backend "built and validated (max abs error $(jmax "$OUT/6-build-trt.json" max_abs)), cache hit, inspect --trt: $(jmax "$OUT/6-inspect-trt.json" disagreements) disagreement(s), exported to 6-triton"
  fi
fi
plan="$(jstr "$OUT/6-build-trt.json" entry)"
if [ "$step6" != 1 ]; then na 6d trt-deserialize "step 6 did not pass"
elif [ -z "$PY" ]; then na 6d trt-deserialize "$NO_PY"
elif ! py_has tensorrt; then na 6d trt-deserialize "$PY has no tensorrt package"
elif [ ! -f "$plan" ]; then bad 6d trt-deserialize "no plan at '$plan' (the artifact entry in 6-build-trt.json)"
elif run 120 6d-deserialize.txt "$PY" - "$plan" <<'PYEOF'
import sys, tensorrt as trt
engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(open(sys.argv[1], "rb").read())
if engine is None: raise SystemExit("deserialize_cuda_engine returned None")
print("deserialized by tensorrt", trt.__version__, "with", engine.num_io_tensors, "I/O tensors")
PYEOF
then ok 6d trt-deserialize "$(tail -1 "$OUT/6d-deserialize.txt")"
else bad 6d trt-deserialize "$(tail -1 "$OUT/6d-deserialize.txt")"
fi

say "gpu-check: $( [ "$failed" = 0 ] && echo 'no step failed' || echo 'some steps FAILED' ) (results in $OUT)"
exit "$failed"
