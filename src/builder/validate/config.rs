//! How to validate ([`ValidationConfig`]) and the defaults the CLI and the daemon share
//! (the thread and prepack probes' limits, the largest random input).

use std::path::PathBuf;

use super::Tolerance;

/// How to validate.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ValidationConfig {
    pub seed: u64,
    /// Integer inputs are drawn from `[lo, hi)`.
    pub int_range: (i64, i64),
    /// Overrides the precision's default tolerance.
    pub tolerance: Option<Tolerance>,
    /// Golden inputs (`.npz`, one array per input name) instead of random ones.
    pub golden: Option<PathBuf>,
    /// Largest total size of the random inputs, in bytes (`limits.validation_max_bytes`): a
    /// model with a huge fixed input is refused with this, before anything is allocated.
    #[serde(default = "default_max_input_bytes")]
    pub max_input_bytes: u64,
    /// `ort-cpu`: after validation, time the artifact's runs with ONNX Runtime's default
    /// thread pool and on one thread (`cache::ThreadProbe`) when its first validation run
    /// took at most this many milliseconds (`limits.thread_probe_max_run_ms`); 0: never.
    #[serde(default = "default_thread_probe_max_run_ms")]
    pub thread_probe_max_run_ms: u64,
    /// `ort-cpu`: after the thread probe, time the artifact's sessions and runs with and
    /// without prepacked weights (`cache::PrepackProbe`) when its first validation run took
    /// at most this many milliseconds (`limits.prepack_probe_max_run_ms`); 0: never.
    #[serde(default = "default_prepack_probe_max_run_ms")]
    pub prepack_probe_max_run_ms: u64,
    /// Default input candidates (by label) the search does not run: ONNX Runtime crashed
    /// running the original model on them in an earlier attempt of this build (the
    /// pipeline adds them, [`crate::builder::Fallback::ReferenceCrashed`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_inputs: Vec<String>,
    /// How many default candidates a build may leave out because ONNX Runtime crashed on
    /// them (`limits.validation_crash_retries`) before the crash is the build's failure.
    #[serde(default = "default_crash_retries")]
    pub crash_retries: u32,
}

/// Default [`ValidationConfig::crash_retries`]: 16 (asr_wespeaker took 11).
pub const DEFAULT_CRASH_RETRIES: u32 = 16;

fn default_crash_retries() -> u32 {
    DEFAULT_CRASH_RETRIES
}

/// Default [`ValidationConfig::thread_probe_max_run_ms`]: 10 ms, so the probe adds at most
/// about 2 × [`THREAD_PROBE_RUNS`] × 10 ms and a session to a build.
pub const DEFAULT_THREAD_PROBE_MAX_RUN_MS: u64 = 10;

/// Fewest runs the thread and prepack probes time each way.
pub const THREAD_PROBE_RUNS: u32 = 9;

/// Most runs the thread and prepack probes time each way: after the first
/// [`THREAD_PROBE_RUNS`] pairs, runs go on while [`PROBE_RUN_BUDGET`] lasts (a 15 µs run's
/// fastest of 9 moved by 2-3 % between builds; of 50, by under 1 %).
pub const PROBE_MAX_RUNS: u32 = 50;

/// Time a probe's runs may take beyond the first [`THREAD_PROBE_RUNS`] pairs.
pub const PROBE_RUN_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// The thread probe's scale for batch dimensions when the validation inputs came from the
/// default search: a batch of 256 where the search found 1 ([`scaled_inputs`]).
pub const THREAD_PROBE_SCALE: i64 = 256;

/// Largest total size of the thread probe's scaled inputs (the scale halves to fit).
pub const THREAD_PROBE_SCALED_MAX_BYTES: u64 = 16 << 20;

fn default_thread_probe_max_run_ms() -> u64 {
    DEFAULT_THREAD_PROBE_MAX_RUN_MS
}

/// Default [`ValidationConfig::prepack_probe_max_run_ms`]: 50 ms, so the probe adds at most
/// about 2 × [`THREAD_PROBE_RUNS`] × 50 ms and six sessions to a build.
pub const DEFAULT_PREPACK_PROBE_MAX_RUN_MS: u64 = 50;

fn default_prepack_probe_max_run_ms() -> u64 {
    DEFAULT_PREPACK_PROBE_MAX_RUN_MS
}

/// Default [`ValidationConfig::max_input_bytes`]: 2 GiB.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 2 << 30;

fn default_max_input_bytes() -> u64 {
    DEFAULT_MAX_INPUT_BYTES
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            // The sidecar's defaults (`plan::GoldenSettings`), so the library and the CLI
            // validate on the same inputs.
            seed: 0,
            int_range: (0, 2),
            tolerance: None,
            golden: None,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            thread_probe_max_run_ms: DEFAULT_THREAD_PROBE_MAX_RUN_MS,
            prepack_probe_max_run_ms: DEFAULT_PREPACK_PROBE_MAX_RUN_MS,
            avoid_inputs: Vec::new(),
            crash_retries: DEFAULT_CRASH_RETRIES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_and_the_cli_probe_threads_under_the_same_default() {
        assert_eq!(
            crate::config::Limits::default().thread_probe_max_run_ms,
            DEFAULT_THREAD_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            ValidationConfig::default().thread_probe_max_run_ms,
            DEFAULT_THREAD_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            crate::config::Limits::default().prepack_probe_max_run_ms,
            DEFAULT_PREPACK_PROBE_MAX_RUN_MS
        );
        assert_eq!(
            ValidationConfig::default().prepack_probe_max_run_ms,
            DEFAULT_PREPACK_PROBE_MAX_RUN_MS
        );
    }
}
