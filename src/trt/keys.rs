//! What a `trt` artifact's key depends on beyond the model and profile: the TensorRT version
//! of the *loaded* library, the shim's C API version, the hardware-compatibility level and
//! the builder options, and the SKU (exact GPU unless a hardware-compatibility level widens it
//! to a compute-capability class). Plain values the key stage puts into
//! [`crate::key::KeyParts`] (`backend.versions`, `sku`, `options`).

use std::collections::BTreeMap;

use super::api::Trt;
use super::types::{BuildOptions, HwCompat, TrtVersion};
use crate::device::Sku;

/// The backend's library versions: `tensorrt` (from `getInferLibVersion` of the loaded
/// library, never from a file name) and `trtcache-trt-abi`.
pub fn backend_versions(trt: &Trt) -> BTreeMap<String, String> {
    versions_for(trt.version())
}

/// [`backend_versions`] for a known version.
pub fn versions_for(v: TrtVersion) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("tensorrt".to_string(), v.to_string()),
        (
            "trtcache-trt-abi".to_string(),
            super::ffi::TRTCACHE_TRT_ABI_VERSION.to_string(),
        ),
    ])
}

/// The SKU a key records: the GPU exactly (name, compute capability, SMs) without a
/// hardware-compatibility level; with one, the class of GPUs the engine runs on, so hosts of
/// that class share the artifact.
pub fn key_sku(gpu: &Sku, hw: HwCompat) -> Sku {
    match hw {
        HwCompat::None => gpu.clone(),
        HwCompat::AmperePlus => Sku {
            kind: "gpu".into(),
            name: "compute-class:ampere-plus".into(),
            compute_capability: Some(">=8.0".into()),
            sm_count: None,
            isa: Vec::new(),
        },
        HwCompat::SameComputeCapability => {
            let cc = gpu.compute_capability.clone().unwrap_or_default();
            Sku {
                kind: "gpu".into(),
                name: format!("compute-capability:{cc}"),
                compute_capability: Some(cc),
                sm_count: None,
                isa: Vec::new(),
            }
        }
    }
}

/// The builder options as canonical strings (`trt.` prefixed, every field present, so a new
/// default never aliases an old key). The timing cache is not part of the key: it changes
/// which tactics are timed, not what the engine computes, and validation checks every
/// engine.
pub fn key_options(o: &BuildOptions) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("trt.precision".into(), o.precision.canonical()),
        (
            "trt.workspace_bytes".into(),
            o.workspace_bytes
                .map_or_else(|| "default".into(), |b| b.to_string()),
        ),
        (
            "trt.builder_optimization_level".into(),
            o.builder_optimization_level
                .map_or_else(|| "default".into(), |l| l.to_string()),
        ),
        (
            "trt.hardware_compatibility".into(),
            o.hardware_compatibility.name().to_string(),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> Sku {
        Sku {
            kind: "gpu".into(),
            name: "NVIDIA H200".into(),
            compute_capability: Some("9.0".into()),
            sm_count: Some(132),
            isa: vec![],
        }
    }

    #[test]
    fn sku_is_exact_unless_hardware_compatible() {
        assert_eq!(key_sku(&h200(), HwCompat::None), h200());
        let h100 = Sku {
            name: "NVIDIA H100 80GB HBM3".into(),
            ..h200()
        };
        let same = key_sku(&h200(), HwCompat::SameComputeCapability);
        assert_eq!(same, key_sku(&h100, HwCompat::SameComputeCapability));
        assert_eq!(same.name, "compute-capability:9.0");
        assert_ne!(same, key_sku(&h200(), HwCompat::AmperePlus));
        let a100 = Sku {
            name: "NVIDIA A100".into(),
            compute_capability: Some("8.0".into()),
            sm_count: Some(108),
            ..h200()
        };
        assert_eq!(
            key_sku(&a100, HwCompat::AmperePlus),
            key_sku(&h200(), HwCompat::AmperePlus)
        );
    }

    #[test]
    fn every_option_changes_the_options() {
        let base = BuildOptions::default();
        let o = key_options(&base);
        assert_eq!(o["trt.precision"], "fp32");
        assert_eq!(o["trt.workspace_bytes"], "default");
        for changed in [
            BuildOptions {
                workspace_bytes: Some(1 << 30),
                ..base.clone()
            },
            BuildOptions {
                builder_optimization_level: Some(5),
                ..base.clone()
            },
            BuildOptions {
                hardware_compatibility: HwCompat::AmperePlus,
                ..base.clone()
            },
            BuildOptions {
                precision: super::super::Precision::parse("fp16").unwrap(),
                ..base.clone()
            },
        ] {
            assert_ne!(key_options(&changed), o, "{changed:?}");
        }
        // The timing cache is not part of the key.
        let with_cache = BuildOptions {
            timing_cache: vec![1, 2, 3],
            ..base.clone()
        };
        assert_eq!(key_options(&with_cache), o);
        assert_eq!(
            versions_for(TrtVersion::from_raw(101601))["tensorrt"],
            "10.16.1"
        );
    }
}
