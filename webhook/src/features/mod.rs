//! The disabled-field guard of the feature lifecycle (KEP-3920), at `/validate/features`.
//!
//! One route serves two kinds of request, told apart by `request.kind`:
//! * `Feature` objects (`nodewarden.io`): every owned field's path must parse ([`FieldPath`]);
//!   a Feature with an invalid path is rejected with the reason.
//! * any other resource (built-in or custom, read as raw JSON): for every Feature that counts as
//!   off (`status.state` `Off` or `TurningOff`; desired `Off` with no state yet), a CREATE or
//!   UPDATE that sets one of its fields on that resource is denied (`Deny`, `Clear`) or admitted
//!   with a warning (`Warn`).
//!
//! Ratcheting, as the API server's drop-disabled-fields rule does it: an UPDATE whose old
//! object already used the field *anywhere* (any instance of the path, any value) is admitted,
//! whatever it now sets at that path, so existing objects stay editable. A CREATE has no old
//! object. This is per owned field: using field A does not let a write start using field B.
//!
//! The resource is matched on API group and plural resource name; the version is not compared,
//! so a path must mean the same thing in every served version of the resource.

//! Files: [`rules`] (the pure checks, shared with the lifecycle controller), [`path`] (owned
//! field paths), [`guard`] (the admission handler), [`cache`] (Features and NodeFeatureReports
//! watched into memory), [`controller`] (the lifecycle controller the leader runs).

pub mod cache;
pub mod controller;
pub mod guard;
pub mod lifecycle;
pub mod path;
pub mod rules;

use nodewarden_api::features::FeatureState;

pub use cache::FeatureCaches;
pub use guard::FeaturesGuard;
pub use path::{FieldPath, PathError};
pub use rules::{
    GuardIndex, GuardedField, effective_state, feature_key, guard_index, is_guarded, review_feature,
    review_owned, validate_spec,
};

/// Path of the features webhook.
pub const ROUTE: &str = "/validate/features";
/// Longest warning sent back (the API server truncates longer ones).
pub const MAX_WARNING: usize = 119;

/// Flags of the Feature lifecycle controller.
#[derive(clap::Args, Debug, Clone)]
pub struct FeaturesArgs {
    /// Run the Feature lifecycle controller in the leader (transitions, uses, ClearField).
    #[arg(long, env = "NODEWARDEN_FEATURES_CONTROLLER", action = clap::ArgAction::Set, default_value_t = true)]
    pub features_controller: bool,

    /// Objects per list page of a Feature's ClearField task.
    #[arg(long, env = "NODEWARDEN_FEATURES_CLEAR_PAGE_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub features_clear_page_size: u32,

    /// Most objects per second a ClearField task patches.
    #[arg(long, env = "NODEWARDEN_FEATURES_CLEAR_RATE", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub features_clear_rate: u32,

    /// How often the leader looks at every Feature, besides when a Feature or report changes.
    #[arg(long, env = "NODEWARDEN_FEATURES_RESYNC_INTERVAL", default_value = "10s", value_parser = nodewarden_runtime::duration::parse_interval)]
    pub features_resync_interval: std::time::Duration,
}

/// How the guard decided, as counted in `nodewarden_features_decisions_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No field of an off feature was set.
    Allowed,
    /// A field of an off feature was set, but the old object already used it.
    Ratcheted,
    /// Admitted with a warning (`Warn`).
    Warned,
    /// Denied (`Deny`, `Clear`).
    Denied,
    /// A Feature object was accepted.
    FeatureAccepted,
    /// A Feature object was rejected (invalid field path).
    FeatureRejected,
}

impl Decision {
    /// The `outcome` label of `nodewarden_features_decisions_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Ratcheted => "ratcheted",
            Decision::Warned => "warned",
            Decision::Denied => "denied",
            Decision::FeatureAccepted => "feature-accepted",
            Decision::FeatureRejected => "feature-rejected",
        }
    }
}

/// Receives the guard's decisions (the webhook's metrics).
pub trait FeaturesObserver: Send + Sync {
    /// One decision of the guard.
    fn decided(&self, decision: Decision);
    /// A Feature entered `state`.
    fn transitioned(&self, _state: FeatureState) {}
}
