//! Per-node right-sizing of DaemonSet pods (KEP-4943, VPA `scope: node`).
//!
//! `DaemonSetAutoscaler` says which DaemonSet to right-size and how; its fields are shaped like
//! VPA's so users can carry their YAML over. `NodeRecommendation/<node>` holds what the agent on
//! that node recommends for every autoscaled container running there.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::quantity::ResourceName;
use crate::quantity::{ResourceList, resource_list_schema};

/// Right-size the pods of one DaemonSet, node by node.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodewarden.io",
    version = "v1alpha1",
    kind = "DaemonSetAutoscaler",
    namespaced,
    shortname = "dsa",
    category = "nodewarden",
    status = "DaemonSetAutoscalerStatus",
    derive = "PartialEq",
    doc = "Right-sizes the pods of one DaemonSet per node, from what the agent measures on each node.",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.targetRef.name"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.updatePolicy.updateMode"),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        description = "Nodes whose agent published a recommendation for this autoscaler",
        json_path = ".status.nodesWithRecommendation"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        description = "Running pods (InPlace, Recreate) whose requests and limits are their node's figures",
        json_path = ".status.podsUpToDate"
    ),
    printcolumn(
        name = "CPU P50",
        type_ = "string",
        description = "Per container, the median of the node targets",
        json_path = ".status.fleet[*].median.cpu"
    ),
    printcolumn(
        name = "CPU P90",
        type_ = "string",
        description = "Per container, the fleet figure: the 90th percentile of the node targets, at most twice their median",
        json_path = ".status.fleet[*].target.cpu"
    ),
    printcolumn(
        name = "Memory P50",
        type_ = "string",
        description = "Per container, the median of the node targets",
        json_path = ".status.fleet[*].median.memory"
    ),
    printcolumn(
        name = "Memory P90",
        type_ = "string",
        description = "Per container, the fleet figure: the 90th percentile of the node targets, at most twice their median",
        json_path = ".status.fleet[*].target.memory"
    ),
    printcolumn(
        name = "Provided",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"RecommendationProvided\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Containers",
        type_ = "string",
        priority = 1,
        json_path = ".status.fleet[*].containerName"
    ),
    printcolumn(
        name = "Cold Start",
        type_ = "string",
        priority = 1,
        json_path = ".spec.coldStart"
    ),
    printcolumn(name = "Ceiling", type_ = "string", priority = 1, json_path = ".spec.ceiling"),
    printcolumn(name = "Scope", type_ = "string", priority = 1, json_path = ".spec.scope"),
    printcolumn(
        name = "Groups",
        type_ = "string",
        priority = 1,
        description = "The node groups with figures (values of spec.nodeGroupLabel)",
        json_path = ".status.groups[*].value"
    ),
    printcolumn(
        name = "Unsupported",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"ConfigUnsupported\")].status"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetAutoscalerSpec {
    /// The DaemonSet whose pods are right-sized. It lives in the autoscaler's namespace.
    pub target_ref: TargetRef,
    /// How far a recommendation reaches: `Node` (every node its own figures) or `NodeGroup`
    /// (the nodes that share a value of the label `nodeGroupLabel` share one figure per container).
    #[serde(default)]
    pub scope: Scope,
    /// The node label whose value names a node's group (for example
    /// `node.kubernetes.io/instance-type`, a node pool's label, or `topology.kubernetes.io/zone`).
    /// Required with `scope: NodeGroup` and with `coldStart: Group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub node_group_label: Option<String>,
    /// When recommendations are applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_policy: Option<UpdatePolicy>,
    /// Per-container bounds and modes, as in VPA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_policy: Option<ResourcePolicy>,
    /// What a node without history gets.
    #[serde(default)]
    pub cold_start: ColdStart,
    /// An upper cap on every recommendation besides `maxAllowed`.
    #[serde(default)]
    pub ceiling: Ceiling,
}

/// Reference to the DaemonSet to right-size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// API version of the target; only `apps/v1`.
    #[serde(default = "apps_v1")]
    #[schemars(regex(pattern = r"^apps/v1$"))]
    pub api_version: String,
    /// Kind of the target; only `DaemonSet`.
    pub kind: TargetKind,
    /// Name of the DaemonSet in the autoscaler's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

fn apps_v1() -> String {
    "apps/v1".to_string()
}

/// The only kind an autoscaler can target.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum TargetKind {
    /// An `apps/v1` DaemonSet.
    #[default]
    DaemonSet,
}

