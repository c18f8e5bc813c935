//! `[trt]`: the native TensorRT backend's builder settings for the daemon (docs/trt.md).

use serde::{Deserialize, Serialize};

/// The `trt` backend's builder settings for the daemon (`trtcache build` has them as flags:
/// `--trt-hardware-compat`, `--trt-workspace`, `--trt-opt-level`). All are key parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrtSettings {
    /// `none` (the engine runs on the GPU model it was built on), `ampere-plus` or
    /// `same-compute-capability`.
    pub hardware_compatibility: String,
    /// Builder workspace limit in bytes; 0 keeps TensorRT's default (the device's memory).
    pub workspace_bytes: u64,
    /// Builder optimization level, 0–5 (also used by `ort-tensorrt`).
    pub builder_optimization_level: u8,
}

impl Default for TrtSettings {
    fn default() -> Self {
        Self {
            hardware_compatibility: "none".into(),
            workspace_bytes: 0,
            builder_optimization_level: 3,
        }
    }
}
