//! The webhook as one object: [`App::new`] builds every capability from the flags,
//! [`App::router`] hands out the admission router (tests drive it without TLS or a cluster),
//! [`App::run`] serves it over TLS with the admin port, the caches and the controllers until
//! shutdown.
//!
//! This is the only module that knows every capability and the metrics: `observers` connects
//! each capability's observer trait to [`Metrics`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use nodewarden_runtime::admin::{self, Readiness};
use nodewarden_runtime::client::{kube_client, retry_backoff};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::admission::{self, Route};
use crate::certificates::{self, CertMode, CertReloader, CertResolver, Reload};
use crate::claims::{ClaimsCache, ClaimsCacheOptions, ClaimsGuard};
use crate::config::Config;
use crate::controllers::{self, ControllerOptions, LeaderTask};
use crate::features::{FeatureCaches, FeaturesGuard};
use crate::metrics::Metrics;
use crate::node_reports::evictions::{ApiServerPods, EvictionGuard, POD_LOOKUP_TIMEOUT};
use crate::node_reports::{NodeReportsGuard, NodeReportsPolicy};
use crate::rightsizing::{AutoscalerValidator, PodMutator, RightsizingCache};
use crate::{claims, features, node_reports, rightsizing, server};

/// Readiness condition: a serving certificate is loaded.
pub const READY_CERTIFICATES: &str = "certificates";
/// Readiness condition: the process is not shutting down.
pub const READY_NOT_TERMINATING: &str = "not-terminating";
/// Readiness condition: the watch caches have synced.
pub const READY_CACHES: &str = "caches";

/// The admission handlers of every capability.
pub struct Handlers {
    /// `/validate/claims`: the ClusterClaim guard.
    pub claims: Arc<ClaimsGuard>,
    /// `/mutate/pods`: per-node right-sizing of DaemonSet pods.
    pub pods: Arc<PodMutator>,
    /// `/validate/autoscalers`: DaemonSetAutoscaler rules the schema cannot express.
    pub autoscalers: Arc<AutoscalerValidator>,
    /// `/validate/node-reports`: only node N's agent writes node N's reports.
    pub node_reports: Arc<NodeReportsGuard>,
    /// `/validate/evictions`: node N's agent evicts only pods on node N.
    pub evictions: Arc<EvictionGuard>,
    /// `/validate/features`: Feature objects, and writes to fields of features that are off.
    pub features: Arc<FeaturesGuard>,
}

/// The admission routes of every capability; a path without a handler answers 404.
pub fn routes(handlers: &Handlers) -> Vec<Route> {
    vec![
        Route {
            path: claims::ROUTE,
            handler: handlers.claims.clone(),
        },
        Route {
            path: rightsizing::MUTATE_ROUTE,
            handler: handlers.pods.clone(),
        },
        Route {
            path: rightsizing::VALIDATE_ROUTE,
            handler: handlers.autoscalers.clone(),
        },
        Route {
            path: node_reports::ROUTE,
            handler: handlers.node_reports.clone(),
        },
        Route {
            path: node_reports::evictions::ROUTE,
            handler: handlers.evictions.clone(),
        },
        Route {
            path: features::ROUTE,
            handler: handlers.features.clone(),
        },
    ]
}

/// The webhook, built from its flags; nothing runs and nothing is bound until [`App::run`].
pub struct App {
    config: Config,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    handlers: Handlers,
    claims: Arc<ClaimsCache>,
    rightsizing: Arc<RightsizingCache>,
    features: Arc<FeatureCaches>,
    /// The eviction guard's client, set once [`App::run`] has built one.
    pod_reader: Arc<std::sync::OnceLock<kube::Client>>,
}

