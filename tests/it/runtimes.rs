//! Runtime upgrades without cold starts (docs/daemon.md, "Upgrading the runtime"), with two
//! real ONNX Runtime versions: the project's `.venv` one (current) and the incoming one
//! `scripts/setup-python.sh` installs in `.venv/runtimes/`. Consumers on the old version are
//! served throughout; `warm --runtime NEW` pre-builds every model; a consumer on the new
//! version then gets its artifacts with zero builds on the acquire path; after the switch gc
//! evicts the runtime nobody uses first and keeps what is in use.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use trtcache::fixtures::{models, write};

use crate::daemon::Daemon;
use crate::support;

/// The incoming runtime's folder (`PYTHONPATH` for a consumer on it) and library.
fn incoming() -> (PathBuf, PathBuf, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/runtimes");
    let dir = std::fs::read_dir(&root)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run scripts/setup-python.sh (it installs the incoming runtime)",
                root.display()
            )
        })
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("onnxruntime-"))
        })
        .expect("an incoming onnxruntime in .venv/runtimes: run scripts/setup-python.sh");
    let version = dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("onnxruntime-")
        .to_string();
    let lib = dir
        .join("onnxruntime/capi")
        .join(format!("libonnxruntime.so.{version}"));
    assert!(lib.is_file(), "{}", lib.display());
    (dir, lib, version)
}

/// The current runtime's version (the `.venv` library's file name).
fn current_version() -> String {
    let lib = support::ort_dylib();
    let name = lib.file_name().unwrap().to_string_lossy().into_owned();
    name.trim_start_matches("libonnxruntime.so.").to_string()
}

/// A Python consumer: acquires each model through the Python client (`runtime="auto"`: the
/// onnxruntime it imports), runs one inference, and prints `model key runtime-version`.
/// `pythonpath`: the incoming runtime's folder, for a consumer on it.
fn consumer(
    d: &Daemon,
    models: &[&str],
    pythonpath: Option<&Path>,
) -> Vec<(String, String, String)> {
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import onnxruntime as ort
import trtcache_client as t
c = t.Client(sys.argv[2])
assert c.runtime == {"onnxruntime": ort.__version__}, (c.runtime, ort.__version__)
for m in sys.argv[3:]:
    a = c.acquire(m)
    s = a.session()
    feed = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 2 for d in i.shape]
        feed[i.name] = (np.arange(np.prod(shape)) % 7).reshape(shape).astype(np.int64 if "int64" in i.type else np.float32)
    s.run(None, feed)
    print(m, a.metadata["key"], a.metadata.get("runtime", {}).get("onnxruntime", "?"), ort.__version__)
"#;
    let mut c = Command::new(support::python());
    c.arg("-c")
        .arg(script)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python"))
        .arg(d.socket())
        .args(models);
    if let Some(p) = pythonpath {
        c.env("PYTHONPATH", p);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "consumer failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "{l}");
            assert_eq!(
                f[2], f[3],
                "served an artifact built for another runtime: {l}"
            );
            (f[0].to_string(), f[1].to_string(), f[2].to_string())
        })
        .collect()
}

fn builds(d: &Daemon) -> u64 {
    d.client().stats().unwrap().builds
}

fn cli(d: &Daemon, args: &[&str]) -> Output {
    support::cmd()
        .args(args)
        .arg("--config")
        .arg(d.config())
        .output()
        .unwrap()
}

