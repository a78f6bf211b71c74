//! This node's pods and the autoscalers that target their DaemonSets.
//!
//! Two reflectors (pods with `spec.nodeName=<node>`, every `DaemonSetAutoscaler`) feed a pure
//! join, [`targets`]: for each running container of a pod whose controlling owner is a
//! DaemonSet that an autoscaler targets, where its cgroup is (pod UID, container ID) and what
//! it requests.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::domain::rightsizing::{controlling_daemonset, precedence};
use nodewarden_api::domain::sizing::is_sidecar;
use nodewarden_api::quantity::parse_milli;
use nodewarden_api::rightsizing::{AutoscalerRef, DaemonSetAutoscaler};
use nodewarden_estimator::policy::{Key, Policy, policy_for};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// A pod with only the fields the agent reads: the watch decodes and keeps much less than a
/// full `Pod` (everything else in the API server's answer is skipped).
#[derive(Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = "Pod")]
pub struct NodePod {
    /// The pod's metadata, without `managedFields` and with only the mirror pod annotation
    /// (see [`slim_metadata`]).
    #[serde(deserialize_with = "slim_metadata")]
    pub metadata: ObjectMeta,
    /// The containers.
    #[serde(default)]
    pub spec: Option<NodePodSpec>,
    /// Phase, conditions and container statuses.
    #[serde(default)]
    pub status: Option<NodePodStatus>,
}

/// Decodes a pod's metadata without its `managedFields` (skipped in the JSON text, never built:
/// for a pod of 100 containers they are about half its size, and decoded as JSON values they
/// took several times that in memory while each watch event was read) and with only the
/// annotation the agent reads ([`MIRROR_ANNOTATION`]).
pub fn slim_metadata<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        annotations: Option<BTreeMap<String, String>>,
        #[serde(default)]
        creation_timestamp: Option<Time>,
        #[serde(default)]
        deletion_grace_period_seconds: Option<i64>,
        #[serde(default)]
        deletion_timestamp: Option<Time>,
        #[serde(default)]
        finalizers: Option<Vec<String>>,
        #[serde(default)]
        generate_name: Option<String>,
        #[serde(default)]
        generation: Option<i64>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        owner_references: Option<Vec<OwnerReference>>,
        #[serde(default)]
        resource_version: Option<String>,
        #[serde(default)]
        uid: Option<String>,
    }
    let m = Meta::deserialize(d)?;
    let annotations = m.annotations.map(|mut a| {
        a.retain(|k, _| k == MIRROR_ANNOTATION);
        a
    });
    Ok(ObjectMeta {
        annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: None,
        uid: m.uid,
    })
}

/// The part of a pod's spec the agent reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePodSpec {
    /// The (non-init) containers.
    #[serde(default)]
    pub containers: Vec<NodeContainer>,
    /// The init containers (the native sidecars among them are autoscaled as containers).
    #[serde(default)]
    pub init_containers: Vec<NodeContainer>,
}

impl NodePodSpec {
    /// The containers right-sizing covers: `containers`, then the native sidecars of
    /// `initContainers` (`restartPolicy: Always`), each in pod order.
    pub fn sized(&self) -> impl Iterator<Item = &NodeContainer> {
        self.containers.iter().chain(self.sidecars())
    }

    /// The native sidecars of `initContainers`, in pod order.
    pub fn sidecars(&self) -> impl Iterator<Item = &NodeContainer> {
        self.init_containers
            .iter()
            .filter(|c| is_sidecar(c.restart_policy.as_deref()))
    }
}

/// A container of the pod's spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeContainer {
    /// Container name.
    pub name: String,
    /// Its requests and limits, as specified.
    #[serde(default)]
    pub resources: Option<Requests>,
    /// `Always` for an init container that is a native sidecar.
    #[serde(default)]
    pub restart_policy: Option<String>,
}

/// A container's resources: requests and limits by resource name.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Requests {
    /// Requests, such as `cpu` and `memory`.
    #[serde(default)]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Limits, such as `cpu` and `memory`.
    #[serde(default)]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

/// The part of a pod's status the agent reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePodStatus {
    /// Status of each (non-init) container.
    #[serde(default)]
    pub container_statuses: Option<Vec<NodeContainerStatus>>,
    /// Status of each init container (the sidecars' among them).
    #[serde(default)]
    pub init_container_statuses: Option<Vec<NodeContainerStatus>>,
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// When the kubelet accepted the pod.
    #[serde(default)]
    pub start_time: Option<Time>,
    /// The pod's conditions.
    #[serde(default)]
    pub conditions: Option<Vec<PodCondition>>,
}

