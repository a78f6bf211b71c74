//! `report --prometheus`: what nodewarden would recommend from Prometheus history alone.
//!
//! The DaemonSets come from the cluster (all of the namespace, those with the `-l` labels, or
//! those `--daemonset` names),
//! with their pods (current requests, and which node a pod ran on when its series carry no
//! `node` label). A DaemonSet's `DaemonSetAutoscaler`, when there is one, gives the policy;
//! otherwise (nothing installed yet) the report uses an autoscaler with every default
//! (`scope: Node`, both resources, no bounds). Its pods' cAdvisor series over the window
//! (`nodewarden_history::cadvisor`) go, per node and container, into the agent's own estimator
//! (`nodewarden_estimator::recommender::History`, the same constants); the agent's
//! `figures::entry` and `figures::spec` turn the estimates into the `NodeRecommendation`s the
//! node's agent would publish from the same samples, and [`super::compute`] does the rest as
//! for a cluster where nodewarden runs. docs/history.md has the queries, window and limits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::domain::rightsizing::precedence;
use nodewarden_api::quantity::parse_milli;
use nodewarden_api::rightsizing::{AutoscalerRef, DaemonSetAutoscaler, TargetKind, TargetRef};
use nodewarden_api::{DaemonSetAutoscalerSpec, NodeRecommendation};
use nodewarden_estimator::figures::{self, Figures};
use nodewarden_estimator::policy::{Key, policy_for};
use nodewarden_estimator::recommender::EstimatorConfig;
use nodewarden_estimator::samples::{Samples, history_of};
use nodewarden_history::cadvisor::{self, ContainerUsage, Labels, Window};
use nodewarden_history::{Endpoint, Limits as QueryLimits, Prometheus};
use serde::Serialize;

use super::{Snapshot, pod_node};
use crate::error::{Error, classify};

/// Where the history comes from, as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The Prometheus base URL.
    pub prometheus: String,
    /// Start of the window, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// End of the window, in milliseconds since the Unix epoch.
    pub end_ms: i64,
    /// One sample per this many seconds.
    pub resolution_seconds: u64,
    /// CPU's `rate()` range, in seconds.
    pub rate_window_seconds: u64,
    /// The DaemonSets read that have no `DaemonSetAutoscaler` (the report used the defaults).
    pub without_autoscaler: Vec<String>,
    /// Containers whose series carried no node label and whose pod no longer exists: left out.
    pub unplaced_containers: usize,
}

/// What `--prometheus` and its flags ask for.
#[derive(Clone, Debug)]
pub struct Request {
    /// Where Prometheus is and how to authenticate.
    pub endpoint: Endpoint,
    /// The bounds of every query.
    pub limits: QueryLimits,
    /// How far back to read.
    pub window: Duration,
    /// One sample per this interval.
    pub resolution: Duration,
    /// CPU's `rate()` range.
    pub rate_window: Duration,
    /// Where the window ends (`--end`), in milliseconds since the Unix epoch; `None`: now, less
    /// the newest samples that may still be arriving ([`cadvisor::settled_end`]).
    pub end_ms: Option<i64>,
    /// Only these DaemonSets (all of the namespace when empty).
    pub daemonsets: Vec<String>,
    /// Only the DaemonSets with these labels (`-l`, kubectl's syntax).
    pub selector: Option<String>,
    /// The label names of the cAdvisor series.
    pub labels: Labels,
}

/// The window a run at `now_ms` reads: ending at `--end`, else where a seeding agent's read at
/// `now_ms` would end ([`cadvisor::settled_end`]), its end on a whole multiple of the resolution (so
/// that runs a little apart, and a seeding agent, read the same steps): the agent's
/// `cadvisor::window`.
pub fn window(request: &Request, now_ms: i64) -> Window {
    let end_ms = request
        .end_ms
        .unwrap_or_else(|| cadvisor::settled_end(now_ms, request.rate_window));
    cadvisor::window(request.window, request.resolution, request.rate_window, end_ms)
}

/// An autoscaler with every default for `ds`, named after it: what the report assumes for a
/// DaemonSet nobody has autoscaled yet.
pub fn default_autoscaler(ds: &DaemonSet) -> DaemonSetAutoscaler {
    let spec = DaemonSetAutoscalerSpec {
        target_ref: TargetRef {
            api_version: "apps/v1".to_string(),
            kind: TargetKind::DaemonSet,
            name: ds.name_any(),
        },
        scope: Default::default(),
        node_group_label: None,
        update_policy: None,
        resource_policy: None,
        cold_start: Default::default(),
        ceiling: Default::default(),
    };
    let mut dsa = DaemonSetAutoscaler::new(&ds.name_any(), spec);
    dsa.metadata.namespace = ds.namespace();
    dsa
}

/// Which DaemonSet (index into `daemonsets`) a pod's name belongs to.
fn owner_of(pod: &str, patterns: &[(usize, String)]) -> Option<usize> {
    patterns.iter().find_map(|(i, prefix)| {
        let rest = pod.strip_prefix(prefix.as_str())?;
        (rest.len() == 5 && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())).then_some(*i)
    })
}

