//! The daemon's metrics: one prometheus-client registry, encoded for the socket's `stats`
//! request (`format: prometheus`) and for the HTTP listener's `/metrics` (`super::http`),
//! and the readiness rule `/readyz` and `trtcache health --ready` share.
//!
//! Enters: a [`Snapshot`] the service takes at each scrape: its counters, its two duration
//! histograms ([`Durations`], observed where acquires and builds end) and every model's
//! variant states. Leaves: Prometheus text (0.0.4) or OpenMetrics text. Per-model series are capped at `limits.metrics_max_models` model labels (in name
//! order); the other models are summed under `model="/other"` (no model name has a `/`).

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use trtcache_client::protocol::{ModelStatus, Stats, VariantState};

/// The label value the models beyond the cap are summed under.
pub const OTHER_MODELS: &str = "/other";

const STATES: [VariantState; 5] = [
    VariantState::Ready,
    VariantState::Building,
    VariantState::Queued,
    VariantState::Failed,
    VariantState::Missing,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

/// A duration histogram by outcome (`hit`, `miss`, `error` for acquires; `ok`, `failed`,
/// `cancelled` for builds). Clones share their counts.
#[derive(Clone, Debug)]
pub struct Durations(Family<Outcome, Histogram, fn() -> Histogram>);

fn acquire_buckets() -> Histogram {
    // 50 µs (a hit from memory) to 52 s (an acquire that waited for a build), ×4.
    Histogram::new(exponential_buckets(5e-5, 4.0, 11))
}

fn build_buckets() -> Histogram {
    // 0.25 s (a small ort-cpu build) to 2.3 h (past the default build timeout), ×2.
    Histogram::new(exponential_buckets(0.25, 2.0, 16))
}

impl Durations {
    /// Acquire latency, from the request to the artifact's descriptors being ready.
    pub fn acquires() -> Self {
        Durations(Family::new_with_constructor(acquire_buckets))
    }

    /// Build time, from the build's start in a worker to its stored (or failed) end.
    pub fn builds() -> Self {
        Durations(Family::new_with_constructor(build_buckets))
    }

    /// Records one duration.
    pub fn observe(&self, outcome: &'static str, d: Duration) {
        self.0
            .get_or_create(&Outcome { outcome })
            .observe(d.as_secs_f64());
    }
}

/// The text format to encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text exposition 0.0.4 (`text/plain; version=0.0.4`).
    Prometheus,
    /// OpenMetrics 1.0 text (ends with `# EOF`).
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// What one scrape reads, taken from the service at once (`Service::metrics_snapshot`).
#[derive(Debug)]
pub struct Snapshot {
    /// The counters.
    pub stats: Stats,
    /// Every model's status (its variants' states).
    pub models: Vec<ModelStatus>,
    /// `limits.metrics_max_models`.
    pub max_models: usize,
    /// Acquire latency by outcome (shares its counts with the service's).
    pub acquire_seconds: Durations,
    /// Build time by outcome (shares its counts with the queue's).
    pub build_seconds: Durations,
}

/// Every metric of `snap`. Its cost grows with the models (a series per model and state):
/// the socket and the HTTP listener call it on the blocking pool.
pub fn encode(snap: Snapshot, format: Format) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("trtcache");
    reg.register(
        "build",
        "The daemon's version",
        Info::new([("version", env!("CARGO_PKG_VERSION"))]),
    );
    reg.register_with_unit(
        "acquire_duration",
        "Acquire latency by outcome (hit: served from the cache, miss: waited for a build, error)",
        Unit::Seconds,
        snap.acquire_seconds.0,
    );
    reg.register_with_unit(
        "build_duration",
        "Build time by outcome (ok, failed, cancelled), validation included",
        Unit::Seconds,
        snap.build_seconds.0,
    );
    reg.register_collector(Box::new(Counts {
        stats: snap.stats,
        models: snap.models,
        max_models: snap.max_models,
    }));
    let mut out = String::new();
    match format {
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &reg)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &reg)?,
    }
    Ok(out)
}

/// The counters and states of one scrape, as a collector.
#[derive(Debug)]
struct Counts {
    stats: Stats,
    models: Vec<ModelStatus>,
    max_models: usize,
}

/// Writes one unlabelled metric.
fn one<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    m: M,
) -> Result<(), std::fmt::Error> {
    m.encode(enc.encode_descriptor(name, help, unit, m.metric_type())?)
}

/// One sample of a family: its labels and its value.
type Sample<'a, M> = (&'a [(&'a str, &'a str)], M);

