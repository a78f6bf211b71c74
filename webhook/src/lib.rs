//! nodewarden-webhook: the admission server and, in the same process, nodewarden's controllers.
//!
//! `main.rs` parses flags and calls [`run`]. Tests build the same pieces: [`admission::router`]
//! without TLS, [`server::serve_tls`] with certificates from `nodewarden-certs`.

pub mod admin;
pub mod admission;
pub mod config;
pub mod metrics;
pub mod server;
pub mod telemetry;
pub mod tls;

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::admission::Route;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::tls::{CertReloader, CertResolver, Reload};

/// Readiness condition: a serving certificate is loaded.
pub const READY_CERTIFICATES: &str = "certificates";
/// Readiness condition: the process is not shutting down.
pub const READY_NOT_TERMINATING: &str = "not-terminating";

/// The admission routes of every capability. Capabilities add theirs as they land; a path
/// without a handler answers 404.
pub fn routes() -> Vec<Route> {
    Vec::new()
}

/// Runs the webhook until `shutdown` is cancelled, then shuts down gracefully.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    readiness.require(READY_CERTIFICATES);
    readiness.set(READY_NOT_TERMINATING, true);

    let resolver = Arc::new(CertResolver::default());
    let reloader = Arc::new(CertReloader::new(
        config.tls_cert_file.clone(),
        config.tls_key_file.clone(),
        resolver.clone(),
        metrics.clone(),
    ));
    if let Reload::Rejected(why) = reloader.check() {
        tracing::warn!(%why, "no serving certificate yet; not ready until one loads");
    }
    readiness.set(READY_CERTIFICATES, resolver.is_loaded());
    let tls = tls::server_config(resolver.clone()).context("building the TLS configuration")?;

    let listener = TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("binding the admission server to {}", config.listen_addr))?;
    let admin_listener = TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("binding the admin server to {}", config.admin_addr))?;
    tracing::info!(listen = %config.listen_addr, admin = %config.admin_addr, "nodewarden-webhook serving");

    let stop_reloading = CancellationToken::new();
    let ready = readiness.clone();
    let reload_task = tokio::spawn(reloader.run(
        config.cert_reload_interval,
        stop_reloading.clone(),
        move |ok| ready.set(READY_CERTIFICATES, ok),
    ));

    let stop_admin = CancellationToken::new();
    let admin_app = admin::router(readiness.clone(), metrics.clone());
    let admin_stop = stop_admin.clone();
    let admin_task = tokio::spawn(async move {
        axum::serve(admin_listener, admin_app)
            .with_graceful_shutdown(admin_stop.cancelled_owned())
            .await
    });

    let max_body = usize::try_from(config.max_body_bytes).unwrap_or(usize::MAX);
    let app = admission::router(routes(), metrics.clone(), max_body);
    let stop_serving = CancellationToken::new();
    let serve_task = tokio::spawn(server::serve_tls(
        listener,
        tls,
        app,
        stop_serving.clone(),
        config.shutdown_grace,
    ));

    shutdown.cancelled().await;
    tracing::info!(delay = ?config.shutdown_delay, "shutting down: readiness is now false");
    readiness.set(READY_NOT_TERMINATING, false);
    tokio::time::sleep(config.shutdown_delay).await;
    stop_serving.cancel();
    serve_task.await.context("admission server task")?;
    stop_reloading.cancel();
    stop_admin.cancel();
    let _ = reload_task.await;
    admin_task
        .await
        .context("admin server task")?
        .context("admin server")?;
    tracing::info!("nodewarden-webhook stopped");
    Ok(())
}

/// Cancels the returned token on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        t.cancel();
    });
    Ok(token)
}
