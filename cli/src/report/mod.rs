//! `kubectl nodewarden report`: per DaemonSet and node, the template's requests beside the pod's
//! current requests and the node's recommendation, and what the fleet would free or need.
//!
//! [`compute`] is a pure function of the objects read from the cluster ([`Snapshot`]);
//! [`fetch`] reads them, [`render`] prints the result.
//!
//! The figures:
//! - *template*: the DaemonSet's pod template requests (`spec.containers`, then the native
//!   sidecars of `spec.initContainers`, marked as such: the containers the webhook sizes);
//! - *current*: the requests of the newest pod of the DaemonSet bound to (or aimed at) the node,
//!   the template's when no pod is there;
//! - *target*: the requests the webhook would give a new pod of the DaemonSet on the node, by
//!   the rule the webhook and the agent share (`nodewarden_api::domain::sizing`): the node's
//!   `NodeRecommendation`, its group's or the fleet's figure as the autoscaler's `scope` and
//!   `coldStart` say, within `ceiling`, the container policy's bounds and the namespace's
//!   LimitRanges. Resources the rule leaves alone (not controlled, policy `mode: Off`, no figure
//!   yet) keep the current requests. *source* says where the figure came from (and
//!   *sourceDetail* in the words of the pod's `nodewarden.io/source` annotation).
//! - *lower*, *upper*: the node recommendation's bounds, where the figure is the node's own.
//! - *delta* = target − current; what the fleet would *free* is the sum of the negative deltas,
//!   what it *needs on top* the sum of the positive ones, per node and overall.
//! - per DaemonSet and node, the *pod's* request as the scheduler counts it (KEP-753:
//!   containers and sidecars summed, or a run-to-completion init container's peak if higher),
//!   now and with the targets ([`PodRequests`]).

pub mod fetch;
pub mod history;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, LimitRange, Pod, PodSpec, ResourceRequirements};
use kube::ResourceExt;
use nodewarden_api::domain::sizing::{self, Amounts, Targets};
use nodewarden_api::quantity::{ResourceList, parse_milli};
use nodewarden_api::rightsizing::{ContainerRecommendation, ResourceName, UpdateMode};
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
    /// The labels of every node, by node name (read only when an autoscaler uses node groups).
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// The LimitRanges of the autoscalers' namespaces.
    pub limit_ranges: Vec<LimitRange>,
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

    /// `self`, with the resources `amounts` has replaced by its figures.
    fn overlaid(mut self, amounts: &Amounts) -> Self {
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Some(cpu) = amounts.get(ResourceName::Cpu) {
            self.cpu_millis = Some(signed(cpu));
        }
        if let Some(memory) = amounts.get(ResourceName::Memory) {
            self.memory_bytes = Some(signed(memory));
        }
        self
    }
}

/// Where a row's target comes from, in short: the shared rule's source
/// ([`sizing::Source`]) grouped by what the reader needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// The node's own recommendation.
    Node,
    /// The figure of the node's group (`scope: NodeGroup`, or `coldStart: Group`).
    Group,
    /// The autoscaler's fleet figure (`coldStart: Fleet`, or `Group` without a group figure).
    Fleet,
    /// No figure: the requests stay as they are (no history yet, or none for the container).
    None,
    /// The container's policy is `mode: Off`.
    Off,
}

impl Source {
    /// The source's name as the table and CSV show it: `node`, `group`, `fleet`, `none` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Node => "node",
            Source::Group => "group",
            Source::Fleet => "fleet",
            Source::None => "none",
            Source::Off => "off",
        }
    }
}

