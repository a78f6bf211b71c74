//! Rules both the agent and the webhook decide by, written once.
//!
//! - [`rightsizing`]: which DaemonSet controls a pod, which autoscaler applies to it (the
//!   oldest wins), which container policy applies to a container,
//! - [`names`]: DNS names as Kubernetes checks them, and service-account names on the command
//!   line,
//! - [`quantity`]: the quantity codec, one canonical format,
//! - the Feature state names are
//!   [`FeatureState::as_str`](crate::features::FeatureState::as_str).

pub mod names;
pub mod quantity;
pub mod rightsizing;
