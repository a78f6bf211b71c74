//! `kubectl nodewarden report`: per DaemonSet and node, the template's requests beside the pod's
//! current requests and the node's recommendation, and what the fleet would free or need.
//!
//! [`compute`] is a pure function of the objects read from the cluster ([`Snapshot`]);
//! [`fetch`] reads them, [`render`] prints the result.
//!
//! The figures:
//! - *template*: the DaemonSet's pod template requests (`spec.containers` only, as the webhook);
//! - *current*: the requests of the newest pod of the DaemonSet bound to (or aimed at) the node,
//!   the template's when no pod is there;
//! - *target*, *lower*, *upper*: the node's `NodeRecommendation` entry for the autoscaler and
//!   container (already within the autoscaler's `minAllowed`/`maxAllowed`, as the agent
//!   publishes it), with `ceiling: Template` applied; with `coldStart: Fleet` a node without an
//!   entry shows the autoscaler's fleet figure (source `fleet`). Containers with policy
//!   `mode: Off` and resources outside `controlledResources` keep their current requests.
//!   LimitRanges are not applied.
//! - *delta* = target − current; what the fleet would *free* is the sum of the negative deltas,
//!   what it *needs on top* the sum of the positive ones, per node and overall.

pub mod fetch;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use kube::ResourceExt;
use nodewarden_api::quantity::{ResourceList, parse_milli};
use nodewarden_api::rightsizing::{
    Ceiling, ColdStart, ContainerMode, ContainerPolicy, ResourceName, UpdateMode,
};
use nodewarden_api::{DaemonSetAutoscaler, NodeRecommendation};
use serde::Serialize;

/// Everything the report reads from the cluster.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The `DaemonSetAutoscaler`s to report on.
    pub autoscalers: Vec<DaemonSetAutoscaler>,
    /// The DaemonSets the autoscalers target.
    pub daemonsets: Vec<DaemonSet>,
    /// Pods of the targeted DaemonSets (others are ignored).
    pub pods: Vec<Pod>,
    /// Every node's `NodeRecommendation`.
    pub recommendations: Vec<NodeRecommendation>,
}

/// CPU in millicores and memory in bytes; `None` where not set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPU in millicores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<i64>,
    /// Memory in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<i64>,
}

impl Resources {
    fn from_list(list: Option<&ResourceList>) -> Self {
        let get = |name: &str, scale: u128| {
            list.and_then(|l| l.get(name))
                .and_then(|q| parse_milli(&q.0))
                .map(|v| i64::try_from(v.div_ceil(scale)).unwrap_or(i64::MAX))
        };
        Resources {
            cpu_millis: get("cpu", 1),
            memory_bytes: get("memory", 1000),
        }
    }

    fn requests_of(resources: Option<&ResourceRequirements>) -> Self {
        Self::from_list(resources.and_then(|r| r.requests.as_ref()))
    }

    fn is_empty(&self) -> bool {
        self.cpu_millis.is_none() && self.memory_bytes.is_none()
    }
}

/// Where a row's target comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// The node's own recommendation.
    Node,
    /// No history on the node; the autoscaler's fleet figure (`coldStart: Fleet`).
    Fleet,
    /// No history on the node; the pod keeps the template (`coldStart: Template`).
    None,
    /// The container's policy is `mode: Off`.
    Off,
}

impl Source {
    /// The source's name as the table and CSV show it: `node`, `fleet`, `none` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Node => "node",
            Source::Fleet => "fleet",
            Source::None => "none",
            Source::Off => "off",
        }
    }
}

