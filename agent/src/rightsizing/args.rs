//! Right-sizing's flags of `nodewarden-agent` ([`RightsizingArgs`]): how this node's containers
//! are measured and checkpointed, when its NodeRecommendation is written, the estimator's
//! constants ([`EstimatorFlags`]), updates of running pods ([`UpdateArgs`]) and seeding from
//! Prometheus ([`HistoryArgs`]). Every flag also reads an environment variable; semantics in
//! docs/agent.md.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nodewarden_api::domain::update::Thresholds;
use nodewarden_api::quantity::parse_milli;
use nodewarden_estimator::recommender::{EstimatorConfig, histogram_options};
use nodewarden_runtime::duration::{parse_duration, parse_interval};

use crate::rightsizing::sampler::PublishConfig;

/// Flags of per-node right-sizing.
#[derive(Args, Debug, Clone)]
pub struct RightsizingArgs {
    /// Root of the node's cgroup hierarchy (v2), or the folder the v1 hierarchies are mounted
    /// below, as mounted in the agent's container.
    #[arg(long, env = "NODEWARDEN_CGROUP_ROOT", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,

    /// cgroup version of the node: `auto` detects it at start (v2 when cgroup.controllers is at
    /// the root, else v1 when a memory hierarchy is mounted below it).
    #[arg(long, env = "NODEWARDEN_CGROUP_VERSION", value_enum, default_value = "auto")]
    pub cgroup_version: crate::cgroup::Version,

    /// Folder of the checkpoint file (a hostPath, so history survives restarts).
    #[arg(
        long,
        env = "NODEWARDEN_CHECKPOINT_DIR",
        default_value = "/var/lib/nodewarden"
    )]
    pub checkpoint_dir: PathBuf,

    /// How often the containers are measured.
    #[arg(long, env = "NODEWARDEN_SAMPLE_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub sample_interval: Duration,

    /// How often the histograms are written to the checkpoint file.
    #[arg(long, env = "NODEWARDEN_CHECKPOINT_INTERVAL", default_value = "1m", value_parser = parse_interval)]
    pub checkpoint_interval: Duration,

    /// Without a material change, NodeRecommendation is rewritten this often.
    #[arg(long, env = "NODEWARDEN_REFRESH_INTERVAL", default_value = "1h", value_parser = parse_interval)]
    pub refresh_interval: Duration,

    /// At most one NodeRecommendation write per this interval; a material change within it
    /// is written when it ends.
    #[arg(long, env = "NODEWARDEN_MIN_PUBLISH_INTERVAL", default_value = "30s", value_parser = parse_interval)]
    pub min_publish_interval: Duration,

    /// On average at most one NodeRecommendation write per this interval, in bursts of at most
    /// 3: a change beyond that waits for the budget. The first write, a changed set of
    /// containers and a new OOM kill are written at once all the same.
    #[arg(long, env = "NODEWARDEN_PUBLISH_BUDGET", default_value = "10m", value_parser = parse_interval)]
    pub publish_budget: Duration,

    /// A target must move by more than this fraction to be published before the refresh.
    #[arg(long, env = "NODEWARDEN_CHANGE_THRESHOLD", default_value_t = 0.1, value_parser = parse_fraction)]
    pub change_threshold: f64,

    /// The estimator's settings.
    #[command(flatten)]
    pub estimator: EstimatorFlags,

    /// Updates of running pods (`updateMode` InPlace and Recreate).
    #[command(flatten)]
    pub update: UpdateArgs,

    /// Seeding from Prometheus history of the containers without a checkpointed history.
    #[command(flatten)]
    pub history: HistoryArgs,
}

impl RightsizingArgs {
    /// The publish settings from the flags, intervals in milliseconds.
    pub fn publish(&self) -> PublishConfig {
        PublishConfig {
            change_threshold: self.change_threshold,
            refresh_ms: millis(self.refresh_interval),
            min_interval_ms: millis(self.min_publish_interval),
            budget_interval_ms: millis(self.publish_budget),
        }
    }
}

