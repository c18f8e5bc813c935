//! Finding and opening the TensorRT shim at run time.
//!
//! The shim (`libtrtcache_trt.so`) is looked for at `TRTCACHE_TRT_SHIM` (or the config's
//! path; when set, nothing else is tried), next to the running binary (where `build.rs` puts
//! it), in `../lib` beside it, and in `$TENSORRT_ROOT/lib`. TensorRT's own libraries
//! (`libnvinfer.so.MAJOR`, `libnvonnxparser.so.MAJOR`) are opened first, from
//! `$TENSORRT_ROOT/lib` (a TensorRT tarball, or the `tensorrt` wheel's `tensorrt_libs`
//! folder) or the loader's usual path, with `RTLD_GLOBAL`, so a shim linked against them
//! resolves them even when they are not on `LD_LIBRARY_PATH`. What could not be found is
//! collected into [`Missing`], which says how to install it. Every file opened by path passes
//! [`crate::libs::trust::trusted_file`] first (owned by root or this user, writable by no one
//! else down its whole path); a bare name goes to the system loader's own path.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::error::{Missing, TrtError};
use super::ffi::TrtShim;

/// The shim's file name.
pub const SHIM_FILE: &str = "libtrtcache_trt.so";
/// Environment variable naming the shim's path.
pub const SHIM_ENV: &str = "TRTCACHE_TRT_SHIM";
/// Environment variable naming a TensorRT install (its `lib/` holds the libraries).
pub const ROOT_ENV: &str = "TENSORRT_ROOT";
/// TensorRT major versions the loader tries, in order.
pub const DEFAULT_MAJORS: &[u32] = &[10, 11];

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

fn open_global(path: &OsStr) -> Result<Library, String> {
    // SAFETY: opening a shared library runs its initialisers; TensorRT's and the shim's are
    // trusted code of this install.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())
}

/// Opens one TensorRT library (`libnvinfer.so.10`): from the configured folders first, then by
/// bare name through the loader's path.
fn open_trt_library(cfg: &LoaderConfig, name: &str) -> Result<(PathBuf, Library), String> {
    for d in cfg.library_dirs() {
        let p = d.join(name);
        if p.exists() {
            let real = crate::libs::trust::trusted_file(&p).map_err(|e| e.to_string())?;
            return open_global(real.as_os_str()).map(|l| (p, l));
        }
    }
    open_global(OsStr::new(name)).map(|l| (PathBuf::from(name), l))
}

/// Opened libraries with their paths.
type OpenedLibs = Vec<(PathBuf, Library)>;
/// Library name → why it could not be opened.
type Reasons = Vec<(String, String)>;

/// Opens TensorRT's libraries for the first major version that has them all; the reasons
/// for every name tried otherwise.
fn open_tensorrt(cfg: &LoaderConfig) -> Result<OpenedLibs, Reasons> {
    let mut missing = Vec::new();
    for major in cfg.majors() {
        let mut opened = Vec::new();
        let mut this_missing = Vec::new();
        for base in ["libnvinfer.so", "libnvonnxparser.so"] {
            let name = format!("{base}.{major}");
            match open_trt_library(cfg, &name) {
                Ok(l) => opened.push(l),
                Err(why) => this_missing.push((name, why)),
            }
        }
        if this_missing.is_empty() {
            return Ok(opened);
        }
        if missing.is_empty() {
            // The first major's reasons are the ones reported (10, the supported one).
            missing = this_missing;
        }
    }
    Err(missing)
}

/// Opens TensorRT's libraries (when present) and the shim; `Unavailable` lists what is not
/// there. A shim that does not need TensorRT (the test double) loads without it.
pub(crate) fn open(cfg: &LoaderConfig) -> Result<Opened, TrtError> {
    let (libraries, missing_libs) = match open_tensorrt(cfg) {
        Ok(l) => (l, Vec::new()),
        Err(m) => (Vec::new(), m),
    };
    let candidates = cfg.shim_candidates();
    let Some(found) = candidates.iter().find(|p| p.is_file()).cloned() else {
        return Err(TrtError::Unavailable(Missing {
            libraries: missing_libs,
            shim_searched: candidates,
            shim_unloadable: None,
        }));
    };
    // The shim's constructor runs as this user: only from a file no one else could write.
    let path = match crate::libs::trust::trusted_file(&found) {
        Ok(p) => p,
        Err(e) => {
            return Err(TrtError::Unavailable(Missing {
                libraries: missing_libs,
                shim_searched: Vec::new(),
                shim_unloadable: Some((found, e.to_string())),
            }))
        }
    };
    // SAFETY: as in `open_global`; the symbols are checked against the bindgen'd signatures
    // only by name, which is why the ABI version is compared right after.
    let lib = match unsafe { Library::open(Some(path.as_os_str()), RTLD_NOW) } {
        Ok(l) => l,
        Err(e) => {
            return Err(TrtError::Unavailable(Missing {
                libraries: missing_libs,
                shim_searched: Vec::new(),
                shim_unloadable: Some((path, e.to_string())),
            }))
        }
    };
    // SAFETY: every function of the header is looked up by name (dynamic_link_require_all).
    let api = match unsafe { TrtShim::from_library(libloading::Library::from(lib)) } {
        Ok(a) => a,
        Err(e) => {
            return Err(TrtError::Unavailable(Missing {
                libraries: missing_libs,
                shim_searched: Vec::new(),
                shim_unloadable: Some((
                    path,
                    format!("{e} (a shim from another trtcache version?)"),
                )),
            }))
        }
    };
    // SAFETY: a function without arguments, found above.
    let found = unsafe { (api.trtcache_trt_abi_version)() };
    if found != super::ffi::TRTCACHE_TRT_ABI_VERSION {
        return Err(TrtError::AbiMismatch {
            path,
            found,
            expected: super::ffi::TRTCACHE_TRT_ABI_VERSION,
        });
    }
    tracing::debug!(shim = %path.display(), libraries = libraries.len(), "TensorRT shim loaded");
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
        match open_trt_library(cfg, &name) {
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
