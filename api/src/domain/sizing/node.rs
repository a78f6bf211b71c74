//! The node a DaemonSet pod is for.

use k8s_openapi::api::core::v1::Pod;

/// The node a DaemonSet pod is for: `spec.nodeName`, else the single
/// `matchFields metadata.name In [node]` term the DaemonSet controller sets.
pub fn target_node(pod: &Pod) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or(NO_SPEC)?;
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or_default();
    node_of(
        spec.node_name.as_deref(),
        terms.iter().map(|term| {
            term.match_fields.iter().flatten().map(|f| {
                (
                    f.key.as_str(),
                    f.operator.as_str(),
                    f.values.as_deref().unwrap_or_default(),
                )
            })
        }),
    )
}

/// Why [`target_node`] finds no node in a pod without a spec.
pub const NO_SPEC: &str = "the pod has no spec";

/// [`target_node`] of a pod whose `spec.nodeName` is `node_name` and whose required node
/// affinity has `terms`, each given as its `matchFields` (key, operator, values).
pub fn node_of<'a, T, F>(node_name: Option<&str>, terms: T) -> Result<String, String>
where
    T: ExactSizeIterator<Item = F>,
    F: Iterator<Item = (&'a str, &'a str, &'a [String])>,
{
    if let Some(name) = node_name.filter(|n| !n.is_empty()) {
        return Ok(name.to_string());
    }
    let term_count = terms.len();
    let mut nodes = Vec::new();
    for fields in terms {
        for (key, operator, values) in fields {
            if key == "metadata.name" && operator == "In" {
                nodes.extend(values.iter().cloned());
            }
        }
    }
    match nodes.as_slice() {
        [one] if term_count == 1 => Ok(one.clone()),
        [] => Err(
            "no spec.nodeName and no matchFields metadata.name In [node] term in the required node affinity"
                .to_string(),
        ),
        _ => Err(format!(
            "the required node affinity does not name exactly one node ({term_count} terms, nodes {nodes:?})"
        )),
    }
}
