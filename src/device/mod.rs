//! Stage 4: the device SKU an artifact is built for: GPU (name, compute capability, SMs, memory,
//! driver) through cudarc's dynamic loading, or, without a driver or GPU, the CPU (vendor,
//! model, the ISA flags that change kernels).
//!
//! Data enters from the CUDA driver (`libcuda`, loaded at run time only when present) and from
//! `/proc/cpuinfo`; it leaves as a [`DeviceReport`] (everything found, for `trtcache sku`) and
//! the [`Sku`] that goes into cache keys. [`detect`] never panics: a missing driver, a driver
//! without devices or an unreadable cpuinfo become a reason string in the report.

mod cpu;
pub(crate) mod gpu;

use serde::{Deserialize, Serialize};

pub use cpu::{cpu_info, parse_cpuinfo, CpuInfo, KERNEL_ISA_FLAGS};
pub use gpu::{gpu_devices, GpuDevice, GpuError};

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

/// Everything [`detect`] found: every GPU, the CPU, and the SKUs used for keys.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    /// GPUs seen through the CUDA driver, by ordinal.
    pub gpus: Vec<GpuDevice>,
    /// Why no GPU is listed (no libcuda, cuInit failed, no device…); `None` when GPUs exist.
    pub gpu_unavailable: Option<String>,
    /// The GPU ordinal keys are made for (`TRTCACHE_DEVICE` or 0), when it exists.
    pub selected_gpu: Option<usize>,
    /// The host CPU.
    pub cpu: CpuInfo,
    /// The SKU used for keys by default: the selected GPU's, else the CPU's.
    pub sku: Sku,
}

impl DeviceReport {
    /// The CPU SKU (used by CPU backends even on GPU hosts).
    pub fn cpu_sku(&self) -> Sku {
        self.cpu.sku()
    }

    /// The selected GPU's SKU, or why there is none.
    pub fn gpu_sku(&self) -> Result<Sku, String> {
        match self.selected_gpu.and_then(|i| self.gpus.get(i)) {
            Some(g) => Ok(g.sku()),
            None => Err(self
                .gpu_unavailable
                .clone()
                .unwrap_or_else(|| "the selected GPU does not exist".into())),
        }
    }
}

pub use crate::config::DEVICE_ENV;

/// Detects GPUs (when a CUDA driver is present) and the CPU; never panics. The selected GPU
/// is the configured ordinal ([`crate::config::gpu_ordinal`]: `TRTCACHE_DEVICE`, else 0).
pub fn detect() -> DeviceReport {
    detect_with(crate::config::gpu_ordinal())
}

/// [`detect`] with an explicit ordinal (`Err(text)` when the configured value is not one).
pub fn detect_with(ordinal: Result<usize, String>) -> DeviceReport {
    let cpu = cpu_info();
    let (gpus, mut gpu_unavailable) = match gpu_devices() {
        Ok(g) if g.is_empty() => (g, Some("the CUDA driver reports no devices".to_string())),
        Ok(g) => (g, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let selected_gpu = match ordinal {
        Ok(i) if i < gpus.len() => Some(i),
        Ok(i) => {
            if !gpus.is_empty() {
                gpu_unavailable = Some(format!(
                    "GPU ordinal {i} ({DEVICE_ENV} or --device) but only {} GPU(s) exist (ordinals 0..{})",
                    gpus.len(),
                    gpus.len() - 1
                ));
            }
            None
        }
        Err(v) => {
            gpu_unavailable = Some(format!("{DEVICE_ENV}=`{v}` is not a device ordinal"));
            None
        }
    };
    let sku = match selected_gpu.and_then(|i| gpus.get(i)) {
        Some(g) => g.sku(),
        None => cpu.sku(),
    };
    tracing::debug!(gpus = gpus.len(), sku = %sku.name, "device detection");
    DeviceReport {
        gpus,
        gpu_unavailable,
        selected_gpu,
        cpu,
        sku,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ordinal_is_reported_not_panicked() {
        let r = detect_with(Err("abc".into()));
        assert!(r.selected_gpu.is_none());
        assert!(r.gpu_unavailable.unwrap().contains("`abc`"));
        assert_eq!(r.sku.kind, "cpu");
    }
}
