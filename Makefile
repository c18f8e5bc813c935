# The README's two commands: `make run` and `make test`.
.PHONY: run serve test setup models lint bench fuzz

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
