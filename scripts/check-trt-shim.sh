#!/usr/bin/env bash
# Compiles the TensorRT shim (shim/trtcache_trt.cpp) against the TensorRT and CUDA headers given,
# with -Wall -Wextra -Werror (warnings from the shim's own code) apart from TensorRT's own deprecation warnings, into a shared
# library with undefined symbols allowed (nothing is linked: no TensorRT library is needed).
#
#   scripts/check-trt-shim.sh TRT_INCLUDE CUDA_INCLUDE... [-- EXTRA_CXXFLAGS...]
#
# TRT_INCLUDE holds NvInfer.h and NvOnnxParser.h; each CUDA_INCLUDE is a folder with CUDA
# runtime headers (cuda_runtime_api.h, crt/host_defines.h). The headers are not part of this
# repository; docs/trt.md says where they come from. Exit 0 when it compiles; the compiler's
# output otherwise. CXX (default g++) picks the compiler, OUT_SO where the library goes
# (default: a temp file, removed). With SHIM_NEEDED=1 the library also records its
# dependencies (libnvinfer.so.MAJOR, libnvonnxparser.so.MAJOR, libcudart.so.CUDA_MAJOR, the
# CUDA major read from the given CUDA headers' CUDART_VERSION) by linking
# against empty stand-ins with those sonames, so a shim built here (without TensorRT's
# libraries) loads them by itself on a GPU host.
set -euo pipefail
usage() { echo "usage: $0 TRT_INCLUDE CUDA_INCLUDE... [-- EXTRA_CXXFLAGS...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
root="$(cd "$(dirname "$0")/.." && pwd)"
trt="$1"; shift
[ -f "$trt/NvInfer.h" ] || { echo "check-trt-shim: $trt/NvInfer.h not found" >&2; exit 2; }
[ -f "$trt/NvOnnxParser.h" ] || { echo "check-trt-shim: $trt/NvOnnxParser.h not found" >&2; exit 2; }
# TensorRT's and CUDA's headers are system headers: their own warnings (TensorRT 10.16's
# unused parameters under -Wextra) are not the shim's.
incs=(-I"$root/include" -isystem "$trt")
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  [ -d "$1" ] || { echo "check-trt-shim: $1 is not a folder" >&2; exit 2; }
  incs+=(-isystem "$1"); shift
done
[ "${1:-}" = "--" ] && shift
cxx="${CXX:-g++}"
out="${OUT_SO:-}"
tmp=""
if [ -z "$out" ]; then tmp="$(mktemp -d)"; out="$tmp/libtrtcache_trt.so"; fi
trap '[ -n "$tmp" ] && rm -rf "$tmp"' EXIT
# The headers' own version, as the preprocessor sees it (10.0-10.13 define NV_TENSORRT_MAJOR
# directly, 10.14+ through TRT_MAJOR_ENTERPRISE).
read -r major minor patch < <(printf '#include <NvInferVersion.h>\nNV_TENSORRT_MAJOR NV_TENSORRT_MINOR NV_TENSORRT_PATCH\n' \
  | "${CXX:-g++}" -E -P -x c++ -isystem "$trt" - 2>/dev/null | tail -1) || true
# The CUDA runtime's major, from the CUDA headers given (CUDART_VERSION 12090 -> 12): the
# soname the shim needs (libcudart.so.13 for a CUDA 13 host, .12 for CUDA 12).
cudart=$(printf '#include <cuda_runtime_api.h>\nCUDART_VERSION\n' \
  | "${CXX:-g++}" -E -P -x c++ "${incs[@]}" - 2>/dev/null | tail -1 | tr -dc '0-9') || true
cuda_major=$(( ${cudart:-12000} / 1000 ))
echo "check-trt-shim: TensorRT headers ${major:-?}.${minor:-?}.${patch:-?} in $trt; CUDA runtime headers ${cudart:-?} (libcudart.so.$cuda_major); $("$cxx" --version | head -1)"
link=()
if [ "${SHIM_NEEDED:-0}" = 1 ]; then
  stubs="$(mktemp -d)"; trap '[ -n "$tmp" ] && rm -rf "$tmp"; rm -rf "$stubs"' EXIT
  echo 'void trtcache_stub(void) {}' >"$stubs/stub.c"
  for so in "libnvinfer.so.${major:-10}" "libnvonnxparser.so.${major:-10}" "libcudart.so.$cuda_major"; do
    "${CC:-cc}" -shared -fPIC "$stubs/stub.c" -Wl,-soname,"$so" -o "$stubs/$so"
  done
  link=(-Wl,--no-as-needed -L"$stubs" -l:"libnvinfer.so.${major:-10}" -l:"libnvonnxparser.so.${major:-10}" -l:"libcudart.so.$cuda_major")
fi
set -x
"$cxx" -std=c++17 -O1 -fPIC -shared -Wall -Wextra -Werror -Wno-deprecated-declarations \
  "${incs[@]}" "$@" "$root/shim/trtcache_trt.cpp" -o "$out" "${link[@]}"
{ set +x; } 2>/dev/null
# Every function the header declares must be exported (the loader requires all of them).
missing="$(comm -23 <(grep -oE '\btrtcache_trt_[a-z0-9_]+\(' "$root/include/trtcache_trt.h" | tr -d '(' | sort -u) \
  <(nm -D --defined-only "$out" | awk '{print $3}' | sort -u))"
if [ -n "$missing" ]; then echo "check-trt-shim: the shim does not export: $missing" >&2; exit 1; fi
echo "check-trt-shim: OK ($(wc -c <"$out") bytes, $(grep -cE '^trtcache_trt_' <(nm -D --defined-only "$out" | awk '{print $3}')) C API functions exported, $(nm -D --undefined-only "$out" | grep -c -E 'createInferBuilder|createNvOnnxParser|getInferLibVersion|createInferRuntime|cuda') TensorRT/CUDA symbols left to the loader)"
