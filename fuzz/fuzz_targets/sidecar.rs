//! The sidecar (`MODEL.trtcache.toml`) parser and profile validation on arbitrary text,
//! against the tiny encoder's inputs. Must never panic.
//! The body lives in `trtcache::fuzzing`, shared with the regression test that replays
//! `fuzz/regressions/sidecar/`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trtcache::fuzzing::sidecar(data));
