//! The pure part of right-sizing, shared by the webhook (new pods) and the agent (running pods): (pod, autoscaler, this node's targets, fleet targets, limit
//! ranges) → a JSON Patch and the annotations that explain it.
//!
//! Amounts are integers: CPU in millicores, memory in bytes. Quantities written into the pod use
//! the one canonical form the agent writes too ([`format_amount`], from `nodewarden-api`): CPU as whole cores (`2`) when exact, else millicores
//! (`250m`); memory with the largest binary suffix that divides it exactly (`1Gi`, `300Mi`,
//! `512Ki`), else plain bytes (`314572801`).
//!
//! The patch only ever uses `add` operations (which create a member or replace its value), creates
//! `metadata.annotations`, `resources`, `resources.requests` and `resources.limits` when they are
//! missing, and touches only `spec.containers`. It never removes a field. Applying the webhook to
//! its own output gives the same pod: every figure is a function of the recommendation and of
//! the pod's current values in a way that is stable once applied, and the annotations describe the
//! resulting values rather than the difference.

use std::collections::BTreeMap;

pub use crate::domain::patch::AddPatch;
pub use crate::domain::quantity::{amount, amount_of, format_amount};
use crate::domain::rightsizing::PolicyLookup;
use crate::rightsizing::{
    Ceiling, ColdStart, ContainerMode, ContainerPolicy, ControlledValues, DaemonSetAutoscaler,
    FleetRecommendation, NodeRecommendation, ResourceName, Scope, UpdateMode,
};
use k8s_openapi::api::core::v1::{Container, LimitRange, LimitRangeItem, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Prefix of every annotation the webhook sets on a pod.
pub const ANNOTATION_PREFIX: &str = "rightsizing.nodewarden.io/";
/// The autoscaler that decided (its name; it lives in the pod's namespace).
pub const ANNOTATION_AUTOSCALER: &str = "rightsizing.nodewarden.io/autoscaler";
/// The node whose figures were used.
pub const ANNOTATION_NODE: &str = "rightsizing.nodewarden.io/node";
/// Per container, where the figures came from.
pub const ANNOTATION_SOURCE: &str = "rightsizing.nodewarden.io/source";
/// Per container, the requests and limits the webhook set.
pub const ANNOTATION_UPDATES: &str = "rightsizing.nodewarden.io/updates";
/// Per container and resource, the caps that bounded the recommendation.
pub const ANNOTATION_CAPPED: &str = "rightsizing.nodewarden.io/capped";
/// Why the pod was left as it was, when nothing could be decided.
pub const ANNOTATION_SKIPPED: &str = "rightsizing.nodewarden.io/skipped";

/// CPU in millicores and memory in bytes; `None` when there is no figure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amounts {
    /// Millicores.
    pub cpu: Option<u64>,
    /// Bytes.
    pub memory: Option<u64>,
}

impl Amounts {
    /// The amount of `resource`.
    pub fn get(&self, resource: ResourceName) -> Option<u64> {
        match resource {
            ResourceName::Cpu => self.cpu,
            ResourceName::Memory => self.memory,
        }
    }

    /// Sets the amount of `resource`.
    pub fn set(&mut self, resource: ResourceName, value: Option<u64>) {
        match resource {
            ResourceName::Cpu => self.cpu = value,
            ResourceName::Memory => self.memory = value,
        }
    }

    /// Whether neither resource has a figure.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }

    /// Reads `cpu` and `memory` from a resource list; unreadable quantities count as absent.
    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut out = Amounts::default();
        if let Some(list) = list {
            for resource in RESOURCES {
                out.set(
                    resource,
                    list.get(resource.as_str()).and_then(|q| amount(resource, q)),
                );
            }
        }
        out
    }
}

/// Targets by container name.
pub type Targets = BTreeMap<String, Amounts>;

/// What the decision reads of a pod: whether it has annotations, and each container's name,
/// requests and limits. The webhook reads it straight from a review, without building a `Pod`;
/// [`PodFacts::of`] takes it from one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// Whether `metadata.annotations` is there (the patch creates it when it is not).
    pub has_annotations: bool,
    /// `spec.containers`, in pod order.
    pub containers: Vec<ContainerFacts>,
}

/// What the decision reads of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFacts {
    /// The container's name.
    pub name: String,
    /// Its `resources`; `None` when the container has none.
    pub resources: Option<ResourceFacts>,
}

/// A container's `resources`: `None` for a map it does not have. A quantity that cannot be
/// read counts as absent, as in [`Amounts::from_list`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceFacts {
    /// `resources.requests`.
    pub requests: Option<Amounts>,
    /// `resources.limits`.
    pub limits: Option<Amounts>,
}

impl PodFacts {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> Self {
        PodFacts {
            has_annotations: pod.metadata.annotations.is_some(),
            containers: pod
                .spec
                .as_ref()
                .map(|s| s.containers.iter().map(ContainerFacts::of).collect())
                .unwrap_or_default(),
        }
    }
}

impl ContainerFacts {
    /// The facts of `container`.
    pub fn of(container: &Container) -> Self {
        ContainerFacts {
            name: container.name.clone(),
            resources: container.resources.as_ref().map(|r| ResourceFacts {
                requests: r.requests.as_ref().map(|l| Amounts::from_list(Some(l))),
                limits: r.limits.as_ref().map(|l| Amounts::from_list(Some(l))),
            }),
        }
    }

    /// Its requests (none when it has no `requests`).
    pub fn requests(&self) -> Amounts {
        self.resources.and_then(|r| r.requests).unwrap_or_default()
    }

    /// Its limits (none when it has no `limits`).
    pub fn limits(&self) -> Amounts {
        self.resources.and_then(|r| r.limits).unwrap_or_default()
    }
}

/// The figures a pod's containers may take, by where they come from; which one a container
/// gets is the autoscaler's `scope` and `coldStart` (see [`mutate_on`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures<'a> {
    /// The targets the agent of the pod's node published for the autoscaler's containers
    /// (`None`: no recommendation on this node).
    pub node: Option<&'a Targets>,
    /// The figure of the node's group ([`group_targets`]), for `scope: NodeGroup` and
    /// `coldStart: Group`.
    pub group: Option<&'a Targets>,
    /// The fleet figure ([`fleet_targets`]), for `coldStart: Fleet` and `Group`.
    pub fleet: Option<&'a Targets>,
}

