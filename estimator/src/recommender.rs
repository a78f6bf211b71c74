//! The VPA estimator, per (autoscaler, container) on this node.
//!
//! It follows the VPA recommender v1.8.1 rule by rule; each rule below names the VPA file
//! (paths under `pkg/recommender/` of k8s.io/autoscaler/vertical-pod-autoscaler) it comes
//! from. `estimator/tests/vpa_differential.rs` replays the same traces through VPA's own code
//! (`tests/vpa/cmd/recommend`) and checks that both agree.
//!
//! CPU: every sample (cores used over one sample interval, rounded up to whole millicores as
//! VPA's metrics client does) goes into a decaying histogram with the same fixed weight, 0.1,
//! whatever the container's request.
//!
//! Memory: one peak (working set) per aggregation interval (24 h). Peaks go into a decaying
//! histogram too, each weighing 1 at the end of its interval; when a later sample raises the
//! interval's peak, the old peak is taken out and the new one put in. Old peaks are not
//! dropped after a number of intervals: they lose half their weight every half-life (24 h). An
//! OOM kill adds a peak of `max(used + oom_min_bump, used × oom_bump_ratio)` where
//! `used = max(request, this interval's peak of real samples)`.
//!
//! Figures: target = p90, lower bound = p50, upper bound = p95 of each histogram, plus the
//! safety margin (15 %). Bounds are widened by the confidence `c = min(days between the first
//! and last CPU sample, CPU samples / 1440)`: upper × (1 + 1/c), lower × (1 + 0.001/c)^−2.
//! Everything is at least the per-pod floor (25 millicores, 250 MiB) divided by the pod's
//! container count.
//!
//! Where nodewarden differs, on purpose: it keeps fractions of millicores and bytes through
//! every step and the agent rounds up when it publishes, while VPA truncates to whole
//! millicores and bytes after each step (percentile, margin, confidence factor, floor); and
//! with no confidence (no CPU history) the upper bound is absent rather than VPA's maximum
//! amount. See `docs/estimator.md`.

use serde::{Deserialize, Serialize};

use crate::histogram::{DecayingHistogram, HistogramError, HistogramOptions, StoredHistogram, stored_time};

/// One mebibyte, in bytes.
pub const MIB: f64 = 1024.0 * 1024.0;
const DAY_MS: i64 = 24 * 3600 * 1000;

/// Estimator constants; the defaults are the VPA recommender's: percentiles, margin, floors
/// and confidence interval from `config/config.go` (`DefaultRecommenderConfig`, lines
/// 125-135), confidence multipliers and exponents from `logic/recommender.go`
/// (`CreatePodResourceRecommender`, lines 162-178), half-lives, interval, OOM bump and sample
/// weight from `model/aggregations_config.go` (lines 60-82).
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorConfig {
    /// Usage percentile of the target (0.9).
    pub target_percentile: f64,
    /// Usage percentile of the lower bound (0.5).
    pub lower_bound_percentile: f64,
    /// Usage percentile of the upper bound (0.95).
    pub upper_bound_percentile: f64,
    /// Fraction added to every figure (0.15).
    pub safety_margin: f64,
    /// Upper bound × (1 + multiplier / confidence)^exponent: the multiplier (1).
    pub upper_confidence_multiplier: f64,
    /// The upper bound's exponent (1).
    pub upper_confidence_exponent: f64,
    /// Lower bound × (1 + multiplier / confidence)^exponent: the multiplier (0.001).
    pub lower_confidence_multiplier: f64,
    /// The lower bound's exponent (−2).
    pub lower_confidence_exponent: f64,
    /// Samples that count as one day of confidence (VPA: one per minute).
    pub confidence_samples_per_day: f64,
    /// Smallest CPU figure per pod, in cores, shared among its containers (0.025).
    pub pod_min_cpu_cores: f64,
    /// Smallest memory figure per pod, in bytes, shared among its containers (250 MiB).
    pub pod_min_memory_bytes: f64,
    /// An OOM kill adds a peak of at least the memory used × this (1.2).
    pub oom_bump_ratio: f64,
    /// An OOM kill adds a peak of at least the memory used + this many bytes (100 MiB).
    pub oom_min_bump_bytes: f64,
    /// The weight of every CPU sample (VPA's `minSampleWeight`, `model/aggregations_config.go`
    /// line 62, which `model/aggregate_container_state.go` line 254 gives to each sample).
    pub min_cpu_sample_weight: f64,
    /// Half-life of CPU samples' weight, in milliseconds (24 h).
    pub cpu_half_life_ms: i64,
    /// Half-life of memory peaks' weight, in milliseconds (24 h).
    pub memory_half_life_ms: i64,
    /// Length of a memory aggregation interval, in milliseconds (24 h); one peak per interval.
    pub memory_interval_ms: i64,
    /// Intervals after which a history with no new sample is dropped (VPA: the aggregate
    /// expires, `model/aggregate_container_state.go` line 306); peaks are not counted.
    pub memory_interval_count: usize,
    /// Bucket layout of the CPU histogram (cores).
    pub cpu_options: HistogramOptions,
    /// Bucket layout of the memory histogram (bytes).
    pub memory_options: HistogramOptions,
}

