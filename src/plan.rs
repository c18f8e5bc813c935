//! Stage 3: the build plan's parts that users choose: shape profiles (min/opt/max per dynamic
//! input, from a `MODEL.trtcache.toml` sidecar or trtexec-style flags) and precision.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Numeric precision of a build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Fp16,
}

/// One named optimisation profile: per input name, the min/opt/max shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeProfile {
    pub name: String,
    pub min: BTreeMap<String, Vec<i64>>,
    pub opt: BTreeMap<String, Vec<i64>>,
    pub max: BTreeMap<String, Vec<i64>>,
}