/// Flags of the seeding from Prometheus (docs/agent.md, docs/history.md). Off without
/// `--history-prometheus-url`.
#[derive(Args, Debug, Clone)]
pub struct HistoryArgs {
    /// Start the histories of this node's autoscaled containers that have none in the
    /// checkpoint from this Prometheus server's history of the kubelet's cAdvisor series (base
    /// URL, e.g. `http://prometheus.monitoring:9090`): at the start, and for a container first
    /// seen later. Unset (the default): no seeding. A checkpointed history is never replaced.
    #[arg(long, env = "NODEWARDEN_HISTORY_PROMETHEUS_URL", value_name = "URL", value_parser = parse_url)]
    pub history_prometheus_url: Option<String>,
    /// A file holding a bearer token sent to Prometheus (read again for each query).
    #[arg(long, env = "NODEWARDEN_HISTORY_PROMETHEUS_TOKEN_FILE", value_name = "FILE")]
    pub history_prometheus_token_file: Option<PathBuf>,
    /// A PEM file of CA certificates to trust for an https URL (else the system's).
    #[arg(long, env = "NODEWARDEN_HISTORY_PROMETHEUS_CA_FILE", value_name = "FILE")]
    pub history_prometheus_ca_file: Option<PathBuf>,
    /// How far back to read (VPA's 8 days; at most 90d).
    #[arg(long, env = "NODEWARDEN_HISTORY_WINDOW", default_value = "8d", value_parser = parse_history_window)]
    pub history_window: Duration,
    /// The range of CPU's rate() (the report's --rate-window; 1s to 24h): at least twice the
    /// scrape interval of the kubelets' /metrics/cadvisor. Give the report the same, so that
    /// both read the same figures.
    #[arg(long, env = "NODEWARDEN_HISTORY_RATE_WINDOW", default_value = "2m", value_parser = parse_rate_window)]
    pub history_rate_window: Duration,
    /// How long one query may take.
    #[arg(long, env = "NODEWARDEN_HISTORY_PROMETHEUS_TIMEOUT", default_value = "30s", value_parser = parse_interval)]
    pub history_prometheus_timeout: Duration,
    /// The whole seeding, retries included, gives up after this long (the agent then starts
    /// empty, as without the flag).
    #[arg(long, env = "NODEWARDEN_HISTORY_BUDGET", default_value = "2m", value_parser = parse_interval)]
    pub history_budget: Duration,
    /// The most series one read of Prometheus may hold (pods × containers of one autoscaled
    /// DaemonSet on this node, over the window; 1 to 2000); more fails the seeding
    /// (the agent starts empty). What a read holds grows with this and the window: raise the
    /// agent's memory limit with it (docs/history.md, "The agent's memory").
    #[arg(long, env = "NODEWARDEN_HISTORY_MAX_SERIES", default_value_t = crate::rightsizing::seed::MAX_SERIES, value_parser = parse_max_series)]
    pub history_max_series: usize,
    /// The most bytes of one answer of Prometheus (64Ki to 256Mi), refused as it arrives; pages
    /// are shortened so that answers of --history-max-series series fit. Raise the agent's memory
    /// limit with it.
    #[arg(long, env = "NODEWARDEN_HISTORY_MAX_ANSWER_SIZE", default_value = "4Mi", value_parser = parse_answer_size)]
    pub history_max_answer_size: usize,
}

/// The most `--history-max-series` (the report's default).
pub const MAX_HISTORY_SERIES: usize = 2000;

fn parse_max_series(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_HISTORY_SERIES).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a whole number from 1 to {MAX_HISTORY_SERIES}"
        )),
    }
}

/// The bounds of `--history-max-answer-size`.
pub const HISTORY_ANSWER_SIZES: std::ops::RangeInclusive<usize> = (64 << 10)..=(256 << 20);

fn parse_answer_size(s: &str) -> Result<usize, String> {
    let bytes = parse_milli(s)
        .map(|m| m / 1000)
        .ok_or_else(|| format!("{s:?} is not a size (use e.g. 4Mi, 512Ki)"))?;
    usize::try_from(bytes)
        .ok()
        .filter(|b| HISTORY_ANSWER_SIZES.contains(b))
        .ok_or_else(|| format!("{s} is not between 64Ki and 256Mi"))
}

/// The longest `--history-window`.
pub const MAX_HISTORY_WINDOW: Duration = Duration::from_secs(90 * 24 * 3600);

fn parse_history_window(s: &str) -> Result<Duration, String> {
    let d = nodewarden_runtime::duration::parse_at_least(s, Duration::from_secs(60))?;
    if d > MAX_HISTORY_WINDOW {
        return Err(format!("{s} is longer than 90d"));
    }
    Ok(d)
}

/// The longest `--history-rate-window` (as the report's `--rate-window`).
pub const MAX_HISTORY_RATE_WINDOW: Duration = Duration::from_secs(24 * 3600);

