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

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Container, LimitRange, Node, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::domain::sizing::{
    Amounts, ContainerSizing, Targets, is_sidecar, sizing_on, status_figures,
};
use nodewarden_api::domain::update::{
    Action, Bounds, Current, Facts, Leave, ResizeState, Thresholds, Why, decide,
};
use nodewarden_api::quantity::format_amount;
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, NodePods, NodeRecommendationSpec, ResourceName, RunningPods,
};
use nodewarden_runtime::discovery::ResizeSupportCache;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::rightsizing::args::UpdateArgs;
use crate::rightsizing::pods::{NodePod, NodePodStatus, Stores, autoscaler_for, daemonset_owner};

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

fn watch_limit_ranges(client: Client, stop: CancellationToken) -> Store<LimitRange> {
    let (store, writer) = reflector::store();
    let api: Api<LimitRange> = Api::all(client);
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                item = futures::StreamExt::next(&mut stream) => match item {
                    Some(Ok(_)) => {}
                    Some(Err(err)) => tracing::warn!(error = %err, "limitranges watch error; retrying"),
                    None => return,
                }
            }
        }
    });
    store
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
            let ranges: Vec<LimitRange> = limit_ranges
                .iter()
                .filter(|lr| lr.namespace().as_deref() == Some(ns.as_str()))
                .map(|lr| lr.as_ref().clone())
                .collect();
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
            .data
            .and_then(|d| d.spec)
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .map(RevisionPodSpec::sized)
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

/// A ControllerRevision of a DaemonSet as the updater reads it: the names and resources of its
/// template's containers, decoded straight from the API server's answer (everything else in it
/// is skipped, never built).
#[derive(Resource, Clone, Debug, Default, Deserialize)]
#[resource(inherit = "ControllerRevision")]
pub struct TemplateRevision {
    /// The revision's metadata (without managed fields).
    #[serde(deserialize_with = "crate::rightsizing::pods::slim_metadata")]
    pub metadata: ObjectMeta,
    /// The DaemonSet's patch this revision records (`spec.template`).
    #[serde(default)]
    pub data: Option<RevisionData>,
}

