//! Integration tests: one binary, one module per stage. Each module works in temp dirs with
//! real files, the real `trtcache` binary and, where it needs them, the project's Python
//! environment (`scripts/setup-python.sh`) as the reference implementation.

mod analysis;
mod build;
mod clients;
mod corpus;
mod daemon;
mod daemon_engine;
mod daemon_models;
mod daemon_system;
mod deploy;
mod fuzz_regressions;
mod gpu_check;
mod half_outputs;
mod keys;
mod layering;
mod modgraph;
mod onnx_load;
mod ops;
mod quantized_outputs;
mod readme;
mod ready_index;
mod ready_trust;
mod reliability_crash;
mod reliability_faults;
mod reliability_files;
mod reliability_hostile;
mod reliability_races;
mod reliability_store;
mod reliability_worker;
mod remote;
mod remote_faults;
mod runtimes;
mod support;
mod trt;
mod trt_backend;
mod trt_loader;
mod trt_runtimes;
mod trust_host;
mod validation_inputs;
mod watch;
