//! The `/validate/features` admission handler.

use std::sync::Arc;

use kube::Resource;
use nodewarden_api::features::Feature;

use super::cache::FeatureCaches;
use super::rules::{review_feature, review_owned};
use super::{Decision, FeaturesObserver};
use crate::admission::{AdmissionRequest, AdmissionResponse, Handler, Kept};

/// The `/validate/features` handler.
pub struct FeaturesGuard {
    caches: Arc<FeatureCaches>,
    observer: Option<Arc<dyn FeaturesObserver>>,
}

impl FeaturesGuard {
    /// A guard reading `caches`, counting nothing.
    pub fn new(caches: Arc<FeatureCaches>) -> Self {
        FeaturesGuard {
            caches,
            observer: None,
        }
    }

    /// Counts the guard's decisions in `observer`.
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
    /// The object is read as raw JSON, every other field kept.
    type Object = Box<serde_json::value::RawValue>;
    type Extras = Kept;

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
