//! nodewarden-webhook: the admission server and, in the same process, nodewarden's controllers.
//!
//! `main.rs` parses flags and calls [`run`]. Tests build the same pieces: [`admission::router`]
//! without TLS, [`server::serve_tls`] with certificates from `nodewarden-certs`.

pub mod admin;
pub mod admission;
pub mod caches;
pub mod certmanager;
pub mod config;
pub mod controllers;
#[cfg(feature = "loadgen")]
pub mod loadgen;
pub mod metrics;
pub mod server;
pub mod telemetry;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use backon::BackoffBuilder;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::admission::Route;
use crate::admission::claims::ClaimsGuard;
use crate::admission::features::{FeatureCaches, FeaturesGuard};
use crate::admission::node_reports::{NodeReportsGuard, NodeReportsPolicy};
use crate::admission::rightsizing::{AutoscalerValidator, PodMutator, RightsizingIndex};
use crate::caches::{Caches, CachesOptions};
use crate::certmanager::CertMode;
use crate::config::Config;
use crate::controllers::{CacheControllers, ControllerOptions};
use crate::metrics::Metrics;
use crate::tls::{CertReloader, CertResolver, Reload};

/// Readiness condition: a serving certificate is loaded.
pub const READY_CERTIFICATES: &str = "certificates";
/// Readiness condition: the process is not shutting down.
pub const READY_NOT_TERMINATING: &str = "not-terminating";

/// Readiness condition: the watch caches have synced.
pub const READY_CACHES: &str = "caches";

/// The admission handlers of every capability. Capabilities add theirs as they land.
pub struct Handlers {
    pub claims: Arc<ClaimsGuard>,
    /// `/mutate/pods`: per-node right-sizing of DaemonSet pods.
    pub pods: Arc<PodMutator>,
    /// `/validate/autoscalers`: DaemonSetAutoscaler rules the schema cannot express.
    pub autoscalers: Arc<AutoscalerValidator>,
    /// `/validate/node-reports`: only node N's agent writes node N's reports.
    pub node_reports: Arc<NodeReportsGuard>,
    /// `/validate/features`: Feature objects, and writes to fields of features that are off.
    pub features: Arc<FeaturesGuard>,
}

/// The admission routes of every capability; a path without a handler answers 404.
pub fn routes(handlers: &Handlers) -> Vec<Route> {
    vec![
        Route {
            path: admission::claims::ROUTE,
            handler: handlers.claims.clone(),
        },
        Route {
            path: admission::rightsizing::MUTATE_ROUTE,
            handler: handlers.pods.clone(),
        },
        Route {
            path: admission::rightsizing::VALIDATE_ROUTE,
            handler: handlers.autoscalers.clone(),
        },
        Route {
            path: admission::node_reports::ROUTE,
            handler: handlers.node_reports.clone(),
        },
        Route {
            path: admission::features::ROUTE,
            handler: handlers.features.clone(),
        },
    ]
}

/// Delays between retries of API server calls: exponential from 500 ms to 30 s, with jitter,
/// without end.
pub(crate) fn retry_backoff() -> impl Iterator<Item = Duration> + Send {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

/// A client for the API server from `--kubeconfig`, else in-cluster or `$KUBECONFIG`.
/// Nothing is sent to the API server yet.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding API server credentials (in-cluster service account, $KUBECONFIG or ~/.kube/config)",
        )?,
    };
    kube::Client::try_from(config).context("building the API server client")
}

/// What the feature lifecycle adds to [`run_kube`]: its caches, and the metrics its controller
/// counts transitions in.
struct FeatureParts {
    caches: Arc<FeatureCaches>,
    metrics: Arc<Metrics>,
}

