//! ONNX decoding + `inspect` facts + capability analysis on arbitrary bytes: must never
//! panic, hang or blow up.
//! The body lives in `trtcache::fuzzing`, shared with the regression test that replays
//! `fuzz/regressions/onnx_inspect/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trtcache::fuzzing::onnx_inspect(data));
