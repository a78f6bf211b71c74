//! A container's whole usage history: cAdvisor's CPU, memory and OOM-kill series
//! ([`cadvisor`]) joined with the OOM kills kube-state-metrics saw ([`kube_state_metrics`]).

use crate::cadvisor::{self, ContainerUsage, Labels, Window};
use crate::{Error, Prometheus, kube_state_metrics};

/// CPU, memory and OOM kills of every container of the pods of `namespace` whose names match
/// `pods` (a regular expression, e.g. [`cadvisor::daemonset_pods`]s joined by `|`), ordered by pod and
/// container (containers with OOM kills from kube-state-metrics alone last).
pub async fn read(
    prometheus: &Prometheus,
    labels: &Labels,
    namespace: &str,
    pods: &str,
    window: &Window,
) -> Result<Vec<ContainerUsage>, Error> {
    read_on(prometheus, labels, namespace, pods, None, window).await
}

/// [`read`] narrowed to the series of one node (`node="…"` in every query), as an agent reads
/// its own node's history: series without a node label are then left out.
pub async fn read_on(
    prometheus: &Prometheus,
    labels: &Labels,
    namespace: &str,
    pods: &str,
    node: Option<&str>,
    window: &Window,
) -> Result<Vec<ContainerUsage>, Error> {
    let read = |kind| async move {
        let q = cadvisor::query(kind, labels, namespace, pods, node, window);
        prometheus
            .query_range(&q, window.start_ms, window.end_ms, window.step)
            .await
    };
    let cpu = read(cadvisor::Kind::Cpu).await?;
    let memory = read(cadvisor::Kind::Memory).await?;
    let oom = read(cadvisor::Kind::Oom).await?;
    let restarts = kube_state_metrics::read(prometheus, labels, namespace, pods, node, window).await?;
    let mut usage = cadvisor::join(labels, cpu, memory, oom);
    kube_state_metrics::add_kills(labels, &mut usage, restarts, window);
    Ok(usage)
}
