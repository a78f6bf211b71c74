//! The decision: a pod's patch and the annotations that explain it ([`mutate_on`]), or the same
//! figures without a patch ([`sizing_on`]).

use std::collections::BTreeMap;

use super::facts::{Amounts, ContainerFacts, PodFacts};
use super::figures::Figures;
use super::limit_ranges::Ranges;
use super::node::target_node;
use super::plan::{Plan, Source, by_container, capped_plan, scaled_limit};
use crate::domain::patch::AddPatch;
use crate::quantity::format_amount;
use crate::rightsizing::{DaemonSetAutoscaler, UpdateMode};
use k8s_openapi::api::core::v1::{LimitRange, Pod};

/// Prefix of every annotation the webhook sets on a pod.
pub const ANNOTATION_PREFIX: &str = "rightsizing.nodewarden.io/";
/// The autoscaler that decided (its name; it lives in the pod's namespace).
pub const ANNOTATION_AUTOSCALER: &str = "rightsizing.nodewarden.io/autoscaler";
/// The node whose figures were used.
pub const ANNOTATION_NODE: &str = "rightsizing.nodewarden.io/node";
/// Per container, where the figures came from.
pub const ANNOTATION_SOURCE: &str = "rightsizing.nodewarden.io/source";
/// Per container, the requests and limits the webhook set.
pub const ANNOTATION_UPDATES: &str = "rightsizing.nodewarden.io/updates";
/// Per container and resource, the caps that bounded the recommendation.
pub const ANNOTATION_CAPPED: &str = "rightsizing.nodewarden.io/capped";
/// Why the pod was left as it was, when nothing could be decided.
pub const ANNOTATION_SKIPPED: &str = "rightsizing.nodewarden.io/skipped";

/// Why a pod came out as it did (bounded, for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Requests or limits were changed.
    Resized,
    /// The autoscaler applied but every figure already matched (or every container was left as is).
    Unchanged,
    /// `updateMode: Off`: the autoscaler only recommends.
    UpdateModeOff,
    /// The pod names no single node.
    NoTargetNode,
    /// A VerticalPodAutoscaler that updates pods targets the same DaemonSet: nodewarden yields.
    YieldsToVpa,
}

impl Reason {
    /// The `reason` label of `nodewarden_rightsizing_pods_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Resized => "resized",
            Reason::Unchanged => "unchanged",
            Reason::UpdateModeOff => "update-mode-off",
            Reason::NoTargetNode => "no-target-node",
            Reason::YieldsToVpa => "yields-to-vpa",
        }
    }
}

/// The outcome of [`mutate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Empty when the pod stays as it is (annotations included).
    pub patch: AddPatch,
    /// The annotations the patch sets.
    pub annotations: BTreeMap<String, String>,
    /// Why the pod came out as it did.
    pub reason: Reason,
    /// The node the pod is for, when it names one.
    pub node: Option<String>,
    /// Per container (in pod order), where its figures came from.
    pub sources: Vec<(String, Source)>,
}

