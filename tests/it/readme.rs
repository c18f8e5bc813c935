//! The README's walk-through, run as written, so it cannot drift from what the binary does.
//! The shell block under "## A walk-through" is taken from README.md itself and run by bash
//! in a temp copy of the checkout's layout (`examples/models` copied, an empty `cache/`,
//! `clients/` and `.venv` linked), with `trtcache` the debug binary and two stand-ins on PATH:
//! `make run` starts `trtcache serve` (what the Makefile runs, without the release build), and
//! `cargo run …` runs against the real workspace. A person waits for the daemon to come up
//! before typing the next line: after a line that ends in `&` the test waits for the socket.
//! Every command must exit 0; the daemon is then stopped with SIGTERM and must exit 0 too.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first ```sh block after the `heading` line of `markdown`.
pub(crate) fn shell_block(markdown: &str, heading: &str) -> Option<String> {
    let after = &markdown[markdown.find(&format!("\n{heading}\n"))?..];
    let start = after.find("```sh\n")? + "```sh\n".len();
    let len = after[start..].find("\n```")?;
    Some(after[start..start + len + 1].to_string())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/usr/bin/env bash\n{body}")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_block_is_found_and_a_heading_without_one_is_not() {
    let md = "# x\n\n## A walk-through\n\ntext\n\n```sh\na\nb   # c\n```\n\n## Next\n";
    assert_eq!(
        shell_block(md, "## A walk-through").as_deref(),
        Some("a\nb   # c\n")
    );
    assert_eq!(shell_block(md, "## Next"), None);
}

#[test]
fn the_readme_walk_through_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = shell_block(&readme, "## A walk-through").expect("README has a walk-through");
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    copy_dir(&repo().join("examples/models"), &t.join("examples/models"));
    std::fs::create_dir_all(t.join("cache")).unwrap();
    // A checkout is a folder with Cargo.toml and cache/: the defaults of a binary built in it
    // then point here.
    std::fs::write(t.join("Cargo.toml"), "").unwrap();
    symlink(repo().join("clients"), t.join("clients")).unwrap();
    symlink(repo().join(".venv"), t.join(".venv")).unwrap();
    // The defaults follow the checkout the executable was built in (never the working
    // directory): the binary goes where a build in this checkout puts it.
    let built = t.join("target/release/trtcache");
    std::fs::create_dir_all(built.parent().unwrap()).unwrap();
    if std::fs::hard_link(support::bin(), &built).is_err() {
        std::fs::copy(support::bin(), &built).unwrap();
    }
    let bin = t.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    script(&bin.join("trtcache"), &format!("exec {built:?} \"$@\"\n"));
    script(
        &bin.join("make"),
        "if [ \"$1\" = run ]; then exec trtcache serve; fi\n\
         echo \"make $*: not a walk-through target\" >&2; exit 99\n",
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    script(
        &bin.join("cargo"),
        &format!(
            "if [ \"$1\" = run ]; then shift; exec {cargo:?} run --quiet --manifest-path {manifest:?} \"$@\"; fi\n\
             echo \"cargo $*: not a walk-through command\" >&2; exit 99\n",
            manifest = repo().join("Cargo.toml"),
        ),
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // After a line that starts something in the background (`make run &`), wait until the
    // daemon answers, as a person does before typing the next command.
    let paced: String = block
        .lines()
        .map(|l| {
            let code = l.split(" #").next().unwrap_or(l).trim_end();
            if code.ends_with('&') {
                format!("{l}\n__up\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let full = format!(
        "set -e\n__up() {{ for _ in $(seq 600); do [ -S cache/trtcache.sock ] && return 0; sleep 0.1; done; echo 'the daemon did not come up' >&2; return 1; }}\n\
         {paced}\n\
         for p in $(jobs -p); do kill -TERM $p; wait $p || {{ echo \"daemon exited $?\" >&2; exit 98; }}; done\n"
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&full)
        .current_dir(t)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .env_remove("TRTCACHE_CACHE_DIR")
        .env_remove("TRTCACHE_SOCKET")
        .env_remove("TRTCACHE_CONFIG")
        .env_remove("INVOCATION_ID")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the README walk-through failed ({}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    // It did what it says: warm through the daemon, every model ready, inference ran.
    assert!(stderr.contains("warm: using the daemon"), "{stderr}");
    assert!(!stderr.contains(" 0 ready"), "{stderr}");
    assert!(stdout.contains("(1, 4, 64)"), "{stdout}");
}
