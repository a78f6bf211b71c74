//! The VPA estimator, per (autoscaler, container) on this node.
//!
//! CPU: every sample (cores used over one sample interval) goes into a decaying histogram,
//! weighted by the container's CPU request in cores, at least `min_cpu_sample_weight` (0.1), so
//! that raising the request makes older history count for less.
//!
//! Memory: one peak (working set) per aggregation interval (24 h), the last
//! `memory_interval_count` (8) intervals kept; each peak weighs 1 at the end of its interval and
//! decays with the memory half-life. An OOM kill adds a peak of
//! `max(used + oom_min_bump, used × oom_bump_ratio)` where `used = max(request, peak)`.
//!
//! Figures: target = p90, lower bound = p50, upper bound = p95 of each histogram, plus the
//! safety margin (15 %). Bounds are widened by the confidence `c = min(days between the first
//! and last sample, samples / 1440)`: upper × (1 + 1/c), lower × (1 + 0.001/c)^−2. Everything is
//! at least the per-pod floor (25 millicores, 250 MiB) divided by the pod's container count.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::histogram::{DecayingHistogram, HistogramError, HistogramOptions, StoredHistogram};

pub const MIB: f64 = 1024.0 * 1024.0;
const DAY_MS: i64 = 24 * 3600 * 1000;

/// Estimator constants; the defaults are the VPA recommender's.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorConfig {
    pub target_percentile: f64,
    pub lower_bound_percentile: f64,
    pub upper_bound_percentile: f64,
    pub safety_margin: f64,
    pub upper_confidence_multiplier: f64,
    pub upper_confidence_exponent: f64,
    pub lower_confidence_multiplier: f64,
    pub lower_confidence_exponent: f64,
    /// Samples that count as one day of confidence (VPA: one per minute).
    pub confidence_samples_per_day: f64,
    pub pod_min_cpu_cores: f64,
    pub pod_min_memory_bytes: f64,
    pub oom_bump_ratio: f64,
    pub oom_min_bump_bytes: f64,
    pub min_cpu_sample_weight: f64,
    pub cpu_half_life_ms: i64,
    pub memory_half_life_ms: i64,
    pub memory_interval_ms: i64,
    pub memory_interval_count: usize,
    pub cpu_options: HistogramOptions,
    pub memory_options: HistogramOptions,
}

/// Histogram layouts from the bucket growth: CPU from 0.01 core to 1000 cores, memory from
/// 1e7 B to 1e12 B. Epsilon is 0.001 × the minimum sample weight, as in VPA.
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

/// One memory peak: the largest working set of one aggregation interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Peak {
    pub window_end_ms: i64,
    pub bytes: f64,
}

/// Everything measured for one (autoscaler, container) on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    cpu: DecayingHistogram,
    /// Peaks of finished intervals, oldest first; at most `memory_interval_count − 1`.
    past_peaks: VecDeque<Peak>,
    /// End (exclusive) of the current memory interval; 0 before the first memory sample.
    window_end_ms: i64,
    memory_peak: f64,
    oom_peak: f64,
    last_memory_sample_ms: i64,
    pub first_sample_ms: i64,
    pub last_sample_ms: i64,
    pub sample_count: u64,
    pub oom_count: u64,
    /// When the last OOM kill was recorded (0: never).
    pub last_oom_ms: i64,
}

/// [`History`] as stored in the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredHistory {
    pub cpu: StoredHistogram,
    pub past_peaks: Vec<Peak>,
    pub window_end_ms: i64,
    pub memory_peak: f64,
    pub oom_peak: f64,
    pub last_memory_sample_ms: i64,
    pub first_sample_ms: i64,
    pub last_sample_ms: i64,
    pub sample_count: u64,
    pub oom_count: u64,
    #[serde(default)]
    pub last_oom_ms: i64,
}

/// Figures for one container: CPU in cores, memory in bytes. `None` upper bounds mean "no
/// bound yet" (zero confidence).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Estimate {
    pub target: Resources,
    pub lower_bound: Resources,
    pub upper_bound: Option<Resources>,
}