/// Scope of a recommendation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum Scope {
    /// One recommendation per node.
    #[default]
    Node,
    /// One recommendation per group of nodes: the nodes that share a value of the label
    /// `nodeGroupLabel`. A node without the label, or of a group with no figure yet, gets its own
    /// figure, else the cold-start choice.
    NodeGroup,
}

impl DaemonSetAutoscalerSpec {
    /// Whether pods read a group figure (`scope: NodeGroup` or `coldStart: Group`).
    pub fn uses_groups(&self) -> bool {
        self.scope == Scope::NodeGroup || self.cold_start == ColdStart::Group
    }

    /// The `updatePolicy`'s mode (`Initial` when none is written).
    pub fn update_mode(&self) -> UpdateMode {
        self.update_policy
            .as_ref()
            .map(|p| p.update_mode)
            .unwrap_or_default()
    }
}

/// When recommendations are applied to pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePolicy {
    /// As in VPA: `Off` only recommends; `Initial` sets resources when a pod is created;
    /// `Recreate` also evicts running pods that are far off (the DaemonSet controller re-creates
    /// them on the same node, with the webhook's figures); `InPlace` has each node's agent resize
    /// its running pods through `pods/resize`, evicting only when the kubelet cannot apply a resize.
    /// VPA's names are accepted so objects carry over: `Auto` is `Recreate` (as in VPA) and
    /// `InPlaceOrRecreate` is `InPlace`.
    #[serde(default)]
    pub update_mode: UpdateMode,
}

/// As in VPA: `Off` only recommends; `Initial` sets resources when a pod is created;
/// `Recreate` also evicts running pods that are far off (the DaemonSet controller re-creates
/// them on the same node, with the webhook's figures); `InPlace` has each node's agent resize
/// its running pods through `pods/resize`, evicting only when the kubelet cannot apply a resize
/// (and acting as `Recreate` on a cluster that does not serve `pods/resize`, which the
/// autoscaler's `InPlaceResize` condition says). VPA's names are accepted so objects carry over: `Auto` is `Recreate` (as in VPA) and
/// `InPlaceOrRecreate` is `InPlace`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum UpdateMode {
    /// Only recommend; pods keep their template's resources.
    Off,
    /// Set resources when a pod is created; running pods are left alone.
    #[default]
    Initial,
    /// Also evict running pods that are far off, so they are re-created with the node's figures.
    Recreate,
    /// Also resize running pods in place; evict only when the kubelet cannot apply a resize.
    InPlace,
    /// VPA's name for `Recreate`.
    Auto,
    /// VPA's name for `InPlace` (which falls back to eviction here too).
    InPlaceOrRecreate,
}

/// What an update mode does to running pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunningPods {
    /// Nothing (`Off`, `Initial`).
    Untouched,
    /// Evicted when far off (`Recreate`, `Auto`).
    Evict,
    /// Resized in place, evicted when a resize cannot be applied (`InPlace`, `InPlaceOrRecreate`).
    Resize,
}

impl UpdateMode {
    /// What the mode does to running pods.
    pub fn running_pods(self) -> RunningPods {
        match self {
            UpdateMode::Off | UpdateMode::Initial => RunningPods::Untouched,
            UpdateMode::Recreate | UpdateMode::Auto => RunningPods::Evict,
            UpdateMode::InPlace | UpdateMode::InPlaceOrRecreate => RunningPods::Resize,
        }
    }

    /// The mode's name as written in the object.
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateMode::Off => "Off",
            UpdateMode::Initial => "Initial",
            UpdateMode::Recreate => "Recreate",
            UpdateMode::InPlace => "InPlace",
            UpdateMode::Auto => "Auto",
            UpdateMode::InPlaceOrRecreate => "InPlaceOrRecreate",
        }
    }
}

/// Per-container policies.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePolicy {
    /// Policies by container name; `*` applies to containers without their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub container_policies: Vec<ContainerPolicy>,
}