/// What an autoscaler's status gives every node, read once: the fleet figure and each group's
/// (only what the spec can use). The webhook keeps one per autoscaler in its index, so the
/// request path parses no quantity of the status; the agent reads it per round. Both then take
/// a node's [`Figures`] from it with [`StatusFigures::for_node`], so they agree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusFigures {
    /// The fleet figure, with `coldStart: Fleet` or `Group`.
    pub fleet: Option<Targets>,
    /// Each group's figure by its label value, with `scope: NodeGroup` or `coldStart: Group`
    /// (see [`group_targets`]).
    pub groups: BTreeMap<String, Targets>,
}

impl StatusFigures {
    /// The figures of a node with its own `node` targets, of group `group_value` (its value of
    /// `spec.nodeGroupLabel`, `None` without the label).
    pub fn for_node<'a>(&'a self, node: Option<&'a Targets>, group_value: Option<&str>) -> Figures<'a> {
        Figures {
            node: node.filter(|t| !t.is_empty()),
            group: group_value.and_then(|v| self.groups.get(v)),
            fleet: self.fleet.as_ref(),
        }
    }
}

/// Reads [`StatusFigures`] from an autoscaler: the fleet figure and the groups' figures, each
/// only when the spec can use it.
pub fn status_figures(autoscaler: &DaemonSetAutoscaler) -> StatusFigures {
    let spec = &autoscaler.spec;
    let fleet = match spec.cold_start {
        ColdStart::Fleet | ColdStart::Group => autoscaler.status.as_ref().map(|s| fleet_targets(&s.fleet)),
        ColdStart::Template => None,
    };
    let groups = match &autoscaler.status {
        Some(status) if spec.uses_groups() => status
            .groups
            .iter()
            .filter_map(|g| Some((g.value.clone(), group_targets(autoscaler, &g.value)?)))
            .collect(),
        _ => BTreeMap::new(),
    };
    StatusFigures { fleet, groups }
}

/// The figure of group `value` in the autoscaler's status; `None` when there is none, or when
/// the status's groups were computed for another label than the spec's `nodeGroupLabel`.
pub fn group_targets(autoscaler: &DaemonSetAutoscaler, value: &str) -> Option<Targets> {
    let status = autoscaler.status.as_ref()?;
    let label = autoscaler.spec.node_group_label.as_deref()?;
    if status.node_group_label.as_deref() != Some(label) {
        return None;
    }
    let group = status.groups.iter().find(|g| g.value == value)?;
    let targets = fleet_targets(&group.containers);
    (!targets.is_empty()).then_some(targets)
}

const RESOURCES: [ResourceName; 2] = [ResourceName::Cpu, ResourceName::Memory];

/// Where a container's figures came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The recommendation the agent on this node published.
    Node,
    /// No history on this node (or no figure of its group); the fleet figure (`coldStart:
    /// Fleet`, or `Group` for a node whose group has no figure).
    Fleet,
    /// The figure of the node's group: `scope: NodeGroup`, or `coldStart: Group` on a node
    /// without history of its own.
    Group,
    /// This node has no figures for the autoscaler yet and `coldStart: Template`: the
    /// template's requests stay.
    ColdStartTemplate,
    /// This node has no figures for the autoscaler yet and `coldStart: Fleet` (or `Group`), but
    /// no node (nor group) has a figure for this container: the template's requests stay.
    NoFleetFigure,
    /// This node has figures for the autoscaler, but not for this container (a container new in
    /// the template, or not measured here yet): the template's requests stay (with `coldStart:
    /// Fleet` and a fleet figure, that figure is used instead, source `fleet`).
    ContainerNotMeasured,
    /// The container policy says `Off`.
    PolicyOff,
}

impl Source {
    /// The `source` label of `nodewarden_rightsizing_containers_total` and of the source annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Node => "node-recommendation",
            Source::Fleet => "fleet",
            Source::Group => "group",
            Source::ColdStartTemplate => "cold-start-template",
            Source::NoFleetFigure => "no-fleet-figure-yet",
            Source::ContainerNotMeasured => "container-not-in-node-recommendation",
            Source::PolicyOff => "policy-off",
        }
    }
}

/// Which cap bounded a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// A LimitRange of type Pod: the pod's requests summed stay under its max.
    LimitRangePodMax,
    /// A LimitRange of type Pod: the pod's requests summed stay over its min.
    LimitRangePodMin,
    /// A LimitRange of type Container: its max.
    LimitRangeContainerMax,
    /// A LimitRange of type Container: its min.
    LimitRangeContainerMin,
    /// The container policy's `minAllowed`.
    MinAllowed,
    /// The container policy's `maxAllowed`.
    MaxAllowed,
    /// `ceiling: Template`: never above the template's request.
    CeilingTemplate,
    /// `RequestsOnly`: the request may not exceed the existing limit.
    Limit,
}

impl Cap {
    /// The cap's name in the capped annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Cap::LimitRangePodMax => "limitrange-pod-max",
            Cap::LimitRangePodMin => "limitrange-pod-min",
            Cap::LimitRangeContainerMax => "limitrange-container-max",
            Cap::LimitRangeContainerMin => "limitrange-container-min",
            Cap::MinAllowed => "minAllowed",
            Cap::MaxAllowed => "maxAllowed",
            Cap::CeilingTemplate => "ceiling-template",
            Cap::Limit => "limit",
        }
    }
}

/// Why a pod came out as it did (bounded, for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Requests or limits were changed.
    Resized,
    /// The autoscaler applied but every figure already matched (or every container was left as is).
    Unchanged,
    /// `updateMode: Off`: the autoscaler only recommends.
    UpdateModeOff,
    /// The pod names no single node.
    NoTargetNode,
}

impl Reason {
    /// The `reason` label of `nodewarden_rightsizing_pods_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Resized => "resized",
            Reason::Unchanged => "unchanged",
            Reason::UpdateModeOff => "update-mode-off",
            Reason::NoTargetNode => "no-target-node",
        }
    }
}

/// The outcome of [`mutate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Empty when the pod stays as it is (annotations included).
    pub patch: AddPatch,
    /// The annotations the patch sets.
    pub annotations: BTreeMap<String, String>,
    /// Why the pod came out as it did.
    pub reason: Reason,
    /// The node the pod is for, when it names one.
    pub node: Option<String>,
    /// Per container (in pod order), where its figures came from.
    pub sources: Vec<(String, Source)>,
}

/// The node a DaemonSet pod is for: `spec.nodeName`, else the single
/// `matchFields metadata.name In [node]` term the DaemonSet controller sets.
pub fn target_node(pod: &Pod) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or(NO_SPEC)?;
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or_default();
    node_of(
        spec.node_name.as_deref(),
        terms.iter().map(|term| {
            term.match_fields.iter().flatten().map(|f| {
                (
                    f.key.as_str(),
                    f.operator.as_str(),
                    f.values.as_deref().unwrap_or_default(),
                )
            })
        }),
    )
}

