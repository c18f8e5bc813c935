//! Finding and opening the TensorRT shim at run time.
//!
//! The shim (`libtrtcache_trt.so`) is looked for at `TRTCACHE_TRT_SHIM` (or the config's
//! path; when set, nothing else is tried), next to the running binary (where `build.rs` puts
//! it), in `../lib` beside it, and in `$TENSORRT_ROOT/lib`.
//!
//! **Which TensorRT.** The shim's ELF dynamic section ([`super::elf`]) names the TensorRT it was
//! linked against (`DT_NEEDED libnvinfer.so.MAJOR`), read before anything of it runs: exactly
//! those TensorRT libraries are opened first ([`shim_tensorrt_major`] decides, and refuses a
//! shim linked against two majors or one this trtcache does not load), from
//! `$TENSORRT_ROOT/lib` (a TensorRT tarball, or the `tensorrt` wheel's `tensorrt_libs` folder)
//! or the loader's usual path, with `RTLD_GLOBAL`, so the shim resolves them even when they
//! are not on `LD_LIBRARY_PATH`, and never binds to another major's symbols. Once open, the
//! library the shim actually bound must be of the major it was compiled for and at least the
//! version of its headers ([`check_versions`]).
//!
//! What could not be found is collected into [`Missing`], which says how to install it. Every
//! file opened by path passes [`crate::libs::trust::trusted_file`] first (owned by root or this
//! user, writable by no one else down its whole path); a bare name goes to the system loader's
//! own path.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::error::{Missing, TrtError};
use super::ffi::TrtShim;
use super::TrtVersion;

pub use super::{SHIM_ENV, SHIM_FILE};
/// Environment variable naming a TensorRT install (its `lib/` holds the libraries).
pub const ROOT_ENV: &str = "TENSORRT_ROOT";
/// TensorRT major versions the loader accepts (and, to report what is missing, tries in order).
pub const DEFAULT_MAJORS: &[u32] = &[10, 11];
/// The TensorRT libraries a shim may be linked against, without the `.so.MAJOR` suffix.
const TRT_LIBS: &[&str] = &["libnvinfer", "libnvonnxparser", "libnvinfer_plugin"];

/// Where to look (every field has an environment default, see [`LoaderConfig::from_env`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoaderConfig {
    /// The shim's exact path; `None` searches.
    pub shim: Option<PathBuf>,
    /// A TensorRT install: `ROOT/lib` (or `ROOT` itself when it holds the libraries).
    pub tensorrt_root: Option<PathBuf>,
    /// TensorRT major versions to accept, in order of preference (default 10, 11).
    pub majors: Vec<u32>,
}

impl LoaderConfig {
    /// `TRTCACHE_TRT_SHIM`, `TENSORRT_ROOT`, majors 10 then 11.
    pub fn from_env() -> Self {
        let path = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        Self {
            shim: path(SHIM_ENV),
            tensorrt_root: path(ROOT_ENV),
            majors: DEFAULT_MAJORS.to_vec(),
        }
    }

    fn majors(&self) -> &[u32] {
        if self.majors.is_empty() {
            DEFAULT_MAJORS
        } else {
            &self.majors
        }
    }

    /// Folders that may hold TensorRT's libraries, besides the loader's own path.
    fn library_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(r) = &self.tensorrt_root {
            dirs.push(r.join("lib"));
            dirs.push(r.clone());
        }
        dirs
    }

    /// Where the shim is looked for, in order.
    pub fn shim_candidates(&self) -> Vec<PathBuf> {
        if let Some(p) = &self.shim {
            return vec![p.clone()];
        }
        let mut c = Vec::new();
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            c.push(dir.join(SHIM_FILE));
            // Test binaries live in target/<profile>/deps, the shim in target/<profile>.
            if let Some(up) = dir.parent() {
                c.push(up.join(SHIM_FILE));
                c.push(up.join("lib").join(SHIM_FILE));
            }
        }
        if let Some(r) = &self.tensorrt_root {
            c.push(r.join("lib").join(SHIM_FILE));
        }
        c
    }
}

/// An opened shim, with the TensorRT libraries opened for it (kept open as long as it is).
pub(crate) struct Opened {
    pub api: TrtShim,
    pub path: PathBuf,
    /// The TensorRT libraries opened before the shim, with their paths.
    pub libraries: Vec<(PathBuf, Library)>,
}