fn parse_rate_window(s: &str) -> Result<Duration, String> {
    let d = nodewarden_runtime::duration::parse_at_least(s, Duration::from_secs(1))?;
    if d > MAX_HISTORY_RATE_WINDOW {
        return Err(format!("{s} is longer than 24h"));
    }
    Ok(d)
}

fn parse_url(s: &str) -> Result<String, String> {
    // empty: off, as the chart's default
    if s.is_empty() || s.starts_with("http://") || s.starts_with("https://") {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an http:// or https:// URL"))
    }
}

impl HistoryArgs {
    /// The seeding these flags ask for; `None` without `--history-prometheus-url` (or with it
    /// empty, as the chart leaves it).
    pub fn seed(&self) -> Option<crate::rightsizing::seed::Config> {
        let url = self.history_prometheus_url.as_deref().filter(|u| !u.is_empty())?;
        Some(crate::rightsizing::seed::Config {
            endpoint: nodewarden_history::Endpoint {
                url: url.to_string(),
                bearer_token_file: self.history_prometheus_token_file.clone(),
                ca_file: self.history_prometheus_ca_file.clone(),
            },
            limits: crate::rightsizing::seed::limits(
                self.history_prometheus_timeout,
                self.history_max_series,
                self.history_max_answer_size,
            ),
            window: self.history_window,
            rate_window: self.history_rate_window,
            budget: self.history_budget,
        })
    }
}

/// The estimator's constants; defaults are the VPA recommender's.
#[derive(clap::Args, Debug, Clone)]
pub struct EstimatorFlags {
    /// Usage percentile of the target.
    #[arg(long, env = "NODEWARDEN_TARGET_PERCENTILE", default_value_t = 0.9, value_parser = parse_fraction)]
    pub target_percentile: f64,
    /// Usage percentile of the lower bound.
    #[arg(long, env = "NODEWARDEN_LOWER_BOUND_PERCENTILE", default_value_t = 0.5, value_parser = parse_fraction)]
    pub lower_bound_percentile: f64,
    /// Usage percentile of the upper bound.
    #[arg(long, env = "NODEWARDEN_UPPER_BOUND_PERCENTILE", default_value_t = 0.95, value_parser = parse_fraction)]
    pub upper_bound_percentile: f64,
    /// Fraction added to every figure as a safety margin.
    #[arg(long, env = "NODEWARDEN_SAFETY_MARGIN", default_value_t = 0.15, value_parser = parse_non_negative)]
    pub safety_margin: f64,
    /// Upper bound × (1 + multiplier / confidence)^exponent.
    #[arg(long, env = "NODEWARDEN_UPPER_BOUND_CONFIDENCE_MULTIPLIER", default_value_t = 1.0, value_parser = parse_non_negative)]
    pub upper_bound_confidence_multiplier: f64,
    /// Exponent of the upper bound's confidence factor (see the multiplier).
    #[arg(
        long,
        env = "NODEWARDEN_UPPER_BOUND_CONFIDENCE_EXPONENT",
        default_value_t = 1.0,
        allow_hyphen_values = true
    )]
    pub upper_bound_confidence_exponent: f64,
    /// Lower bound × (1 + multiplier / confidence)^exponent.
    #[arg(long, env = "NODEWARDEN_LOWER_BOUND_CONFIDENCE_MULTIPLIER", default_value_t = 0.001, value_parser = parse_non_negative)]
    pub lower_bound_confidence_multiplier: f64,
    /// Exponent of the lower bound's confidence factor (see the multiplier).
    #[arg(long, env = "NODEWARDEN_LOWER_BOUND_CONFIDENCE_EXPONENT", default_value_t = -2.0, allow_hyphen_values = true)]
    pub lower_bound_confidence_exponent: f64,
    /// CPU samples that count as one day of confidence (VPA: 1440, one a minute).
    #[arg(long, env = "NODEWARDEN_CONFIDENCE_SAMPLES_PER_DAY", default_value_t = 1440.0, value_parser = parse_positive)]
    pub confidence_samples_per_day: f64,
    /// Smallest CPU recommendation per pod, shared among its containers.
    #[arg(long, env = "NODEWARDEN_POD_MIN_CPU", default_value = "25m", value_parser = parse_quantity)]
    pub pod_min_cpu: QuantityArg,
    /// Smallest memory recommendation per pod, shared among its containers.
    #[arg(long, env = "NODEWARDEN_POD_MIN_MEMORY", default_value = "250Mi", value_parser = parse_quantity)]
    pub pod_min_memory: QuantityArg,
    /// After an OOM kill, memory is at least used × this ratio…
    #[arg(long, env = "NODEWARDEN_OOM_BUMP_RATIO", default_value_t = 1.2, value_parser = parse_positive)]
    pub oom_bump_ratio: f64,
    /// …and at least used + this much.
    #[arg(long, env = "NODEWARDEN_OOM_MIN_BUMP", default_value = "100Mi", value_parser = parse_quantity)]
    pub oom_min_bump: QuantityArg,
    /// The weight of every CPU sample (VPA's minSampleWeight), whatever the request.
    #[arg(long, env = "NODEWARDEN_CPU_MIN_SAMPLE_WEIGHT", default_value_t = 0.1, value_parser = parse_positive)]
    pub cpu_min_sample_weight: f64,
    /// Histogram buckets grow by this fraction.
    #[arg(long, env = "NODEWARDEN_BUCKET_GROWTH", default_value_t = 0.05, value_parser = parse_positive)]
    pub bucket_growth: f64,
    /// CPU samples lose half their weight in this time.
    #[arg(long, env = "NODEWARDEN_CPU_HALF_LIFE", default_value = "24h", value_parser = parse_interval)]
    pub cpu_half_life: Duration,
    /// Memory peaks lose half their weight in this time.
    #[arg(long, env = "NODEWARDEN_MEMORY_HALF_LIFE", default_value = "24h", value_parser = parse_interval)]
    pub memory_half_life: Duration,
    /// One memory peak per interval of this length.
    #[arg(long, env = "NODEWARDEN_MEMORY_AGGREGATION_INTERVAL", default_value = "24h", value_parser = parse_interval)]
    pub memory_aggregation_interval: Duration,
    /// A history with no sample for this many intervals is dropped (old peaks decay, as in VPA).
    #[arg(long, env = "NODEWARDEN_MEMORY_AGGREGATION_INTERVAL_COUNT", default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub memory_aggregation_interval_count: u16,
}