/// Why [`target_node`] finds no node in a pod without a spec.
pub const NO_SPEC: &str = "the pod has no spec";

/// [`target_node`] of a pod whose `spec.nodeName` is `node_name` and whose required node
/// affinity has `terms`, each given as its `matchFields` (key, operator, values).
pub fn node_of<'a, T, F>(node_name: Option<&str>, terms: T) -> Result<String, String>
where
    T: ExactSizeIterator<Item = F>,
    F: Iterator<Item = (&'a str, &'a str, &'a [String])>,
{
    if let Some(name) = node_name.filter(|n| !n.is_empty()) {
        return Ok(name.to_string());
    }
    let term_count = terms.len();
    let mut nodes = Vec::new();
    for fields in terms {
        for (key, operator, values) in fields {
            if key == "metadata.name" && operator == "In" {
                nodes.extend(values.iter().cloned());
            }
        }
    }
    match nodes.as_slice() {
        [one] if term_count == 1 => Ok(one.clone()),
        [] => Err(
            "no spec.nodeName and no matchFields metadata.name In [node] term in the required node affinity"
                .to_string(),
        ),
        _ => Err(format!(
            "the required node affinity does not name exactly one node ({term_count} terms, nodes {nodes:?})"
        )),
    }
}

/// The targets of one autoscaler's containers in a node's recommendation.
pub fn node_targets(rec: &NodeRecommendation, namespace: &str, autoscaler: &str) -> Targets {
    rec.spec
        .recommendations
        .iter()
        .filter(|r| r.autoscaler.namespace == namespace && r.autoscaler.name == autoscaler)
        .map(|r| (r.container_name.clone(), Amounts::from_list(r.target.as_ref())))
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// The fleet targets from an autoscaler's status.
pub fn fleet_targets(fleet: &[FleetRecommendation]) -> Targets {
    fleet
        .iter()
        .map(|f| (f.container_name.clone(), Amounts::from_list(f.target.as_ref())))
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// The 90th percentile (nearest rank, rounded up) of some values; `None` when there are none.
pub fn p90(values: &mut [u64]) -> Option<u64> {
    percentile(values, 90)
}

/// The `percent`th percentile (nearest rank, rounded up) of some values; `None` when there are
/// none.
pub fn percentile(values: &mut [u64], percent: usize) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (values.len() * percent.min(100)).div_ceil(100).max(1);
    values.get(rank - 1).copied()
}

/// How far above the median of the node targets the fleet figure may go: the fleet figure is
/// the 90th percentile, but at most this multiple of the median (see [`fleet_from_nodes`]).
pub const FLEET_MEDIAN_MULTIPLE: u64 = 2;

/// Fleet targets from the targets of many nodes: per container and resource, the 90th
/// percentile (nearest rank), but at most [`FLEET_MEDIAN_MULTIPLE`] × the median (nearest rank,
/// the lower of two middle values).
///
/// Why the cap: below ten nodes the nearest-rank 90th percentile is the largest figure, so one
/// node that reports a huge target (a compromised agent may write its own node's
/// recommendation, nothing else) would decide the requests of every new node. The median
/// cannot be raised above the largest honest figure while at most half of the nodes lie, so:
/// - while at most ⌊n/2⌋ of n nodes report false figures, the fleet figure is at most twice the
///   largest figure of an honest node;
/// - while at most n − ⌈0.9·n⌉ (about a tenth) do, it is at most that largest honest figure.
///
/// In a fleet whose busiest tenth runs at up to twice its median, the figure is the plain 90th
/// percentile.
pub fn fleet_from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Targets>) -> Targets {
    let robust = |values: &mut Vec<u64>| {
        let p90 = percentile(values, 90)?;
        let median = percentile(values, 50)?;
        Some(p90.min(median.saturating_mul(FLEET_MEDIAN_MULTIPLE)))
    };
    per_container(nodes)
        .into_iter()
        .map(|(c, (mut cpu, mut mem))| {
            (
                c,
                Amounts {
                    cpu: robust(&mut cpu),
                    memory: robust(&mut mem),
                },
            )
        })
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// Every node's CPU and memory targets, by container.
fn per_container<'a>(nodes: impl IntoIterator<Item = &'a Targets>) -> BTreeMap<String, (Vec<u64>, Vec<u64>)> {
    let mut samples: BTreeMap<String, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for targets in nodes {
        for (container, a) in targets {
            let entry = samples.entry(container.clone()).or_default();
            entry.0.extend(a.cpu);
            entry.1.extend(a.memory);
        }
    }
    samples
}

/// Per container and resource, the `percent`th percentile of many nodes' targets.
pub fn fleet_percentile<'a>(nodes: impl IntoIterator<Item = &'a Targets>, percent: usize) -> Targets {
    per_container(nodes)
        .into_iter()
        .map(|(c, (mut cpu, mut mem))| {
            (
                c,
                Amounts {
                    cpu: percentile(&mut cpu, percent),
                    memory: percentile(&mut mem, percent),
                },
            )
        })
        .filter(|(_, a)| !a.is_empty())
        .collect()
}

/// Adds `<base>/<map>/<resource>` (`map` is `requests` or `limits`), first adding `<base>`
/// (the container's `resources`) and `<base>/<map>` when the pod has neither yet; `parents`
/// records what exists so far.
fn add_amount(
    ops: &mut AddPatch,
    base: &[&str; 4],
    parents: (&mut bool, &mut bool),
    map: &str,
    resource: &str,
    amount: &str,
) {
    let (has_resources, has_map) = parents;
    if !*has_resources {
        ops.add_empty_object(base);
        *has_resources = true;
    }
    let [a, b, c, d] = *base;
    if !*has_map {
        ops.add_empty_object(&[a, b, c, d, map]);
        *has_map = true;
    }
    ops.add_str(&[a, b, c, d, map, resource], amount);
}

fn items<'a>(limit_ranges: &'a [LimitRange], kind: &'a str) -> impl Iterator<Item = &'a LimitRangeItem> + 'a {
    limit_ranges
        .iter()
        .filter_map(|lr| lr.spec.as_ref())
        .flat_map(|s| s.limits.iter())
        .filter(move |item| item.type_ == kind)
}

/// The tightest bound of `field` over the items (smallest max, largest min).
fn bound(
    items: &[&LimitRangeItem],
    resource: ResourceName,
    field: fn(&LimitRangeItem) -> Option<&BTreeMap<String, Quantity>>,
    tightest: fn(u64, u64) -> u64,
) -> Option<u64> {
    items
        .iter()
        .filter_map(|i| field(i)?.get(resource.as_str()))
        .filter_map(|q| amount(resource, q))
        .reduce(tightest)
}