/// Histogram layouts from the bucket growth: CPU from 0.01 core to 1000 cores, memory from
/// 1e7 B to 1e12 B. Epsilon is 0.001 × the minimum sample weight, as in VPA
/// (`model/aggregations_config.go`, lines 65 and 89-111).
pub fn histogram_options(
    bucket_growth: f64,
    min_cpu_sample_weight: f64,
) -> Result<(HistogramOptions, HistogramOptions), HistogramError> {
    let epsilon = 0.001 * min_cpu_sample_weight;
    Ok((
        HistogramOptions::exponential(1000.0, 0.01, 1.0 + bucket_growth, epsilon)?,
        HistogramOptions::exponential(1e12, 1e7, 1.0 + bucket_growth, epsilon)?,
    ))
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        let (cpu_options, memory_options) =
            histogram_options(0.05, 0.1).expect("the VPA default histogram options are valid constants");
        EstimatorConfig {
            target_percentile: 0.9,
            lower_bound_percentile: 0.5,
            upper_bound_percentile: 0.95,
            safety_margin: 0.15,
            upper_confidence_multiplier: 1.0,
            upper_confidence_exponent: 1.0,
            lower_confidence_multiplier: 0.001,
            lower_confidence_exponent: -2.0,
            confidence_samples_per_day: 1440.0,
            pod_min_cpu_cores: 0.025,
            pod_min_memory_bytes: 250.0 * MIB,
            oom_bump_ratio: 1.2,
            oom_min_bump_bytes: 100.0 * MIB,
            min_cpu_sample_weight: 0.1,
            cpu_half_life_ms: DAY_MS,
            memory_half_life_ms: DAY_MS,
            memory_interval_ms: DAY_MS,
            memory_interval_count: 8,
            cpu_options,
            memory_options,
        }
    }
}

/// One memory peak: the largest working set of one aggregation interval. Checkpoints of
/// version 1 kept the last eight of them; they are read back into the memory histogram.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peak {
    /// End of its interval, in milliseconds since the Unix epoch.
    pub window_end_ms: i64,
    /// The largest working set, in bytes.
    pub bytes: f64,
}

/// Everything measured for one (autoscaler, container) on this node: VPA's
/// `AggregateContainerState` (the histograms, first/last sample, count) and the memory
/// interval of its `ContainerState` (`model/container.go`).
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    cpu: DecayingHistogram,
    /// One peak per interval, each added at its interval's end with weight 1.
    memory: DecayingHistogram,
    /// End (exclusive) of the current memory interval; 0 before the first memory sample.
    window_end_ms: i64,
    /// This interval's peak of real samples, and of OOM bumps.
    memory_peak: f64,
    oom_peak: f64,
    /// Time of the last memory sample or OOM kill taken in; 0 before the first.
    last_memory_sample_ms: i64,
    /// Time of the first CPU sample, in milliseconds since the Unix epoch.
    pub first_sample_ms: i64,
    /// Time of the last CPU sample, in milliseconds since the Unix epoch.
    pub last_sample_ms: i64,
    /// CPU samples taken in.
    pub sample_count: u64,
    /// OOM kills recorded.
    pub oom_count: u64,
    /// When the last OOM kill was recorded (0: never).
    pub last_oom_ms: i64,
}

/// [`History`] as stored in the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHistory {
    /// The CPU histogram.
    pub cpu: StoredHistogram,
    /// The memory histogram (checkpoint version 2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<StoredHistogram>,
    /// Finished intervals' peaks (checkpoint version 1 only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub past_peaks: Vec<Peak>,
    /// End (exclusive) of the current memory interval, in milliseconds since the Unix epoch.
    pub window_end_ms: i64,
    /// The current interval's peak of real samples, in bytes.
    pub memory_peak: f64,
    /// The current interval's peak of OOM bumps, in bytes.
    pub oom_peak: f64,
    /// Time of the last memory sample or OOM kill taken in, in milliseconds since the Unix epoch.
    pub last_memory_sample_ms: i64,
    /// [`History::first_sample_ms`].
    pub first_sample_ms: i64,
    /// [`History::last_sample_ms`].
    pub last_sample_ms: i64,
    /// [`History::sample_count`].
    pub sample_count: u64,
    /// [`History::oom_count`].
    pub oom_count: u64,
    /// [`History::last_oom_ms`] (0 in older checkpoints).
    #[serde(default)]
    pub last_oom_ms: i64,
}

