//! Seeding: the histories of containers without one, loaded from Prometheus.
//!
//! With `--history-prometheus-url`, an agent reads its own node's history of the autoscaled
//! DaemonSet containers that have no history in its checkpoint (the kubelet's cAdvisor series
//! and kube-state-metrics' OOM kills, through `nodewarden-history`, every query narrowed to
//! `node="<this node>"`) and feeds it into the same histories as live samples, with
//! [`history_of`]: before its first sample tick for the containers running then, and for those it
//! first sees later through [`super::seed_later`]. A checkpointed history wins: it is never
//! read. `kubectl nodewarden report --prometheus` builds its figures with the same
//! [`history_of`] and [`window`], so a seeded agent's first `NodeRecommendation` is what the
//! report prints for its node.
//!
//! Bounded: every query has the reader's limits (timeout, series, points, bytes), the agent's
//! own ([`limits`]: answers of a few MiB, few series) so that a read fits its memory limit; one
//! DaemonSet's samples are held at a time, and the freed memory is given back after. A failed read
//! is tried again with backoff ([`retry_backoff`]: 1 s doubling, at most [`RETRIES`] retries) and
//! the whole seeding stops after [`Config::budget`] whatever happens. A failure leaves the agent
//! empty, as without the flag; it never stops the agent. docs/agent.md and docs/history.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use nodewarden_estimator::policy::Key;
use nodewarden_estimator::recommender::{EstimatorConfig, History};
use nodewarden_estimator::samples::{Samples, history_of};
use nodewarden_history::cadvisor::{self, Labels, Window};
use nodewarden_history::{Endpoint, Error, Limits, Prometheus};

use crate::rightsizing::pods::Target;

/// One sample per this interval: the report's default resolution, so that an agent and
/// `report --prometheus` read the same steps (and confidence counts 1440 samples to a day).
pub const RESOLUTION: Duration = Duration::from_secs(60);

/// CPU's `rate()` range by default (`--history-rate-window`): the report's default (at least two
/// scrapes at the usual 30–60 s).
pub const RATE_WINDOW: Duration = Duration::from_secs(120);

/// Retries of a failed read, after the first try.
pub const RETRIES: usize = 3;

/// The agent's default of `--history-max-answer-size`: the most bytes of one answer. The
/// reader's default (256 MiB, for `kubectl nodewarden report` on a workstation) would not fit
/// the chart's 64 MiB memory limit of the agent; an answer is refused as it arrives, before it is
/// held whole (docs/history.md, "The agent's memory").
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The agent's default of `--history-max-series`: the most series (pods × containers of one
/// namespace's autoscaled DaemonSets on this node, over the window) one read may hold. What a
/// read holds grows with the series and the window's steps; 24 series over 8 days fit the
/// chart's memory limit with room (docs/benchmarks.md, "Agent: seeding from Prometheus").
pub const MAX_SERIES: usize = 24;

/// The most bytes one point can take in an answer (`[1700000000.123,"1.2345678901234567e-05"],`
/// is 42): pages hold at most `--history-max-answer-size / 48` points, so that an answer of
/// `--history-max-series` series fits the size limit.
pub const ANSWER_BYTES_PER_POINT: usize = 48;

/// Points of a series over the window [`max_points_per_read`] is measured in: 8 days at
/// [`RESOLUTION`], both ends included.
pub const STEPS_PER_SERIES: usize = 8 * 24 * 60 + 1;

/// The most points one query of a read may gather: `max_series` series of 8 days at 1 minute,
/// whatever `--history-window` says (a longer window holds fewer series in the same memory).
pub fn max_points_per_read(max_series: usize) -> usize {
    max_series.saturating_mul(STEPS_PER_SERIES)
}

/// The reader's limits of the agent: `max_series` series and `max_answer_bytes` bytes per
/// answer, pages short enough that every answer of `max_series` series fits in
/// `max_answer_bytes` (at [`ANSWER_BYTES_PER_POINT`]), at most [`max_points_per_read`] points
/// gathered per query, `timeout` per query.
pub fn limits(timeout: Duration, max_series: usize, max_answer_bytes: usize) -> Limits {
    Limits {
        query_timeout: timeout,
        max_series,
        max_response_bytes: max_answer_bytes,
        max_points_per_query: (max_answer_bytes / ANSWER_BYTES_PER_POINT).max(1),
        max_points_per_read: max_points_per_read(max_series),
        ..Limits::default()
    }
}