impl App {
    /// Every capability with empty caches. Fails on flags that cannot work together (e.g.
    /// managed certificates without their settings), so they stop the start, not loop later.
    pub fn new(config: Config) -> anyhow::Result<Self> {
        if config.certs.cert_mode == CertMode::Managed {
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

        let claims = ClaimsCache::new(ClaimsCacheOptions {
            discovery_interval: config.claims.claims_discovery_interval,
        });
        let rightsizing = RightsizingCache::new();
        let features = FeatureCaches::new();
        let pods = ApiServerPods::new(POD_LOOKUP_TIMEOUT);
        let pod_reader = pods.client_slot();
        let handlers = Handlers {
            features: Arc::new(FeaturesGuard::new(features.clone()).with_observer(metrics.clone())),
            claims: Arc::new(ClaimsGuard::new(
                config.claims.policy(),
                claims.claims(),
                metrics.clone(),
            )),
            pods: Arc::new(PodMutator::new(rightsizing.clone()).with_observer(metrics.clone())),
            autoscalers: Arc::new(AutoscalerValidator::new(rightsizing.clone())),
            node_reports: Arc::new(NodeReportsGuard::new(NodeReportsPolicy::from(
                &config.node_reports,
            ))),
            evictions: Arc::new(EvictionGuard::new(
                NodeReportsPolicy::from(&config.node_reports),
                Arc::new(pods),
            )),
        };
        Ok(App {
            config,
            metrics,
            readiness,
            handlers,
            claims,
            rightsizing,
            features,
            pod_reader,
        })
    }

    /// The admission router of every capability, counted in this app's metrics.
    pub fn router(&self) -> Router {
        let max_body = usize::try_from(self.config.max_body_bytes).unwrap_or(usize::MAX);
        admission::router(routes(&self.handlers), self.metrics.clone(), max_body)
    }

    /// The webhook's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs the webhook until `shutdown` is cancelled, then shuts down gracefully: readiness
    /// turns false, the admission server keeps serving for `--shutdown-delay`, then drains.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let config = &self.config;
        let readiness = self.readiness.clone();
        if config.node_reports.agent_service_account.is_none() {
            tracing::warn!(
                "--agent-service-account is not set: any service account with a token bound to node N may write node N's reports, and evictions are not guarded"
            );
        }

        let resolver = Arc::new(CertResolver::default());
        let client_auth = config.client_auth().context("--client-ca-file")?;
        let reloader = Arc::new(
            CertReloader::new(
                config.tls_cert_file.clone(),
                config.tls_key_file.clone(),
                resolver.clone(),
                self.metrics.clone(),
            )
            .with_client_ca(client_auth.clone()),
        );
        if let Reload::Rejected(why) = reloader.check() {
            tracing::warn!(%why, "no serving certificate yet; not ready until one loads");
        }
        readiness.set(READY_CERTIFICATES, resolver.is_loaded());
        let tls = certificates::server_config_with(resolver.clone(), client_auth)
            .context("building the TLS configuration")?;

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
        let metrics = self.metrics.clone();
        let served = resolver.clone();
        let admin_app = admin::router(
            readiness.clone(),
            Arc::new(move || {
                if let Some(not_after) = served.not_after() {
                    metrics.certificate_expires(not_after);
                }
                metrics.encode()
            }),
        );
        let admin_task = admin::serve(admin_listener, admin_app, stop_admin.clone());

        let app = self.router();
        let stop_serving = server::Shutdown::default();
        let serve_task = tokio::spawn(server::serve_tls_with(
            listener,
            tls,
            app,
            stop_serving.clone(),
            config.shutdown_grace,
            config.server_limits(),
            {
                let metrics = self.metrics.clone();
                Arc::new(move |reason| metrics.connection_closed(reason))
            },
        ));

        let (delay, name) = (config.shutdown_delay, "nodewarden-webhook");
        let stop_kube = CancellationToken::new();
        let kube_task = tokio::spawn(self.run_kube(resolver, stop_kube.clone()));

        shutdown.cancelled().await;
        tracing::info!(?delay, "shutting down: readiness is now false");
        readiness.set(READY_NOT_TERMINATING, false);
        // while the endpoint's removal spreads, callers still reaching this replica are answered
        // and told to go elsewhere (HTTP/1.1 Connection: close, HTTP/2 GOAWAY)
        stop_serving.retire.cancel();
        tokio::time::sleep(delay).await;
        stop_serving.stop.cancel();
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
        tracing::info!("{name} stopped");
        Ok(())
    }

