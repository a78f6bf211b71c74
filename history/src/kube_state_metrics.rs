//! OOM kills from kube-state-metrics: where the kubelet's cAdvisor counter
//! (`container_oom_events_total`) misses them, or is not exported at all.
//!
//! kube-state-metrics exports what the pod's status says: `kube_pod_container_status_restarts_total`
//! (the container's `restartCount`) and `kube_pod_container_status_last_terminated_reason` (1 for
//! the reason its last run ended with, as `lastState.terminated.reason`). A kill is a step in which
//! the restart count rose while the last reason is `OOMKilled`: the rule of VPA's recommender,
//! which records an OOM when a pod update shows `restartCount` up and `lastState.terminated.reason`
//! `OOMKilled` (`pkg/recommender/input/oom/observer.go`). Its series carry the namespace, pod and
//! container but not the node (a `node` label on them, where a scrape job adds one, names the node
//! kube-state-metrics runs on), so the node comes from `kube_pod_info{node=…}`, joined on namespace
//! and pod.
//!
//! One query per read ([`query`]), evaluated at each step `t` by Prometheus:
//!
//! ```text
//! (
//!   (
//!     max by (namespace, pod, container) (kube_pod_container_status_restarts_total{SEL})
//!     - max by (namespace, pod, container) (kube_pod_container_status_restarts_total{SEL} offset STEP)
//!   ) > 0
//!   and on (namespace, pod, container)
//!   (max by (namespace, pod, container) (kube_pod_container_status_last_terminated_reason{SEL, reason="OOMKilled"}) > 0)
//! )
//! * on (namespace, pod) group_left (node)
//! max by (namespace, pod, node) (topk by (namespace, pod) (1, kube_pod_info{namespace=…, pod=~…[, node=…]}))
//! ```
//!
//! - the value is the restarts of the step `(t − STEP, t]`, kept where the last reason at `t` is
//!   `OOMKilled`: the kills of that step, at its end (as the cAdvisor counter's rises);
//! - every step stands alone (no baseline to lose at the window's start or between pages), and
//!   the answer holds only the steps with kills;
//! - `max by` drops the labels that differ between copies of a series (two kube-state-metrics
//!   replicas, `instance`, `job`, a scrape job's `node`), and `topk by (namespace, pod) (1, …)`
//!   keeps one `kube_pod_info` per pod, so the join can never be many-to-many;
//! - two restarts within one step of which only the last was an OOM kill count as two kills, and
//!   one of which only the first was counts none; a kill before the pod's first scrape (no earlier
//!   count to compare with) is not seen.
//!
//! [`merge_kills`] puts these kills together with the cAdvisor counter's: each source misses kills
//! the other sees (the counter lives with the killed container's cgroup, which is usually gone
//! before the next scrape; the pod status shows only kills that ended the container, not a child
//! process killed while the container ran on), so both count, and a kill both saw counts once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cadvisor::{ContainerUsage, Labels, Window, promql_duration, quoted};
use crate::{Error, Prometheus, Series};

/// The kube-state-metrics counter of a container's restarts.
pub const RESTARTS_SERIES: &str = "kube_pod_container_status_restarts_total";
/// The kube-state-metrics gauge of how a container's last run ended (`reason` label).
pub const LAST_TERMINATED_SERIES: &str = "kube_pod_container_status_last_terminated_reason";
/// The kube-state-metrics gauge of a pod, with its node (`node` label).
pub const POD_INFO_SERIES: &str = "kube_pod_info";
/// The reason a container killed by the kernel's OOM killer ends with.
pub const OOM_KILLED: &str = "OOMKilled";

/// A kill seen by both sources within this long of each other (or one step, when longer) is
/// one kill: kube-state-metrics shows it at the first scrape after the kubelet updated the pod's
/// status, the counter at the first scrape after the kill, both usually within a scrape interval.
pub const SAME_KILL: Duration = Duration::from_secs(120);

