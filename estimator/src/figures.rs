//! The figures one container publishes: the estimate within its policy and its node, in
//! whole millicores and bytes, and the `NodeRecommendation` they make.
//!
//! The agent publishes these ([`entry`] each sample tick), and `kubectl nodewarden report
//! --prometheus` prints the same from the same histories, so the report of a node is what that
//! node's agent publishes.
//!
//! Nothing before the first measurement, nothing above the node: see [`entry`] and
//! docs/estimator.md.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use nodewarden_api::quantity::{amount, format_amount};
use nodewarden_api::rightsizing::{
    CapReason, Capped, CappedResources, ContainerRecommendation, NodeRecommendation, NodeRecommendationSpec,
    NodeSummary, ResourceName, history_text,
};

use crate::policy::{Key, Policy};
use crate::recommender::{Estimate, History, Resources};

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

fn ceil_u64(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        // saturating float → int conversion
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.ceil() as u64;
        n
    } else {
        0
    }
}

/// The lower of `maxAllowed` and the node's allocatable, with which one it is (maxAllowed on a
/// tie: the user's own word).
fn cap_of(max: Option<f64>, allocatable: Option<u64>) -> Option<(f64, CapReason)> {
    let node = allocatable.map(|a| (a as f64, CapReason::NodeAllocatable));
    match (max.map(|m| (m, CapReason::MaxAllowed)), node) {
        (Some(m), Some(a)) => Some(if a.0 < m.0 { a } else { m }),
        (m, a) => m.or(a),
    }
}

/// One figure (millicores or bytes) within the policy and the node: raised to `minAllowed`,
/// then held at the cap, with the cap's reason when it held it. `None`: VPA's figure is
/// unbounded (no confidence), so the cap is the figure, or none without one.
fn within(
    v: Option<f64>,
    min: Option<f64>,
    cap: Option<(f64, CapReason)>,
) -> (Option<u64>, Option<CapReason>) {
    let v = v.map(|v| min.map_or(v, |m| v.max(m)));
    match (v, cap) {
        (Some(v), Some((c, why))) if ceil_u64(v) > ceil_u64(c) => (Some(ceil_u64(c)), Some(why)),
        (None, Some((c, why))) => (Some(ceil_u64(c)), Some(why)),
        (v, _) => (v.map(ceil_u64), None),
    }
}

/// One figure of each resource within the policy and the node; `None` for a resource the
/// autoscaler does not control or that has no measurement yet.
fn bounded(
    r: Option<Resources>,
    policy: &Policy,
    node: Figures,
    measured: (bool, bool),
) -> (Figures, CappedResources) {
    let l = &policy.limits;
    let f = |v: Option<u64>| v.map(|v| v as f64);
    let (cpu, cpu_why) = within(
        r.map(|r| r.cpu_cores * 1000.0),
        f(l.min.cpu),
        cap_of(f(l.max.cpu), node.cpu_milli),
    );
    let (memory, memory_why) = within(
        r.map(|r| r.memory_bytes),
        f(l.min.memory),
        cap_of(f(l.max.memory), node.memory_bytes),
    );
    let cpu_on = policy.cpu && measured.0;
    let memory_on = policy.memory && measured.1;
    (
        Figures {
            cpu_milli: cpu.filter(|_| cpu_on),
            memory_bytes: memory.filter(|_| memory_on),
        },
        CappedResources {
            cpu: cpu_why.filter(|_| cpu_on),
            memory: memory_why.filter(|_| memory_on),
        },
    )
}