fn lr_max(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.max.as_ref()
}
fn lr_min(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.min.as_ref()
}
fn lr_default(i: &LimitRangeItem) -> Option<&BTreeMap<String, Quantity>> {
    i.default.as_ref()
}

/// One resource of one container the decision covers.
#[derive(Debug)]
struct Plan<'a> {
    container: usize,
    resource: ResourceName,
    target: u64,
    request: Option<u64>,
    /// The container's own limit.
    own_limit: Option<u64>,
    /// Its own limit, else the LimitRange default that applies to it.
    limit: Option<u64>,
    controlled_values: ControlledValues,
    policy: Option<&'a ContainerPolicy>,
    value: u64,
    caps: Vec<Cap>,
}

/// Decides a DaemonSet pod's resources, finding its node with [`target_node`]; see [`mutate_on`].
pub fn mutate(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Decision {
    let node = target_node(pod);
    mutate_on(
        &PodFacts::of(pod),
        autoscaler,
        node.as_deref().map_err(String::as_str),
        figures,
        limit_ranges,
    )
}

/// Decides a DaemonSet pod's resources for its node, computed once by the caller.
///
/// * `node`: the node the pod is for ([`target_node`]), or why it names none.
/// * `figures`: this node's own targets, its group's and the fleet's ([`StatusFigures::for_node`]). Each
///   container takes the first figure it has of: with `scope: Node` the node's own; with
///   `scope: NodeGroup` the group's, then the node's own; then by `coldStart`: `Template`
///   none (the template's requests stay), `Fleet` the fleet's, `Group` the group's, then the
///   fleet's.
/// * `limit_ranges`: the LimitRanges of the pod's namespace.
///
/// Four steps: `plan` (which container and resource gets which target), `cap_pod`
/// (LimitRanges of type Pod), `cap_containers` (per container caps), `patch`.
pub fn mutate_on(
    pod: &PodFacts,
    autoscaler: &DaemonSetAutoscaler,
    node: Result<&str, &str>,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Decision {
    let name = autoscaler.metadata.name.clone().unwrap_or_default();
    let mode = autoscaler
        .spec
        .update_policy
        .as_ref()
        .map(|p| p.update_mode)
        .unwrap_or_default();
    let mut annotations = BTreeMap::from([(ANNOTATION_AUTOSCALER.to_string(), name)]);
    if mode == UpdateMode::Off {
        annotations.insert(
            ANNOTATION_SKIPPED.to_string(),
            "updateMode Off: the autoscaler only recommends; resources left as the template says".to_string(),
        );
        return Decision {
            patch: annotation_patch(pod, &annotations, &AddPatch::new()),
            annotations,
            reason: Reason::UpdateModeOff,
            node: None,
            sources: Vec::new(),
        };
    }
    let node = match node {
        Ok(node) => node.to_string(),
        Err(why) => {
            annotations.insert(
                ANNOTATION_SKIPPED.to_string(),
                format!("no single target node, resources left as the template says: {why}"),
            );
            return Decision {
                patch: annotation_patch(pod, &annotations, &AddPatch::new()),
                annotations,
                reason: Reason::NoTargetNode,
                node: None,
                sources: Vec::new(),
            };
        }
    };
    annotations.insert(ANNOTATION_NODE.to_string(), node.clone());

    let containers = pod.containers.as_slice();
    let ranges = Ranges::of(limit_ranges);
    let (plans, sources) = capped_plan(containers, autoscaler, figures, &ranges);
    let (ops, changed) = patch(&plans, containers, &ranges, &mut annotations);

    let mut source_text = String::new();
    for (c, s) in &sources {
        if !source_text.is_empty() {
            source_text.push_str(", ");
        }
        source_text.push_str(c);
        source_text.push('=');
        source_text.push_str(s.as_str());
    }
    annotations.insert(ANNOTATION_SOURCE.to_string(), source_text);
    let patch = annotation_patch(pod, &annotations, &ops);
    Decision {
        patch,
        annotations,
        reason: if changed {
            Reason::Resized
        } else {
            Reason::Unchanged
        },
        node: Some(node),
        sources,
    }
}

/// The requests and limits one container gets on its node: only the resources the decision
/// covers (a resource without a target, not controlled, or under a policy `Off` is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSizing {
    /// The container's name.
    pub name: String,
    /// The requests it gets.
    pub requests: Amounts,
    /// The limits it gets (`None` per resource: the limit is not the decision's to set, as with
    /// `RequestsOnly` or no limit at all).
    pub limits: Amounts,
}

/// What [`mutate_on`] gives `pod`'s containers on `node`, as figures instead of a patch: the
/// agent compares them with a running pod's and resizes it to exactly these. Pass the pod as
/// its DaemonSet's template makes it (the template's requests and limits), so `ceiling:
/// Template` and the limit ratio are those of the template, as for a new pod. `updateMode` is
/// not looked at (the caller decides what to do with the figures). Containers in pod order.
pub fn sizing_on(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Vec<ContainerSizing> {
    sizing_and_sources_on(pod, autoscaler, figures, limit_ranges).0
}

/// [`sizing_on`], and where each container's figures came from (every container of the pod, in
/// pod order, also those that keep the template's figures): what `kubectl nodewarden report`
/// shows for a new pod on a node.
pub fn sizing_and_sources_on(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> (Vec<ContainerSizing>, Vec<(String, Source)>) {
    let pod = PodFacts::of(pod);
    let containers = pod.containers.as_slice();
    let ranges = Ranges::of(limit_ranges);
    let (plans, sources) = capped_plan(containers, autoscaler, figures, &ranges);
    let mut out = Vec::new();
    for (index, mine) in by_container(&plans) {
        let Some(container) = containers.get(index) else {
            continue;
        };
        let mut sizing = ContainerSizing {
            name: container.name.clone(),
            ..ContainerSizing::default()
        };
        for plan in mine {
            sizing.requests.set(plan.resource, Some(plan.value));
            sizing
                .limits
                .set(plan.resource, scaled_limit(plan, plan.value, &ranges));
        }
        out.push(sizing);
    }
    (out, sources)
}

/// The containers that have plans, in pod order, each with its index and its plans. The plans
/// are made in pod order ([`plan`]) and the caps keep their order, so each container's plans
/// are next to each other: one pass, and a pod of many containers costs their number.
fn by_container<'p, 'a>(plans: &'p [Plan<'a>]) -> impl Iterator<Item = (usize, &'p [Plan<'a>])> {
    plans
        .chunk_by(|a, b| a.container == b.container)
        .map(|mine| (mine.first().map_or(0, |p| p.container), mine))
}

/// Steps 1 to 3, shared by the patch ([`mutate_on`]) and the figures ([`sizing_on`]): the plan,
/// capped by the LimitRanges of type Pod, then per container.
fn capped_plan<'a>(
    containers: &[ContainerFacts],
    autoscaler: &'a DaemonSetAutoscaler,
    figures: Figures,
    ranges: &Ranges,
) -> (Vec<Plan<'a>>, Vec<(String, Source)>) {
    let (mut plans, sources) = plan(containers, autoscaler, figures, ranges);
    cap_pod(&mut plans, containers, ranges);
    cap_containers(&mut plans, autoscaler.spec.ceiling, ranges);
    // `by_container` groups each container's plans by adjacency
    debug_assert!(plans.is_sorted_by_key(|p| p.container), "plans are in pod order");
    (plans, sources)
}