/// The query of the OOM kills of each step of the containers of the pods of `namespace` whose
/// names match `pods`, with each pod's node from `kube_pod_info`; narrowed to the pods of one
/// node when `node` is given.
pub fn query(labels: &Labels, namespace: &str, pods: &str, node: Option<&str>, window: &Window) -> String {
    let (ns, pod, container, node_label) = (&labels.namespace, &labels.pod, &labels.container, &labels.node);
    let pod_selector = format!("{ns}={}, {pod}=~{}", quoted(namespace), quoted(pods));
    let containers = format!("{pod_selector}, {container}!=\"\"");
    let on_node = node.map_or_else(String::new, |n| format!(", {node_label}={}", quoted(n)));
    let by = format!("{ns}, {pod}, {container}");
    format!(
        "(((max by ({by}) ({RESTARTS_SERIES}{{{containers}}}) - max by ({by}) ({RESTARTS_SERIES}{{{containers}}} \
         offset {step})) > 0) and on ({by}) (max by ({by}) ({LAST_TERMINATED_SERIES}{{{containers}, reason={oom}}}) \
         > 0)) * on ({ns}, {pod}) group_left ({node_label}) max by ({ns}, {pod}, {node_label}) (topk by ({ns}, {pod}) \
         (1, {POD_INFO_SERIES}{{{pod_selector}{on_node}}}))",
        step = promql_duration(window.step),
        oom = quoted(OOM_KILLED),
    )
}

/// `(namespace, pod, container)` of a series, when it has a pod and a container.
type Key = (String, String, String);

/// A container's node (`None` when `kube_pod_info` had none) and its kills, `(ms, kills)`.
pub type Kills = (Option<String>, Vec<(i64, u64)>);

/// The kills of each series of an answer of [`query`]: `(ms, kills)` at the end of each step
/// with kills, per container, with its node (`None` when `kube_pod_info` had none). Values that
/// are not whole positive counts are rounded; 0 and less are no kill.
pub fn kills(labels: &Labels, series: Vec<Series>) -> BTreeMap<Key, Kills> {
    let mut out: BTreeMap<Key, Kills> = BTreeMap::new();
    for s in series {
        let get = |name: &str| s.labels.get(name).filter(|v| !v.is_empty()).cloned();
        let (Some(pod), Some(container)) = (get(&labels.pod), get(&labels.container)) else {
            continue;
        };
        let key = (get(&labels.namespace).unwrap_or_default(), pod, container);
        let entry = out.entry(key).or_default();
        if entry.0.is_none() {
            entry.0 = get(&labels.node);
        }
        entry.1.extend(s.points.iter().filter_map(|&(at, v)| {
            // counts are whole numbers; saturating float → int conversion
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = v.round() as u64;
            (v.is_finite() && n > 0).then_some((at, n))
        }));
        entry.1.sort_by_key(|p| p.0);
    }
    out
}

/// The kills of both sources, in time order: every kill of `counter` (cAdvisor's), and those of
/// `restarts` (kube-state-metrics') that no kill of `counter` within `tolerance_ms` accounts for.
/// Each kill of one source accounts for at most one of the other (the earliest one it can).
pub fn merge_kills(counter: &[(i64, u64)], restarts: &[(i64, u64)], tolerance_ms: i64) -> Vec<(i64, u64)> {
    let mut left: Vec<(i64, u64)> = counter.to_vec();
    left.sort_by_key(|p| p.0);
    let mut restarts = restarts.to_vec();
    restarts.sort_by_key(|p| p.0);
    let mut out = counter.to_vec();
    let mut first = 0;
    for (at, mut n) in restarts {
        while first < left.len() && left[first].0 < at.saturating_sub(tolerance_ms) {
            first += 1;
        }
        let mut i = first;
        while n > 0 && i < left.len() && left[i].0 <= at.saturating_add(tolerance_ms) {
            let taken = n.min(left[i].1);
            left[i].1 -= taken;
            n -= taken;
            i += 1;
        }
        if n > 0 {
            out.push((at, n));
        }
    }
    out.sort_by_key(|p| p.0);
    out
}

