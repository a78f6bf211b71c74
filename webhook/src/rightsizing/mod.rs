//! Per-node right-sizing of DaemonSet pods (KEP-4943, VPA `scope: node`).
//!
//! * [`sizing::mutate`](nodewarden_api::domain::sizing::mutate) (in the api crate, shared with the agent): the pure decision, (pod,
//!   autoscaler, node targets, fleet, LimitRanges) → JSON Patch + annotations.
//! * [`PodMutator`]: the `/mutate/pods` handler. Pod CREATE → controller owner DaemonSet →
//!   its autoscaler → the pod's node → that node's targets → the decision. Everything comes
//!   from the in-memory [`RightsizingCache`]; no API call on the request path.
//! * [`AutoscalerValidator`]: the `/validate/autoscalers` handler: bounds and one autoscaler per
//!   DaemonSet.
//! * [`controller`]: the controller that keeps `DaemonSetAutoscaler.status`.
//!
//! Semantics, annotations and caps are described for users in docs/rightsizing.md.

//! Files: [`guard`] (the two admission handlers), `view` (the fields of a pod the pod handler
//! reads, decoded in the same pass as the review), [`rules`] (an autoscaler's own checks, shared
//! with the status controller), [`cache`] (what the handlers read, watched into memory),
//! [`controller`] (the status controller the leader runs).

pub mod cache;
pub mod controller;
pub mod guard;
pub mod rules;
mod view;

pub use cache::{Prepared, RightsizingCache};
pub use guard::{AutoscalerValidator, PodMutator, RightsizingObserver};
pub use nodewarden_api::domain::sizing::{Decision, Reason, Source, Targets};
pub use rules::{MAX_PROBLEMS_NAMED, validate_autoscaler};
pub use view::{MAX_CONTAINER_POLICIES, MAX_POD_CONTAINERS, PodView};

/// Path of the pod mutation webhook.
pub const MUTATE_ROUTE: &str = "/mutate/pods";
/// Path of the autoscaler validation webhook.
pub const VALIDATE_ROUTE: &str = "/validate/autoscalers";

/// Flags of right-sizing (the status controller the leader runs).
#[derive(clap::Args, Debug, Clone)]
pub struct RightsizingArgs {
    /// How often the leader recomputes every DaemonSetAutoscaler's status (nodes with a
    /// recommendation, fleet figure, conditions).
    #[arg(long, env = "NODEWARDEN_RIGHTSIZING_STATUS_INTERVAL", default_value = "15s", value_parser = nodewarden_runtime::duration::parse_interval)]
    pub rightsizing_status_interval: std::time::Duration,
}
