//! The cluster's LimitRanges, watched into a store the updater reads each round (the
//! webhook's figures for a pod respect its namespace's LimitRanges, and so do the agent's).

use k8s_openapi::api::core::v1::LimitRange;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

pub(super) fn watch_limit_ranges(client: Client, stop: CancellationToken) -> Store<LimitRange> {
    let (store, writer) = reflector::store();
    let api: Api<LimitRange> = Api::all(client);
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                item = futures::StreamExt::next(&mut stream) => match item {
                    Some(Ok(_)) => {}
                    Some(Err(err)) => tracing::warn!(error = %err, "limitranges watch error; retrying"),
                    None => return,
                }
            }
        }
    });
    store
}
