//! Publishing `NodeRecommendation/<node>`: when (a pure decision) and how (server-side apply
//! with field manager `nodewarden-agent`, owner reference to the Node, retried with backoff).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nodewarden_api::quantity::{amount, format_amount};
use nodewarden_api::rightsizing::{
    Capped, ContainerRecommendation, NodeRecommendation, NodeRecommendationSpec, NodeSummary, ResourceName,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::rightsizing::pods::Key;

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "nodewarden-agent";

/// One container's published figures, in millicores and bytes, plus the request it had.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The recommended requests, within the policy's limits.
    pub target: Figures,
    /// Lower bound, within the policy's limits.
    pub lower: Figures,
    /// Upper bound, within the policy's limits; `None` when the estimator gives none.
    pub upper: Option<Figures>,
    /// The target before the policy's limits were applied.
    pub uncapped_target: Figures,
    /// The figures held at a cap (the node's allocatable, `maxAllowed`), and why.
    pub capped: Option<Capped>,
    /// Current requests (millicores, bytes) of the running container, if known.
    pub request_cpu_milli: Option<u64>,
    /// Current memory request of the running container, in bytes, if known.
    pub request_memory_bytes: Option<u64>,
    /// Samples the recommendation rests on.
    pub sample_count: u64,
    /// Time of the first sample, in milliseconds since the Unix epoch.
    pub first_sample_ms: i64,
    /// Time of the last sample, in milliseconds since the Unix epoch.
    pub last_sample_ms: i64,
    /// OOM kills seen.
    pub oom_count: u64,
}

/// Millicores and bytes; `None` for a resource the autoscaler does not control.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Figures {
    /// CPU in millicores.
    pub cpu_milli: Option<u64>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
}

/// Every container's figures, as written in (or due for) one `NodeRecommendation`.
pub type Snapshot = BTreeMap<Key, Entry>;

/// Why a write is due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Nothing was written yet and there is something to write.
    First,
    /// The set of containers changed.
    ContainersChanged,
    /// A target moved by more than the change threshold.
    TargetMoved {
        /// The container.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
    },
    /// The current request moved to another side of the [lower, upper] range.
    BoundCrossedRequest {
        /// The container.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
    },
    /// Nothing material changed, but the refresh interval passed.
    Refresh,
}

impl Reason {
    /// The reason as a metric label value (`first`, `containers-changed`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::First => "first",
            Reason::ContainersChanged => "containers-changed",
            Reason::TargetMoved { .. } => "target-moved",
            Reason::BoundCrossedRequest { .. } => "bound-crossed-request",
            Reason::Refresh => "refresh",
        }
    }
}

/// Where a request sits relative to [lower, upper].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Below,
    Within,
    Above,
}

fn side(request: Option<u64>, lower: Option<u64>, upper: Option<Option<u64>>) -> Option<Side> {
    let r = request?;
    if lower.is_some_and(|l| r < l) {
        Some(Side::Below)
    } else if upper.flatten().is_some_and(|u| r > u) {
        Some(Side::Above)
    } else {
        Some(Side::Within)
    }
}

fn moved(old: Option<u64>, new: Option<u64>, threshold: f64) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => {
            let (o, n) = (o as f64, n as f64);
            if o == 0.0 {
                n != 0.0
            } else {
                ((n - o) / o).abs() > threshold
            }
        }
        (None, None) => false,
        _ => true,
    }
}

/// The resources compared, with the figure of each.
type Pick = fn(&Figures) -> Option<u64>;
const RESOURCES: [(&str, Pick); 2] = [("cpu", |f| f.cpu_milli), ("memory", |f| f.memory_bytes)];

fn request_of(e: &Entry, resource: &str) -> Option<u64> {
    if resource == "cpu" {
        e.request_cpu_milli
    } else {
        e.request_memory_bytes
    }
}