/// The LimitRange items of the pod's namespace, by type.
struct Ranges<'a> {
    container: Vec<&'a LimitRangeItem>,
    pod: Vec<&'a LimitRangeItem>,
}

impl<'a> Ranges<'a> {
    fn of(limit_ranges: &'a [LimitRange]) -> Self {
        Ranges {
            container: items(limit_ranges, "Container").collect(),
            pod: items(limit_ranges, "Pod").collect(),
        }
    }
}

/// Step 1, the raw plan: which container and resource gets which target, and where each
/// container's figures came from (in pod order).
fn plan<'a>(
    containers: &[ContainerFacts],
    autoscaler: &'a DaemonSetAutoscaler,
    figures: Figures,
    ranges: &Ranges,
) -> (Vec<Plan<'a>>, Vec<(String, Source)>) {
    let mut sources = Vec::new();
    let mut plans: Vec<Plan> = Vec::new();
    let policies = PolicyLookup::of(autoscaler);
    // where figures are looked for, in order: the history of the node (or its group), then the
    // cold-start choice
    let history = match autoscaler.spec.scope {
        Scope::Node => [(Source::Node, figures.node), (Source::Node, None)],
        Scope::NodeGroup => [(Source::Group, figures.group), (Source::Node, figures.node)],
    };
    let has_history = history.iter().any(|(_, t)| t.is_some_and(|t| !t.is_empty()));
    let cold = match autoscaler.spec.cold_start {
        ColdStart::Template => [(Source::Fleet, None), (Source::Fleet, None)],
        ColdStart::Fleet => [(Source::Fleet, figures.fleet), (Source::Fleet, None)],
        ColdStart::Group => [(Source::Group, figures.group), (Source::Fleet, figures.fleet)],
    };
    let chain: [(Source, Option<&Targets>); 4] = [history[0], history[1], cold[0], cold[1]];
    for (index, container) in containers.iter().enumerate() {
        let policy = policies.get(&container.name);
        if policy.is_some_and(|p| p.mode == ContainerMode::Off) {
            sources.push((container.name.clone(), Source::PolicyOff));
            continue;
        }
        let found = chain
            .iter()
            .find_map(|(source, t)| Some((*source, *t.and_then(|t| t.get(&container.name))?)));
        let (source, targets) = match found {
            Some((source, t)) => (source, Some(t)),
            None if has_history => (Source::ContainerNotMeasured, None),
            None => match autoscaler.spec.cold_start {
                ColdStart::Template => (Source::ColdStartTemplate, None),
                ColdStart::Fleet | ColdStart::Group => (Source::NoFleetFigure, None),
            },
        };
        sources.push((container.name.clone(), source));
        let Some(targets) = targets else { continue };
        let controlled: &[ResourceName] = policy
            .and_then(|p| p.controlled_resources.as_deref())
            .unwrap_or(&RESOURCES);
        let requests = container.requests();
        let limits = container.limits();
        for resource in RESOURCES {
            if !controlled.contains(&resource) {
                continue;
            }
            let Some(target) = targets.get(resource) else {
                continue;
            };
            let own_limit = limits.get(resource);
            let default_limit = bound(&ranges.container, resource, lr_default, u64::min);
            plans.push(Plan {
                container: index,
                resource,
                target,
                request: requests.get(resource),
                own_limit,
                limit: own_limit.or(default_limit),
                controlled_values: policy.map(|p| p.controlled_values).unwrap_or_default(),
                policy,
                value: target,
                caps: Vec::new(),
            });
        }
    }
    (plans, sources)
}

/// Step 2, LimitRanges of type Pod: the sum of the pod's requests stays within min and max,
/// the planned containers scaled together.
fn cap_pod(plans: &mut [Plan], containers: &[ContainerFacts], ranges: &Ranges) {
    if ranges.pod.is_empty() {
        return;
    }
    for resource in RESOURCES {
        let planned: Vec<usize> = (0..plans.len())
            .filter(|&i| plans[i].resource == resource)
            .collect();
        if planned.is_empty() {
            continue;
        }
        // one flag per container: a pod of many containers costs their number, not its square
        let mut is_planned = vec![false; containers.len()];
        for &p in &planned {
            if let Some(flag) = is_planned.get_mut(plans[p].container) {
                *flag = true;
            }
        }
        let others: u64 = containers
            .iter()
            .enumerate()
            .filter(|(i, _)| !is_planned[*i])
            .filter_map(|(_, c)| c.requests().get(resource))
            .fold(0, u64::saturating_add);
        let ours: u64 = planned
            .iter()
            .map(|&p| plans[p].value)
            .fold(0, u64::saturating_add);
        // saturating: a sum beyond u64 is over any max and never under a min
        let total = others.saturating_add(ours);
        if let Some(max) = bound(&ranges.pod, resource, lr_max, u64::min)
            && total > max
            && ours > 0
        {
            let room = max.saturating_sub(others);
            scale_to_sum(plans, &planned, room, ours);
            for &p in &planned {
                plans[p].caps.push(Cap::LimitRangePodMax);
            }
        } else if let Some(min) = bound(&ranges.pod, resource, lr_min, u64::max)
            && total < min
            && ours > 0
        {
            let need = min.saturating_sub(others);
            scale_to_sum(plans, &planned, need, ours);
            for &p in &planned {
                plans[p].caps.push(Cap::LimitRangePodMin);
            }
        }
    }
}

