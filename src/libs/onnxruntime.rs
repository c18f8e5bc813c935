//! ONNX Runtime's shared library: where it is (the one search, used by `trtcache key` and by
//! the build stage's loader alike, so a key always names the library a build would load) and
//! its version, found WITHOUT initialising ort.
//!
//! Search order ([`SEARCH_ORDER`], also in `--help` and docs/cache.md): the configured path
//! (`ort_library`), `ORT_DYLIB_PATH` (either, when set, is authoritative: a wrong one is an
//! error), then an `onnxruntime` Python package: the `.venv` of the checkout the `trtcache`
//! executable itself was built in, `$VIRTUAL_ENV`, then whatever `python3 -I` (isolated: no
//! working directory on its path) imports (`onnxruntime/capi/libonnxruntime.so.*`). Nothing is
//! ever looked for in a place derived from the working directory, and every candidate must pass
//! [`super::trust::trusted_file`] (owned by root or this user, writable by no one else, down
//! every folder of its path) before it is loaded: an explicit one that fails is an error, a
//! searched one is skipped with the reason listed.
//!
//! Supported range: ONNX Runtime >= 1.20 (ort is compiled with `api-20`); tested with 1.31.1.

use std::path::{Path, PathBuf};

use super::is_version;
use super::trust::trusted_file;

/// Oldest ONNX Runtime minor version (1.x) this build can drive; matches ort's `api-20`.
pub const MIN_MINOR: u32 = 20;

/// Why ONNX Runtime could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("ONNX Runtime not found; looked for libonnxruntime in:\n{}\n(the search: {SEARCH_ORDER})\nfix: `pip install onnxruntime` (>= 1.{MIN_MINOR}) in the project's .venv (scripts/setup-python.sh), or set ORT_DYLIB_PATH / the `ort_library` setting to libonnxruntime.so", .looked.iter().map(|l| format!("  - {l}")).collect::<Vec<_>>().join("\n"))]
    NotFound { looked: Vec<String> },
    #[error("{path}: cannot load ONNX Runtime: {why}\nfix: point ORT_DYLIB_PATH / `ort_library` at a working libonnxruntime.so (>= 1.{MIN_MINOR})")]
    Load { path: PathBuf, why: String },
    #[error("{path}: ONNX Runtime {version} is too old: trtcache needs >= 1.{MIN_MINOR}\nfix: `pip install -U onnxruntime` (or onnxruntime-gpu) and point ORT_DYLIB_PATH / `ort_library` at the new libonnxruntime.so")]
    TooOld { path: PathBuf, version: String },
    #[error("ONNX Runtime environment: {0}")]
    Environment(String),
    #[error("{0}\nfix: install ONNX Runtime where only root or this user can write (owner root or uid {uid}, no group/other write bit on the file or any folder above it), or fix the modes", uid = super::trust::effective_uid())]
    Untrusted(#[from] super::trust::Untrusted),
}

/// Where ONNX Runtime is looked for, in order: one line each (`--help` and errors quote it).
pub const SEARCH_ORDER: &str = "the `ort_library` setting, else ORT_DYLIB_PATH (either one, when set, is the only place tried), \
else the .venv of the checkout the trtcache executable was built in, else $VIRTUAL_ENV, else the onnxruntime package \
that `python3 -I` (or $TRTCACHE_PYTHON) imports; never a place derived from the working directory, and never a library \
that a user other than root or the caller could have written (the file or any folder above it)";

/// `1.31.1` from `libonnxruntime.so.1.31.1` (or `libonnxruntime.1.31.1.dylib`); a symlink
/// such as `libonnxruntime.so` is followed to its versioned target.
pub fn version_from_path(path: &Path) -> Option<String> {
    let from_name = |p: &Path| {
        let name = p.file_name()?.to_str()?;
        let v = name
            .strip_prefix("libonnxruntime.so.")
            .or_else(|| name.strip_prefix("libonnxruntime.")?.strip_suffix(".dylib"))?;
        is_version(v).then(|| v.to_string())
    };
    from_name(path).or_else(|| from_name(&std::fs::canonicalize(path).ok()?))
}

/// Finds the library and its version without initialising ort: the version comes from the
/// file name (`libonnxruntime.so.1.31.1`, a symlink followed), else from the library's own
/// `GetVersionString` (a `dlopen`, no ort state). `trtcache key` uses this, so its key names
/// the library a build would load.
pub fn locate(configured: Option<&Path>) -> Result<(PathBuf, String), RuntimeError> {
    let path = find(configured)?;
    let version = match version_from_path(&path) {
        Some(v) => v,
        None => probe_version(&loadable(&path)?)?,
    };
    Ok((path, version))
}

