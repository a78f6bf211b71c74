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

pub mod path;

use crate::caches::{Change, watch_into};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use kube::{Api, Client, Resource, ResourceExt};
use nodewarden_api::features::{
    DesiredState, Feature, FeatureSpec, FeatureState, NodeFeatureReport, OnDisable,
};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use path::{FieldPath, PathError};

use super::{AdmissionRequest, AdmissionResponse, Handler, Operation};

/// Path of the features webhook.
pub const ROUTE: &str = "/validate/features";
/// Longest warning sent back (the API server truncates longer ones).
pub const MAX_WARNING: usize = 119;

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
    fn decided(&self, decision: Decision);
    /// A Feature entered `state`.
    fn transitioned(&self, _state: FeatureState) {}
}

/// `namespace/name` of a Feature.
pub fn feature_key(feature: &Feature) -> String {
    format!(
        "{}/{}",
        feature.namespace().unwrap_or_default(),
        feature.name_any()
    )
}

/// The state a Feature counts as being in: its status, or, before the controller has written
/// one, its desired state.
pub fn effective_state(feature: &Feature) -> FeatureState {
    match feature.status.as_ref().and_then(|s| s.state) {
        Some(state) => state,
        None => match feature.spec.desired {
            DesiredState::On => FeatureState::On,
            DesiredState::Off => FeatureState::Off,
        },
    }
}

/// Whether writes to the feature's fields are guarded.
pub fn is_guarded(state: FeatureState) -> bool {
    matches!(state, FeatureState::Off | FeatureState::TurningOff)
}

pub fn state_str(state: FeatureState) -> &'static str {
    match state {
        FeatureState::On => "On",
        FeatureState::TurningOff => "TurningOff",
        FeatureState::Off => "Off",
        FeatureState::TurningOn => "TurningOn",
    }
}

/// Every problem with a Feature's spec, each naming the field; empty when valid.
pub fn validate_spec(spec: &FeatureSpec) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, field) in spec.fields.iter().enumerate() {
        if let Err(err) = FieldPath::parse(&field.path) {
            problems.push(format!("spec.fields[{i}].path: {err}"));
        }
        if field.resource.is_empty() || field.resource.contains('/') {
            problems.push(format!(
                "spec.fields[{i}].resource: {:?} is not a plural resource name like \"pods\"",
                field.resource
            ));
        }
    }
    for (i, r) in spec.wait_for_absence.iter().enumerate() {
        if r.resource.is_empty() || r.resource.contains('/') {
            problems.push(format!(
                "spec.waitForAbsence[{i}].resource: {:?} is not a plural resource name like \"pods\"",
                r.resource
            ));
        }
    }
    problems
}

/// One owned field of a feature that counts as off.
#[derive(Debug, Clone)]
pub struct GuardedField {
    /// `namespace/name` of the Feature.
    pub feature: String,
    pub state: FeatureState,
    pub path: FieldPath,
    pub on_disable: OnDisable,
}

/// (API group, plural resource) → the guarded fields of that resource.
pub type GuardIndex = HashMap<(String, String), Vec<GuardedField>>;

/// The guard index of `features`: the fields of those that count as off. Invalid paths (of
/// Features written before the webhook ran) are left out.
pub fn guard_index<'a>(features: impl IntoIterator<Item = &'a Feature>) -> GuardIndex {
    let mut index = GuardIndex::new();
    for feature in features {
        let state = effective_state(feature);
        if !is_guarded(state) {
            continue;
        }
        for field in &feature.spec.fields {
            match FieldPath::parse(&field.path) {
                Ok(path) => index
                    .entry((field.group.clone(), field.resource.clone()))
                    .or_default()
                    .push(GuardedField {
                        feature: feature_key(feature),
                        state,
                        path,
                        on_disable: field.on_disable,
                    }),
                Err(err) => tracing::warn!(feature = %feature_key(feature), %err, "owned field not guarded"),
            }
        }
    }
    index
}

/// A map filled by a watcher.
struct Watched<V> {
    live: RwLock<HashMap<String, Arc<V>>>,
    synced: AtomicBool,
}

