//! The updater: running DaemonSet pods on this node follow this node's recommendation
//! (`updateMode` `InPlace`/`InPlaceOrRecreate`: resized through `pods/resize`; `Recreate`/`Auto`:
//! evicted, and re-created by their DaemonSet with the webhook's figures).
//!
//! Every round (`--update-interval`) looks at each autoscaled pod of this node and no other:
//! * the new figures are [`sizing_on`] of the pod as its DaemonSet's template made it (the
//!   template is read from the pod's ControllerRevision, cached: revisions never change), with
//!   the figures this agent published, the autoscaler's fleet figures, its node group's figures
//!   (`scope: NodeGroup`, `coldStart: Group`; the node's labels are read with a metadata GET
//!   at most every [`NODE_LABELS_MAX_AGE`]) and the namespace's LimitRanges: exactly what the
//!   webhook would give a new pod here;
//! * [`decide`] says resize, evict or leave (VPA's updater rules, thresholds as flags);
//! * a resize is one PATCH of `pods/resize`; a resize the API server refuses (a QoS class
//!   change, say), the kubelet calls Infeasible, or that hangs, falls back to eviction;
//! * on a cluster that does not serve `pods/resize` (API discovery, asked again every 10 min:
//!   Kubernetes before 1.32, or its `InPlacePodVerticalScaling` gate off) the InPlace modes act as
//!   `Recreate` (the same thresholds, interval and budget), each eviction's Event says why, and
//!   the log says it once;
//! * an eviction goes through the Eviction API (PodDisruptionBudgets: a 429 is retried next
//!   round), at most one per DaemonSet on this node per `--eviction-min-interval`, and only
//!   while the DaemonSet's disruption budget allows it (see [`Budget`]); a pod that is not
//!   Ready (in an OOM loop, say) is unavailable already and is re-created outside the budget.
//!
//! Every resize and eviction is an Event on the pod and counts in
//! `nodewarden_agent_pod_updates_total{action, outcome}`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{LimitRange, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Recorder;
use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::domain::sizing::{ContainerSizing, in_namespace, sizing_on, status_figures};
use nodewarden_api::domain::update::{Action, Leave, Thresholds, Why, decide};
use nodewarden_api::rightsizing::{AutoscalerRef, NodePods, NodeRecommendationSpec, RunningPods};
use nodewarden_runtime::discovery::ResizeSupportCache;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::rightsizing::args::UpdateArgs;
use crate::rightsizing::pods::{NodePod, Stores, autoscaler_for, daemonset_owner};

mod budget;
mod facts;
mod limit_ranges;
mod revision;

pub use budget::{Budget, lease_tag};
use budget::{holder, lease_live, ready};
pub use facts::{describe, facts, node_figures, resize_body};
use limit_ranges::watch_limit_ranges;
pub use revision::{RevisionData, TemplateContainer, TemplateRevision, template_pod};

/// The label on a DaemonSet pod naming its ControllerRevision (`<daemonset>-<hash>`).
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// The label of a disruption lease: a hash of the DaemonSet's namespace and name.
pub const LEASE_LABEL: &str = "nodewarden.io/disruption";
/// The annotation of a disruption lease: the DaemonSet it is for (`namespace/name`).
pub const LEASE_DAEMONSET: &str = "nodewarden.io/daemonset";
/// How long the node's labels (for its node group) are used before they are read again.
pub const NODE_LABELS_MAX_AGE: Duration = Duration::from_secs(300);
/// Cached templates, at most (revisions are immutable; the cache is emptied when full).
const TEMPLATE_CACHE: usize = 512;
/// Pods acted on per round, at most (the rest wait for the next round).
const ACTIONS_PER_ROUND: usize = 8;
/// Every API call of the updater gives up after this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// What one pod's round came to (for tests and logs).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Nothing to do; why, as a label.
    Left(&'static str),
    /// Resized in place to the figures given.
    Resized(String),
    /// Evicted, for the reason given, so its DaemonSet re-creates it.
    Evicted(String),
    /// An action was wanted but did not happen (budget, interval, PDB, an error).
    Held(String),
}

