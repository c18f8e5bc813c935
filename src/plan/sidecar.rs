//! The `MODEL.trtcache.toml` sidecar next to a model: named shape profiles, precision,
//! backends, tolerances per precision and golden-input settings. Read with
//! [`load_sidecar`] (finds the file) or [`Sidecar::load`]; unknown keys are errors so typos
//! do not silently fall back to defaults.
//!
//! ```toml
//! precision = "fp16"                 # fp32 (default) or fp16
//! backends = ["ort-tensorrt", "ort-cpu"]
//! default_profile = "small"          # needed when several profiles exist
//! specialize = false                 # ort-cpu: keep fixed profile dims free (default true)
//! rewrite = false                    # ort-cpu: no graph rewrites (default true)
//!
//! [profiles.small]                   # shapes as tables ...
//! min = { ids = [1, 1],   mask = [1, 1] }
//! opt = { ids = [1, 128], mask = [1, 128] }
//! max = { ids = [8, 512], mask = [8, 512] }
//!
//! [profiles.big]                     # ... or in trtexec syntax; opt alone = fixed shape
//! opt = "ids:16x512,mask:16x512"
//!
//! [tolerances.fp16]                  # |actual - expected| <= atol + rtol * |expected|
//! atol = 1e-2
//! rtol = 1e-2
//! ulps = 8                           # float16/bfloat16 outputs: or this many steps of
//!                                    # their type at max(|expected|, the output's rms)
//!
//! [golden]
//! npz = "golden.npz"                 # relative to the sidecar's folder
//! seed = 0
//! int_range = [0, 2]                 # integer inputs drawn from [lo, hi)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{parse_shapes, PlanError};
use crate::spec::{Backend, Precision, ShapeProfile, Tolerance};

/// One `[profiles.NAME]` table: each of min/opt/max is a TOML table of integer arrays
/// (`{ ids = [1, 128] }`) or a trtexec string (`"ids:1x128"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    pub min: Option<toml::Value>,
    pub opt: Option<toml::Value>,
    pub max: Option<toml::Value>,
}

/// Shapes of one bound from its TOML value; `Err` says what is wrong.
fn shape_set(flag: &str, v: &toml::Value) -> Result<BTreeMap<String, Vec<i64>>, String> {
    match v {
        toml::Value::String(s) => parse_shapes(flag, s).map_err(|e| e.to_string()),
        toml::Value::Table(t) => t
            .iter()
            .map(|(name, dims)| {
                let bad = || format!("{flag}: `{name}` must be an array of integers, e.g. {name} = [1, 128]");
                let arr = dims.as_array().ok_or_else(bad)?;
                let dims = arr
                    .iter()
                    .map(|d| d.as_integer().ok_or_else(bad))
                    .collect::<Result<Vec<i64>, String>>()?;
                Ok((name.clone(), dims))
            })
            .collect(),
        other => Err(format!(
            "{flag}: expected a table like {{ x = [1, 128] }} or a string like \"x:1x128\", found a {}",
            other.type_str()
        )),
    }
}

/// The largest sidecar file read (a sidecar is a few lines of TOML).
pub const MAX_SIDECAR_BYTES: u64 = 1 << 20;

/// How validation inputs are made: a golden `.npz`, or seeded random tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GoldenSettings {
    /// Inputs (and optionally expected outputs) in an `.npz`; relative paths are resolved
    /// against the sidecar's folder by [`Sidecar::load`].
    pub npz: Option<PathBuf>,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Integer inputs are drawn from `[int_range[0], int_range[1])`.
    pub int_range: [i64; 2],
}

