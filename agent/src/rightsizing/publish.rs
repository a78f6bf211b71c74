//! Publishing `NodeRecommendation/<node>` (server-side apply with field manager
//! `nodewarden-agent`, owner reference to the Node, retried with backoff), and reading the node's
//! allocatable that caps its figures. What is written and when are the estimator's
//! (`nodewarden_estimator::figures`, `nodewarden_estimator::due`).

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nodewarden_api::rightsizing::{NodeRecommendation, NodeRecommendationSpec};
use nodewarden_estimator::figures::{Figures, allocatable_of, object};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Field manager of every write.
pub const FIELD_MANAGER: &str = "nodewarden-agent";

/// How often the agent reads its Node's allocatable again (it changes with the kubelet's
/// configuration, rarely), and how soon after a failed read.
pub const ALLOCATABLE_REFRESH: Duration = Duration::from_secs(300);
const ALLOCATABLE_RETRY: Duration = Duration::from_secs(30);

/// Reads the agent's own Node's allocatable at once and every [`ALLOCATABLE_REFRESH`] into `out`
/// (only its own Node: `get nodes/<node>`), until `stop` fires. A failed read keeps the last
/// figures and is retried sooner.
pub async fn watch_allocatable(
    client: Client,
    node: String,
    out: watch::Sender<Figures>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut warned = false;
    loop {
        let wait = match nodes.get(&node).await {
            Ok(n) => {
                let figures = allocatable_of(&n);
                out.send_if_modified(|old| {
                    let changed = *old != figures;
                    *old = figures;
                    changed
                });
                warned = false;
                ALLOCATABLE_REFRESH
            }
            Err(err) => {
                if !warned {
                    tracing::warn!(node = %node, error = %err, "cannot read the node's allocatable resources; figures are not capped at them until it can");
                    warned = true;
                }
                ALLOCATABLE_RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// What the sampler hands to the publisher: the spec to write, newest wins.
pub type Desired = Option<Arc<NodeRecommendationSpec>>;

/// Backoff between failed writes: 1 s doubling to 5 min, with jitter, forever.
pub fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(300))
        .with_jitter()
        .without_max_times()
}

/// Writes every new desired spec; on failure retries with [`backoff`], always with the newest
/// spec, until it is written or `stop` fires.
pub async fn run_publisher(
    client: Client,
    node: String,
    mut desired: watch::Receiver<Desired>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    backoff: ExponentialBuilder,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let recs: Api<NodeRecommendation> = Api::all(client);
    let mut node_uid: Option<String> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
        }
        desired.borrow_and_update();
        let attempt = || async {
            // always the newest spec, also on a retry
            let Some(spec) = desired.borrow().clone() else {
                return Ok::<Option<String>, kube::Error>(None);
            };
            let uid = match &node_uid {
                Some(uid) => uid.clone(),
                None => nodes.get(&node).await?.metadata.uid.unwrap_or_default(),
            };
            let obj = object(&node, &uid, (*spec).clone());
            recs.patch(
                &node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await?;
            Ok(Some(uid))
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            r = attempt
                .retry(backoff)
                .notify(|err: &kube::Error, after: Duration| {
                    metrics.write_error();
                    tracing::warn!(error = %err, retry_in = ?after, "writing NodeRecommendation failed; measuring goes on");
                }) => r,
        };
        match result {
            Ok(None) => {}
            Ok(Some(uid)) => {
                metrics.write_ok();
                node_uid = Some(uid);
                tracing::debug!(node = %node, "NodeRecommendation written");
            }
            Err(err) => tracing::error!(error = %err, "giving up writing NodeRecommendation"),
        }
    }
}
