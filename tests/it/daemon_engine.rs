//! The daemon over the real build/cache stage: the key it serves is the key `trtcache key`
//! prints for the same model and sidecar; `trtcache warm` without a daemon fills the cache
//! that `trtcache serve` then serves without building; cache maintenance commands name the
//! daemon when it holds the cache.

use std::process::Command;

use trtcache::fixtures::{models, write};

use crate::daemon::{artifact_session, assert_close, reference, run_encoder, Daemon};
use crate::support;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn warm_then_serve_serves_the_key_trtcache_key_prints_without_building() {
    let mut d = Daemon::new();
    let model = d.models().join("enc.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    // A sidecar: one named profile and its own tolerance, as deploys write them.
    std::fs::write(
        d.models().join("enc.trtcache.toml"),
        "[profiles.short]\nmin = \"x:1x1x64\"\nopt = \"x:2x8x64\"\nmax = \"x:4x32x64\"\n\
         [tolerances.fp32]\natol = 0.001\nrtol = 0.01\n[golden]\nseed = 3\n",
    )
    .unwrap();
    // No daemon: warm builds in-process into the cache.
    let out = Command::new(support::bin())
        .args(["warm", "--json", "--config"])
        .arg(d.config())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stderr(&out),
        String::from_utf8_lossy(&out.stdout)
    );
    let warm = support::json(&out);
    assert_eq!(warm[0]["state"], "ready", "{warm}");
    assert_eq!(warm[0]["cached"], false, "{warm}");
    assert_eq!(warm[0]["profile"], "short", "{warm}");
    let warm_key = warm[0]["key"].as_str().unwrap().to_string();

    let key = support::json(&support::trtcache([
        "key".to_string(),
        model.display().to_string(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
        "--ort-library".into(),
        support::ort_dylib().display().to_string(),
        "--json".into(),
    ]));
    assert_eq!(key["key"], warm_key.as_str(), "{key}");
    assert_eq!(
        key["parts"]["profile"]["opt"]["x"],
        serde_json::json!([2, 8, 64])
    );

    d.start();
    let mut c = d.client();
    let art = c.acquire_model("enc").unwrap();
    assert_eq!(art.metadata.key, warm_key);
    assert_eq!(art.metadata.backend, "ort-cpu");
    assert_eq!(art.metadata.profile, "short");
    assert!(art.metadata.validation.passed);
    assert_eq!(art.metadata.files[0].role, "graph");
    // The capability analysis's plan for ort-cpu: every partition on the CPU provider.
    assert!(!art.metadata.providers.is_empty(), "{:?}", art.metadata);
    assert!(art
        .metadata
        .providers
        .iter()
        .all(|p| p == "CPUExecutionProvider"));
    // The artifact is the optimized model, not a copy of the file.
    assert_ne!(
        art.graph_bytes().unwrap(),
        std::fs::read(&model).unwrap(),
        "served the model itself"
    );
    let s = c.stats().unwrap();
    assert_eq!(
        (s.builds, s.hits),
        (0, 1),
        "served from the warm cache: {s:?}"
    );
    let mut sess = artifact_session(&art);
    assert_close(&run_encoder(&mut sess, 8), &reference(&model, 8), "enc");

    // `status` through the daemon lists the same key as ready.
    let st = support::json(&support::trtcache([
        "status".to_string(),
        "--json".into(),
        "--socket".into(),
        d.socket().display().to_string(),
    ]));
    let v = &st[0]["variants"][0];
    assert_eq!(
        (v["state"].as_str(), v["key"].as_str()),
        (Some("ready"), Some(warm_key.as_str())),
        "{st}"
    );

    // Maintenance commands point at the daemon instead of failing with a bare pid.
    let ls = support::trtcache([
        "ls".to_string(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
    ]);
    assert_eq!(ls.status.code(), Some(2), "{}", stderr(&ls));
    let msg = stderr(&ls);
    assert!(
        msg.contains("trtcache status") && msg.contains("daemon"),
        "{msg}"
    );
    drop(c);
    assert!(d.stop());
    // With the daemon stopped, ls reads the cache directly.
    let ls = support::trtcache([
        "ls".to_string(),
        "--json".into(),
        "--cache-dir".into(),
        d.cache().display().to_string(),
    ]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    let recs = support::json(&ls);
    assert!(recs
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["key"] == warm_key.as_str() && r["status"]["state"] == "ready"));
}
