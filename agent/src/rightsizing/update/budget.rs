//! A DaemonSet's disruption budget on this node and the leases agents take before they evict:
//! at most the rollout's `maxUnavailable` pods down at once, all nodes together.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

use crate::rightsizing::pods::NodePod;

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

pub(super) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

pub(super) fn lease_live(lease: &Lease, now: Timestamp) -> bool {
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

pub(super) fn ready(pod: &NodePod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn lease_tags_are_stable_and_distinct() {
        assert_eq!(lease_tag("ns", "ds"), lease_tag("ns", "ds"));
        assert_ne!(lease_tag("ns", "ds"), lease_tag("n", "sds"));
        assert_eq!(lease_tag("ns", "ds").len(), 16);
    }
}
