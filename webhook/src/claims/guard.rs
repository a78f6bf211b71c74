//! The claims admission handler: [`decide`] over the caches merged with this replica's recent
//! writes, an audit annotation naming the rule, and a count of every decision.

use std::sync::Arc;
use std::time::Instant;

use super::Shape;
use super::presence::{ClaimView, Merged, RecentWrites, Written};
use super::rules::{ClaimsPolicy, Decision, NameClass, Rule, classify, decide};
use crate::admission::{AdmissionRequest, AdmissionResponse, Handler, Kept, Operation};

/// Counts the guard's decisions (the webhook's metrics, or nothing).
pub trait ClaimsObserver: Send + Sync {
    /// One decision: the rule that decided it and whether it allowed the write.
    fn decided(&self, rule: Rule, allowed: bool);
}

impl ClaimsObserver for () {
    fn decided(&self, _: Rule, _: bool) {}
}

/// The claims admission handler.
pub struct ClaimsGuard {
    policy: Arc<ClaimsPolicy>,
    view: Arc<dyn ClaimView>,
    recent: RecentWrites,
    observer: Arc<dyn ClaimsObserver>,
}

impl ClaimsGuard {
    /// A guard deciding by `policy` over `view`, counting its decisions in `observer`.
    pub fn new(policy: ClaimsPolicy, view: Arc<dyn ClaimView>, observer: Arc<dyn ClaimsObserver>) -> Self {
        ClaimsGuard {
            policy: Arc::new(policy),
            view,
            recent: RecentWrites::default(),
            observer,
        }
    }

    /// The decision for `request` at `now`, remembering admitted well-known writes.
    pub fn decide_at(&self, request: &AdmissionRequest, now: Instant) -> Decision {
        let merged = Merged {
            cached: self.view.as_ref(),
            recent: &self.recent,
            now,
        };
        let decision = decide(request, &self.policy, &merged);
        if decision.allowed
            && request.dry_run != Some(true)
            && let Some(shape) = Shape::from_group(&request.kind.group)
            && let Some(name) = request.name.as_deref()
            && matches!(classify(name), NameClass::Id | NameClass::Clusterset)
        {
            let written = match request.operation {
                Operation::Create | Operation::Update => Some(Written::Upserted),
                Operation::Delete => Some(Written::Deleted),
                Operation::Connect => None,
            };
            if let Some(written) = written {
                self.recent.record(shape, name, written, now);
            }
        }
        decision
    }
}

impl Handler for ClaimsGuard {
    /// The object is read as raw JSON, every other field kept.
    type Object = Box<serde_json::value::RawValue>;
    type Extras = Kept;

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let decision = self.decide_at(request, Instant::now());
        self.observer.decided(decision.rule, decision.allowed);
        decision.into_response(&request.uid)
    }
}