/// The updater's state across rounds.
pub struct Updater {
    client: Client,
    /// A client that does not retry 429 (see `nodewarden_runtime::client::client_without_retries`).
    evictions: Client,
    node: String,
    args: UpdateArgs,
    thresholds: Thresholds,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    templates: HashMap<(String, String), Arc<Vec<TemplateContainer>>>,
    last_eviction: HashMap<(String, String), tokio::time::Instant>,
    /// Evictions held back: (namespace, daemonset) → not before.
    retry_at: HashMap<(String, String), tokio::time::Instant>,
    /// Where the per-autoscaler pod counts of each round go (published with the figures).
    report: Option<watch::Sender<Vec<NodePods>>>,
    /// Disruption leases this agent holds: (namespace, daemonset) → (lease name, evicted pod UID).
    held: HashMap<(String, String), (String, String)>,
    /// This node's labels and when they were read (for node groups).
    labels: Option<(tokio::time::Instant, BTreeMap<String, String>)>,
    /// Whether the API server serves `pods/resize` (asked when a pod's mode resizes).
    resize: ResizeSupportCache,
}

/// Runs the updater until `stop`.
pub async fn run(
    mut updater: Updater,
    stores: Stores,
    desired: watch::Receiver<crate::rightsizing::publish::Desired>,
    stop: CancellationToken,
) {
    if !updater.args.update_running_pods {
        tracing::info!("updates of running pods are off (--update-running-pods=false)");
        return;
    }
    let limit_ranges = watch_limit_ranges(updater.client.clone(), stop.clone());
    let mut ticker = tokio::time::interval(updater.args.update_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let spec = desired.borrow().clone();
        let Some(spec) = spec else { continue };
        let pods = stores.pods.state();
        let autoscalers = stores.autoscalers.state();
        let ranges = limit_ranges.state();
        updater.round(&pods, &autoscalers, &spec, &ranges).await;
        // the round's transient peak (pods, patches, answers) back to the kernel, not kept
        nodewarden_sys::release_free_heap();
    }
}

impl Updater {
    /// An updater for `node`; evictions go through `evictions`, a client that does not retry 429.
    pub fn new(
        client: Client,
        evictions: Client,
        node: String,
        args: UpdateArgs,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = nodewarden_runtime::events::recorder(&client, "nodewarden-agent", Some(node.clone()));
        Updater {
            thresholds: args.thresholds(),
            client,
            evictions,
            node,
            args,
            metrics,
            recorder,
            templates: HashMap::new(),
            last_eviction: HashMap::new(),
            retry_at: HashMap::new(),
            report: None,
            held: HashMap::new(),
            labels: None,
            resize: ResizeSupportCache::default(),
        }
    }