    /// Everything that talks to the API server: the client (retried until it can be built), the
    /// caches (readiness follows their sync), the controllers. Returns after `shutdown`.
    async fn run_kube(self, resolver: Arc<CertResolver>, shutdown: CancellationToken) {
        let config = &self.config;
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
        // until now the eviction guard denied the agent's evictions: it could not read pods
        let _ = self.pod_reader.set(client.clone());
        let namespace = config
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let certs_task = match config.certs.cert_mode {
            CertMode::Managed => match config.certs.options(&namespace) {
                Ok(options) => {
                    let ready = self.readiness.clone();
                    Some(tokio::spawn(certificates::manager::run(
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
        let synced = self.claims.synced();
        let caches_task = tokio::spawn(self.claims.clone().run(client.clone(), shutdown.clone()));
        let rightsizing_task = tokio::spawn(self.rightsizing.clone().run(client.clone(), shutdown.clone()));
        let features_task = tokio::spawn(self.features.clone().run(client.clone(), shutdown.clone()));
        let (features, index, ready, stop) = (
            self.features.clone(),
            self.rightsizing.clone(),
            self.readiness.clone(),
            shutdown.clone(),
        );
        let readiness_task = tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = async { tokio::join!(synced, index.wait_synced(), features.wait_synced()) } => ready.set(READY_CACHES, true),
            }
        });
        let options = ControllerOptions {
            namespace,
            identity: config.pod_name.clone().unwrap_or_else(host_name),
        };
        let controllers_task = tokio::spawn(controllers::run(
            client,
            options,
            self.leader_tasks(),
            shutdown.clone(),
        ));
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

    /// The controllers the flags switch on, run by the replica that leads.
    fn leader_tasks(&self) -> Vec<LeaderTask> {
        let config = &self.config;
        let mut tasks = vec![rightsizing::controller::task(
            self.rightsizing.clone(),
            config.rightsizing.rightsizing_status_interval,
            Some(self.metrics.clone()),
        )];
        if config.claims.claims_initialize_id {
            tasks.push(claims::initializer::task(
                config.claims.claims_initialize_interval,
            ));
        }
        if config.features.features_controller {
            tasks.push(features::controller::task(
                self.features.clone(),
                features::controller::FeaturesOptions {
                    clear_page_size: config.features.features_clear_page_size,
                    clear_rate: config.features.features_clear_rate,
                    resync_interval: config.features.features_resync_interval,
                },
                Some(self.metrics.clone()),
                Some(self.metrics.clone()),
            ));
        }
        tasks
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

/// Each capability's observer trait, counted in [`Metrics`] by the decisions' metric labels.
mod observers {
    use std::time::Duration;

    use nodewarden_api::features::FeatureState;

    use crate::admission::{AdmissionObserver, Outcome};
    use crate::certificates::ReloadObserver;
    use crate::claims::{ClaimsObserver, Rule};
    use crate::controllers::ReconcileObserver;
    use crate::features::{Decision as FeatureDecision, FeaturesObserver};
    use crate::metrics::Metrics;
    use crate::rightsizing::{Reason, RightsizingObserver, Source};

    impl AdmissionObserver for Metrics {
        fn observed(&self, route: &'static str, outcome: Outcome, took: Duration) {
            self.admission(route, outcome.metric_label(), took);
        }
    }

    impl ReloadObserver for Metrics {
        fn reloaded(&self, loaded: bool) {
            self.certificate_reload(loaded);
        }
    }

    impl ClaimsObserver for Metrics {
        fn decided(&self, rule: Rule, allowed: bool) {
            self.claims_decision(rule.as_str(), allowed);
        }
    }

    impl RightsizingObserver for Metrics {
        fn decided(&self, reason: Reason, sources: &[(String, Source)]) {
            self.rightsizing_pod(reason.as_str());
            for (_, source) in sources {
                self.rightsizing_container(source.as_str());
            }
        }
    }

    impl ReconcileObserver for Metrics {
        fn reconciled(&self, controller: &'static str, ok: bool, took: Duration) {
            self.controller_reconcile(controller, ok, took);
        }

        fn failed(&self, controller: &'static str, error: &'static str) {
            self.controller_reconcile_error(controller, error);
        }
    }

    impl FeaturesObserver for Metrics {
        fn decided(&self, decision: FeatureDecision) {
            self.features_decision(decision.as_str());
        }

        fn transitioned(&self, state: FeatureState) {
            self.features_transition(state.as_str());
        }
    }
}