/// A quantity flag: the text and its value in milli-units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantityArg {
    /// The value in milli-units (millicores, or thousandths of a byte).
    pub milli: u128,
}

fn parse_quantity(s: &str) -> Result<QuantityArg, String> {
    parse_milli(s)
        .map(|milli| QuantityArg { milli })
        .ok_or_else(|| format!("{s:?} is not a Kubernetes quantity (use e.g. 25m, 0.5, 250Mi, 1Gi)"))
}

fn parse_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() {
        return Err(format!("{s:?} is not a finite number"));
    }
    Ok(v)
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s} is out of range: between 0 and 1 (e.g. 0.9)"));
    }
    Ok(v)
}

fn parse_non_negative(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if v < 0.0 {
        return Err(format!("{s} must not be negative"));
    }
    Ok(v)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if v <= 0.0 {
        return Err(format!("{s} must be greater than 0"));
    }
    Ok(v)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl EstimatorFlags {
    /// The estimator settings these flags describe.
    pub fn estimator(&self) -> anyhow::Result<EstimatorConfig> {
        let (cpu_options, memory_options) = histogram_options(self.bucket_growth, self.cpu_min_sample_weight)
            .map_err(|e| anyhow::anyhow!("--bucket-growth / --cpu-min-sample-weight: {e}"))?;
        Ok(EstimatorConfig {
            target_percentile: self.target_percentile,
            lower_bound_percentile: self.lower_bound_percentile,
            upper_bound_percentile: self.upper_bound_percentile,
            safety_margin: self.safety_margin,
            upper_confidence_multiplier: self.upper_bound_confidence_multiplier,
            upper_confidence_exponent: self.upper_bound_confidence_exponent,
            lower_confidence_multiplier: self.lower_bound_confidence_multiplier,
            lower_confidence_exponent: self.lower_bound_confidence_exponent,
            confidence_samples_per_day: self.confidence_samples_per_day,
            pod_min_cpu_cores: self.pod_min_cpu.milli as f64 / 1000.0,
            pod_min_memory_bytes: self.pod_min_memory.milli as f64 / 1000.0,
            oom_bump_ratio: self.oom_bump_ratio,
            oom_min_bump_bytes: self.oom_min_bump.milli as f64 / 1000.0,
            min_cpu_sample_weight: self.cpu_min_sample_weight,
            cpu_half_life_ms: millis(self.cpu_half_life),
            memory_half_life_ms: millis(self.memory_half_life),
            memory_interval_ms: millis(self.memory_aggregation_interval),
            memory_interval_count: usize::from(self.memory_aggregation_interval_count),
            cpu_options,
            memory_options,
        })
    }
}

/// Flags of the updater.
#[derive(Args, Debug, Clone)]
pub struct UpdateArgs {
    /// Act on running pods at all (`false`: every mode behaves like `Initial` on this node).
    #[arg(long, env = "NODEWARDEN_UPDATE_RUNNING_PODS", default_value_t = true, action = clap::ArgAction::Set)]
    pub update_running_pods: bool,
    /// How often running pods are compared with this node's recommendation.
    #[arg(long, env = "NODEWARDEN_UPDATE_INTERVAL", default_value = "1m", value_parser = parse_interval)]
    pub update_interval: Duration,
    /// Inside the recommendation's bounds, a pod is updated only when its requests differ by
    /// at least this fraction (VPA's resource diff, summed over CPU and memory).
    #[arg(long, env = "NODEWARDEN_UPDATE_MIN_CHANGE", default_value_t = 0.1, value_parser = parse_non_negative)]
    pub update_min_change: f64,
    /// Inside the bounds, a pod is updated only once it has run this long.
    #[arg(long, env = "NODEWARDEN_UPDATE_MIN_AGE", default_value = "12h", value_parser = parse_interval)]
    pub update_min_age: Duration,
    /// A container OOM-killed this soon after it started makes its pod update at once when
    /// more memory is recommended.
    #[arg(long, env = "NODEWARDEN_UPDATE_OOM_WINDOW", default_value = "10m", value_parser = parse_interval)]
    pub update_oom_window: Duration,
    /// While the CPU history behind a container's figures (first to last sample) is shorter
    /// than this, its running pods are only raised (a request below the lower bound, a quick
    /// OOM kill), never lowered; `0s`: VPA's rules from the first sample.
    #[arg(long, env = "NODEWARDEN_UPDATE_MIN_HISTORY", default_value = "24h", value_parser = parse_duration)]
    pub update_min_history: Duration,
    /// A resize the kubelet defers this long falls back to eviction.
    #[arg(long, env = "NODEWARDEN_RESIZE_DEFERRED_LIMIT", default_value = "5m", value_parser = parse_interval)]
    pub resize_deferred_limit: Duration,
    /// A resize in progress this long falls back to eviction.
    #[arg(long, env = "NODEWARDEN_RESIZE_IN_PROGRESS_LIMIT", default_value = "1h", value_parser = parse_interval)]
    pub resize_in_progress_limit: Duration,
    /// At most one eviction per DaemonSet on this node per this interval.
    #[arg(long, env = "NODEWARDEN_EVICTION_MIN_INTERVAL", default_value = "10m", value_parser = parse_interval)]
    pub eviction_min_interval: Duration,
    /// After an eviction held back (the DaemonSet's budget, a PodDisruptionBudget), the next
    /// try for that DaemonSet on this node waits this long.
    #[arg(long, env = "NODEWARDEN_EVICTION_RETRY_INTERVAL", default_value = "2m", value_parser = parse_interval)]
    pub eviction_retry_interval: Duration,
    /// Namespace of the disruption leases (the agent's own).
    #[arg(long, env = "NODEWARDEN_POD_NAMESPACE", default_value = "nodewarden", value_parser = parse_namespace)]
    pub disruption_namespace: String,
    /// A disruption lease not released by its holder expires after this long (an agent that
    /// died holding one blocks no one for longer).
    #[arg(long, env = "NODEWARDEN_DISRUPTION_LEASE_DURATION", default_value = "10m", value_parser = parse_interval)]
    pub disruption_lease_duration: Duration,
}

fn parse_namespace(s: &str) -> Result<String, String> {
    nodewarden_api::domain::names::check_dns_label(s)
        .map_err(|why| format!("{s:?} is not a namespace name: {why}"))?;
    Ok(s.to_string())
}

impl UpdateArgs {
    /// The decision's thresholds.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            min_change: self.update_min_change,
            min_age: self.update_min_age,
            oom_window: self.update_oom_window,
            deferred_limit: self.resize_deferred_limit,
            in_progress_limit: self.resize_in_progress_limit,
            min_history: self.update_min_history,
        }
    }
}
