//! The ClusterClaim guard (KEP-2149): who may write reserved claims, what the well-known claims
//! may hold, and in which order they may come and go.
//!
//! [`decide`] ([`rules`]) is a pure function of the request, the [`ClaimsPolicy`] and a [`ClaimView`] of the
//! other claims of the same API shape. [`ClaimsGuard`] is the admission [`Handler`](crate::admission::Handler): it reads the
//! watch caches through a [`ClaimView`], remembers the well-known writes it admitted until the
//! caches show them (`RecentWrites`, in [`presence`]), counts decisions and adds the audit annotation.
//!
//! The rules, in the order they are checked (the first that fails decides):
//!
//! | rule | applies to | denies |
//! |---|---|---|
//! | `reserved-name` | names `k8s.io`, `kubernetes.io` and names ending in `.k8s.io` or `.kubernetes.io` (so also `sigs.k8s.io`) | any write by a principal outside the allowed users, groups and service accounts |
//! | `value-size` | every claim, CREATE and UPDATE | an empty or missing `spec.value`, or one over 128 KiB |
//! | `id-format` | `id.k8s.io`, `cluster.clusterset.k8s.io` | a value that is not an RFC 1123 DNS label (or, with `--claims-id-subdomain`, a DNS subdomain under 128 characters for `cluster.clusterset.k8s.io`) |
//! | `id-lifespan` | the ID claims | changing the value of, or deleting, any ID claim while `clusterset.k8s.io` exists |
//! | `clusterset-requires-id` | `clusterset.k8s.io` | creating it while no ID claim exists |
//! | `clusterset-immutable` | `clusterset.k8s.io` | changing its value (leave and join again: delete, then create) |
//!
//! An UPDATE that keeps the value is not held to `value-size` and `id-format` (a value stored
//! before the guard was installed stays editable, as the API server ratchets its own rules).
//! Allowed decisions are labelled with the class of the claim: `id-claim`, `clusterset-claim`,
//! `reserved-name` (another reserved name, written by an allowed principal) or `custom-name`.

//!
//! Files: [`rules`] (the pure decision), [`presence`] (what the guard knows of the other claims:
//! the cache's view merged with its own recent writes), [`guard`] (the admission handler),
//! [`cache`] (the watch caches of the claim APIs), [`initializer`] (the leader's `id.k8s.io`
//! initializer).

pub mod cache;
pub mod guard;
pub mod initializer;
pub mod presence;
pub mod rules;

use std::fmt;

pub use cache::{ClaimCaches, ClaimsCache, ClaimsCacheOptions};
pub use guard::{ClaimsGuard, ClaimsObserver};
pub use nodewarden_api::domain::names::{
    MAX_LABEL_CHARS, ServiceAccountName, check_dns_label, check_dns_subdomain,
};
#[cfg(any(test, feature = "test-util"))]
pub use presence::StaticView;
pub use presence::{ClaimView, Presence, RECENT_WRITE_TTL};
pub use rules::{ClaimsPolicy, Decision, NameClass, Principals, Rule, classify, decide, is_reserved, quote};

/// Path of the claims webhook.
pub const ROUTE: &str = "/validate/claims";
/// Key of the audit annotation naming the rule of each decision. The API server prefixes it with
/// the webhook's name, so with the chart's webhook `claims.nodewarden.io` audit events carry
/// `claims.nodewarden.io/rule` (a key with a `/` of its own would be dropped by the API server).
pub const AUDIT_RULE_KEY: &str = "rule";
/// The ID claim as KEP-2149 first named it.
pub const ID_CLAIM: &str = "id.k8s.io";
/// The ID claim as the published standard (about-api) names it.
pub const CLUSTER_ID_CLAIM: &str = "cluster.clusterset.k8s.io";
/// The ClusterSet membership claim.
pub const CLUSTERSET_CLAIM: &str = "clusterset.k8s.io";
/// Both names that hold the cluster's ID.
pub const ID_CLAIMS: [&str; 2] = [ID_CLAIM, CLUSTER_ID_CLAIM];
/// Largest claim value, in bytes (128 KiB).
pub const MAX_VALUE_BYTES: usize = nodewarden_api::claims::MAX_VALUE_BYTES;
/// Longest `cluster.clusterset.k8s.io` value in subdomain mode ("under 128 characters").
pub const MAX_SUBDOMAIN_ID_CHARS: usize = 127;
/// How much of a value a message quotes.
const QUOTE_CHARS: usize = 64;