fn open_with(path: &OsStr, global: bool) -> Result<Library, String> {
    let flags = if global {
        RTLD_NOW | RTLD_GLOBAL
    } else {
        RTLD_NOW
    };
    // SAFETY: opening a shared library runs its initialisers; TensorRT's and the shim's are
    // trusted code of this install.
    unsafe { Library::open(Some(path), flags) }.map_err(|e| e.to_string())
}

/// Opens one TensorRT library (`libnvinfer.so.10`): from the configured folders first, then by
/// bare name through the loader's path. `global`: its symbols serve libraries opened later
/// (the shim); otherwise they stay private to it (a version probe must not decide what a
/// later shim binds to).
fn open_trt_library(
    cfg: &LoaderConfig,
    name: &str,
    global: bool,
) -> Result<(PathBuf, Library), String> {
    for d in cfg.library_dirs() {
        let p = d.join(name);
        if p.exists() {
            let real = crate::libs::trust::trusted_file(&p).map_err(|e| e.to_string())?;
            return open_with(real.as_os_str(), global).map(|l| (p, l));
        }
    }
    open_with(OsStr::new(name), global).map(|l| (PathBuf::from(name), l))
}

/// The TensorRT major a shim must be given, from its `DT_NEEDED` sonames: `Some(MAJOR)` for a
/// shim linked against `libnvinfer.so.MAJOR` (and its siblings), `None` for one linked against
/// no TensorRT library (the test double). Refused, with the reason: a shim that needs two
/// majors at once, or a major not in `accepted`.
pub fn shim_tensorrt_major(needed: &[String], accepted: &[u32]) -> Result<Option<u32>, String> {
    let mut majors = std::collections::BTreeSet::new();
    for name in needed {
        for base in TRT_LIBS {
            let major = name
                .strip_prefix(base)
                .and_then(|r| r.strip_prefix(".so."))
                .and_then(|m| m.parse::<u32>().ok());
            if let Some(m) = major {
                majors.insert(m);
            }
        }
    }
    let mut it = majors.iter();
    let Some(&major) = it.next() else {
        return Ok(None);
    };
    if it.next().is_some() {
        let all: Vec<String> = majors.iter().map(|m| format!("TensorRT {m}")).collect();
        return Err(format!(
            "it is linked against {} at once (DT_NEEDED {}): rebuild it against one TensorRT",
            all.join(" and "),
            needed.join(", ")
        ));
    }
    if !accepted.contains(&major) {
        let ok: Vec<String> = accepted.iter().map(u32::to_string).collect();
        return Err(format!(
            "it is linked against TensorRT {major} (libnvinfer.so.{major}), and this trtcache \
             loads TensorRT {} only",
            ok.join(" or ")
        ));
    }
    Ok(Some(major))
}

/// Whether the TensorRT a shim bound to can run it: the major it was compiled for (and linked
/// against, `linked`), and no older than the headers it was compiled against (an older library
/// may lack what the headers declare). `Err` says what to do.
pub fn check_versions(
    compiled: TrtVersion,
    loaded: TrtVersion,
    linked: Option<u32>,
) -> Result<(), String> {
    if let Some(l) = linked.filter(|&l| l != compiled.major) {
        return Err(format!(
            "it was compiled against TensorRT {compiled} headers but linked against \
             libnvinfer.so.{l}: rebuild it against one TensorRT's headers and libraries"
        ));
    }
    if loaded.major != compiled.major {
        return Err(format!(
            "it was compiled against TensorRT {compiled} headers, but the libnvinfer it bound to \
             is TensorRT {loaded}: make TensorRT {} the one found (TENSORRT_ROOT), or rebuild \
             the shim against TensorRT {}'s headers",
            compiled.major, loaded.major
        ));
    }
    if loaded < compiled {
        return Err(format!(
            "it was compiled against TensorRT {compiled} headers, but the libnvinfer loaded is \
             TensorRT {loaded}, older: install TensorRT {compiled} or later, or rebuild the shim \
             against the installed TensorRT's headers"
        ));
    }
    Ok(())
}

/// Opened libraries with their paths.
type OpenedLibs = Vec<(PathBuf, Library)>;
/// Library name → why it could not be opened.
type Reasons = Vec<(String, String)>;

/// What is missing for every accepted major, to say what to install when there is no shim
/// (the first major's reasons, the supported one); nothing when one major has them all.
fn probe_tensorrt(cfg: &LoaderConfig) -> Reasons {
    let mut missing = Vec::new();
    for major in cfg.majors() {
        let mut this_missing = Vec::new();
        for base in ["libnvinfer.so", "libnvonnxparser.so"] {
            let name = format!("{base}.{major}");
            if let Err(why) = open_trt_library(cfg, &name, false) {
                this_missing.push((name, why));
            }
        }
        if this_missing.is_empty() {
            return Vec::new();
        }
        if missing.is_empty() {
            missing = this_missing;
        }
    }
    missing
}