impl NodePodStatus {
    /// The statuses of the containers and of the init containers, in that order.
    pub fn all(&self) -> Vec<&NodeContainerStatus> {
        self.container_statuses
            .iter()
            .flatten()
            .chain(self.init_container_statuses.iter().flatten())
            .collect()
    }
}

/// A pod condition (the updater reads `Ready`, `PodResizePending` and `PodResizeInProgress`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    /// Condition type, such as `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Machine-readable reason of the last transition.
    #[serde(default)]
    pub reason: Option<String>,
    /// Human-readable detail.
    #[serde(default)]
    pub message: Option<String>,
    /// When the status last changed.
    #[serde(default)]
    pub last_transition_time: Option<Time>,
}

/// The part of a container's status the agent reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeContainerStatus {
    /// Container name.
    pub name: String,
    /// `<runtime>://<id>` of the running instance.
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
    /// Requests applied by the kubelet (in-place resize).
    #[serde(default)]
    pub resources: Option<Requests>,
    /// The previous instance's end, when it had one.
    #[serde(default)]
    pub last_state: Option<LastState>,
}

/// A container's previous state.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LastState {
    /// Set when the previous instance terminated.
    #[serde(default)]
    pub terminated: Option<Terminated>,
}

/// How a container instance ended.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    /// Why, such as `OOMKilled`.
    #[serde(default)]
    pub reason: Option<String>,
    /// `<runtime>://<id>` of the ended instance.
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
    /// When it started.
    #[serde(default)]
    pub started_at: Option<Time>,
    /// When it ended.
    #[serde(default)]
    pub finished_at: Option<Time>,
}

/// Annotation on a mirror pod holding the static pod's own UID (the one its cgroup uses).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One running, autoscaled container on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Its history key.
    pub key: Key,
    /// Namespace of its pod.
    pub pod_namespace: String,
    /// Name of its pod.
    pub pod_name: String,
    /// Name of the DaemonSet that controls its pod.
    pub daemonset: String,
    /// UID of the pod cgroup (the static pod's own UID for mirror pods).
    pub cgroup_uid: String,
    /// Container ID without the runtime prefix.
    pub container_id: String,
    /// Current requests: millicores and bytes.
    pub cpu_request_milli: Option<u64>,
    /// Current memory request, in bytes.
    pub memory_request_bytes: Option<u64>,
    /// Containers in the pod (the policy's floors are shared among them).
    pub containers_per_pod: usize,
    /// What the autoscaler's policy says about this container.
    pub policy: Policy,
    /// The previous instance of this container was OOM-killed: (its container ID, when).
    pub last_oom: Option<(String, i64)>,
}

/// The container ID without its `<runtime>://` prefix.
pub fn strip_runtime(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

/// The UID that names the pod's cgroup.
pub fn cgroup_uid(pod: &NodePod) -> Option<String> {
    if let Some(uid) = pod.annotations().get(MIRROR_ANNOTATION).filter(|s| !s.is_empty()) {
        return Some(uid.clone());
    }
    pod.metadata.uid.clone()
}

/// Name of the DaemonSet that controls the pod, if one does.
pub fn daemonset_owner(pod: &NodePod) -> Option<&str> {
    controlling_daemonset(pod.owner_references())
}

/// The autoscaler for a pod's DaemonSet: the one in the pod's namespace targeting it; with
/// several, the oldest (then the first by name), as the webhook picks it.
pub fn autoscaler_for<'a>(
    namespace: &str,
    daemonset: &str,
    autoscalers: &'a [Arc<DaemonSetAutoscaler>],
) -> Option<&'a DaemonSetAutoscaler> {
    autoscalers
        .iter()
        .filter(|a| a.namespace().as_deref() == Some(namespace) && a.spec.target_ref.name == daemonset)
        .min_by(|a, b| precedence(a, b))
        .map(|a| a.as_ref())
}

fn request_of(c: &NodeContainer, name: &str) -> Option<u128> {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(name))
        .and_then(|q| parse_milli(&q.0))
}

fn rfc3339_ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