/// Whether to write `next`, given what was last written (`prev`, at `prev_ms`).
///
/// Material changes: the set of containers changed; a target moved by more than `threshold`
/// (0.1 = 10 %); or the current request moved to the other side of a bound (lower bound now
/// above the request, upper bound now below it, or back). Otherwise only once `refresh_ms`
/// passed since the last write. An empty snapshot is never written first.
pub fn decide(
    prev: Option<(&Snapshot, i64)>,
    next: &Snapshot,
    now_ms: i64,
    threshold: f64,
    refresh_ms: i64,
) -> Option<Reason> {
    let Some((prev, prev_ms)) = prev else {
        return (!next.is_empty()).then_some(Reason::First);
    };
    if prev.len() != next.len() || prev.keys().zip(next.keys()).any(|(a, b)| a != b) {
        return Some(Reason::ContainersChanged);
    }
    for (key, n) in next {
        let Some(p) = prev.get(key) else {
            return Some(Reason::ContainersChanged);
        };
        for (resource, pick) in RESOURCES {
            if moved(pick(&p.target), pick(&n.target), threshold) {
                return Some(Reason::TargetMoved {
                    container: key.container.clone(),
                    resource,
                });
            }
        }
        for (resource, pick) in RESOURCES {
            let before = side(
                request_of(p, resource),
                pick(&p.lower),
                p.upper.as_ref().map(pick),
            );
            let now = side(
                request_of(n, resource),
                pick(&n.lower),
                n.upper.as_ref().map(pick),
            );
            if before.is_some() && now.is_some() && before != now {
                return Some(Reason::BoundCrossedRequest {
                    container: key.container.clone(),
                    resource,
                });
            }
        }
    }
    (now_ms - prev_ms >= refresh_ms).then_some(Reason::Refresh)
}

fn list(f: &Figures) -> Option<nodewarden_api::quantity::ResourceList> {
    let mut m = BTreeMap::new();
    for (resource, amount) in [
        (ResourceName::Cpu, f.cpu_milli),
        (ResourceName::Memory, f.memory_bytes),
    ] {
        if let Some(amount) = amount {
            m.insert(
                resource.as_str().to_string(),
                Quantity(format_amount(resource, amount)),
            );
        }
    }
    (!m.is_empty()).then_some(m)
}

fn time(ms: i64) -> Option<Time> {
    (ms > 0)
        .then(|| Timestamp::from_millisecond(ms).ok())
        .flatten()
        .map(Time)
}

/// The spec the agent writes for `snapshot`.
pub fn spec(snapshot: &Snapshot, now_ms: i64) -> NodeRecommendationSpec {
    let recommendations: Vec<ContainerRecommendation> = snapshot
        .iter()
        .map(|(key, e)| ContainerRecommendation {
            autoscaler: key.autoscaler.clone(),
            container_name: key.container.clone(),
            target: list(&e.target),
            lower_bound: list(&e.lower),
            upper_bound: e.upper.as_ref().and_then(list),
            uncapped_target: list(&e.uncapped_target),
            sample_count: i64::try_from(e.sample_count).unwrap_or(i64::MAX),
            first_sample_time: time(e.first_sample_ms),
            last_sample_time: time(e.last_sample_ms),
            oom_count: i64::try_from(e.oom_count).unwrap_or(i64::MAX),
            capped: e.capped.clone(),
        })
        .collect();
    NodeRecommendationSpec {
        update_time: time(now_ms),
        pods: Vec::new(),
        summary: Some(NodeSummary::of(&recommendations)),
        recommendations,
    }
}

/// The whole object, owned by the Node so that it goes when the node goes.
pub fn object(node: &str, node_uid: &str, spec: NodeRecommendationSpec) -> NodeRecommendation {
    let mut obj = NodeRecommendation::new(node, spec);
    obj.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.to_string(),
        uid: node_uid.to_string(),
        ..Default::default()
    }]);
    obj
}

/// The node's allocatable millicores and bytes (`status.allocatable`); a quantity that is
/// missing or unreadable is `None` (no cap for that resource).
pub fn allocatable_of(node: &Node) -> Figures {
    let list = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |r: ResourceName| list.and_then(|l| amount(r, l.get(r.as_str())?));
    Figures {
        cpu_milli: get(ResourceName::Cpu).filter(|&v| v > 0),
        memory_bytes: get(ResourceName::Memory).filter(|&v| v > 0),
    }
}

/// How often the agent reads its Node's allocatable again (it changes with the kubelet's
/// configuration, rarely), and how soon after a failed read.
pub const ALLOCATABLE_REFRESH: Duration = Duration::from_secs(300);
const ALLOCATABLE_RETRY: Duration = Duration::from_secs(30);