impl From<sizing::Source> for Source {
    fn from(source: sizing::Source) -> Self {
        match source {
            sizing::Source::Node => Source::Node,
            sizing::Source::Group => Source::Group,
            sizing::Source::Fleet => Source::Fleet,
            sizing::Source::ColdStartTemplate
            | sizing::Source::NoFleetFigure
            | sizing::Source::ContainerNotMeasured => Source::None,
            sizing::Source::PolicyOff => Source::Off,
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
    /// Whether it is a native sidecar (an init container with `restartPolicy: Always`).
    pub sidecar: bool,
    /// Requests of the container in the DaemonSet's pod template.
    pub template: Resources,
    /// Requests of the pod on the node; the template's when there is no pod.
    pub current: Resources,
    /// Whether a pod of the DaemonSet is on (or aimed at) the node.
    pub has_pod: bool,
    /// Where `target` comes from.
    pub source: Source,
    /// Where `target` comes from, as the pod's `nodewarden.io/source` annotation says it (e.g.
    /// `node-recommendation`, `cold-start-template`).
    pub source_detail: String,
    /// The requests a new pod's container gets on the node (the webhook's rule: figures within
    /// `ceiling`, the policy's bounds and LimitRanges); the current requests for resources the
    /// rule leaves alone.
    pub target: Resources,
    /// The node recommendation's lower bound (only with source `node`).
    pub lower_bound: Resources,
    /// The node recommendation's upper bound (only with source `node`).
    pub upper_bound: Resources,
    /// OOM kills the node's agent saw for the container (only with source `node`).
    pub oom_kills: i64,
    /// Which of the node's figures are held at a cap (the node's allocatable, `maxAllowed`)
    /// rather than VPA's, and on how much history (only with source `node`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capped: Option<String>,
    /// The history behind the node's figures (only with source `node`): how many CPU samples,
    /// from when to when. VPA's confidence in a figure is the days this spans.
    pub history: HistorySpan,
    /// target − current, per resource (a request that is not set counts as 0); 0 where there is
    /// no target.
    pub delta: Delta,
}

impl Row {
    /// The container's name as the table shows it: `name (sidecar)` for a sidecar.
    pub fn label(&self) -> String {
        if self.sidecar {
            format!("{} (sidecar)", self.container)
        } else {
            self.container.clone()
        }
    }
}

/// The samples behind a node's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistorySpan {
    /// CPU samples taken in.
    pub sample_count: i64,
    /// When the first CPU sample was taken (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_sample_time: Option<String>,
    /// When the last CPU sample was taken (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sample_time: Option<String>,
    /// From the first sample to the last, in seconds.
    pub seconds: i64,
}

impl HistorySpan {
    fn of(e: &ContainerRecommendation) -> Self {
        let first = e.first_sample_time.as_ref().map(|t| t.0);
        let last = e.last_sample_time.as_ref().map(|t| t.0);
        let seconds = match (first, last) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs().max(0),
            _ => 0,
        };
        HistorySpan {
            sample_count: e.sample_count,
            first_sample_time: first.map(|t| t.to_string()),
            last_sample_time: last.map(|t| t.to_string()),
            seconds,
        }
    }
}

/// The pod's requests on one node as the scheduler counts them
/// ([`sizing::effective_requests`]), now and with the targets.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRequests {
    /// The node's name.
    pub node: String,
    /// The pod's request now (the template's when there is no pod).
    pub current: Resources,
    /// The request of a new pod of the DaemonSet on the node: what the node needs for it.
    pub target: Resources,
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
    /// Per node, the pod's request as the scheduler counts it, now and with the targets.
    pub pods: Vec<PodRequests>,
    /// What the DaemonSet's rows would free and need on top.
    pub totals: Totals,
}

/// The totals of one node over every DaemonSet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTotals {
    /// The node's name.
    pub node: String,
    /// Sum over the DaemonSets of their pod's request on the node now, as the scheduler counts
    /// it ([`PodRequests::current`]; an unset request counts as 0).
    pub current: Delta,
    /// Sum over the DaemonSets of the request of a new pod on the node
    /// ([`PodRequests::target`]): what the node needs for them.
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
    /// Where the figures come from when they are computed from Prometheus history
    /// (`--prometheus`) rather than read from the nodes' `NodeRecommendation`s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<history::Source>,
}

/// How rows are ordered (`--sort-by`). Ties keep the order by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Biggest absolute change first: by |CPU Δ|, then |memory Δ| (frees and needs alike).
    #[default]
    Change,
    /// Biggest absolute memory change first: by |memory Δ|, then |CPU Δ|.
    MemoryChange,
    /// By namespace, DaemonSet (autoscaler), node, then the template's container order.
    Name,
    /// By node, then namespace, autoscaler and container.
    Node,
}

fn change_key(cpu: i64, memory: i64, by: SortBy) -> (std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
    use std::cmp::Reverse;
    match by {
        SortBy::MemoryChange => (Reverse(memory.unsigned_abs()), Reverse(cpu.unsigned_abs())),
        _ => (Reverse(cpu.unsigned_abs()), Reverse(memory.unsigned_abs())),
    }
}

fn sort_rows(rows: &mut [Row], by: SortBy) {
    // `compute` gives rows by node, then the template's container order: the order by name
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    match by {
        SortBy::Change | SortBy::MemoryChange => {
            rows.sort_by_key(|r| change_key(r.delta.cpu_millis, r.delta.memory_bytes, by));
        }
        SortBy::Name | SortBy::Node => {}
    }
}

