//! Prometheus metrics of the webhook, all prefixed `nodewarden_`, with bounded label sets:
//! routes come from the registered handlers, outcomes from a fixed list.
//!
//! This module knows no capability: each one reports through an observer trait of its own, with
//! its decisions' `metric_label()`s, and the app connects those observers to the methods here
//! (`app::observers`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    route: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimDecisionLabels {
    /// One of the claims guard's rule names.
    rule: &'static str,
    /// `allowed` or `denied`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RightsizingPodLabels {
    /// `resized`, `unchanged`, `update-mode-off`, `no-target-node` or `yields-to-vpa`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RightsizingContainerLabels {
    /// `node-recommendation`, `fleet`, `policy-off`, `cold-start-template`, `no-fleet-figure-yet`
    /// or `container-not-in-node-recommendation`.
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureDecisionLabels {
    /// `allowed`, `ratcheted`, `warned`, `denied`, `feature-accepted` or `feature-rejected`.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureTransitionLabels {
    /// The state entered: `On`, `TurningOff`, `Off` or `TurningOn`.
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    /// The controller: `features` or `autoscaler-status`.
    controller: &'static str,
    /// `ok` or `error`.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileErrorLabels {
    /// The controller: `features` or `autoscaler-status`.
    controller: &'static str,
    /// The error's kind, its `metric_label()`.
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Latency buckets, in seconds: 50 µs to 2.5 s, with a bound at 1 s, the slow-answer alert's
/// threshold (without it the alert's quantile was interpolated between 0.5 and 2.5 s).
const LATENCY_BUCKETS: [f64; 15] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Reconcile duration buckets, in seconds: 1 ms (a status that did not change) to 30 s (a page
/// of objects cleared at a bounded rate).
const RECONCILE_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

fn reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_BUCKETS)
}

/// Every metric of the webhook, in one registry.
pub struct Metrics {
    registry: Registry,
    admission_requests: Family<AdmissionLabels, Counter>,
    admission_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    certificate_reloads: Family<ResultLabels, Counter>,
    /// One series without labels, created when a certificate is first loaded (a gauge would
    /// read 0, "expired in 1970", before that).
    certificate_expiry: Family<Vec<(&'static str, &'static str)>, Gauge>,
    claims_decisions: Family<ClaimDecisionLabels, Counter>,
    rightsizing_pods: Family<RightsizingPodLabels, Counter>,
    rightsizing_containers: Family<RightsizingContainerLabels, Counter>,
    features_decisions: Family<FeatureDecisionLabels, Counter>,
    features_transitions: Family<FeatureTransitionLabels, Counter>,
    controller_reconciliations: Family<ReconcileLabels, Counter>,
    controller_reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    controller_reconcile_errors: Family<ReconcileErrorLabels, Counter>,
    connections_closed: Family<ConnectionLabels, Counter>,
}