/// Figures for one container: CPU in cores, memory in bytes. `None` upper bounds mean "no
/// bound yet" (zero confidence).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Estimate {
    /// The recommended requests.
    pub target: Resources,
    /// The lower-bound percentile, with the margin, confidence factor and floor applied.
    pub lower_bound: Resources,
    /// The upper-bound percentile likewise; `None` with zero confidence (no CPU history).
    pub upper_bound: Option<Resources>,
}

/// CPU in cores and memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Resources {
    /// CPU in cores.
    pub cpu_cores: f64,
    /// Memory in bytes.
    pub memory_bytes: f64,
}

/// VPA's largest resource amount (`model/types.go`, `MaxResourceAmount`, line 47): 1e14
/// millicores or bytes. A finite bound is capped there, as VPA's amounts are.
const MAX_AMOUNT: f64 = 1e14;

/// CPU samples are whole millicores in VPA: its metrics client takes `MilliValue()` of the
/// usage quantity (`input/metrics/metrics_client.go`, line 115), which rounds up. A rate within
/// a nanocore of a whole millicore counts as that millicore.
fn whole_millicores(cores: f64) -> f64 {
    ((cores * 1000.0) - 1e-6).ceil().max(0.0) / 1000.0
}

impl History {
    /// An empty history; fails when the configured histogram half-lives are below 1 ms.
    pub fn new(cfg: &EstimatorConfig) -> Result<Self, HistogramError> {
        Ok(History {
            cpu: DecayingHistogram::new(cfg.cpu_options, cfg.cpu_half_life_ms)?,
            memory: DecayingHistogram::new(cfg.memory_options, cfg.memory_half_life_ms)?,
            window_end_ms: 0,
            memory_peak: 0.0,
            oom_peak: 0.0,
            last_memory_sample_ms: 0,
            first_sample_ms: 0,
            last_sample_ms: 0,
            sample_count: 0,
            oom_count: 0,
            last_oom_ms: 0,
        })
    }

    /// Adds a CPU sample (cores) taken at `at_ms`. Samples not newer than the last one are
    /// dropped (VPA: `model/container.go` line 81); returns whether it was added.
    ///
    /// Every sample weighs the same, `min_cpu_sample_weight` (VPA:
    /// `model/aggregate_container_state.go` line 254): the container's request plays no part,
    /// so resizing a container does not reweigh its history.
    pub fn add_cpu(&mut self, cfg: &EstimatorConfig, at_ms: i64, usage_cores: f64) -> bool {
        if !(usage_cores.is_finite() && usage_cores >= 0.0)
            || (self.sample_count > 0 && at_ms <= self.last_sample_ms)
        {
            return false;
        }
        self.cpu
            .add_sample(whole_millicores(usage_cores), cfg.min_cpu_sample_weight, at_ms);
        // first/last sample and count come from CPU samples only (VPA:
        // model/aggregate_container_state.go lines 255-261)
        if self.sample_count == 0 || at_ms < self.first_sample_ms {
            self.first_sample_ms = at_ms;
        }
        self.last_sample_ms = self.last_sample_ms.max(at_ms);
        self.sample_count = self.sample_count.saturating_add(1);
        true
    }

    /// Adds a memory (working set) sample in bytes.
    pub fn add_memory(&mut self, cfg: &EstimatorConfig, at_ms: i64, bytes: f64) -> bool {
        self.add_memory_sample(cfg, at_ms, bytes.ceil(), false)
    }

    /// Records an OOM kill at `at_ms` of a container whose memory request was `request_bytes`.
    /// Returns the bumped peak, or `None` when the event is too old.
    ///
    /// VPA (`model/container.go`, `RecordOOM`, lines 206-231): an OOM more than one interval
    /// older than the last memory sample is dropped (measured from that sample, not from the
    /// interval's end, since kubernetes/autoscaler#8548); the bump is
    /// `max(used + min bump, used × ratio)` over `used = max(request, this interval's peak of
    /// real samples)` (an earlier OOM peak is left out, so repeated kills do not compound),
    /// taken in as a memory sample at the OOM's time.
    pub fn record_oom(&mut self, cfg: &EstimatorConfig, at_ms: i64, request_bytes: f64) -> Option<f64> {
        if self.last_memory_sample_ms != 0 && at_ms < self.last_memory_sample_ms - cfg.memory_interval_ms {
            return None;
        }
        let used = request_bytes.ceil().max(self.memory_peak);
        // VPA's amounts are whole bytes: the ratio's product is truncated (model/types.go, ScaleResource)
        let needed = (used + cfg.oom_min_bump_bytes).max((used * cfg.oom_bump_ratio).floor());
        if !self.add_memory_sample(cfg, at_ms, needed, true) {
            return None;
        }
        self.oom_count = self.oom_count.saturating_add(1);
        self.last_oom_ms = self.last_oom_ms.max(at_ms);
        Some(needed)
    }