/// Reads the agent's own Node's allocatable at once and every [`ALLOCATABLE_REFRESH`] into `out`
/// (only its own Node: `get nodes/<node>`), until `stop` fires. A failed read keeps the last
/// figures and is retried sooner.
pub async fn watch_allocatable(
    client: Client,
    node: String,
    out: watch::Sender<Figures>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut warned = false;
    loop {
        let wait = match nodes.get(&node).await {
            Ok(n) => {
                let figures = allocatable_of(&n);
                out.send_if_modified(|old| {
                    let changed = *old != figures;
                    *old = figures;
                    changed
                });
                warned = false;
                ALLOCATABLE_REFRESH
            }
            Err(err) => {
                if !warned {
                    tracing::warn!(node = %node, error = %err, "cannot read the node's allocatable resources; figures are not capped at them until it can");
                    warned = true;
                }
                ALLOCATABLE_RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What the sampler hands to the publisher: the spec to write, newest wins.
pub type Desired = Option<Arc<NodeRecommendationSpec>>;

/// Backoff between failed writes: 1 s doubling to 5 min, with jitter, forever.
pub fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(300))
        .with_jitter()
        .without_max_times()
}

/// Writes every new desired spec; on failure retries with [`backoff`], always with the newest
/// spec, until it is written or `stop` fires.
pub async fn run_publisher(
    client: Client,
    node: String,
    mut desired: watch::Receiver<Desired>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    backoff: ExponentialBuilder,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let recs: Api<NodeRecommendation> = Api::all(client);
    let mut node_uid: Option<String> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
        }
        desired.borrow_and_update();
        let attempt = || async {
            // always the newest spec, also on a retry
            let Some(spec) = desired.borrow().clone() else {
                return Ok::<Option<String>, kube::Error>(None);
            };
            let uid = match &node_uid {
                Some(uid) => uid.clone(),
                None => nodes.get(&node).await?.metadata.uid.unwrap_or_default(),
            };
            let obj = object(&node, &uid, (*spec).clone());
            recs.patch(
                &node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await?;
            Ok(Some(uid))
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            r = attempt
                .retry(backoff)
                .notify(|err: &kube::Error, after: Duration| {
                    metrics.write_error();
                    tracing::warn!(error = %err, retry_in = ?after, "writing NodeRecommendation failed; measuring goes on");
                }) => r,
        };
        match result {
            Ok(None) => {}
            Ok(Some(uid)) => {
                metrics.write_ok();
                node_uid = Some(uid);
                tracing::debug!(node = %node, "NodeRecommendation written");
            }
            Err(err) => tracing::error!(error = %err, "giving up writing NodeRecommendation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_api::rightsizing::AutoscalerRef;

    fn key(c: &str) -> Key {
        Key {
            autoscaler: AutoscalerRef {
                namespace: "mon".into(),
                name: "agent".into(),
            },
            container: c.into(),
        }
    }

    fn entry(cpu: u64, mem: u64) -> Entry {
        Entry {
            target: Figures {
                cpu_milli: Some(cpu),
                memory_bytes: Some(mem),
            },
            lower: Figures {
                cpu_milli: Some(cpu / 2),
                memory_bytes: Some(mem / 2),
            },
            upper: Some(Figures {
                cpu_milli: Some(cpu * 2),
                memory_bytes: Some(mem * 2),
            }),
            uncapped_target: Figures {
                cpu_milli: Some(cpu),
                memory_bytes: Some(mem),
            },
            capped: None,
            request_cpu_milli: Some(cpu),
            request_memory_bytes: Some(mem),
            sample_count: 10,
            first_sample_ms: 1,
            last_sample_ms: 2,
            oom_count: 0,
        }
    }

    fn snap(entries: &[(&str, Entry)]) -> Snapshot {
        entries.iter().map(|(c, e)| (key(c), e.clone())).collect()
    }

    #[test]
    fn publish_decision_table() {
        const HOUR: i64 = 3_600_000;
        let base = snap(&[("app", entry(100, 1000))]);
        let with = |f: &dyn Fn(&mut Entry)| {
            let mut e = entry(100, 1000);
            f(&mut e);
            snap(&[("app", e)])
        };
        // (case, last written, now, now_ms, expected reason)
        type Case<'a> = (&'a str, Option<&'a Snapshot>, Snapshot, i64, Option<&'a str>);
        let cases: Vec<Case> = vec![
            ("nothing yet, nothing to say", None, Snapshot::new(), 0, None),
            ("first figures", None, base.clone(), 0, Some("first")),
            ("unchanged", Some(&base), base.clone(), 10, None),
            (
                "cpu target +10 % exactly",
                Some(&base),
                with(&|e| e.target.cpu_milli = Some(110)),
                10,
                None,
            ),
            (
                "cpu target +11 %",
                Some(&base),
                with(&|e| e.target.cpu_milli = Some(111)),
                10,
                Some("target-moved"),
            ),
            (
                "memory target −11 %",
                Some(&base),
                with(&|e| e.target.memory_bytes = Some(890)),
                10,
                Some("target-moved"),
            ),
            (
                "memory target −5 %",
                Some(&base),
                with(&|e| e.target.memory_bytes = Some(950)),
                10,
                None,
            ),
            (
                "lower bound rises above the request",
                Some(&base),
                with(&|e| e.lower.cpu_milli = Some(101)),
                10,
                Some("bound-crossed-request"),
            ),
            (
                "upper bound falls below the memory request",
                Some(&base),
                with(&|e| {
                    e.upper = Some(Figures {
                        cpu_milli: Some(200),
                        memory_bytes: Some(999),
                    })
                }),
                10,
                Some("bound-crossed-request"),
            ),
            (
                "bounds move but the request stays within",
                Some(&base),
                with(&|e| e.lower.cpu_milli = Some(90)),
                10,
                None,
            ),
            (
                "a resource stops being controlled",
                Some(&base),
                with(&|e| e.target.cpu_milli = None),
                10,
                Some("target-moved"),
            ),
            (
                "a container appears",
                Some(&base),
                snap(&[("app", entry(100, 1000)), ("side", entry(1, 1))]),
                10,
                Some("containers-changed"),
            ),
            (
                "all containers gone",
                Some(&base),
                Snapshot::new(),
                10,
                Some("containers-changed"),
            ),
            (
                "unchanged, refresh due",
                Some(&base),
                base.clone(),
                HOUR,
                Some("refresh"),
            ),
            (
                "unchanged, refresh not yet due",
                Some(&base),
                base.clone(),
                HOUR - 1,
                None,
            ),
        ];
        for (name, prev, next, now, want) in cases {
            let got = decide(prev.map(|p| (p, 0)), &next, now, 0.1, HOUR);
            assert_eq!(got.as_ref().map(Reason::as_str), want, "{name}");
        }
    }

    #[test]
    fn spec_has_quantities_in_the_canonical_format() {
        let s = spec(&snap(&[("app", entry(25, 262_144_000))]), 1_763_708_400_000);
        let r = &s.recommendations[0];
        assert_eq!(r.container_name, "app");
        assert_eq!(r.target.as_ref().unwrap()["cpu"].0, "25m");
        // the one format of the agent and the webhook: 262144000 bytes are 250Mi
        assert_eq!(r.target.as_ref().unwrap()["memory"].0, "250Mi");
        assert_eq!(r.upper_bound.as_ref().unwrap()["cpu"].0, "50m");
        assert_eq!(r.sample_count, 10);
        assert!(s.update_time.is_some());
        let obj = object("x", "uid-x", s);
        let owner = &obj.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "x", "uid-x")
        );
        assert_eq!(obj.metadata.name.as_deref(), Some("x"));
    }

    #[test]
    fn the_cap_and_its_reason_are_published() {
        use nodewarden_api::rightsizing::{CapReason, CappedResources};
        let mut e = entry(25, 262_144_000);
        e.upper = Some(Figures {
            cpu_milli: Some(4000),
            memory_bytes: Some(16 << 30),
        });
        e.capped = Some(Capped {
            upper_bound: Some(CappedResources {
                cpu: Some(CapReason::NodeAllocatable),
                memory: Some(CapReason::NodeAllocatable),
            }),
            history: "2m".into(),
            ..Capped::default()
        });
        let s = spec(&snap(&[("app", e)]), 1_763_708_400_000);
        let json = serde_json::to_value(&s.recommendations[0]).unwrap();
        assert_eq!(
            json["upperBound"],
            serde_json::json!({"cpu": "4", "memory": "16Gi"})
        );
        assert_eq!(
            json["capped"],
            serde_json::json!({"upperBound": {"cpu": "NodeAllocatable", "memory": "NodeAllocatable"}, "history": "2m"})
        );
        // not capped: no field at all
        let s = spec(&snap(&[("app", entry(25, 262_144_000))]), 1_763_708_400_000);
        assert!(
            serde_json::to_value(&s.recommendations[0])
                .unwrap()
                .get("capped")
                .is_none()
        );
    }

    #[test]
    fn the_nodes_allocatable_is_read_from_its_status() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "3920m", "memory": "15Gi", "pods": "110"}}
        }))
        .unwrap();
        assert_eq!(
            allocatable_of(&node),
            Figures {
                cpu_milli: Some(3920),
                memory_bytes: Some(15 << 30),
            }
        );
        // missing or unreadable: no cap for that resource
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "lots", "memory": "0"}}
        }))
        .unwrap();
        assert_eq!(allocatable_of(&node), Figures::default());
        assert_eq!(allocatable_of(&Node::default()), Figures::default());
    }
}
