//! The cAdvisor queries: per namespace, pod, container and node, CPU in cores and the memory
//! working set in bytes, one point per step.
//!
//! - CPU: `max by (namespace, pod, container, node) (rate(container_cpu_usage_seconds_total{…}[W]))`.
//!   `rate()` handles counter resets (a counter that goes down started again from 0), as in
//!   VPA's provider; the rate window `W` is a flag (VPA uses its resolution, 1 h, for both).
//! - Memory: `max by (…) (max_over_time(container_memory_working_set_bytes{…}[step]))`: the
//!   highest scrape within each step, so the daily peak the estimator keeps is the highest
//!   scrape of the day. VPA reads the instantaneous value once per step and misses peaks
//!   between steps.
//! - OOM kills: `max by (…) (max_over_time(container_oom_events_total{…}[step]))`, the
//!   counter's rises counted on this side (VPA reads no OOM kills from Prometheus; the agent
//!   counts the cgroup's counter the same way). Optional: a kubelet without it gives none.
//! - OOM kills from kube-state-metrics (`crate::kube_state_metrics`, joined by `crate::usage`): the steps in which a
//!   container's restart count rose while its last run ended `OOMKilled`, its node from
//!   `kube_pod_info`; merged with the counter's, a kill both saw counted once. Optional too.
//! - `{…}` is `namespace="…", pod=~"…", container!="", container!="POD"`: no pod-level and no
//!   pause-container series, as VPA's selector. `max by` drops the labels that differ between a
//!   container's instances (`id`, `name`, `image`, `instance`, `job`), so a restarted container
//!   is one series (the new instance's counter starts at 0, which `rate()` already handled per
//!   instance), and a container scraped twice (two jobs) is not counted twice.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{Error, Prometheus, Series};

/// The cAdvisor counter of CPU seconds used.
pub const CPU_SERIES: &str = "container_cpu_usage_seconds_total";
/// The cAdvisor gauge of the memory working set, in bytes.
pub const MEMORY_SERIES: &str = "container_memory_working_set_bytes";
/// The cAdvisor counter of OOM kills of a container (optional: older kubelets lack it).
pub const OOM_SERIES: &str = "container_oom_events_total";

/// Names of the labels that say whose a series is (the kubelet's cAdvisor endpoint scraped as
/// kube-prometheus and the Prometheus Helm chart scrape it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels {
    /// The pod's namespace (`namespace`).
    pub namespace: String,
    /// The pod's name (`pod`).
    pub pod: String,
    /// The container's name (`container`).
    pub container: String,
    /// The node's name (`node`).
    pub node: String,
}

impl Default for Labels {
    fn default() -> Self {
        Labels {
            namespace: "namespace".into(),
            pod: "pod".into(),
            container: "container".into(),
            node: "node".into(),
        }
    }
}

/// The time range and resolution of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Start, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// End, in milliseconds since the Unix epoch.
    pub end_ms: i64,
    /// One point per this interval.
    pub step: Duration,
    /// The range of CPU's `rate()`.
    pub rate_window: Duration,
}

/// One container of one pod: its node (when the series carry it) and its points.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerUsage {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The node's name, if the series carry it.
    pub node: Option<String>,
    /// CPU used, in cores, averaged over the rate window ending at each point: `(ms, cores)`.
    pub cpu: Vec<(i64, f64)>,
    /// The highest working set of each step: `(ms, bytes)`.
    pub memory: Vec<(i64, f64)>,
    /// OOM kills counted in each step where there were some: `(ms, kills)`. From the counter's
    /// rises after its first point in the window (the first is the baseline, as the agent takes
    /// its first reading); a counter that goes down started again from 0, so its new value
    /// counts. With kube-state-metrics' kills added ([`crate::kube_state_metrics::add_kills`]).
    pub oom: Vec<(i64, u64)>,
}