#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Resources {
    pub cpu_cores: f64,
    pub memory_bytes: f64,
}

impl History {
    pub fn new(cfg: &EstimatorConfig) -> Result<Self, HistogramError> {
        Ok(History {
            cpu: DecayingHistogram::new(cfg.cpu_options, cfg.cpu_half_life_ms)?,
            past_peaks: VecDeque::new(),
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

    /// Adds a CPU sample (cores) taken at `at_ms` while the request was `request_cores`.
    /// Samples not newer than the last one are dropped; returns whether it was added.
    pub fn add_cpu(
        &mut self,
        cfg: &EstimatorConfig,
        at_ms: i64,
        usage_cores: f64,
        request_cores: f64,
    ) -> bool {
        if !(usage_cores.is_finite() && usage_cores >= 0.0)
            || (self.sample_count > 0 && at_ms <= self.last_sample_ms)
        {
            return false;
        }
        let weight = request_cores.max(cfg.min_cpu_sample_weight);
        self.cpu.add_sample(usage_cores, weight, at_ms);
        if self.sample_count == 0 || at_ms < self.first_sample_ms {
            self.first_sample_ms = at_ms;
        }
        self.last_sample_ms = self.last_sample_ms.max(at_ms);
        self.sample_count += 1;
        true
    }

    /// Adds a memory (working set) sample in bytes.
    pub fn add_memory(&mut self, cfg: &EstimatorConfig, at_ms: i64, bytes: f64) -> bool {
        self.add_memory_sample(cfg, at_ms, bytes, false)
    }

    /// Records an OOM kill at `at_ms` of a container whose memory request was `request_bytes`.
    /// Returns the bumped peak, or `None` when the event is older than the previous interval.
    pub fn record_oom(&mut self, cfg: &EstimatorConfig, at_ms: i64, request_bytes: f64) -> Option<f64> {
        if self.window_end_ms != 0 && at_ms < self.window_end_ms - cfg.memory_interval_ms {
            return None;
        }
        // the OOM peak itself is left out, so repeated OOMs do not compound
        let used = request_bytes.max(self.memory_peak);
        let needed = (used + cfg.oom_min_bump_bytes).max(used * cfg.oom_bump_ratio);
        self.add_memory_sample(cfg, at_ms, needed, true);
        self.oom_count += 1;
        self.last_oom_ms = self.last_oom_ms.max(at_ms);
        Some(needed)
    }

    fn add_memory_sample(&mut self, cfg: &EstimatorConfig, at_ms: i64, bytes: f64, oom: bool) -> bool {
        if !(bytes.is_finite() && bytes >= 0.0) || (!oom && at_ms < self.last_memory_sample_ms) {
            return false;
        }
        self.last_memory_sample_ms = self.last_memory_sample_ms.max(at_ms);
        if self.window_end_ms == 0 {
            self.window_end_ms = at_ms;
        }
        if at_ms < self.window_end_ms {
            let current = self.memory_peak.max(self.oom_peak);
            if bytes > current {
                if oom {
                    self.oom_peak = bytes;
                } else {
                    self.memory_peak = bytes;
                }
            }
            return true;
        }
        // a new interval: keep the finished one's peak, start the next
        let finished = self.memory_peak.max(self.oom_peak);
        if finished > 0.0 {
            self.past_peaks.push_back(Peak {
                window_end_ms: self.window_end_ms,
                bytes: finished,
            });
        }
        let interval = cfg.memory_interval_ms.max(1);
        let behind = at_ms - self.window_end_ms;
        self.window_end_ms += behind - behind % interval + interval;
        let keep_after =
            self.window_end_ms - interval * i64::try_from(cfg.memory_interval_count).unwrap_or(i64::MAX / 2);
        while self
            .past_peaks
            .front()
            .is_some_and(|p| p.window_end_ms <= keep_after)
        {
            self.past_peaks.pop_front();
        }
        let limit = cfg.memory_interval_count.saturating_sub(1);
        while self.past_peaks.len() > limit {
            self.past_peaks.pop_front();
        }
        self.memory_peak = 0.0;
        self.oom_peak = 0.0;
        if oom {
            self.oom_peak = bytes;
        } else {
            self.memory_peak = bytes;
        }
        true
    }

    /// Every kept peak, oldest first, the current interval's last.
    pub fn peaks(&self) -> Vec<Peak> {
        let mut all: Vec<Peak> = self.past_peaks.iter().copied().collect();
        let current = self.memory_peak.max(self.oom_peak);
        if current > 0.0 {
            all.push(Peak {
                window_end_ms: self.window_end_ms,
                bytes: current,
            });
        }
        all
    }

    /// Whether nothing was measured yet.
    pub fn is_empty(&self) -> bool {
        self.sample_count == 0 && self.peaks().is_empty()
    }

    /// Confidence in days: min(days between first and last CPU sample, samples per day).
    pub fn confidence(&self, cfg: &EstimatorConfig) -> f64 {
        if self.sample_count == 0 {
            return 0.0;
        }
        let days = (self.last_sample_ms - self.first_sample_ms) as f64 / DAY_MS as f64;
        let by_count = self.sample_count as f64 / cfg.confidence_samples_per_day;
        days.min(by_count)
    }

    /// The recommendation for a container in a pod of `containers_per_pod` containers.
    pub fn estimate(&self, cfg: &EstimatorConfig, containers_per_pod: usize) -> Estimate {
        let mut memory = match DecayingHistogram::new(cfg.memory_options, cfg.memory_half_life_ms) {
            Ok(h) => h,
            Err(_) => return Estimate::default(),
        };
        for p in self.peaks() {
            memory.add_sample(p.bytes, 1.0, p.window_end_ms);
        }
        let share = 1.0 / containers_per_pod.max(1) as f64;
        let floor = Resources {
            cpu_cores: cfg.pod_min_cpu_cores * share,
            memory_bytes: cfg.pod_min_memory_bytes * share,
        };
        let margin = 1.0 + cfg.safety_margin;
        let at = |p: f64| Resources {
            cpu_cores: self.cpu.percentile(p) * margin,
            memory_bytes: memory.percentile(p) * margin,
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
        let lower = scale(
            at(cfg.lower_bound_percentile),
            cfg.lower_confidence_multiplier,
            cfg.lower_confidence_exponent,
        );
        // with no confidence the lower factor is 0 (NaN for 0/0 is avoided by conf > 0 checks)
        let lower = if conf > 0.0 { lower } else { Resources::default() };
        let upper = if conf > 0.0 {
            let u = scale(
                at(cfg.upper_bound_percentile),
                cfg.upper_confidence_multiplier,
                cfg.upper_confidence_exponent,
            );
            (u.cpu_cores.is_finite() && u.memory_bytes.is_finite()).then(|| floored(u))
        } else {
            None
        };
        Estimate {
            target,
            lower_bound: floored(lower),
            upper_bound: upper,
        }
    }

    pub fn to_stored(&self) -> StoredHistory {
        StoredHistory {
            cpu: self.cpu.to_stored(),
            past_peaks: self.past_peaks.iter().copied().collect(),
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

    pub fn from_stored(stored: &StoredHistory, cfg: &EstimatorConfig) -> Result<Self, HistogramError> {
        for v in [stored.memory_peak, stored.oom_peak]
            .into_iter()
            .chain(stored.past_peaks.iter().map(|p| p.bytes))
        {
            if !(v.is_finite() && v >= 0.0) {
                return Err(HistogramError::InvalidWeight(v));
            }
        }
        let mut past_peaks: VecDeque<Peak> = stored.past_peaks.iter().copied().collect();
        while past_peaks.len() > cfg.memory_interval_count.saturating_sub(1) {
            past_peaks.pop_front();
        }
        Ok(History {
            cpu: DecayingHistogram::from_stored(&stored.cpu, cfg.cpu_options, cfg.cpu_half_life_ms)?,
            past_peaks,
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

    /// Whether the last sample is older than the whole memory window (8 days by default).
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
        // 100 samples a minute apart: 55 at 0.1 core, 40 at 0.5, 5 at 2.0, request 1 core
        let mut t = T0;
        for (n, v) in [(55, 0.1), (40, 0.5), (5, 2.0)] {
            for _ in 0..n {
                assert!(h.add_cpu(&cfg, t, v, 1.0));
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
    fn cpu_samples_are_weighted_by_request_at_least_a_tenth_of_a_core() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // 3 samples at 0.05 core with request 0 (weight 0.1 each = 0.3), then 1 sample at 1 core
        // with request 0.4 (weight 0.4): the 1-core bucket holds 0.4/0.7 = 57 % of the weight
        for i in 0..3 {
            h.add_cpu(&cfg, T0 + i, 0.05, 0.0);
        }
        h.add_cpu(&cfg, T0 + 3, 1.0, 0.4);
        // p42 still lands in the low bucket (0.3/0.7 = 42.86 %), p43 in the high one
        let p42 = h.cpu.percentile(0.42);
        let p43 = h.cpu.percentile(0.43);
        assert!(close(p42, edge(0.01, 0.05)), "{p42}");
        assert!(close(p43, edge(0.01, 1.0)), "{p43}");
    }

    #[test]
    fn a_memory_peak_one_day_older_weighs_half() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // day 1 peak 1 GiB, day 2 peak 300 MiB (weights 1 : 2)
        h.add_memory(&cfg, T0, 1024.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 300.0 * MIB);
        let peaks = h.peaks();
        assert_eq!(peaks.len(), 2);
        assert_eq!(peaks[1].window_end_ms - peaks[0].window_end_ms, 24 * HOUR);
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
    fn memory_keeps_eight_intervals() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        for day in 0..12 {
            h.add_memory(&cfg, T0 + day * 24 * HOUR + HOUR, (300 + day) as f64 * MIB);
        }
        let peaks = h.peaks();
        assert_eq!(peaks.len(), 8);
        assert!(close(peaks[0].bytes, 304.0 * MIB));
        assert!(close(peaks[7].bytes, 311.0 * MIB));
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
    fn bounds_widen_with_little_history_and_converge_with_more() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        // one sample a minute for a full day at 0.5 core: confidence exactly 1 day
        for i in 0..=1440 {
            h.add_cpu(&cfg, T0 + i * 60_000, 0.5, 0.5);
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
        h.add_cpu(&cfg, T0, 0.001, 0.0);
        h.add_cpu(&cfg, T0 + 60_000, 0.001, 0.0);
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
        assert!(h.add_cpu(&cfg, T0, 0.1, 0.1));
        assert!(!h.add_cpu(&cfg, T0, 0.1, 0.1));
        assert!(!h.add_cpu(&cfg, T0 - 1, 0.1, 0.1));
        assert!(!h.add_cpu(&cfg, T0 + 1, f64::NAN, 0.1));
        assert!(!h.add_cpu(&cfg, T0 + 1, -1.0, 0.1));
        assert_eq!(h.sample_count, 1);
    }

    #[test]
    fn stored_history_round_trips() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3, 0.2);
        h.add_cpu(&cfg, T0 + 60_000, 0.4, 0.2);
        h.add_memory(&cfg, T0, 300.0 * MIB);
        h.add_memory(&cfg, T0 + 25 * HOUR, 200.0 * MIB);
        h.record_oom(&cfg, T0 + 26 * HOUR, 256.0 * MIB);
        let json = serde_json::to_string(&h.to_stored()).unwrap();
        let back = History::from_stored(&serde_json::from_str(&json).unwrap(), &cfg).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.estimate(&cfg, 1), h.estimate(&cfg, 1));
    }

    #[test]
    fn history_expires_after_the_memory_window() {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.add_cpu(&cfg, T0, 0.3, 0.2);
        assert!(!h.is_expired(&cfg, T0 + 7 * 24 * HOUR));
        assert!(h.is_expired(&cfg, T0 + 8 * 24 * HOUR));
    }
}