/// Policy for one container (or `*` for every container without a policy of its own).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPolicy {
    /// Container name, or `*` for the default policy.
    #[schemars(length(min = 1, max = 63))]
    pub container_name: String,
    /// `Off` leaves the container as its template says.
    #[serde(default)]
    pub mode: ContainerMode,
    /// Lower bound of any recommendation for this container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub min_allowed: Option<ResourceList>,
    /// Upper bound of any recommendation for this container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub max_allowed: Option<ResourceList>,
    /// Which resources are right-sized; both by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controlled_resources: Option<Vec<ResourceName>>,
    /// Whether limits follow requests in proportion.
    #[serde(default)]
    pub controlled_values: ControlledValues,
}

/// Whether a container is right-sized.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum ContainerMode {
    /// Right-size the container.
    #[default]
    Auto,
    /// Leave the container's resources as its template says.
    Off,
}

/// Which of a container's resource values nodewarden sets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum ControlledValues {
    /// Requests follow the recommendation; limits keep their ratio to requests.
    #[default]
    RequestsAndLimits,
    /// Only requests change; a request is never set above the existing limit.
    RequestsOnly,
}

/// What a node with no history gets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum ColdStart {
    /// The pod keeps its template's requests.
    #[default]
    Template,
    /// The fleet figure: the 90th percentile of the other nodes' targets, at most twice their median.
    Fleet,
    /// The figure of the node's group (the nodes that share its value of `nodeGroupLabel`),
    /// computed as the fleet figure is but over the group's nodes; kept in the status after the
    /// group's last node is gone. A node without the label or of a group with no figure gets the
    /// fleet figure.
    Group,
}

/// An upper cap applied after `maxAllowed`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum Ceiling {
    /// No cap besides `maxAllowed`.
    #[default]
    None,
    /// Never above the template's requests, so node autoscalers that size nodes from the template stay right.
    Template,
}

/// Observed state of an autoscaler, kept by the webhook's leader-elected controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetAutoscalerStatus {
    /// The `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes whose agent published a recommendation for this autoscaler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_with_recommendation: Option<i32>,
    /// With `updateMode` InPlace or Recreate: the running pods the agents compare with their
    /// node's figures (summed over the nodes' reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_running: Option<i32>,
    /// Of those, the pods whose requests and limits are already their node's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_up_to_date: Option<i32>,
    /// Per container, the fleet figure: the 90th percentile of the node targets, at most twice their
    /// median.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub fleet: Vec<FleetRecommendation>,
    /// The node label the `groups` are for (the spec's `nodeGroupLabel` when they were computed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_group_label: Option<String>,
    /// With `scope: NodeGroup` or `coldStart: Group`: per value of the node label, the group's
    /// figure per container. A group whose nodes are all gone keeps its figures (`nodes: 0`), so a
    /// new node of a known kind starts from them; the groups with nodes come first, then the
    /// most recently updated, at most 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub groups: Vec<GroupRecommendation>,
    /// Standard Kubernetes conditions of the autoscaler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition of an autoscaler whose DaemonSet a VerticalPodAutoscaler (`autoscaling.k8s.io`)
/// also targets. `True` (reason [`VPA_UPDATES_PODS`]): that VPA's `updateMode` is not `Off`, so
/// it writes the pods' resources itself, and nodewarden yields: the webhook leaves new pods as
/// they are and the agents leave running ones, while the agents go on measuring and publishing
/// (docs/vpa.md). `False`: the VPAs there only recommend (`updateMode: Off`), or none is left.
pub const VPA_CONFLICT: &str = "VPAConflict";
/// Reason of [`VPA_CONFLICT`] `True`.
pub const VPA_UPDATES_PODS: &str = "VPAUpdatesPods";

impl DaemonSetAutoscaler {
    /// When a VerticalPodAutoscaler that updates pods targets this autoscaler's DaemonSet
    /// (condition [`VPA_CONFLICT`] `True`, written by the webhook's status controller): the
    /// condition's message, naming the VPA. nodewarden then leaves the DaemonSet's pods alone.
    pub fn yields_to_vpa(&self) -> Option<&str> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == VPA_CONFLICT && c.status == "True")
            .map(|c| c.message.as_str())
    }
}

