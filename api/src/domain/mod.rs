//! Rules both the agent and the webhook decide by, written once.
//!
//! - [`rightsizing`]: which DaemonSet controls a pod, which autoscaler applies to it (the
//!   oldest wins), which container policy applies to a container,
//! - [`names`]: DNS names as Kubernetes checks them, and service-account names on the command
//!   line,
//! - the quantity codec, one canonical format, is [`crate::quantity`] (with the schemas that
//!   check quantities),
//! - [`sizing`]: the requests and limits a DaemonSet pod gets on its node (the webhook's patch
//!   for a new pod, the agent's resize of a running one),
//! - [`update`]: resize, evict or leave a running pod (VPA's updater rules),
//! - the Feature state names are
//!   [`FeatureState::as_str`](crate::features::FeatureState::as_str).

pub mod names;
pub mod patch;
pub mod rightsizing;
pub mod sizing;
pub mod update;
