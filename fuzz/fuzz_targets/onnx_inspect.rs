//! ONNX decoding + `inspect` facts on arbitrary bytes: must never panic, hang or blow up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trtcache::onnx::{facts::facts, Model};

fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(model) = Model::from_bytes("/nonexistent/fuzz.onnx", bytes) {
        let _ = facts(&model, &trtcache::cli::opset_bounds());
    }
});