    /// VPA: `model/container.go`, `addMemorySample`, lines 150-203.
    fn add_memory_sample(&mut self, cfg: &EstimatorConfig, at_ms: i64, bytes: f64, oom: bool) -> bool {
        // OOM kills are always taken in; samples older than the last one are dropped
        if !(bytes.is_finite() && bytes >= 0.0) || (!oom && at_ms < self.last_memory_sample_ms) {
            return false;
        }
        // also an OOM kill's time, even an earlier one (line 157)
        self.last_memory_sample_ms = at_ms;
        if self.window_end_ms == 0 {
            self.window_end_ms = at_ms;
        }
        let replace = if at_ms < self.window_end_ms {
            // within the interval: a higher peak replaces the old one (lines 167-178). As in
            // VPA, a peak of 0 is never replaced within its interval.
            let old = self.memory_peak.max(self.oom_peak);
            let higher = old != 0.0 && bytes > old;
            if higher {
                self.memory.subtract_sample(old, 1.0, self.window_end_ms);
            }
            higher
        } else {
            // a later interval: its end moves by whole intervals past the sample (lines 179-186)
            let interval = cfg.memory_interval_ms.max(1);
            let behind = at_ms - self.window_end_ms;
            self.window_end_ms += behind - behind % interval + interval;
            self.memory_peak = 0.0;
            self.oom_peak = 0.0;
            true
        };
        if replace {
            self.memory.add_sample(bytes, 1.0, self.window_end_ms);
            if oom {
                self.oom_peak = bytes;
            } else {
                self.memory_peak = bytes;
            }
        }
        true
    }

    /// Whether nothing was measured yet.
    pub fn is_empty(&self) -> bool {
        self.sample_count == 0 && self.memory.is_empty()
    }

    /// Confidence in days: min(days between first and last CPU sample, samples per day)
    /// (VPA: `logic/estimator.go`, `getConfidence`, lines 186-193).
    pub fn confidence(&self, cfg: &EstimatorConfig) -> f64 {
        if self.sample_count == 0 {
            return 0.0;
        }
        let days = (self.last_sample_ms - self.first_sample_ms) as f64 / DAY_MS as f64;
        let by_count = self.sample_count as f64 / cfg.confidence_samples_per_day;
        days.min(by_count)
    }

    /// The recommendation for a container in a pod of `containers_per_pod` containers
    /// (VPA: `logic/recommender.go`, lines 79-117 and 131-189; `logic/estimator.go`).
    pub fn estimate(&self, cfg: &EstimatorConfig, containers_per_pod: usize) -> Estimate {
        let share = 1.0 / containers_per_pod.max(1) as f64;
        let floor = Resources {
            cpu_cores: cfg.pod_min_cpu_cores * share,
            memory_bytes: cfg.pod_min_memory_bytes * share,
        };
        let margin = 1.0 + cfg.safety_margin;
        let at = |p: f64| Resources {
            cpu_cores: self.cpu.percentile(p) * margin,
            memory_bytes: self.memory.percentile(p) * margin,
        };
        let conf = self.confidence(cfg);
        let scale = |r: Resources, mult: f64, exp: f64| {
            let f = (1.0 + mult / conf).powf(exp);
            Resources {
                cpu_cores: r.cpu_cores * f,
                memory_bytes: r.memory_bytes * f,
            }
        };
        let floored = |r: Resources| Resources {
            cpu_cores: r.cpu_cores.max(floor.cpu_cores),
            memory_bytes: r.memory_bytes.max(floor.memory_bytes),
        };
        let target = floored(at(cfg.target_percentile));
        // with no confidence VPA's lower factor is (1 + 0.001/0)^−2 = 0: the floor
        let lower = if conf > 0.0 {
            scale(
                at(cfg.lower_bound_percentile),
                cfg.lower_confidence_multiplier,
                cfg.lower_confidence_exponent,
            )
        } else {
            Resources::default()
        };
        // with no confidence VPA's upper factor is infinite and its bound the largest amount;
        // nodewarden leaves the bound out
        let upper = if conf > 0.0 {
            let u = scale(
                at(cfg.upper_bound_percentile),
                cfg.upper_confidence_multiplier,
                cfg.upper_confidence_exponent,
            );
            (u.cpu_cores.is_finite() && u.memory_bytes.is_finite()).then(|| {
                floored(Resources {
                    cpu_cores: u.cpu_cores.min(MAX_AMOUNT / 1000.0),
                    memory_bytes: u.memory_bytes.min(MAX_AMOUNT),
                })
            })
        } else {
            None
        };
        Estimate {
            target,
            lower_bound: floored(lower),
            upper_bound: upper,
        }
    }

