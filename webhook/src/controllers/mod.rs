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
//!
//! The controllers that reconcile objects (the Feature lifecycle, the autoscaler status) run on
//! kube-runtime's [`Controller`](kube::runtime::Controller) and share what is here: a
//! [`Reconciling`] per controller times and counts each reconciliation through a
//! [`ReconcileObserver`] (the webhook's metrics, which know no capability), and retries a failed
//! object with its own exponential backoff ([`ObjectBackoff`]: [`BACKOFF_BASE`], doubling up to
//! [`BACKOFF_CAP`], plus up to as much again of jitter), reset by its next success. [`start`]
//! is their one start-up: it waits for the cache the controller reads, builds the kube-runtime
//! `Controller` on every object of the kind, and runs a [`Reconciler`] on it through [`drive`],
//! which runs a controller's result stream to its end and logs what went wrong outside a
//! reconciler. A failed reconciliation is counted by its error's kind
//! ([`ReconcileError::metric_label`], the `error` label of
//! `nodewarden_controller_reconcile_errors_total`).

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use kube_lease_manager::LeaseManagerBuilder;
use serde::de::DeserializeOwned;
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

/// Receives the result of every reconciliation (the webhook's metrics).
pub trait ReconcileObserver: Send + Sync {
    /// One reconciliation of an object by `controller` ended, `ok` or with an error, after `took`.
    fn reconciled(&self, controller: &'static str, ok: bool, took: Duration);

    /// A reconciliation by `controller` failed with an error of kind `error`
    /// ([`ReconcileError::metric_label`]); it is retried.
    fn failed(&self, controller: &'static str, error: &'static str) {
        let _ = (controller, error);
    }
}

/// A reconciler's error, with its kind as a metric label (a few fixed values per controller, so
/// the metric's series stay bounded).
pub trait ReconcileError: std::error::Error + Send + Sync + 'static {
    /// The error's kind: the `error` label of `nodewarden_controller_reconcile_errors_total`.
    fn metric_label(&self) -> &'static str;
}

/// Delay before the first retry of an object whose reconciliation failed.
pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// The delay doubles with every further failure up to this (before jitter, which adds at most as
/// much again: no object waits more than twice this).
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);

/// Per-object exponential backoff of failed reconciliations: each object (by its key) has its
/// own sequence of delays, so one failing object neither slows the others down nor is retried
/// in a tight loop. A success forgets the object's failures.
pub struct ObjectBackoff {
    base: Duration,
    cap: Duration,
    delays: Mutex<HashMap<String, backon::ExponentialBackoff>>,
}

impl ObjectBackoff {
    /// Delays from `base`, doubling up to `cap`, each with up to as much again of jitter.
    pub fn new(base: Duration, cap: Duration) -> Self {
        ObjectBackoff {
            base,
            cap,
            delays: Mutex::new(HashMap::new()),
        }
    }

    /// One more failure of `key`: how long to wait before its next attempt.
    pub fn failed(&self, key: &str) -> Duration {
        let mut delays = self.delays.lock().unwrap_or_else(|p| p.into_inner());
        let delays = delays.entry(key.to_string()).or_insert_with(|| {
            backon::ExponentialBuilder::default()
                .with_min_delay(self.base)
                .with_max_delay(self.cap)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times()
                .build()
        });
        delays.next().unwrap_or(self.cap)
    }