/// Opens, globally, the TensorRT libraries among `needed` (the shim's `DT_NEEDED` sonames);
/// the reasons for those that could not be opened otherwise.
fn open_tensorrt(cfg: &LoaderConfig, needed: &[String]) -> Result<OpenedLibs, Reasons> {
    let mut opened = Vec::new();
    let mut missing = Vec::new();
    for name in needed {
        if !TRT_LIBS
            .iter()
            .any(|b| name.strip_prefix(b).is_some_and(|r| r.starts_with(".so.")))
        {
            continue;
        }
        match open_trt_library(cfg, name, true) {
            Ok(l) => opened.push(l),
            Err(why) => missing.push((name.clone(), why)),
        }
    }
    if missing.is_empty() {
        Ok(opened)
    } else {
        Err(missing)
    }
}
/// Opens the shim and the TensorRT it was linked against; `Unavailable` lists what is not
/// there, `ShimMismatch` says why the shim cannot run with the TensorRT found. A shim that
/// does not need TensorRT (the test double) loads without it.
pub(crate) fn open(cfg: &LoaderConfig) -> Result<Opened, TrtError> {
    let unloadable = |libraries, path: PathBuf, why: String| {
        TrtError::Unavailable(Missing {
            libraries,
            shim_searched: Vec::new(),
            shim_unloadable: Some((path, why)),
        })
    };
    let candidates = cfg.shim_candidates();
    let Some(found) = candidates.iter().find(|p| p.is_file()).cloned() else {
        return Err(TrtError::Unavailable(Missing {
            libraries: probe_tensorrt(cfg),
            shim_searched: candidates,
            shim_unloadable: None,
        }));
    };
    // The shim's constructor runs as this user: only from a file no one else could write.
    let path = crate::libs::trust::trusted_file(&found)
        .map_err(|e| unloadable(Vec::new(), found.clone(), e.to_string()))?;
    let needed = super::elf::needed(&path).map_err(|e| {
        unloadable(
            Vec::new(),
            path.clone(),
            format!("reading its ELF dynamic section: {e}"),
        )
    })?;
    let linked =
        shim_tensorrt_major(&needed, cfg.majors()).map_err(|reason| TrtError::ShimMismatch {
            path: path.clone(),
            reason,
        })?;
    let libraries = open_tensorrt(cfg, &needed).map_err(|missing| {
        let names: Vec<&str> = missing.iter().map(|(n, _)| n.as_str()).collect();
        let why = format!(
            "it needs {} (TensorRT {})",
            names.join(" and "),
            linked.map_or_else(|| "?".to_string(), |m| m.to_string())
        );
        unloadable(missing, path.clone(), why)
    })?;
    // SAFETY: as in `open_with`; the symbols are checked against the bindgen'd signatures
    // only by name, which is why the ABI version is compared right after.
    let lib = unsafe { Library::open(Some(path.as_os_str()), RTLD_NOW) }
        .map_err(|e| unloadable(Vec::new(), path.clone(), e.to_string()))?;
    // SAFETY: every function of the header is looked up by name (dynamic_link_require_all).
    let api = unsafe { TrtShim::from_library(libloading::Library::from(lib)) }.map_err(|e| {
        unloadable(
            Vec::new(),
            path.clone(),
            format!("{e} (a shim from another trtcache version?)"),
        )
    })?;
    // SAFETY: a function without arguments, found above.
    let found = unsafe { (api.trtcache_trt_abi_version)() };
    if found != super::ffi::TRTCACHE_TRT_ABI_VERSION {
        return Err(TrtError::AbiMismatch {
            path,
            found,
            expected: super::ffi::TRTCACHE_TRT_ABI_VERSION,
        });
    }
    // SAFETY: functions without arguments; the library one calls getInferLibVersion, which
    // touches no device.
    let (compiled, loaded) = unsafe {
        (
            TrtVersion::from_raw((api.trtcache_trt_compiled_version)()),
            TrtVersion::from_raw((api.trtcache_trt_library_version)()),
        )
    };
    check_versions(compiled, loaded, linked).map_err(|reason| TrtError::ShimMismatch {
        path: path.clone(),
        reason,
    })?;
    tracing::debug!(
        shim = %path.display(),
        compiled = %compiled,
        tensorrt = %loaded,
        libraries = libraries.len(),
        "TensorRT shim loaded"
    );
    Ok(Opened {
        api,
        path,
        libraries,
    })
}