/// Finds the library without loading it, in the documented order. The path returned is the
/// one found (its name may carry the version, e.g. a `libonnxruntime.so.1.30.0` link) and has
/// passed the trust check; the loader checks it again and loads the resolved file
/// ([`loadable`]).
pub fn find(configured: Option<&Path>) -> Result<PathBuf, RuntimeError> {
    // An explicit setting is authoritative: a wrong one is an error, not a reason to load
    // some other library silently.
    if let Some(p) = configured {
        if p.is_file() {
            trusted_file(p)?;
            return Ok(p.to_path_buf());
        }
        return Err(RuntimeError::NotFound {
            looked: vec![format!(
                "config ort_library = {} (no such file)",
                p.display()
            )],
        });
    }
    let mut looked = vec!["config ort_library (not set)".to_string()];
    match std::env::var_os("ORT_DYLIB_PATH") {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            if p.is_file() {
                trusted_file(&p)?;
                return Ok(p);
            }
            looked.push(format!("ORT_DYLIB_PATH = {} (no such file)", p.display()));
            return Err(RuntimeError::NotFound { looked });
        }
        _ => looked.push("ORT_DYLIB_PATH (not set)".into()),
    }
    let mut venvs: Vec<PathBuf> = Vec::new();
    match crate::config::exe_checkout() {
        Some(root) => venvs.push(root.join(".venv")),
        None => looked.push("the executable's checkout (not run from one)".into()),
    }
    if let Some(v) = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty()) {
        venvs.push(PathBuf::from(v));
    } else {
        looked.push("$VIRTUAL_ENV (not set)".into());
    }
    for venv in venvs {
        match in_venv(&venv) {
            Some(p) => match trusted_file(&p) {
                Ok(_) => return Ok(p),
                Err(e) => looked.push(format!("{} (refused: {e})", p.display())),
            },
            None => looked.push(format!(
                "{}/lib/python3*/site-packages/onnxruntime/capi/ (no libonnxruntime.so.*)",
                venv.display()
            )),
        }
    }
    let python = std::env::var_os("TRTCACHE_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    match from_python(&python) {
        Ok(p) => match trusted_file(&p) {
            Ok(_) => return Ok(p),
            Err(e) => looked.push(format!("{} (refused: {e})", p.display())),
        },
        Err(why) => looked.push(format!(
            "`{} -I -c 'import onnxruntime'` ({why})",
            python.display()
        )),
    }
    Err(RuntimeError::NotFound { looked })
}

/// The file to `dlopen` for a library [`find`] returned: resolved and checked again right
/// before loading, so a link swapped since is not followed.
pub fn loadable(found: &Path) -> Result<PathBuf, RuntimeError> {
    Ok(trusted_file(found)?)
}

/// The CUDA major an ONNX Runtime GPU build was made for (`13` for onnxruntime-gpu 1.31.1 from
/// PyPI), read from the `build_and_package_info.py` the wheel ships next to its library
/// (`cuda_version = '13.0'`); `None` for a CPU build or a library without that file.
pub fn cuda_major(library: &Path) -> Option<String> {
    let info = library.parent()?.join("build_and_package_info.py");
    let text = std::fs::read_to_string(info).ok()?;
    cuda_major_in(&text)
}

/// [`cuda_major`] of the text of `build_and_package_info.py`.
fn cuda_major_in(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        if k.trim() != "cuda_version" {
            return None;
        }
        let v = v.trim().trim_matches(|c| c == '\'' || c == '"');
        let major = v.split('.').next()?;
        (!major.is_empty() && major.bytes().all(|b| b.is_ascii_digit())).then(|| major.to_string())
    })
}

/// The library this process loaded (told by the build stage's loader), if any.
static LOADED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Records the library the process loaded: later questions about "the library a build
/// would load" answer about it (one library per process).
pub fn note_loaded(path: &Path) {
    let _ = LOADED.set(path.to_path_buf());
}

/// [`cuda_major`] of the library a build would load now (the loaded one, or the search's).
pub fn cuda_major_of_loader_choice() -> Option<String> {
    let path = match LOADED.get() {
        Some(p) => p.clone(),
        None => find(None).ok()?,
    };
    cuda_major(&path)
}

/// Entries of `dir` whose file name starts with `prefix`, sorted; `None` when `dir` cannot be
/// read.
fn entries_named(dir: &Path, prefix: &str) -> Option<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    found.sort();
    Some(found)
}

fn newest_lib(capi: &Path) -> Option<PathBuf> {
    entries_named(capi, "libonnxruntime.so.")?.pop()
}

