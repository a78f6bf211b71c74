//! The pure part of right-sizing, shared by the webhook (new pods) and the agent (running pods): (pod, autoscaler, this node's targets, fleet targets, limit
//! ranges) → a JSON Patch and the annotations that explain it.
//!
//! Amounts are integers: CPU in millicores, memory in bytes. Quantities written into the pod use
//! the one canonical form the agent writes too ([`format_amount`], from `nodewarden-api`): CPU as whole cores (`2`) when exact, else millicores
//! (`250m`); memory with the largest binary suffix that divides it exactly (`1Gi`, `300Mi`,
//! `512Ki`), else plain bytes (`314572801`).
//!
//! The patch only ever uses `add` operations (which create a member or replace its value), creates
//! `metadata.annotations`, `resources`, `resources.requests` and `resources.limits` when they are
//! missing, and touches only `spec.containers` and the native sidecars of `spec.initContainers`
//! (init containers with `restartPolicy: Always`, sized exactly as containers; run-to-completion
//! init containers are never touched). It never removes a field. Applying the webhook to
//! its own output gives the same pod: every figure is a function of the recommendation and of
//! the pod's current values in a way that is stable once applied, and the annotations describe the
//! resulting values rather than the difference.
//!
//! By concept:
//! - [`facts`](self::facts): what the decision reads of a pod ([`PodFacts`], [`Amounts`]),
//! - [`figures`](self::figures): the node's, its group's and the fleet's figures
//!   ([`StatusFigures`]) and the fleet percentile ([`fleet_from_nodes`]),
//! - [`node`](self::node): the node a pod is for ([`target_node`]),
//! - [`plan`](self::plan): which container gets which figure ([`Source`]), and its caps ([`Cap`]),
//! - [`limit_ranges`](self::limit_ranges): the LimitRanges' bounds,
//! - [`decision`](self::decision): the patch and its annotations ([`mutate_on`]), or the same
//!   figures without a patch ([`sizing_on`]).

mod decision;
mod facts;
mod figures;
mod limit_ranges;
mod node;
mod plan;
#[cfg(test)]
mod tests;

pub use crate::domain::patch::AddPatch;
pub use crate::quantity::{amount, amount_of, format_amount};
pub use decision::{
    ANNOTATION_AUTOSCALER, ANNOTATION_CAPPED, ANNOTATION_NODE, ANNOTATION_PREFIX, ANNOTATION_SKIPPED,
    ANNOTATION_SOURCE, ANNOTATION_UPDATES, ContainerSizing, Decision, Reason, mutate, mutate_on,
    sizing_and_sources_on, sizing_on,
};
pub use facts::{Amounts, ContainerFacts, PodFacts, ResourceFacts, Targets, effective_requests, is_sidecar};
pub use figures::{
    FLEET_MEDIAN_MULTIPLE, Figures, StatusFigures, fleet_from_nodes, fleet_percentile, fleet_targets,
    group_targets, node_targets, p90, percentile, status_figures,
};
pub use limit_ranges::in_namespace;
pub use node::{NO_SPEC, node_of, target_node};
pub use plan::{Cap, MAX_SCALED_LIMIT, Source};
