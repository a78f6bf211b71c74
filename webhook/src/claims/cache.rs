//! The claims' watch caches: one kube-runtime reflector per claim API the API server serves.
//!
//! [`ClaimsCache`] is made before the API server is reachable (the guard holds its view from the
//! start) and started with [`ClaimsCache::run`] once a [`kube::Client`] exists.
//! [`ClaimsCache::synced`] resolves when every claim API found at start-up has listed its
//! objects; the webhook is not ready before.
//!
//! The three claim APIs ([`Shape`]) are found by discovery. A foreign CRD (about-api, Open
//! Cluster Management) that is installed later is picked up by the next discovery round
//! (`--claims-discovery-interval`, default 1 min), and a cache whose API went away is stopped.
//! Until a shape's cache has synced, rules that need the other claims of that shape deny with
//! 503 ([`Rule::CacheNotSynced`](super::Rule)); the others apply at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::discovery::Discovery;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{ClaimView, Presence, Shape};
use crate::watch::reflect;

/// Settings of the caches.
#[derive(Clone, Debug)]
pub struct ClaimsCacheOptions {
    /// How often to look for claim APIs that appeared or went away after start-up.
    pub discovery_interval: Duration,
}

impl Default for ClaimsCacheOptions {
    fn default() -> Self {
        ClaimsCacheOptions {
            discovery_interval: Duration::from_secs(60),
        }
    }
}

/// The claim caches and the discovery loop that starts and stops them.
pub struct ClaimsCache {
    options: ClaimsCacheOptions,
    claims: Arc<ClaimCaches>,
    synced: watch::Sender<bool>,
}

impl ClaimsCache {
    /// Empty caches, not synced; nothing runs until [`ClaimsCache::run`].
    pub fn new(options: ClaimsCacheOptions) -> Arc<Self> {
        Arc::new(ClaimsCache {
            options,
            claims: Arc::new(ClaimCaches::default()),
            synced: watch::channel(false).0,
        })
    }

    /// The claim caches, as the claims guard reads them.
    pub fn claims(&self) -> Arc<ClaimCaches> {
        self.claims.clone()
    }

    /// Whether every claim API found at start-up has listed its objects.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once every cache started at start-up has synced (never, if they never do).
    pub fn synced(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.synced.subscribe();
        async move {
            // the sender lives as long as the caches; if they are dropped, stay pending
            if rx.wait_for(|synced| *synced).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Discovers the claim APIs, starts their reflectors, marks the caches synced once they
    /// have listed, then re-runs discovery on the interval until `shutdown`. API server
    /// failures are retried with backoff; this never returns an error.
    pub async fn run(self: Arc<Self>, client: Client, shutdown: CancellationToken) {
        let mut backoff = nodewarden_runtime::client::retry_backoff();
        let shapes = loop {
            match discover_claim_apis(&client).await {
                Ok(found) => break found,
                Err(err) => {
                    let wait = backoff.next().unwrap_or(Duration::from_secs(30));
                    tracing::warn!(error = %err, retry_in = ?wait, "discovering the claim APIs failed; not ready");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        };
        self.claims.reconcile(&client, &shapes, &shutdown);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = self.claims.all_ready() => {}
        }
        tracing::info!(watched = ?self.claims.watched(), "caches synced");
        self.synced.send_replace(true);

        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.options.discovery_interval) => {}
            }
            match discover_claim_apis(&client).await {
                Ok(found) => self.claims.reconcile(&client, &found, &shutdown),
                Err(err) => {
                    tracing::warn!(error = %err, "re-discovering the claim APIs failed; keeping the current caches")
                }
            }
        }
    }
}

/// Which of the claim APIs the API server serves, each at its recommended version.
pub(crate) async fn discover_claim_apis(
    client: &Client,
) -> Result<BTreeMap<Shape, ApiResource>, kube::Error> {
    let groups: Vec<&str> = Shape::ALL.iter().map(|s| s.group()).collect();
    let discovery = Discovery::new(client.clone()).filter(&groups).run().await?;
    let mut found = BTreeMap::new();
    for shape in Shape::ALL {
        let resource = discovery
            .get(shape.group())
            .and_then(|group| group.recommended_kind(shape.kind()))
            .map(|(resource, _)| resource)
            .filter(|r| r.plural == shape.plural());
        if let Some(resource) = resource {
            found.insert(shape, resource);
        }
    }
    Ok(found)
}

/// The watch cache of one claim API.
struct ShapeCache {
    resource: ApiResource,
    store: Store<DynamicObject>,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
}

/// The claim caches, one per served claim API.
#[derive(Default)]
pub struct ClaimCaches {
    shapes: RwLock<BTreeMap<Shape, ShapeCache>>,
}

