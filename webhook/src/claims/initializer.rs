//! The optional ID initializer (`--claims-initialize-id`): when no ID claim exists, create
//! `id.k8s.io` (nodewarden.io `ClusterClaim`) with the `kube-system` namespace UID, as KEP-2149
//! recommends. It never overwrites: it only creates, and the API server refuses a create when
//! the name exists. An existing `cluster.clusterset.k8s.io` also counts as the cluster's ID.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::{Api, Client};
use nodewarden_api::{ClusterClaim, ClusterClaimSpec};
use tokio_util::sync::CancellationToken;

use super::{ID_CLAIM, ID_CLAIMS};
use crate::controllers::{FIELD_MANAGER, LeaderTask, leader_task};

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Initialized {
    /// Created `id.k8s.io` with this value.
    Created(String),
    /// An ID claim already existed (its name); nothing was written.
    AlreadyPresent(&'static str),
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum InitError {
    #[error("reading or creating ClusterClaims: {0}")]
    Claims(#[source] kube::Error),
    #[error("reading namespace kube-system: {0}")]
    KubeSystem(#[source] kube::Error),
    #[error("namespace kube-system has no uid")]
    NoUid,
}

/// One pass: create `id.k8s.io` = kube-system UID unless an ID claim exists.
pub(crate) async fn ensure_id_claim(client: &Client) -> Result<Initialized, InitError> {
    let claims: Api<ClusterClaim> = Api::all(client.clone());
    for name in ID_CLAIMS {
        if claims.get_opt(name).await.map_err(InitError::Claims)?.is_some() {
            return Ok(Initialized::AlreadyPresent(name));
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let uid = namespaces
        .get("kube-system")
        .await
        .map_err(InitError::KubeSystem)?
        .metadata
        .uid
        .filter(|u| !u.is_empty())
        .ok_or(InitError::NoUid)?;
    let claim = ClusterClaim::new(ID_CLAIM, ClusterClaimSpec { value: uid.clone() });
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match claims.create(&params, &claim).await {
        Ok(_) => Ok(Initialized::Created(uid)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Initialized::AlreadyPresent(ID_CLAIM)),
        Err(err) => Err(InitError::Claims(err)),
    }
}

/// Runs [`ensure_id_claim`] every `interval` (sooner after errors) until `stop`.
pub(crate) async fn run(client: Client, interval: Duration, stop: CancellationToken) {
    let mut backoff = nodewarden_runtime::client::retry_backoff();
    loop {
        let wait = match ensure_id_claim(&client).await {
            Ok(Initialized::Created(value)) => {
                tracing::info!(claim = ID_CLAIM, %value, "created the cluster ID claim from the kube-system namespace UID");
                backoff = nodewarden_runtime::client::retry_backoff();
                interval
            }
            Ok(Initialized::AlreadyPresent(name)) => {
                tracing::debug!(claim = name, "an ID claim exists; leaving it alone");
                backoff = nodewarden_runtime::client::retry_backoff();
                interval
            }
            Err(err) => {
                let wait = backoff.next().unwrap_or(interval).min(interval);
                tracing::warn!(error = %err, retry_in = ?wait, "could not ensure the cluster ID claim");
                wait
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The initializer as a leader task, checking every `interval`.
pub fn task(interval: Duration) -> LeaderTask {
    leader_task(move |client, stop| run(client, interval, stop))
}
