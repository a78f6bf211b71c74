//! The plain-HTTP admin port: `/livez`, `/readyz`, `/metrics`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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

    /// Sets a condition, adding it if it is new.
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

/// The OpenMetrics text of a binary's metrics.
pub type MetricsText = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: MetricsText,
}

/// The admin routes: `/livez` always answers, `/readyz` answers 503 naming the unmet
/// conditions, `/metrics` serves `metrics()`.
pub fn router(readiness: Arc<Readiness>, metrics: MetricsText) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { readiness, metrics })
}

/// Serves `app` (plain HTTP) on `listener` until `stop`, then finishes in-flight requests.
pub fn serve(listener: TcpListener, app: Router, stop: CancellationToken) -> JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    })
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
        (state.metrics)(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        let response = app.oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn readiness_names_the_unmet_conditions() {
        let readiness = Arc::new(Readiness::default());
        readiness.require("caches");
        readiness.set("certificates", true);
        let app = router(readiness.clone(), Arc::new(|| "# EOF\n".to_string()));
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: caches\n".to_string())
        );
        readiness.set("caches", true);
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (StatusCode::OK, "ok\n".to_string())
        );
        assert_eq!(get(app, "/metrics").await.1, "# EOF\n");
    }
}
