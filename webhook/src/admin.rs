//! The plain-HTTP admin port: `/livez`, `/readyz`, `/metrics`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Named readiness conditions; ready when every one of them holds.
#[derive(Debug, Default)]
pub struct Readiness {
    conditions: Mutex<BTreeMap<&'static str, bool>>,
}

impl Readiness {
    /// Adds a condition that starts unmet.
    pub fn require(&self, name: &'static str) {
        self.lock().entry(name).or_insert(false);
    }

    pub fn set(&self, name: &'static str, ok: bool) {
        self.lock().insert(name, ok);
    }

    /// Whether every condition holds, and the ones that do not.
    pub fn check(&self) -> (bool, Vec<&'static str>) {
        let unmet: Vec<_> = self
            .lock()
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(n, _)| *n)
            .collect();
        (unmet.is_empty(), unmet)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, bool>> {
        self.conditions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
}

pub fn router(readiness: Arc<Readiness>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { readiness, metrics })
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.check() {
        (true, _) => (StatusCode::OK, "ok\n".to_string()),
        (false, unmet) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", unmet.join(", ")),
        ),
    }
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
