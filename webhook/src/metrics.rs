//! Prometheus metrics of the webhook, all prefixed `nodewarden_`, with bounded label sets:
//! routes come from the registered handlers, outcomes from a fixed list.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admission::Outcome;
use crate::admission::features::{Decision as FeatureDecision, FeaturesObserver, state_str};
use crate::admission::rightsizing::{Reason, RightsizingObserver, Source};
use nodewarden_api::features::FeatureState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub route: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimDecisionLabels {
    /// One of the claims guard's rule names (`admission::claims::Rule`).
    pub rule: &'static str,
    /// `allowed` or `denied`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RightsizingPodLabels {
    /// `resized`, `unchanged`, `update-mode-off` or `no-target-node`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RightsizingContainerLabels {
    /// `node-recommendation`, `fleet`, `cold-start-template` or `policy-off`.
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureDecisionLabels {
    /// `allowed`, `ratcheted`, `warned`, `denied`, `feature-accepted` or `feature-rejected`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureTransitionLabels {
    /// The state entered: `On`, `TurningOff`, `Off` or `TurningOn`.
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Latency buckets, in seconds: 50 µs to 2.5 s.
const LATENCY_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 2.5,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    admission_requests: Family<AdmissionLabels, Counter>,
    admission_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    certificate_reloads: Family<ResultLabels, Counter>,
    claims_decisions: Family<ClaimDecisionLabels, Counter>,
    rightsizing_pods: Family<RightsizingPodLabels, Counter>,
    rightsizing_containers: Family<RightsizingContainerLabels, Counter>,
    features_decisions: Family<FeatureDecisionLabels, Counter>,
    features_transitions: Family<FeatureTransitionLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodewarden");
        let admission_requests = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "AdmissionReviews answered, by route and outcome (allowed, patched, denied, invalid, error)",
            admission_requests.clone(),
        );
        let admission_duration =
            Family::<RouteLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "admission_duration_seconds",
            "Time from receiving an AdmissionReview body to having its answer, by route",
            admission_duration.clone(),
        );
        let certificate_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads, by result (loaded, rejected)",
            certificate_reloads.clone(),
        );
        let claims_decisions = Family::<ClaimDecisionLabels, Counter>::default();
        registry.register(
            "claims_decisions",
            "ClusterClaim guard decisions, by rule and outcome (allowed, denied)",
            claims_decisions.clone(),
        );
        let rightsizing_pods = Family::<RightsizingPodLabels, Counter>::default();
        registry.register(
            "rightsizing_pods",
            "DaemonSet pods an autoscaler applied to, by reason (resized, unchanged, update-mode-off, no-target-node)",
            rightsizing_pods.clone(),
        );
        let rightsizing_containers = Family::<RightsizingContainerLabels, Counter>::default();
        registry.register(
            "rightsizing_containers",
            "Containers of right-sized pods, by where their figures came from (node-recommendation, fleet, cold-start-template, policy-off)",
            rightsizing_containers.clone(),
        );
        let features_decisions = Family::<FeatureDecisionLabels, Counter>::default();
        registry.register(
            "features_decisions",
            "Decisions of the features guard, by outcome (allowed, ratcheted, warned, denied, feature-accepted, feature-rejected)",
            features_decisions.clone(),
        );
        let features_transitions = Family::<FeatureTransitionLabels, Counter>::default();
        registry.register(
            "features_transitions",
            "Feature states entered by the lifecycle controller, by state (On, TurningOff, Off, TurningOn)",
            features_transitions.clone(),
        );
        Metrics {
            registry,
            features_decisions,
            features_transitions,
            admission_requests,
            admission_duration,
            certificate_reloads,
            claims_decisions,
            rightsizing_pods,
            rightsizing_containers,
        }
    }

    pub fn observe_admission(&self, route: &'static str, outcome: Outcome, took: Duration) {
        self.admission_requests
            .get_or_create(&AdmissionLabels {
                route,
                outcome: outcome.as_str(),
            })
            .inc();
        self.admission_duration
            .get_or_create(&RouteLabels { route })
            .observe(took.as_secs_f64());
    }

    pub fn certificate_reload(&self, loaded: bool) {
        let result = if loaded { "loaded" } else { "rejected" };
        self.certificate_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one decision of the claims guard; `rule` comes from its fixed list of rule names.
    pub fn claims_decision(&self, rule: &'static str, allowed: bool) {
        let outcome = if allowed { "allowed" } else { "denied" };
        self.claims_decisions
            .get_or_create(&ClaimDecisionLabels { rule, outcome })
            .inc();
    }

    /// OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = encode(&mut out, &self.registry) {
            tracing::error!(%err, "encoding metrics failed");
        }
        out
    }
}

impl RightsizingObserver for Metrics {
    fn decided(&self, reason: Reason, sources: &[(String, Source)]) {
        self.rightsizing_pods
            .get_or_create(&RightsizingPodLabels {
                reason: reason.as_str(),
            })
            .inc();
        for (_, source) in sources {
            self.rightsizing_containers
                .get_or_create(&RightsizingContainerLabels {
                    source: source.as_str(),
                })
                .inc();
        }
    }
}

impl FeaturesObserver for Metrics {
    fn decided(&self, decision: FeatureDecision) {
        self.features_decisions
            .get_or_create(&FeatureDecisionLabels {
                outcome: decision.as_str(),
            })
            .inc();
    }

    fn transitioned(&self, state: FeatureState) {
        self.features_transitions
            .get_or_create(&FeatureTransitionLabels {
                state: state_str(state),
            })
            .inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
