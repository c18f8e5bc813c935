//! The wire protocol on arbitrary bytes: the stream split into length-prefixed frames by the
//! client crate's frame reader, each body through the daemon's request parser, then the
//! model-name check every named request goes through. Must never panic.
//! The body lives in `trtcache::fuzzing`, shared with the regression test that replays
//! `fuzz/regressions/protocol_request/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trtcache::fuzzing::protocol_request(data));