/// Step 3, per container: LimitRange, minAllowed/maxAllowed, ceiling, the existing limit; and
/// the LimitRange again, so a policy bound never takes the pod outside what is admissible.
fn cap_containers(plans: &mut [Plan], ceiling: Ceiling, ranges: &Ranges) {
    for plan in plans {
        let r = plan.resource;
        let lr_container_max = bound(&ranges.container, r, lr_max, u64::min);
        let lr_container_min = bound(&ranges.container, r, lr_min, u64::max);
        clamp(
            plan,
            lr_container_min,
            lr_container_max,
            Cap::LimitRangeContainerMin,
            Cap::LimitRangeContainerMax,
        );
        let policy_min = plan
            .policy
            .and_then(|p| Amounts::from_list(p.min_allowed.as_ref()).get(r));
        let policy_max = plan
            .policy
            .and_then(|p| Amounts::from_list(p.max_allowed.as_ref()).get(r));
        clamp(plan, policy_min, policy_max, Cap::MinAllowed, Cap::MaxAllowed);
        if ceiling == Ceiling::Template
            && let Some(template) = plan.request
            && plan.value > template
        {
            plan.value = template;
            plan.caps.push(Cap::CeilingTemplate);
        }
        if plan.controlled_values == ControlledValues::RequestsOnly
            && let Some(limit) = plan.limit
            && plan.value > limit
        {
            plan.value = limit;
            plan.caps.push(Cap::Limit);
        }
        clamp(
            plan,
            lr_container_min,
            lr_container_max,
            Cap::LimitRangeContainerMin,
            Cap::LimitRangeContainerMax,
        );
        plan.caps.dedup();
    }
}

/// The largest limit the ratio may scale to: 2^63 − 1 (millicores or bytes), the largest amount
/// Kubernetes keeps exactly as an integer. Never below the request (see docs/rightsizing.md).
pub const MAX_SCALED_LIMIT: u64 = i64::MAX as u64;

/// The limit that goes with a planned request: `RequestsOnly` keeps the limit as it is;
/// `RequestsAndLimits` keeps the limit-to-request ratio, within the LimitRange max and never
/// below the request.
fn scaled_limit(plan: &Plan, request: u64, ranges: &Ranges) -> Option<u64> {
    match plan.controlled_values {
        ControlledValues::RequestsOnly => None,
        ControlledValues::RequestsAndLimits => plan.limit.map(|old_limit| {
            let scaled = match plan.request {
                Some(old_request) if old_request != old_limit && old_request > 0 => {
                    scale_ceil(old_limit, request, old_request).min(MAX_SCALED_LIMIT)
                }
                _ => request,
            };
            let lr_max = bound(&ranges.container, plan.resource, lr_max, u64::min);
            lr_max.map_or(scaled, |m| scaled.min(m)).max(request)
        }),
    }
}

/// Step 4, the patch: `add` operations for the requests and limits that change, and the
/// `updates` and `capped` annotations. Returns the operations and whether any figure changed.
fn patch(
    plans: &[Plan],
    containers: &[ContainerFacts],
    ranges: &Ranges,
    annotations: &mut BTreeMap<String, String>,
) -> (AddPatch, bool) {
    // room for eight operations (a container's requests and limits, and their parents) of
    // about 70 bytes each without growing
    let mut ops = AddPatch::with_capacity(640);
    // the two annotations' text, written in place: `<container>: <resource> request <amount>
    // [limit <amount>], …; …` and `<container>: <resource> <cap>+<cap> (recommended <amount>),
    // …; …`
    let mut updates = String::new();
    let mut capped = String::new();
    let mut changed = false;
    for (index, mine) in by_container(plans) {
        let Some(container) = containers.get(index) else {
            continue;
        };
        let index_token = index.to_string();
        let base = ["spec", "containers", index_token.as_str(), "resources"];
        let resources = container.resources;
        let mut has_resources = resources.is_some();
        let mut has_requests = resources.and_then(|r| r.requests).is_some();
        let mut has_limits = resources.and_then(|r| r.limits).is_some();
        if !updates.is_empty() {
            updates.push_str("; ");
        }
        updates.push_str(&container.name);
        updates.push_str(": ");
        let mut capped_any = false;
        for (i, plan) in mine.iter().enumerate() {
            let r = plan.resource;
            let request = plan.value;
            let limit = scaled_limit(plan, request, ranges);
            let request_text = format_amount(r, request);
            if i > 0 {
                updates.push_str(", ");
            }
            updates.push_str(r.as_str());
            updates.push_str(" request ");
            updates.push_str(&request_text);
            if plan.request != Some(request) {
                let parents = (&mut has_resources, &mut has_requests);
                add_amount(&mut ops, &base, parents, "requests", r.as_str(), &request_text);
                changed = true;
            }
            if let Some(limit) = limit {
                let limit_text = format_amount(r, limit);
                updates.push_str(" limit ");
                updates.push_str(&limit_text);
                if plan.own_limit != Some(limit) {
                    let parents = (&mut has_resources, &mut has_limits);
                    add_amount(&mut ops, &base, parents, "limits", r.as_str(), &limit_text);
                    changed = true;
                }
            }
            if !plan.caps.is_empty() {
                if capped_any {
                    capped.push_str(", ");
                } else {
                    if !capped.is_empty() {
                        capped.push_str("; ");
                    }
                    capped.push_str(&container.name);
                    capped.push_str(": ");
                    capped_any = true;
                }
                capped.push_str(r.as_str());
                capped.push(' ');
                for (j, cap) in plan.caps.iter().enumerate() {
                    if j > 0 {
                        capped.push('+');
                    }
                    capped.push_str(cap.as_str());
                }
                capped.push_str(" (recommended ");
                capped.push_str(&format_amount(r, plan.target));
                capped.push(')');
            }
        }
    }
    if !updates.is_empty() {
        annotations.insert(ANNOTATION_UPDATES.to_string(), updates);
    }
    if !capped.is_empty() {
        annotations.insert(ANNOTATION_CAPPED.to_string(), capped);
    }
    (ops, changed)
}

fn clamp(plan: &mut Plan, min: Option<u64>, max: Option<u64>, min_cap: Cap, max_cap: Cap) {
    if let Some(max) = max
        && plan.value > max
    {
        plan.value = max;
        plan.caps.push(max_cap);
    }
    if let Some(min) = min
        && plan.value < min
    {
        plan.value = min;
        plan.caps.push(min_cap);
    }
}

/// Scales the `planned` values (summing to `ours`) in proportion so that they sum to exactly
/// `sum`: each rounded down, then the units lost to rounding given one each to the values that
/// lost the most (largest remainder). Rounding each value up instead could end a pod a few
/// units over a Pod LimitRange max as tight as its min (`1001m` and two containers: 501m + 501m).
fn scale_to_sum(plans: &mut [Plan], planned: &[usize], sum: u64, ours: u64) {
    if ours == 0 {
        return;
    }
    let mut remainders: Vec<(u128, usize)> = Vec::with_capacity(planned.len());
    let mut given: u128 = 0;
    for &p in planned {
        let exact = u128::from(plans[p].value) * u128::from(sum);
        let floor = exact / u128::from(ours);
        given += floor;
        remainders.push((exact % u128::from(ours), p));
        plans[p].value = u64::try_from(floor).unwrap_or(u64::MAX);
    }
    // fewer units are missing than there are values (each lost less than one)
    let missing = u128::from(sum).saturating_sub(given);
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, p) in remainders
        .iter()
        .take(usize::try_from(missing).unwrap_or(usize::MAX))
    {
        plans[p].value = plans[p].value.saturating_add(1);
    }
}