/// The regular expression (anchored by Prometheus) of the names of a DaemonSet's pods: the
/// controller names them `<daemonset>-<5 characters>`, the prefix cut to 58 characters as the
/// API server cuts a `generateName`.
pub fn daemonset_pods(daemonset: &str) -> String {
    let prefix: String = format!("{daemonset}-").chars().take(58).collect();
    format!("{}[a-z0-9]{{5}}", escape_regex(&prefix))
}

/// `s` with the characters that mean something in a regular expression escaped.
pub fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` as a PromQL string literal.
pub(crate) fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A PromQL duration: whole minutes, seconds or milliseconds.
pub fn promql_duration(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn selector(labels: &Labels, namespace: &str, pods: &str, node: Option<&str>) -> String {
    let on_node = node.map_or_else(String::new, |n| format!(", {}={}", labels.node, quoted(n)));
    format!(
        "{}={}, {}=~{}{on_node}, {c}!=\"\", {c}!=\"POD\"",
        labels.namespace,
        quoted(namespace),
        labels.pod,
        quoted(pods),
        c = labels.container
    )
}

fn by(labels: &Labels) -> String {
    format!(
        "{}, {}, {}, {}",
        labels.namespace, labels.pod, labels.container, labels.node
    )
}

/// What a query reads: its series, and how one step's value comes out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// CPU in cores: `rate()` of [`CPU_SERIES`] over the window's `rate_window`.
    Cpu,
    /// The highest working set of each step: `max_over_time()` of [`MEMORY_SERIES`] over a step.
    Memory,
    /// The OOM-kill counter's highest value in each step: `max_over_time()` of [`OOM_SERIES`].
    Oom,
}

impl Kind {
    /// The series read.
    pub fn series(self) -> &'static str {
        match self {
            Kind::Cpu => CPU_SERIES,
            Kind::Memory => MEMORY_SERIES,
            Kind::Oom => OOM_SERIES,
        }
    }

    /// The range function and its range.
    fn range(self, window: &Window) -> (&'static str, Duration) {
        match self {
            Kind::Cpu => ("rate", window.rate_window),
            Kind::Memory | Kind::Oom => ("max_over_time", window.step),
        }
    }
}

/// The query of `kind` for the containers of the pods of `namespace` whose names match `pods`,
/// narrowed to the series of one node (its `node` label) when `node` is given.
pub fn query(
    kind: Kind,
    labels: &Labels,
    namespace: &str,
    pods: &str,
    node: Option<&str>,
    window: &Window,
) -> String {
    let (function, range) = kind.range(window);
    format!(
        "max by ({}) ({function}({}{{{}}}[{}]))",
        by(labels),
        kind.series(),
        selector(labels, namespace, pods, node),
        promql_duration(range)
    )
}

/// The steps where a counter rose, and by how much; a fall is a reset (its new value counts).
pub fn counter_rises(points: &[(i64, f64)]) -> Vec<(i64, u64)> {
    points
        .windows(2)
        .filter_map(|w| {
            let (before, (at, now)) = (w[0].1, w[1]);
            let rise = if now >= before { now - before } else { now };
            // counts are whole numbers; saturating float → int conversion
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = rise.round() as u64;
            (n > 0).then_some((at, n))
        })
        .collect()
}

/// Whether the series every read needs are there over the window: the first one missing is
/// an [`Error::MissingSeries`].
pub async fn check_series(prometheus: &Prometheus, window: &Window) -> Result<(), Error> {
    for series in [CPU_SERIES, MEMORY_SERIES] {
        if !prometheus
            .has_series(series, window.start_ms, window.end_ms)
            .await?
        {
            return Err(Error::MissingSeries {
                url: prometheus.url().to_string(),
                series: series.to_string(),
                start: window.start_ms.div_euclid(1000),
                end: window.end_ms.div_euclid(1000),
            });
        }
    }
    Ok(())
}

type Key = (String, String, String, Option<String>);

/// The CPU, memory and OOM-kill series of the same container put together; series without a
/// pod or container label are left out.
pub fn join(labels: &Labels, cpu: Vec<Series>, memory: Vec<Series>, oom: Vec<Series>) -> Vec<ContainerUsage> {
    let key = |s: &Series| -> Option<Key> {
        let get = |name: &str| s.labels.get(name).filter(|v| !v.is_empty()).cloned();
        Some((
            get(&labels.namespace).unwrap_or_default(),
            get(&labels.pod)?,
            get(&labels.container)?,
            get(&labels.node),
        ))
    };
    let mut out: BTreeMap<Key, ContainerUsage> = BTreeMap::new();
    for (series, kind) in cpu
        .into_iter()
        .map(|s| (s, 0))
        .chain(memory.into_iter().map(|s| (s, 1)))
        .chain(oom.into_iter().map(|s| (s, 2)))
    {
        let Some(k) = key(&series) else { continue };
        let usage = out.entry(k.clone()).or_insert_with(|| ContainerUsage {
            namespace: k.0,
            pod: k.1,
            container: k.2,
            node: k.3,
            ..ContainerUsage::default()
        });
        match kind {
            0 => usage.cpu.extend(series.points),
            1 => usage.memory.extend(series.points),
            _ => usage.oom.extend(counter_rises(&series.points)),
        }
    }
    out.into_values().collect()
}

/// Where a read made at `now_ms` ends its window: half the CPU rate window before now. The
/// newest samples may still be on their way: the kubelet's cAdvisor stamps a sample with the time
/// it measured it, and Prometheus stores it only at its next scrape, up to a scrape interval
/// later (and `rate_window` is at least twice that interval, as the chart's value says). Ending
/// before them, two reads of the same minute (the agent's seeding and a later
/// `kubectl nodewarden report --prometheus`) read the same samples, not one more.
pub fn settled_end(now_ms: i64, rate_window: Duration) -> i64 {
    let half = i64::try_from(rate_window.as_millis() / 2).unwrap_or(i64::MAX);
    now_ms.saturating_sub(half)
}

/// The window of `length` ending at `end_ms`, its end on a whole multiple of `resolution` at or
/// before it (so that reads a little apart, the agent's and the report's, read the same steps).
pub fn window(length: Duration, resolution: Duration, rate_window: Duration, end_ms: i64) -> Window {
    let step_ms = i64::try_from(resolution.as_millis()).unwrap_or(i64::MAX).max(1);
    let end_ms = end_ms.div_euclid(step_ms) * step_ms;
    let length = i64::try_from(length.as_millis()).unwrap_or(i64::MAX);
    Window {
        start_ms: end_ms.saturating_sub(length),
        end_ms,
        step: resolution,
        rate_window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_ends_on_a_whole_step() {
        let w = window(
            Duration::from_secs(3600),
            Duration::from_secs(60),
            Duration::from_secs(120),
            1_700_000_123_456,
        );
        assert_eq!(w.end_ms, 1_700_000_100_000);
        assert_eq!(w.start_ms, 1_700_000_100_000 - 3_600_000);
        assert_eq!(w.step, Duration::from_secs(60));
    }

    #[test]
    fn a_read_now_leaves_out_the_newest_half_rate_window() {
        // 12:01:20 with a 2m rate window: samples stamped after 12:00:20 may still arrive,
        // so the window ends at 12:00, not 12:01
        let minute = 60_000;
        let now = 1_700_000_040_000 + 80_000;
        let end = settled_end(now, Duration::from_secs(120));
        assert_eq!(end, now - minute);
        let w = window(
            Duration::from_secs(3600),
            Duration::from_secs(60),
            Duration::from_secs(120),
            end,
        );
        assert_eq!(w.end_ms, 1_700_000_040_000);
        // from 12:02:00 on, 12:01 is settled
        let w = window(
            Duration::from_secs(3600),
            Duration::from_secs(60),
            Duration::from_secs(120),
            settled_end(1_700_000_040_000 + 2 * minute, Duration::from_secs(120)),
        );
        assert_eq!(w.end_ms, 1_700_000_100_000);
    }

    #[test]
    fn queries_select_containers_of_the_daemonsets_pods() {
        let window = Window {
            start_ms: 0,
            end_ms: 0,
            step: Duration::from_secs(60),
            rate_window: Duration::from_secs(120),
        };
        let pods = daemonset_pods("log.shipper");
        assert_eq!(pods, "log\\.shipper-[a-z0-9]{5}");
        assert_eq!(
            query(Kind::Cpu, &Labels::default(), "logging", &pods, None, &window),
            "max by (namespace, pod, container, node) (rate(container_cpu_usage_seconds_total{namespace=\"logging\", \
             pod=~\"log\\\\.shipper-[a-z0-9]{5}\", container!=\"\", container!=\"POD\"}[2m]))"
        );
        assert_eq!(
            query(Kind::Memory, &Labels::default(), "logging", &pods, None, &window),
            "max by (namespace, pod, container, node) (max_over_time(container_memory_working_set_bytes{namespace=\
             \"logging\", pod=~\"log\\\\.shipper-[a-z0-9]{5}\", container!=\"\", container!=\"POD\"}[1m]))"
        );
        // an agent narrows every query to its own node
        let on = Labels {
            node: "instance_node".into(),
            ..Labels::default()
        };
        assert_eq!(
            query(Kind::Oom, &on, "logging", &pods, Some("n\"1"), &window),
            "max by (namespace, pod, container, instance_node) (max_over_time(container_oom_events_total{namespace=\
             \"logging\", pod=~\"log\\\\.shipper-[a-z0-9]{5}\", instance_node=\"n\\\"1\", container!=\"\", \
             container!=\"POD\"}[1m]))"
        );
        // a long name is cut as the API server cuts generateName
        let long = "a".repeat(70);
        assert_eq!(daemonset_pods(&long), format!("{}[a-z0-9]{{5}}", "a".repeat(58)));
    }

    #[test]
    fn durations_read_as_promql() {
        assert_eq!(promql_duration(Duration::from_secs(120)), "2m");
        assert_eq!(promql_duration(Duration::from_secs(90)), "90s");
        assert_eq!(promql_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn cpu_and_memory_of_a_container_are_joined() {
        let series = |pod: &str, node: Option<&str>, points: Vec<(i64, f64)>| {
            let mut labels: BTreeMap<String, String> =
                [("namespace", "ns"), ("pod", pod), ("container", "c")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
            if let Some(node) = node {
                labels.insert("node".into(), node.into());
            }
            Series { labels, points }
        };
        let joined = join(
            &Labels::default(),
            vec![
                series("a", Some("n1"), vec![(1, 0.5)]),
                series("b", None, vec![(1, 0.1)]),
            ],
            vec![series("a", Some("n1"), vec![(1, 100.0)])],
            vec![series("a", Some("n1"), vec![(1, 2.0), (2, 3.0), (3, 3.0)])],
        );
        assert_eq!(joined.len(), 2);
        assert_eq!(joined[0].node.as_deref(), Some("n1"));
        assert_eq!(joined[0].cpu, vec![(1, 0.5)]);
        assert_eq!(joined[0].memory, vec![(1, 100.0)]);
        assert_eq!(joined[0].oom, vec![(2, 1)]);
        assert_eq!(joined[1].node, None);
    }

    #[test]
    fn oom_kills_are_the_counters_rises_and_a_reset_counts_its_new_value() {
        // baseline 2 (before the window), +1, flat, reset to 1, +2
        let points = [(1, 2.0), (2, 3.0), (3, 3.0), (4, 1.0), (5, 3.0)];
        assert_eq!(counter_rises(&points), vec![(2, 1), (4, 1), (5, 2)]);
        assert_eq!(counter_rises(&[(1, 5.0)]), vec![]);
    }
}
