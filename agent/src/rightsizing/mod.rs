//! Per-node right-sizing on the node: measures the autoscaled DaemonSet containers of this node,
//! recommends their requests with the VPA estimator, publishes `NodeRecommendation/<node>`, and
//! makes running pods follow those figures. Pure logic apart from I/O:
//! - [`args`]: its flags, [`RightsizingArgs`](args::RightsizingArgs), one field of the agent's
//!   [`Config`](crate::config::Config),
//! - [`checkpoint`]: the history on disk,
//! - [`pods`]: watches of this node's pods and of autoscalers, and their join,
//! - [`publish`]: how `NodeRecommendation` is written (when: the estimator's `due`),
//! - [`sampler`]: one sample tick tying the above together (it reads the containers through
//!   [`cgroup`](crate::cgroup)),
//! - [`seed`]: the histories of containers without a checkpointed one, from Prometheus (`--history-prometheus-url`),
//! - [`seed_later`]: the same for containers first seen after the start, off the sampling loop,
//! - [`run`]: the loop that ties them together on the node (started by the crate's `run`),
//! - [`update`]: the updater: running pods of this node follow its figures (resize or evict).
//!
//! The estimator itself (histograms, histories, a container's policy, the published figures) is
//! the `nodewarden-estimator` crate, which `kubectl nodewarden report` uses too.
//!
//! The rules the webhook applies too (which autoscaler and container policy apply to a pod, the
//! figures a pod gets, resize, evict or leave) are the api crate's `domain` module. Semantics for users: docs/rightsizing.md and docs/agent.md.

pub mod args;
pub mod checkpoint;
pub mod pods;
pub mod publish;
pub mod run;
pub mod sampler;
pub mod seed;
pub mod seed_later;
pub mod update;