/// Writes one metric family of samples (nothing when there are none).
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[Sample<'_, M>],
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = samples.first() else {
        return Ok(());
    };
    let mut metric = enc.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, m) in samples {
        m.encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Counts {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.stats;
        let c = ConstCounter::new;
        family(
            &mut enc,
            "acquires",
            "Acquires by outcome: hit (from the cache), miss (waited for a build), error.",
            &[
                (&[("outcome", "hit")], c(s.hits)),
                (&[("outcome", "miss")], c(s.misses)),
                (&[("outcome", "error")], c(s.acquire_errors)),
            ],
        )?;
        family(
            &mut enc,
            "builds",
            "Builds by outcome: ok (built here, validated and stored; artifacts fetched from the fleet bucket are fetches_total), failed (timeouts included), cancelled.",
            &[
                (&[("outcome", "ok")], c(s.builds)),
                (&[("outcome", "failed")], c(s.failures)),
                (&[("outcome", "cancelled")], c(s.cancelled)),
            ],
        )?;
        one(
            &mut enc,
            "fetches",
            "Artifacts fetched from the fleet bucket (verified and stored) in place of a build; not in builds_total.",
            None,
            c(s.fetches),
        )?;
        family(
            &mut enc,
            "evictions",
            "Artifacts evicted: size (least recently used, to fit limits.cache_size_bytes), request (evict).",
            &[
                (&[("reason", "size")], c(s.evictions)),
                (&[("reason", "request")], c(s.evictions_requested)),
            ],
        )?;
        for (name, help, v) in [
            (
                "ready_index_hits",
                "Acquires answered from the ready index (a consumer opened a pointer; also in acquires{outcome=\"hit\"}).",
                s.fast_hits,
            ),
            (
                "remote_hits",
                "Local misses answered from the fleet bucket.",
                s.remote_hits,
            ),
            (
                "remote_misses",
                "Local misses the fleet bucket could not answer.",
                s.remote_misses,
            ),
            (
                "remote_uploads",
                "Artifacts uploaded to the fleet bucket.",
                s.remote_uploads,
            ),
            (
                "remote_rejected",
                "Fleet manifests or blobs refused.",
                s.remote_rejected,
            ),
            (
                "remote_errors",
                "Fleet tier network or server errors.",
                s.remote_errors,
            ),
        ] {
            one(&mut enc, name, help, None, c(v))?;
        }
        let g = ConstGauge::new;
        for (name, help, v) in [
            ("queue_depth", "Builds waiting for a slot.", s.queue_depth),
            ("builds_running", "Builds running.", s.building),
            ("models", "Models served.", s.models),
            ("connections", "Open socket connections.", s.connections),
            (
                "artifacts_in_memory",
                "Ready artifacts held in memory for the current models.",
                s.artifacts_in_memory,
            ),
        ] {
            one(&mut enc, name, help, None, g(v))?;
        }
        one(
            &mut enc,
            "uptime",
            "Seconds since the daemon started.",
            Some(&Unit::Seconds),
            ConstGauge::new(s.uptime_seconds),
        )?;
        self.states(&mut enc)
    }
}

impl Counts {
    /// `variants{state}` over every model, and `model_variants{model,state}` per model up to
    /// the cap, the rest summed under [`OTHER_MODELS`].
    fn states(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let index = |st: VariantState| STATES.iter().position(|s| *s == st).unwrap_or(0);
        let mut total = [0u64; STATES.len()];
        let mut per_model: Vec<(&str, [u64; STATES.len()])> = Vec::new();
        let mut other = [0u64; STATES.len()];
        let mut sorted: Vec<&ModelStatus> = self.models.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        for (i, m) in sorted.iter().enumerate() {
            let mut counts = [0u64; STATES.len()];
            for v in &m.variants {
                counts[index(v.state)] += 1;
                total[index(v.state)] += 1;
            }
            if i < self.max_models {
                per_model.push((&m.name, counts));
            } else {
                for (o, n) in other.iter_mut().zip(counts) {
                    *o += n;
                }
            }
        }
        let names: Vec<String> = STATES.iter().map(|s| s.to_string()).collect();
        let totals: Vec<[(&str, &str); 1]> =
            names.iter().map(|n| [("state", n.as_str())]).collect();
        let samples: Vec<Sample<'_, ConstGauge<u64>>> = totals
            .iter()
            .zip(total)
            .map(|(l, v)| (l.as_slice(), ConstGauge::new(v)))
            .collect();
        family(
            enc,
            "variants",
            "Model variants (profile x backend) by state, over every model.",
            &samples,
        )?;
        if sorted.len() > self.max_models {
            per_model.push((OTHER_MODELS, other));
        }
        let labels: Vec<[(&str, &str); 2]> = per_model
            .iter()
            .flat_map(|(model, _)| {
                names
                    .iter()
                    .map(|n| [("model", *model), ("state", n.as_str())])
            })
            .collect();
        let values = per_model
            .iter()
            .flat_map(|(_, counts)| counts.iter().copied());
        let samples: Vec<Sample<'_, ConstGauge<u64>>> = labels
            .iter()
            .zip(values)
            .map(|(l, v)| (l.as_slice(), ConstGauge::new(v)))
            .collect();
        family(
            enc,
            "model_variants",
            "Variants of each model by state; models past limits.metrics_max_models are summed under model=\"/other\".",
            &samples,
        )
    }
}

