//! NVIDIA GPUs through the CUDA driver API, loaded at run time by cudarc's
//! `dynamic-loading`: the binary builds and runs without CUDA. cudarc panics on the first call
//! when `libcuda` is missing, so [`gpu_devices`] checks `is_culib_present` first and also
//! catches a panic from a driver lacking a symbol. Only `cuInit` and `cuDevice*` queries are
//! used: no context is created, so detection allocates no GPU memory.
//!
//! Not run on this project's development machine (no GPU); written for a GPU host.

use serde::Serialize;

use super::Sku;

/// Why the GPU list is empty.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver: libcuda.so (libcuda.so.1) was not found by the dynamic loader; install the NVIDIA driver or add its folder to LD_LIBRARY_PATH")]
    NoDriverLib,
    #[error("the CUDA driver failed in {call}: {message}")]
    Driver { call: &'static str, message: String },
    #[error(
        "the CUDA driver library panicked while being queried (too old for this cudarc?): {0}"
    )]
    Panicked(String),
}

/// One GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuDevice {
    pub ordinal: usize,
    pub name: String,
    /// `major.minor`.
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_bytes: u64,
    /// `cuDriverGetVersion` as `major.minor` (e.g. 12.8): the CUDA version the driver supports.
    pub driver_version: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
    pub uuid: String,
}

impl GpuDevice {
    /// The SKU for keys: name, compute capability and SM count (memory, UUID and driver are
    /// reported but do not change generated code; the driver version goes in with the
    /// backend's library versions).
    pub fn sku(&self) -> Sku {
        Sku {
            kind: "gpu".into(),
            name: self.name.clone(),
            compute_capability: Some(self.compute_capability.clone()),
            sm_count: Some(self.sm_count),
            isa: Vec::new(),
        }
    }
}

/// Whether libcuda can be loaded at all.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; no driver call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The CUDA driver's version, `major.minor`, when a driver is present.
pub fn driver_version() -> Option<String> {
    if !driver_present() {
        return None;
    }
    std::panic::catch_unwind(|| {
        let mut v = 0i32;
        // SAFETY: a plain out-parameter call; valid before cuInit.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            .result()
            .ok()
            .map(|_| format!("{}.{}", v / 1000, (v % 1000) / 10))
    })
    .ok()
    .flatten()
}

/// Every GPU the driver sees; `Err` says why none can be listed. Never panics.
pub fn gpu_devices() -> Result<Vec<GpuDevice>, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriverLib);
    }
    match std::panic::catch_unwind(query_devices) {
        Ok(r) => r,
        Err(p) => Err(GpuError::Panicked(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        )),
    }
}

fn query_devices() -> Result<Vec<GpuDevice>, GpuError> {
    use cudarc::driver::result::{self, device};
    use cudarc::driver::sys::CUdevice_attribute as A;
    let err = |call: &'static str| {
        move |e: result::DriverError| GpuError::Driver {
            call,
            message: e.to_string(),
        }
    };
    result::init().map_err(err("cuInit"))?;
    let driver = driver_version().unwrap_or_else(|| "unknown".into());
    let count = device::get_count().map_err(err("cuDeviceGetCount"))?;
    let mut out = Vec::new();
    for ordinal in 0..count.max(0) {
        let dev = device::get(ordinal).map_err(err("cuDeviceGet"))?;
        let name = device::get_name(dev).map_err(err("cuDeviceGetName"))?;
        // SAFETY: `dev` came from cuDeviceGet above.
        let attr = |a| unsafe { device::get_attribute(dev, a) };
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(err("cuDeviceGetAttribute"))?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(err("cuDeviceGetAttribute"))?;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(err("cuDeviceGetAttribute"))?;
        // SAFETY: as above.
        let mem = unsafe { device::total_mem(dev) }.map_err(err("cuDeviceTotalMem"))?;
        let uuid = device::get_uuid(dev).map_err(err("cuDeviceGetUuid"))?;
        out.push(GpuDevice {
            ordinal: ordinal as usize,
            name,
            compute_capability: format!("{major}.{minor}"),
            sm_count: sms.max(0) as u32,
            memory_bytes: mem as u64,
            driver_version: driver.clone(),
            uuid: format_uuid(&uuid.bytes.map(|b| b as u8)),
        });
    }
    Ok(out)
}

/// nvidia-smi's UUID form: `GPU-` and 8-4-4-4-12 hex digits.
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h = crate::spec::hex(b);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_format() {
        let mut b = [0u8; 16];
        b[0] = 0xab;
        b[15] = 0x01;
        assert_eq!(format_uuid(&b), "GPU-ab000000-0000-0000-0000-000000000001");
    }

    #[test]
    fn no_driver_here_is_an_error_not_a_panic() {
        // This development machine has no libcuda; on a GPU host the first branch runs.
        match gpu_devices() {
            Ok(g) => assert!(driver_present(), "devices without a driver: {g:?}"),
            Err(e) => {
                if !driver_present() {
                    assert!(matches!(e, GpuError::NoDriverLib));
                    assert!(e.to_string().contains("libcuda"));
                }
            }
        }
    }
}