/// The autoscaled, running containers among `pods`.
pub fn targets(pods: &[Arc<NodePod>], autoscalers: &[Arc<DaemonSetAutoscaler>]) -> Vec<Target> {
    let mut out = Vec::new();
    for pod in pods {
        let Some(ds) = daemonset_owner(pod) else { continue };
        let ns = pod.namespace().unwrap_or_default();
        let Some(dsa) = autoscaler_for(&ns, ds, autoscalers) else {
            continue;
        };
        let Some(uid) = cgroup_uid(pod) else { continue };
        let Some(spec) = pod.spec.as_ref() else { continue };
        // a sidecar's status is among the init containers' (names are unique in a pod)
        let statuses = pod.status.as_ref().map(NodePodStatus::all).unwrap_or_default();
        let autoscaler = AutoscalerRef {
            namespace: ns.clone(),
            name: dsa.name_any(),
        };
        let containers_per_pod = spec.sized().count();
        for c in spec.sized() {
            let Some(policy) = policy_for(dsa, &c.name) else {
                continue;
            };
            let Some(status) = statuses.iter().find(|s| s.name == c.name) else {
                continue;
            };
            let Some(id) = status
                .container_id
                .as_deref()
                .map(strip_runtime)
                .filter(|s| !s.is_empty())
            else {
                continue;
            };
            // an in-place resize shows the applied requests in the status
            let applied = status.resources.as_ref().and_then(|r| r.requests.as_ref());
            let applied_of = |name: &str| applied.and_then(|r| r.get(name)).and_then(|q| parse_milli(&q.0));
            let cpu = applied_of("cpu").or_else(|| request_of(c, "cpu"));
            let memory = applied_of("memory").or_else(|| request_of(c, "memory"));
            let last_oom = status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .filter(|t| t.reason.as_deref() == Some("OOMKilled"))
                .and_then(|t| {
                    let id = t.container_id.as_deref().map(strip_runtime)?.to_string();
                    let at = t.finished_at.as_ref().map(rfc3339_ms)?;
                    Some((id, at))
                });
            out.push(Target {
                key: Key {
                    autoscaler: autoscaler.clone(),
                    container: c.name.clone(),
                },
                pod_namespace: ns.clone(),
                pod_name: pod.name_any(),
                daemonset: ds.to_string(),
                cgroup_uid: uid.clone(),
                container_id: id.to_string(),
                cpu_request_milli: cpu.and_then(|m| u64::try_from(m).ok()),
                memory_request_bytes: memory.and_then(|m| u64::try_from(m / 1000).ok()),
                containers_per_pod,
                policy,
                last_oom,
            });
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    // one pod per DaemonSet per node; should two overlap (a replacement starting), keep one
    out.dedup_by(|a, b| a.key == b.key);
    out
}

/// The autoscalers that still exist, so histories of deleted ones can be dropped.
pub fn autoscaler_refs(autoscalers: &[Arc<DaemonSetAutoscaler>]) -> BTreeMap<AutoscalerRef, ()> {
    autoscalers
        .iter()
        .map(|a| {
            (
                AutoscalerRef {
                    namespace: a.namespace().unwrap_or_default(),
                    name: a.name_any(),
                },
                (),
            )
        })
        .collect()
}

/// Reflector stores of this node's pods and of every autoscaler.
#[derive(Clone)]
pub struct Stores {
    /// This node's pods.
    pub pods: Store<NodePod>,
    /// Every `DaemonSetAutoscaler`.
    pub autoscalers: Store<DaemonSetAutoscaler>,
}

impl Stores {
    /// Waits until both stores have listed once.
    pub async fn ready(&self) -> bool {
        self.pods.wait_until_ready().await.is_ok() && self.autoscalers.wait_until_ready().await.is_ok()
    }

    /// [`targets`] and [`autoscaler_refs`] of what the stores hold now.
    pub fn targets(&self) -> (Vec<Target>, BTreeMap<AutoscalerRef, ()>) {
        let autoscalers = self.autoscalers.state();
        (
            targets(&self.pods.state(), &autoscalers),
            autoscaler_refs(&autoscalers),
        )
    }
}

/// Starts the two watches; they retry with kube-runtime's default backoff until `stop`.
pub fn watch(client: Client, node: &str, stop: CancellationToken) -> Stores {
    let (pods, pods_writer) = reflector::store();
    let (autoscalers, dsa_writer) = reflector::store();
    let pod_api: Api<NodePod> = Api::all(client.clone());
    let pod_cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    // `NodePod` leaves out what the agent never reads (managed fields, other annotations)
    let pod_stream = reflector::reflector(pods_writer, watcher(pod_api, pod_cfg)).default_backoff();
    let dsa_api: Api<DaemonSetAutoscaler> = Api::all(client);
    let dsa_stream =
        reflector::reflector(dsa_writer, watcher(dsa_api, watcher::Config::default())).default_backoff();
    spawn_drain("pods", pod_stream, stop.clone());
    spawn_drain("daemonsetautoscalers", dsa_stream, stop);
    Stores { pods, autoscalers }
}

fn spawn_drain<S, T>(what: &'static str, stream: S, stop: CancellationToken)
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(_)) => {}
                    Some(Err(err)) => tracing::warn!(watch = what, error = %err, "watch failed; retrying with backoff"),
                    None => return,
                },
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Arc<NodePod> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn dsa(ns: &str, name: &str, ds: &str, policies: serde_json::Value) -> Arc<DaemonSetAutoscaler> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"targetRef": {"kind": "DaemonSet", "name": ds}, "resourcePolicy": {"containerPolicies": policies}}
            }))
            .unwrap(),
        )
    }

    const ID_APP: &str = "aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111";
    const ID_SIDE: &str = "bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222";

    fn ds_pod(owner_kind: &str) -> Arc<NodePod> {
        pod(json!({
            "metadata": {"name": "agent-x1", "namespace": "mon", "uid": "11111111-2222-3333-4444-555555555555",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": "agent", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "x", "containers": [
                {"name": "app", "image": "i", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}},
                {"name": "side", "image": "i"},
                {"name": "notstarted", "image": "i"}
            ]},
            "status": {"containerStatuses": [
                {"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
                 "containerID": format!("containerd://{ID_APP}"),
                 "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                    "containerID": "containerd://cccc", "finishedAt": "2026-11-21T07:00:00Z"}}},
                {"name": "side", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "containerID": format!("cri-o://{ID_SIDE}")},
                {"name": "notstarted", "image": "i", "imageID": "", "ready": false, "restartCount": 0}
            ]}
        }))
    }

    #[test]
    fn joins_daemonset_pods_to_their_autoscaler() {
        let dsas = vec![dsa("mon", "agent-dsa", "agent", json!([]))];
        let t = targets(&[ds_pod("DaemonSet")], &dsas);
        assert_eq!(t.len(), 2, "{t:#?}");
        let app = &t[0];
        assert_eq!(app.key.container, "app");
        assert_eq!(app.key.autoscaler.name, "agent-dsa");
        assert_eq!(app.cgroup_uid, "11111111-2222-3333-4444-555555555555");
        assert_eq!(app.container_id, ID_APP);
        assert_eq!(app.cpu_request_milli, Some(250));
        assert_eq!(app.memory_request_bytes, Some(128 * 1024 * 1024));
        assert_eq!(app.containers_per_pod, 3);
        assert_eq!(app.last_oom.as_ref().map(|(id, _)| id.as_str()), Some("cccc"));
        let side = &t[1];
        assert_eq!(side.container_id, ID_SIDE);
        assert_eq!(side.cpu_request_milli, None);
    }

    #[test]
    fn native_sidecars_are_measured_and_init_containers_are_not() {
        let pod = pod(json!({
            "metadata": {"name": "agent-x1", "namespace": "mon", "uid": "11111111-2222-3333-4444-555555555555",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "x",
                "initContainers": [
                    {"name": "setup", "image": "i"},
                    {"name": "log", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "50m"}}},
                    {"name": "mesh", "image": "i", "restartPolicy": "Always"}
                ],
                "containers": [{"name": "app", "image": "i"}]},
            "status": {
                "containerStatuses": [{"name": "app", "containerID": format!("containerd://{ID_APP}")}],
                "initContainerStatuses": [
                    {"name": "setup", "containerID": "containerd://dddd"},
                    {"name": "log", "containerID": format!("containerd://{ID_SIDE}"),
                     "resources": {"requests": {"cpu": "40m"}}},
                    {"name": "mesh", "containerID": "containerd://eeee"}
                ]
            }
        }));
        let dsas = vec![dsa(
            "mon",
            "agent-dsa",
            "agent",
            json!([{"containerName": "mesh", "mode": "Off"}]),
        )];
        let t = targets(&[pod], &dsas);
        let got: Vec<(&str, &str, Option<u64>, usize)> = t
            .iter()
            .map(|t| {
                (
                    t.key.container.as_str(),
                    t.container_id.as_str(),
                    t.cpu_request_milli,
                    t.containers_per_pod,
                )
            })
            .collect();
        // the sidecar's applied request (an in-place resize) is read from its status; `mesh` is
        // Off; `setup` runs to completion
        assert_eq!(got, [("app", ID_APP, None, 3), ("log", ID_SIDE, Some(40), 3)]);
    }

    #[test]
    fn pods_of_other_owners_or_without_autoscaler_are_ignored() {
        let dsas = vec![dsa("mon", "agent-dsa", "agent", json!([]))];
        assert!(targets(&[ds_pod("ReplicaSet")], &dsas).is_empty());
        let elsewhere = vec![dsa("other", "agent-dsa", "agent", json!([]))];
        assert!(targets(&[ds_pod("DaemonSet")], &elsewhere).is_empty());
        let other_ds = vec![dsa("mon", "x", "not-agent", json!([]))];
        assert!(targets(&[ds_pod("DaemonSet")], &other_ds).is_empty());
    }

    #[test]
    fn container_policies_switch_off_and_limit() {
        let dsas = vec![dsa(
            "mon",
            "agent-dsa",
            "agent",
            json!([
                {"containerName": "side", "mode": "Off"},
                {"containerName": "*", "controlledResources": ["memory"], "minAllowed": {"memory": "1Gi"}, "maxAllowed": {"cpu": "2"}}
            ]),
        )];
        let t = targets(&[ds_pod("DaemonSet")], &dsas);
        assert_eq!(t.len(), 1);
        assert!(!t[0].policy.cpu && t[0].policy.memory);
        assert_eq!(t[0].policy.limits.min.memory, Some(1 << 30));
        assert_eq!(t[0].policy.limits.max.cpu, Some(2000));
    }

    #[test]
    fn pods_are_kept_without_managed_fields_and_other_annotations() {
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "labels": {"app": "a"},
            "annotations": {MIRROR_ANNOTATION: "m", "other": "x"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "d", "controller": true}],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:phase": {}}}}]}}),
        );
        assert_eq!(p.metadata.managed_fields, None);
        assert_eq!(p.annotations().len(), 1);
        assert_eq!(p.annotations()[MIRROR_ANNOTATION], "m");
        assert_eq!(p.labels()["app"], "a");
        assert_eq!(p.resource_version().as_deref(), Some("7"));
        assert_eq!(daemonset_owner(&p), Some("ds"));
    }

    #[test]
    fn mirror_pods_use_the_static_pod_uid() {
        let p = pod(json!({"metadata": {"name": "s", "uid": "mirror-uid",
            "annotations": {MIRROR_ANNOTATION: "6f1c0b0a8e2d4c3b9a7f5e4d3c2b1a09"}}}));
        assert_eq!(
            cgroup_uid(&p).as_deref(),
            Some("6f1c0b0a8e2d4c3b9a7f5e4d3c2b1a09")
        );
        assert_eq!(strip_runtime("cri-o://abc"), "abc");
        assert_eq!(strip_runtime("abc"), "abc");
    }

    #[test]
    fn two_autoscalers_for_one_daemonset_pick_the_oldest_then_the_first_by_name() {
        let dsas = vec![
            dsa("mon", "zeta", "agent", json!([])),
            dsa("mon", "alpha", "agent", json!([])),
        ];
        let t = targets(&[ds_pod("DaemonSet")], &dsas);
        assert!(t.iter().all(|t| t.key.autoscaler.name == "alpha"));
        let aged = |name: &str, at: &str| {
            let mut a = (*dsa("mon", name, "agent", json!([]))).clone();
            a.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                at.parse().unwrap(),
            ));
            Arc::new(a)
        };
        let dsas = vec![
            aged("alpha", "2026-11-21T08:00:00Z"),
            aged("zeta", "2026-11-21T07:00:00Z"),
        ];
        let t = targets(&[ds_pod("DaemonSet")], &dsas);
        assert!(t.iter().all(|t| t.key.autoscaler.name == "zeta"));
    }
}