/// A variant (or model) that is not ready, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NotReady {
    pub model: String,
    pub backend: String,
    pub profile: String,
    pub state: VariantState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.backend.is_empty() {
            return write!(f, "{}: {}", self.model, self.state);
        }
        write!(
            f,
            "{} {} {}: {}",
            self.model, self.backend, self.profile, self.state
        )
    }
}

/// The readiness rule: ready when every variant of every model is ready. A model with no
/// variant to serve (no servable version) is not ready.
pub fn not_ready(models: &[ModelStatus]) -> Vec<NotReady> {
    let mut out = Vec::new();
    for m in models {
        if m.variants.is_empty() {
            out.push(NotReady {
                model: m.name.clone(),
                backend: String::new(),
                profile: String::new(),
                state: VariantState::Missing,
                reason: Some("no servable version".into()),
            });
        }
        for v in m.variants.iter().filter(|v| v.state != VariantState::Ready) {
            out.push(NotReady {
                model: m.name.clone(),
                backend: v.backend.clone(),
                profile: v.profile.clone(),
                state: v.state,
                reason: v.reason.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trtcache_client::protocol::VariantStatus;

    fn model(name: &str, states: &[VariantState]) -> ModelStatus {
        ModelStatus {
            name: name.into(),
            version: 0,
            versions: vec![0],
            layout: "flat".into(),
            variants: states
                .iter()
                .map(|s| VariantStatus {
                    profile: "default".into(),
                    backend: "ort-cpu".into(),
                    precision: "fp32".into(),
                    state: *s,
                    key: None,
                    reason: None,
                    phase: None,
                    origin: None,
                    runtime: None,
                    validated_at: None,
                    also_validated_at: None,
                })
                .collect(),
        }
    }

    fn snapshot_text(models: Vec<ModelStatus>, max_models: usize) -> String {
        let mut reg = Registry::with_prefix("trtcache");
        reg.register_collector(Box::new(Counts {
            stats: Stats {
                hits: 7,
                misses: 2,
                builds: 3,
                failures: 1,
                ..Default::default()
            },
            models,
            max_models,
        }));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &reg).unwrap();
        out
    }

    #[test]
    fn counters_carry_their_outcome_and_models_past_the_cap_are_summed() {
        let models = vec![
            model("c", &[VariantState::Failed]),
            model("a", &[VariantState::Ready, VariantState::Building]),
            model("b", &[VariantState::Ready]),
        ];
        let text = snapshot_text(models, 1);
        for line in [
            "trtcache_acquires_total{outcome=\"hit\"} 7",
            "trtcache_acquires_total{outcome=\"miss\"} 2",
            "trtcache_builds_total{outcome=\"ok\"} 3",
            "trtcache_builds_total{outcome=\"failed\"} 1",
            "trtcache_variants{state=\"ready\"} 2",
            "trtcache_model_variants{model=\"a\",state=\"building\"} 1",
            "trtcache_model_variants{model=\"/other\",state=\"ready\"} 1",
            "trtcache_model_variants{model=\"/other\",state=\"failed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("model=\"b\""), "{text}");
        // Five states per labelled model plus the aggregate, however many models there are.
        let series = text
            .lines()
            .filter(|l| l.starts_with("trtcache_model_variants{"))
            .count();
        assert_eq!(series, 10, "{text}");
    }

    #[test]
    fn ready_means_every_variant_of_every_model_is_ready() {
        assert!(not_ready(&[model("a", &[VariantState::Ready])]).is_empty());
        assert!(not_ready(&[]).is_empty());
        let nr = not_ready(&[
            model("a", &[VariantState::Ready, VariantState::Building]),
            model("empty", &[]),
        ]);
        let text: Vec<String> = nr.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            text,
            ["a ort-cpu default: building", "empty: missing"],
            "{nr:?}"
        );
    }
}
