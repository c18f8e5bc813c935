//! The `ort-cpu` backend's room: its graph passes ([`passes`]).

pub mod passes;