#[test]
fn a_runtime_upgrade_is_prebuilt_served_without_builds_and_kept_by_gc() {
    let (incoming_dir, incoming_lib, new) = incoming();
    let old = current_version();
    assert_ne!(old, new);
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    write(&models::tiny_encoder(true), &d.models().join("enc2.onnx")).unwrap();
    d.start();
    d.wait_settled(&["enc", "enc2"]);
    let names = ["enc", "enc2"];

    // Consumers on the current runtime.
    let before = consumer(&d, &names, None);
    assert!(before.iter().all(|(_, _, v)| *v == old), "{before:?}");

    // The deploy step: every model pre-built for the incoming runtime.
    let out = cli(
        &d,
        &[
            "warm",
            "--json",
            "--runtime",
            incoming_lib.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "warm --runtime: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let results = support::json(&out);
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 2, "{results:?}");
    for r in results {
        assert_eq!(r["state"], "ready", "{r}");
        assert_eq!(r["runtime"], new.as_str(), "{r}");
    }
    // status lists both runtimes' variants, ready.
    let st = d.client().list().unwrap();
    for m in &st {
        let runtimes: Vec<Option<String>> = m.variants.iter().map(|v| v.runtime.clone()).collect();
        assert!(
            runtimes.contains(&None) && runtimes.contains(&Some(new.clone())),
            "{m:?}"
        );
        assert!(m
            .variants
            .iter()
            .all(|v| v.state == trtcache_client::VariantState::Ready));
        // Which inputs validation ran on, per ready variant (issue 41): realistic sizes.
        for v in &m.variants {
            let shapes = v
                .validated_at
                .as_ref()
                .expect("validated_at of a ready variant");
            assert!(
                shapes.values().all(|s| s.iter().product::<i64>() > 1),
                "{shapes:?}"
            );
            // And the second run's, every free batch axis doubled: `enc` has one
            // (`[batch, seq, 64]`), `enc2` none (`[1, 16, 64]`).
            let static_batch = shapes.values().all(|s| s.first() == Some(&1));
            match &v.also_validated_at {
                Some(also) => {
                    assert!(!static_batch, "{shapes:?} {also:?}");
                    assert_eq!(also["x"][0], 2 * shapes["x"][0], "{also:?}");
                    assert_eq!(also["x"][1..], shapes["x"][1..], "{also:?}");
                }
                None => assert!(static_batch, "no second run for {shapes:?}"),
            }
        }
    }

    // A consumer on the new runtime: its own artifacts, no build on the acquire path.
    let built = builds(&d);
    let after = consumer(&d, &names, Some(&incoming_dir));
    assert!(after.iter().all(|(_, _, v)| *v == new), "{after:?}");
    assert_eq!(
        builds(&d),
        built,
        "an acquire on the new runtime built something"
    );
    for ((m, k_old, _), (_, k_new, _)) in before.iter().zip(&after) {
        assert_ne!(k_old, k_new, "{m}: one key for two runtimes");
    }
    // Old consumers are still served, their artifacts unchanged.
    assert_eq!(consumer(&d, &names, None), before);

    // A consumer on a runtime the daemon has no library for is told so, and served nothing.
    let out = Command::new(support::python())
        .arg("-c")
        .arg(
            r#"
import sys
sys.path.insert(0, sys.argv[1])
import trtcache_client as t
try:
    t.Client(sys.argv[2], runtime="1.20.0", ready_index=False).acquire("enc")
except t.RuntimeUnavailable as e:
    print("refused:", e)
"#,
        )
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python"))
        .arg(d.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("refused: runtime_unavailable") && text.contains("[runtimes]"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The switch: the incoming runtime becomes the current one (a config change and a
    // restart), and the old one is no longer kept once nobody used it recently.
    assert!(d.stop());
    let cfg = std::fs::read_to_string(d.config()).unwrap();
    let cfg = cfg.replace(
        &format!("ort_dylib = {:?}", support::ort_dylib()),
        &format!("ort_dylib = {incoming_lib:?}"),
    );
    std::fs::write(d.config(), format!("{cfg}[runtimes]\nkeep_used_secs = 0\n")).unwrap();
    d.start();
    d.wait_settled(&["enc", "enc2"]);
    assert_eq!(builds(&d), 0, "the switch rebuilt something:\n{}", d.log());
    let switched = consumer(&d, &names, Some(&incoming_dir));
    assert_eq!(switched, after);
    // gc down to one runtime's worth: the old runtime's artifacts go first.
    let out = cli(&d, &["gc", "--json", "--dry-run", "--max-size", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gc = support::json(&out);
    let evicted: Vec<String> = gc["evicted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let old_keys: Vec<&String> = before.iter().map(|(_, k, _)| k).collect();
    assert_eq!(evicted.len(), 4, "{gc}");
    assert!(
        evicted[..2].iter().all(|k| old_keys.contains(&k)),
        "the old runtime's artifacts are evicted first: {evicted:?} (old {old_keys:?})"
    );
}
