//! Right-sizing rules the agent and the webhook share: they must pick the same autoscaler and
//! the same container policy for a pod, or the agent measures for one and the webhook applies
//! another.

use std::cmp::Ordering;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::rightsizing::{ContainerPolicy, DaemonSetAutoscaler};

/// The node a DaemonSet pod runs on or is meant for, as the DaemonSet controller says it
/// (Kubernetes' `GetTargetNodeName`): `spec.nodeName` when set, else the value of the single
/// required node-affinity term `matchFields: metadata.name In [<node>]`. The webhook reads the same
/// rule from the raw review (it parses only the fields it needs); this is the typed form for tools
/// that hold a whole `Pod` (the report, the tests).
pub fn daemonset_pod_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let [term] = terms.as_slice() else { return None };
    let [field] = term.match_fields.as_deref()? else {
        return None;
    };
    match (
        field.key.as_str(),
        field.operator.as_str(),
        field.values.as_deref()?,
    ) {
        ("metadata.name", "In", [node]) => Some(node.clone()),
        _ => None,
    }
}

/// The container policy name that applies to every container without a policy of its own.
pub const ANY_CONTAINER: &str = "*";

/// The name of the DaemonSet that controls a pod: its controller ownerReference of kind
/// `DaemonSet` in `apps/v1`.
pub fn controlling_daemonset(owners: &[OwnerReference]) -> Option<&str> {
    owners
        .iter()
        .find(|o| is_controlling_daemonset(o.controller, &o.kind, &o.api_version))
        .map(|o| o.name.as_str())
}

/// Whether an ownerReference with these fields is a pod's controlling DaemonSet (see
/// [`controlling_daemonset`]).
pub fn is_controlling_daemonset(controller: Option<bool>, kind: &str, api_version: &str) -> bool {
    controller == Some(true) && kind == "DaemonSet" && api_version == "apps/v1"
}

/// The order in which autoscalers of one DaemonSet take precedence: the oldest first, then by
/// name. The first one applies; the others are reported as conflicting.
pub fn precedence(a: &DaemonSetAutoscaler, b: &DaemonSetAutoscaler) -> Ordering {
    let created = |x: &DaemonSetAutoscaler| x.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// Every container policy of an autoscaler, in the order written (none without a
/// `resourcePolicy`).
pub fn container_policies(autoscaler: &DaemonSetAutoscaler) -> &[ContainerPolicy] {
    autoscaler
        .spec
        .resource_policy
        .as_ref()
        .map(|p| p.container_policies.as_slice())
        .unwrap_or_default()
}

/// Every container's policy, looked up in constant time: [`container_policy`] for a whole pod
/// in one pass over the policies, so a pod's work grows with its containers plus the policies,
/// not with their product.
pub struct PolicyLookup<'a> {
    named: HashMap<&'a str, &'a ContainerPolicy>,
    any: Option<&'a ContainerPolicy>,
}

impl<'a> PolicyLookup<'a> {
    /// The policies of `autoscaler`; of two policies with one name the first counts, as in
    /// [`container_policy`].
    pub fn of(autoscaler: &'a DaemonSetAutoscaler) -> Self {
        let mut named = HashMap::new();
        for policy in container_policies(autoscaler) {
            named.entry(policy.container_name.as_str()).or_insert(policy);
        }
        let any = named.get(ANY_CONTAINER).copied();
        PolicyLookup { named, any }
    }

    /// The policy of `container`: its own, else the `*` policy, else none.
    pub fn get(&self, container: &str) -> Option<&'a ContainerPolicy> {
        self.named.get(container).copied().or(self.any)
    }
}

/// The policy of a container: its own, else the `*` policy, else none.
pub fn container_policy<'a>(
    autoscaler: &'a DaemonSetAutoscaler,
    container: &str,
) -> Option<&'a ContainerPolicy> {
    let policies = container_policies(autoscaler);
    policies
        .iter()
        .find(|p| p.container_name == container)
        .or_else(|| policies.iter().find(|p| p.container_name == ANY_CONTAINER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn autoscaler(name: &str, created: Option<&str>, policies: serde_json::Value) -> DaemonSetAutoscaler {
        let mut metadata = serde_json::json!({"name": name, "namespace": "ns"});
        if let Some(t) = created {
            metadata["creationTimestamp"] = serde_json::json!(t);
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "DaemonSetAutoscaler",
            "metadata": metadata,
            "spec": {"targetRef": {"kind": "DaemonSet", "name": "ds"},
                     "resourcePolicy": {"containerPolicies": policies}},
        }))
        .expect("autoscaler")
    }

    #[test]
    fn the_oldest_autoscaler_wins_then_the_first_by_name() {
        let old = autoscaler("b", Some("2026-01-01T00:00:00Z"), serde_json::json!([]));
        let new = autoscaler("a", Some("2026-02-01T00:00:00Z"), serde_json::json!([]));
        assert_eq!(precedence(&old, &new), Ordering::Less);
        let twin = autoscaler("c", Some("2026-01-01T00:00:00Z"), serde_json::json!([]));
        assert_eq!(precedence(&old, &twin), Ordering::Less);
    }

    #[test]
    fn a_container_policy_of_its_own_beats_the_star() {
        let a = autoscaler(
            "a",
            None,
            serde_json::json!([{"containerName": "*", "mode": "Off"}, {"containerName": "app"}]),
        );
        assert_eq!(
            container_policy(&a, "app").map(|p| p.container_name.as_str()),
            Some("app")
        );
        assert_eq!(
            container_policy(&a, "sidecar").map(|p| p.container_name.as_str()),
            Some("*")
        );
        let none = autoscaler("n", None, serde_json::json!([]));
        assert!(container_policy(&none, "app").is_none());
        for (autoscaler, container) in [(&a, "app"), (&a, "sidecar"), (&a, "*"), (&none, "app")] {
            assert_eq!(
                PolicyLookup::of(autoscaler)
                    .get(container)
                    .map(|p| &p.container_name),
                container_policy(autoscaler, container).map(|p| &p.container_name),
                "{container}"
            );
        }
    }

    #[test]
    fn only_an_apps_v1_controller_daemonset_controls() {
        let owner = |kind: &str, api: &str, controller: bool| OwnerReference {
            api_version: api.to_string(),
            kind: kind.to_string(),
            name: format!("{kind}-{api}"),
            uid: "u".to_string(),
            controller: Some(controller),
            ..Default::default()
        };
        assert_eq!(
            controlling_daemonset(&[owner("DaemonSet", "apps/v1", false)]),
            None
        );
        assert_eq!(
            controlling_daemonset(&[owner("ReplicaSet", "apps/v1", true)]),
            None
        );
        assert_eq!(
            controlling_daemonset(&[
                owner("ReplicaSet", "apps/v1", false),
                owner("DaemonSet", "apps/v1", true)
            ]),
            Some("DaemonSet-apps/v1")
        );
    }
}
