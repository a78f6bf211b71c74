//! The controller that keeps `DaemonSetAutoscaler.status`: how many nodes have a
//! recommendation, how many running pods have their node's figures (summed from the agents'
//! reports, modes InPlace and Recreate), the fleet figure per container (the 90th percentile of the node targets), the
//! figures of the node groups (`scope: NodeGroup`, `coldStart: Group`; kept after a group's last
//! node is gone, see [`desired_groups`]), and the conditions `RecommendationProvided` and
//! `ConfigUnsupported`.
//!
//! It runs in the leader only, as a kube-runtime `Controller` on the autoscalers: an autoscaler
//! is reconciled when it changes and again every `interval` (which picks up new node
//! recommendations and pod counts from the same in-memory index the webhook reads); its status
//! is computed and written (status subresource, merge patch) when it changed. A failed
//! reconciliation is retried with the autoscaler's own backoff. A condition keeps its
//! `lastTransitionTime` while its status stays.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::domain::sizing::{Amounts, Targets, fleet_from_nodes, fleet_percentile, format_amount};
use nodewarden_api::rightsizing::{
    DaemonSetAutoscaler, DaemonSetAutoscalerStatus, FleetRecommendation, GroupRecommendation, ResourceName,
    RunningPods, VPA_CONFLICT, VPA_UPDATES_PODS,
};
use nodewarden_runtime::discovery::{ResizeSupport, ResizeSupportCache};
use tokio_util::sync::CancellationToken;

use super::RightsizingCache;
use crate::controllers::{
    self, LeaderTask, ReconcileError, ReconcileObserver, Reconciler, Reconciling, leader_task,
};
use crate::events;

/// Condition: at least one node has published a recommendation for this autoscaler.
pub const RECOMMENDATION_PROVIDED: &str = "RecommendationProvided";
/// Condition: the autoscaler cannot be acted on as written (e.g. its DaemonSet does not exist).
pub const CONFIG_UNSUPPORTED: &str = "ConfigUnsupported";
/// Condition of an autoscaler whose `updateMode` resizes running pods (`InPlace`,
/// `InPlaceOrRecreate`): whether the cluster can resize them in place (True), or its pods are
/// recreated instead (False, naming the Kubernetes version and the feature gate).
pub const IN_PLACE_RESIZE: &str = "InPlaceResize";
/// Field manager of the status writes.
pub const FIELD_MANAGER: &str = "nodewarden-rightsizing-status";

/// The most node groups an autoscaler's status keeps (the schema's limit too): with 64
/// containers of about 150 bytes each, 100 groups stay far below etcd's 1.5 MB per object.
pub const MAX_GROUPS: usize = 100;

/// Per container, the robust 90th percentile of `node_targets` (at most twice their median) and
/// their median: the fleet figure, or a group's over the group's nodes.
fn figures<T: Borrow<Targets>>(node_targets: &[T]) -> Vec<FleetRecommendation> {
    let list = |a: &Amounts| {
        let mut list = BTreeMap::new();
        for r in [ResourceName::Cpu, ResourceName::Memory] {
            if let Some(v) = a.get(r) {
                list.insert(r.as_str().to_string(), Quantity(format_amount(r, v)));
            }
        }
        list
    };
    let medians = fleet_percentile(node_targets.iter().map(Borrow::borrow), 50);
    fleet_from_nodes(node_targets.iter().map(Borrow::borrow))
        .into_iter()
        .map(|(container, a)| FleetRecommendation {
            median: medians.get(&container).map(list),
            target: Some(list(&a)),
            container_name: container,
        })
        .collect()
}

/// The node groups the status should hold, and the label they are for (`None`, and no groups,
/// when the spec uses none).
///
/// * `live`: per value of the label, the targets of the nodes of that value that have a
///   recommendation now. Each becomes a group with their figure ([`fleet_from_nodes`] over the
///   group, as the fleet figure is over all nodes).
/// * A group of the old status with no node now keeps its figures, with `nodes: 0`: a node of a
///   known kind that joins later starts from them, whatever has come and gone in between.
/// * At most [`MAX_GROUPS`]: the groups with nodes first (most nodes first), then the most
///   recently updated; listed by value.
/// * `updateTime` changes only with the figures or the node count, so an unchanged group does
///   not rewrite the status.
/// * When the label changes, the old groups are dropped: they group the nodes another way.
pub fn desired_groups(
    autoscaler: &DaemonSetAutoscaler,
    live: &BTreeMap<String, Vec<Targets>>,
    now: &Time,
) -> (Option<String>, Vec<GroupRecommendation>) {
    groups_of(autoscaler, live, now)
}