/// Adds the kills of an answer of [`query`] to `usage` (the cAdvisor read of the same pods): to
/// the container of the same namespace, pod and container (a pod runs on one node; its node is
/// filled in from `kube_pod_info` where the cAdvisor series had none), merged with the counter's
/// by [`merge_kills`]; a container with kills and no cAdvisor series is added with its kills
/// alone.
pub fn add_kills(labels: &Labels, usage: &mut Vec<ContainerUsage>, series: Vec<Series>, window: &Window) {
    let step_ms = i64::try_from(window.step.as_millis()).unwrap_or(i64::MAX);
    let tolerance = step_ms.max(i64::try_from(SAME_KILL.as_millis()).unwrap_or(i64::MAX));
    for ((namespace, pod, container), (node, found)) in kills(labels, series) {
        if found.is_empty() {
            continue;
        }
        let same = usage
            .iter_mut()
            .find(|u| u.namespace == namespace && u.pod == pod && u.container == container);
        match same {
            Some(u) => {
                u.oom = merge_kills(&u.oom, &found, tolerance);
                if u.node.is_none() {
                    u.node = node;
                }
            }
            None => usage.push(ContainerUsage {
                namespace,
                pod,
                container,
                node,
                oom: found,
                ..ContainerUsage::default()
            }),
        }
    }
}