fn in_venv(venv: &Path) -> Option<PathBuf> {
    entries_named(&venv.join("lib"), "python3")?
        .into_iter()
        .rev()
        .find_map(|py| newest_lib(&py.join("site-packages/onnxruntime/capi")))
}

fn from_python(python: &Path) -> Result<PathBuf, String> {
    // -I (isolated): the working directory is not on the import path and PYTHON* variables
    // are ignored, so a planted `onnxruntime/` next to where trtcache was started is not
    // imported (and run) as this user.
    let out = std::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run: {e}"))?;
    if !out.status.success() {
        return Err("no onnxruntime package".into());
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    newest_lib(&dir.join("capi"))
        .ok_or_else(|| format!("no libonnxruntime.so.* in {}/capi", dir.display()))
}

/// Reads the library's version (`OrtGetApiBase()->GetVersionString()`) without touching
/// ort's global state, so a too-old library gives our error instead of ort's.
fn probe_version(path: &Path) -> Result<String, RuntimeError> {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    let load_err = |why: String| RuntimeError::Load {
        path: path.to_path_buf(),
        why,
    };
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|e| load_err(e.to_string()))?;
    // SAFETY: dlopen/dlsym with valid C strings; the handle is kept open (ort loads the same
    // library next and the process keeps it for its lifetime), the symbol is ORT's C entry
    // point with the documented signature.
    unsafe {
        let handle = libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let err = libc::dlerror();
            let why = if err.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(err).to_string_lossy().into_owned()
            };
            return Err(load_err(why));
        }
        let sym = libc::dlsym(handle, c"OrtGetApiBase".as_ptr());
        if sym.is_null() {
            return Err(load_err(
                "does not export OrtGetApiBase: not an ONNX Runtime library".into(),
            ));
        }
        let get_base: unsafe extern "C" fn() -> *const ort::sys::OrtApiBase =
            std::mem::transmute(sym);
        let base = get_base();
        if base.is_null() {
            return Err(load_err("OrtGetApiBase returned null".into()));
        }
        let v = ((*base).GetVersionString)();
        if v.is_null() {
            return Err(load_err("GetVersionString returned null".into()));
        }
        Ok(CStr::from_ptr(v).to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        let v = |s: &str| version_from_path(Path::new(s));
        assert_eq!(v("/x/libonnxruntime.so.1.31.1").as_deref(), Some("1.31.1"));
        assert_eq!(v("libonnxruntime.1.22.0.dylib").as_deref(), Some("1.22.0"));
        assert_eq!(v("/nonexistent/libonnxruntime.so"), None);
        assert_eq!(v("libonnxruntime.so.1.x"), None);
    }

    #[test]
    fn symlink_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("libonnxruntime.so.1.30.2");
        std::fs::write(&real, b"").unwrap();
        let link = d.path().join("libonnxruntime.so");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(version_from_path(&link).as_deref(), Some("1.30.2"));
    }

    #[test]
    fn missing_configured_library_is_listed() {
        match find(Some(Path::new("/nonexistent/libonnxruntime.so"))) {
            Err(RuntimeError::NotFound { looked }) => {
                assert!(looked[0].contains("/nonexistent/libonnxruntime.so"))
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn not_a_library_is_a_load_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("libonnxruntime.so.1.99.0");
        std::fs::write(&p, b"not an ELF file").unwrap();
        let e = probe_version(&p).unwrap_err();
        assert!(matches!(e, RuntimeError::Load { .. }), "{e}");
    }

    #[test]
    fn cuda_major_of_a_gpu_wheel() {
        // onnxruntime-gpu 1.31.1's capi/build_and_package_info.py, and the CPU wheel's.
        let gpu = "package_name = 'onnxruntime-gpu'\n__version__ = '1.31.1'\ncuda_version = '13.0'\ncudnn_version = '9.8'\n";
        assert_eq!(cuda_major_in(gpu).as_deref(), Some("13"));
        assert_eq!(
            cuda_major_in("cuda_version = \"12.8\"").as_deref(),
            Some("12")
        );
        assert_eq!(
            cuda_major_in("package_name = 'onnxruntime'\n__version__ = '1.31.1'\n"),
            None
        );
        assert_eq!(cuda_major_in("cuda_version = ''"), None);
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("build_and_package_info.py"), gpu).unwrap();
        assert_eq!(
            cuda_major(&d.path().join("libonnxruntime.so.1.31.1")).as_deref(),
            Some("13")
        );
    }

    #[test]
    fn error_lists_fix() {
        let e = RuntimeError::NotFound {
            looked: vec!["ORT_DYLIB_PATH (not set)".into()],
        };
        let s = e.to_string();
        assert!(s.contains("ORT_DYLIB_PATH (not set)") && s.contains("pip install onnxruntime"));
    }
}