/// Flags of the claims guard and the ID initializer.
#[derive(clap::Args, Debug, Clone)]
pub struct ClaimsArgs {
    /// Users allowed to write reserved claims (`*.k8s.io`, `*.kubernetes.io`), comma-separated.
    #[arg(long, env = "NODEWARDEN_CLAIMS_ALLOWED_USERS", value_delimiter = ',')]
    pub claims_allowed_users: Vec<String>,

    /// Groups allowed to write reserved claims, comma-separated.
    #[arg(
        long,
        env = "NODEWARDEN_CLAIMS_ALLOWED_GROUPS",
        value_delimiter = ',',
        default_value = "system:masters"
    )]
    pub claims_allowed_groups: Vec<String>,

    /// Service accounts allowed to write reserved claims, comma-separated, each
    /// `namespace:name` or `system:serviceaccount:namespace:name`.
    #[arg(long, env = "NODEWARDEN_CLAIMS_ALLOWED_SERVICE_ACCOUNTS", value_delimiter = ',', value_parser = parse_service_account)]
    pub claims_allowed_service_accounts: Vec<Option<ServiceAccountName>>,

    /// Accept an RFC 1123 DNS subdomain (under 128 characters) as the value of
    /// `cluster.clusterset.k8s.io`, as the published standard permits; otherwise it must be a
    /// DNS label like `id.k8s.io`.
    #[arg(long, env = "NODEWARDEN_CLAIMS_ID_SUBDOMAIN", action = clap::ArgAction::Set, default_value_t = false)]
    pub claims_id_subdomain: bool,

    /// How often to look for claim APIs (about.k8s.io ClusterProperty, Open Cluster Management
    /// ClusterClaim) installed after start-up.
    #[arg(long, env = "NODEWARDEN_CLAIMS_DISCOVERY_INTERVAL", default_value = "1m", value_parser = nodewarden_runtime::duration::parse_interval)]
    pub claims_discovery_interval: std::time::Duration,

    /// Let the leader create `id.k8s.io` with the kube-system namespace UID when no ID claim
    /// exists (never overwrites one).
    #[arg(long, env = "NODEWARDEN_CLAIMS_INITIALIZE_ID", action = clap::ArgAction::Set, default_value_t = false)]
    pub claims_initialize_id: bool,

    /// How often the ID initializer checks that an ID claim exists.
    #[arg(long, env = "NODEWARDEN_CLAIMS_INITIALIZE_INTERVAL", default_value = "1m", value_parser = nodewarden_runtime::duration::parse_interval)]
    pub claims_initialize_interval: std::time::Duration,
}

impl ClaimsArgs {
    /// The claims guard's settings from the flags.
    pub fn policy(&self) -> ClaimsPolicy {
        ClaimsPolicy {
            principals: Principals::new(
                self.claims_allowed_users.iter().cloned(),
                self.claims_allowed_groups.iter().cloned(),
                self.claims_allowed_service_accounts.iter().flatten().cloned(),
            ),
            id_subdomain: self.claims_id_subdomain,
        }
    }
}

/// The three APIs that carry claims, all cluster-scoped with the value at `spec.value`. Each is a
/// set of claims of its own: the cross-object rules only look at claims of the same shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    /// `nodewarden.io/v1alpha1` `ClusterClaim` (nodewarden's own CRD).
    Nodewarden,
    /// `about.k8s.io` `ClusterProperty` (the about-api CRD, v1alpha1 and v1beta1).
    About,
    /// `cluster.open-cluster-management.io/v1alpha1` `ClusterClaim` (Open Cluster Management).
    OpenClusterManagement,
}

impl Shape {
    /// Every shape, in the order discovery looks for them.
    pub const ALL: [Shape; 3] = [Shape::Nodewarden, Shape::About, Shape::OpenClusterManagement];

    /// The API group.
    pub fn group(self) -> &'static str {
        match self {
            Shape::Nodewarden => "nodewarden.io",
            Shape::About => "about.k8s.io",
            Shape::OpenClusterManagement => "cluster.open-cluster-management.io",
        }
    }

    /// The kind.
    pub fn kind(self) -> &'static str {
        match self {
            Shape::Nodewarden | Shape::OpenClusterManagement => "ClusterClaim",
            Shape::About => "ClusterProperty",
        }
    }

    /// The plural resource name.
    pub fn plural(self) -> &'static str {
        match self {
            Shape::Nodewarden | Shape::OpenClusterManagement => "clusterclaims",
            Shape::About => "clusterproperties",
        }
    }

    /// The shape whose API group is `group`.
    pub fn from_group(group: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.group() == group)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.group(), self.kind())
    }
}

/// A service account, or nothing for an empty entry (an empty list in an environment variable).
fn parse_service_account(s: &str) -> Result<Option<ServiceAccountName>, String> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    s.parse().map(Some)
}
