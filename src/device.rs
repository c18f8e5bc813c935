//! The device SKU an artifact is built for: GPU (name, compute capability, SMs, memory,
//! driver) through cudarc's dynamic loading, or, without a driver or GPU, the CPU (vendor,
//! model, the ISA flags that change kernels).

use serde::{Deserialize, Serialize};

/// What an artifact is specific to. Only the fields that change generated code are part of
/// the cache key (see `key_fields`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sku {
    /// `gpu` or `cpu`.
    pub kind: String,
    /// GPU name or CPU model name.
    pub name: String,
    /// GPU compute capability `major.minor`.
    pub compute_capability: Option<String>,
    pub sm_count: Option<u32>,
    /// CPU ISA flags that change kernels (avx2, avx512f, avx512_vnni, amx…), sorted.
    pub isa: Vec<String>,
}
