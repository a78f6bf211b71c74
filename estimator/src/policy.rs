//! What an autoscaler's policy says about one container: whether CPU and memory are
//! recommended, and the bounds (`minAllowed`, `maxAllowed`) its figures stay within.
//!
//! The bounds are read with the same reader as the webhook's plan
//! ([`nodewarden_api::domain::sizing::Amounts::from_list`]: whole millicores and bytes, rounded
//! up), so the agent, `kubectl nodewarden report` and the webhook agree on them to the unit.

use nodewarden_api::domain::rightsizing::container_policy;
use nodewarden_api::domain::sizing::Amounts;
use nodewarden_api::rightsizing::{AutoscalerRef, ContainerMode, DaemonSetAutoscaler, ResourceName};

/// History key: one autoscaler, one container name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// The autoscaler.
    pub autoscaler: AutoscalerRef,
    /// The container's name.
    pub container: String,
}

/// `minAllowed` and `maxAllowed` of a container policy, in millicores and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Limits {
    /// Least to recommend.
    pub min: Amounts,
    /// Most to recommend.
    pub max: Amounts,
}

/// What the autoscaler's policy says about one container.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// Whether CPU is recommended.
    pub cpu: bool,
    /// Whether memory is recommended.
    pub memory: bool,
    /// Bounds of the recommendation.
    pub limits: Limits,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cpu: true,
            memory: true,
            limits: Limits::default(),
        }
    }
}

/// The policy for `container` of the pods `dsa` autoscales: `None` when the container's mode is
/// `Off`. The agent and `report --prometheus` both apply it.
pub fn policy_for(dsa: &DaemonSetAutoscaler, container: &str) -> Option<Policy> {
    let Some(p) = container_policy(dsa, container) else {
        return Some(Policy::default());
    };
    if p.mode == ContainerMode::Off {
        return None;
    }
    let controlled = p.controlled_resources.as_deref();
    let has = |r: ResourceName| controlled.is_none_or(|c| c.contains(&r));
    Some(Policy {
        cpu: has(ResourceName::Cpu),
        memory: has(ResourceName::Memory),
        limits: Limits {
            min: Amounts::from_list(p.min_allowed.as_ref()),
            max: Amounts::from_list(p.max_allowed.as_ref()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dsa(policies: serde_json::Value) -> DaemonSetAutoscaler {
        serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {
                "targetRef": {"kind": "DaemonSet", "name": "ds"},
                "resourcePolicy": {"containerPolicies": policies}
            }
        }))
        .unwrap()
    }

    #[test]
    fn bounds_are_read_as_the_webhook_reads_them() {
        let d = dsa(json!([
            {"containerName": "*", "controlledResources": ["memory"],
             "minAllowed": {"memory": "1Gi", "cpu": "0.0005"}, "maxAllowed": {"cpu": "2"}}
        ]));
        let p = policy_for(&d, "any").expect("a policy");
        assert!(!p.cpu && p.memory);
        assert_eq!(p.limits.min.memory, Some(1 << 30));
        // half a millicore rounds up, as the webhook's plan reads it
        assert_eq!(p.limits.min.cpu, Some(1));
        assert_eq!(p.limits.max.cpu, Some(2000));
        assert_eq!(p.limits.max.memory, None);
    }

    #[test]
    fn off_is_no_policy_and_none_is_the_default() {
        let d = dsa(json!([{"containerName": "sidecar", "mode": "Off"}]));
        assert_eq!(policy_for(&d, "sidecar"), None);
        assert_eq!(policy_for(&d, "main"), Some(Policy::default()));
    }
}
