//! The TensorRT shim loader against real `dlopen`: which TensorRT a shim gets (the major its
//! ELF `DT_NEEDED` entries name, with TensorRT 10 and 11 both installed), and the shims it
//! refuses (two majors, a major not accepted, a major not installed, a library older than the
//! shim's headers). Stand-in TensorRT libraries (sonames and `getInferLibVersion` only) and the
//! C test double (`shim/double/`) linked against them; nothing here is TensorRT itself
//! (docs/trt.md).
//!
//! These tests share one process and its loaded libraries: a soname loaded by one satisfies the
//! same soname everywhere after, so every stand-in of a major reports the same version, and the
//! missing-major case uses a major (12) no other test loads.

use std::path::{Path, PathBuf};

use trtcache::trt::{LoaderConfig, Trt, TrtError};

use crate::trt::{cc, double, double_src};

/// A stand-in TensorRT library: soname `libNAME.so.MAJOR`, and for libnvinfer a
/// `getInferLibVersion` returning `version` (the same per major in every test, as tests share
/// one process and its loaded libraries).
fn stub_trt(dir: &Path, base: &str, major: u32) -> PathBuf {
    let version = major * 10000 + if major == 10 { 1601 } else { 100 };
    let src = dir.join(format!("{base}{major}.c"));
    std::fs::write(
        &src,
        format!("int getInferLibVersion(void) {{ return {version}; }}\nint {base}_stub(void) {{ return {major}; }}\n"),
    )
    .unwrap();
    let so = format!("{base}.so.{major}");
    let out = dir.join(&so);
    cc(&[&src], &out, &[&format!("-Wl,-soname,{so}")]);
    out
}

/// The double linked (DT_NEEDED) against the given stand-ins in `lib`, reporting the version of
/// the libnvinfer it binds to.
fn linked_double(dir: &Path, lib: &Path, needed: &[&str], compiled: u32) -> PathBuf {
    let out = dir.join("libtrtcache_trt.so");
    let mut args = vec![
        "-DDOUBLE_LINK_TRT".to_string(),
        format!("-DDOUBLE_COMPILED_VERSION={compiled}"),
        "-Wl,--no-as-needed".to_string(),
        format!("-L{}", lib.display()),
    ];
    args.extend(needed.iter().map(|n| format!("-l:{n}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cc(&[&double_src()], &out, &args);
    out
}

/// With TensorRT 10 and 11 both installed, a shim linked against 11 gets 11: the loader reads
/// the shim's DT_NEEDED entries and opens that major only (it used to open 10 globally first,
/// and the shim's symbols bound to 10's).
#[test]
fn the_shim_binds_the_tensorrt_it_was_linked_against() {
    let root = tempfile::tempdir().unwrap();
    let lib = root.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    for major in [10, 11] {
        stub_trt(&lib, "libnvinfer", major);
        stub_trt(&lib, "libnvonnxparser", major);
    }
    let shim_dir = tempfile::tempdir().unwrap();
    let shim = linked_double(
        shim_dir.path(),
        &lib,
        &["libnvinfer.so.11", "libnvonnxparser.so.11"],
        110100,
    );
    let trt = Trt::load(&LoaderConfig {
        shim: Some(shim),
        tensorrt_root: Some(root.path().to_path_buf()),
        ..LoaderConfig::default()
    })
    .unwrap();
    assert_eq!(trt.version().to_string(), "11.1.0");
    assert_eq!(trt.compiled_version().to_string(), "11.1.0");
    let libs: Vec<String> = trt
        .libraries()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(libs, vec!["libnvinfer.so.11", "libnvonnxparser.so.11"]);
}

/// A shim this trtcache cannot run with is refused before any call into it, saying why: linked
/// against two majors, against a major the loader does not accept, or against one whose
/// libraries are not installed.
#[test]
fn a_shim_for_another_tensorrt_is_refused_precisely() {
    let root = tempfile::tempdir().unwrap();
    let lib = root.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    for major in [10, 11] {
        stub_trt(&lib, "libnvinfer", major);
    }
    let load = |shim: PathBuf, majors: Vec<u32>, root: &Path| {
        Trt::load(&LoaderConfig {
            shim: Some(shim),
            tensorrt_root: Some(root.to_path_buf()),
            majors,
        })
        .err()
        .unwrap()
    };
    let two = tempfile::tempdir().unwrap();
    let e = load(
        linked_double(
            two.path(),
            &lib,
            &["libnvinfer.so.10", "libnvinfer.so.11"],
            110100,
        ),
        Vec::new(),
        root.path(),
    );
    assert!(matches!(e, TrtError::ShimMismatch { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("linked against TensorRT 10 and TensorRT 11 at once"),
        "{e}"
    );
    let eleven = tempfile::tempdir().unwrap();
    let shim11 = linked_double(eleven.path(), &lib, &["libnvinfer.so.11"], 110100);
    let e = load(shim11.clone(), vec![10], root.path()).to_string();
    assert!(
        e.contains("linked against TensorRT 11 (libnvinfer.so.11), and this trtcache loads TensorRT 10 only"),
        "{e}"
    );
    // TensorRT 10 installed, the shim built for another major (12 here: no other test loads
    // it into this process, where a loaded soname would satisfy it): named, with what to install.
    let twelve = tempfile::tempdir().unwrap();
    stub_trt(twelve.path(), "libnvinfer", 12);
    let shim12 = linked_double(twelve.path(), twelve.path(), &["libnvinfer.so.12"], 120000);
    std::fs::remove_file(twelve.path().join("libnvinfer.so.12")).unwrap();
    let only10 = tempfile::tempdir().unwrap();
    std::fs::create_dir(only10.path().join("lib")).unwrap();
    stub_trt(&only10.path().join("lib"), "libnvinfer", 10);
    let e = load(shim12, vec![10, 12], only10.path());
    assert!(matches!(e, TrtError::Unavailable(_)), "{e:?}");
    let msg = e.to_string();
    for want in [
        "TensorRT's libnvinfer.so.12 not found",
        "could not be opened: it needs libnvinfer.so.12 (TensorRT 12)",
        "install TensorRT 12",
    ] {
        assert!(msg.contains(want), "missing {want:?} in {msg}");
    }
}

/// The loaded TensorRT must be of the shim's major and no older than its headers.
#[test]
fn a_tensorrt_older_than_the_shims_headers_is_refused() {
    let load = |defines: &[&str]| {
        let d = tempfile::tempdir().unwrap();
        let r = Trt::load(&LoaderConfig {
            shim: Some(double(d.path(), defines)),
            ..LoaderConfig::default()
        });
        r.map(|t| t.version().to_string())
            .map_err(|e| e.to_string())
    };
    let e = load(&[
        "-DDOUBLE_VERSION=100800",
        "-DDOUBLE_COMPILED_VERSION=100900",
    ])
    .unwrap_err();
    assert!(
        e.contains("compiled against TensorRT 10.9.0 headers, but the libnvinfer loaded is TensorRT 10.8.0, older"),
        "{e}"
    );
    let e = load(&[
        "-DDOUBLE_VERSION=101601",
        "-DDOUBLE_COMPILED_VERSION=110100",
    ])
    .unwrap_err();
    assert!(
        e.contains("the libnvinfer it bound to is TensorRT 10.16.1"),
        "{e}"
    );
    // A newer library of the same major serves an older shim.
    assert_eq!(
        load(&[
            "-DDOUBLE_VERSION=101601",
            "-DDOUBLE_COMPILED_VERSION=100000"
        ])
        .unwrap(),
        "10.16.1"
    );
}
