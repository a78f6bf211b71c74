//! Watching the API server into in-memory caches: the loops every capability's cache is filled by.
//!
//! [`reflect`] keeps a kube-runtime reflector [`Store`](kube::runtime::reflector::Store) up to
//! date; [`watch_into`] hands each change to a closure, for caches that keep only what they read.

use std::fmt::Debug;
use std::hash::Hash;

use futures::StreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// Runs a reflector for `api` into `writer` until `stop`: list, then watch, re-listing with
/// kube-runtime's default backoff after errors (which are logged).
pub(crate) async fn reflect<K>(
    what: String,
    api: Api<K>,
    writer: Writer<K>,
    config: watcher::Config,
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    let mut stream = std::pin::pin!(stream);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            next = stream.next() => match next {
                Some(Ok(_)) => {}
                Some(Err(err)) => tracing::warn!(cache = %what, error = %err, "watch failed; retrying"),
                None => break,
            },
        }
    }
    tracing::debug!(cache = %what, "cache stopped");
}

/// A change to a watched collection.
pub(crate) enum Change<V> {
    Apply(V),
    Delete(V),
    /// A complete (re-)list.
    Replace(Vec<V>),
}

/// Runs a watcher on `api` until `stop`, handing each object through `convert` (so a re-list
/// buffers only what the cache keeps, not whole objects) and then to `apply`. Errors are
/// logged and retried with kube-runtime's default backoff.
pub(crate) async fn watch_into<K, V, C, F>(
    what: &'static str,
    api: kube::Api<K>,
    stop: CancellationToken,
    mut convert: C,
    mut apply: F,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    C: FnMut(K) -> V,
    F: FnMut(Change<V>),
{
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Vec<V> = Vec::new();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(watcher::Event::Init)) => buffer.clear(),
            Some(Ok(watcher::Event::InitApply(obj))) => buffer.push(convert(obj)),
            Some(Ok(watcher::Event::InitDone)) => {
                let all = std::mem::take(&mut buffer);
                tracing::info!(cache = what, objects = all.len(), "cache listed");
                apply(Change::Replace(all));
                // the list's pages, decoded and dropped, leave free heap below the cache's
                // live data; glibc keeps it resident until trimmed
                nodewarden_sys::release_free_heap();
            }
            Some(Ok(watcher::Event::Apply(obj))) => apply(Change::Apply(convert(obj))),
            Some(Ok(watcher::Event::Delete(obj))) => apply(Change::Delete(convert(obj))),
            Some(Err(err)) => tracing::warn!(cache = what, error = %err, "watch failed; retrying"),
            None => break,
        }
    }
}