/// Everything that talks to the API server: the client (retried until it can be built), the
/// caches (readiness follows their sync), the controllers. Returns after `shutdown`.
async fn run_kube(
    config: Config,
    caches: Arc<Caches>,
    rightsizing: Arc<RightsizingIndex>,
    readiness: Arc<Readiness>,
    resolver: Arc<CertResolver>,
    shutdown: CancellationToken,
    feature_parts: FeatureParts,
) {
    let FeatureParts {
        caches: features,
        metrics,
    } = feature_parts;
    let mut backoff = retry_backoff();
    let client = loop {
        match kube_client(config.kubeconfig.as_deref()).await {
            Ok(client) => break client,
            Err(err) => {
                let wait = backoff.next().unwrap_or(Duration::from_secs(30));
                tracing::error!(error = format!("{err:#}"), retry_in = ?wait, "no API server client; not ready");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    };
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let certs_task = match config.certs.cert_mode {
        CertMode::Managed => match config.certs.options(&namespace) {
            Ok(options) => {
                let ready = readiness.clone();
                Some(tokio::spawn(certmanager::run(
                    client.clone(),
                    options,
                    resolver,
                    shutdown.clone(),
                    move |ok| ready.set(READY_CERTIFICATES, ok),
                )))
            }
            // flags were checked at start-up; this only repeats the message
            Err(why) => {
                tracing::error!(%why, "managed certificates are off");
                None
            }
        },
        _ => None,
    };
    let synced = caches.synced();
    let caches_task = tokio::spawn(caches.run(client.clone(), shutdown.clone()));
    let rightsizing_task = tokio::spawn(rightsizing.clone().run(client.clone(), shutdown.clone()));
    let features_task = tokio::spawn(features.clone().run(client.clone(), shutdown.clone()));
    let features_synced = features.clone();
    let ready = readiness.clone();
    let stop = shutdown.clone();
    let index = rightsizing.clone();
    let readiness_task = tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = async { tokio::join!(synced, index.wait_synced(), features_synced.wait_synced()) } => ready.set(READY_CACHES, true),
        }
    });
    let options = ControllerOptions {
        namespace: config
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string()),
        identity: config.pod_name.clone().unwrap_or_else(host_name),
        initialize_id: config.claims_initialize_id,
        initialize_interval: config.claims_initialize_interval,
    };
    let cached = CacheControllers {
        rightsizing_status: Some((rightsizing, config.rightsizing_status_interval)),
        features: config
            .features_controller
            .then(|| controllers::FeaturesController {
                caches: features.clone(),
                options: controllers::features::FeaturesOptions {
                    clear_page_size: config.features_clear_page_size,
                    clear_rate: config.features_clear_rate,
                    resync_interval: config.features_resync_interval,
                },
                observer: Some(metrics.clone()),
            }),
    };
    let controllers_task = tokio::spawn(controllers::run_with(client, options, cached, shutdown.clone()));
    let _ = tokio::join!(
        caches_task,
        rightsizing_task,
        readiness_task,
        controllers_task,
        features_task
    );
    if let Some(task) = certs_task {
        let _ = task.await;
    }
}

/// The host name (a pod's name, in a cluster), or a made-up unique name.
fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("nodewarden-webhook-{}", std::process::id()))
}

/// Runs the webhook until `shutdown` is cancelled, then shuts down gracefully.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    if config.certs.cert_mode == CertMode::Managed {
        // wrong certificate flags are an error at start, not a loop of failures later
        config
            .certs
            .options(config.namespace.as_deref().unwrap_or("default"))
            .map_err(anyhow::Error::msg)?;
    }
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    readiness.require(READY_CERTIFICATES);
    readiness.require(READY_CACHES);
    readiness.set(READY_NOT_TERMINATING, true);

    let caches = Caches::new(CachesOptions {
        discovery_interval: config.claims_discovery_interval,
    });
    let rightsizing = RightsizingIndex::new();
    let features = FeatureCaches::new();
    let handlers = Handlers {
        features: Arc::new(FeaturesGuard::new(features.clone()).with_observer(metrics.clone())),
        claims: Arc::new(ClaimsGuard::new(
            config.claims_policy(),
            caches.claims(),
            metrics.clone(),
        )),
        pods: Arc::new(PodMutator::new(rightsizing.clone()).with_observer(metrics.clone())),
        autoscalers: Arc::new(AutoscalerValidator::new(rightsizing.clone())),
        node_reports: Arc::new(NodeReportsGuard::new(NodeReportsPolicy::from(
            &config.node_reports,
        ))),
    };
    if config.node_reports.agent_service_account.is_none() {
        tracing::warn!(
            "--agent-service-account is not set: any service account with a token bound to node N may write node N's reports"
        );
    }

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

    let stop_kube = CancellationToken::new();
    let kube_task = tokio::spawn(run_kube(
        config.clone(),
        caches,
        rightsizing,
        readiness.clone(),
        resolver.clone(),
        stop_kube.clone(),
        FeatureParts {
            caches: features,
            metrics: metrics.clone(),
        },
    ));

    let max_body = usize::try_from(config.max_body_bytes).unwrap_or(usize::MAX);
    let app = admission::router(routes(&handlers), metrics.clone(), max_body);
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
    stop_kube.cancel();
    let _ = kube_task.await;
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