/// The published entry for one history: the estimate within the container policy and the
/// node's allocatable (`node`: millicores and bytes, `None` each when not known).
///
/// Nothing before the first measurement: `None` for a history without a CPU sample, unless an
/// OOM kill was seen (then memory figures only: the kill is a measurement, CPU has none yet).
/// No figure above the node's allocatable or `maxAllowed`: where VPA's is, the cap is published
/// and `capped` says which and on how much history; with a single CPU sample VPA's upper bound
/// is unbounded, so the upper bound is the cap (none when no cap is known).
pub fn entry(
    estimate: &Estimate,
    history: &History,
    policy: &Policy,
    requests: (Option<u64>, Option<u64>),
    node: Figures,
) -> Option<Entry> {
    let cpu_measured = history.sample_count > 0;
    if !cpu_measured && history.oom_count == 0 {
        return None;
    }
    let measured = (cpu_measured, true);
    let (target, target_why) = bounded(Some(estimate.target), policy, node, measured);
    let (lower, lower_why) = bounded(Some(estimate.lower_bound), policy, node, measured);
    let (upper, upper_why) = bounded(estimate.upper_bound, policy, node, measured);
    let upper = (upper.cpu_milli.is_some() || upper.memory_bytes.is_some()).then_some(upper);
    let raw = |v: f64, on: bool| on.then(|| ceil_u64(v));
    let uncapped_target = Figures {
        cpu_milli: raw(estimate.target.cpu_cores * 1000.0, policy.cpu && cpu_measured),
        memory_bytes: raw(estimate.target.memory_bytes, policy.memory),
    };
    let some = |c: CappedResources| (!c.is_empty()).then_some(c);
    let capped = Capped {
        target: some(target_why),
        lower_bound: some(lower_why),
        upper_bound: some(upper_why),
        // a span of 0 is one sample (or an OOM kill alone): said as such, not as "0s"
        history: match history.sample_count {
            0 => "no CPU sample".to_string(),
            1 => "1 sample".to_string(),
            _ => history_text(history.last_sample_ms - history.first_sample_ms),
        },
    };
    let any = capped.target.is_some() || capped.lower_bound.is_some() || capped.upper_bound.is_some();
    Some(Entry {
        target,
        lower,
        upper,
        uncapped_target,
        capped: any.then_some(capped),
        request_cpu_milli: requests.0,
        request_memory_bytes: requests.1,
        sample_count: history.sample_count,
        first_sample_ms: history.first_sample_ms,
        last_sample_ms: history.last_sample_ms,
        oom_count: history.oom_count,
    })
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::Limits;
    use crate::recommender::{EstimatorConfig, MIB};
    use nodewarden_api::domain::sizing::Amounts;
    use nodewarden_api::rightsizing::AutoscalerRef;

    pub(crate) fn key(c: &str) -> Key {
        Key {
            autoscaler: AutoscalerRef {
                namespace: "mon".into(),
                name: "agent".into(),
            },
            container: c.into(),
        }
    }

    pub(crate) fn sized(cpu: u64, mem: u64) -> Entry {
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

    pub(crate) fn snap(entries: &[(&str, Entry)]) -> Snapshot {
        entries.iter().map(|(c, e)| (key(c), e.clone())).collect()
    }

    const T0: i64 = 1_700_000_000_000;
    const GIB: f64 = 1024.0 * MIB;

    /// A node of 4 cores and 16 GiB.
    const NODE: Figures = Figures {
        cpu_milli: Some(4000),
        memory_bytes: Some(16 << 30),
    };

    fn history(cpu: &[(i64, f64)], memory: &[(i64, f64)]) -> History {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        for &(t, v) in cpu {
            assert!(h.add_cpu(&cfg, t, v));
        }
        for &(t, v) in memory {
            assert!(h.add_memory(&cfg, t, v));
        }
        h
    }

    fn published(h: &History, policy: &Policy, node: Figures) -> Option<Entry> {
        let est = h.estimate(&EstimatorConfig::default(), 1);
        entry(&est, h, policy, (Some(500), None), node)
    }

    #[test]
    fn nothing_is_published_before_the_first_cpu_sample() {
        // memory only: VPA's aggregate has no sample and gives no recommendation
        let h = history(&[], &[(T0, 300.0 * MIB)]);
        assert_eq!(published(&h, &Policy::default(), NODE), None);
        // an OOM kill before any CPU sample is a measurement of memory: memory figures only
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.record_oom(&cfg, T0, 64.0 * MIB).unwrap();
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        assert_eq!(e.target.cpu_milli, None);
        assert_eq!(e.lower.cpu_milli, None);
        assert!(e.target.memory_bytes.unwrap() as f64 > 164.0 * MIB);
        assert_eq!(e.uncapped_target.cpu_milli, None);
    }

    #[test]
    fn a_single_sample_has_the_node_as_its_upper_bound() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        // VPA: upper unbounded (1e14); nodewarden: what the node has, and says so
        assert_eq!(e.upper, Some(NODE));
        let capped = e.capped.expect("capped");
        assert_eq!(
            capped.upper_bound,
            Some(CappedResources {
                cpu: Some(CapReason::NodeAllocatable),
                memory: Some(CapReason::NodeAllocatable),
            })
        );
        assert_eq!(capped.history, "1 sample");
        assert_eq!((capped.target, capped.lower_bound), (None, None));
        // lower: the floor (VPA's factor is 0); target: the one sample's bucket plus the margin
        assert_eq!(e.lower.cpu_milli, Some(25));
        assert!(e.target.cpu_milli.unwrap() < 200);
        // without a known cap, no upper bound (as before the node was read)
        let e = published(&h, &Policy::default(), Figures::default()).expect("an entry");
        assert_eq!((e.upper, e.capped), (None, None));
    }

    #[test]
    fn a_short_history_is_capped_at_the_node_and_a_long_one_is_vpas() {
        // two minutes at 273m and 300 MiB: VPA's upper bound is hundreds of cores
        let cpu: Vec<(i64, f64)> = (0..=12).map(|i| (T0 + i * 10_000, 0.273)).collect();
        let h = history(&cpu, &[(T0, 300.0 * MIB)]);
        let raw = h.estimate(&EstimatorConfig::default(), 1).upper_bound.unwrap();
        assert!(raw.cpu_cores > 100.0 && raw.memory_bytes > 100.0 * GIB, "{raw:?}");
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        assert_eq!(e.upper, Some(NODE));
        assert_eq!(e.capped.as_ref().map(|c| c.history.as_str()), Some("2m"));
        assert_eq!(
            e.capped.unwrap().describe(),
            "upper cpu+memory at node allocatable (history 2m)"
        );
        // a day at a sample a minute: VPA's bound (twice the p95) is below the node: kept
        let cpu: Vec<(i64, f64)> = (0..=1440).map(|i| (T0 + i * 60_000, 0.273)).collect();
        let h = history(&cpu, &[(T0, 300.0 * MIB)]);
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        let raw = h.estimate(&EstimatorConfig::default(), 1).upper_bound.unwrap();
        assert_eq!(
            e.upper.unwrap().cpu_milli,
            Some((raw.cpu_cores * 1000.0).ceil() as u64)
        );
        assert_eq!(e.capped, None);
    }

    #[test]
    fn max_allowed_below_the_node_is_the_cap_and_named() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let policy = Policy {
            limits: Limits {
                max: Amounts {
                    cpu: Some(1000),
                    memory: Some(64 << 30),
                },
                ..Limits::default()
            },
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(
            e.upper,
            Some(Figures {
                cpu_milli: Some(1000),
                memory_bytes: NODE.memory_bytes,
            })
        );
        assert_eq!(
            e.capped.unwrap().upper_bound,
            Some(CappedResources {
                cpu: Some(CapReason::MaxAllowed),
                memory: Some(CapReason::NodeAllocatable),
            })
        );
        // a target above the node (a tiny node, a big minAllowed) is held at the node too
        let policy = Policy {
            limits: Limits {
                min: Amounts {
                    cpu: Some(8000),
                    memory: None,
                },
                ..Limits::default()
            },
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(e.target.cpu_milli, Some(4000));
        assert_eq!(
            e.capped.unwrap().target.and_then(|t| t.cpu),
            Some(CapReason::NodeAllocatable)
        );
    }

    #[test]
    fn an_uncontrolled_resource_has_no_figure_and_no_cap() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let policy = Policy {
            memory: false,
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(
            e.upper,
            Some(Figures {
                cpu_milli: Some(4000),
                memory_bytes: None
            })
        );
        assert_eq!(e.capped.unwrap().upper_bound.unwrap().memory, None);
    }

    #[test]
    fn spec_has_quantities_in_the_canonical_format() {
        let s = spec(&snap(&[("app", sized(25, 262_144_000))]), 1_763_708_400_000);
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
        let mut e = sized(25, 262_144_000);
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
        let s = spec(&snap(&[("app", sized(25, 262_144_000))]), 1_763_708_400_000);
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
