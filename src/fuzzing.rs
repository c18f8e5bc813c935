//! The bodies of the fuzz targets in `fuzz/`, kept in the library so that the libFuzzer
//! targets and the regression test (`tests/it/fuzz_regressions.rs`, which replays every input
//! kept under `fuzz/regressions/TARGET/`) run exactly the same code. Each function must return
//! for any input: no panic, no hang, bounded memory.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::OnceLock;

use crate::analysis::{analyse, tables::TrtTable, Options};
use crate::onnx::{facts::facts, Model};
use crate::plan::{validate_profile, ModelInputs, Sidecar};

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// The fuzz targets, by the name `cargo fuzz run` takes.
pub const TARGETS: [(&str, Target); 3] = [
    ("onnx_inspect", onnx_inspect),
    ("protocol_request", protocol_request),
    ("sidecar", sidecar),
];

/// The frame-size limit the protocol target decodes with (the daemon's default is larger;
/// a small one makes "too large" reachable from short inputs).
const FUZZ_MAX_FRAME: u32 = 4096;

/// The longest input the protocol target streams through a socketpair.
const STREAM_MAX: usize = 64 << 10;

fn table() -> &'static TrtTable {
    static T: OnceLock<TrtTable> = OnceLock::new();
    T.get_or_init(|| TrtTable::load("10.15").expect("bundled table"))
}

/// ONNX decoding + `inspect` facts + capability analysis (shapes, data-dependent shapes,
/// partitioning) + the `ort-cpu` build's graph rewrites on arbitrary bytes. A rewritten
/// graph must read only names that exist (a graph input, an initializer or an earlier
/// node's output) wherever the original did.
pub fn onnx_inspect(data: &[u8]) {
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(model) = Model::from_bytes("/nonexistent/fuzz.onnx", bytes) {
        let _ = facts(&model, &crate::cli::opset_bounds(table()));
        let _ = analyse(&model, &Options::default());
        if let Some(r) = crate::builder::backends::ort_cpu::passes::apply(&model.proto) {
            assert!(
                !reads_defined(&model.proto) || reads_defined(&r.model),
                "a rewrite reads a name nothing defines"
            );
        }
        if let Some(e) = crate::builder::backends::ort_cpu::passes::exact_reference(&model.proto) {
            assert!(!reads_defined(&model.proto) || reads_defined(&e));
        }
    }
}

/// Whether every top-level node reads only names defined before it (graph inputs,
/// initializers, earlier outputs; empty names are absent optional inputs).
fn reads_defined(m: &crate::onnx::proto::ModelProto) -> bool {
    let Some(g) = m.graph.as_ref() else {
        return true;
    };
    let mut defined: std::collections::HashSet<&str> = g
        .input
        .iter()
        .map(|v| v.name.as_str())
        .chain(g.initializer.iter().map(|t| t.name.as_str()))
        .collect();
    for n in &g.node {
        if n.input
            .iter()
            .any(|i| !i.is_empty() && !defined.contains(i.as_str()))
        {
            return false;
        }
        defined.extend(n.output.iter().map(String::as_str));
    }
    true
}

/// The wire protocol as the daemon reads it: the input is a byte stream on a socket, split
/// into length-prefixed frames by the client crate's frame reader (oversized and truncated
/// frames included), each body parsed by the daemon's request parser, every parsed request
/// re-encoded, and every string checked as a model name. The same text as a ready-index
/// pointer (`trtcache_client::ready`, read by the clients): a pointer that parses and can be
/// written again must read back as itself.
pub fn protocol_request(data: &[u8]) {
    // The whole input is written before anything is read: it must fit in the socketpair's
    // buffer (about 200 KiB here) or the write would block; `fuzz/run.sh` caps inputs at
    // 64 KiB. The write end is then closed so the reader sees the end of the stream.
    if data.len() <= STREAM_MAX {
        let Ok((mut w, r)) = UnixStream::pair() else {
            return;
        };
        if w.write_all(data).is_ok() {
            drop(w);
            while let Ok((body, _fds)) = trtcache_client::frame::read_frame(&r, FUZZ_MAX_FRAME) {
                if let Ok(req) = crate::daemon::parse_request(&body) {
                    let _ = serde_json::to_vec(&req);
                }
            }
        }
    }
    if let Ok(req) = crate::daemon::parse_request(data) {
        let _ = serde_json::to_vec(&req);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = trtcache_client::protocol::valid_model_name(s);
        if let Ok(p) = trtcache_client::ready::ReadyPointer::parse(s) {
            if let Some(text) = p.render() {
                let again = trtcache_client::ready::ReadyPointer::parse(&text);
                assert_eq!(again.as_ref(), Ok(&p), "a rendered pointer reads back");
            }
        }
    }
}

fn inputs() -> &'static ModelInputs {
    static INPUTS: OnceLock<ModelInputs> = OnceLock::new();
    INPUTS.get_or_init(|| {
        let bytes = prost::Message::encode_to_vec(&crate::fixtures::models::tiny_encoder(false));
        let model = Model::from_bytes("/nonexistent/m.onnx", bytes.into()).expect("fixture loads");
        ModelInputs::of(&model)
    })
}

/// The sidecar (`MODEL.trtcache.toml`) parser, and every profile it names validated against
/// the tiny encoder's inputs, on arbitrary text.
pub fn sidecar(data: &[u8]) {
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
}