impl Default for GoldenSettings {
    fn default() -> Self {
        Self {
            npz: None,
            seed: 0,
            int_range: [0, 2],
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SidecarFile {
    precision: Option<String>,
    #[serde(default)]
    backends: Vec<Backend>,
    default_profile: Option<String>,
    specialize: Option<bool>,
    rewrite: Option<bool>,
    #[serde(default)]
    profiles: BTreeMap<String, ProfileSpec>,
    #[serde(default)]
    tolerances: BTreeMap<String, Tolerance>,
    #[serde(default)]
    golden: GoldenSettings,
}

/// A parsed sidecar.
#[derive(Clone, Debug)]
pub struct Sidecar {
    /// Where it was read from.
    pub path: PathBuf,
    pub precision: Option<Precision>,
    pub backends: Vec<Backend>,
    pub default_profile: Option<String>,
    /// `ort-cpu`: whether a profile's fixed dimensions are baked into the artifact (`None`:
    /// the command's default, yes).
    pub specialize: Option<bool>,
    /// `ort-cpu`: whether the build applies its graph rewrites (`builder::backends::ort_cpu::passes`; `None`:
    /// the command's default, yes).
    pub rewrite: Option<bool>,
    /// Profiles by name, unvalidated (validation needs the model: [`super::validate_profile`]).
    pub profiles: BTreeMap<String, ShapeProfile>,
    pub tolerances: HashMap<Precision, Tolerance>,
    pub golden: GoldenSettings,
}

/// The sidecar file names looked for next to `model`: `STEM.trtcache.toml` and
/// `FILE.trtcache.toml` (for `bert.onnx`: `bert.trtcache.toml`, `bert.onnx.trtcache.toml`).
pub fn sidecar_candidates(model: &Path) -> Vec<PathBuf> {
    let dir = model.parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    if let Some(stem) = model.file_stem() {
        let mut s = stem.to_os_string();
        s.push(".trtcache.toml");
        out.push(dir.join(s));
    }
    if let Some(name) = model.file_name() {
        let mut s = name.to_os_string();
        s.push(".trtcache.toml");
        let p = dir.join(s);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Loads the sidecar next to `model_path`, if one exists.
pub fn load_sidecar(model_path: &Path) -> Result<Option<Sidecar>, PlanError> {
    let found: Vec<PathBuf> = sidecar_candidates(model_path)
        .into_iter()
        .filter(|p| p.is_file())
        .collect();
    match found.as_slice() {
        [] => Ok(None),
        [p] => Sidecar::load(p).map(Some),
        [a, b, ..] => Err(PlanError::AmbiguousSidecar {
            a: a.clone(),
            b: b.clone(),
        }),
    }
}

impl Sidecar {
    /// Reads and parses one sidecar file.
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let read_err = |source| PlanError::SidecarRead {
            path: path.to_path_buf(),
            source,
        };
        // A regular file of bounded size: a FIFO would block, `/dev/zero` never end.
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if !meta.is_file() {
            return Err(PlanError::SidecarParse {
                path: path.to_path_buf(),
                message: "not a regular file".into(),
            });
        }
        if meta.len() > MAX_SIDECAR_BYTES {
            return Err(PlanError::SidecarParse {
                path: path.to_path_buf(),
                message: format!(
                    "{} bytes is over the sidecar limit of {MAX_SIDECAR_BYTES} bytes",
                    meta.len()
                ),
            });
        }
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(
                std::fs::File::open(path).map_err(read_err)?,
                MAX_SIDECAR_BYTES,
            ),
            &mut text,
        )
        .map_err(read_err)?;
        Self::parse(path, &text)
    }

    /// Parses sidecar text; `path` names it in errors and anchors relative paths.
    pub fn parse(path: &Path, text: &str) -> Result<Self, PlanError> {
        let bad = |message: String| PlanError::SidecarParse {
            path: path.to_path_buf(),
            message,
        };
        let f: SidecarFile = toml::from_str(text).map_err(|e| bad(e.to_string().trim().into()))?;
        let precision = f
            .precision
            .as_deref()
            .map(|s| s.parse::<Precision>())
            .transpose()
            .map_err(|e| bad(format!("precision: {e}")))?;
        let mut tolerances = HashMap::new();
        for (k, t) in f.tolerances {
            let p: Precision = k
                .parse()
                .map_err(|e| bad(format!("[tolerances.{k}]: {e}")))?;
            if !(t.atol >= 0.0 && t.rtol >= 0.0 && t.ulps.is_none_or(|u| u >= 0.0)) {
                return Err(bad(format!(
                    "[tolerances.{k}]: atol, rtol and ulps must be >= 0"
                )));
            }
            tolerances.insert(p, t);
        }
        if f.golden.int_range[0] >= f.golden.int_range[1] {
            return Err(bad(format!(
                "[golden] int_range {:?} is empty; need [lo, hi) with lo < hi",
                f.golden.int_range
            )));
        }
        let mut golden = f.golden;
        let dir = path.parent().unwrap_or(Path::new(""));
        // Golden files are the model's own: inside its folder, never a path that lets a
        // sidecar (or a socket user who drops one) read or probe other files.
        if let Some(p) = &golden.npz {
            let inside = p.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            });
            if !inside {
                return Err(bad(format!(
                    "[golden] npz = {:?} must be a path inside the model's folder (relative, no `..`)",
                    p.display().to_string()
                )));
            }
        }
        golden.npz = golden.npz.map(|p| dir.join(p));
        let mut profiles = BTreeMap::new();
        for (name, spec) in f.profiles {
            let set = |which: &str, v: &Option<toml::Value>| -> Result<_, PlanError> {
                v.as_ref()
                    .map(|v| shape_set(&format!("profiles.{name}.{which}"), v))
                    .transpose()
                    .map_err(bad)
            };
            let (min, opt, max) = (
                set("min", &spec.min)?,
                set("opt", &spec.opt)?,
                set("max", &spec.max)?,
            );
            let Some(opt) = opt else {
                return Err(bad(format!(
                    "[profiles.{name}] has no `opt`; give opt alone (min = max = opt) or min, opt and max"
                )));
            };
            if min.is_some() != max.is_some() {
                return Err(bad(format!(
                    "[profiles.{name}] has `{}` without `{}`; give opt alone (min = max = opt) or min, opt and max",
                    if min.is_some() { "min" } else { "max" },
                    if min.is_some() { "max" } else { "min" },
                )));
            }
            profiles.insert(
                name.clone(),
                ShapeProfile {
                    name,
                    min: min.unwrap_or_else(|| opt.clone()),
                    max: max.unwrap_or_else(|| opt.clone()),
                    opt,
                },
            );
        }
        if let Some(d) = &f.default_profile {
            if !profiles.contains_key(d) {
                return Err(bad(format!(
                    "default_profile `{d}` is not among the profiles ({})",
                    profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        }
        Ok(Sidecar {
            path: path.to_path_buf(),
            precision,
            backends: f.backends,
            default_profile: f.default_profile,
            specialize: f.specialize,
            rewrite: f.rewrite,
            profiles,
            tolerances,
            golden,
        })
    }

    /// The profile named `name`, or the default one (`default_profile`, or the only one) when
    /// `name` is `None`; `Ok(None)` when the sidecar defines no profiles and none was asked.
    pub fn profile(&self, name: Option<&str>) -> Result<Option<ShapeProfile>, PlanError> {
        let available = || self.profiles.keys().cloned().collect::<Vec<_>>();
        let name = match (name, &self.default_profile) {
            (Some(n), _) => n,
            (None, Some(d)) => d.as_str(),
            (None, None) => {
                return match self.profiles.len() {
                    0 => Ok(None),
                    1 => Ok(self.profiles.values().next().cloned()),
                    _ => Err(PlanError::NoDefaultProfile {
                        path: self.path.clone(),
                        available: available(),
                    }),
                }
            }
        };
        match self.profiles.get(name) {
            Some(p) => Ok(Some(p.clone())),
            None => Err(PlanError::NoSuchProfile {
                name: name.into(),
                where_: Some(self.path.clone()),
                available: available(),
            }),
        }
    }

    /// The tolerance for `p`: the sidecar's, else the default.
    pub fn tolerance(&self, p: Precision) -> Tolerance {
        self.tolerances
            .get(&p)
            .copied()
            .unwrap_or_else(|| Tolerance::default_for(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
precision = "fp16"
backends = ["ort-tensorrt", "ort-cpu"]
default_profile = "small"
specialize = false
rewrite = false
[profiles.small]
min = { x = [1, 1, 64] }
opt = { x = [2, 16, 64] }
max = { x = [8, 128, 64] }
[profiles.fixed]
opt = "x:4x32x64"
[tolerances.fp16]
atol = 0.05
rtol = 0.01
ulps = 2
[golden]
npz = "g.npz"
seed = 7
int_range = [0, 5]
"#;

    #[test]
    fn parses_everything() {
        let s = Sidecar::parse(Path::new("/m/model.trtcache.toml"), FULL).unwrap();
        assert_eq!(s.precision, Some(Precision::Fp16));
        assert_eq!(s.backends, [Backend::OrtTensorRt, Backend::OrtCpu]);
        assert_eq!(s.specialize, Some(false));
        assert_eq!(s.rewrite, Some(false));
        let p = s.profile(None).unwrap().unwrap();
        assert_eq!(p.name, "small");
        assert_eq!(p.max["x"], [8, 128, 64]);
        let f = s.profile(Some("fixed")).unwrap().unwrap();
        assert_eq!(f.min["x"], [4, 32, 64]);
        assert_eq!(f.max, f.opt);
        assert_eq!(s.tolerance(Precision::Fp16).atol, 0.05);
        assert_eq!(s.tolerance(Precision::Fp16).half_ulps(), 2.0);
        assert_eq!(
            s.tolerance(Precision::Fp32),
            Tolerance::default_for(Precision::Fp32)
        );
        assert_eq!(s.golden.npz.as_deref(), Some(Path::new("/m/g.npz")));
        assert_eq!(s.golden.int_range, [0, 5]);
    }

    #[test]
    fn errors_name_the_problem() {
        let p = Path::new("m.trtcache.toml");
        let e = Sidecar::parse(p, "precison = \"fp16\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("precison") && e.contains("m.trtcache.toml"),
            "{e}"
        );
        let e = Sidecar::parse(p, "precision = \"int4\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("int4"), "{e}");
        let e = Sidecar::parse(p, "[profiles.a]\nmin = \"x:1\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[profiles.a] has no `opt`"), "{e}");
        let e = Sidecar::parse(p, "[profiles.a]\nmin = \"x:1\"\nopt = \"x:1\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("has `min` without `max`"), "{e}");
        let e = Sidecar::parse(p, "[profiles.a]\nopt = { x = [1.5] }")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("profiles.a.opt: `x` must be an array of integers"),
            "{e}"
        );
        let e = Sidecar::parse(p, "[profiles.a]\nopt = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("profiles.a.opt: expected a table"), "{e}");
        let e = Sidecar::parse(p, "backends = [\"ort-gpu\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown backend `ort-gpu`"), "{e}");
        let e = Sidecar::parse(p, "[golden]\nint_range = [2, 2]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("int_range"), "{e}");
        let two = "[profiles.a]\nopt = \"x:1\"\n[profiles.b]\nopt = \"x:2\"";
        let s = Sidecar::parse(p, two).unwrap();
        let e = s.profile(None).unwrap_err().to_string();
        assert!(e.contains("a, b") && e.contains("--profile"), "{e}");
        let e = s.profile(Some("c")).unwrap_err().to_string();
        assert!(e.contains("`c`") && e.contains("available: a, b"), "{e}");
    }

    #[test]
    fn tolerance_is_allclose() {
        let t = Tolerance {
            atol: 0.1,
            rtol: 0.5,
            ulps: None,
        };
        assert!(t.allows(1.5, 1.0));
        assert!(!t.allows(1.7, 1.0));
        assert!(!t.allows(f64::NAN, 1.0));
        assert!(t.allows(f64::INFINITY, f64::INFINITY));
    }

    #[test]
    fn candidates() {
        let c = sidecar_candidates(Path::new("d/bert.onnx"));
        assert_eq!(
            c,
            [
                PathBuf::from("d/bert.trtcache.toml"),
                PathBuf::from("d/bert.onnx.trtcache.toml")
            ]
        );
    }

    #[test]
    fn golden_files_stay_inside_the_model_folder_and_sidecars_are_regular_files() {
        let p = Path::new("/m/x.trtcache.toml");
        for bad in ["/dev/zero", "../other/g.npz", "/etc/passwd"] {
            let e = Sidecar::parse(p, &format!("[golden]\nnpz = {bad:?}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("inside the model's folder"), "{bad}: {e}");
        }
        let ok = Sidecar::parse(p, "[golden]\nnpz = \"sub/g.npz\"").unwrap();
        assert_eq!(ok.golden.npz.as_deref(), Some(Path::new("/m/sub/g.npz")));
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("m.trtcache.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = Sidecar::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = d.path().join("big.trtcache.toml");
        std::fs::write(&big, vec![b'#'; (MAX_SIDECAR_BYTES + 1) as usize]).unwrap();
        assert!(Sidecar::load(&big)
            .unwrap_err()
            .to_string()
            .contains("limit"));
    }
}
