//! The deploy step and operating a running daemon: `trtcache warm` right after a copy into
//! the watched folder (also from a slow writer), an empty repository, Triton folders named
//! by `config.pbtxt`, the cache commands (`ls`, `rm`, `gc`, `verify`, `stats`) through the
//! daemon that holds the cache, and `--json` errors. Real daemon, real builds.

use std::io::Write;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use trtcache::fixtures::{models, write};

use crate::daemon::Daemon;
use crate::support;

/// A daemon whose settle interval is long against the slow writer's pause below, so the
/// pause never looks like the end of the copy.
fn daemon_with_settle(ms: u64) -> Daemon {
    let d = Daemon::new();
    let cfg = std::fs::read_to_string(d.config())
        .unwrap()
        .replace("debounce_ms = 150", &format!("debounce_ms = {ms}"));
    std::fs::write(d.config(), cfg).unwrap();
    d
}

fn run(args: &[&str], extra: &[&Path]) -> Output {
    support::cmd().args(args).args(extra).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn warm(d: &Daemon, extra: &[&str]) -> Output {
    support::cmd()
        .args(["warm", "--json", "--config"])
        .arg(d.config())
        .args(extra)
        .output()
        .unwrap()
}

fn result_state(v: &serde_json::Value, model: &str) -> Option<String> {
    v.as_array()?
        .iter()
        .find(|r| r["model"] == model)
        .map(|r| r["state"].as_str().unwrap_or_default().to_string())
}

#[test]
fn warm_right_after_a_copy_waits_for_the_model_and_reports_it_ready() {
    let mut d = daemon_with_settle(1000);
    d.start();
    // An empty repository is an error (a deploy that copied nothing), unless allowed.
    let out = warm(&d, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let v = support::json(&out);
    assert_eq!(v["error"]["code"], "empty_repository", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no models"));
    let out = warm(&d, &["--allow-empty"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(support::json(&out), serde_json::json!([]));

    // A copy into the watched folder, and warm at once.
    let staged = d.root.join("outside/enc.onnx");
    write(&models::tiny_encoder(false), &staged).unwrap();
    std::fs::copy(&staged, d.models().join("enc.onnx")).unwrap();
    let out = warm(&d, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", d.log());
    assert_eq!(
        result_state(&support::json(&out), "enc").as_deref(),
        Some("ready"),
        "{err}"
    );
    assert!(err.contains("1 ready, 0 failed"), "{err}");

    // A slow writer: half the file, a pause, the rest; warm starts during the pause.
    let bytes = {
        let p = d.root.join("outside/slow.onnx");
        write(&models::tiny_encoder(true), &p).unwrap();
        std::fs::read(&p).unwrap()
    };
    let target = d.models().join("slow.onnx");
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::File::create(&target).unwrap();
        f.write_all(&bytes[..bytes.len() / 2]).unwrap();
        f.flush().unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        f.write_all(&bytes[bytes.len() / 2..]).unwrap();
    });
    rx.recv().unwrap();
    let out = warm(&d, &[]);
    writer.join().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", d.log());
    let v = support::json(&out);
    assert_eq!(result_state(&v, "slow").as_deref(), Some("ready"), "{v}");
    assert_eq!(result_state(&v, "enc").as_deref(), Some("ready"), "{v}");
    assert!(err.contains("2 ready, 0 failed"), "{err}");
    // The half-written file was never planned or built: no failure anywhere.
    let s = d.client().stats().unwrap();
    assert_eq!(s.failures, 0, "{s:?}\n{}", d.log());
    assert!(d.stop());
}

#[test]
fn warm_serves_triton_folders_named_by_config_pbtxt_and_names_what_it_skips() {
    let mut d = Daemon::new();
    let m = d.models();
    std::fs::create_dir_all(m.join("tri/1")).unwrap();
    std::fs::create_dir_all(m.join("tri/labels")).unwrap();
    std::fs::write(
        m.join("tri/config.pbtxt"),
        "name: \"tri\"\nplatform: \"onnxruntime_onnx\"\ndefault_model_filename: \"encoder.onnx\"\n",
    )
    .unwrap();
    write(&models::tiny_encoder(false), &m.join("tri/1/encoder.onnx")).unwrap();
    std::fs::write(m.join("README.txt"), "not a model").unwrap();
    d.start();
    let out = warm(&d, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", d.log());
    assert_eq!(
        result_state(&support::json(&out), "tri").as_deref(),
        Some("ready")
    );
    for skipped in ["README.txt", "tri/labels"] {
        let p = m.join(skipped).display().to_string();
        assert!(err.contains(&format!("skipped {p}")), "{skipped}: {err}");
        assert!(
            d.log().contains(&p),
            "daemon log names {skipped}: {}",
            d.log()
        );
    }
    let st = d.client().status("tri").unwrap();
    assert_eq!((st.layout.as_str(), st.version), ("triton", 1), "{st:?}");
    assert!(d.stop());
}

#[test]
fn cache_commands_go_through_the_daemon_that_holds_the_cache() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    d.start();
    d.wait_settled(&["enc"]);
    let cache = d.cache();
    let c = ["--cache-dir".as_ref(), cache.as_path()];

    let out = run(&["ls", "--json"], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("asking it"), "{}", stderr(&out));
    let records = support::json(&out);
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["status"]["state"], "ready");
    let key = records[0]["key"].as_str().unwrap().to_string();
    let out = run(&["ls"], &c);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&key[..16]));

    let out = run(&["verify", "--json"], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = support::json(&out);
    assert_eq!(
        (v["checked"].as_u64(), v["passed"].as_bool()),
        (Some(1), Some(true)),
        "{v}"
    );

    let out = run(&["gc", "--json", "--dry-run", "--max-size", "0"], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(support::json(&out)["evicted"], serde_json::json!([key]));

    let out = run(&["stats", "--json"], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = support::json(&out);
    assert_eq!(
        (s["builds"].as_u64(), s["models"].as_u64()),
        (Some(1), Some(1)),
        "{s}"
    );
    let out = run(&["stats"], &c);
    assert!(String::from_utf8_lossy(&out.stdout).contains("builds"));

    // rm through the daemon: gone from the store and from its memory, so the next acquire
    // builds it again instead of handing out removed files.
    let out = run(&["rm", "--json", &key[..12]], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(support::json(&out)["removed"], key.as_str());
    let out = run(&["ls", "--json"], &c);
    assert_eq!(support::json(&out), serde_json::json!([]));
    let mut client = d.client();
    let art = client.acquire_model("enc").unwrap();
    assert_eq!(art.metadata.key, key);
    assert!(art.metadata.validation.passed);
    assert_eq!(client.stats().unwrap().builds, 2);
    let out = run(&["rm", "--json", "0123456789abcdef"], &c);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(support::json(&out)["error"]["code"], "not_found");

    // Stopped: the same commands open the cache directly.
    drop(client);
    assert!(d.stop());
    let out = run(&["ls", "--json"], &c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("asking it"));
    assert_eq!(support::json(&out).as_array().unwrap().len(), 1);
    let out = run(&["stats", "--json"], &c);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(support::json(&out)["error"]["code"], "no_daemon");
}

#[test]
fn a_missing_cache_dir_is_an_error_for_reads_and_json_errors_are_json() {
    let tmp = tempfile::tempdir().unwrap();
    let typo = tmp.path().join("cahce");
    for cmd in [
        &["ls"][..],
        &["verify"],
        &["gc", "--dry-run"],
        &["rm", "01234567"],
        &["stats"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--json");
        let out = run(&args, &["--cache-dir".as_ref(), typo.as_path()]);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", stderr(&out));
        let v = support::json(&out);
        assert_eq!(v["error"]["code"], "no_such_cache", "{cmd:?}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("cahce"),
            "{v}"
        );
        assert!(!typo.exists(), "{cmd:?} created {}", typo.display());
    }
    // A command that writes creates the directory only inside a folder that exists.
    let deep = tmp.path().join("no/such/cache");
    let model = tmp.path().join("m.onnx");
    write(&models::tiny_encoder(false), &model).unwrap();
    let out = run(
        &["build", "--json", "--cache-dir"],
        &[deep.as_path(), model.as_path()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(support::json(&out)["error"]["code"], "no_such_cache");
    assert!(!tmp.path().join("no").exists());
    // Errors of other commands with --json are JSON on stdout too.
    let out = run(
        &["inspect", "--json"],
        &[tmp.path().join("missing.onnx").as_path()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        support::json(&out)["error"]["code"],
        "not_found",
        "{}",
        stderr(&out)
    );
    let out = run(
        &["status", "--json", "--socket"],
        &[tmp.path().join("nobody.sock").as_path()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(support::json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("nobody.sock"));
}

#[test]
fn a_failed_start_leaves_no_socket_behind() {
    let d = Daemon::new();
    let cfg = std::fs::read_to_string(d.config()).unwrap().replace(
        "[limits]\n",
        "socket_group = \"no-such-group-trtcache\"\n[limits]\n",
    );
    std::fs::write(d.config(), cfg).unwrap();
    let out = support::cmd()
        .args(["serve", "--config"])
        .arg(d.config())
        .env_remove("LISTEN_FDS")
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no-such-group-trtcache"),
        "{}",
        stderr(&out)
    );
    assert!(
        !d.socket().exists(),
        "the failed start left {}",
        d.socket().display()
    );
}

#[test]
fn rescan_from_both_clients_reports_models_and_skipped_entries() {
    let mut d = Daemon::new();
    write(&models::tiny_encoder(false), &d.models().join("enc.onnx")).unwrap();
    std::fs::write(d.models().join("notes.txt"), "x").unwrap();
    d.start();
    let r = d.client().rescan().unwrap();
    assert_eq!(r.models.len(), 1, "{r:?}");
    assert!(r.models[0].settled && r.models[0].name == "enc", "{r:?}");
    assert_eq!(r.skipped.len(), 1, "{r:?}");
    assert!(r.skipped[0].path.ends_with("notes.txt"), "{r:?}");
    assert_eq!(r.settle_ms, 150);
    let py = support::run_python(
        "import sys; sys.path.insert(0, 'clients/python')\n\
         from trtcache_client import Client\n\
         r = Client(sys.argv[1]).rescan()\n\
         print(r['models'][0]['name'], r['models'][0]['settled'], len(r['skipped']))",
        &[&d.socket()],
    );
    assert_eq!(py.trim(), "enc True 1");
    assert!(d.stop());
}