/// One container of one DaemonSet on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The node's name.
    pub node: String,
    /// The container's name.
    pub container: String,
    /// Requests of the container in the DaemonSet's pod template.
    pub template: Resources,
    /// Requests of the pod on the node; the template's when there is no pod.
    pub current: Resources,
    /// Whether a pod of the DaemonSet is on (or aimed at) the node.
    pub has_pod: bool,
    /// Where `target` comes from.
    pub source: Source,
    /// The requests the container would get on the node: after `ceiling: Template`; the current requests for resources nodewarden does not control.
    pub target: Resources,
    /// The node recommendation's lower bound (only with source `node`).
    pub lower_bound: Resources,
    /// The node recommendation's upper bound (only with source `node`).
    pub upper_bound: Resources,
    /// OOM kills the node's agent saw for the container (only with source `node`).
    pub oom_kills: i64,
    /// target − current, per resource (a request that is not set counts as 0); 0 where there is
    /// no target.
    pub delta: Delta,
}

/// A signed difference in millicores and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delta {
    /// CPU in millicores.
    pub cpu_millis: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
}

/// What moving every pod to its target would free and need on top.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// CPU the targets would free, in millicores.
    pub cpu_free_millis: i64,
    /// CPU the targets would need on top, in millicores.
    pub cpu_needed_millis: i64,
    /// Memory the targets would free, in bytes.
    pub memory_free_bytes: i64,
    /// Memory the targets would need on top, in bytes.
    pub memory_needed_bytes: i64,
    /// OOM kills seen, summed over the rows.
    pub oom_kills: i64,
}

impl Totals {
    fn add_row(&mut self, row: &Row) {
        self.add_delta(row.delta);
        self.oom_kills += row.oom_kills;
    }

    fn add_delta(&mut self, d: Delta) {
        if d.cpu_millis < 0 {
            self.cpu_free_millis += -d.cpu_millis;
        } else {
            self.cpu_needed_millis += d.cpu_millis;
        }
        if d.memory_bytes < 0 {
            self.memory_free_bytes += -d.memory_bytes;
        } else {
            self.memory_needed_bytes += d.memory_bytes;
        }
    }

    fn add(&mut self, other: &Totals) {
        self.cpu_free_millis += other.cpu_free_millis;
        self.cpu_needed_millis += other.cpu_needed_millis;
        self.memory_free_bytes += other.memory_free_bytes;
        self.memory_needed_bytes += other.memory_needed_bytes;
        self.oom_kills += other.oom_kills;
    }

    /// Net change: needed − freed (negative = the fleet frees resources).
    pub fn net(&self) -> Delta {
        Delta {
            cpu_millis: self.cpu_needed_millis - self.cpu_free_millis,
            memory_bytes: self.memory_needed_bytes - self.memory_free_bytes,
        }
    }
}

/// One autoscaled DaemonSet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetReport {
    /// The autoscaler's namespace.
    pub namespace: String,
    /// The autoscaler's name.
    pub autoscaler: String,
    /// The name of the DaemonSet it targets.
    pub daemonset: String,
    /// The autoscaler's update mode, e.g. `Initial`.
    pub mode: String,
    /// Why there are no rows, when there are none (e.g. the DaemonSet does not exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// One row per node and container.
    pub rows: Vec<Row>,
    /// What the DaemonSet's rows would free and need on top.
    pub totals: Totals,
}

/// The totals of one node over every DaemonSet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTotals {
    /// The node's name.
    pub node: String,
    /// Sum of the current requests on the node (an unset request counts as 0).
    pub current: Delta,
    /// Sum of the targets on the node (the current request where there is no target).
    pub target: Delta,
    /// What the node's rows would free and need on top.
    pub totals: Totals,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// One entry per autoscaler.
    pub daemonsets: Vec<DaemonSetReport>,
    /// One entry per node, by name.
    pub nodes: Vec<NodeTotals>,
    /// What the whole fleet would free and need on top.
    pub totals: Totals,
}

/// The node a DaemonSet pod runs on or is aimed at (the shared rule,
/// `nodewarden_api::domain::rightsizing::daemonset_pod_node`).
pub fn pod_node(pod: &Pod) -> Option<String> {
    nodewarden_api::domain::rightsizing::daemonset_pod_node(pod)
}

