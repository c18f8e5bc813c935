# The README's two commands: `make run` and `make test`.
.PHONY: run test setup models lint bench

setup:
	scripts/setup-python.sh

# Inspect the example models (the daemon replaces this once it lands).
run: setup
	cargo build --release
	for m in examples/models/*.onnx; do ./target/release/trtcache inspect "$$m"; done

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

# Start the daemon on the example models with the defaults (cache in cache/, socket
# cache/trtcache.sock); Ctrl-C stops it. See docs/daemon.md.
.PHONY: serve
serve: setup
	cargo build --release
	eval "$$(scripts/ort-env.sh)" && ./target/release/trtcache serve