/// `value × num / den`, rounded up, saturating.
fn scale_ceil(value: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return value;
    }
    u64::try_from((u128::from(value) * u128::from(num)).div_ceil(u128::from(den))).unwrap_or(u64::MAX)
}

/// `add` operations for the annotations (creating `metadata.annotations` when missing), then
/// those of `then`.
fn annotation_patch(pod: &PodFacts, annotations: &BTreeMap<String, String>, then: &AddPatch) -> AddPatch {
    // room for all of it, so the text is written without growing: each operation's text is its
    // key and value and some 50 bytes around them
    let room = annotations
        .iter()
        .map(|(k, v)| k.len() + v.len() + 64)
        .sum::<usize>()
        + then.json_len()
        + 64;
    let mut ops = AddPatch::with_capacity(room);
    if !pod.has_annotations {
        ops.add_empty_object(&["metadata", "annotations"]);
    }
    for (key, value) in annotations {
        ops.add_str(&["metadata", "annotations", key.as_str()], value);
    }
    ops.append(then);
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_pointer_tokens() {
        let mut op = AddPatch::new();
        op.add_str(&["metadata", "annotations", "a~b/c"], "");
        let text = op.to_json();
        assert!(text.contains(r#""/metadata/annotations/a~0b~1c""#), "{text}");
    }

    fn cpu_targets(pairs: &[(&str, u64)]) -> Targets {
        pairs
            .iter()
            .map(|(c, m)| {
                (
                    c.to_string(),
                    Amounts {
                        cpu: Some(*m),
                        memory: None,
                    },
                )
            })
            .collect()
    }

    /// An autoscaler of scope `scope`, cold start `cold`, grouped by `instance-type`, whose status
    /// holds a fleet figure of 900m for `a` and group `big` at 700m for `a` (computed for
    /// `status_label`).
    fn grouped(scope: &str, cold: &str, status_label: &str) -> DaemonSetAutoscaler {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}, "scope": scope,
                     "coldStart": cold, "nodeGroupLabel": "instance-type"},
            "status": {
                "fleet": [{"containerName": "a", "target": {"cpu": "900m"}}],
                "nodeGroupLabel": status_label,
                "groups": [{"value": "big", "nodes": 0,
                            "containers": [{"containerName": "a", "target": {"cpu": "700m"}}]}],
            }
        }))
        .expect("autoscaler")
    }

    /// Which figure container `a` and `b` take (their source and CPU request) for a node with
    /// its own targets `own` and group `group`.
    fn chosen(
        autoscaler: &DaemonSetAutoscaler,
        own: Option<Targets>,
        group: Option<&str>,
    ) -> Vec<(Source, Option<u64>)> {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]}
        }))
        .expect("pod");
        let status = status_figures(autoscaler);
        let figures = status.for_node(own.as_ref(), group);
        let decision = mutate(&pod, autoscaler, figures, &[]);
        let sizing = sizing_on(&pod, autoscaler, figures, &[]);
        decision
            .sources
            .iter()
            .map(|(c, s)| {
                let cpu = sizing.iter().find(|z| &z.name == c).and_then(|z| z.requests.cpu);
                (*s, cpu)
            })
            .collect()
    }

    #[test]
    fn scope_node_group_takes_the_group_figure_then_the_node_own_then_the_cold_start() {
        let own = || Some(cpu_targets(&[("a", 300), ("b", 50)]));
        let a = grouped("NodeGroup", "Fleet", "instance-type");
        // a node of a known group: its group's figure, even with history of its own; `b` has no
        // group figure, so its own
        assert_eq!(
            chosen(&a, own(), Some("big")),
            vec![(Source::Group, Some(700)), (Source::Node, Some(50))]
        );
        // a node of an unknown group, or without the label: its own figures
        assert_eq!(
            chosen(&a, own(), Some("small")),
            vec![(Source::Node, Some(300)), (Source::Node, Some(50))]
        );
        // a new node of a known group
        assert_eq!(
            chosen(&a, None, Some("big")),
            vec![(Source::Group, Some(700)), (Source::ContainerNotMeasured, None)]
        );
        // a new node without a group: the cold-start choice
        assert_eq!(
            chosen(&a, None, None),
            vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
        );
        // groups computed for another label are not read
        let stale = grouped("NodeGroup", "Template", "zone");
        assert_eq!(
            chosen(&stale, None, Some("big")),
            vec![
                (Source::ColdStartTemplate, None),
                (Source::ColdStartTemplate, None)
            ]
        );
    }

    #[test]
    fn cold_start_group_serves_new_nodes_only() {
        let a = grouped("Node", "Group", "instance-type");
        // history of its own wins
        assert_eq!(
            chosen(&a, Some(cpu_targets(&[("a", 300)])), Some("big")),
            vec![(Source::Node, Some(300)), (Source::ContainerNotMeasured, None)]
        );
        // a new node: its group's figure, else the fleet's, else the template
        assert_eq!(
            chosen(&a, None, Some("big")),
            vec![(Source::Group, Some(700)), (Source::NoFleetFigure, None)]
        );
        assert_eq!(
            chosen(&a, None, Some("small")),
            vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
        );
        // without groups in the spec, the group figure is never read
        let mut fleet_only = a.clone();
        fleet_only.spec.cold_start = ColdStart::Fleet;
        assert_eq!(
            chosen(&fleet_only, None, Some("big")),
            vec![(Source::Fleet, Some(900)), (Source::NoFleetFigure, None)]
        );
    }

    /// `sizing_on` gives the figures `mutate_on` writes: a pod sized by the patch has exactly
    /// them (ratio kept, LimitRange max, per-container `Off`, `RequestsOnly` with a limit cap).
    #[test]
    fn a_pod_limit_range_as_tight_as_its_min_holds_exactly() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
        }))
        .expect("pod");
        let autoscaler: DaemonSetAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}}
        }))
        .expect("autoscaler");
        let cpu = |m| Amounts {
            cpu: Some(m),
            memory: None,
        };
        let targets = Targets::from([
            ("a".to_string(), cpu(100)),
            ("b".to_string(), cpu(100)),
            ("c".to_string(), cpu(100)),
        ]);
        for (min, max) in [("1001m", "1001m"), ("100m", "200m")] {
            let limit_ranges: Vec<LimitRange> = vec![
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "lr", "namespace": "ns"},
                    "spec": {"limits": [{"type": "Pod", "min": {"cpu": min}, "max": {"cpu": max}}]}
                }))
                .expect("limit range"),
            ];
            let sizing = sizing_on(
                &pod,
                &autoscaler,
                Figures {
                    node: Some(&targets),
                    ..Figures::default()
                },
                &limit_ranges,
            );
            let sum: u64 = sizing.iter().filter_map(|s| s.requests.cpu).sum();
            // rounding each container up would give 334m × 3 = 1002m, over the max
            let want = if min == "1001m" { 1001 } else { 200 };
            assert_eq!(sum, want, "{min}..{max}: {sizing:?}");
        }
    }

    #[test]
    fn sizing_is_what_the_patch_writes() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                                               "limits": {"cpu": "200m", "memory": "200Mi"}}},
                {"name": "capped", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "150m"}}},
                {"name": "off", "resources": {"requests": {"cpu": "100m"}}}
            ]}
        }))
        .expect("pod");
        let autoscaler: DaemonSetAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"}, "resourcePolicy": {"containerPolicies": [
                {"containerName": "capped", "controlledValues": "RequestsOnly"},
                {"containerName": "off", "mode": "Off"}
            ]}}
        }))
        .expect("autoscaler");
        let limit_ranges: Vec<LimitRange> = vec![
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "lr", "namespace": "ns"},
                "spec": {"limits": [{"type": "Container", "max": {"memory": "500Mi"}}]}
            }))
            .expect("limit range"),
        ];
        let mi = 1u64 << 20;
        let targets = Targets::from([
            (
                "app".to_string(),
                Amounts {
                    cpu: Some(300),
                    memory: Some(300 * mi),
                },
            ),
            (
                "capped".to_string(),
                Amounts {
                    cpu: Some(400),
                    memory: None,
                },
            ),
            (
                "off".to_string(),
                Amounts {
                    cpu: Some(400),
                    memory: None,
                },
            ),
        ]);
        let sizing = sizing_on(
            &pod,
            &autoscaler,
            Figures {
                node: Some(&targets),
                ..Figures::default()
            },
            &limit_ranges,
        );
        let want = vec![
            ContainerSizing {
                name: "app".to_string(),
                requests: Amounts {
                    cpu: Some(300),
                    memory: Some(300 * mi),
                },
                // ratio 2 kept for CPU; memory's 600Mi is over the LimitRange max
                limits: Amounts {
                    cpu: Some(600),
                    memory: Some(500 * mi),
                },
            },
            ContainerSizing {
                name: "capped".to_string(),
                requests: Amounts {
                    cpu: Some(150),
                    memory: None,
                },
                limits: Amounts::default(),
            },
        ];
        assert_eq!(sizing, want);

        let decision = mutate_on(
            &PodFacts::of(&pod),
            &autoscaler,
            Ok("n1"),
            Figures {
                node: Some(&targets),
                ..Figures::default()
            },
            &limit_ranges,
        );
        let mut patched = serde_json::to_value(&pod).expect("json");
        json_patch::patch(&mut patched, &decision.patch.to_json_patch().expect("a patch"))
            .expect("patch applies");
        let patched: Pod = serde_json::from_value(patched).expect("pod");
        for s in &want {
            let spec = patched.spec.as_ref().expect("spec");
            let c = spec
                .containers
                .iter()
                .find(|c| c.name == s.name)
                .expect("container");
            let r = c.resources.as_ref().expect("resources");
            let (requests, limits) = (
                Amounts::from_list(r.requests.as_ref()),
                Amounts::from_list(r.limits.as_ref()),
            );
            for resource in RESOURCES {
                if let Some(v) = s.requests.get(resource) {
                    assert_eq!(requests.get(resource), Some(v), "{} {resource:?} request", s.name);
                }
                if let Some(v) = s.limits.get(resource) {
                    assert_eq!(limits.get(resource), Some(v), "{} {resource:?} limit", s.name);
                }
            }
        }
    }

    fn nodes_with_cpu(cpus: &[u64]) -> Vec<Targets> {
        cpus.iter()
            .map(|&cpu| {
                BTreeMap::from([(
                    "agent".to_string(),
                    Amounts {
                        cpu: Some(cpu),
                        memory: None,
                    },
                )])
            })
            .collect()
    }

    fn fleet_cpu(cpus: &[u64]) -> Option<u64> {
        fleet_from_nodes(nodes_with_cpu(cpus).iter())
            .get("agent")
            .and_then(|a| a.cpu)
    }

    #[test]
    fn fleet_figure_resists_a_minority_of_nodes() {
        let liar = u64::MAX / 3;
        // one node alone is the fleet
        assert_eq!(fleet_cpu(&[300]), Some(300));
        // one liar among five honest nodes (below ten nodes the 90th percentile is the largest
        // figure): at most twice the honest median
        assert_eq!(fleet_cpu(&[100, 120, 150, 200, 250, liar]), Some(300));
        // half the nodes lying: still at most twice the largest honest figure
        assert_eq!(fleet_cpu(&[100, 200, 300, liar, liar, liar]), Some(600));
        // a tenth lying in a fleet of twenty: not above the largest honest figure
        let mut twenty: Vec<u64> = (1..=18).map(|i| 100 + i).collect();
        twenty.extend([liar, liar]);
        assert_eq!(fleet_cpu(&twenty), Some(118));
        // an honest fleet whose busiest tenth runs at under twice its median: the plain p90
        let honest: Vec<u64> = (1..=10).map(|i| 100 + 10 * i).collect();
        assert_eq!(fleet_cpu(&honest), Some(190));
        // a fleet of two: the busier node, but at most twice the other
        assert_eq!(fleet_cpu(&[100, 150]), Some(150));
        assert_eq!(fleet_cpu(&[100, 900]), Some(200));
        // no overflow at the top of the range
        assert_eq!(fleet_cpu(&[u64::MAX, u64::MAX]), Some(u64::MAX));
    }

    #[test]
    fn p90_is_nearest_rank() {
        assert_eq!(p90(&mut []), None);
        assert_eq!(p90(&mut [5]), Some(5));
        assert_eq!(p90(&mut [1, 2]), Some(2));
        let mut ten: Vec<u64> = (1..=10).rev().collect();
        assert_eq!(p90(&mut ten), Some(9));
        let mut hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(p90(&mut hundred), Some(90));
        assert_eq!(percentile(&mut hundred, 50), Some(50));
        assert_eq!(percentile(&mut [3, 1, 2], 50), Some(2));
        assert_eq!(percentile(&mut [1, 2], 50), Some(1));
    }
}