    /// `key` was reconciled: its next failure starts from the base delay again.
    pub fn succeeded(&self, key: &str) {
        self.delays.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

impl Default for ObjectBackoff {
    fn default() -> Self {
        Self::new(BACKOFF_BASE, BACKOFF_CAP)
    }
}

/// What every reconciling controller has: its name (the `controller` label of its metrics), the
/// observer of its results and the per-object backoff of its error policy.
pub struct Reconciling {
    name: &'static str,
    observer: Option<Arc<dyn ReconcileObserver>>,
    backoff: ObjectBackoff,
}

impl Reconciling {
    /// The shared parts of controller `name`, with the default backoff.
    pub fn new(name: &'static str, observer: Option<Arc<dyn ReconcileObserver>>) -> Self {
        Reconciling {
            name,
            observer,
            backoff: ObjectBackoff::default(),
        }
    }

    /// The controller's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs one reconciliation of the object `key`: times it, reports its result, and forgets
    /// the object's failures when it succeeds.
    pub async fn observe<T, E>(&self, key: &str, work: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let started = Instant::now();
        let result = work.await;
        if let Some(observer) = &self.observer {
            observer.reconciled(self.name, result.is_ok(), started.elapsed());
        }
        if result.is_ok() {
            self.backoff.succeeded(key);
        }
        result
    }

    /// The error policy: logs `error`, counts it by its kind, and requeues the object `key` after
    /// its next backoff delay.
    pub fn retry(&self, key: &str, error: &impl ReconcileError) -> Action {
        if let Some(observer) = &self.observer {
            observer.failed(self.name, error.metric_label());
        }
        Action::requeue(self.retry_delay(key, error))
    }

    fn retry_delay(&self, key: &str, error: &dyn Display) -> Duration {
        let wait = self.backoff.failed(key);
        tracing::warn!(controller = self.name, object = %key, error = %error, retry_in = ?wait,
            "reconciling failed; retrying");
        wait
    }
}

/// What a controller does with each object of kind `K`; [`start`] runs it.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Why a reconciliation failed; the object is retried with its own backoff.
    type Error: ReconcileError;

    /// The controller's name, observer and per-object backoff.
    fn reconciling(&self) -> &Reconciling;

    /// Reconciles the object `key` (namespace/name): what to do next, or why it failed.
    fn reconcile(
        self: Arc<Self>,
        key: String,
        object: Arc<K>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send + 'static;
}

/// The key of an object in the backoff and the logs: namespace/name (`/name` when it has no
/// namespace).
pub fn object_key<K: Resource>(object: &K) -> String {
    format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
}

/// The start-up every reconciling controller shares. Once `synced` (the cache the reconciler
/// reads is filled), unless `stop` comes first: a kube-runtime `Controller` on every `K`,
/// reconciling at most `concurrency` objects at once, changed by `adjust` (more triggers), that
/// stops gracefully at `stop`; the reconciler made by `make` from the client and the controller's
/// own store of the objects; then [`drive`] until the controller ends. Each reconciliation is
/// timed and counted ([`Reconciling::observe`]), each failure retried ([`Reconciling::retry`]).
pub async fn start<K, R>(
    client: Client,
    stop: CancellationToken,
    synced: impl Future<Output = ()>,
    concurrency: u16,
    adjust: impl FnOnce(Controller<K>) -> Controller<K>,
    make: impl FnOnce(Client, Store<K>) -> R,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    R: Reconciler<K>,
{
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = synced => {}
    }
    let controller = Controller::new(Api::<K>::all(client.clone()), watcher::Config::default())
        .with_config(controller::Config::default().concurrency(concurrency));
    let controller = adjust(controller).graceful_shutdown_on(stop.cancelled_owned());
    let reconciler = Arc::new(make(client, controller.store()));
    let name = reconciler.reconciling().name();
    drive(
        name,
        controller.run(reconcile::<K, R>, error_policy::<K, R>, reconciler),
    )
    .await;
}

async fn reconcile<K, R>(object: Arc<K>, reconciler: Arc<R>) -> Result<Action, R::Error>
where
    K: Resource + Send + Sync + 'static,
    R: Reconciler<K>,
{
    let key = object_key(object.as_ref());
    let work = reconciler.clone().reconcile(key.clone(), object);
    reconciler.reconciling().observe(&key, work).await
}

fn error_policy<K: Resource, R: Reconciler<K>>(
    object: Arc<K>,
    error: &R::Error,
    reconciler: Arc<R>,
) -> Action {
    reconciler
        .reconciling()
        .retry(&object_key(object.as_ref()), error)
}

/// Runs a controller's result stream to its end (graceful shutdown ends it). Reconciler errors
/// were logged by [`Reconciling::retry`]; this logs the rest (watch errors, objects gone).
pub async fn drive<K, E>(
    name: &'static str,
    results: impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, watcher::Error>>>,
) where
    K: Resource,
    E: std::error::Error + 'static,
{
    tracing::info!(controller = name, "controller started");
    results
        .for_each(|result| async move {
            match result {
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(object)) => {
                    tracing::debug!(controller = name, %object, "object gone before it was reconciled")
                }
                Err(err) => tracing::warn!(controller = name, error = %err, "controller error; retrying"),
            }
        })
        .await;
    tracing::info!(controller = name, "controller stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_object_backs_off_on_its_own_doubling_up_to_the_cap() {
        let backoff = ObjectBackoff::new(Duration::from_secs(1), Duration::from_secs(8));
        // jitter adds between nothing and as much again
        let within =
            |d: Duration, base: u64| d >= Duration::from_secs(base) && d < Duration::from_secs(2 * base);
        let delays: Vec<Duration> = (0..7).map(|_| backoff.failed("ns/a")).collect();
        for (d, base) in delays.iter().zip([1, 2, 4, 8, 8, 8, 8]) {
            assert!(within(*d, base), "{delays:?}");
        }
        // another object starts from the base, whatever the first one has been through
        assert!(within(backoff.failed("ns/b"), 1));
        // a success starts the object over
        backoff.succeeded("ns/a");
        assert!(within(backoff.failed("ns/a"), 1));
        assert!(within(backoff.failed("ns/b"), 2));
    }

    #[test]
    fn the_default_backoff_is_bounded() {
        let backoff = ObjectBackoff::default();
        let first = backoff.failed("x");
        assert!(first >= BACKOFF_BASE && first < 2 * BACKOFF_BASE, "{first:?}");
        let worst = (0..40).map(|_| backoff.failed("x")).max().unwrap_or_default();
        assert!(worst >= BACKOFF_CAP && worst < 2 * BACKOFF_CAP, "{worst:?}");
    }

    #[derive(Default)]
    struct Counted(Mutex<Vec<(&'static str, bool)>>);

    impl ReconcileObserver for Counted {
        fn reconciled(&self, controller: &'static str, ok: bool, _took: Duration) {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((controller, ok));
        }
    }

    #[tokio::test]
    async fn every_reconciliation_is_reported_and_a_success_resets_the_backoff() {
        let counted = Arc::new(Counted::default());
        let reconciling = Reconciling::new("test", Some(counted.clone()));
        let failed: Result<(), &str> = reconciling.observe("ns/a", async { Err("no") }).await;
        assert!(failed.is_err());
        let first = reconciling.retry_delay("ns/a", &"no");
        let second = reconciling.retry_delay("ns/a", &"no");
        assert!(second >= 2 * BACKOFF_BASE, "{second:?} after {first:?}");
        let ok: Result<(), &str> = reconciling.observe("ns/a", async { Ok(()) }).await;
        assert!(ok.is_ok());
        let after = reconciling.retry_delay("ns/a", &"no");
        assert!(after < 2 * BACKOFF_BASE, "{after:?}");
        assert_eq!(
            *counted.0.lock().unwrap_or_else(|p| p.into_inner()),
            vec![("test", false), ("test", true)]
        );
    }
}