/// Libraries [`tensorrt_library_version`] opened, kept open for the process's life.
static KEPT: std::sync::Mutex<Vec<Library>> = std::sync::Mutex::new(Vec::new());

/// The TensorRT version of the library that would be loaded, asked of the library itself
/// (`getInferLibVersion`, exported by `libnvinfer`), without the shim: what the
/// `ort-tensorrt` backend's key should record instead of a version read from a file name.
pub fn tensorrt_library_version(cfg: &LoaderConfig) -> Result<super::TrtVersion, TrtError> {
    let mut reasons = Vec::new();
    for major in cfg.majors() {
        let name = format!("libnvinfer.so.{major}");
        match open_trt_library(cfg, &name, false) {
            Ok((path, lib)) => {
                // SAFETY: `int32_t getInferLibVersion(void)` is TensorRT's C entry point.
                let v = unsafe {
                    lib.get::<unsafe extern "C" fn() -> i32>(b"getInferLibVersion\0")
                        .map(|f| f())
                };
                return match v {
                    Ok(v) => {
                        // Kept open: closing it would unload TensorRT, and the next key
                        // would pay for loading it again.
                        KEPT.lock().unwrap_or_else(|p| p.into_inner()).push(lib);
                        Ok(super::TrtVersion::from_raw(v))
                    }
                    Err(e) => Err(TrtError::Unavailable(Missing {
                        libraries: vec![(
                            path.display().to_string(),
                            format!("no getInferLibVersion: {e}"),
                        )],
                        ..Default::default()
                    })),
                };
            }
            Err(why) => reasons.push((name, why)),
        }
    }
    reasons.truncate(1);
    Err(TrtError::Unavailable(Missing {
        libraries: reasons,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_shims_tensorrt_major_comes_from_its_needed_libraries() {
        let all = DEFAULT_MAJORS;
        let shim11 = names(&[
            "libnvinfer.so.11",
            "libnvonnxparser.so.11",
            "libcudart.so.13",
            "libc.so.6",
        ]);
        assert_eq!(shim_tensorrt_major(&shim11, all), Ok(Some(11)));
        assert_eq!(
            shim_tensorrt_major(&names(&["libnvinfer.so.10", "libcudart.so.12"]), all),
            Ok(Some(10))
        );
        // No TensorRT library (the test double): nothing to open first.
        assert_eq!(shim_tensorrt_major(&names(&["libc.so.6"]), all), Ok(None));
        // Look-alikes are not TensorRT.
        assert_eq!(
            shim_tensorrt_major(&names(&["libnvinfer.so", "libnvinfer_x.so.9"]), all),
            Ok(None)
        );
        let two = shim_tensorrt_major(&names(&["libnvinfer.so.10", "libnvonnxparser.so.11"]), all)
            .unwrap_err();
        assert!(
            two.contains("linked against TensorRT 10 and TensorRT 11 at once"),
            "{two}"
        );
        let other = shim_tensorrt_major(&shim11, &[10]).unwrap_err();
        assert!(
            other.contains(
                "TensorRT 11 (libnvinfer.so.11), and this trtcache loads TensorRT 10 only"
            ),
            "{other}"
        );
    }

    #[test]
    fn the_loaded_tensorrt_must_match_the_shims_headers() {
        let v = TrtVersion::from_raw;
        assert_eq!(check_versions(v(100900), v(100900), Some(10)), Ok(()));
        assert_eq!(check_versions(v(100900), v(101601), Some(10)), Ok(()));
        assert_eq!(check_versions(v(100900), v(101601), None), Ok(()));
        let older = check_versions(v(100900), v(100800), Some(10)).unwrap_err();
        assert!(
            older.contains(
                "TensorRT 10.9.0 headers, but the libnvinfer loaded is TensorRT 10.8.0, older"
            ),
            "{older}"
        );
        let patch = check_versions(v(101601), v(101600), None).unwrap_err();
        assert!(patch.contains("older"), "{patch}");
        let major = check_versions(v(110100), v(101601), None).unwrap_err();
        assert!(
            major.contains("bound to is TensorRT 10.16.1: make TensorRT 11 the one found"),
            "{major}"
        );
        let linked = check_versions(v(110100), v(110100), Some(10)).unwrap_err();
        assert!(
            linked.contains("TensorRT 11.1.0 headers but linked against libnvinfer.so.10"),
            "{linked}"
        );
    }
}
