//! What the `ort-cpu` validation times after the artifact passed: whether one intra-op
//! thread serves it as fast as ONNX Runtime's default pool (on the validation inputs, and on
//! batch-scaled ones when the search sized them), and whether sessions opened without
//! prepacking run as fast and as right. Consumers read both from the record.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

use crate::builder::validate;
use crate::builder::{BuildError, Runtime};
use crate::cache::{PrepackProbe, ScaledProbe, ThreadProbe};

/// Whether every input of `session` has one size only: a tensor of fixed dimensions, or a
/// map (one sample, as DictVectorizer reads it: no batch to grow). A sequence's length is
/// free, like a free dimension.
pub(super) fn static_inputs(session: &Session) -> bool {
    session.inputs().iter().all(|i| match i.dtype() {
        ort::value::ValueType::Tensor { shape, .. } => shape.iter().all(|&d| d > 0),
        ort::value::ValueType::Map { .. } => true,
        _ => false,
    })
}

/// Opens an artifact's graph the way the clients do: optimizations off (it is optimized),
/// weights packed on the intra-op threads; `threads` intra-op threads (0: ORT's default).
pub(super) fn open_artifact(
    rt: &Runtime,
    entry: &Path,
    threads: usize,
) -> Result<Session, BuildError> {
    open_artifact_with(rt, entry, threads, true)
}

/// [`open_artifact`], with its constant weights prepacked or not
/// (`session.disable_prepacking`).
fn open_artifact_with(
    rt: &Runtime,
    entry: &Path,
    threads: usize,
    prepack: bool,
) -> Result<Session, BuildError> {
    let mut b = crate::builder::ort::base_builder(rt, entry, threads)?
        .with_optimization_level(GraphOptimizationLevel::Disable)
        .map_err(|e| BuildError::ort("open artifact", entry, e))?
        .with_config_entry("session.prepack.enable_parallel", "1")
        .map_err(|e| BuildError::ort("open artifact", entry, e))?;
    if !prepack {
        b = b
            .with_config_entry("session.disable_prepacking", "1")
            .map_err(|e| BuildError::ort("open artifact", entry, e))?;
    }
    b.commit_from_file(entry)
        .map_err(|e| BuildError::ort("open artifact", entry, e))
}

