//! Trust boundaries on a shared host (issue "Nothing on the host or in the bucket can make
//! trtcache run, serve or delete what it should not", section 1): where libraries are loaded
//! from, which folders are caches and what a store may delete in them, and which setting wins
//! when a flag, a config file and the environment disagree. Each test reproduces what a
//! co-tenant or an operator's ordinary mistake did to the code before the fix.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use super::support::{cmd, json, ort_dylib};

fn model(dir: &Path) -> PathBuf {
    let p = dir.join("enc.onnx");
    trtcache::fixtures::write(&trtcache::fixtures::models::tiny_encoder(true), &p).unwrap();
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A user's folder that happens to have `tmp/` and `blobs/` entries, as `--cache-dir .` or a
/// project's own `cache/` would.
fn users_folder(dir: &Path) -> [PathBuf; 3] {
    std::fs::create_dir_all(dir.join("tmp/draft")).unwrap();
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    let files = [
        dir.join("tmp/draft/thesis.tex"),
        dir.join("blobs/photo.jpg"),
        dir.join("notes.txt"),
    ];
    for f in &files {
        std::fs::write(f, b"the user's own").unwrap();
    }
    files
}

fn all_there(files: &[PathBuf]) {
    for f in files {
        assert_eq!(
            std::fs::read(f).unwrap_or_default(),
            b"the user's own",
            "{} was changed or deleted",
            f.display()
        );
    }
}

#[test]
fn a_folder_that_is_not_a_cache_is_refused_and_untouched() {
    let d = tempfile::tempdir().unwrap();
    let folder = d.path().join("work");
    let files = users_folder(&folder);
    let m = model(d.path());
    let ort = ort_dylib();
    let key = "0".repeat(64);
    for args in [
        vec!["ls", "--cache-dir"],
        vec!["gc", "--max-size", "0", "--cache-dir"],
        vec!["verify", "--cache-dir"],
        vec!["verify", "--repair", "--cache-dir"],
        vec!["rm", key.as_str(), "--cache-dir"],
    ] {
        let out = cmd().args(&args).arg(&folder).output().unwrap();
        assert!(!out.status.success(), "{args:?} accepted a user's folder");
        assert!(
            stderr(&out).contains("is not a trtcache cache"),
            "{args:?}: {}",
            stderr(&out)
        );
        all_there(&files);
    }
    let out = cmd()
        .args(["build", m.to_str().unwrap(), "--cache-dir"])
        .arg(&folder)
        .env("ORT_DYLIB_PATH", &ort)
        .output()
        .unwrap();
    assert!(!out.status.success(), "build took over a user's folder");
    assert!(
        stderr(&out).contains("is not a trtcache cache"),
        "{}",
        stderr(&out)
    );
    all_there(&files);
    assert!(!folder.join("CACHEDIR.TAG").exists());
    assert!(!folder.join("db").exists() && !folder.join("lock").exists());
}

#[test]
fn a_store_deletes_only_what_it_named_and_ls_deletes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let m = model(d.path());
    let out = cmd()
        .args(["build", m.to_str().unwrap(), "--json", "--cache-dir"])
        .arg(&cache)
        .env("ORT_DYLIB_PATH", ort_dylib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let tag = std::fs::read_to_string(cache.join("CACHEDIR.TAG")).unwrap();
    assert!(
        tag.starts_with("Signature: 8a477f597d28d172789f06886806bc55"),
        "{tag}"
    );
    // What a crash leaves (the store's own names) and what a user put there.
    let leftover_build = cache.join("tmp/build-AbC123");
    let leftover_blob = cache.join("blobs").join("ab".repeat(32));
    std::fs::create_dir_all(leftover_build.join("x")).unwrap();
    std::fs::create_dir_all(&leftover_blob).unwrap();
    std::fs::create_dir_all(cache.join("tmp/mine")).unwrap();
    let theirs = [
        cache.join("tmp/mine/thesis.tex"),
        cache.join("blobs/photo.jpg"),
    ];
    for f in &theirs {
        std::fs::write(f, b"the user's own").unwrap();
    }
    // A listing changes nothing at all.
    let out = cmd()
        .args(["ls", "--json", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        json(&out).as_array().map(Vec::len),
        Some(1),
        "{}",
        stderr(&out)
    );
    assert!(
        leftover_build.exists() && leftover_blob.exists(),
        "ls cleaned the cache"
    );
    all_there(&theirs);
    // A writing open (gc) cleans the store's own leftovers and nothing else.
    let out = cmd()
        .args(["gc", "--max-size", "10G", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !leftover_build.exists(),
        "the store's temp leftover was kept"
    );
    assert!(!leftover_blob.exists(), "the store's orphan blob was kept");
    all_there(&theirs);
}

#[test]
fn a_cache_from_before_the_tag_is_adopted() {
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let m = model(d.path());
    let build = |c: &Path| {
        cmd()
            .args(["build", m.to_str().unwrap(), "--json", "--cache-dir"])
            .arg(c)
            .env("ORT_DYLIB_PATH", ort_dylib())
            .output()
            .unwrap()
    };
    assert!(build(&cache).status.success());
    // An older trtcache wrote no tag: such a cache is still read, and tagged when written.
    std::fs::remove_file(cache.join("CACHEDIR.TAG")).unwrap();
    let out = cmd()
        .args(["ls", "--json", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!cache.join("CACHEDIR.TAG").exists(), "ls wrote the tag");
    let out = build(&cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        json(&out)["cache_hit"],
        true,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(cache.join("CACHEDIR.TAG").exists());
}

#[test]
fn a_plain_ls_in_a_project_leaves_its_cache_folder_alone() {
    // A Rust project (Cargo.toml) with a `cache/` folder of its own, and no setting naming a
    // cache: the default must not be derived from the working directory.
    let d = tempfile::tempdir().unwrap();
    let project = d.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("Cargo.toml"), "[package]\nname = \"p\"\n").unwrap();
    let files = users_folder(&project.join("cache"));
    let home = d.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // (Read-only commands only: the default may be this checkout's own cache.)
    for args in [vec!["ls"], vec!["config"]] {
        let out = cmd()
            .args(&args)
            .current_dir(&project)
            .env_remove("TRTCACHE_CACHE_DIR")
            .env_remove("TRTCACHE_CONFIG")
            .env("HOME", &home)
            .env_remove("XDG_CACHE_HOME")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(
            !text.contains(&project.join("cache").display().to_string()),
            "{args:?} resolved the project's cache/: {text}"
        );
        all_there(&files);
    }
}

/// A folder above the working directory with `Cargo.toml` and a `.venv` holding an
/// "ONNX Runtime" of another version: the version is read from the file name, so `key`
/// shows which library a build would load without loading it.
#[test]
fn onnx_runtime_is_never_looked_for_above_the_working_directory() {
    let d = tempfile::tempdir().unwrap();
    let shared = d.path().join("shared");
    let capi = shared.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
    std::fs::create_dir_all(&capi).unwrap();
    std::fs::write(shared.join("Cargo.toml"), "[package]\nname = \"p\"\n").unwrap();
    std::fs::write(capi.join("libonnxruntime.so.1.99.0"), b"planted").unwrap();
    let work = shared.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let m = model(d.path());
    let out = cmd()
        .args(["key", m.to_str().unwrap(), "--json", "--no-memo"])
        .current_dir(&work)
        .env_remove("ORT_DYLIB_PATH")
        .env_remove("TRTCACHE_ORT_LIBRARY")
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        !text.contains("1.99.0"),
        "the planted library was chosen: {text}"
    );
    assert!(!text.contains(&shared.display().to_string()), "{text}");
}

/// A library (or a folder above it) that someone other than root or this user can write is
/// never loaded, even when named explicitly.
#[test]
fn a_library_others_can_write_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let m = model(d.path());
    let real = ort_dylib();
    let name = real.file_name().unwrap();
    let shared = d.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let copy = shared.join(name);
    std::fs::copy(&real, &copy).unwrap();
    type Setup<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Setup)> = vec![
        (
            "group/other-writable folder",
            Box::new(|| {
                std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap()
            }),
        ),
        (
            "world-writable file",
            Box::new(|| {
                std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
                std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o666)).unwrap()
            }),
        ),
    ];
    for (what, setup) in cases {
        setup();
        for args in [
            vec!["key", m.to_str().unwrap(), "--json", "--no-memo"],
            vec!["build", m.to_str().unwrap(), "--json", "--cache-dir"],
        ] {
            let mut c = cmd();
            c.args(&args);
            if args[0] == "build" {
                c.arg(d.path().join("cache"));
            }
            let out = c.env("ORT_DYLIB_PATH", &copy).output().unwrap();
            assert!(!out.status.success(), "{what}: {args:?} loaded it");
            assert!(
                stderr(&out).contains("refusing to load it"),
                "{what}: {args:?}: {}",
                stderr(&out)
            );
        }
    }
    // And the same file, private again, loads.
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cmd()
        .args(["key", m.to_str().unwrap(), "--json", "--no-memo"])
        .env("ORT_DYLIB_PATH", &copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn flags_beat_the_config_file_which_beats_the_environment() {
    let d = tempfile::tempdir().unwrap();
    let (from_file, from_env, from_flag) = (
        d.path().join("file-cache"),
        d.path().join("env-cache"),
        d.path().join("flag-cache"),
    );
    let cfg = d.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!("cache_dir = {:?}\n", from_file.display().to_string()),
    )
    .unwrap();
    let m = model(d.path());
    // One entry in the file's cache, none in the environment's.
    for c in [&from_file, &from_env] {
        std::fs::create_dir_all(c).unwrap();
    }
    let out = cmd()
        .args(["build", m.to_str().unwrap(), "--json", "--cache-dir"])
        .arg(&from_file)
        .env("ORT_DYLIB_PATH", ort_dylib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let key = json(&out)["key"].as_str().unwrap().to_string();
    let out = cmd()
        .args([
            "build",
            m.to_str().unwrap(),
            "--json",
            "--no-rewrite",
            "--cache-dir",
        ])
        .arg(&from_env)
        .env("ORT_DYLIB_PATH", ort_dylib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The operator's shell names another cache; --config names the daemon's.
    let ls = |extra: &[&str]| {
        let out = cmd()
            .args(["ls", "--json", "--config"])
            .arg(&cfg)
            .args(extra)
            .env("TRTCACHE_CACHE_DIR", &from_env)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        json(&out)
    };
    let listed = ls(&[]);
    assert_eq!(listed[0]["key"], key.as_str(), "{listed}");
    let out = cmd()
        .args(["config", "--config"])
        .arg(&cfg)
        .env("TRTCACHE_CACHE_DIR", &from_env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "# cache_dir: from the config file {}",
            cfg.display()
        )),
        "{text}"
    );
    assert!(text.contains(&from_file.display().to_string()), "{text}");
    // Without the file, the environment; a flag beats both.
    let out = cmd()
        .arg("config")
        .env("TRTCACHE_CACHE_DIR", &from_env)
        .env_remove("TRTCACHE_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("# cache_dir: from the environment (TRTCACHE_CACHE_DIR)"),
        "{text}"
    );
    let out = cmd()
        .args(["config", "--config"])
        .arg(&cfg)
        .arg("--cache-dir")
        .arg(&from_flag)
        .env("TRTCACHE_CACHE_DIR", &from_env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("# cache_dir: from the --cache-dir flag"),
        "{text}"
    );
    assert!(text.contains(&from_flag.display().to_string()), "{text}");
}