/// [`desired_groups`] over targets owned or borrowed (the index's pass borrows each node's
/// targets for its group instead of copying them).
fn groups_of<G: Borrow<Targets>>(
    autoscaler: &DaemonSetAutoscaler,
    live: &BTreeMap<String, Vec<G>>,
    now: &Time,
) -> (Option<String>, Vec<GroupRecommendation>) {
    let spec = &autoscaler.spec;
    let Some(label) = spec.node_group_label.clone().filter(|_| spec.uses_groups()) else {
        return (None, Vec::new());
    };
    let old: &[GroupRecommendation] = autoscaler
        .status
        .as_ref()
        .filter(|s| s.node_group_label.as_deref() == Some(label.as_str()))
        .map(|s| s.groups.as_slice())
        .unwrap_or_default();
    let mut groups: Vec<GroupRecommendation> = Vec::with_capacity(live.len());
    for (value, targets) in live {
        let containers = figures(targets);
        let nodes = i32::try_from(targets.len()).unwrap_or(i32::MAX);
        let update_time = match old.iter().find(|g| &g.value == value) {
            Some(g) if g.nodes == nodes && g.containers == containers => g.update_time.clone(),
            _ => Some(now.clone()),
        };
        groups.push(GroupRecommendation {
            value: value.clone(),
            nodes,
            update_time,
            containers,
        });
    }
    for g in old.iter().filter(|g| !live.contains_key(&g.value)) {
        let mut kept = g.clone();
        if kept.nodes != 0 {
            kept.nodes = 0;
            kept.update_time = Some(now.clone());
        }
        groups.push(kept);
    }
    if groups.len() > MAX_GROUPS {
        groups.sort_by(|a, b| {
            b.nodes
                .cmp(&a.nodes)
                .then_with(|| b.update_time.cmp(&a.update_time))
                .then_with(|| a.value.cmp(&b.value))
        });
        groups.truncate(MAX_GROUPS);
    }
    groups.sort_by(|a, b| a.value.cmp(&b.value));
    (Some(label), groups)
}

/// What the status should say, apart from transition times. `groups`: per value of the node
/// label, the targets of its nodes (see [`desired_groups`]; empty when the spec uses no groups).
pub fn desired_status(
    autoscaler: &DaemonSetAutoscaler,
    node_targets: &[Targets],
    groups: &BTreeMap<String, Vec<Targets>>,
    pods: Option<(i32, i32)>,
    target_exists: bool,
    now: &Time,
) -> DaemonSetAutoscalerStatus {
    status_of(autoscaler, node_targets, groups, pods, target_exists, now)
}

