//! nodewarden's controllers. They run in the webhook process, and only in the replica that holds
//! the Lease `nodewarden-controllers` (leader election with the `kube-lease-manager` crate, on
//! `coordination.k8s.io/v1` Leases).
//!
//! Each capability hands in its controllers as [`LeaderTask`]s; this module knows none of them.
//! Leader election only runs when at least one controller is enabled. Timing: a Lease lasts
//! [`LEASE_DURATION_SECS`]; the holder renews it [`LEASE_GRACE_SECS`] before it runs out; a
//! replica that stops releases it, so another takes over at once; one that dies is replaced once
//! the Lease has expired. A holder that cannot reach the API server keeps acting as leader until
//! it can tell otherwise, so the controllers' writes are safe with two leaders at once (the ID
//! initializer only ever creates, which the API server makes atomic).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

/// Name of the Lease the replicas compete for.
pub const LEASE_NAME: &str = "nodewarden-controllers";
/// Field manager of the controllers' writes.
pub const FIELD_MANAGER: &str = "nodewarden-controllers";
/// How long a Lease is valid after its last renewal, in seconds.
pub const LEASE_DURATION_SECS: u64 = 15;
/// How long before expiry the holder renews, in seconds.
pub const LEASE_GRACE_SECS: u64 = 5;

/// Who takes part in leader election.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Namespace of the Lease (the webhook's own).
    pub namespace: String,
    /// This replica's name in the Lease (the pod name).
    pub identity: String,
}

/// One controller run by the leader: started with a client when this replica starts leading,
/// stopped through the token when it stops. Built by each capability (e.g.
/// `claims::initializer::task`).
pub type LeaderTask = Arc<dyn Fn(Client, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;

/// A [`LeaderTask`] from an async function of the client and the stop token.
pub fn leader_task<F, Fut>(run: F) -> LeaderTask
where
    F: Fn(Client, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |client, stop| Box::pin(run(client, stop)))
}

/// Takes part in leader election and runs the enabled controllers while this replica leads,
/// until `shutdown`; then releases the Lease. API errors are retried with backoff.
pub async fn run(
    client: Client,
    options: ControllerOptions,
    tasks: Vec<LeaderTask>,
    shutdown: CancellationToken,
) {
    if tasks.is_empty() {
        tracing::info!("no controller enabled; not taking part in leader election");
        return;
    }
    let mut backoff = nodewarden_runtime::client::retry_backoff();
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
        backoff = nodewarden_runtime::client::retry_backoff();
        let (leading, task) = manager.watch().await;
        follow_leadership(&client, &options, &tasks, leading, &shutdown).await;
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
    tasks: &[LeaderTask],
    mut leading: tokio::sync::watch::Receiver<bool>,
    shutdown: &CancellationToken,
) {
    loop {
        let is_leader = *leading.borrow_and_update();
        if is_leader {
            tracing::info!(identity = %options.identity, "leading: starting controllers");
            let lead = shutdown.child_token();
            let work = tokio::spawn(futures::future::join_all(
                tasks
                    .iter()
                    .map(|task| task(client.clone(), lead.clone()))
                    .collect::<Vec<_>>(),
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
