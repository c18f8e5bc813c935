//! Replays every input kept under `fuzz/regressions/TARGET/` (each a finding of a fuzz run,
//! fixed since, or a hand-written hostile case) plus the example models through the same
//! functions the fuzz targets run (`trtcache::fuzzing`): none may panic. A new finding is
//! kept by copying it from `fuzz/artifacts/TARGET/` into `fuzz/regressions/TARGET/`.

use std::path::Path;

#[test]
fn every_kept_fuzz_input_runs_without_panicking() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for (target, run) in trtcache::fuzzing::TARGETS {
        let dir = root.join("fuzz/regressions").join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        if target == "onnx_inspect" {
            files.extend(
                std::fs::read_dir(root.join("examples/models"))
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "onnx")),
            );
        }
        files.sort();
        assert!(!files.is_empty(), "nothing kept for {target}");
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| run(&data));
            assert!(r.is_ok(), "{target} panicked on {}", f.display());
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} inputs");
}