/// Reads the DaemonSets, their pods and autoscalers, and Prometheus's history of their
/// containers, and builds the snapshot [`super::compute`] reads, with the `NodeRecommendation`s
/// the agents would publish from that history.
pub async fn snapshot(
    client: &Client,
    namespace: Option<&str>,
    request: &Request,
    now_ms: i64,
) -> Result<(Snapshot, Source), Error> {
    let prometheus = Prometheus::new(request.endpoint.clone(), request.limits)?;
    let window = window(request, now_ms);

    let api: Api<DaemonSet> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut params = ListParams::default();
    if let Some(selector) = request.selector.as_deref().filter(|s| !s.is_empty()) {
        params = params.labels(selector);
    }
    let mut daemonsets = api
        .list(&params)
        .await
        .map_err(|e| classify("daemonsets.apps", e))?
        .items;
    if !request.daemonsets.is_empty() {
        daemonsets.retain(|d| request.daemonsets.contains(&d.name_any()));
        let found: BTreeSet<String> = daemonsets.iter().map(|d| d.name_any()).collect();
        if let Some(missing) = request.daemonsets.iter().find(|n| !found.contains(*n)) {
            return Err(Error::NoDaemonSet {
                name: missing.clone(),
                namespace: namespace.map(str::to_string),
            });
        }
    }
    daemonsets.sort_by_key(|d| (d.namespace(), d.name_any()));

    // the autoscalers, if nodewarden's CRDs are there at all
    let dsa_api: Api<DaemonSetAutoscaler> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let installed = match dsa_api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(e) => return Err(classify("daemonsetautoscalers.nodewarden.io", e)),
    };
    let mut autoscalers = Vec::new();
    let mut without_autoscaler = Vec::new();
    for ds in &daemonsets {
        let ns = ds.namespace().unwrap_or_default();
        let own = installed
            .iter()
            .filter(|a| {
                a.namespace().as_deref() == Some(ns.as_str()) && a.spec.target_ref.name == ds.name_any()
            })
            .min_by(|a, b| precedence(a, b));
        match own {
            Some(a) => autoscalers.push(a.clone()),
            None => {
                without_autoscaler.push(format!("{ns}/{}", ds.name_any()));
                autoscalers.push(default_autoscaler(ds));
            }
        }
    }

    let (pods, limit_ranges, node_labels) = super::fetch::around(client, &daemonsets, &autoscalers).await?;

    // the history, one namespace at a time
    let mut by_namespace: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, ds) in daemonsets.iter().enumerate() {
        by_namespace
            .entry(ds.namespace().unwrap_or_default())
            .or_default()
            .push(i);
    }
    let mut usage: Vec<(usize, ContainerUsage)> = Vec::new();
    let (mut any_cpu, mut any_memory) = (false, false);
    for (ns, members) in &by_namespace {
        let patterns: Vec<(usize, String)> = members
            .iter()
            .map(|&i| {
                let prefix: String = format!("{}-", daemonsets[i].name_any())
                    .chars()
                    .take(58)
                    .collect();
                (i, prefix)
            })
            .collect();
        let regex = members
            .iter()
            .map(|&i| cadvisor::daemonset_pods(&daemonsets[i].name_any()))
            .collect::<Vec<_>>()
            .join("|");
        let read = nodewarden_history::usage::read(&prometheus, &request.labels, ns, &regex, &window).await?;
        for c in read {
            any_cpu |= !c.cpu.is_empty();
            any_memory |= !c.memory.is_empty();
            if let Some(i) = owner_of(&c.pod, &patterns) {
                usage.push((i, c));
            }
        }
    }
    let complete = any_cpu && any_memory;
    if !daemonsets.is_empty() && !complete {
        // no history for any of them: say so when the series are not there at all
        cadvisor::check_series(&prometheus, &window).await?;
    }

    // per node, DaemonSet and container: the samples of every pod it had there
    let pod_nodes: BTreeMap<(String, String), String> = pods
        .iter()
        .filter_map(|p| Some(((p.namespace()?, p.name_any()), pod_node(p)?)))
        .collect();
    let mut samples: BTreeMap<(String, usize, String), Samples> = BTreeMap::new();
    let mut unplaced = 0;
    for (i, c) in usage {
        let node = c
            .node
            .clone()
            .or_else(|| pod_nodes.get(&(c.namespace.clone(), c.pod.clone())).cloned());
        let Some(node) = node else {
            unplaced += 1;
            continue;
        };
        samples
            .entry((node, i, c.container.clone()))
            .or_default()
            .add(c.cpu, c.memory, c.oom);
    }

    // each node's allocatable, as its agent caps its figures (unreadable: no cap, as the agent)
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut allocatable: BTreeMap<String, Figures> = BTreeMap::new();
    for (node, _, _) in samples.keys() {
        if !allocatable.contains_key(node) {
            let figures = match nodes_api.get_opt(node).await {
                Ok(Some(n)) => figures::allocatable_of(&n),
                _ => Figures::default(),
            };
            allocatable.insert(node.clone(), figures);
        }
    }
    let cfg = EstimatorConfig::default();
    let mut per_node: BTreeMap<String, figures::Snapshot> = BTreeMap::new();
    for ((node, i, container), mut s) in samples {
        let ds = &daemonsets[i];
        let dsa = &autoscalers[i];
        let template = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let Some(template) = template else { continue };
        // containers of the template only, as the agent measures them
        if !template.containers.iter().any(|c| c.name == container) {
            continue;
        }
        let Some(policy) = policy_for(dsa, &container) else {
            continue;
        };
        s.merge();
        let requests = current_requests(&pods, ds, &node, &container);
        let Some(history) = history_of(&cfg, &s, requests.1.unwrap_or(0) as f64) else {
            continue;
        };
        if history.sample_count == 0 && s.memory.is_empty() {
            continue;
        }
        let estimate = history.estimate(&cfg, template.containers.len());
        let node_allocatable = allocatable.get(&node).copied().unwrap_or_default();
        let Some(entry) = figures::entry(&estimate, &history, &policy, requests, node_allocatable) else {
            continue;
        };
        let key = Key {
            autoscaler: AutoscalerRef {
                namespace: dsa.namespace().unwrap_or_default(),
                name: dsa.name_any(),
            },
            container,
        };
        per_node.entry(node).or_default().insert(key, entry);
    }
    let recommendations: Vec<NodeRecommendation> = per_node
        .into_iter()
        .map(|(node, snapshot)| figures::object(&node, "", figures::spec(&snapshot, now_ms)))
        .collect();

    let source = Source {
        prometheus: prometheus.url().to_string(),
        start_ms: window.start_ms,
        end_ms: window.end_ms,
        resolution_seconds: request.resolution.as_secs(),
        rate_window_seconds: request.rate_window.as_secs(),
        without_autoscaler,
        unplaced_containers: unplaced,
    };
    Ok((
        Snapshot {
            autoscalers,
            daemonsets,
            pods,
            recommendations,
            node_labels,
            limit_ranges,
        },
        source,
    ))
}