/// The fleet figure of one container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetRecommendation {
    /// The container's name.
    pub container_name: String,
    /// The 90th percentile of the node targets, at most twice their median (what `coldStart: Fleet`
    /// gives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub target: Option<ResourceList>,
    /// The median of the node targets: with `target`, how far apart the nodes are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub median: Option<ResourceList>,
}

/// The figures of one group of nodes (the nodes that share a value of the node label).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupRecommendation {
    /// The label's value the group's nodes share.
    #[schemars(length(max = 63))]
    pub value: String,
    /// The group's nodes whose agent published a recommendation for this autoscaler now; 0 when
    /// none is left (the figures stay).
    pub nodes: i32,
    /// When the figures or the node count last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<Time>,
    /// Per container, the group's figure: the 90th percentile of its nodes' targets, at most twice
    /// their median.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub containers: Vec<FleetRecommendation>,
}

/// What the agent on one node recommends. The object's name is the node's name; only that
/// node's agent may write it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodewarden.io",
    version = "v1alpha1",
    kind = "NodeRecommendation",
    shortname = "noderec",
    category = "nodewarden",
    derive = "PartialEq",
    doc = "Resource recommendations of one node, written by the nodewarden agent on that node.",
    printcolumn(
        name = "Containers",
        type_ = "string",
        json_path = ".spec.recommendations[*].containerName"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        description = "Total CPU target of the node's containers",
        json_path = ".spec.summary.cpuTarget"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        description = "Total memory target of the node's containers",
        json_path = ".spec.summary.memoryTarget"
    ),
    printcolumn(
        name = "OOM",
        type_ = "integer",
        description = "OOM kills seen on this node, all containers",
        json_path = ".spec.summary.oomKills"
    ),
    printcolumn(
        name = "Last Sample",
        type_ = "date",
        description = "The newest sample behind the figures",
        json_path = ".spec.summary.lastSampleTime"
    ),
    printcolumn(name = "Updated", type_ = "date", json_path = ".spec.updateTime"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "CPU Each",
        type_ = "string",
        priority = 1,
        description = "Target of each container, in the order of Containers",
        json_path = ".spec.recommendations[*].target.cpu"
    ),
    printcolumn(
        name = "Memory Each",
        type_ = "string",
        priority = 1,
        description = "Target of each container, in the order of Containers",
        json_path = ".spec.recommendations[*].target.memory"
    ),
    printcolumn(
        name = "Autoscalers",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].autoscaler.name"
    ),
    printcolumn(
        name = "Samples",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].sampleCount"
    ),
    printcolumn(
        name = "Lower CPU",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].lowerBound.cpu"
    ),
    printcolumn(
        name = "Upper CPU",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].upperBound.cpu"
    ),
    printcolumn(
        name = "Lower Memory",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].lowerBound.memory"
    ),
    printcolumn(
        name = "Upper Memory",
        type_ = "string",
        priority = 1,
        json_path = ".spec.recommendations[*].upperBound.memory"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecommendationSpec {
    /// When the agent last published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_time: Option<Time>,
    /// One entry per (autoscaler, container) on the node. The bound keeps the API server's
    /// cost estimate of the schema's CEL rules within budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub recommendations: Vec<ContainerRecommendation>,
    /// Totals over `recommendations` (what `kubectl get noderec` shows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<NodeSummary>,
    /// Per autoscaler that acts on running pods (InPlace, Recreate): its running pods on the
    /// node and how many have the node's figures already (the agent's last update round).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub pods: Vec<NodePods>,
}

/// Totals of a node's recommendations.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    /// Sum of the containers' CPU targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_target: Option<String>,
    /// Sum of the containers' memory targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_target: Option<String>,
    /// OOM kills seen on the node, all containers.
    #[serde(default)]
    pub oom_kills: i64,
    /// The newest sample behind the figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample_time: Option<Time>,
}