impl Metrics {
    /// Every metric registered, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodewarden");
        registry.register(
            "build",
            "The webhook's version and the Rust target it was built for (always 1)",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("program", "nodewarden-webhook"),
                ("arch", std::env::consts::ARCH),
            ]),
        );
        let admission_requests = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "AdmissionReviews answered, by route and outcome (allowed, patched, denied, invalid, error, failed_open)",
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
        let certificate_expiry = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
        registry.register(
            "serving_certificate_expiration_timestamp_seconds",
            "When the serving certificate being served expires, in seconds since the Unix epoch (absent until one is loaded)",
            certificate_expiry.clone(),
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
            "DaemonSet pods an autoscaler applied to, by reason (resized, unchanged, update-mode-off, no-target-node, yields-to-vpa)",
            rightsizing_pods.clone(),
        );
        let rightsizing_containers = Family::<RightsizingContainerLabels, Counter>::default();
        registry.register(
            "rightsizing_containers",
            "Containers of right-sized pods, by where their figures came from (node-recommendation, fleet, policy-off, cold-start-template, no-fleet-figure-yet, container-not-in-node-recommendation)",
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
        let controller_reconciliations = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "controller_reconciliations",
            "Reconciliations of one object by the leader's controllers, by controller (features, autoscaler-status) and result (ok, error)",
            controller_reconciliations.clone(),
        );
        let controller_reconcile_duration =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                reconcile_histogram,
            );
        registry.register(
            "controller_reconcile_duration_seconds",
            "Time one reconciliation of one object took, by controller",
            controller_reconcile_duration.clone(),
        );
        let controller_reconcile_errors = Family::<ReconcileErrorLabels, Counter>::default();
        registry.register(
            "controller_reconcile_errors",
            "Failed reconciliations of one object by the leader's controllers, by controller and the error's kind",
            controller_reconcile_errors.clone(),
        );
        let connections_closed = Family::<ConnectionLabels, Counter>::default();
        registry.register(
            "connections_closed_early",
            "Connections the server closed to stay fair to every address (docs/server.md): reason \
             over-rate and share-full refuse a new connection, stalest-at-share and stalest-at-limit \
             close an idle older one to make room",
            connections_closed.clone(),
        );
        Metrics {
            registry,
            controller_reconciliations,
            controller_reconcile_duration,
            controller_reconcile_errors,
            features_decisions,
            features_transitions,
            admission_requests,
            admission_duration,
            certificate_reloads,
            certificate_expiry,
            claims_decisions,
            rightsizing_pods,
            rightsizing_containers,
            connections_closed,
        }
    }

    /// Counts a connection the server closed early, by reason (see [`crate::server::Closed`]).
    pub fn connection_closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ConnectionLabels { reason })
            .inc();
    }

    /// Counts one answered review and its latency.
    pub fn admission(&self, route: &'static str, outcome: &'static str, took: Duration) {
        self.admission_requests
            .get_or_create(&AdmissionLabels { route, outcome })
            .inc();
        self.admission_duration
            .get_or_create(&RouteLabels { route })
            .observe(took.as_secs_f64());
    }

    /// Counts one serving certificate reload, loaded or rejected.
    pub fn certificate_reload(&self, loaded: bool) {
        let result = if loaded { "loaded" } else { "rejected" };
        self.certificate_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// The serving certificate now served expires at `not_after` (seconds since the Unix epoch).
    pub fn certificate_expires(&self, not_after: i64) {
        self.certificate_expiry.get_or_create(&Vec::new()).set(not_after);
    }

    /// Counts one decision of the claims guard; `rule` comes from its fixed list of rule names.
    pub fn claims_decision(&self, rule: &'static str, allowed: bool) {
        let outcome = if allowed { "allowed" } else { "denied" };
        self.claims_decisions
            .get_or_create(&ClaimDecisionLabels { rule, outcome })
            .inc();
    }

    /// Counts one right-sized pod by its `reason`.
    pub fn rightsizing_pod(&self, reason: &'static str) {
        self.rightsizing_pods
            .get_or_create(&RightsizingPodLabels { reason })
            .inc();
    }

    /// Counts one container of a right-sized pod by the `source` of its figures.
    pub fn rightsizing_container(&self, source: &'static str) {
        self.rightsizing_containers
            .get_or_create(&RightsizingContainerLabels { source })
            .inc();
    }

    /// Counts one decision of the features guard.
    pub fn features_decision(&self, outcome: &'static str) {
        self.features_decisions
            .get_or_create(&FeatureDecisionLabels { outcome })
            .inc();
    }

    /// Counts one Feature entering `state`.
    pub fn features_transition(&self, state: &'static str) {
        self.features_transitions
            .get_or_create(&FeatureTransitionLabels { state })
            .inc();
    }

    /// Counts one reconciliation by `controller`, `ok` or failed, and its duration.
    pub fn controller_reconcile(&self, controller: &'static str, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.controller_reconciliations
            .get_or_create(&ReconcileLabels { controller, result })
            .inc();
        self.controller_reconcile_duration
            .get_or_create(&ControllerLabels { controller })
            .observe(took.as_secs_f64());
    }

    /// Counts one failed reconciliation by `controller`, by the error's kind (`error`, its
    /// `metric_label()`).
    pub fn controller_reconcile_error(&self, controller: &'static str, error: &'static str) {
        self.controller_reconcile_errors
            .get_or_create(&ReconcileErrorLabels { controller, error })
            .inc();
    }

    /// OpenMetrics text of every metric, followed by the process's own (`process_*`: CPU, memory,
    /// open files, threads, start time).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = nodewarden_runtime::process::encode(&mut out, &self.registry) {
            tracing::error!(%err, "encoding metrics failed");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
