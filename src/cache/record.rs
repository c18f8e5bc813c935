//! The versioned record stored per cache key, and the artifact unit the store copies in.
//!
//! Records are JSON in sled (readable by `trtcache ls --json` and by later versions); a
//! record whose `format` is newer than [`RECORD_FORMAT`] is listed but never served.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::key::KeyParts;
use crate::spec::{Backend, CacheKey, Tolerance};

/// Version of the record encoding.
pub const RECORD_FORMAT: u32 = 1;

/// Error of one output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputError {
    pub name: String,
    pub elements: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    /// Elements outside both tolerances.
    pub mismatched: usize,
    pub passed: bool,
    /// Reference elements that are NaN or infinite: they are only checked for being the
    /// same non-finite value, so the comparison says less about them (0 in records written
    /// before the field existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub non_finite: usize,
    /// The reference's element type (`float16`, `float32`, `int64`, …; a sequence's or map's
    /// first tensor's). Absent in records written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The rule its elements were held to: `exact` (integers, bools, strings),
    /// `atol + rtol·|ref|` (float32, float64), or for float16/bfloat16 that or a number of
    /// steps of the type at the output's scale (`spec::Tolerance::rule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Float outputs: the largest error in steps (ulps) of the output's own type, taken at
    /// max(|ref|, rms of the reference) as the float16/bfloat16 rule takes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ulps: Option<f64>,
}

impl OutputError {
    /// The half type (`float16`, `bfloat16`) whose steps the output was compared in: its
    /// own type, or the type a float32/float64 output is a Cast of (said in its `rule`); or
    /// `int8` for an output of dynamically quantized activations (`spec::DYNAMIC_INT8`).
    pub fn steps_of(&self) -> Option<&'static str> {
        let cast = |t: &str| {
            self.rule
                .as_deref()
                .is_some_and(|r| r.ends_with(&format!("(a Cast of {t})")))
        };
        if self
            .rule
            .as_deref()
            .is_some_and(|r| r.contains("int8 steps of"))
        {
            return Some("int8");
        }
        match self.dtype.as_deref() {
            Some("float16") => Some("float16"),
            Some("bfloat16") => Some("bfloat16"),
            _ if cast("float16") => Some("float16"),
            _ if cast("bfloat16") => Some("bfloat16"),
            _ => None,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The outcome of validation, stored in the cache record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    pub passed: bool,
    pub tolerance: Tolerance,
    pub seed: u64,
    /// The golden `.npz` the inputs came from, when one was given.
    #[serde(default)]
    pub golden: Option<String>,
    /// Input name → the concrete shape used.
    pub shapes: BTreeMap<String, Vec<i64>>,
    pub outputs: Vec<OutputError>,
    /// `ort-cpu`/`ort-cuda`: the graph optimization level of the artifact this report is
    /// about, when it is lower than the one asked for (absent when they agree): an artifact
    /// over tolerance is built again one level lower (all → extended → basic → disabled) before the
    /// build counts as failed. See [`ValidationReport::rejected`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opt_level: Option<String>,
    /// The artifacts built first and refused as over tolerance, each with its worst outputs:
    /// one with graph rewrites (`rewrites at all: y max abs …`, built again without them),
    /// the same level without (`all: y max abs 2.5e-3 max rel 2.6e-3`), then the lower levels,
    /// highest first (with the rewrites again when the one without them missed too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<String>,
    /// `ort-cpu`: the artifact's runs timed on the validation inputs with ONNX Runtime's
    /// default intra-op pool and on one thread (absent: not measured, see
    /// [`ThreadProbe`]). Consumers are told the thread count that suits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<ThreadProbe>,
    /// `ort-cpu`: sessions and runs of the artifact timed with its weights prepacked (ONNX
    /// Runtime's default) and without (absent: not measured, see [`PrepackProbe`]).
    /// Consumers are told to skip prepacking when it buys their runs nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepack: Option<PrepackProbe>,
    /// `ort-cpu`: the graph rewrites the artifact has (`builder::backends::ort_cpu::passes`), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<String>,
    /// What the artifact was compared with when it was not the model as given: a rewritten
    /// artifact over tolerance against ONNX Runtime's run of the model is compared with the
    /// model whose rewritten ops compute in float64 (`builder::backends::ort_cpu::passes::exact_reference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The input shapes of a second validation run at every free batch axis doubled
    /// (`outputs` covers both runs), when the default search found the inputs, the model has
    /// a free batch axis and the original model runs there: an artifact that is right at one
    /// batch and wrong or crashing at another (ONNX Runtime 1.31 segfaults at batch 2 on an
    /// artifact with saved prepacked weights it ran at batch 1) is caught.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_at: Option<BTreeMap<String, Vec<i64>>>,
}

/// How an `ort-cpu` artifact ran on the validation inputs with ONNX Runtime's default
/// intra-op thread pool and with one thread, timed in the build worker after validation.
/// Measured only for a model whose first validation run took at most
/// `limits.thread_probe_max_run_ms` and a build with ORT's default thread count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadProbe {
    /// Fastest run, in microseconds, with ONNX Runtime's default pool (older records hold
    /// medians, which a busy machine biased towards one thread).
    pub default_us: f64,
    /// Fastest run, in microseconds, on one thread.
    pub single_us: f64,
    /// Runs timed each way (9 to 50 while 100 ms last: `builder::validate::PROBE_MAX_RUNS`;
    /// always 9 in older records).
    pub runs: u32,
    /// One thread suits the artifact ([`ThreadProbe::single_suits`], and at the scaled
    /// inputs too when [`ThreadProbe::scaled`] was needed): consumers are told
    /// `intra_op_num_threads = 1`.
    pub single: bool,
    /// Validation inputs from the default search (a free dimension at the smallest size the
    /// model accepts): the same timing at inputs whose batch dimensions are `factor` times
    /// those sizes, which one thread must also suit; not timed (a `note` says why, and the
    /// pool is kept) when another dimension is free. Absent for golden inputs, a profile's
    /// opt shapes, static-shape models and map inputs (their inputs are what consumers feed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaled: Option<ScaledProbe>,
}