impl NodeSummary {
    /// The totals of `recommendations` (quantities in the canonical format).
    pub fn of(recommendations: &[ContainerRecommendation]) -> NodeSummary {
        use crate::quantity::{amount, format_amount};
        let total = |r: ResourceName| {
            let values: Vec<u64> = recommendations
                .iter()
                .filter_map(|c| amount(r, c.target.as_ref()?.get(r.as_str())?))
                .collect();
            (!values.is_empty()).then(|| format_amount(r, values.into_iter().fold(0, u64::saturating_add)))
        };
        NodeSummary {
            cpu_target: total(ResourceName::Cpu),
            memory_target: total(ResourceName::Memory),
            oom_kills: recommendations
                .iter()
                .map(|c| c.oom_count.max(0))
                .fold(0, i64::saturating_add),
            last_sample_time: recommendations
                .iter()
                .filter_map(|c| c.last_sample_time.clone())
                .max_by_key(|t| t.0),
        }
    }
}

/// One autoscaler's running pods on a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePods {
    /// The autoscaler whose pods these are.
    pub autoscaler: AutoscalerRef,
    /// Running pods the agent compared with the node's figures.
    #[schemars(range(min = 0))]
    pub running: i32,
    /// Of those, the pods whose requests and limits are the node's figures.
    #[schemars(range(min = 0))]
    pub up_to_date: i32,
}

/// Reference to a `DaemonSetAutoscaler`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerRef {
    /// The autoscaler's namespace.
    pub namespace: String,
    /// The autoscaler's name.
    pub name: String,
}

/// The recommendation for one container of one autoscaled DaemonSet on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecommendation {
    /// The autoscaler the container's DaemonSet belongs to.
    pub autoscaler: AutoscalerRef,
    /// The container's name.
    pub container_name: String,
    /// Recommended requests on this node, after the autoscaler's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub target: Option<ResourceList>,
    /// A running pod whose request is below this is updated at once (VPA's `lowerBound`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub lower_bound: Option<ResourceList>,
    /// A running pod whose request is above this is updated at once (VPA's `upperBound`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub upper_bound: Option<ResourceList>,
    /// The target before the autoscaler's min/max policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "resource_list_schema")]
    pub uncapped_target: Option<ResourceList>,
    /// CPU samples behind this recommendation.
    #[serde(default)]
    pub sample_count: i64,
    /// When the oldest sample behind this recommendation was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sample_time: Option<Time>,
    /// When the newest sample behind this recommendation was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample_time: Option<Time>,
    /// OOM kills seen for this container on this node.
    #[serde(default)]
    pub oom_count: i64,
    /// The figures held below what VPA's formula gives, and why; absent when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped: Option<Capped>,
}

/// What caps a published figure: nothing on the node can use more.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CapReason {
    /// The node's allocatable resources (its Node's `status.allocatable`).
    NodeAllocatable,
    /// The container policy's `maxAllowed`.
    MaxAllowed,
}

impl CapReason {
    /// How a person reads it (`node allocatable`, `maxAllowed`).
    pub fn as_text(self) -> &'static str {
        match self {
            CapReason::NodeAllocatable => "node allocatable",
            CapReason::MaxAllowed => "maxAllowed",
        }
    }
}

/// Per resource, what capped one figure (absent: not capped).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct CappedResources {
    /// What capped the CPU figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CapReason>,
    /// What capped the memory figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<CapReason>,
}

impl CappedResources {
    /// Whether neither resource was capped.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none()
    }
}

/// The figures of a recommendation that are a cap rather than VPA's figure. VPA's bounds widen
/// as `1 + 1/confidence` with a history of minutes (and without end with a single CPU sample);
/// nodewarden publishes the cap instead wherever VPA's figure is above it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Capped {
    /// What capped `target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<CappedResources>,
    /// What capped `lowerBound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_bound: Option<CappedResources>,
    /// What capped `upperBound` (with a single CPU sample VPA's is unbounded: then always the cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_bound: Option<CappedResources>,
    /// The CPU history behind the figures, first to last sample (`2m`, `3d4h`; `1 sample`, or
    /// `no CPU sample` for an OOM kill alone): VPA's bounds are wide when it is short.
    #[schemars(length(max = 32))]
    pub history: String,
}