/// [`desired_status`] over targets owned or borrowed.
fn status_of<A: Borrow<Targets>, G: Borrow<Targets>>(
    autoscaler: &DaemonSetAutoscaler,
    node_targets: &[A],
    groups: &BTreeMap<String, Vec<G>>,
    pods: Option<(i32, i32)>,
    target_exists: bool,
    now: &Time,
) -> DaemonSetAutoscalerStatus {
    let fleet = figures(node_targets);
    let (node_group_label, groups) = groups_of(autoscaler, groups, now);
    let count = i32::try_from(node_targets.len()).unwrap_or(i32::MAX);
    let generation = autoscaler.metadata.generation;
    let old = autoscaler
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let provided = if count > 0 {
        condition(
            old,
            RECOMMENDATION_PROVIDED,
            "True",
            "NodesReported",
            format!("{count} node(s) have published a recommendation"),
            generation,
            now,
        )
    } else {
        condition(
            old,
            RECOMMENDATION_PROVIDED,
            "False",
            "NoNodeRecommendation",
            "no node has published a recommendation for this autoscaler yet; pods get the cold-start choice"
                .to_string(),
            generation,
            now,
        )
    };
    let target = &autoscaler.spec.target_ref.name;
    let problems = super::rules::validate_autoscaler(autoscaler);
    let unsupported = if !problems.is_empty() {
        condition(
            old,
            CONFIG_UNSUPPORTED,
            "True",
            "InvalidPolicy",
            problems.join("; "),
            generation,
            now,
        )
    } else if target_exists {
        condition(
            old,
            CONFIG_UNSUPPORTED,
            "False",
            "TargetFound",
            format!("DaemonSet {target} exists"),
            generation,
            now,
        )
    } else {
        condition(
            old,
            CONFIG_UNSUPPORTED,
            "True",
            "TargetNotFound",
            format!(
                "DaemonSet {target} does not exist in namespace {}",
                autoscaler.namespace().unwrap_or_default()
            ),
            generation,
            now,
        )
    };
    DaemonSetAutoscalerStatus {
        observed_generation: generation,
        nodes_with_recommendation: Some(count),
        pods_running: pods.map(|p| p.0),
        pods_up_to_date: pods.map(|p| p.1),
        fleet,
        node_group_label,
        groups,
        conditions: vec![provided, unsupported],
    }
}

/// The [`IN_PLACE_RESIZE`] condition: only for an autoscaler whose mode resizes running pods, and
/// only once the cluster's answer is known.
pub fn resize_condition(
    autoscaler: &DaemonSetAutoscaler,
    support: Option<&ResizeSupport>,
    now: &Time,
) -> Option<Condition> {
    let mode = autoscaler.spec.update_mode();
    if mode.running_pods() != RunningPods::Resize {
        return None;
    }
    let support = support?;
    let old = autoscaler
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let generation = autoscaler.metadata.generation;
    Some(if support.served() {
        condition(
            old,
            IN_PLACE_RESIZE,
            "True",
            "ResizeServed",
            format!("{}: running pods are resized in place", support.explain()),
            generation,
            now,
        )
    } else {
        condition(
            old,
            IN_PLACE_RESIZE,
            "False",
            "ResizeNotServed",
            format!(
                "{}; updateMode {} acts as Recreate here: the agents evict running pods that are \
                 off their node's figures, within the DaemonSet's disruption budget, and the \
                 DaemonSet re-creates them with those figures",
                support.explain(),
                mode.as_str()
            ),
            generation,
            now,
        )
    })
}

/// [`desired_status`] from what the index holds: every node's targets for the autoscaler, grouped
/// by their Node's value of the spec's `nodeGroupLabel` when it uses groups, and the pod counts.
/// One pass over the index: no API call.
pub fn desired_from_index(
    index: &RightsizingCache,
    autoscaler: &DaemonSetAutoscaler,
    target_exists: bool,
    now: &Time,
) -> DaemonSetAutoscalerStatus {
    let namespace = autoscaler.namespace().unwrap_or_default();
    let name = autoscaler.name_any();
    let label = autoscaler
        .spec
        .node_group_label
        .as_deref()
        .filter(|_| autoscaler.spec.uses_groups());
    let all = index.all_node_targets(&namespace, &name);
    // the groups borrow their nodes' targets instead of copying them
    let mut targets: Vec<&Targets> = Vec::with_capacity(all.len());
    let mut groups: BTreeMap<String, Vec<&Targets>> = BTreeMap::new();
    for (node, t) in &all {
        if let Some(value) = label.and_then(|l| index.node_label(node, l)) {
            groups.entry(value.to_string()).or_default().push(t);
        }
        targets.push(t);
    }
    let pods = index.pods_of(&namespace, &name);
    status_of(autoscaler, &targets, &groups, pods, target_exists, now)
}