impl<V> Default for Watched<V> {
    fn default() -> Self {
        Watched {
            live: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
        }
    }
}

impl<V> Watched<V> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<V>>> {
        self.live.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<V>>> {
        self.live.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Watch caches of Features and NodeFeatureReports, and the guard index built from them.
#[derive(Default)]
pub struct FeatureCaches {
    features: Watched<Feature>,
    reports: Watched<NodeFeatureReport>,
    index: RwLock<Arc<GuardIndex>>,
    changed: Notify,
}

impl FeatureCaches {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn is_synced(&self) -> bool {
        self.features.synced.load(Ordering::Acquire) && self.reports.synced.load(Ordering::Acquire)
    }

    /// Resolves once both kinds have been listed.
    pub async fn wait_synced(&self) {
        while !self.is_synced() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Resolves at the next change of a Feature or a report.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub fn guard_index(&self) -> Arc<GuardIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn features(&self) -> Vec<Arc<Feature>> {
        self.features.read().values().cloned().collect()
    }

    pub fn feature(&self, key: &str) -> Option<Arc<Feature>> {
        self.features.read().get(key).cloned()
    }

    pub fn reports(&self) -> Vec<Arc<NodeFeatureReport>> {
        self.reports.read().values().cloned().collect()
    }

    // ---- writes (also used by tests to fill the caches without a cluster)

    pub fn apply_feature(&self, feature: Feature) {
        self.features
            .write()
            .insert(feature_key(&feature), Arc::new(feature));
        self.features_changed();
    }

    pub fn delete_feature(&self, key: &str) {
        self.features.write().remove(key);
        self.features_changed();
    }

    pub fn apply_report(&self, report: NodeFeatureReport) {
        self.reports.write().insert(report.name_any(), Arc::new(report));
        self.changed.notify_waiters();
    }

    fn features_changed(&self) {
        let index = {
            let features = self.features.read();
            guard_index(features.values().map(|f| f.as_ref()))
        };
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
        self.changed.notify_waiters();
    }

    /// Watches Features and NodeFeatureReports until `stop`; errors are logged and retried with
    /// kube-runtime's default backoff.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let features = {
            let caches = self.clone();
            watch_into(
                "features",
                Api::<Feature>::all(client.clone()),
                stop.clone(),
                |f| f,
                move |change| match change {
                    Change::Apply(f) => caches.apply_feature(f),
                    Change::Delete(f) => caches.delete_feature(&feature_key(&f)),
                    Change::Replace(all) => {
                        *caches.features.write() =
                            all.into_iter().map(|f| (feature_key(&f), Arc::new(f))).collect();
                        caches.features.synced.store(true, Ordering::Release);
                        caches.features_changed();
                    }
                },
            )
        };
        let reports = {
            let caches = self.clone();
            watch_into(
                "nodefeaturereports",
                Api::<NodeFeatureReport>::all(client),
                stop.clone(),
                |r| r,
                move |change| {
                    match change {
                        Change::Apply(r) => caches.apply_report(r),
                        Change::Delete(r) => {
                            caches.reports.write().remove(&r.name_any());
                        }
                        Change::Replace(all) => {
                            *caches.reports.write() =
                                all.into_iter().map(|r| (r.name_any(), Arc::new(r))).collect();
                            caches.reports.synced.store(true, Ordering::Release);
                        }
                    }
                    caches.changed.notify_waiters();
                },
            )
        };
        tokio::join!(features, reports);
    }
}

/// The `/validate/features` handler.
pub struct FeaturesGuard {
    caches: Arc<FeatureCaches>,
    observer: Option<Arc<dyn FeaturesObserver>>,
}

impl FeaturesGuard {
    pub fn new(caches: Arc<FeatureCaches>) -> Self {
        FeaturesGuard {
            caches,
            observer: None,
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn FeaturesObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    fn count(&self, decision: Decision) {
        if let Some(o) = &self.observer {
            o.decided(decision);
        }
    }
}

impl Handler for FeaturesGuard {
    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let (response, decision) =
            if request.kind.group == Feature::group(&()) && request.kind.kind == "Feature" {
                review_feature(request)
            } else {
                review_owned(request, &self.caches.guard_index())
            };
        self.count(decision);
        response
    }
}

/// Validates a Feature object. An UPDATE that keeps an invalid path the old object already had
/// is let through, so a Feature written before the webhook ran can still be edited or deleted.
pub fn review_feature(request: &AdmissionRequest) -> (AdmissionResponse, Decision) {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return (AdmissionResponse::allow(&request.uid), Decision::FeatureAccepted);
    }
    let feature: Feature = match request.object_as() {
        Ok(f) => f,
        Err(why) => {
            return (
                AdmissionResponse::deny(&request.uid, 400, "BadRequest", format!("not a Feature: {why}")),
                Decision::FeatureRejected,
            );
        }
    };
    let mut problems = validate_spec(&feature.spec);
    if let Ok(Some(old)) = request.old_object_as::<Feature>() {
        let before = validate_spec(&old.spec);
        problems.retain(|p| !before.contains(p));
    }
    if problems.is_empty() {
        return (AdmissionResponse::allow(&request.uid), Decision::FeatureAccepted);
    }
    let message = format!(
        "Feature {}/{} is invalid: {}",
        request.namespace.clone().unwrap_or_default(),
        feature.name_any(),
        problems.join("; ")
    );
    (
        AdmissionResponse::deny(&request.uid, 422, "Invalid", message),
        Decision::FeatureRejected,
    )
}

fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 64 {
        let cut: String = text.chars().take(61).collect();
        format!("{cut}...")
    } else {
        text
    }
}