impl Capped {
    /// One line for a person: `upper cpu, memory: node allocatable (history 2m)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, c) in [
            ("target", &self.target),
            ("lower", &self.lower_bound),
            ("upper", &self.upper_bound),
        ] {
            let Some(c) = c else { continue };
            let mut by: Vec<(CapReason, Vec<&str>)> = Vec::new();
            for (r, reason) in [("cpu", c.cpu), ("memory", c.memory)] {
                let Some(reason) = reason else { continue };
                match by.iter_mut().find(|(x, _)| *x == reason) {
                    Some((_, rs)) => rs.push(r),
                    None => by.push((reason, vec![r])),
                }
            }
            for (reason, rs) in by {
                parts.push(format!("{what} {} at {}", rs.join("+"), reason.as_text()));
            }
        }
        format!("{} (history {})", parts.join(", "), self.history)
    }
}

/// A span of history, compact: the two largest units of days, hours, minutes and seconds
/// (`45s`, `2m10s`, `3d4h`); `0s` for none.
pub fn history_text(ms: i64) -> String {
    let mut secs = (ms.max(0) / 1000) as u64;
    if secs == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut shown = 0;
    for (unit, size) in [("d", 86_400u64), ("h", 3_600), ("m", 60), ("s", 1)] {
        let n = secs / size;
        secs %= size;
        if n > 0 || shown > 0 {
            if n > 0 {
                out.push_str(&format!("{n}{unit}"));
            }
            shown += 1;
        }
        if shown == 2 {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(cpu: &str, memory: Option<&str>, oom: i64, last: Option<&str>) -> ContainerRecommendation {
        serde_json::from_value(serde_json::json!({
            "autoscaler": {"namespace": "ns", "name": "a"},
            "containerName": "c",
            "target": match memory {
                Some(m) => serde_json::json!({"cpu": cpu, "memory": m}),
                None => serde_json::json!({"cpu": cpu}),
            },
            "sampleCount": 1,
            "oomCount": oom,
            "lastSampleTime": last,
        }))
        .expect("recommendation")
    }

    #[test]
    fn summary_totals_the_containers() {
        let summary = NodeSummary::of(&[
            rec("250m", Some("100Mi"), 1, Some("2026-11-24T10:00:00Z")),
            rec("1750m", None, 2, Some("2026-11-24T11:00:00Z")),
            rec("0.5", Some("156Mi"), 0, None),
        ]);
        assert_eq!(summary.cpu_target.as_deref(), Some("2500m"));
        assert_eq!(summary.memory_target.as_deref(), Some("256Mi"));
        assert_eq!(summary.oom_kills, 3);
        assert_eq!(
            summary.last_sample_time.map(|t| t.0.to_string()).as_deref(),
            Some("2026-11-24T11:00:00Z")
        );
        assert_eq!(NodeSummary::of(&[]), NodeSummary::default());
    }

    #[test]
    fn history_is_shown_in_its_two_largest_units() {
        assert_eq!(history_text(0), "0s");
        assert_eq!(history_text(-5), "0s");
        assert_eq!(history_text(45_000), "45s");
        assert_eq!(history_text(130_000), "2m10s");
        assert_eq!(history_text(120_000), "2m");
        assert_eq!(history_text((3 * 86_400 + 4 * 3_600 + 59) * 1000), "3d4h");
        assert_eq!(history_text((86_400 + 30) * 1000), "1d");
    }

    #[test]
    fn capped_figures_read_as_one_line() {
        let c = Capped {
            upper_bound: Some(CappedResources {
                cpu: Some(CapReason::NodeAllocatable),
                memory: Some(CapReason::NodeAllocatable),
            }),
            target: Some(CappedResources {
                cpu: Some(CapReason::MaxAllowed),
                memory: None,
            }),
            lower_bound: None,
            history: "2m".into(),
        };
        assert_eq!(
            c.describe(),
            "target cpu at maxAllowed, upper cpu+memory at node allocatable (history 2m)"
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "target": {"cpu": "MaxAllowed"},
                "upperBound": {"cpu": "NodeAllocatable", "memory": "NodeAllocatable"},
                "history": "2m"
            })
        );
    }
}