/// The status as a merge patch: a field the desired status leaves out is written as null, or
/// the old value would stay (an empty fleet, groups no longer used, pod counts no longer
/// reported).
fn merge_patch_status(desired: &DaemonSetAutoscalerStatus) -> serde_json::Value {
    const OPTIONAL: [&str; 6] = [
        "nodesWithRecommendation",
        "podsRunning",
        "podsUpToDate",
        "fleet",
        "nodeGroupLabel",
        "groups",
    ];
    let mut status = serde_json::to_value(desired).unwrap_or_default();
    if let Some(map) = status.as_object_mut() {
        for field in OPTIONAL {
            map.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    status
}

fn condition(
    old: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The conditions of `new` whose status or reason differs from the condition of the same type
/// in `old` (or that `old` does not have): each becomes an Event on the autoscaler.
pub fn changed_conditions<'a>(old: &[Condition], new: &'a [Condition]) -> Vec<&'a Condition> {
    new.iter()
        .filter(|c| {
            !old.iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        })
        .collect()
}

/// A VerticalPodAutoscaler that targets an autoscaler's DaemonSet: its name and `updateMode`
/// (VPA's default, `Auto`, when it sets none).
#[derive(Clone, Debug, PartialEq)]
pub struct Vpa {
    /// The VPA's name (in the autoscaler's namespace).
    pub name: String,
    /// Its `spec.updatePolicy.updateMode`.
    pub update_mode: String,
}

/// The VPA API the status controller reads (`autoscaling.k8s.io/v1`).
fn vpa_resource() -> ApiResource {
    ApiResource {
        group: "autoscaling.k8s.io".to_string(),
        version: "v1".to_string(),
        api_version: "autoscaling.k8s.io/v1".to_string(),
        kind: "VerticalPodAutoscaler".to_string(),
        plural: "verticalpodautoscalers".to_string(),
    }
}

/// The VerticalPodAutoscalers of `vpas` (objects of the VPA API) whose `targetRef` is DaemonSet
/// `daemonset`, by name.
pub fn vpas_targeting(vpas: &[DynamicObject], daemonset: &str) -> Vec<Vpa> {
    let mut found: Vec<Vpa> = vpas
        .iter()
        .filter(|v| {
            let target = &v.data["spec"]["targetRef"];
            target["kind"] == "DaemonSet" && target["name"] == daemonset
        })
        .map(|v| Vpa {
            name: v.name_any(),
            update_mode: v.data["spec"]["updatePolicy"]["updateMode"]
                .as_str()
                .unwrap_or("Auto")
                .to_string(),
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// The [`VPA_CONFLICT`] condition for the VPAs that target the autoscaler's DaemonSet (`None`:
/// the API server serves no VPA API). `True` while one of them updates pods (any `updateMode`
/// but `Off`, `Initial` included: it writes new pods' resources); `False` once they only
/// recommend or are gone; absent when there never was one.
pub fn vpa_condition(
    autoscaler: &DaemonSetAutoscaler,
    vpas: Option<&[Vpa]>,
    now: &Time,
) -> Option<Condition> {
    let old = autoscaler
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let had = old.iter().any(|c| c.type_ == VPA_CONFLICT);
    let generation = autoscaler.metadata.generation;
    let target = &autoscaler.spec.target_ref.name;
    let vpas = vpas.unwrap_or_default();
    let updating: Vec<String> = vpas
        .iter()
        .filter(|v| v.update_mode != "Off")
        .map(|v| format!("{} (updateMode {})", v.name, v.update_mode))
        .collect();
    if !updating.is_empty() {
        return Some(condition(
            old,
            VPA_CONFLICT,
            "True",
            VPA_UPDATES_PODS,
            format!(
                "VerticalPodAutoscaler {} sizes DaemonSet {target} too: nodewarden leaves its pods to it and \
                 only publishes its figures; set the VPA's updateMode to Off, or delete it, to hand the pods \
                 to nodewarden (docs/vpa.md)",
                updating.join(", ")
            ),
            generation,
            now,
        ));
    }
    if !vpas.is_empty() {
        let names: Vec<&str> = vpas.iter().map(|v| v.name.as_str()).collect();
        return Some(condition(
            old,
            VPA_CONFLICT,
            "False",
            "VPARecommendsOnly",
            format!(
                "VerticalPodAutoscaler {} has updateMode Off: it only recommends, nodewarden sizes the pods",
                names.join(", ")
            ),
            generation,
            now,
        ));
    }
    had.then(|| {
        condition(
            old,
            VPA_CONFLICT,
            "False",
            "NoVPA",
            format!("no VerticalPodAutoscaler targets DaemonSet {target}"),
            generation,
            now,
        )
    })
}

/// Name of the status controller (the `controller` label of the reconcile metrics).
pub const CONTROLLER: &str = "autoscaler-status";
/// Reconciliations of different autoscalers run at once at most.
const CONCURRENCY: u16 = 4;

/// Held while an autoscaler's status is computed from the index: one pass at a time (see
/// `reconcile_status`).
static PASS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The status controller as a leader task, reconciling each autoscaler on its changes and every
/// `interval`.
pub fn task(
    index: Arc<RightsizingCache>,
    interval: Duration,
    reconciles: Option<Arc<dyn ReconcileObserver>>,
) -> LeaderTask {
    leader_task(move |client, stop| run(client, index.clone(), interval, reconciles.clone(), stop))
}

/// Why an autoscaler's status could not be brought up to date; it is retried with the
/// autoscaler's own backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The status could not be computed (its task on the blocking pool failed).
    #[error("computing the status: {0}")]
    Compute(String),
    /// Whether the target DaemonSet exists could not be read.
    #[error("reading DaemonSet {namespace}/{name}: {source}")]
    ReadTarget {
        /// The DaemonSet's namespace.
        namespace: String,
        /// The DaemonSet's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The VerticalPodAutoscalers of the namespace could not be listed.
    #[error("listing the VerticalPodAutoscalers of namespace {namespace}: {source}")]
    ListVpas {
        /// The autoscaler's namespace.
        namespace: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The status could not be written.
    #[error("writing the status of DaemonSetAutoscaler {namespace}/{name}: {source}")]
    WriteStatus {
        /// The autoscaler's namespace.
        namespace: String,
        /// The autoscaler's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Compute(_) => "compute",
            Error::ReadTarget { .. } => "read-target",
            Error::ListVpas { .. } => "list-vpas",
            Error::WriteStatus { .. } => "write-status",
        }
    }
}

struct Context {
    client: Client,
    /// Whether the API server serves `pods/resize` (asked for autoscalers that resize).
    resize: tokio::sync::Mutex<ResizeSupportCache>,
    index: Arc<RightsizingCache>,
    interval: Duration,
    recorder: Recorder,
    reconciling: Reconciling,
}

/// Reconciles the autoscalers' statuses until `stop`.
pub async fn run(
    client: Client,
    index: Arc<RightsizingCache>,
    interval: Duration,
    reconciles: Option<Arc<dyn ReconcileObserver>>,
    stop: CancellationToken,
) {
    let synced = index.clone();
    controllers::start(
        client,
        stop,
        async move { synced.wait_synced().await },
        CONCURRENCY,
        |controller| controller,
        |client, _| Context {
            recorder: events::recorder(&client),
            resize: tokio::sync::Mutex::new(ResizeSupportCache::default()),
            client,
            index,
            interval,
            reconciling: Reconciling::new(CONTROLLER, reconciles),
        },
    )
    .await;
}

impl Reconciler<DaemonSetAutoscaler> for Context {
    type Error = Error;

    fn reconciling(&self) -> &Reconciling {
        &self.reconciling
    }

    async fn reconcile(
        self: Arc<Self>,
        _key: String,
        autoscaler: Arc<DaemonSetAutoscaler>,
    ) -> Result<Action, Error> {
        let resizes = autoscaler.spec.update_mode().running_pods() == RunningPods::Resize;
        let support = if resizes {
            self.resize.lock().await.get(&self.client).await.support
        } else {
            None
        };
        reconcile_status(
            &self.client,
            &self.recorder,
            &self.index,
            autoscaler,
            support.as_ref(),
        )
        .await?;
        Ok(Action::requeue(self.interval))
    }
}

async fn reconcile_status(
    client: &Client,
    recorder: &Recorder,
    index: &Arc<RightsizingCache>,
    autoscaler: Arc<DaemonSetAutoscaler>,
    resize: Option<&ResizeSupport>,
) -> Result<(), Error> {
    let namespace = autoscaler.namespace().unwrap_or_default();
    let name = autoscaler.name_any();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
    let exists = daemonsets
        .get_metadata_opt(&autoscaler.spec.target_ref.name)
        .await
        .map_err(|source| Error::ReadTarget {
            namespace: namespace.clone(),
            name: autoscaler.spec.target_ref.name.clone(),
            source,
        })?
        .is_some();
    let vpas = vpas_in(client, &namespace).await?;
    let vpas = vpas.map(|all| vpas_targeting(&all, &autoscaler.spec.target_ref.name));
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // a pass over every node's targets takes milliseconds at thousands of nodes: off the thread
    // that answers admission reviews. One pass at a time: each copies every node's targets for
    // its autoscaler, and passes in parallel would run on blocking threads with a malloc arena
    // each, whose free space stays resident. The heap the pass freed goes back to the kernel
    // after it.
    let desired = {
        let _one_pass = PASS.lock().await;
        let (index, autoscaler, now) = (index.clone(), autoscaler.clone(), now.clone());
        tokio::task::spawn_blocking(move || {
            let desired = desired_from_index(&index, &autoscaler, exists, &now);
            nodewarden_sys::release_free_heap();
            desired
        })
        .await
        .map_err(|err| Error::Compute(err.to_string()))?
    };
    let mut desired = desired;
    desired
        .conditions
        .extend(resize_condition(&autoscaler, resize, &now));
    desired
        .conditions
        .extend(vpa_condition(&autoscaler, vpas.as_deref(), &now));
    let autoscaler = autoscaler.as_ref();
    if autoscaler.status.as_ref() == Some(&desired) {
        return Ok(());
    }
    let api: Api<DaemonSetAutoscaler> = Api::namespaced(client.clone(), &namespace);
    let status = merge_patch_status(&desired);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::WriteStatus {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    let old = autoscaler
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    for c in changed_conditions(old, &desired.conditions) {
        let warning = (c.type_ == CONFIG_UNSUPPORTED && c.status == "True")
            || (c.type_ == IN_PLACE_RESIZE && c.status == "False")
            || (c.type_ == VPA_CONFLICT && c.status == "True");
        let note = format!("{} is {}: {}", c.type_, c.status, c.message);
        events::publish(
            recorder,
            &autoscaler.object_ref(&()),
            warning,
            &c.type_,
            &c.reason,
            note,
        )
        .await;
    }
    Ok(())
}

/// Every VerticalPodAutoscaler of `namespace`; `None` when the API server serves no VPA API
/// (404) or the webhook may not read it (403: its ClusterRole lacks the rule; said in the log).
async fn vpas_in(client: &Client, namespace: &str) -> Result<Option<Vec<DynamicObject>>, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &vpa_resource());
    match api.list(&Default::default()).await {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(namespace, error = %e.message, "may not list VerticalPodAutoscalers: a VPA on the same DaemonSet is not noticed");
            Ok(None)
        }
        Err(source) => Err(Error::ListVpas {
            namespace: namespace.to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of error has its label, and a failed reconciliation is counted under it.
    #[test]
    fn each_error_kind_is_counted_under_its_label() {
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let reconciling = Reconciling::new(CONTROLLER, Some(metrics.clone()));
        let kinds = [
            (Error::Compute("the pass panicked".to_string()), "compute"),
            (
                Error::ReadTarget {
                    namespace: "obs".to_string(),
                    name: "logs".to_string(),
                    source: kube::Error::TlsRequired,
                },
                "read-target",
            ),
            (
                Error::ListVpas {
                    namespace: "obs".to_string(),
                    source: kube::Error::TlsRequired,
                },
                "list-vpas",
            ),
            (
                Error::WriteStatus {
                    namespace: "obs".to_string(),
                    name: "logs".to_string(),
                    source: kube::Error::TlsRequired,
                },
                "write-status",
            ),
        ];
        for (error, label) in &kinds {
            assert_eq!(error.metric_label(), *label, "{error}");
            reconciling.retry("obs/logs", error);
            let text = metrics.encode();
            let series = format!(
                "nodewarden_controller_reconcile_errors_total{{controller=\"autoscaler-status\",error=\"{label}\"}} 1"
            );
            assert!(text.contains(&series), "{series} not in\n{text}");
        }
    }

    fn c(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn vpa(name: &str, kind: &str, target: &str, mode: Option<&str>) -> DynamicObject {
        let mut spec =
            serde_json::json!({"targetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target}});
        if let Some(mode) = mode {
            spec["updatePolicy"] = serde_json::json!({"updateMode": mode});
        }
        DynamicObject::new(name, &vpa_resource())
            .within("obs")
            .data(serde_json::json!({"spec": spec}))
    }

    fn autoscaler_for_logs(conditions: Vec<Condition>) -> DaemonSetAutoscaler {
        let mut a: DaemonSetAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "logs", "namespace": "obs", "generation": 3},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "logs"}},
        }))
        .unwrap();
        a.status = Some(DaemonSetAutoscalerStatus {
            conditions,
            ..Default::default()
        });
        a
    }

    #[test]
    fn only_vpas_on_the_same_daemonset_count_and_a_missing_mode_is_vpas_default() {
        let all = [
            vpa("b-vpa", "DaemonSet", "logs", None),
            vpa("a-vpa", "DaemonSet", "logs", Some("Off")),
            vpa("deploy", "Deployment", "logs", Some("Auto")),
            vpa("other", "DaemonSet", "metrics", Some("Recreate")),
        ];
        let found = vpas_targeting(&all, "logs");
        let said: Vec<(&str, &str)> = found
            .iter()
            .map(|v| (v.name.as_str(), v.update_mode.as_str()))
            .collect();
        assert_eq!(said, [("a-vpa", "Off"), ("b-vpa", "Auto")]);
    }

    #[test]
    fn a_vpa_that_updates_pods_makes_nodewarden_yield_until_it_only_recommends() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let fresh = autoscaler_for_logs(Vec::new());
        // no VPA API, or none on this DaemonSet: no condition at all
        assert_eq!(vpa_condition(&fresh, None, &now), None);
        assert_eq!(vpa_condition(&fresh, Some(&[]), &now), None);
        assert!(fresh.yields_to_vpa().is_none());

        for mode in ["Auto", "Recreate", "Initial", "InPlaceOrRecreate"] {
            let vpas = [Vpa {
                name: "logs-vpa".to_string(),
                update_mode: mode.to_string(),
            }];
            let c = vpa_condition(&fresh, Some(&vpas), &now).expect("a condition");
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("True", VPA_UPDATES_PODS),
                "{mode}"
            );
            assert!(
                c.message.contains(&format!("logs-vpa (updateMode {mode})")),
                "{}",
                c.message
            );
            assert!(c.message.contains("updateMode to Off"), "{}", c.message);
            let yielding = autoscaler_for_logs(vec![c.clone()]);
            assert_eq!(yielding.yields_to_vpa(), Some(c.message.as_str()));
        }

        let off = [Vpa {
            name: "logs-vpa".to_string(),
            update_mode: "Off".to_string(),
        }];
        let c = vpa_condition(&fresh, Some(&off), &now).expect("a condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "VPARecommendsOnly")
        );
        assert!(autoscaler_for_logs(vec![c.clone()]).yields_to_vpa().is_none());

        // once there was one, its end is said too (and nothing yields)
        let was = autoscaler_for_logs(vec![c]);
        let gone = vpa_condition(&was, Some(&[]), &now).expect("a condition");
        assert_eq!((gone.status.as_str(), gone.reason.as_str()), ("False", "NoVPA"));
        let api_gone = vpa_condition(&was, None, &now).expect("a condition");
        assert_eq!(api_gone.reason, "NoVPA");
    }

    #[test]
    fn only_conditions_that_changed_become_events() {
        let old = [
            c(RECOMMENDATION_PROVIDED, "False", "NoNodeRecommendation"),
            c(CONFIG_UNSUPPORTED, "False", "Valid"),
        ];
        let new = [
            c(RECOMMENDATION_PROVIDED, "True", "NodesReporting"),
            c(CONFIG_UNSUPPORTED, "False", "Valid"),
        ];
        let changed: Vec<&str> = changed_conditions(&old, &new)
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(changed, vec![RECOMMENDATION_PROVIDED]);
        // a first status: every condition is news
        assert_eq!(changed_conditions(&[], &new).len(), 2);
        assert!(changed_conditions(&new, &new).is_empty());
    }
}