/// The requests of `container` in the newest pod of `ds` on `node` (millicores, bytes).
fn current_requests(pods: &[Pod], ds: &DaemonSet, node: &str, container: &str) -> (Option<u64>, Option<u64>) {
    let newest = pods
        .iter()
        .filter(|p| super::owned_by(p, ds) && pod_node(p).as_deref() == Some(node))
        .max_by_key(|p| p.creation_timestamp());
    let requests = newest
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.requests.as_ref());
    let get = |name: &str, scale: u128| {
        requests
            .and_then(|r| r.get(name))
            .and_then(|q| parse_milli(&q.0))
            .map(|v| u64::try_from(v.div_ceil(scale)).unwrap_or(u64::MAX))
    };
    (get("cpu", 1), get("memory", 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_matched_to_their_daemonset_by_name() {
        let patterns = vec![(0, "log-".to_string()), (1, "log-shipper-".to_string())];
        assert_eq!(owner_of("log-abcde", &patterns), Some(0));
        assert_eq!(owner_of("log-shipper-x1y2z", &patterns), Some(1));
        assert_eq!(owner_of("log-shipper-x1y2", &patterns), None);
        assert_eq!(owner_of("log-ABCDE", &patterns), None);
        assert_eq!(owner_of("other-abcde", &patterns), None);
    }

    #[test]
    fn a_default_autoscaler_targets_the_daemonset() {
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shipper", "namespace": "logs"},
        }))
        .unwrap();
        let dsa = default_autoscaler(&ds);
        assert_eq!(dsa.name_any(), "shipper");
        assert_eq!(dsa.namespace().as_deref(), Some("logs"));
        assert_eq!(dsa.spec.target_ref.name, "shipper");
        assert_eq!(
            policy_for(&dsa, "any"),
            Some(nodewarden_estimator::policy::Policy::default())
        );
    }

    #[test]
    fn the_window_ends_on_a_whole_step() {
        let request = Request {
            endpoint: Endpoint {
                url: "http://p".into(),
                bearer_token_file: None,
                ca_file: None,
            },
            limits: QueryLimits::default(),
            window: Duration::from_secs(3600),
            resolution: Duration::from_secs(60),
            rate_window: Duration::from_secs(120),
            end_ms: None,
            daemonsets: Vec::new(),
            selector: None,
            labels: Labels::default(),
        };
        // now less half the rate window (60 s), down to the minute
        let w = window(&request, 1_700_000_123_456);
        assert_eq!(w.end_ms, 1_700_000_040_000);
        assert_eq!(w.start_ms, 1_700_000_040_000 - 3_600_000);
        // --end: down to the minute, whatever the time now
        let pinned = Request {
            end_ms: Some(1_700_000_123_456),
            ..request
        };
        let w = window(&pinned, 1_800_000_000_000);
        assert_eq!(w.end_ms, 1_700_000_100_000);
    }
}
