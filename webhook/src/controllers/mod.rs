//! nodewarden's controllers. They run in the webhook process, and only in the replica that holds
//! the Lease `nodewarden-controllers` (leader election with the `kube-lease-manager` crate, on
//! `coordination.k8s.io/v1` Leases).
//!
//! Leader election only runs when at least one controller is enabled. Timing: a Lease lasts
//! [`LEASE_DURATION_SECS`]; the holder renews it [`LEASE_GRACE_SECS`] before it runs out; a
//! replica that stops releases it, so another takes over at once; one that dies is replaced once
//! the Lease has expired. A holder that cannot reach the API server keeps acting as leader until
//! it can tell otherwise, so the controllers' writes are safe with two leaders at once (the ID
//! initializer only ever creates, which the API server makes atomic).

pub mod claims_id;
pub mod features;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

use crate::admission::features::{FeatureCaches, FeaturesObserver};
use crate::admission::rightsizing::RightsizingIndex;
use crate::admission::rightsizing::status as rightsizing_status;

/// Name of the Lease the replicas compete for.
pub const LEASE_NAME: &str = "nodewarden-controllers";
/// Field manager of the controllers' writes.
pub const FIELD_MANAGER: &str = "nodewarden-controllers";
/// How long a Lease is valid after its last renewal, in seconds.
pub const LEASE_DURATION_SECS: u64 = 15;
/// How long before expiry the holder renews, in seconds.
pub const LEASE_GRACE_SECS: u64 = 5;

/// What the controllers need.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Namespace of the Lease (the webhook's own).
    pub namespace: String,
    /// This replica's name in the Lease (the pod name).
    pub identity: String,
    /// Create `id.k8s.io` from the `kube-system` namespace UID when no ID claim exists.
    pub initialize_id: bool,
    /// How often the leader checks that an ID claim exists.
    pub initialize_interval: Duration,
}

impl ControllerOptions {
    fn any_enabled(&self) -> bool {
        self.initialize_id
    }
}

/// Controllers that read the webhook's in-memory caches, besides those [`ControllerOptions`]
/// switches on.
#[derive(Clone, Default)]
pub struct CacheControllers {
    /// Keep `DaemonSetAutoscaler.status` from the right-sizing index, every interval.
    pub rightsizing_status: Option<(Arc<RightsizingIndex>, Duration)>,
    /// Run the Feature lifecycle controller from the features caches.
    pub features: Option<FeaturesController>,
}

/// What the Feature lifecycle controller needs.
#[derive(Clone)]
pub struct FeaturesController {
    pub caches: Arc<FeatureCaches>,
    pub options: features::FeaturesOptions,
    pub observer: Option<Arc<dyn FeaturesObserver>>,
}

/// Takes part in leader election and runs the enabled controllers while this replica leads,
/// until `shutdown`; then releases the Lease. API errors are retried with backoff.
pub async fn run(client: Client, options: ControllerOptions, shutdown: CancellationToken) {
    run_with(client, options, CacheControllers::default(), shutdown).await;
}

/// [`run`], with the controllers that read the caches.
pub async fn run_with(
    client: Client,
    options: ControllerOptions,
    cached: CacheControllers,
    shutdown: CancellationToken,
) {
    if !options.any_enabled() && cached.rightsizing_status.is_none() && cached.features.is_none() {
        tracing::info!("no controller enabled; not taking part in leader election");
        return;
    }
    let mut backoff = crate::retry_backoff();
    while !shutdown.is_cancelled() {
        let built = LeaseManagerBuilder::new(client.clone(), LEASE_NAME)
            .with_namespace(options.namespace.clone())
            .with_identity(options.identity.clone())
            .with_field_manager(format!("{FIELD_MANAGER}-{}", options.identity))
            .with_duration(LEASE_DURATION_SECS)
            .with_grace(LEASE_GRACE_SECS)
            .build()
            .await;
        let manager = match built {
            Ok(m) => m,
            Err(err) => {
                let wait = backoff.next().unwrap_or(Duration::from_secs(30));
                tracing::warn!(error = %err, namespace = %options.namespace, lease = LEASE_NAME, retry_in = ?wait,
                    "cannot use the controllers' Lease; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        backoff = crate::retry_backoff();
        let (leading, task) = manager.watch().await;
        follow_leadership(&client, &options, &cached, leading, &shutdown).await;
        // the receiver is dropped: the manager releases the Lease (if held) and ends
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("left leader election"),
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "leader election ended with an error"),
            Ok(Err(err)) => tracing::warn!(error = %err, "leader election task failed"),
            Err(_) => tracing::warn!("releasing the Lease took too long; it will expire on its own"),
        }
    }
}

/// Runs the controllers whenever `leading` says so; returns on shutdown or when the election
/// task is gone.
async fn follow_leadership(
    client: &Client,
    options: &ControllerOptions,
    cached: &CacheControllers,
    mut leading: tokio::sync::watch::Receiver<bool>,
    shutdown: &CancellationToken,
) {
    loop {
        let is_leader = *leading.borrow_and_update();
        if is_leader {
            tracing::info!(identity = %options.identity, "leading: starting controllers");
            let lead = shutdown.child_token();
            let work = tokio::spawn(lead_controllers(
                client.clone(),
                options.clone(),
                cached.clone(),
                lead.clone(),
            ));
            let ended = tokio::select! {
                _ = shutdown.cancelled() => true,
                changed = leading.changed() => changed.is_err(),
            };
            lead.cancel();
            let _ = work.await;
            tracing::info!(identity = %options.identity, "stopped leading");
            if ended {
                return;
            }
        } else {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// The controllers of the leader, until `stop`.
async fn lead_controllers(
    client: Client,
    options: ControllerOptions,
    cached: CacheControllers,
    stop: CancellationToken,
) {
    let id = async {
        if options.initialize_id {
            claims_id::run(client.clone(), options.initialize_interval, stop.clone()).await;
        }
    };
    let status = async {
        if let Some((index, interval)) = cached.rightsizing_status {
            rightsizing_status::run(client.clone(), index, interval, stop.clone()).await;
        }
    };
    let lifecycle = async {
        if let Some(f) = cached.features {
            features::run(client.clone(), f.caches, f.options, f.observer, stop.clone()).await;
        }
    };
    tokio::join!(id, status, lifecycle);
}
