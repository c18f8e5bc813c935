//! The daemon's request decoding on arbitrary frame bodies: JSON → typed `Request`, then the
//! model-name check every named request goes through. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trtcache_client::protocol::{valid_model_name, Request};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(req) = serde_json::from_value::<Request>(v) {
            let _ = serde_json::to_vec(&req);
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = valid_model_name(s);
    }
});
