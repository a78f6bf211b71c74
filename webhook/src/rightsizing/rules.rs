//! The checks of a `DaemonSetAutoscaler` on its own (bounds, node group label, one policy per
//! container), pure: the `/validate/autoscalers` handler denies with them and the status
//! controller reports them as `ConfigUnsupported`. The decision for a pod is the api crate's
//! [`sizing`](nodewarden_api::domain::sizing) module, shared with the agent.

use nodewarden_api::domain::names::check_label_key;
use nodewarden_api::domain::rightsizing::container_policies;
use nodewarden_api::domain::sizing;
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, ResourceName, Scope};

/// Most problems a denial names; the rest are counted (a message stays short however many
/// policies are wrong).
pub const MAX_PROBLEMS_NAMED: usize = 10;

/// The denial's message: the first [`MAX_PROBLEMS_NAMED`] problems, then how many more there are.
pub(super) fn denial(problems: &[String]) -> String {
    let mut message = problems
        .iter()
        .take(MAX_PROBLEMS_NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > MAX_PROBLEMS_NAMED {
        message.push_str(&format!(
            "; and {} more problems",
            problems.len() - MAX_PROBLEMS_NAMED
        ));
    }
    message
}

/// Problems of an autoscaler on its own: each names the field path and the offending values.
pub fn validate_autoscaler(autoscaler: &DaemonSetAutoscaler) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = &autoscaler.spec;
    match spec.node_group_label.as_deref() {
        None if spec.uses_groups() => problems.push(format!(
            "spec.nodeGroupLabel: required with {}: name the node label whose value groups the nodes, \
             e.g. node.kubernetes.io/instance-type",
            if spec.scope == Scope::NodeGroup {
                "scope NodeGroup"
            } else {
                "coldStart Group"
            }
        )),
        Some(key) => {
            if let Err(why) = check_label_key(key) {
                problems.push(format!(
                    "spec.nodeGroupLabel: {key:?} is not a label key: it {why}"
                ));
            }
        }
        None => {}
    }
    let policies = container_policies(autoscaler);
    // names seen so far: one lookup per policy, so many policies cost their number, not its square
    let mut seen = std::collections::HashSet::with_capacity(policies.len());
    for (i, policy) in policies.iter().enumerate() {
        let path = format!("spec.resourcePolicy.containerPolicies[{i}]");
        if !seen.insert(policy.container_name.as_str()) {
            problems.push(format!(
                "{path}.containerName: {:?} has a policy already; give each container (and `*`) one policy",
                policy.container_name
            ));
        }
        for resource in [ResourceName::Cpu, ResourceName::Memory] {
            let r = resource.as_str();
            let min = policy.min_allowed.as_ref().and_then(|l| l.get(r));
            let max = policy.max_allowed.as_ref().and_then(|l| l.get(r));
            if let (Some(min), Some(max)) = (min, max) {
                match (sizing::amount(resource, min), sizing::amount(resource, max)) {
                    (Some(lo), Some(hi)) if lo > hi => problems.push(format!(
                        "{path}: minAllowed.{r} {} is above maxAllowed.{r} {}; minAllowed must be at most maxAllowed",
                        min.0, max.0
                    )),
                    _ => {}
                }
            }
        }
    }
    problems
}