fn clip(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut cut: String = text.chars().take(max.saturating_sub(3)).collect();
    cut.push_str("...");
    cut
}

/// Checks a write of any resource against the guarded fields of `index`.
pub fn review_owned(request: &AdmissionRequest, index: &GuardIndex) -> (AdmissionResponse, Decision) {
    let allow = || AdmissionResponse::allow(&request.uid);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return (allow(), Decision::Allowed);
    }
    let key = (request.resource.group.clone(), request.resource.resource.clone());
    let Some(fields) = index.get(&key) else {
        return (allow(), Decision::Allowed);
    };
    let object: Value = match request.object_as() {
        Ok(v) => v,
        Err(why) => {
            return (
                AdmissionResponse::deny(&request.uid, 400, "BadRequest", why),
                Decision::Denied,
            );
        }
    };
    let old: Option<Value> = request.old_object_as().unwrap_or(None);
    let resource = if request.resource.group.is_empty() {
        request.resource.resource.clone()
    } else {
        format!("{}.{}", request.resource.resource, request.resource.group)
    };
    let mut denials = Vec::new();
    let mut warnings = Vec::new();
    let mut ratcheted = false;
    for field in fields.iter() {
        let set = field.path.instances(&object);
        let Some(first) = set.first() else { continue };
        if old.as_ref().is_some_and(|o| field.path.is_set_in(o)) {
            ratcheted = true;
            continue;
        }
        let state = state_str(field.state);
        match field.on_disable {
            OnDisable::Deny | OnDisable::Clear => denials.push(format!(
                "feature {} is {state}: {} may not be set on {resource} (found {} = {}{}); \
                 objects that already use the field stay editable",
                field.feature,
                field.path,
                first.at,
                shown(first.value),
                if set.len() > 1 {
                    format!(" and {} more", set.len() - 1)
                } else {
                    String::new()
                },
            )),
            OnDisable::Warn => warnings.push(clip(
                format!("feature {} is {state}: {} is set", field.feature, first.at),
                MAX_WARNING,
            )),
        }
    }
    if !denials.is_empty() {
        return (
            AdmissionResponse::deny(&request.uid, 403, "Forbidden", denials.join("; ")),
            Decision::Denied,
        );
    }
    if !warnings.is_empty() {
        let mut response = allow();
        response.warnings = warnings;
        return (response, Decision::Warned);
    }
    let decision = if ratcheted {
        Decision::Ratcheted
    } else {
        Decision::Allowed
    };
    (allow(), decision)
}
