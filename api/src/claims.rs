//! Cluster identity claims (KEP-2149).
//!
//! A `ClusterClaim` is a cluster-scoped name/value pair. The well-known claims `id.k8s.io`
//! (also `cluster.clusterset.k8s.io`) and `clusterset.k8s.io` identify the cluster and the
//! ClusterSet it belongs to; the webhook enforces their rules.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest claim value accepted, in bytes (128 KiB).
pub const MAX_VALUE_BYTES: usize = 128 * 1024;

/// A cluster-scoped claim about this cluster.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nodewarden.io",
    version = "v1alpha1",
    kind = "ClusterClaim",
    shortname = "clusterclaim",
    category = "nodewarden",
    derive = "PartialEq",
    doc = "A claim about this cluster, such as its ID (id.k8s.io) or the ClusterSet it belongs to (clusterset.k8s.io).",
    printcolumn(name = "Value", type_ = "string", json_path = ".spec.value"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterClaimSpec {
    /// The claimed value. Well-known claims restrict it further (see the nodewarden docs).
    #[schemars(length(min = 1, max = 131072))]
    pub value: String,
}