/// What the agent's `--history-prometheus-*` flags ask for.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where Prometheus is and how to authenticate.
    pub endpoint: Endpoint,
    /// The bounds of every query (the timeout from `--history-prometheus-timeout`).
    pub limits: Limits,
    /// How far back to read (`--history-window`, 8 days as VPA).
    pub window: Duration,
    /// CPU's `rate()` range (`--history-rate-window`, [`RATE_WINDOW`] by default).
    pub rate_window: Duration,
    /// The whole seeding, retries included, stops after this long.
    pub budget: Duration,
}

/// Backoff between tries of a failed read: 1 s doubling (to 8 s), with jitter, [`RETRIES`] times.
pub fn retry_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(8))
        .with_jitter()
        .with_max_times(RETRIES)
}

/// Whether a failed read is worth another try: not a bad URL or file, a refusal (401/403), a
/// query Prometheus rejects as such (4xx) or an answer over the limits, which fail the same way
/// again.
pub fn transient(err: &Error) -> bool {
    match err {
        Error::Unreachable { .. } | Error::Timeout { .. } | Error::BadAnswer { .. } => true,
        Error::Query { status, .. } => *status >= 500 || *status == 429,
        Error::BadUrl { .. }
        | Error::File { .. }
        | Error::Unauthorized { .. }
        | Error::TooLarge { .. }
        | Error::TooManyPoints { .. }
        | Error::TooManySeries { .. }
        | Error::MissingSeries { .. } => false,
    }
}

/// The histories seeded, and what went into them.
#[derive(Debug, Default)]
pub struct Seeded {
    /// One history per container with samples, and its containers per pod.
    pub histories: Vec<(Key, History, usize)>,
    /// Samples (CPU and memory) read in all.
    pub samples: u64,
    /// The oldest sample read, in milliseconds since the Unix epoch.
    pub first_sample_ms: Option<i64>,
    /// The largest answer of Prometheus, in bytes (against `--history-max-answer-size`).
    pub largest_answer_bytes: usize,
}

/// The history of `targets` (this node's autoscaled containers, with `daemonset` named) on
/// `node` over `window`, one read per namespace, each tried again with backoff when it fails
/// for a reason that may pass.
pub async fn load(
    prometheus: &Prometheus,
    node: &str,
    targets: &[Target],
    window: &Window,
    cfg: &EstimatorConfig,
) -> Result<Seeded, Error> {
    load_noting(prometheus, node, targets, window, cfg, &Mutex::new(None)).await
}

/// [`load`], writing each failed read's error into `last_error` as it happens (so that a
/// caller whose deadline cuts the retries short can say what went wrong).
async fn load_noting(
    prometheus: &Prometheus,
    node: &str,
    targets: &[Target],
    window: &Window,
    cfg: &EstimatorConfig,
    last_error: &Mutex<Option<String>>,
) -> Result<Seeded, Error> {
    // per namespace, the DaemonSets; per (namespace, DaemonSet, container), its target
    let mut by_namespace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut wanted: BTreeMap<(&str, &str, &str), &Target> = BTreeMap::new();
    for t in targets {
        by_namespace
            .entry(t.pod_namespace.as_str())
            .or_default()
            .insert(t.daemonset.as_str());
        wanted
            .entry((
                t.pod_namespace.as_str(),
                t.daemonset.as_str(),
                t.key.container.as_str(),
            ))
            .or_insert(t);
    }
    let labels = Labels::default();
    let mut seeded = Seeded::default();
    // one DaemonSet at a time: its samples become histories before the next is read, so what a
    // seeding holds at once is one DaemonSet's samples on this node (at most `max_series`
    // series), whatever the number of DaemonSets and namespaces
    for (ns, daemonsets) in &by_namespace {
        for ds in daemonsets {
            read_one(
                prometheus,
                node,
                window,
                cfg,
                last_error,
                &labels,
                &wanted,
                (ns, ds),
                &mut seeded,
            )
            .await?;
        }
    }
    Ok(seeded)
}

