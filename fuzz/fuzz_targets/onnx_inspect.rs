//! ONNX decoding + `inspect` facts + capability analysis on arbitrary bytes: must never
//! panic, hang or blow up.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trtcache::analysis::{analyse, tables::TrtTable, Options};
use trtcache::onnx::{facts::facts, Model};

fn table() -> &'static TrtTable {
    static T: OnceLock<TrtTable> = OnceLock::new();
    T.get_or_init(|| TrtTable::load("10.15").expect("bundled table"))
}

fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(model) = Model::from_bytes("/nonexistent/fuzz.onnx", bytes) {
        let _ = facts(&model, &trtcache::cli::opset_bounds(table()));
        let _ = analyse(&model, &Options::default());
    }
});
