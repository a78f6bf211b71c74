//! Feature lifecycle (KEP-3920).
//!
//! A `Feature` says whether a feature should be on, which fields of which resources it owns,
//! and (in its status) where the cluster is on the way there. `NodeFeatureReport/<node>` holds
//! the feature gates the node components of one node run with.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A feature of the cluster, its desired state and the fields it owns.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodewarden.io",
    version = "v1alpha1",
    kind = "Feature",
    namespaced,
    shortname = "feat",
    category = "nodewarden",
    status = "FeatureStatus",
    derive = "PartialEq",
    doc = "A cluster feature: desired state, owned fields, and the state of its lifecycle.",
    printcolumn(name = "Desired", type_ = "string", json_path = ".spec.desired"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Uses", type_ = "string", json_path = ".status.usesSummary"),
    printcolumn(
        name = "Since",
        type_ = "date",
        description = "When the current or last transition started",
        json_path = ".status.transitionTime"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Tasks",
        type_ = "string",
        priority = 1,
        json_path = ".status.tasks[*].name"
    ),
    printcolumn(
        name = "Task States",
        type_ = "string",
        priority = 1,
        json_path = ".status.tasks[*].state"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FeatureSpec {
    /// Whether the feature should be on.
    pub desired: DesiredState,
    /// The feature gate's name as components report it; the object's name when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub gate: Option<String>,
    /// Release stage of the feature gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// Whether the feature is on by default in the components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
    /// Components that use the feature (kubelet, kube-proxy, ...). Their reports decide when a
    /// transition is complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<String>,
    /// Fields the feature owns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<OwnedField>,
    /// Resources whose objects must be gone before the feature counts as off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_for_absence: Vec<ResourceRef>,
}

/// Whether a feature should be on or off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DesiredState {
    /// The feature should be on.
    On,
    /// The feature should be off.
    Off,
}

/// Release stage of a feature gate.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Stage {
    /// Alpha: off by default, may change or go away.
    Alpha,
    /// Beta: well tested, may still change.
    Beta,
    /// Generally available: stable.
    GA,
    /// Deprecated: to be removed.
    Deprecated,
}

/// A resource, by group, version and plural name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version, e.g. `v1`.
    #[schemars(length(min = 1))]
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    #[schemars(length(min = 1))]
    pub resource: String,
}

/// A field owned by a feature.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnedField {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version, e.g. `v1`.
    #[schemars(length(min = 1))]
    pub version: String,
    /// Plural resource name, e.g. `pods`.
    #[schemars(length(min = 1))]
    pub resource: String,
    /// Dotted field path; `[*]` walks every element of a list, e.g.
    /// `spec.initContainers[*].restartPolicy`.
    #[schemars(length(min = 1, max = 1024))]
    pub path: String,
    /// What happens to writes that set the field while the feature is off.
    #[serde(default)]
    pub on_disable: OnDisable,
}

/// What the webhook does with writes that set an owned field while its feature is off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum OnDisable {
    /// Reject writes that set the field.
    #[default]
    Deny,
    /// Admit them with a warning.
    Warn,
    /// Reject them, and remove the field from stored objects while turning off.
    Clear,
}

/// Where a feature's lifecycle stands.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct FeatureStatus {
    /// Where the lifecycle stands; unset until the controller first acts on the feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<FeatureState>,
    /// The `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the current or last transition started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition_time: Option<Time>,
    /// The tasks of the current transition, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Task>,
    /// Per component, how many nodes report the feature enabled or disabled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uses: Vec<ComponentUses>,
    /// The uses in one line, for `kubectl get features`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses_summary: Option<String>,
    /// Standard Kubernetes conditions of the feature.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The state of a feature's lifecycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FeatureState {
    /// On, and every reporting component agrees.
    On,
    /// Turning off: tasks are running or components still report the feature enabled.
    TurningOff,
    /// Off, and every reporting component agrees.
    Off,
    /// Turning on: tasks are running or components still report the feature disabled.
    TurningOn,
}

impl FeatureState {
    /// The state's name, as `status.state` holds it: `On`, `TurningOff`, `Off`, `TurningOn`.
    pub fn as_str(self) -> &'static str {
        match self {
            FeatureState::On => "On",
            FeatureState::TurningOff => "TurningOff",
            FeatureState::Off => "Off",
            FeatureState::TurningOn => "TurningOn",
        }
    }
}

/// One step of a transition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// The task's name, unique within the transition.
    pub name: String,
    /// Where the task stands.
    pub state: TaskState,
    /// Human-readable detail, e.g. why the task failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Resume point of a resumable task (e.g. a list continue token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// The state of one task of a transition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TaskState {
    /// Not started yet.
    Pending,
    /// Started, not finished.
    Running,
    /// Finished successfully.
    Done,
    /// Failed; `message` says why.
    Failed,
}

/// Reported uses of a feature by one component.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentUses {
    /// The component's name, e.g. `kubelet`.
    pub component: String,
    /// Nodes whose current report has the feature gate enabled.
    pub enabled: i32,
    /// Nodes whose current report has the feature gate disabled or lacks it.
    pub disabled: i32,
    /// Reports older than the current transition.
    pub stale: i32,
}

/// The feature gates the node components of one node run with. The object's name is the
/// node's name; only that node's agent may write it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodewarden.io",
    version = "v1alpha1",
    kind = "NodeFeatureReport",
    shortname = "nfr",
    category = "nodewarden",
    derive = "PartialEq",
    doc = "Feature gates of the node components of one node, written by the nodewarden agent on that node.",
    printcolumn(name = "Components", type_ = "string", json_path = ".spec.components[*].name"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Observed",
        type_ = "string",
        priority = 1,
        description = "When each component was last read, in the order of Components",
        json_path = ".spec.components[*].observedTime"
    ),
    printcolumn(
        name = "Errors",
        type_ = "string",
        priority = 1,
        description = "Why a component could not be read",
        json_path = ".spec.components[*].error"
    ),
    printcolumn(
        name = "Error Reasons",
        type_ = "string",
        priority = 1,
        description = "What kind of failure each error is (CertificateNotVerified, Forbidden, Other)",
        json_path = ".spec.components[*].errorReason"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeFeatureReportSpec {
    /// One entry per node component the agent read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentReport>,
}

/// The gates of one component.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentReport {
    /// `kubelet`, `kube-proxy` or `nodewarden-agent`.
    pub name: String,
    /// When the agent last read the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<Time>,
    /// Why the component could not be read, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure `error` is, when the agent can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<ReadFailure>,
    /// The component's feature gates, as it reports them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateState>,
}

/// What kind of failure kept the agent from reading a component.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReadFailure {
    /// The component's serving certificate could not be verified with the CA the agent was given
    /// (a self-signed kubelet certificate, as kind and kubeadm make them by default).
    CertificateNotVerified,
    /// The component refused the agent's credentials (HTTP 401 or 403, e.g. no `nodes/metrics`).
    Forbidden,
    /// Anything else: not reachable, an unreadable answer. Newer reasons read as this too.
    #[serde(other)]
    Other,
}

impl ReadFailure {
    /// The reason's name, as the report holds it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadFailure::CertificateNotVerified => "CertificateNotVerified",
            ReadFailure::Forbidden => "Forbidden",
            ReadFailure::Other => "Other",
        }
    }
}

/// One feature gate as a component reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateState {
    /// The feature gate's name.
    pub name: String,
    /// Whether the gate is enabled in the component.
    pub enabled: bool,
    /// `ALPHA`, `BETA`, `DEPRECATED`, `GA` or empty.
    #[serde(default)]
    pub stage: String,
}