/// `data` of a DaemonSet's ControllerRevision: `{"spec": {"template": {"spec": {"containers": ...}}}}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RevisionData {
    #[serde(default)]
    spec: Option<RevisionSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct RevisionSpec {
    #[serde(default)]
    template: Option<RevisionTemplate>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct RevisionTemplate {
    #[serde(default)]
    spec: Option<RevisionPodSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RevisionPodSpec {
    #[serde(default)]
    containers: Vec<TemplateContainer>,
    #[serde(default)]
    init_containers: Vec<TemplateContainer>,
}

impl RevisionPodSpec {
    /// The containers, then the native sidecars (marked so); the other init containers dropped.
    fn sized(self) -> Vec<TemplateContainer> {
        let sidecars = self
            .init_containers
            .into_iter()
            .filter(|c| is_sidecar(c.restart_policy.as_deref()))
            .map(|c| TemplateContainer { sidecar: true, ..c });
        self.containers
            .into_iter()
            .map(|c| TemplateContainer { sidecar: false, ..c })
            .chain(sidecars)
            .collect()
    }
}

/// A container of a DaemonSet's pod template as the updater keeps it: what [`sizing_on`] reads
/// (about 100 bytes, where a full `Container` takes over 2 KB even when empty).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateContainer {
    /// Container name.
    pub name: String,
    /// Requests and limits of the template.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// `Always` for a native sidecar among the init containers.
    #[serde(default)]
    pub restart_policy: Option<String>,
    /// Whether it is a native sidecar (set from where it was read, not from the text).
    #[serde(skip)]
    pub sidecar: bool,
}

/// A pod holding only `containers` (the sidecars among them as init containers with
/// `restartPolicy: Always`), for [`sizing_on`] (built for the call, dropped after it).
pub fn template_pod(containers: &[TemplateContainer]) -> Pod {
    let of = |sidecar: bool| -> Vec<Container> {
        containers
            .iter()
            .filter(|c| c.sidecar == sidecar)
            .map(|c| Container {
                name: c.name.clone(),
                resources: c.resources.clone(),
                restart_policy: sidecar.then(|| "Always".to_string()),
                ..Container::default()
            })
            .collect()
    };
    let sidecars = of(true);
    Pod {
        spec: Some(PodSpec {
            containers: of(false),
            init_containers: (!sidecars.is_empty()).then_some(sidecars),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// A DaemonSet's disruption budget: its rollout's `maxUnavailable` (a number, or a percentage
/// of the nodes that should run it, rounded up as the DaemonSet controller does; 1 when unset),
/// minus the pods unavailable now (`desiredNumberScheduled − numberAvailable`, whatever the
/// cause), minus the pods other agents hold disruption leases for. The last two may count one
/// pod twice (evicted by another agent and not yet back), which only makes the budget stricter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The rollout's `maxUnavailable`, in pods.
    pub max_unavailable: u32,
    /// Pods unavailable now.
    pub unavailable: u32,
}

impl Budget {
    /// The budget from the DaemonSet's spec and status (leases are counted in [`Budget::allows`]).
    pub fn of(ds: &DaemonSet) -> Budget {
        let status = ds.status.as_ref();
        let desired = status.map_or(0, |s| s.desired_number_scheduled.max(0)) as u32;
        let available = status.and_then(|s| s.number_available).unwrap_or(0).max(0) as u32;
        let configured = ds
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref())
            .and_then(|r| r.max_unavailable.as_ref());
        let max_unavailable = match configured {
            None => 1,
            Some(IntOrString::Int(n)) => (*n).max(0) as u32,
            Some(IntOrString::String(s)) => match s.strip_suffix('%').and_then(|p| p.parse::<u64>().ok()) {
                Some(percent) => {
                    u32::try_from((u64::from(desired) * percent).div_ceil(100)).unwrap_or(u32::MAX)
                }
                None => 1,
            },
        };
        Budget {
            max_unavailable,
            unavailable: desired.saturating_sub(available),
        }
    }

    /// Whether one more pod may go, with `others` pods held by other agents' leases.
    pub fn allows(&self, others: usize) -> Result<(), String> {
        let others = u32::try_from(others).unwrap_or(u32::MAX);
        let used = self.unavailable.saturating_add(others);
        if self.max_unavailable == 0 {
            return Err("maxUnavailable is 0: its pods are never taken down".to_string());
        }
        if used >= self.max_unavailable {
            return Err(format!(
                "{} pods unavailable and {} being re-created by other nodes' agents; maxUnavailable is {}",
                self.unavailable, others, self.max_unavailable
            ));
        }
        Ok(())
    }
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

fn lease_live(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    if holder(lease).is_none() {
        return false;
    }
    let (Some(renew), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else {
        return false;
    };
    let until = renew.0.as_millisecond().saturating_add(i64::from(secs) * 1000);
    until > now.as_millisecond()
}

/// A short, stable name part for a DaemonSet's leases (FNV-1a of `namespace/name`, 64 bits, hex):
/// every agent, of any version, computes the same.
pub fn lease_tag(ns: &str, ds: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in ns.bytes().chain(std::iter::once(b'/')).chain(ds.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn ready(pod: &NodePod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// This node's targets and bounds for one autoscaler's containers.
pub fn node_figures(
    spec: &NodeRecommendationSpec,
    ns: &str,
    autoscaler: &str,
) -> (Targets, BTreeMap<String, Bounds>) {
    let mut targets = Targets::new();
    let mut bounds = BTreeMap::new();
    for r in &spec.recommendations {
        if r.autoscaler.namespace != ns || r.autoscaler.name != autoscaler {
            continue;
        }
        let target = Amounts::from_list(r.target.as_ref());
        if target.is_empty() {
            continue;
        }
        targets.insert(r.container_name.clone(), target);
        bounds.insert(
            r.container_name.clone(),
            Bounds {
                lower: Amounts::from_list(r.lower_bound.as_ref()),
                upper: Amounts::from_list(r.upper_bound.as_ref()),
                history: history(r),
            },
        );
    }
    (targets, bounds)
}

/// The CPU history behind a recommendation, first to last sample (`None` when it says neither).
fn history(r: &ContainerRecommendation) -> Option<Duration> {
    let (first, last) = (r.first_sample_time.as_ref()?, r.last_sample_time.as_ref()?);
    let ms = last.0.as_millisecond().saturating_sub(first.0.as_millisecond());
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

fn since(t: Option<&Time>) -> Option<Duration> {
    let t = t?;
    let ms = Timestamp::now()
        .as_millisecond()
        .saturating_sub(t.0.as_millisecond());
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// The facts [`decide`] needs, read from the pod.
pub fn facts(pod: &NodePod, bounds: BTreeMap<String, Bounds>, th: &Thresholds) -> Facts {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| {
            s.sized()
                .map(|c| Current {
                    name: c.name.clone(),
                    requests: Amounts::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref())),
                    limits: Amounts::from_list(c.resources.as_ref().and_then(|r| r.limits.as_ref())),
                })
                .collect()
        })
        .unwrap_or_default();
    let status = pod.status.as_ref();
    let quick_oom = status
        .map(NodePodStatus::all)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| {
                    t.reason.as_deref() == Some("OOMKilled")
                        && match (t.started_at.as_ref(), t.finished_at.as_ref()) {
                            (Some(start), Some(end)) => {
                                let ran = end.0.as_millisecond().saturating_sub(start.0.as_millisecond());
                                u128::try_from(ran).is_ok_and(|ran| ran < th.oom_window.as_millis())
                            }
                            _ => false,
                        }
                })
        })
        .map(|c| c.name.clone())
        .collect();
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let condition = |t: &str| conditions.iter().find(|c| c.type_ == t && c.status == "True");
    let resize = if let Some(pending) = condition("PodResizePending") {
        let message = pending.message.clone().unwrap_or_default();
        if pending.reason.as_deref() == Some("Infeasible") {
            ResizeState::Infeasible { message }
        } else {
            ResizeState::Deferred {
                message,
                for_: since(pending.last_transition_time.as_ref()).unwrap_or_default(),
            }
        }
    } else if let Some(progress) = condition("PodResizeInProgress") {
        ResizeState::InProgress {
            for_: since(progress.last_transition_time.as_ref()).unwrap_or_default(),
        }
    } else {
        ResizeState::Idle
    };
    Facts {
        containers,
        bounds,
        age: since(status.and_then(|s| s.start_time.as_ref())),
        quick_oom,
        resize,
    }
}

/// The strategic-merge patch of `pods/resize` for these containers (merged by name): the
/// sidecars under `initContainers` (the API server takes their resources there from 1.33 on).
pub fn resize_body(containers: &[ContainerSizing]) -> Value {
    let item = |c: &ContainerSizing| {
        let mut resources = serde_json::Map::new();
        for (key, amounts) in [("requests", c.requests), ("limits", c.limits)] {
            let mut map = serde_json::Map::new();
            for r in [ResourceName::Cpu, ResourceName::Memory] {
                if let Some(v) = amounts.get(r) {
                    map.insert(r.as_str().to_string(), Value::String(format_amount(r, v)));
                }
            }
            if !map.is_empty() {
                resources.insert(key.to_string(), Value::Object(map));
            }
        }
        json!({"name": c.name, "resources": resources})
    };
    let list = |sidecar: bool| -> Vec<Value> {
        containers
            .iter()
            .filter(|c| c.sidecar == sidecar)
            .map(item)
            .collect()
    };
    let mut spec = serde_json::Map::new();
    for (key, sidecar) in [("containers", false), ("initContainers", true)] {
        let items = list(sidecar);
        if !items.is_empty() {
            spec.insert(key.to_string(), Value::Array(items));
        }
    }
    json!({ "spec": spec })
}

/// `app: cpu 250m/500m, memory 300Mi` (request/limit).
pub fn describe(containers: &[ContainerSizing]) -> String {
    containers
        .iter()
        .map(|c| {
            let parts: Vec<String> = [ResourceName::Cpu, ResourceName::Memory]
                .into_iter()
                .filter_map(|r| {
                    let request = c.requests.get(r)?;
                    let mut text = format!("{} {}", r.as_str(), format_amount(r, request));
                    if let Some(limit) = c.limits.get(r) {
                        text.push_str(&format!("/{}", format_amount(r, limit)));
                    }
                    Some(text)
                })
                .collect();
            format!("{}: {}", c.name, parts.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(max_unavailable: Option<IntOrString>, desired: i32, available: i32) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "ds", "namespace": "ns"},
            "spec": {
                "selector": {},
                "template": {},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}}
            },
            "status": {"desiredNumberScheduled": desired, "numberAvailable": available,
                       "currentNumberScheduled": desired, "numberMisscheduled": 0, "numberReady": available}
        }))
        .expect("daemonset")
    }

    #[test]
    fn budget_counts_unavailable_pods_and_other_agents() {
        let b = Budget::of(&ds(None, 10, 10));
        assert_eq!(
            b,
            Budget {
                max_unavailable: 1,
                unavailable: 0
            }
        );
        assert!(b.allows(0).is_ok());
        assert!(b.allows(1).is_err(), "another agent holds the only slot");
        let b = Budget::of(&ds(Some(IntOrString::Int(2)), 10, 9));
        assert!(b.allows(0).is_ok());
        assert_eq!(
            b.allows(1).unwrap_err(),
            "1 pods unavailable and 1 being re-created by other nodes' agents; maxUnavailable is 2"
        );
        // 25% of 10 nodes, rounded up: 3
        let b = Budget::of(&ds(Some(IntOrString::String("25%".into())), 10, 10));
        assert_eq!(b.max_unavailable, 3);
        let b = Budget::of(&ds(Some(IntOrString::Int(0)), 10, 10));
        assert!(b.allows(0).unwrap_err().contains("maxUnavailable is 0"));
    }

    #[test]
    fn a_revision_is_read_as_its_template_containers_names_and_resources() {
        let rev: TemplateRevision = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "ds-5d8f", "namespace": "ns", "managedFields": [{"manager": "m"}]},
            "revision": 1,
            "data": {"spec": {"template": {"$patch": "replace", "metadata": {"labels": {"app": "a"}},
                "spec": {"containers": [
                    {"name": "app", "image": "app:1", "args": ["--x"],
                     "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "64Mi"}}},
                    {"name": "side", "image": "side:1"}
                ]}}}}
        }))
        .expect("revision");
        let containers = rev
            .data
            .and_then(|d| d.spec)
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .map(|s| s.containers)
            .expect("containers");
        let pod = template_pod(&containers);
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers.len(), 2);
        assert_eq!(spec.containers[0].name, "app");
        let resources = spec.containers[0].resources.as_ref().expect("resources");
        assert_eq!(resources.requests.as_ref().expect("requests")["cpu"].0, "100m");
        assert_eq!(resources.limits.as_ref().expect("limits")["memory"].0, "64Mi");
        assert_eq!(
            spec.containers[0].image, None,
            "only names and resources are kept"
        );
        assert!(spec.containers[1].resources.is_none());
    }

    #[test]
    fn lease_tags_are_stable_and_distinct() {
        assert_eq!(lease_tag("ns", "ds"), lease_tag("ns", "ds"));
        assert_ne!(lease_tag("ns", "ds"), lease_tag("n", "sds"));
        assert_eq!(lease_tag("ns", "ds").len(), 16);
    }

    #[test]
    fn resize_body_names_containers_and_canonical_quantities() {
        let body = resize_body(&[ContainerSizing {
            name: "app".into(),
            sidecar: false,
            requests: Amounts {
                cpu: Some(250),
                memory: Some(300 << 20),
            },
            limits: Amounts {
                cpu: Some(500),
                memory: None,
            },
        }]);
        assert_eq!(
            body,
            json!({"spec": {"containers": [{"name": "app", "resources": {
                "requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"cpu": "500m"}}}]}})
        );
    }

    #[test]
    fn a_resize_carries_sidecars_under_init_containers() {
        let sized = |name: &str, sidecar: bool, cpu: u64| ContainerSizing {
            name: name.into(),
            sidecar,
            requests: Amounts {
                cpu: Some(cpu),
                memory: None,
            },
            limits: Amounts::default(),
        };
        assert_eq!(
            resize_body(&[sized("app", false, 250), sized("log", true, 40)]),
            json!({"spec": {
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "250m"}}}],
                "initContainers": [{"name": "log", "resources": {"requests": {"cpu": "40m"}}}]
            }})
        );
        assert_eq!(
            resize_body(&[sized("log", true, 40)]),
            json!({"spec": {"initContainers": [{"name": "log", "resources": {"requests": {"cpu": "40m"}}}]}}),
            "a sidecar alone: no empty containers list"
        );
    }

    #[test]
    fn a_revision_keeps_its_sidecars_and_drops_its_init_containers() {
        let rev: TemplateRevision = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "ds-5d8f", "namespace": "ns"},
            "revision": 1,
            "data": {"spec": {"template": {"spec": {
                "initContainers": [
                    {"name": "setup", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "log", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "50m"}}}
                ],
                "containers": [{"name": "app", "image": "i", "restartPolicy": "Always"}]
            }}}}
        }))
        .expect("revision");
        let containers = rev
            .data
            .and_then(|d| d.spec)
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .map(RevisionPodSpec::sized)
            .expect("containers");
        let names: Vec<(&str, bool)> = containers.iter().map(|c| (c.name.as_str(), c.sidecar)).collect();
        assert_eq!(names, [("app", false), ("log", true)]);
        let pod = template_pod(&containers);
        let facts = nodewarden_api::domain::sizing::PodFacts::of(&pod);
        let read: Vec<(&str, Option<usize>)> = facts
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.sidecar))
            .collect();
        assert_eq!(
            read,
            [("app", None), ("log", Some(0))],
            "the sizing rule sees the sidecar"
        );
    }

    #[test]
    fn facts_count_sidecars_as_containers() {
        let pod: NodePod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}
                ],
                "containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}]
            },
            "status": {
                "phase": "Running",
                "initContainerStatuses": [{"name": "log", "lastState": {"terminated": {
                    "reason": "OOMKilled", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}}}]
            }
        }))
        .expect("pod");
        let f = facts(&pod, BTreeMap::new(), &Thresholds::default());
        let names: Vec<(&str, Option<u64>)> = f
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.requests.cpu))
            .collect();
        assert_eq!(names, [("app", Some(100)), ("log", Some(50))]);
        assert_eq!(f.quick_oom, ["log"]);
    }

    #[test]
    fn facts_read_resize_conditions_and_quick_ooms() {
        let pod: NodePod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}}]},
            "status": {
                "phase": "Running",
                "startTime": "2026-01-01T00:00:00Z",
                "conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "no room"}],
                "containerStatuses": [{"name": "app", "lastState": {"terminated": {
                    "reason": "OOMKilled", "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}}}]
            }
        }))
        .expect("pod");
        let f = facts(&pod, BTreeMap::new(), &Thresholds::default());
        assert_eq!(
            f.resize,
            ResizeState::Infeasible {
                message: "no room".into()
            }
        );
        assert_eq!(f.quick_oom, vec!["app".to_string()]);
        assert_eq!(f.containers[0].limits.cpu, Some(200));
        assert!(f.age.is_some_and(|a| a > Duration::from_secs(3600)));
    }
}