/// The thread probe at scaled-up inputs ([`ThreadProbe::scaled`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaledProbe {
    /// Each free dimension is this many times its validation size.
    pub factor: i64,
    /// The inputs' shapes.
    pub shapes: BTreeMap<String, Vec<i64>>,
    /// Fastest runs in microseconds, pooled and on one thread (absent when not timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single_us: Option<f64>,
    /// Runs timed each way (absent when not timed; 9 in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Why it was not timed, or stopped: a free dimension that is not a batch, no batch to
    /// scale, the model refused the inputs, or one run took longer than the probe's budget.
    /// One thread is then not advised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl ScaledProbe {
    /// One thread is no slower at these inputs (within 5 % and 2 µs): no bound on the run,
    /// since a longer run here is what the scaling is for.
    pub fn single_suits(&self) -> bool {
        match (self.default_us, self.single_us) {
            (Some(d), Some(s)) => d.is_finite() && s.is_finite() && s <= d * 1.05 + 2.0,
            _ => false,
        }
    }
}

impl ThreadProbe {
    /// One thread suits an artifact whose run takes at most [`ThreadProbe::MAX_RUN_US`] on
    /// the default pool and no longer on one thread: within 5 % and 2 µs (timer and
    /// scheduling noise on a microsecond run). Its consumers then skip creating the pool (a
    /// thread per core) with every session, and no pool thread spins after each run. The
    /// bound keeps a wrong call (a build timed beside other builds) to microseconds a run.
    pub fn single_suits(default_us: f64, single_us: f64) -> bool {
        single_us.is_finite()
            && default_us <= Self::MAX_RUN_US
            && single_us <= default_us * 1.05 + 2.0
    }

    /// The longest pooled run one thread is considered for, in microseconds.
    pub const MAX_RUN_US: f64 = 100.0;
}

/// How an `ort-cpu` artifact's sessions and runs compare with its constant weights
/// prepacked while the session is created (ONNX Runtime's default: MatMul, Gemm, LSTM, ...
/// pack their weights for MLAS once) and without (`session.disable_prepacking`: the kernels
/// pack a weight's panels as each run needs them). Timed in the build worker after
/// validation and the thread probe, with the thread count consumers are told, on the
/// validation inputs (the smallest a free dimension takes: packing at run time costs a run
/// the same whatever its batch, so a larger batch only shrinks its share). Measured only for
/// a model whose first validation run took at most `limits.prepack_probe_max_run_ms` and a
/// build with ORT's default thread count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrepackProbe {
    /// Fastest session creation, in microseconds, with prepacking (of
    /// [`PrepackProbe::SESSIONS`], in this warm process: ONNX Runtime's once-per-process
    /// costs are paid already, so this is the model's own).
    pub session_us: f64,
    /// Fastest session creation, in microseconds, without prepacking.
    pub unpacked_session_us: f64,
    /// Fastest run, in microseconds, with prepacking.
    pub run_us: f64,
    /// Fastest run, in microseconds, without prepacking.
    pub unpacked_run_us: f64,
    /// Runs timed each way (9 to 50: `builder::validate::PROBE_MAX_RUNS`).
    pub runs: u32,
    /// Fastest runs (with prepacking, without) of a second pair of fresh sessions, timed
    /// only when the first pair's favour skipping prepacking, which then needs both pairs'
    /// ([`PrepackProbe::unpacked_suits`] on each): one pair's fastest runs move by up to
    /// ~10 % from the next pair's in the same process. Absent otherwise, and in older
    /// records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_run_us: Option<[f64; 2]>,
    /// The session without prepacking passed the artifact's validation too (same inputs,
    /// reference and tolerance): MLAS's kernels for unpacked weights need not sum in the
    /// same order as for packed ones, and consumers must get validated outputs either way.
    /// Checked only when the timings (both pairs) favour skipping prepacking (absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated: Option<bool>,
    /// Prepacking buys the runs nothing (both pairs of sessions) and costs the session, and
    /// the session without it passed validation ([`PrepackProbe::unpacked_suits`], [`PrepackProbe::validated`]):
    /// consumers are told `session.disable_prepacking = 1`.
    pub disable: bool,
}

