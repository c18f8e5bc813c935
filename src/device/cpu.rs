//! The CPU SKU from `/proc/cpuinfo`: vendor, model name and the ISA flags that select
//! different kernels in ONNX Runtime's MLAS (and so change an offline-optimized model).

use serde::Serialize;

use super::Sku;

/// cpuinfo flags that change which kernels ONNX Runtime (MLAS) dispatches to. Other flags
/// (aes, rdrand, …) do not change generated code and stay out of the key.
pub const KERNEL_ISA_FLAGS: &[&str] = &[
    // x86-64
    "sse4_1",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "avx_vnni_int8",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "amx_fp16",
    // aarch64
    "asimd",
    "asimddp",
    "asimdhp",
    "fphp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
    "sme",
];

/// The host CPU as `/proc/cpuinfo` describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuInfo {
    /// `GenuineIntel`, `AuthenticAMD`, or the ARM implementer code.
    pub vendor: String,
    /// The marketing name (`model name`), or a stand-in built from the ARM part number.
    pub model_name: String,
    /// `x86_64`, `aarch64`, …
    pub arch: String,
    /// Logical CPUs listed.
    pub logical_cpus: usize,
    /// The kernel-relevant flags present ([`KERNEL_ISA_FLAGS`]), sorted.
    pub isa: Vec<String>,
    /// Set when cpuinfo could not be read or lacks fields.
    pub note: Option<String>,
}

impl CpuInfo {
    /// The SKU for keys: kind `cpu`, the model name, and the kernel-relevant ISA flags.
    pub fn sku(&self) -> Sku {
        Sku {
            kind: "cpu".into(),
            name: if self.vendor.is_empty() || self.model_name.contains(&self.vendor) {
                self.model_name.clone()
            } else {
                format!("{} ({})", self.model_name, self.vendor)
            },
            compute_capability: None,
            sm_count: None,
            isa: self.isa.clone(),
        }
    }
}

/// Reads `/proc/cpuinfo`; an unreadable file gives an `unknown` CPU with a note.
pub fn cpu_info() -> CpuInfo {
    match std::fs::read_to_string("/proc/cpuinfo") {
        Ok(text) => parse_cpuinfo(&text, std::env::consts::ARCH),
        Err(e) => CpuInfo {
            vendor: String::new(),
            model_name: "unknown".into(),
            arch: std::env::consts::ARCH.into(),
            logical_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            isa: Vec::new(),
            note: Some(format!("cannot read /proc/cpuinfo: {e}")),
        },
    }
}

/// Parses cpuinfo text (x86 `vendor_id`/`model name`/`flags`, ARM `CPU implementer`/
/// `CPU part`/`Features`). Flags are taken from the first processor block.
pub fn parse_cpuinfo(text: &str, arch: &str) -> CpuInfo {
    let mut vendor = None;
    let mut model = None;
    let mut part = None;
    let mut flags: Option<&str> = None;
    let mut logical = 0usize;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "processor" => logical += 1,
            "vendor_id" | "CPU implementer" if vendor.is_none() => vendor = Some(v),
            "model name" | "Model" | "Hardware" if model.is_none() => model = Some(v),
            "CPU part" if part.is_none() => part = Some(v),
            "flags" | "Features" if flags.is_none() => flags = Some(v),
            _ => {}
        }
    }
    let present: Vec<&str> = flags.unwrap_or("").split_whitespace().collect();
    let mut isa: Vec<String> = KERNEL_ISA_FLAGS
        .iter()
        .filter(|f| present.contains(f))
        .map(|f| f.to_string())
        .collect();
    isa.sort();
    let mut missing = Vec::new();
    let model_name = match (model, part) {
        (Some(m), _) => m.to_string(),
        (None, Some(p)) => format!("{arch} part {p}"),
        (None, None) => {
            missing.push("model name");
            "unknown".to_string()
        }
    };
    if flags.is_none() {
        missing.push("flags");
    }
    CpuInfo {
        vendor: vendor.unwrap_or("").to_string(),
        model_name,
        arch: arch.to_string(),
        logical_cpus: logical,
        isa,
        note: (!missing.is_empty())
            .then(|| format!("/proc/cpuinfo has no {}", missing.join(" or "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n\
        flags\t\t: fpu sse4_1 avx avx2 fma aes avx512f avx512_vnni sha_ni\n\n\
        processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n";

    #[test]
    fn x86_flags_are_filtered_and_sorted() {
        let c = parse_cpuinfo(X86, "x86_64");
        assert_eq!(c.vendor, "AuthenticAMD");
        assert_eq!(c.model_name, "AMD EPYC 9R14");
        assert_eq!(c.logical_cpus, 2);
        assert_eq!(
            c.isa,
            ["avx", "avx2", "avx512_vnni", "avx512f", "fma", "sse4_1"]
        );
        assert!(c.note.is_none());
        let s = c.sku();
        assert_eq!(s.kind, "cpu");
        assert_eq!(s.name, "AMD EPYC 9R14 (AuthenticAMD)");
    }

    #[test]
    fn arm_without_model_name_uses_part() {
        let c = parse_cpuinfo(
            "processor\t: 0\nFeatures\t: fp asimd asimddp i8mm sve\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n",
            "aarch64",
        );
        assert_eq!(c.model_name, "aarch64 part 0xd40");
        assert_eq!(c.isa, ["asimd", "asimddp", "i8mm", "sve"]);
    }

    #[test]
    fn empty_cpuinfo_is_noted() {
        let c = parse_cpuinfo("", "x86_64");
        assert_eq!(c.model_name, "unknown");
        assert!(c.note.unwrap().contains("model name"));
    }
}