    /// The history as stored in the checkpoint (version 2).
    pub fn to_stored(&self) -> StoredHistory {
        StoredHistory {
            cpu: self.cpu.to_stored(),
            memory: Some(self.memory.to_stored()),
            past_peaks: Vec::new(),
            window_end_ms: self.window_end_ms,
            memory_peak: self.memory_peak,
            oom_peak: self.oom_peak,
            last_memory_sample_ms: self.last_memory_sample_ms,
            first_sample_ms: self.first_sample_ms,
            last_sample_ms: self.last_sample_ms,
            sample_count: self.sample_count,
            oom_count: self.oom_count,
            last_oom_ms: self.last_oom_ms,
        }
    }

    /// Reads a stored history back. A version-1 history (its peaks as a list) gets a memory
    /// histogram with each kept peak, and the current interval's, at its interval's end.
    pub fn from_stored(stored: &StoredHistory, cfg: &EstimatorConfig) -> Result<Self, HistogramError> {
        // times out of range would overflow the interval and decay arithmetic later
        for (field, ms) in [
            ("windowEndMs", stored.window_end_ms),
            ("lastMemorySampleMs", stored.last_memory_sample_ms),
            ("firstSampleMs", stored.first_sample_ms),
            ("lastSampleMs", stored.last_sample_ms),
            ("lastOomMs", stored.last_oom_ms),
        ]
        .into_iter()
        .chain(
            stored
                .past_peaks
                .iter()
                .map(|p| ("pastPeaks.windowEndMs", p.window_end_ms)),
        ) {
            stored_time(field, ms)?;
        }
        for v in [stored.memory_peak, stored.oom_peak]
            .into_iter()
            .chain(stored.past_peaks.iter().map(|p| p.bytes))
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(HistogramError::InvalidWeight(v));
            }
        }
        let memory = match &stored.memory {
            Some(m) => DecayingHistogram::from_stored(m, cfg.memory_options, cfg.memory_half_life_ms)?,
            None => {
                let mut m = DecayingHistogram::new(cfg.memory_options, cfg.memory_half_life_ms)?;
                for p in &stored.past_peaks {
                    m.add_sample(p.bytes, 1.0, p.window_end_ms);
                }
                let current = stored.memory_peak.max(stored.oom_peak);
                if current > 0.0 {
                    m.add_sample(current, 1.0, stored.window_end_ms);
                }
                m
            }
        };
        Ok(History {
            cpu: DecayingHistogram::from_stored(&stored.cpu, cfg.cpu_options, cfg.cpu_half_life_ms)?,
            memory,
            window_end_ms: stored.window_end_ms,
            memory_peak: stored.memory_peak,
            oom_peak: stored.oom_peak,
            last_memory_sample_ms: stored.last_memory_sample_ms,
            first_sample_ms: stored.first_sample_ms,
            last_sample_ms: stored.last_sample_ms,
            sample_count: stored.sample_count,
            oom_count: stored.oom_count,
            last_oom_ms: stored.last_oom_ms,
        })
    }

    /// Whether the last sample is older than the whole memory window (8 days by default;
    /// VPA: `model/aggregate_container_state.go` line 306, from the last CPU sample there).
    pub fn is_expired(&self, cfg: &EstimatorConfig, now_ms: i64) -> bool {
        let last = self.last_sample_ms.max(self.last_memory_sample_ms);
        let window = cfg
            .memory_interval_ms
            .saturating_mul(i64::try_from(cfg.memory_interval_count).unwrap_or(i64::MAX));
        last > 0 && now_ms - last >= window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000_000;
    const HOUR: i64 = 3600 * 1000;

    /// Upper edge of the bucket holding `v` with the default layout, computed by hand:
    /// bucket n = floor(log_1.05(v·0.05/first + 1)), upper edge = first·(1.05^(n+1) − 1)/0.05.
    fn edge(first: f64, v: f64) -> f64 {
        let n = ((v * 0.05 / first + 1.0).ln() / 1.05f64.ln()).floor();
        first * (1.05f64.powf(n + 1.0) - 1.0) / 0.05
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn one_memory_peak_gives_its_bucket_edge_plus_margin() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        let used = 300.0 * MIB;
        assert!(h.add_memory(&cfg, T0, used));
        assert!(h.add_memory(&cfg, T0 + 10_000, 200.0 * MIB)); // lower: peak stays
        let e = h.estimate(&cfg, 1);
        // 300 MiB = 314572800 B falls in bucket 19, whose upper edge is 1e7·(1.05^20 − 1)/0.05
        let want = 1e7 * (1.05f64.powi(20) - 1.0) / 0.05 * 1.15;
        assert!(
            close(e.target.memory_bytes, want),
            "{} vs {want}",
            e.target.memory_bytes
        );
        assert!(close(edge(1e7, used) * 1.15, want));
        // no CPU samples: CPU is the floor, no upper bound yet
        assert!(close(e.target.cpu_cores, 0.025));
        assert_eq!(e.upper_bound, None);
    }

    #[test]
    fn cpu_target_lower_and_upper_use_p90_p50_p95() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // 100 samples a minute apart: 55 at 0.1 core, 40 at 0.5, 5 at 2.0
        let mut t = T0;
        for (n, v) in [(55, 0.1), (40, 0.5), (5, 2.0)] {
            for _ in 0..n {
                assert!(h.add_cpu(&cfg, t, v));
                t += 60_000;
            }
        }
        let e = h.estimate(&cfg, 1);
        // within 99 minutes the later samples weigh up to 2^(99/1440) = 1.049 times more, so
        // the first 55 hold 54.4 % of the weight (p50 → 0.1 core), the first 95 hold 94.9 %
        // (p90 → 0.5 core, p95 → 2 cores)
        assert!(close(e.target.cpu_cores, edge(0.01, 0.5) * 1.15), "{:?}", e);
        // confidence: min(99 min in days, 100/1440) = 99/1440 days
        let conf: f64 = 99.0 / 1440.0;
        assert!(close(h.confidence(&cfg), conf));
        let lower = edge(0.01, 0.1) * 1.15 * (1.0 + 0.001 / conf).powi(-2);
        assert!(
            close(e.lower_bound.cpu_cores, lower),
            "{} vs {lower}",
            e.lower_bound.cpu_cores
        );
        let upper = e.upper_bound.expect("upper bound").cpu_cores;
        let want_upper = edge(0.01, 2.0) * 1.15 * (1.0 + 1.0 / conf);
        assert!(close(upper, want_upper), "{upper} vs {want_upper}");
    }

    #[test]
    fn every_cpu_sample_weighs_the_same() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // 3 samples at 0.05 core, then 1 at 1 core, a millisecond apart: the 1-core bucket
        // holds a quarter of the weight (a hair more, the newest sample being 1 ms younger)
        for i in 0..3 {
            h.add_cpu(&cfg, T0 + i, 0.05);
        }
        h.add_cpu(&cfg, T0 + 3, 1.0);
        let p74 = h.cpu.percentile(0.74);
        let p76 = h.cpu.percentile(0.76);
        assert!(close(p74, edge(0.01, 0.05)), "{p74}");
        assert!(close(p76, edge(0.01, 1.0)), "{p76}");
    }

    #[test]
    fn cpu_samples_are_whole_millicores_rounded_up() {
        assert_eq!(whole_millicores(0.0), 0.0);
        assert_eq!(whole_millicores(0.1), 0.1);
        assert_eq!(whole_millicores(0.0101), 0.011);
        assert_eq!(whole_millicores(0.0000001), 0.001);
        // within a nanocore of a whole millicore: that millicore
        assert_eq!(whole_millicores(0.3 + 1e-13), 0.3);
    }

    #[test]
    fn a_memory_peak_one_day_older_weighs_half() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // day 1 peak 1 GiB, day 2 peak 300 MiB (weights 1 : 2)
        h.add_memory(&cfg, T0, 1024.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 300.0 * MIB);
        assert_eq!(h.window_end_ms, T0 + 48 * HOUR);
        let mut cfg_low = cfg.clone();
        // p66 ≤ 2/3: the newer, heavier, smaller peak; p67: the older, bigger one
        cfg_low.target_percentile = 0.66;
        let e = h.estimate(&cfg_low, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 300.0 * MIB) * 1.15));
        cfg_low.target_percentile = 0.67;
        let e = h.estimate(&cfg_low, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 1024.0 * MIB) * 1.15));
    }

    #[test]
    fn old_memory_peaks_decay_rather_than_drop_out() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // a 2 GiB peak on day 0, then eleven days at 300 MiB
        h.add_memory(&cfg, T0 + HOUR, 2048.0 * MIB);
        for day in 1..12 {
            h.add_memory(&cfg, T0 + day * 24 * HOUR + HOUR, 300.0 * MIB);
        }
        // the day-0 peak weighs 2^−11 of the newest one, but it is still there
        let mut all = cfg.clone();
        all.target_percentile = 1.0;
        let e = h.estimate(&all, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 2048.0 * MIB) * 1.15));
        let e = h.estimate(&cfg, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 300.0 * MIB) * 1.15));
    }

    #[test]
    fn a_higher_sample_replaces_the_intervals_peak_but_a_zero_peak_stays() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_memory(&cfg, T0, 300.0 * MIB);
        h.add_memory(&cfg, T0 + HOUR, 400.0 * MIB);
        let mut all = cfg.clone();
        all.lower_bound_percentile = 0.0;
        all.target_percentile = 1.0;
        // one peak only: the lowest and highest percentiles are both 400 MiB
        let e = h.estimate(&all, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 400.0 * MIB) * 1.15));
        // VPA's rule (model/container.go line 169): a 0 peak is not replaced in its interval
        let mut z = History::new(&cfg).unwrap();
        z.add_memory(&cfg, T0, 0.0);
        z.add_memory(&cfg, T0 + HOUR, 400.0 * MIB);
        assert!(close(z.estimate(&cfg, 1).target.memory_bytes, 250.0 * MIB));
    }

    #[test]
    fn oom_bump_is_the_larger_of_plus_100_mib_and_times_1_2() {
        let cfg = EstimatorConfig::default();
        // small container: +100 MiB wins (used = max(request 200 MiB, peak 300 MiB) = 300 MiB)
        let mut h = History::new(&cfg).unwrap();
        h.add_memory(&cfg, T0, 300.0 * MIB);
        let bumped = h.record_oom(&cfg, T0 + 1000, 200.0 * MIB).unwrap();
        assert!(close(bumped, 400.0 * MIB));
        assert_eq!(h.oom_count, 1);
        let e = h.estimate(&cfg, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 400.0 * MIB) * 1.15));
        // large container: ×1.2 wins (used = request 1 GiB > peak 600 MiB)
        let mut h = History::new(&cfg).unwrap();
        h.add_memory(&cfg, T0, 600.0 * MIB);
        let bumped = h.record_oom(&cfg, T0 + 1000, 1024.0 * MIB).unwrap();
        assert!(close(bumped, 1.2 * 1024.0 * MIB));
        // a second OOM does not compound on the first bump
        let again = h.record_oom(&cfg, T0 + 2000, 1024.0 * MIB).unwrap();
        assert!(close(again, bumped));
        // an OOM from before the previous interval is dropped
        h.add_memory(&cfg, T0 + 30 * HOUR, 500.0 * MIB);
        assert_eq!(h.record_oom(&cfg, T0 - 30 * HOUR, 1024.0 * MIB), None);
    }

    #[test]
    fn an_oom_just_before_the_interval_boundary_counts() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // day 1 at 300 MiB; the day-2 interval opens at T0 + 24 h, its end is T0 + 48 h
        h.add_memory(&cfg, T0, 300.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 300.0 * MIB);
        // an OOM from T0 + 23 h, reported late: within one interval of the last sample, so it
        // counts (the old rule measured from the interval's end, T0 + 48 h, and dropped it)
        let bumped = h.record_oom(&cfg, T0 + 23 * HOUR, 256.0 * MIB).expect("kept");
        assert!(close(bumped, 400.0 * MIB));
        // it raised the day-2 peak (weight 2 against day 1's 1)
        let e = h.estimate(&cfg, 1);
        assert!(close(e.target.memory_bytes, edge(1e7, 400.0 * MIB) * 1.15));
        // the OOM moved the last memory sample time back to T0 + 23 h: a sample from
        // T0 + 24 h is taken in, one older than the OOM is not
        assert!(h.add_memory(&cfg, T0 + 24 * HOUR, 100.0 * MIB));
        assert!(!h.add_memory(&cfg, T0 + 23 * HOUR, 100.0 * MIB));
        // more than one interval before the last memory sample: dropped
        assert_eq!(h.record_oom(&cfg, T0 - HOUR - 1, 512.0 * MIB), None);
    }

    #[test]
    fn bounds_widen_with_little_history_and_converge_with_more() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // one sample a minute for a full day at 0.5 core: confidence exactly 1 day
        for i in 0..=1440 {
            h.add_cpu(&cfg, T0 + i * 60_000, 0.5);
        }
        h.add_memory(&cfg, T0, 300.0 * MIB);
        let conf = h.confidence(&cfg);
        assert!(close(conf, 1.0), "{conf}");
        let e = h.estimate(&cfg, 1);
        let base = edge(0.01, 0.5) * 1.15;
        assert!(close(e.target.cpu_cores, base));
        assert!(close(e.upper_bound.unwrap().cpu_cores, base * 2.0));
        assert!(close(e.lower_bound.cpu_cores, base / (1.001f64 * 1.001)));
        // memory follows the same factors
        let mem = edge(1e7, 300.0 * MIB) * 1.15;
        assert!(close(e.upper_bound.unwrap().memory_bytes, mem * 2.0));
    }

    #[test]
    fn floors_are_shared_among_the_pods_containers() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.001);
        h.add_cpu(&cfg, T0 + 60_000, 0.001);
        h.add_memory(&cfg, T0, 10.0 * MIB);
        let one = h.estimate(&cfg, 1);
        assert!(close(one.target.cpu_cores, 0.025));
        assert!(close(one.target.memory_bytes, 250.0 * MIB));
        assert!(close(one.lower_bound.cpu_cores, 0.025));
        let two = h.estimate(&cfg, 2);
        assert!(close(two.target.cpu_cores, 0.0125));
        assert!(close(two.target.memory_bytes, 125.0 * MIB));
    }

    #[test]
    fn stale_and_duplicate_samples_are_dropped() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        assert!(h.add_cpu(&cfg, T0, 0.1));
        assert!(!h.add_cpu(&cfg, T0, 0.1));
        assert!(!h.add_cpu(&cfg, T0 - 1, 0.1));
        assert!(!h.add_cpu(&cfg, T0 + 1, f64::NAN));
        assert!(!h.add_cpu(&cfg, T0 + 1, -1.0));
        assert_eq!(h.sample_count, 1);
    }

    #[test]
    fn stored_history_round_trips() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3);
        h.add_cpu(&cfg, T0 + 60_000, 0.4);
        h.add_memory(&cfg, T0, 300.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 200.0 * MIB);
        h.record_oom(&cfg, T0 + 26 * HOUR, 256.0 * MIB);
        let json = serde_json::to_string(&h.to_stored()).unwrap();
        let back = History::from_stored(&serde_json::from_str(&json).unwrap(), &cfg).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.estimate(&cfg, 1), h.estimate(&cfg, 1));
    }

    /// Found by the checkpoint fuzz target: times at the ends of i64 overflowed the confidence
    /// and interval arithmetic, and counters at u64::MAX overflowed on the next sample.
    #[test]
    fn a_stored_history_out_of_range_is_refused_and_counters_saturate() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3);
        h.add_memory(&cfg, T0, 300.0 * MIB);
        let good = h.to_stored();
        let mut stored = good.clone();
        stored.first_sample_ms = i64::MIN;
        assert!(matches!(
            History::from_stored(&stored, &cfg),
            Err(HistogramError::InvalidTime {
                field: "firstSampleMs",
                ..
            })
        ));
        let mut stored = good.clone();
        stored.past_peaks = vec![Peak {
            window_end_ms: i64::MAX,
            bytes: 1.0,
        }];
        assert!(matches!(
            History::from_stored(&stored, &cfg),
            Err(HistogramError::InvalidTime {
                field: "pastPeaks.windowEndMs",
                ..
            })
        ));
        let mut stored = good;
        stored.sample_count = u64::MAX;
        stored.oom_count = u64::MAX;
        let mut back = History::from_stored(&stored, &cfg).unwrap();
        assert!(back.add_cpu(&cfg, T0 + HOUR, 0.5));
        assert!(back.record_oom(&cfg, T0 + HOUR, 256.0 * MIB).is_some());
        assert_eq!((back.sample_count, back.oom_count), (u64::MAX, u64::MAX));
    }

    #[test]
    fn a_version_1_history_is_read_into_the_memory_histogram() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3);
        h.add_memory(&cfg, T0, 1024.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 300.0 * MIB);
        // the same history as version 1 stored it: finished peaks in a list
        let mut v1 = serde_json::to_value(h.to_stored()).unwrap();
        v1.as_object_mut().unwrap().remove("memory");
        v1["pastPeaks"] = serde_json::json!([{"windowEndMs": T0 + 24 * HOUR, "bytes": 1024.0 * MIB}]);
        let back = History::from_stored(&serde_json::from_value(v1).unwrap(), &cfg).unwrap();
        let mut p = cfg.clone();
        for q in [0.5, 0.66, 0.67, 0.9] {
            p.target_percentile = q;
            assert_eq!(back.estimate(&p, 1).target, h.estimate(&p, 1).target, "p{q}");
        }
    }

    #[test]
    fn history_expires_after_the_memory_window() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3);
        assert!(!h.is_expired(&cfg, T0 + 7 * 24 * HOUR));
        assert!(h.is_expired(&cfg, T0 + 8 * 24 * HOUR));
    }
}