    /// The value of label `key` on this node, from its labels read at most
    /// [`NODE_LABELS_MAX_AGE`] ago; when they cannot be read, the last labels read (or none).
    async fn node_label(&mut self, key: &str) -> Option<String> {
        let fresh = self
            .labels
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < NODE_LABELS_MAX_AGE);
        if !fresh {
            let nodes: Api<Node> = Api::all(self.client.clone());
            match nodes.get_metadata(&self.node).await {
                Ok(node) => {
                    self.labels = Some((
                        tokio::time::Instant::now(),
                        node.metadata.labels.unwrap_or_default(),
                    ));
                }
                Err(err) => {
                    tracing::warn!(node = %self.node, error = %err, "reading the node's labels failed; using the last ones read");
                }
            }
        }
        self.labels.as_ref()?.1.get(key).cloned()
    }

    /// Why pods cannot be resized in place on this cluster, when they cannot (API discovery has no
    /// `pods/resize`); said in the log once each time the answer changes.
    async fn resize_absent(&mut self) -> Option<String> {
        let read = self.resize.get(&self.client).await;
        let support = read.support?;
        if read.changed {
            if support.served() {
                tracing::info!(
                    version = support.version(),
                    "the API server serves pods/resize: InPlace modes resize in place"
                );
            } else {
                tracing::warn!(
                    version = support.version(),
                    "{}; pods of autoscalers with updateMode InPlace or InPlaceOrRecreate are recreated instead, within their DaemonSet's budget",
                    support.explain()
                );
            }
        }
        (!support.served()).then(|| support.explain())
    }

    /// Sends each round's pod counts per autoscaler to `report`.
    pub fn reporting_to(mut self, report: watch::Sender<Vec<NodePods>>) -> Self {
        self.report = Some(report);
        self
    }

    /// One round over this node's pods; returns what happened to each autoscaled pod.
    pub async fn round(
        &mut self,
        pods: &[Arc<NodePod>],
        autoscalers: &[Arc<nodewarden_api::rightsizing::DaemonSetAutoscaler>],
        spec: &NodeRecommendationSpec,
        limit_ranges: &[Arc<LimitRange>],
    ) -> Vec<(String, Outcome)> {
        self.release_leases(pods).await;
        let mut out = Vec::new();
        let mut actions = 0;
        let mut counts: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
        for pod in pods {
            if pod.spec.as_ref().is_none() || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                continue;
            }
            let Some(ds) = daemonset_owner(pod) else { continue };
            let ns = pod.namespace().unwrap_or_default();
            let Some(autoscaler) = autoscaler_for(&ns, ds, autoscalers) else {
                continue;
            };
            let mut mode = autoscaler.spec.update_mode().running_pods();
            if mode == RunningPods::Untouched {
                continue;
            }
            // a VerticalPodAutoscaler that updates pods targets the same DaemonSet (the
            // autoscaler's VPAConflict condition): its pods are left to it
            if autoscaler.yields_to_vpa().is_some() {
                continue;
            }
            // no in-place resize on this cluster: such pods are recreated instead, within the
            // same budget as `Recreate` (the autoscaler's InPlaceResize condition says so)
            let mut no_resize = None;
            if mode == RunningPods::Resize
                && let Some(absent) = self.resize_absent().await
            {
                mode = RunningPods::Evict;
                no_resize = Some(absent);
            }
            let name = format!("{ns}/{}", pod.name_any());
            let template = match self.template(&ns, pod).await {
                Ok(t) => t,
                Err(why) => {
                    tracing::warn!(pod = %name, error = %why, "no template for the pod; left as it is");
                    out.push((name, Outcome::Held(why)));
                    continue;
                }
            };
            let autoscaler_name = autoscaler.name_any();
            let (targets, bounds) = node_figures(spec, &ns, &autoscaler_name);
            let group = match autoscaler.spec.node_group_label.as_deref() {
                Some(label) if autoscaler.spec.uses_groups() => self.node_label(label).await,
                _ => None,
            };
            let status = status_figures(autoscaler);
            let figures = status.for_node(Some(&targets), group.as_deref());
            let ranges = in_namespace(&ns, limit_ranges);
            let sizing = sizing_on(&template_pod(&template), autoscaler, figures, &ranges);
            let facts = facts(pod, bounds, &self.thresholds);
            let action = decide(mode, &sizing, &facts, &self.thresholds);
            let count = counts.entry((ns.clone(), autoscaler_name.clone())).or_default();
            count.0 += 1;
            if action == Action::Leave(Leave::UpToDate) {
                count.1 += 1;
            }
            tracing::debug!(pod = %name, ?mode, resize = ?facts.resize, ?sizing, ?action, "update decision");
            let outcome = match action {
                Action::Leave(leave) => {
                    let label = leave.label();
                    if let Leave::SmallChange { diff } = leave {
                        tracing::debug!(pod = %name, diff, "small change; left as it is");
                    }
                    Outcome::Left(label)
                }
                _ if actions >= ACTIONS_PER_ROUND => {
                    Outcome::Held("the round's action limit is reached".to_string())
                }
                Action::Resize { containers, why } => {
                    actions += 1;
                    self.resize(pod, &ns, ds, &containers, &why).await
                }
                Action::Evict { why } => {
                    actions += 1;
                    let said = match &no_resize {
                        Some(absent) => format!("{why}; not in place: {absent}"),
                        None => why.to_string(),
                    };
                    self.evict(pod, &ns, ds, &said, why.label()).await
                }
            };
            out.push((name, outcome));
        }
        let mut left: BTreeMap<&'static str, i64> = BTreeMap::new();
        for (_, outcome) in &out {
            if let Outcome::Left(label) = outcome {
                *left.entry(label).or_default() += 1;
            }
        }
        self.metrics.pods_left(&Leave::LABELS, &left);
        self.metrics.update_round(&counts);
        if let Some(report) = &self.report {
            let pods: Vec<NodePods> = counts
                .iter()
                .map(|((namespace, name), (running, up_to_date))| NodePods {
                    autoscaler: AutoscalerRef {
                        namespace: namespace.clone(),
                        name: name.clone(),
                    },
                    running: i32::try_from(*running).unwrap_or(i32::MAX),
                    up_to_date: i32::try_from(*up_to_date).unwrap_or(i32::MAX),
                })
                .collect();
            report.send_if_modified(|old| {
                let changed = *old != pods;
                if changed {
                    *old = pods;
                }
                changed
            });
        }
        out
    }

    /// The pod's containers as its ControllerRevision's template has them (names and resources).
    async fn template(&mut self, ns: &str, pod: &NodePod) -> Result<Arc<Vec<TemplateContainer>>, String> {
        let ds = daemonset_owner(pod).unwrap_or_default();
        let hash = pod
            .labels()
            .get(REVISION_LABEL)
            .ok_or_else(|| format!("the pod has no {REVISION_LABEL} label"))?;
        let revision = format!("{ds}-{hash}");
        let key = (ns.to_string(), revision.clone());
        if let Some(t) = self.templates.get(&key) {
            return Ok(t.clone());
        }
        let api: Api<TemplateRevision> = Api::namespaced(self.client.clone(), ns);
        let rev = tokio::time::timeout(CALL_TIMEOUT, api.get(&revision))
            .await
            .map_err(|_| format!("reading ControllerRevision {ns}/{revision} timed out"))?
            .map_err(|e| format!("reading ControllerRevision {ns}/{revision}: {e}"))?;
        let containers = rev
            .sized_containers()
            .ok_or_else(|| format!("ControllerRevision {ns}/{revision} holds no pod template"))?;
        if self.templates.len() >= TEMPLATE_CACHE {
            self.templates.clear();
        }
        let containers = Arc::new(containers);
        self.templates.insert(key, containers.clone());
        Ok(containers)
    }

    async fn resize(
        &mut self,
        pod: &NodePod,
        ns: &str,
        ds: &str,
        containers: &[ContainerSizing],
        why: &Why,
    ) -> Outcome {
        let body = resize_body(containers);
        let said = describe(containers);
        let api: Api<NodePod> = Api::namespaced(self.client.clone(), ns);
        let name = pod.name_any();
        let result = tokio::time::timeout(
            CALL_TIMEOUT,
            api.patch_subresource("resize", &name, &PatchParams::default(), &Patch::Strategic(&body)),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                self.metrics.pod_update("resize", "ok");
                tracing::info!(pod = %name, namespace = ns, %why, resize = %said, "resized in place");
                self.event(
                    pod,
                    false,
                    "Resize",
                    "Resized",
                    format!("resized in place to {said}: {why}"),
                )
                .await;
                Outcome::Resized(said)
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 422 => {
                // e.g. a QoS class change: only a new pod can have these figures
                self.metrics.pod_update("resize", "refused");
                tracing::warn!(pod = %name, namespace = ns, message = %status.message, "the API server refused the resize");
                let why = format!(
                    "the API server refused the resize to {said} ({}); evicting instead",
                    status.message
                );
                self.event(pod, true, "Resize", "ResizeRefused", why.clone())
                    .await;
                self.evict(pod, ns, ds, &why, "resize-refused").await
            }
            Ok(Err(err)) => {
                self.metrics.pod_update("resize", "error");
                let why = format!("resize to {said} failed: {err}");
                tracing::warn!(pod = %name, namespace = ns, error = %err, "resize failed");
                self.event(pod, true, "Resize", "ResizeFailed", why.clone()).await;
                Outcome::Held(why)
            }
            Err(_) => {
                self.metrics.pod_update("resize", "error");
                tracing::warn!(pod = %name, namespace = ns, "resize timed out");
                Outcome::Held("resize timed out".to_string())
            }
        }
    }

    async fn evict(&mut self, pod: &NodePod, ns: &str, ds: &str, why: &str, label: &'static str) -> Outcome {
        let key = (ns.to_string(), ds.to_string());
        if let Some(at) = self.last_eviction.get(&key)
            && at.elapsed() < self.args.eviction_min_interval
        {
            self.metrics.pod_update("evict", "too-soon");
            return Outcome::Held(format!(
                "evicted a pod of this DaemonSet {}s ago; waiting {}s between evictions",
                at.elapsed().as_secs(),
                self.args.eviction_min_interval.as_secs()
            ));
        }
        if let Some(at) = self.retry_at.get(&key)
            && tokio::time::Instant::now() < *at
        {
            return Outcome::Held("an earlier eviction was held back; waiting to retry".to_string());
        }
        // A pod that is not Ready is unavailable already: re-creating it takes nothing more
        // down, so it needs no room in the budget (the DaemonSet controller's rolling update
        // replaces unavailable pods outside maxUnavailable too). Without this, a pod in an OOM
        // loop would hold the budget itself, and never get the memory it needs.
        let lease = if ready(pod) {
            match self.budget(ns, ds, pod).await {
                Ok(lease) => Some(lease),
                Err(held) => {
                    self.hold_back(key);
                    self.metrics.pod_update("evict", "budget");
                    tracing::info!(pod = %pod.name_any(), namespace = ns, reason = %held, "eviction held back");
                    return Outcome::Held(held);
                }
            }
        } else {
            None
        };
        let api: Api<Pod> = Api::namespaced(self.evictions.clone(), ns);
        let name = pod.name_any();
        let result = tokio::time::timeout(CALL_TIMEOUT, api.evict(&name, &EvictParams::default())).await;
        match result {
            Ok(Ok(_)) => {
                self.metrics.pod_update("evict", "ok");
                self.last_eviction
                    .insert(key.clone(), tokio::time::Instant::now());
                if let Some(lease) = lease {
                    self.held
                        .insert(key, (lease, pod.metadata.uid.clone().unwrap_or_default()));
                }
                tracing::info!(pod = %name, namespace = ns, reason = label, %why, "evicted");
                self.event(
                    pod,
                    false,
                    "Evict",
                    "Evicted",
                    format!("evicted so its DaemonSet re-creates it with this node's figures: {why}"),
                )
                .await;
                Outcome::Evicted(why.to_string())
            }
            Ok(Err(err)) => {
                if let Some(lease) = &lease {
                    self.release(lease).await;
                }
                self.hold_back(key);
                let blocked = matches!(&err, kube::Error::Api(s) if s.code == 429);
                self.metrics
                    .pod_update("evict", if blocked { "blocked" } else { "error" });
                let said = if blocked {
                    format!("eviction refused for now (a PodDisruptionBudget); retried next round: {err}")
                } else {
                    format!("eviction failed: {err}")
                };
                tracing::warn!(pod = %name, namespace = ns, error = %err, "eviction not done");
                self.event(
                    pod,
                    true,
                    "Evict",
                    if blocked {
                        "EvictionBlocked"
                    } else {
                        "EvictionFailed"
                    },
                    said.clone(),
                )
                .await;
                Outcome::Held(said)
            }
            Err(_) => {
                if let Some(lease) = &lease {
                    self.release(lease).await;
                }
                self.hold_back(key);
                self.metrics.pod_update("evict", "error");
                tracing::warn!(pod = %name, namespace = ns, "eviction timed out");
                Outcome::Held("eviction timed out".to_string())
            }
        }
    }

    fn hold_back(&mut self, key: (String, String)) {
        if self.retry_at.len() >= TEMPLATE_CACHE {
            self.retry_at.retain(|_, at| *at > tokio::time::Instant::now());
        }
        self.retry_at.insert(
            key,
            tokio::time::Instant::now() + self.args.eviction_retry_interval,
        );
    }

    /// Takes a disruption lease for one pod of `ds`, or says why not.
    async fn budget(&mut self, ns: &str, ds: &str, pod: &NodePod) -> Result<String, String> {
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        let daemonset = tokio::time::timeout(CALL_TIMEOUT, daemonsets.get(ds))
            .await
            .map_err(|_| format!("reading DaemonSet {ns}/{ds} timed out"))?
            .map_err(|e| format!("reading DaemonSet {ns}/{ds}: {e}"))?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.args.disruption_namespace);
        let tag = lease_tag(ns, ds);
        let list = tokio::time::timeout(
            CALL_TIMEOUT,
            leases.list(&ListParams::default().labels(&format!("{LEASE_LABEL}={tag}"))),
        )
        .await
        .map_err(|_| "listing disruption leases timed out".to_string())?
        .map_err(|e| format!("listing disruption leases: {e}"))?;
        let now = Timestamp::now();
        let live: Vec<&Lease> = list.items.iter().filter(|l| lease_live(l, now)).collect();
        let others = live
            .iter()
            .filter(|l| holder(l) != Some(self.node.as_str()))
            .count();
        let budget = Budget::of(&daemonset);
        budget
            .allows(others)
            .map_err(|why| format!("DaemonSet {ns}/{ds}: {why}"))?;
        for slot in 0..budget.max_unavailable {
            let lease_name = format!("nodewarden-disruption-{tag}-{slot}");
            let existing = list.items.iter().find(|l| l.name_any() == lease_name);
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(lease_name.clone()),
                    namespace: Some(self.args.disruption_namespace.clone()),
                    labels: Some(BTreeMap::from([(LEASE_LABEL.to_string(), tag.clone())])),
                    annotations: Some(BTreeMap::from([
                        (LEASE_DAEMONSET.to_string(), format!("{ns}/{ds}")),
                        ("nodewarden.io/pod".to_string(), pod.name_any()),
                    ])),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.node.clone()),
                    lease_duration_seconds: Some(
                        i32::try_from(self.args.disruption_lease_duration.as_secs()).unwrap_or(i32::MAX),
                    ),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    ..LeaseSpec::default()
                }),
            };
            let taken = match existing {
                None => tokio::time::timeout(CALL_TIMEOUT, leases.create(&PostParams::default(), &lease))
                    .await
                    .is_ok_and(|r| r.is_ok()),
                Some(old) if !lease_live(old, now) || holder(old) == Some(self.node.as_str()) => {
                    lease.metadata.resource_version = old.metadata.resource_version.clone();
                    tokio::time::timeout(
                        CALL_TIMEOUT,
                        leases.replace(&lease_name, &PostParams::default(), &lease),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok())
                }
                Some(_) => false,
            };
            if taken {
                return Ok(lease_name);
            }
        }
        Err(format!(
            "DaemonSet {ns}/{ds}: every disruption slot ({}) is taken",
            budget.max_unavailable
        ))
    }

    /// Releases the leases of DaemonSets whose evicted pod has a Ready replacement here.
    async fn release_leases(&mut self, pods: &[Arc<NodePod>]) {
        let mut done = Vec::new();
        for ((ns, ds), (lease, evicted_uid)) in &self.held {
            let replaced = pods.iter().any(|p| {
                p.namespace().as_deref() == Some(ns.as_str())
                    && daemonset_owner(p) == Some(ds.as_str())
                    && p.metadata.uid.as_deref() != Some(evicted_uid.as_str())
                    && ready(p)
            });
            if replaced {
                done.push(((ns.clone(), ds.clone()), lease.clone()));
            }
        }
        for (key, lease) in done {
            self.release(&lease).await;
            self.held.remove(&key);
        }
    }

    async fn release(&self, lease: &str) {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.args.disruption_namespace);
        match tokio::time::timeout(CALL_TIMEOUT, leases.delete(lease, &Default::default())).await {
            Ok(Ok(_)) => {}
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Ok(Err(err)) => {
                tracing::warn!(lease, error = %err, "releasing a disruption lease failed; it expires")
            }
            Err(_) => tracing::warn!(lease, "releasing a disruption lease timed out; it expires"),
        }
    }

    async fn event(&self, pod: &NodePod, warning: bool, action: &str, reason: &str, note: String) {
        let reference = pod.object_ref(&());
        nodewarden_runtime::events::publish(&self.recorder, &reference, warning, action, reason, note).await;
    }
}
