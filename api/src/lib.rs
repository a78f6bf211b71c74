//! nodewarden's custom resources, group `nodewarden.io`, version `v1alpha1`.
//!
//! One module per capability, named as in the webhook, the agent and the chart:
//! - [`rightsizing`]: `DaemonSetAutoscaler` (users) and `NodeRecommendation` (the agent on each node),
//! - [`claims`]: `ClusterClaim` (KEP-2149),
//! - [`features`]: `Feature` (KEP-3920) and `NodeFeatureReport` (the agent on each node).
//!
//! The CRD YAML under `charts/nodewarden/crds/` is generated from these types by `cargo xtask crdgen`
//! ([`crdgen::files`]); a test fails when the committed files drift.

#![warn(missing_docs)]
// `#[kube(printcolumn(..))]` repeats `type_ = ..` by design; clippy reads that as a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

pub mod claims;
pub mod crdgen;
pub mod domain;
pub mod features;
pub mod quantity;
pub mod rightsizing;

/// The API group of every nodewarden kind.
pub const GROUP: &str = "nodewarden.io";
/// The API version of every nodewarden kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as it appears in objects.
pub const API_VERSION: &str = "nodewarden.io/v1alpha1";

pub use claims::{ClusterClaim, ClusterClaimSpec};
pub use features::{Feature, FeatureSpec, FeatureStatus, NodeFeatureReport, NodeFeatureReportSpec};
pub use rightsizing::{
    DaemonSetAutoscaler, DaemonSetAutoscalerSpec, DaemonSetAutoscalerStatus, NodeRecommendation,
    NodeRecommendationSpec,
};