fn owned_by(pod: &Pod, ds: &DaemonSet) -> bool {
    let uid = ds.metadata.uid.as_deref();
    pod.namespace() == ds.namespace()
        && pod.owner_references().iter().any(|o| {
            o.controller == Some(true)
                && o.kind == "DaemonSet"
                && (uid.is_none() || Some(o.uid.as_str()) == uid)
                && o.name == ds.name_any()
        })
}

fn policy_for<'a>(dsa: &'a DaemonSetAutoscaler, container: &str) -> Option<&'a ContainerPolicy> {
    let policies = dsa
        .spec
        .resource_policy
        .as_ref()
        .map(|p| p.container_policies.as_slice())
        .unwrap_or(&[]);
    policies
        .iter()
        .find(|p| p.container_name == container)
        .or_else(|| policies.iter().find(|p| p.container_name == "*"))
}

fn mode_of(dsa: &DaemonSetAutoscaler) -> UpdateMode {
    dsa.spec
        .update_policy
        .as_ref()
        .map(|p| p.update_mode)
        .unwrap_or_default()
}

fn cap(value: Option<i64>, ceiling: Option<i64>) -> Option<i64> {
    match (value, ceiling) {
        (Some(v), Some(c)) => Some(v.min(c)),
        (v, _) => v,
    }
}

fn diff(target: Option<i64>, current: Option<i64>) -> i64 {
    match (target, current) {
        (Some(t), c) => t - c.unwrap_or(0),
        (None, _) => 0,
    }
}