/// One timed run of `session` on `inputs`, in microseconds.
fn time_run(
    session: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<f64, BuildError> {
    let feed: Vec<(&str, &ort::value::DynValue)> =
        inputs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t = Instant::now();
    drop(
        session
            .run(feed)
            .map_err(|e| BuildError::ort("run", entry, e))?,
    );
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// The fastest run, to the nanosecond (the record shows `2.804`, not `2.8040000000000003`).
/// Not the median: the daemon builds beside other builds, and a busy core only ever adds
/// time, more to a pooled run (it needs two cores at once) than to one on a single thread,
/// so medians taken under load lean towards one thread; each way's fastest of the
/// alternating runs is what it does when the cores it uses are free.
fn fastest(v: Vec<f64>) -> f64 {
    let best = v.into_iter().fold(f64::INFINITY, f64::min);
    (best * 1e3).round() / 1e3
}

/// Alternating runs of `a` and `b` on `inputs` (so a drift in the machine's load falls on
/// both): at least [`validate::THREAD_PROBE_RUNS`] pairs, then more while
/// [`validate::PROBE_RUN_BUDGET`] lasts, up to [`validate::PROBE_MAX_RUNS`] (a microsecond
/// run's fastest of 9 moves by several per cent between builds, enough to flip a decision
/// taken at a 5 % margin; of 50, by under 1 %). Returns each way's fastest and the pairs run.
fn time_pairs(
    a: &mut Session,
    b: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<(f64, f64, u32), BuildError> {
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    let t = Instant::now();
    while on_a.len() < validate::THREAD_PROBE_RUNS as usize
        || (on_a.len() < validate::PROBE_MAX_RUNS as usize
            && t.elapsed() < validate::PROBE_RUN_BUDGET)
    {
        on_a.push(time_run(a, inputs, entry)?);
        on_b.push(time_run(b, inputs, entry)?);
    }
    let runs = on_a.len() as u32;
    Ok((fastest(on_a), fastest(on_b), runs))
}

/// A warm-up run of `a` and of `b` on `inputs`, then [`time_pairs`].
fn warm_pairs(
    a: &mut Session,
    b: &mut Session,
    inputs: &validate::Inputs,
    entry: &Path,
) -> Result<(f64, f64, u32), BuildError> {
    time_run(a, inputs, entry)?;
    time_run(b, inputs, entry)?;
    time_pairs(a, b, inputs, entry)
}

/// Times [`PrepackProbe::SESSIONS`] session creations of `entry` with its weights prepacked
/// and without, alternating, then (after a warm-up run each) runs of the last of each on
/// `inputs`, alternating ([`time_pairs`]); when the timings favour skipping
/// prepacking, times a fresh pair of sessions the same way, and when those agree, validates
/// the session without it (`validate_unpacked`: whether it passes)
/// and says whether consumers should skip it ([`PrepackProbe::disable`]). At most two of
/// these sessions are open at once.
pub(super) fn probe_prepack(
    rt: &Runtime,
    entry: &Path,
    inputs: &validate::Inputs,
    threads: usize,
    validate_unpacked: impl FnOnce(&mut Session) -> Result<bool, BuildError>,
) -> Result<PrepackProbe, BuildError> {
    let (mut packed_us, mut unpacked_us) = (Vec::new(), Vec::new());
    let open = |prepack: bool, times: &mut Vec<f64>| {
        let t = Instant::now();
        let s = open_artifact_with(rt, entry, threads, prepack)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        Ok::<_, BuildError>(s)
    };
    let mut packed = open(true, &mut packed_us)?;
    let mut unpacked = open(false, &mut unpacked_us)?;
    for _ in 1..PrepackProbe::SESSIONS {
        drop(packed);
        packed = open(true, &mut packed_us)?;
        drop(unpacked);
        unpacked = open(false, &mut unpacked_us)?;
    }
    let (run_us, unpacked_run_us, runs) = warm_pairs(&mut packed, &mut unpacked, inputs, entry)?;
    let (session_us, unpacked_session_us) = (fastest(packed_us), fastest(unpacked_us));
    drop(packed);
    let mut suits =
        PrepackProbe::unpacked_suits(session_us, unpacked_session_us, run_us, unpacked_run_us);
    let mut confirm = None;
    if suits {
        // Skipping prepacking costs every run where the timings were wrong, and one pair of
        // sessions' fastest runs moves by up to ~10 % from the next pair's in the same
        // process: a second pair of fresh sessions must agree.
        drop(unpacked);
        let mut packed = open_artifact_with(rt, entry, threads, true)?;
        unpacked = open_artifact_with(rt, entry, threads, false)?;
        let (again, unpacked_again, _) = warm_pairs(&mut packed, &mut unpacked, inputs, entry)?;
        drop(packed);
        confirm = Some([again, unpacked_again]);
        suits =
            PrepackProbe::unpacked_suits(session_us, unpacked_session_us, again, unpacked_again);
    }
    let validated = if suits {
        Some(validate_unpacked(&mut unpacked)?)
    } else {
        None
    };
    let probe = PrepackProbe {
        session_us,
        unpacked_session_us,
        run_us,
        unpacked_run_us,
        runs,
        confirm_run_us: confirm,
        validated,
        disable: suits && validated == Some(true),
    };
    tracing::info!(
        session_us = format!("{session_us:.1}"),
        unpacked_session_us = format!("{unpacked_session_us:.1}"),
        run_us = format!("{run_us:.1}"),
        unpacked_run_us = format!("{unpacked_run_us:.1}"),
        confirm_run_us = ?confirm,
        validated = ?validated,
        disable = probe.disable,
        "timed the artifact's sessions and runs with its weights prepacked and without"
    );
    Ok(probe)
}

/// What the thread probe times besides the validation inputs.
pub(super) enum Scale {
    /// Nothing: the validation inputs are what consumers feed (golden inputs, a profile's
    /// opt shapes, a static-shape model's only shapes).
    Fed,
    /// Inputs the default search sized: also the batch-scaled shapes
    /// ([`validate::scaled_shapes`]; `Err`: why there are none), which one thread must suit too, and
    /// the values the graph names for its inputs ([`super::vocab`]) to fill them with.
    Batch(
        Result<(i64, validate::Shapes), String>,
        BTreeMap<String, validate::vocab::Known>,
    ),
}

/// Times `pooled` (a session with ONNX Runtime's default intra-op pool, run once already)
/// against a new one-thread session of `entry` on `inputs`: one warm-up run of the new
/// session, then alternating runs ([`time_pairs`]), and says whether
/// one thread suits the artifact ([`ThreadProbe::single_suits`]). With [`Scale::Batch`],
/// one thread must also suit the scaled inputs ([`ScaledProbe::single_suits`]), whose
/// values are made only when one thread suits the validation inputs; scaled inputs that
/// cannot be made, that the model refuses, or whose first run is over `cap` are recorded and
/// advise the pool.
pub(super) fn probe_threads(
    rt: &Runtime,
    entry: &Path,
    pooled: &mut Session,
    inputs: &validate::Inputs,
    scale: Scale,
    cfg: &validate::ValidationConfig,
    cap: Duration,
) -> Result<ThreadProbe, BuildError> {
    let mut single = open_artifact(rt, entry, 1)?;
    time_run(&mut single, inputs, entry)?;
    let (default_us, single_us, runs) = time_pairs(pooled, &mut single, inputs, entry)?;
    let mut fits = ThreadProbe::single_suits(default_us, single_us);
    let scaled = match scale {
        Scale::Fed => None,
        Scale::Batch(shaped, known) => {
            let mut p = ScaledProbe {
                factor: 1,
                shapes: Default::default(),
                default_us: None,
                single_us: None,
                runs: None,
                note: None,
            };
            match shaped {
                Err(why) => p.note = Some(why),
                Ok((factor, shapes)) => {
                    (p.factor, p.shapes) = (factor, shapes);
                    if fits {
                        time_scaled(&mut p, pooled, &mut single, entry, &known, cfg, cap)?;
                    } else if default_us > ThreadProbe::MAX_RUN_US {
                        p.note = Some(format!(
                            "not timed: the pooled run at the validation inputs is over {} µs",
                            ThreadProbe::MAX_RUN_US
                        ));
                    } else {
                        p.note =
                            Some("not timed: one thread is slower at the validation inputs".into());
                    }
                }
            }
            fits = fits && p.single_suits();
            Some(p)
        }
    };
    let probe = ThreadProbe {
        default_us,
        single_us,
        runs,
        single: fits,
        scaled,
    };
    tracing::info!(
        default_us = format!("{default_us:.1}"),
        single_us = format!("{single_us:.1}"),
        scaled = ?probe.scaled,
        single = probe.single,
        "timed the artifact's runs on ONNX Runtime's default pool and on one thread"
    );
    Ok(probe)
}

/// Times `pooled` and `single` on random inputs of `p.shapes` into `p`, or says in
/// `p.note` why not.
fn time_scaled(
    p: &mut ScaledProbe,
    pooled: &mut Session,
    single: &mut Session,
    entry: &Path,
    known: &BTreeMap<String, validate::vocab::Known>,
    cfg: &validate::ValidationConfig,
    cap: Duration,
) -> Result<(), BuildError> {
    let big = match validate::random_inputs(pooled, entry, &p.shapes, cfg, known) {
        Ok(big) => big,
        Err(e) => {
            p.note = Some(format!("the scaled inputs could not be made: {e}"));
            return Ok(());
        }
    };
    match time_run(pooled, &big, entry) {
        Ok(first) if first > cap.as_secs_f64() * 1e6 => {
            p.note = Some(format!(
                "a run took {:.1} ms, over the probe's budget (limits.thread_probe_max_run_ms)",
                first / 1e3
            ));
        }
        Ok(_) => {
            time_run(single, &big, entry)?;
            let (d, s, runs) = time_pairs(pooled, single, &big, entry)?;
            (p.default_us, p.single_us, p.runs) = (Some(d), Some(s), Some(runs));
        }
        Err(e) => p.note = Some(format!("the artifact refused them: {e}")),
    }
    Ok(())
}
