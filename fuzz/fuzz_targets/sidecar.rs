//! The sidecar (`MODEL.trtcache.toml`) parser and profile validation on arbitrary text,
//! against the tiny encoder's inputs. Must never panic.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use trtcache::onnx::Model;
use trtcache::plan::{validate_profile, ModelInputs, Sidecar};

fn inputs() -> &'static ModelInputs {
    static INPUTS: OnceLock<ModelInputs> = OnceLock::new();
    INPUTS.get_or_init(|| {
        let bytes = prost::Message::encode_to_vec(&trtcache::fixtures::models::tiny_encoder(false));
        let model = Model::from_bytes("/nonexistent/m.onnx", bytes.into()).expect("fixture loads");
        ModelInputs::of(&model)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = Sidecar::parse(Path::new("/nonexistent/m.trtcache.toml"), text) {
        for name in s.profiles.keys() {
            if let Ok(Some(p)) = s.profile(Some(name)) {
                let _ = validate_profile(inputs(), &p);
            }
        }
        let _ = s.profile(None);
    }
});