/// Reads one DaemonSet's history on this node (`key`: its namespace and name) and turns each of
/// its wanted containers' samples into a history in `seeded`.
#[allow(clippy::too_many_arguments)]
async fn read_one(
    prometheus: &Prometheus,
    node: &str,
    window: &Window,
    cfg: &EstimatorConfig,
    last_error: &Mutex<Option<String>>,
    labels: &Labels,
    wanted: &BTreeMap<(&str, &str, &str), &Target>,
    (ns, ds): (&str, &str),
    seeded: &mut Seeded,
) -> Result<(), Error> {
    let mut samples: BTreeMap<(&str, &str, &str), Samples> = BTreeMap::new();
    let regex = cadvisor::daemonset_pods(ds);
    let read = || nodewarden_history::usage::read_on(prometheus, labels, ns, &regex, Some(node), window);
    let usage = read
        .retry(retry_backoff())
        .when(transient)
        .notify(|err, after| {
            note(last_error, err);
            tracing::warn!(error = %err, retry_in = ?after, "reading history from Prometheus failed; trying again");
        })
        .await
        .inspect_err(|err| note(last_error, err))?;
    for c in usage {
        if !owned_by(&c.pod, ds) {
            continue;
        }
        let found = wanted
            .keys()
            .copied()
            .find(|&(n, d, container)| n == ns && d == ds && container == c.container);
        let Some(k) = found else { continue };
        samples.entry(k).or_default().add(c.cpu, c.memory, c.oom);
    }
    // each container's samples dropped as soon as its history is built
    while let Some((k, mut s)) = samples.pop_first() {
        let Some(t) = wanted.get(&k) else { continue };
        s.merge();
        let Some(history) = history_of(cfg, &s, t.memory_request_bytes.unwrap_or(0) as f64) else {
            continue;
        };
        if history.sample_count == 0 && s.memory.is_empty() {
            continue;
        }
        seeded.samples = seeded
            .samples
            .saturating_add((s.cpu.len() + s.memory.len()) as u64);
        let first = s
            .cpu
            .first()
            .into_iter()
            .chain(s.memory.first())
            .map(|p| p.0)
            .min();
        seeded.first_sample_ms = match (seeded.first_sample_ms, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        seeded
            .histories
            .push((t.key.clone(), history, t.containers_per_pod.max(1)));
    }
    Ok(())
}

fn note(last_error: &Mutex<Option<String>>, err: &Error) {
    if let Ok(mut last) = last_error.lock() {
        *last = Some(err.to_string());
    }
}

/// Whether `pod` is named as the DaemonSet controller names the pods of `daemonset`
/// (`<daemonset>-` cut to 58 characters, then 5 lowercase letters or digits).
pub fn owned_by(pod: &str, daemonset: &str) -> bool {
    let prefix: String = format!("{daemonset}-").chars().take(58).collect();
    pod.strip_prefix(prefix.as_str()).is_some_and(|rest| {
        rest.len() == 5 && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// Reads the history with [`load`], the whole within `config.budget`, then gives the memory the
/// reads freed back to the system.
pub async fn seed(
    config: &Config,
    node: &str,
    targets: &[Target],
    cfg: &EstimatorConfig,
    now_ms: i64,
) -> Result<Seeded, SeedError> {
    let prometheus =
        Prometheus::new(config.endpoint.clone(), config.limits).map_err(SeedError::Prometheus)?;
    let end_ms = cadvisor::settled_end(now_ms, config.rate_window);
    let window = cadvisor::window(config.window, RESOLUTION, config.rate_window, end_ms);
    let last_error = Mutex::new(None);
    let load = load_noting(&prometheus, node, targets, &window, cfg, &last_error);
    let outcome = tokio::time::timeout(config.budget, load).await;
    // the answers and samples are gone, the histories kept: give the freed pages back, or the
    // allocator keeps the seeding's peak resident for the agent's whole life
    nodewarden_sys::release_free_heap();
    match outcome {
        Ok(Ok(mut seeded)) => {
            seeded.largest_answer_bytes = prometheus.largest_answer();
            Ok(seeded)
        }
        Ok(Err(err)) => Err(match err {
            Error::TooLarge { url, query, limit } => SeedError::Limit(format!(
                "Prometheus at {url} sent an answer larger than the agent's limit of {limit} bytes \
                 (--history-max-answer-size, chart agent.history.maxAnswerSize; pages are cut so that \
                 {series} series fit, more series than --history-max-series make it larger; {RAISE}) to the \
                 query {query}",
                series = config.limits.max_series,
            )),
            Error::TooManyPoints { query, limit } => SeedError::Limit(format!(
                "Prometheus answered more than the agent's limit of {limit} points over the window \
                 ({} series of 8 days at 1 minute: --history-max-series, chart agent.history.maxSeries; \
                 a longer --history-window holds fewer series; {RAISE}) to the query {query}",
                config.limits.max_series,
            )),
            Error::TooManySeries { query, count, limit } => SeedError::Limit(format!(
                "Prometheus answered {count} series, more than the agent's limit of {limit} \
                 (--history-max-series, chart agent.history.maxSeries; {RAISE}), to the query {query}"
            )),
            err => SeedError::Prometheus(err),
        }),
        Err(_) => Err(SeedError::Budget {
            budget: config.budget,
            last_error: last_error.lock().ok().and_then(|mut l| l.take()),
        }),
    }
}

/// What an answer over one of the agent's limits says to do.
const RAISE: &str =
    "raise it only with agent.resources.limits.memory: docs/history.md, \"The agent's memory\"";

/// Why seeding gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// Prometheus could not be read (after the retries, for a reason that may pass).
    #[error(transparent)]
    Prometheus(Error),
    /// An answer over one of the agent's limits, which bound its memory: never retried. The
    /// text names the limit, its flag and chart value, then the query.
    #[error("{0}")]
    Limit(String),
    /// The budget ran out, with the last read's error if one had failed (else the first read
    /// was still waiting for its answer).
    #[error(
        "reading history from Prometheus took longer than the budget of {budget:?}; {}",
        last_error.as_deref().map_or_else(
            || "no query had been answered yet".to_string(),
            |e| format!("the last error: {e}")
        )
    )]
    Budget {
        /// `--history-budget`.
        budget: Duration,
        /// The last failed read's error, if any.
        last_error: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_matched_to_their_daemonset_by_name() {
        assert!(owned_by("log-abcde", "log"));
        assert!(owned_by("log-shipper-x1y2z", "log-shipper"));
        assert!(!owned_by("log-shipper-x1y2z", "log"));
        assert!(!owned_by("log-shipper-x1y2", "log-shipper"));
        assert!(!owned_by("log-ABCDE", "log"));
        assert!(!owned_by("other-abcde", "log"));
        let long = "a".repeat(70);
        assert!(owned_by(&format!("{}b1c2d", "a".repeat(58)), &long));
    }

    #[test]
    fn only_failures_that_may_pass_are_tried_again() {
        let url = || "http://p".to_string();
        assert!(transient(&Error::Unreachable {
            url: url(),
            reason: "refused".into()
        }));
        assert!(transient(&Error::Query {
            url: url(),
            status: 503,
            query: "q".into(),
            detail: String::new()
        }));
        assert!(!transient(&Error::Query {
            url: url(),
            status: 400,
            query: "q".into(),
            detail: String::new()
        }));
        assert!(!transient(&Error::Unauthorized {
            url: url(),
            status: 401,
            detail: String::new()
        }));
    }

    #[tokio::test]
    async fn a_spent_budget_names_the_last_error() {
        // a port nobody listens on: every read is refused at once, then retried after 1 s
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let config = Config {
            endpoint: Endpoint {
                url: format!("http://127.0.0.1:{port}"),
                bearer_token_file: None,
                ca_file: None,
            },
            limits: Limits::default(),
            window: Duration::from_secs(3600),
            rate_window: RATE_WINDOW,
            budget: Duration::from_millis(1500),
        };
        let target = Target {
            key: Key {
                autoscaler: nodewarden_api::rightsizing::AutoscalerRef {
                    namespace: "logging".into(),
                    name: "shipper".into(),
                },
                container: "shipper".into(),
            },
            pod_namespace: "logging".into(),
            pod_name: "shipper-abcde".into(),
            daemonset: "shipper".into(),
            cgroup_uid: "uid".into(),
            container_id: "id".into(),
            cpu_request_milli: None,
            memory_request_bytes: None,
            containers_per_pod: 1,
            policy: nodewarden_estimator::policy::Policy::default(),
            last_oom: None,
        };
        let cfg = EstimatorConfig::default();
        let err = seed(&config, "n1", &[target], &cfg, 1_700_000_000_000)
            .await
            .unwrap_err();
        assert!(matches!(err, SeedError::Budget { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("budget of 1.5s"), "{text}");
        assert!(
            text.contains(&format!(
                "the last error: cannot reach Prometheus at http://127.0.0.1:{port}"
            )),
            "{text}"
        );
    }

    #[test]
    fn the_retries_are_bounded() {
        use backon::BackoffBuilder;
        let delays: Vec<Duration> = retry_backoff().build().collect();
        assert_eq!(delays.len(), RETRIES);
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(16)), "{delays:?}");
    }
}
