//! The features guard's pure checks: which Features count as off, the index of their guarded
//! fields, and the decision on a Feature object or on a write of any other resource.

use std::collections::HashMap;

use kube::ResourceExt;
use nodewarden_api::features::{DesiredState, Feature, FeatureSpec, FeatureState, OnDisable};
use serde_json::Value;

use super::path::FieldPath;
use super::{Decision, MAX_WARNING};
use crate::admission::{AdmissionRequest, AdmissionResponse, Operation};

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
    /// The state the feature counts as being in.
    pub state: FeatureState,
    /// The owned field.
    pub path: FieldPath,
    /// What a write that sets it gets.
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
        let state = field.state.as_str();
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