impl PrepackProbe {
    /// Sessions created each way.
    pub const SESSIONS: u32 = 3;

    /// Consumers skip prepacking when the session without it is created at least 5 % and
    /// 50 µs faster and its runs are no slower: within 1 % and 0.2 µs (timer noise on a
    /// microsecond run). The run bound is tight on purpose: a session is created once, a
    /// serving consumer runs it millions of times.
    pub fn unpacked_suits(
        session_us: f64,
        unpacked_session_us: f64,
        run_us: f64,
        unpacked_run_us: f64,
    ) -> bool {
        [session_us, unpacked_session_us, run_us, unpacked_run_us]
            .iter()
            .all(|v| v.is_finite())
            && unpacked_session_us <= session_us * 0.95
            && session_us - unpacked_session_us >= 50.0
            && unpacked_run_us <= run_us * 1.01 + 0.2
    }
}

impl ValidationReport {
    /// The outputs over tolerance, one phrase each (`y max abs 1.7e-3 max rel 1.8e-3`).
    pub fn worst(&self) -> String {
        self.outputs
            .iter()
            .filter(|o| !o.passed)
            .map(|o| {
                let steps = match (o.steps_of(), o.max_ulps) {
                    (Some(t), Some(u)) if u < f64::MAX => format!(" ({u:.1} {t} steps)"),
                    _ => String::new(),
                };
                format!(
                    "{} max abs {:.3e} max rel {:.3e}{steps}",
                    o.name, o.max_abs, o.max_rel
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Whether an entry may be served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    /// Built and validated: servable.
    Ready,
    /// The build or its validation failed; kept so it is not rebuilt blindly.
    Failed { reason: String },
    /// `verify` found the files changed; moved aside.
    Quarantined { reason: String },
}

/// One file of a stored artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Plain file name inside the artifact directory.
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Where a stored artifact lives: `blobs/<digest>/`, a content-addressed directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredArtifact {
    /// SHA-256 over the sorted (name, sha256, size) of its files.
    pub digest: String,
    /// The file to open (the graph); the others are its external data.
    pub entry: String,
    pub files: Vec<StoredFile>,
    pub bytes: u64,
}

/// An artifact a backend produced, before it is stored: files in one directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedArtifact {
    pub dir: PathBuf,
    /// File name of the graph to open.
    pub entry: String,
    /// Every file name, `entry` included.
    pub files: Vec<String>,
    /// `ort-cpu`: the graph rewrites applied before optimizing (`builder::backends::ort_cpu::passes`), one line
    /// each; empty when none applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<String>,
}

/// Everything the cache knows about one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub key: CacheKey,
    pub parts: KeyParts,
    pub status: Status,
    pub artifact: Option<StoredArtifact>,
    /// `ort-cpu`, `ort-cuda`, `ort-tensorrt`.
    pub backend: Backend,
    /// Provider → number of top-level nodes it runs, from the capability analysis's plan
    /// for the backend (ONNX Runtime names, e.g. `CPUExecutionProvider`).
    pub providers: Option<BTreeMap<String, usize>>,
    /// The provider of each partition, in graph order (same source); absent in records
    /// written before it existed.
    #[serde(default)]
    pub partitions: Option<Vec<String>>,
    /// Model file the build came from (informational, not part of the key).
    pub model_path: String,
    pub build_ms: u64,
    pub validation: Option<ValidationReport>,
    /// Unix seconds.
    pub created: u64,
    pub last_used: u64,
    pub hits: u64,
    /// Where the artifact came from (see [`Provenance`]); [`Provenance::Unknown`] in
    /// records written before it was kept.
    #[serde(default)]
    pub provenance: Provenance,
}

/// Where a stored artifact came from, so that trust can be checked again later: a fetched
/// entry whose signer is no longer trusted is dropped (at the daemon's start, by `pull` and
/// `push`), and only what this host built and validated itself is ever pushed.
///
/// The default, for records written before the field existed, is `Unknown`, not `Built`:
/// such a record may have been fetched under a key since revoked, and reading it as built
/// here would let `push --all` sign it with this host's key and spread it to hosts that never
/// trusted its builder. Unknown entries are kept and served (what they were before), never
/// pushed; a rebuild (`build --force`) makes them `Built`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Provenance {
    /// Recorded before provenance was kept.
    #[default]
    Unknown,
    /// Built and validated by this host.
    Built,
    /// Fetched from the fleet tier.
    Fetched {
        /// The trusted key whose signature this host verified; `None`: accepted unsigned or
        /// without a check (`remote.trusted_keys` was empty).
        signer: Option<String>,
        /// The builder host the manifest names.
        builder: String,
    },
}

impl Record {
    /// Bytes of the stored artifact (0 when none).
    pub fn bytes(&self) -> u64 {
        self.artifact.as_ref().map_or(0, |a| a.bytes)
    }

    /// A short word for the status.
    pub fn state(&self) -> &'static str {
        match self.status {
            Status::Ready => "ready",
            Status::Failed { .. } => "failed",
            Status::Quarantined { .. } => "quarantined",
        }
    }
}
