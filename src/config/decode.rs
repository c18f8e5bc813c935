//! The decode budget: bounds on what decoding one model may allocate, set from `[limits]`
//! and checked by `onnx::budget` before prost decodes anything.

/// Bounds on what decoding one model may allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecodeLimits {
    /// Nodes in the graph, every subgraph and every function body.
    pub max_nodes: u64,
    /// Node attributes, everywhere.
    pub max_attributes: u64,
    /// Tensors (initializers, attribute tensors, sparse parts).
    pub max_tensors: u64,
    /// Estimated decoded size: `base_bytes` plus `per_file_byte` times the file's size.
    pub base_bytes: u64,
    pub per_file_byte: u64,
}

/// This process's limits when set ([`DecodeLimits::set_process_default`]).
static PROCESS_DEFAULT: std::sync::OnceLock<DecodeLimits> = std::sync::OnceLock::new();

impl DecodeLimits {
    /// Makes `limits` what [`DecodeLimits::default`] (and so every load with default
    /// options) uses in this process: the config file's `[limits]`, set once at start by
    /// the commands that read it, and passed on to build workers. A second call is ignored.
    pub fn set_process_default(limits: DecodeLimits) {
        let _ = PROCESS_DEFAULT.set(limits);
    }

    /// The built-in limits (what a config file without `decode_*` settings gives).
    pub fn builtin() -> Self {
        // A 20,000-node graph decodes to about 3 bytes per file byte; the 10 MB amplification
        // file to 670. 16x plus 256 MiB leaves every real model far inside.
        Self {
            max_nodes: 10_000_000,
            max_attributes: 50_000_000,
            max_tensors: 10_000_000,
            base_bytes: 256 << 20,
            per_file_byte: 16,
        }
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        PROCESS_DEFAULT
            .get()
            .copied()
            .unwrap_or_else(DecodeLimits::builtin)
    }
}