impl Report {
    /// Orders each DaemonSet's rows and the nodes as `by` says. The DaemonSets stay by
    /// namespace and autoscaler name; a node's change is what it frees plus what it needs.
    pub fn sort(&mut self, by: SortBy) {
        self.daemonsets
            .sort_by(|a, b| (&a.namespace, &a.autoscaler).cmp(&(&b.namespace, &b.autoscaler)));
        for ds in &mut self.daemonsets {
            sort_rows(&mut ds.rows, by);
        }
        self.nodes.sort_by(|a, b| a.node.cmp(&b.node));
        if matches!(by, SortBy::Change | SortBy::MemoryChange) {
            self.nodes.sort_by_key(|n| {
                let t = n.totals;
                change_key(
                    t.cpu_free_millis + t.cpu_needed_millis,
                    t.memory_free_bytes + t.memory_needed_bytes,
                    by,
                )
            });
        }
    }

    /// Every row with its DaemonSet, ordered as `by` says across the DaemonSets (the CSV, the
    /// table without headers and the HTML page list them so).
    pub fn rows_sorted(&self, by: SortBy) -> Vec<(&DaemonSetReport, &Row)> {
        let mut rows: Vec<(&DaemonSetReport, &Row)> = self
            .daemonsets
            .iter()
            .flat_map(|ds| ds.rows.iter().map(move |r| (ds, r)))
            .collect();
        rows.sort_by(|(a, ra), (b, rb)| {
            (&a.namespace, &a.autoscaler, &ra.node).cmp(&(&b.namespace, &b.autoscaler, &rb.node))
        });
        match by {
            SortBy::Change | SortBy::MemoryChange => {
                rows.sort_by_key(|(_, r)| change_key(r.delta.cpu_millis, r.delta.memory_bytes, by));
            }
            SortBy::Node => rows.sort_by(|(_, a), (_, b)| a.node.cmp(&b.node)),
            SortBy::Name => {}
        }
        rows
    }
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

fn mode_of(dsa: &DaemonSetAutoscaler) -> UpdateMode {
    dsa.spec.update_mode()
}

fn diff(target: Option<i64>, current: Option<i64>) -> i64 {
    match (target, current) {
        (Some(t), c) => t - c.unwrap_or(0),
        (None, _) => 0,
    }
}

/// The container (or init container) named `name`: names are unique across both in a pod.
fn find_container<'a>(spec: &'a PodSpec, name: &str) -> Option<&'a Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// The pod's effective requests on `node`: now (the pod there, else the template), and for a
/// new pod with the targets `sized` (each sized resource's request replaced, the rest as the
/// template has it).
fn pod_requests(
    node: &str,
    pod: Option<&Pod>,
    new_pod: &Pod,
    sized: &[sizing::ContainerSizing],
) -> PodRequests {
    let effective = |spec: Option<&PodSpec>| {
        let a = spec.map(sizing::effective_requests).unwrap_or_default();
        let signed = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        Resources {
            cpu_millis: signed(a.cpu),
            memory_bytes: signed(a.memory),
        }
    };
    let mut target = new_pod.spec.clone();
    if let Some(spec) = target.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            let Some(s) = sized.iter().find(|s| s.name == c.name) else {
                continue;
            };
            let requests = c
                .resources
                .get_or_insert_with(ResourceRequirements::default)
                .requests
                .get_or_insert_with(Default::default);
            for r in [ResourceName::Cpu, ResourceName::Memory] {
                if let Some(v) = s.requests.get(r) {
                    requests.insert(
                        r.as_str().to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(sizing::format_amount(r, v)),
                    );
                }
            }
        }
    }
    PodRequests {
        node: node.to_string(),
        current: effective(pod.and_then(|p| p.spec.as_ref()).or(new_pod.spec.as_ref())),
        target: effective(target.as_ref()),
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
            pods: Vec::new(),
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
        let template_spec: Option<&PodSpec> = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        // the containers the webhook sizes: the containers, then the native sidecars
        let containers: Vec<(String, bool, Resources)> = template_spec
            .map(|s| {
                let sidecars = s
                    .init_containers
                    .iter()
                    .flatten()
                    .filter(|c| sizing::is_sidecar(c.restart_policy.as_deref()))
                    .map(|c| (c, true));
                s.containers
                    .iter()
                    .map(|c| (c, false))
                    .chain(sidecars)
                    .map(|(c, sidecar)| {
                        (
                            c.name.clone(),
                            sidecar,
                            Resources::requests_of(c.resources.as_ref()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        // a new pod of the DaemonSet, as the webhook sees it (its containers are the template's)
        let new_pod = Pod {
            spec: template_spec.cloned(),
            ..Pod::default()
        };
        let limit_ranges = sizing::in_namespace(&namespace, &snapshot.limit_ranges);
        let status = sizing::status_figures(dsa);
        let group_label = dsa
            .spec
            .node_group_label
            .as_deref()
            .filter(|_| dsa.spec.uses_groups());

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
        // the node's entries for this autoscaler, by container, and its targets as the rule reads them
        let mut recs: BTreeMap<
            String,
            BTreeMap<&str, &nodewarden_api::rightsizing::ContainerRecommendation>,
        > = BTreeMap::new();
        let mut node_targets: BTreeMap<String, Targets> = BTreeMap::new();
        for rec in &snapshot.recommendations {
            for entry in &rec.spec.recommendations {
                if entry.autoscaler.namespace == namespace && entry.autoscaler.name == dsa.name_any() {
                    recs.entry(rec.name_any())
                        .or_default()
                        .insert(entry.container_name.as_str(), entry);
                }
            }
            let targets = sizing::node_targets(rec, &namespace, &dsa.name_any());
            if !targets.is_empty() {
                node_targets.insert(rec.name_any(), targets);
            }
        }
        let nodes: BTreeSet<String> = pods.keys().chain(recs.keys()).cloned().collect();

        for node in nodes {
            let pod = pods.get(&node).copied();
            let group =
                group_label.and_then(|label| snapshot.node_labels.get(&node)?.get(label).map(String::as_str));
            let figures = status.for_node(node_targets.get(&node), group);
            let (sized, sources) = sizing::sizing_and_sources_on(&new_pod, dsa, figures, &limit_ranges);
            let node_totals = by_node.entry(node.clone()).or_insert_with(|| NodeTotals {
                node: node.clone(),
                current: Delta::default(),
                target: Delta::default(),
                totals: Totals::default(),
            });
            // the node's figures are the pod's requests as the scheduler counts them: sidecars
            // summed with the containers, a run-to-completion init container's peak if higher
            let pod_request = pod_requests(&node, pod, &new_pod, &sized);
            node_totals.current.cpu_millis += pod_request.current.cpu_millis.unwrap_or(0);
            node_totals.current.memory_bytes += pod_request.current.memory_bytes.unwrap_or(0);
            node_totals.target.cpu_millis += pod_request.target.cpu_millis.unwrap_or(0);
            node_totals.target.memory_bytes += pod_request.target.memory_bytes.unwrap_or(0);
            report.pods.push(pod_request);
            for (container, sidecar, template) in &containers {
                let current = pod
                    .and_then(|p| p.spec.as_ref())
                    .and_then(|s| find_container(s, container))
                    .map(|c| Resources::requests_of(c.resources.as_ref()))
                    .unwrap_or(*template);
                let entry = recs.get(&node).and_then(|m| m.get(container.as_str())).copied();
                let rule_source = sources
                    .iter()
                    .find(|(name, _)| name == container)
                    .map(|(_, s)| *s)
                    .unwrap_or(sizing::Source::ContainerNotMeasured);
                let source = Source::from(rule_source);
                let target = match sized.iter().find(|c| &c.name == container) {
                    Some(c) => current.overlaid(&c.requests),
                    None => current,
                };
                let (lower, upper, history) = match entry {
                    Some(e) if source == Source::Node => (
                        Resources::from_list(e.lower_bound.as_ref()),
                        Resources::from_list(e.upper_bound.as_ref()),
                        HistorySpan::of(e),
                    ),
                    _ => (Resources::default(), Resources::default(), HistorySpan::default()),
                };
                let delta = Delta {
                    cpu_millis: diff(target.cpu_millis, current.cpu_millis),
                    memory_bytes: diff(target.memory_bytes, current.memory_bytes),
                };
                let row = Row {
                    node: node.clone(),
                    container: container.clone(),
                    sidecar: *sidecar,
                    template: *template,
                    current,
                    has_pod: pod.is_some(),
                    source,
                    source_detail: rule_source.as_str().to_string(),
                    target,
                    lower_bound: lower,
                    upper_bound: upper,
                    // the node's agent saw them, whichever figure the pod gets
                    oom_kills: entry.map_or(0, |e| e.oom_count),
                    capped: entry
                        .filter(|_| source == Source::Node)
                        .and_then(|e| e.capped.as_ref())
                        .map(|c| c.describe()),
                    history,
                    delta,
                };
                report.totals.add_row(&row);
                node_totals.totals.add_row(&row);
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
        history: None,
    }
}

#[cfg(test)]
mod tests;