impl ClaimCaches {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Shape, ShapeCache>> {
        self.shapes.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Shape, ShapeCache>> {
        self.shapes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The watched APIs (`group/version`) and whether each has synced.
    pub fn watched(&self) -> Vec<(Shape, String, bool)> {
        self.read()
            .iter()
            .map(|(shape, c)| {
                (
                    *shape,
                    c.resource.api_version.clone(),
                    c.ready.load(Ordering::Acquire),
                )
            })
            .collect()
    }

    /// `spec.value` of claim `name` of `shape`, if watched and present.
    pub fn value(&self, shape: Shape, name: &str) -> Option<String> {
        let shapes = self.read();
        let cache = shapes.get(&shape)?;
        let object = cache
            .store
            .get(&ObjectRef::new_with(name, cache.resource.clone()))?;
        object
            .data
            .get("spec")?
            .get("value")?
            .as_str()
            .map(str::to_string)
    }

    /// Starts caches for APIs in `found` that have none (or whose version changed) and stops
    /// those whose API is gone.
    fn reconcile(&self, client: &Client, found: &BTreeMap<Shape, ApiResource>, shutdown: &CancellationToken) {
        let mut shapes = self.write();
        shapes.retain(|shape, cache| {
            let keep = found
                .get(shape)
                .is_some_and(|r| r.api_version == cache.resource.api_version);
            if !keep {
                tracing::info!(api = %shape, "claim API gone or changed version; stopping its cache");
                cache.stop.cancel();
            }
            keep
        });
        for (shape, resource) in found {
            if shapes.contains_key(shape) {
                continue;
            }
            tracing::info!(api = %shape, version = %resource.api_version, "watching claims");
            shapes.insert(*shape, start_shape_cache(client, *shape, resource, shutdown));
        }
    }

    /// Resolves when every cache started so far has synced.
    async fn all_ready(&self) {
        let flags: Vec<Arc<AtomicBool>> = self.read().values().map(|c| c.ready.clone()).collect();
        while !flags.iter().all(|f| f.load(Ordering::Acquire)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn start_shape_cache(
    client: &Client,
    shape: Shape,
    resource: &ApiResource,
    shutdown: &CancellationToken,
) -> ShapeCache {
    let writer: Writer<DynamicObject> = Writer::new(resource.clone());
    let store = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let stop = shutdown.child_token();
    tokio::spawn(reflect(
        format!("{shape}"),
        api,
        writer,
        watcher::Config::default(),
        stop.clone(),
    ));
    let ready = Arc::new(AtomicBool::new(false));
    let (flag, reader, until) = (ready.clone(), store.clone(), stop.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = until.cancelled() => {}
            synced = reader.wait_until_ready() => {
                if synced.is_ok() {
                    flag.store(true, Ordering::Release);
                    tracing::info!(api = %shape, claims = reader.len(), "claims cache synced");
                }
            }
        }
    });
    ShapeCache {
        resource: resource.clone(),
        store,
        ready,
        stop,
    }
}

impl ClaimView for ClaimCaches {
    fn presence(&self, shape: Shape, name: &str) -> Option<Presence> {
        let shapes = self.read();
        let cache = shapes.get(&shape)?;
        if !cache.ready.load(Ordering::Acquire) {
            return None;
        }
        let object = cache
            .store
            .get(&ObjectRef::new_with(name, cache.resource.clone()));
        Some(match object {
            None => Presence::ABSENT,
            Some(o) if o.metadata.deletion_timestamp.is_some() => Presence::UNCERTAIN,
            Some(_) => Presence::PRESENT,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about() -> ApiResource {
        ApiResource {
            group: "about.k8s.io".to_string(),
            version: "v1beta1".to_string(),
            api_version: "about.k8s.io/v1beta1".to_string(),
            kind: "ClusterProperty".to_string(),
            plural: "clusterproperties".to_string(),
        }
    }

    fn property(name: &str, value: &str, deleting: bool) -> DynamicObject {
        let mut meta = serde_json::json!({"name": name, "uid": format!("uid-{name}")});
        if deleting {
            meta["deletionTimestamp"] = serde_json::json!("2026-11-21T07:00:00Z");
            meta["finalizers"] = serde_json::json!(["example.com/hold"]);
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "about.k8s.io/v1beta1",
            "kind": "ClusterProperty",
            "metadata": meta,
            "spec": {"value": value},
        }))
        .expect("object")
    }

    #[test]
    fn presence_follows_the_watched_objects() {
        let caches = ClaimCaches::default();
        let mut writer: Writer<DynamicObject> = Writer::new(about());
        let ready = Arc::new(AtomicBool::new(false));
        caches.write().insert(
            Shape::About,
            ShapeCache {
                resource: about(),
                store: writer.as_reader(),
                ready: ready.clone(),
                stop: CancellationToken::new(),
            },
        );
        // not watched, and not listed yet: unknown
        assert_eq!(caches.presence(Shape::Nodewarden, "id.k8s.io"), None);
        assert_eq!(caches.presence(Shape::About, "id.k8s.io"), None);

        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(property(
            "id.k8s.io",
            "cluster-a",
            false,
        )));
        writer.apply_watcher_event(&watcher::Event::InitApply(property(
            "clusterset.k8s.io",
            "set-1",
            true,
        )));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        ready.store(true, Ordering::Release);

        assert_eq!(
            caches.presence(Shape::About, "id.k8s.io"),
            Some(Presence::PRESENT)
        );
        // held back by a finalizer: may still exist, but is on its way out
        assert_eq!(
            caches.presence(Shape::About, "clusterset.k8s.io"),
            Some(Presence::UNCERTAIN)
        );
        assert_eq!(
            caches.presence(Shape::About, "cluster.clusterset.k8s.io"),
            Some(Presence::ABSENT)
        );
        assert_eq!(
            caches.value(Shape::About, "id.k8s.io").as_deref(),
            Some("cluster-a")
        );

        writer.apply_watcher_event(&watcher::Event::Delete(property(
            "clusterset.k8s.io",
            "set-1",
            true,
        )));
        assert_eq!(
            caches.presence(Shape::About, "clusterset.k8s.io"),
            Some(Presence::ABSENT)
        );
        assert_eq!(
            caches.watched(),
            vec![(Shape::About, "about.k8s.io/v1beta1".to_string(), true)]
        );
    }
}
