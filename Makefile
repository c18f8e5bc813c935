# The README's two commands: `make run` and `make test`.
.PHONY: run serve test setup models lint bench fuzz gpu-bundle

setup:
	scripts/setup-python.sh

# The daemon on the example models with the defaults: models from examples/models, cache in
# cache/, socket cache/trtcache.sock. Ctrl-C (SIGTERM) stops it cleanly. See docs/daemon.md.
run: setup
	cargo build --release
	eval "$$(scripts/ort-env.sh)" && ./target/release/trtcache serve

serve: run

test: setup
	eval "$$(scripts/ort-env.sh)" && cargo test --workspace --all-targets

lint:
	cargo fmt --all --check
	cargo clippy --all-targets -- -D warnings

# Regenerate the example models (the custom-domain one goes to examples/inspect: ONNX Runtime
# cannot run its op, so it is an `inspect` example, not a served one).
models:
	cargo run --release --example make_models -- examples/models
	mv examples/models/custom_domain.onnx examples/inspect/custom_domain.onnx

# Every benchmark script; numbers go to BENCHMARKS.md by hand.
bench: setup
	benches/inspect.sh
	benches/capability.sh
	benches/key.sh
	benches/session.sh --runs 7 --cases bert,chain,bert20k-static
	benches/daemon.sh

fuzz:
	fuzz/run.sh 60

# The 10-minute soak (not part of `test`): see RELIABILITY.md and docs/daemon.md.
soak: setup
	benches/soak.sh --minutes 10

# The carryable bundle for a GPU machine (docs/trt.md, "The GPU check"): the release binary
# with its line tables stripped (113 MB -> ~20 MB), the shim when build.rs built one, its
# sources and build script, scripts/gpu-check.sh, the example models and the Python client, in
# target/gpu-bundle/; it fails when the bundle is over BUNDLE_MAX bytes (64 MiB, what can be
# carried to a GPU machine). BUNDLE_PROFILE=debug bundles target/debug's binary instead.
BUNDLE_PROFILE ?= release
BUNDLE_DIR ?= target/gpu-bundle
BUNDLE_MAX ?= 67108864
gpu-bundle:
	cargo build --bin trtcache $(if $(filter release,$(BUNDLE_PROFILE)),--release,)
	rm -rf $(BUNDLE_DIR)
	mkdir -p $(BUNDLE_DIR)/scripts $(BUNDLE_DIR)/examples $(BUNDLE_DIR)/clients
	strip --strip-debug -o $(BUNDLE_DIR)/trtcache target/$(BUNDLE_PROFILE)/trtcache
	if [ -f target/$(BUNDLE_PROFILE)/libtrtcache_trt.so ]; then cp target/$(BUNDLE_PROFILE)/libtrtcache_trt.so $(BUNDLE_DIR)/; fi
	cp -r include shim $(BUNDLE_DIR)/
	cp scripts/gpu-check.sh scripts/check-trt-shim.sh $(BUNDLE_DIR)/scripts/
	cp -r examples/models $(BUNDLE_DIR)/examples/
	cp -r clients/python $(BUNDLE_DIR)/clients/
	find $(BUNDLE_DIR) -name __pycache__ -prune -exec rm -rf {} +
	printf '%s\n' \
	  'trtcache GPU bundle ($(BUNDLE_PROFILE) build of $(shell git describe --always --dirty 2>/dev/null)).' \
	  'Run from this folder: OUT=/tmp/gpu-check scripts/gpu-check.sh   (one line per step in $$OUT/summary.txt).' \
	  'Only ./trtcache and the script are needed; Python, onnxruntime-gpu, TensorRT (pip tensorrt_libs or TENSORRT_ROOT)' \
	  'and the CUDA wheels are used when the image has them. A shim without TensorRT libraries here:' \
	  'SHIM_NEEDED=1 OUT_SO=libtrtcache_trt.so scripts/check-trt-shim.sh TRT/include CUDA/include ... (docs/trt.md).' \
	  >$(BUNDLE_DIR)/README
	@size=$$(du -sb $(BUNDLE_DIR) | cut -f1); \
	if [ "$$size" -gt $(BUNDLE_MAX) ]; then \
	  echo "gpu-bundle: $(BUNDLE_DIR) is $$size bytes, over the $(BUNDLE_MAX) that can be carried"; exit 1; \
	else echo "gpu-bundle: $(BUNDLE_DIR) is $$size bytes (limit $(BUNDLE_MAX))"; fi