/// The kills of the containers of the pods of `namespace` whose names match `pods` (on `node`
/// when given), from kube-state-metrics: [`query`] over `window`. None (an empty answer) where
/// Prometheus has no kube-state-metrics series.
pub async fn read(
    prometheus: &Prometheus,
    labels: &Labels,
    namespace: &str,
    pods: &str,
    node: Option<&str>,
    window: &Window,
) -> Result<Vec<Series>, Error> {
    let q = query(labels, namespace, pods, node, window);
    prometheus
        .query_range(&q, window.start_ms, window.end_ms, window.step)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window {
            start_ms: 0,
            end_ms: 0,
            step: Duration::from_secs(60),
            rate_window: Duration::from_secs(120),
        }
    }

    #[test]
    fn the_query_joins_the_restarts_of_oom_killed_containers_to_their_pods_node() {
        let pods = crate::cadvisor::daemonset_pods("log.shipper");
        assert_eq!(
            query(&Labels::default(), "logging", &pods, Some("n\"1"), &window()),
            "(((max by (namespace, pod, container) (kube_pod_container_status_restarts_total{namespace=\"logging\", \
             pod=~\"log\\\\.shipper-[a-z0-9]{5}\", container!=\"\"}) - max by (namespace, pod, container) \
             (kube_pod_container_status_restarts_total{namespace=\"logging\", pod=~\"log\\\\.shipper-[a-z0-9]{5}\", \
             container!=\"\"} offset 1m)) > 0) and on (namespace, pod, container) (max by (namespace, pod, container) \
             (kube_pod_container_status_last_terminated_reason{namespace=\"logging\", \
             pod=~\"log\\\\.shipper-[a-z0-9]{5}\", container!=\"\", reason=\"OOMKilled\"}) > 0)) * on (namespace, pod) \
             group_left (node) max by (namespace, pod, node) (topk by (namespace, pod) (1, \
             kube_pod_info{namespace=\"logging\", pod=~\"log\\\\.shipper-[a-z0-9]{5}\", node=\"n\\\"1\"}))"
        );
        // the report: every node's pods, other label names
        let labels = Labels {
            node: "instance_node".into(),
            ..Labels::default()
        };
        let q = query(&labels, "ns", "a-[a-z0-9]{5}", None, &window());
        assert!(
            q.ends_with(
                "group_left (instance_node) max by (namespace, pod, instance_node) (topk by (namespace, pod) \
                 (1, kube_pod_info{namespace=\"ns\", pod=~\"a-[a-z0-9]{5}\"}))"
            ),
            "{q}"
        );
        // the container series are never narrowed by a node label (theirs is not the pod's)
        assert_eq!(q.matches("instance_node").count(), 2, "{q}");
    }

    fn series(pod: &str, node: Option<&str>, points: Vec<(i64, f64)>) -> Series {
        let mut labels: BTreeMap<String, String> = [("namespace", "ns"), ("pod", pod), ("container", "c")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some(node) = node {
            labels.insert("node".into(), node.into());
        }
        Series { labels, points }
    }

    #[test]
    fn the_answers_values_are_the_kills_of_each_step() {
        let k = kills(
            &Labels::default(),
            vec![
                series(
                    "a",
                    Some("n1"),
                    vec![(120, 1.0), (60, 2.0), (180, 0.0), (240, f64::NAN)],
                ),
                series("b", None, vec![(60, 1.0)]),
            ],
        );
        let a = &k[&("ns".to_string(), "a".to_string(), "c".to_string())];
        assert_eq!(a, &(Some("n1".to_string()), vec![(60, 2), (120, 1)]));
        let b = &k[&("ns".to_string(), "b".to_string(), "c".to_string())];
        assert_eq!(b, &(None, vec![(60, 1)]));
    }

    #[test]
    fn a_kill_both_sources_saw_counts_once() {
        let min = 60_000;
        // the counter saw the kill at 10 min; kube-state-metrics a minute later, and one at 30 min
        // the counter missed (the killed container's cgroup gone before a scrape)
        assert_eq!(
            merge_kills(&[(10 * min, 1)], &[(11 * min, 1), (30 * min, 1)], 2 * min),
            vec![(10 * min, 1), (30 * min, 1)]
        );
        // a child process killed (the counter only) stays; two restarts for one counted kill: one more
        assert_eq!(
            merge_kills(&[(5 * min, 1), (20 * min, 1)], &[(20 * min, 2)], 2 * min),
            vec![(5 * min, 1), (20 * min, 1), (20 * min, 1)]
        );
        // each counted kill accounts for one restart only
        assert_eq!(
            merge_kills(&[(10 * min, 1)], &[(9 * min, 1), (11 * min, 1)], 2 * min),
            vec![(10 * min, 1), (11 * min, 1)]
        );
        // no counter at all: kube-state-metrics' kills
        assert_eq!(merge_kills(&[], &[(1, 3)], 2 * min), vec![(1, 3)]);
    }

    #[test]
    fn kills_go_to_the_pods_container_and_fill_in_its_node() {
        let mut usage = vec![
            ContainerUsage {
                namespace: "ns".into(),
                pod: "a".into(),
                container: "c".into(),
                node: None,
                memory: vec![(60_000, 1.0)],
                oom: vec![(60_000, 1)],
                ..ContainerUsage::default()
            },
            ContainerUsage {
                namespace: "ns".into(),
                pod: "b".into(),
                container: "c".into(),
                node: Some("n2".into()),
                ..ContainerUsage::default()
            },
        ];
        add_kills(
            &Labels::default(),
            &mut usage,
            vec![
                // the same kill as the counter's, and a later one
                series("a", Some("n1"), vec![(120_000, 1.0), (600_000, 1.0)]),
                // a pod without cAdvisor series
                series("gone", Some("n3"), vec![(60_000, 1.0)]),
            ],
            &window(),
        );
        assert_eq!(usage[0].node.as_deref(), Some("n1"));
        assert_eq!(usage[0].oom, vec![(60_000, 1), (600_000, 1)]);
        assert_eq!(usage[1].oom, vec![]);
        assert_eq!(usage[2].pod, "gone");
        assert_eq!(usage[2].node.as_deref(), Some("n3"));
        assert_eq!(usage[2].oom, vec![(60_000, 1)]);
        assert!(usage[2].cpu.is_empty() && usage[2].memory.is_empty());
    }
}
