//! nodewarden-agent: measures the autoscaled DaemonSet containers of one node, recommends
//! their requests with the VPA estimator, and publishes `NodeRecommendation/<node>`.
//!
//! One folder per capability, as in the webhook:
//! - [`rightsizing`]: the node's figures for its autoscaled DaemonSet containers (histograms,
//!   estimator, checkpoint, the watches of pods and autoscalers, `NodeRecommendation/<node>`,
//!   the updater of running pods),
//! - [`features`]: the feature gates of the node's components, published as `NodeFeatureReport/<node>`.
//!
//! Shared by them: [`cgroup`] (the node's I/O: finding container cgroups, systemd/cgroupfs,
//! containerd/CRI-O, and reading them; the crate `nodewarden-cgroup`, re-exported here),
//! [`metrics`], [`config`] (the flags). [`run`] ties them together.
//!
//! Tracing, the admin server, signals and the API server client come from `nodewarden-runtime`,
//! shared with the webhook.

#![warn(missing_docs)]

pub use nodewarden_cgroup as cgroup;
pub mod config;
pub mod features;
pub mod metrics;
pub mod rightsizing;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use kube::Client;
use nodewarden_runtime::admin::{self, Readiness};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::rightsizing::run::Rightsizing;

/// Readiness condition: the pod and autoscaler watches have listed (named as `/readyz` shows it
/// while unmet).
pub const READY_CACHES: &str = "caches not synced";

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Runs the agent with the in-cluster (or kubeconfig) client until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    cgroup::Hierarchy::detect(&config.rightsizing.cgroup_root, config.rightsizing.cgroup_version)?;
    let kube = nodewarden_runtime::client::kube_config(None).await?;
    run_with_kube_config(config, kube, shutdown).await
}

/// Runs the agent against the API server `kube` describes until `shutdown`: evictions go
/// through a client that does not retry 429 itself (a PodDisruptionBudget's answer).
pub async fn run_with_kube_config(
    config: Config,
    kube: kube::Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let client = kube::Client::try_from(kube.clone()).context("building the API server client")?;
    let evictions = nodewarden_runtime::client::client_without_retries(kube)?;
    run_with_clients(config, client, evictions, shutdown).await
}

/// Runs the agent with `client` until `shutdown`: the end-to-end tests call this with a
/// client made from a node-bound service-account token.
pub async fn run_with_client(
    config: Config,
    client: Client,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_clients(config, client.clone(), client, shutdown).await
}

/// [`run_with_client`] with a second client for evictions (see [`run_with_kube_config`]).
pub async fn run_with_clients(
    config: Config,
    client: Client,
    evictions: Client,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let rightsizing = Rightsizing::new(&config, metrics.clone())?;

    let readiness = Arc::new(Readiness::default());
    readiness.require(READY_CACHES);
    let admin_listener = TcpListener::bind(config.admin_addr)
        .await
        .with_context(|| format!("binding the admin server to {}", config.admin_addr))?;
    let stop = shutdown.child_token();
    let encoded = metrics.clone();
    let admin_app = admin::router(readiness.clone(), Arc::new(move || encoded.encode()));
    let admin_task = admin::serve(admin_listener, admin_app, stop.clone());
    tracing::info!(node = %config.node_name, admin = %config.admin_addr, cgroup = %rightsizing.hierarchy(), "nodewarden-agent starting");

    let gates_task = config.gates.gates.then(|| {
        tokio::spawn(features::run(
            config.gates.clone(),
            client.clone(),
            config.node_name.clone(),
            metrics.clone(),
            stop.clone(),
        ))
    });
    let result = rightsizing
        .run(&config, client, evictions, metrics, readiness, shutdown)
        .await;
    stop.cancel();
    if let Some(task) = gates_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    let _ = admin_task.await;
    result
}