/// Decides a DaemonSet pod's resources, finding its node with [`target_node`]; see [`mutate_on`].
pub fn mutate(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Decision {
    let node = target_node(pod);
    mutate_on(
        &PodFacts::of(pod),
        autoscaler,
        node.as_deref().map_err(String::as_str),
        figures,
        limit_ranges,
    )
}

/// Decides a DaemonSet pod's resources for its node, computed once by the caller.
///
/// * `node`: the node the pod is for ([`target_node`]), or why it names none.
/// * `figures`: this node's own targets, its group's and the fleet's ([`StatusFigures::for_node`](super::StatusFigures::for_node)). Each
///   container takes the first figure it has of: with `scope: Node` the node's own; with
///   `scope: NodeGroup` the group's, then the node's own; then by `coldStart`: `Template`
///   none (the template's requests stay), `Fleet` the fleet's, `Group` the group's, then the
///   fleet's.
/// * `limit_ranges`: the LimitRanges of the pod's namespace.
///
/// Four steps: `plan` (which container and resource gets which target), `cap_pod`
/// (LimitRanges of type Pod), `cap_containers` (per container caps), `patch`.
pub fn mutate_on(
    pod: &PodFacts,
    autoscaler: &DaemonSetAutoscaler,
    node: Result<&str, &str>,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Decision {
    let name = autoscaler.metadata.name.clone().unwrap_or_default();
    let mode = autoscaler.spec.update_mode();
    let mut annotations = BTreeMap::from([(ANNOTATION_AUTOSCALER.to_string(), name)]);
    // a pod left as the template says: only the annotations, saying why
    let left = |mut annotations: BTreeMap<String, String>, why: String, reason: Reason| {
        annotations.insert(ANNOTATION_SKIPPED.to_string(), why);
        Decision {
            patch: annotation_patch(pod, &annotations, &AddPatch::new()),
            annotations,
            reason,
            node: None,
            sources: Vec::new(),
        }
    };
    if mode == UpdateMode::Off {
        let why = "updateMode Off: the autoscaler only recommends; resources left as the template says";
        return left(annotations, why.to_string(), Reason::UpdateModeOff);
    }
    if let Some(vpa) = autoscaler.yields_to_vpa() {
        let why = format!("resources left as the template says: {vpa}");
        return left(annotations, why, Reason::YieldsToVpa);
    }
    let node = match node {
        Ok(node) => node.to_string(),
        Err(why) => {
            let why = format!("no single target node, resources left as the template says: {why}");
            return left(annotations, why, Reason::NoTargetNode);
        }
    };
    annotations.insert(ANNOTATION_NODE.to_string(), node.clone());

    let containers = pod.containers.as_slice();
    let ranges = Ranges::of(limit_ranges);
    let (plans, sources) = capped_plan(containers, autoscaler, figures, &ranges);
    let (ops, changed) = patch(&plans, containers, &ranges, &mut annotations);

    let mut source_text = String::new();
    for (c, s) in &sources {
        if !source_text.is_empty() {
            source_text.push_str(", ");
        }
        source_text.push_str(c);
        source_text.push('=');
        source_text.push_str(s.as_str());
    }
    annotations.insert(ANNOTATION_SOURCE.to_string(), source_text);
    let patch = annotation_patch(pod, &annotations, &ops);
    Decision {
        patch,
        annotations,
        reason: if changed {
            Reason::Resized
        } else {
            Reason::Unchanged
        },
        node: Some(node),
        sources,
    }
}

/// The requests and limits one container gets on its node: only the resources the decision
/// covers (a resource without a target, not controlled, or under a policy `Off` is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSizing {
    /// The container's name.
    pub name: String,
    /// Whether it is a native sidecar (an init container with `restartPolicy: Always`).
    pub sidecar: bool,
    /// The requests it gets.
    pub requests: Amounts,
    /// The limits it gets (`None` per resource: the limit is not the decision's to set, as with
    /// `RequestsOnly` or no limit at all).
    pub limits: Amounts,
}

/// What [`mutate_on`] gives `pod`'s containers on `node`, as figures instead of a patch: the
/// agent compares them with a running pod's and resizes it to exactly these. Pass the pod as
/// its DaemonSet's template makes it (the template's requests and limits), so `ceiling:
/// Template` and the limit ratio are those of the template, as for a new pod. `updateMode` is
/// not looked at (the caller decides what to do with the figures). Containers in pod order.
pub fn sizing_on(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> Vec<ContainerSizing> {
    sizing_and_sources_on(pod, autoscaler, figures, limit_ranges).0
}

/// [`sizing_on`], and where each container's figures came from (every container of the pod, in
/// pod order, also those that keep the template's figures): what `kubectl nodewarden report`
/// shows for a new pod on a node.
pub fn sizing_and_sources_on(
    pod: &Pod,
    autoscaler: &DaemonSetAutoscaler,
    figures: Figures,
    limit_ranges: &[LimitRange],
) -> (Vec<ContainerSizing>, Vec<(String, Source)>) {
    let pod = PodFacts::of(pod);
    let containers = pod.containers.as_slice();
    let ranges = Ranges::of(limit_ranges);
    let (plans, sources) = capped_plan(containers, autoscaler, figures, &ranges);
    let mut out = Vec::new();
    for (index, mine) in by_container(&plans) {
        let Some(container) = containers.get(index) else {
            continue;
        };
        let mut sizing = ContainerSizing {
            name: container.name.clone(),
            sidecar: container.sidecar.is_some(),
            ..ContainerSizing::default()
        };
        for plan in mine {
            sizing.requests.set(plan.resource, Some(plan.value));
            sizing
                .limits
                .set(plan.resource, scaled_limit(plan, plan.value, &ranges));
        }
        out.push(sizing);
    }
    (out, sources)
}

/// Step 4, the patch: `add` operations for the requests and limits that change, and the
/// `updates` and `capped` annotations. Returns the operations and whether any figure changed.
fn patch(
    plans: &[Plan],
    containers: &[ContainerFacts],
    ranges: &Ranges,
    annotations: &mut BTreeMap<String, String>,
) -> (AddPatch, bool) {
    // room for eight operations (a container's requests and limits, and their parents) of
    // about 70 bytes each without growing
    let mut ops = AddPatch::with_capacity(640);
    // the two annotations' text, written in place: `<container>: <resource> request <amount>
    // [limit <amount>], …; …` and `<container>: <resource> <cap>+<cap> (recommended <amount>),
    // …; …`
    let mut updates = String::new();
    let mut capped = String::new();
    let mut changed = false;
    for (index, mine) in by_container(plans) {
        let Some(container) = containers.get(index) else {
            continue;
        };
        // a sidecar's figures go to its place in `initContainers`
        let (list, place) = container.place(index);
        let index_token = place.to_string();
        let base = ["spec", list, index_token.as_str(), "resources"];
        let resources = container.resources;
        let mut has_resources = resources.is_some();
        let mut has_requests = resources.and_then(|r| r.requests).is_some();
        let mut has_limits = resources.and_then(|r| r.limits).is_some();
        if !updates.is_empty() {
            updates.push_str("; ");
        }
        updates.push_str(&container.name);
        updates.push_str(": ");
        let mut capped_any = false;
        for (i, plan) in mine.iter().enumerate() {
            let r = plan.resource;
            let request = plan.value;
            let limit = scaled_limit(plan, request, ranges);
            let request_text = format_amount(r, request);
            if i > 0 {
                updates.push_str(", ");
            }
            updates.push_str(r.as_str());
            updates.push_str(" request ");
            updates.push_str(&request_text);
            if plan.request != Some(request) {
                let parents = (&mut has_resources, &mut has_requests);
                add_amount(&mut ops, &base, parents, "requests", r.as_str(), &request_text);
                changed = true;
            }
            if let Some(limit) = limit {
                let limit_text = format_amount(r, limit);
                updates.push_str(" limit ");
                updates.push_str(&limit_text);
                if plan.own_limit != Some(limit) {
                    let parents = (&mut has_resources, &mut has_limits);
                    add_amount(&mut ops, &base, parents, "limits", r.as_str(), &limit_text);
                    changed = true;
                }
            }
            if !plan.caps.is_empty() {
                if capped_any {
                    capped.push_str(", ");
                } else {
                    if !capped.is_empty() {
                        capped.push_str("; ");
                    }
                    capped.push_str(&container.name);
                    capped.push_str(": ");
                    capped_any = true;
                }
                capped.push_str(r.as_str());
                capped.push(' ');
                for (j, cap) in plan.caps.iter().enumerate() {
                    if j > 0 {
                        capped.push('+');
                    }
                    capped.push_str(cap.as_str());
                }
                capped.push_str(" (recommended ");
                capped.push_str(&format_amount(r, plan.target));
                capped.push(')');
            }
        }
    }
    if !updates.is_empty() {
        annotations.insert(ANNOTATION_UPDATES.to_string(), updates);
    }
    if !capped.is_empty() {
        annotations.insert(ANNOTATION_CAPPED.to_string(), capped);
    }
    (ops, changed)
}

/// Adds `<base>/<map>/<resource>` (`map` is `requests` or `limits`), first adding `<base>`
/// (the container's `resources`) and `<base>/<map>` when the pod has neither yet; `parents`
/// records what exists so far.
fn add_amount(
    ops: &mut AddPatch,
    base: &[&str; 4],
    parents: (&mut bool, &mut bool),
    map: &str,
    resource: &str,
    amount: &str,
) {
    let (has_resources, has_map) = parents;
    if !*has_resources {
        ops.add_empty_object(base);
        *has_resources = true;
    }
    let [a, b, c, d] = *base;
    if !*has_map {
        ops.add_empty_object(&[a, b, c, d, map]);
        *has_map = true;
    }
    ops.add_str(&[a, b, c, d, map, resource], amount);
}

/// `add` operations for the annotations (creating `metadata.annotations` when missing), then
/// those of `then`.
fn annotation_patch(pod: &PodFacts, annotations: &BTreeMap<String, String>, then: &AddPatch) -> AddPatch {
    // room for all of it, so the text is written without growing: each operation's text is its
    // key and value and some 50 bytes around them
    let room = annotations
        .iter()
        .map(|(k, v)| k.len() + v.len() + 64)
        .sum::<usize>()
        + then.json_len()
        + 64;
    let mut ops = AddPatch::with_capacity(room);
    if !pod.has_annotations {
        ops.add_empty_object(&["metadata", "annotations"]);
    }
    for (key, value) in annotations {
        ops.add_str(&["metadata", "annotations", key.as_str()], value);
    }
    ops.append(then);
    ops
}