/// Builds the report from what was read. Pure: the same snapshot gives the same report.
pub fn compute(snapshot: &Snapshot) -> Report {
    let mut daemonsets = Vec::new();
    let mut by_node: BTreeMap<String, NodeTotals> = BTreeMap::new();
    let mut autoscalers: Vec<&DaemonSetAutoscaler> = snapshot.autoscalers.iter().collect();
    autoscalers.sort_by_key(|a| (a.namespace().unwrap_or_default(), a.name_any()));
    for dsa in autoscalers {
        let namespace = dsa.namespace().unwrap_or_default();
        let mut report = DaemonSetReport {
            namespace: namespace.clone(),
            autoscaler: dsa.name_any(),
            daemonset: dsa.spec.target_ref.name.clone(),
            mode: mode_of(dsa).as_str().to_string(),
            problem: None,
            rows: Vec::new(),
            totals: Totals::default(),
        };
        let Some(ds) = snapshot.daemonsets.iter().find(|d| {
            d.namespace().as_deref() == Some(namespace.as_str()) && d.name_any() == dsa.spec.target_ref.name
        }) else {
            report.problem = Some(format!(
                "DaemonSet {namespace}/{} does not exist",
                dsa.spec.target_ref.name
            ));
            daemonsets.push(report);
            continue;
        };
        let containers: Vec<(String, Resources)> = ds
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| (c.name.clone(), Resources::requests_of(c.resources.as_ref())))
                    .collect()
            })
            .unwrap_or_default();

        // the newest pod per node
        let mut pods: BTreeMap<String, &Pod> = BTreeMap::new();
        for pod in snapshot.pods.iter().filter(|p| owned_by(p, ds)) {
            let Some(node) = pod_node(pod) else { continue };
            let newer = pods
                .get(&node)
                .is_none_or(|old| pod.creation_timestamp() > old.creation_timestamp());
            if newer {
                pods.insert(node, pod);
            }
        }
        // the node's entries for this autoscaler, by container
        let mut recs: BTreeMap<
            String,
            BTreeMap<&str, &nodewarden_api::rightsizing::ContainerRecommendation>,
        > = BTreeMap::new();
        for rec in &snapshot.recommendations {
            for entry in &rec.spec.recommendations {
                if entry.autoscaler.namespace == namespace && entry.autoscaler.name == dsa.name_any() {
                    recs.entry(rec.name_any())
                        .or_default()
                        .insert(entry.container_name.as_str(), entry);
                }
            }
        }
        let nodes: BTreeSet<String> = pods.keys().chain(recs.keys()).cloned().collect();
        let fleet: BTreeMap<&str, Resources> = dsa
            .status
            .as_ref()
            .map(|s| {
                s.fleet
                    .iter()
                    .map(|f| (f.container_name.as_str(), Resources::from_list(f.target.as_ref())))
                    .collect()
            })
            .unwrap_or_default();

        for node in nodes {
            let pod = pods.get(&node).copied();
            let node_totals = by_node.entry(node.clone()).or_insert_with(|| NodeTotals {
                node: node.clone(),
                current: Delta::default(),
                target: Delta::default(),
                totals: Totals::default(),
            });
            for (container, template) in &containers {
                let current = pod
                    .and_then(|p| p.spec.as_ref())
                    .and_then(|s| s.containers.iter().find(|c| &c.name == container))
                    .map(|c| Resources::requests_of(c.resources.as_ref()))
                    .unwrap_or(*template);
                let entry = recs.get(&node).and_then(|m| m.get(container.as_str())).copied();
                let policy = policy_for(dsa, container);
                let controlled = |r: ResourceName| {
                    policy
                        .and_then(|p| p.controlled_resources.as_ref())
                        .is_none_or(|list| list.contains(&r))
                };
                let (source, mut target, lower, upper, oom) =
                    if policy.is_some_and(|p| p.mode == ContainerMode::Off) {
                        (
                            Source::Off,
                            current,
                            Resources::default(),
                            Resources::default(),
                            0,
                        )
                    } else if let Some(e) = entry {
                        (
                            Source::Node,
                            Resources::from_list(e.target.as_ref()),
                            Resources::from_list(e.lower_bound.as_ref()),
                            Resources::from_list(e.upper_bound.as_ref()),
                            e.oom_count,
                        )
                    } else if dsa.spec.cold_start == ColdStart::Fleet
                        && let Some(f) = fleet.get(container.as_str()).filter(|f| !f.is_empty())
                    {
                        (Source::Fleet, *f, Resources::default(), Resources::default(), 0)
                    } else {
                        (
                            Source::None,
                            current,
                            Resources::default(),
                            Resources::default(),
                            0,
                        )
                    };
                if dsa.spec.ceiling == Ceiling::Template {
                    target.cpu_millis = cap(target.cpu_millis, template.cpu_millis);
                    target.memory_bytes = cap(target.memory_bytes, template.memory_bytes);
                }
                if !controlled(ResourceName::Cpu) {
                    target.cpu_millis = current.cpu_millis;
                }
                if !controlled(ResourceName::Memory) {
                    target.memory_bytes = current.memory_bytes;
                }
                let delta = Delta {
                    cpu_millis: diff(target.cpu_millis, current.cpu_millis),
                    memory_bytes: diff(target.memory_bytes, current.memory_bytes),
                };
                let row = Row {
                    node: node.clone(),
                    container: container.clone(),
                    template: *template,
                    current,
                    has_pod: pod.is_some(),
                    source,
                    target,
                    lower_bound: lower,
                    upper_bound: upper,
                    oom_kills: oom,
                    delta,
                };
                report.totals.add_row(&row);
                node_totals.totals.add_row(&row);
                node_totals.current.cpu_millis += current.cpu_millis.unwrap_or(0);
                node_totals.current.memory_bytes += current.memory_bytes.unwrap_or(0);
                node_totals.target.cpu_millis += target.cpu_millis.or(current.cpu_millis).unwrap_or(0);
                node_totals.target.memory_bytes += target.memory_bytes.or(current.memory_bytes).unwrap_or(0);
                report.rows.push(row);
            }
        }
        daemonsets.push(report);
    }
    let mut totals = Totals::default();
    for n in by_node.values() {
        totals.add(&n.totals);
    }
    Report {
        daemonsets,
        nodes: by_node.into_values().collect(),
        totals,
    }
}

#[cfg(test)]
mod tests;
