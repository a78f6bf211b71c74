//! Features and NodeFeatureReports watched into memory, and the guard index built from them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::Stream;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::features::{Feature, NodeFeatureReport};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::rules::{GuardIndex, feature_key, guard_index};
use crate::watch::{Change, watch_into};

/// A map filled by a watcher.
struct Watched<V> {
    live: RwLock<HashMap<String, Arc<V>>>,
    synced: AtomicBool,
}

impl<V> Default for Watched<V> {
    fn default() -> Self {
        Watched {
            live: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
        }
    }
}

impl<V> Watched<V> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<V>>> {
        self.live.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<V>>> {
        self.live.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Watch caches of Features and NodeFeatureReports, and the guard index built from them.
pub struct FeatureCaches {
    features: Watched<Feature>,
    reports: Watched<NodeFeatureReport>,
    index: RwLock<Arc<GuardIndex>>,
    /// Counts changes of the reports (the lifecycle controller's trigger).
    report_version: watch::Sender<u64>,
}

impl Default for FeatureCaches {
    fn default() -> Self {
        FeatureCaches {
            features: Watched::default(),
            reports: Watched::default(),
            index: RwLock::default(),
            report_version: watch::Sender::new(0),
        }
    }
}

impl FeatureCaches {
    /// Empty caches, not synced.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether both Features and reports have been listed.
    pub fn is_synced(&self) -> bool {
        self.features.synced.load(Ordering::Acquire) && self.reports.synced.load(Ordering::Acquire)
    }

    /// Resolves once both kinds have been listed.
    pub async fn wait_synced(&self) {
        while !self.is_synced() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// One item after each change of the node reports, from now on, but at most one per
    /// `min_gap`: changes that come faster (5,000 agents refreshing their reports) are merged
    /// into one item.
    pub fn report_changes(&self, min_gap: Duration) -> impl Stream<Item = ()> + Send + 'static {
        let changes = self.report_version.subscribe();
        futures::stream::unfold((changes, false), move |(mut changes, again)| async move {
            if again {
                tokio::time::sleep(min_gap).await;
            }
            changes.changed().await.ok()?;
            Some(((), (changes, true)))
        })
    }

    /// The guarded fields of the Features that count as off.
    pub fn guard_index(&self) -> Arc<GuardIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every Feature.
    pub fn features(&self) -> Vec<Arc<Feature>> {
        self.features.read().values().cloned().collect()
    }

    /// The Feature `namespace/name`.
    pub fn feature(&self, key: &str) -> Option<Arc<Feature>> {
        self.features.read().get(key).cloned()
    }

    /// Every node's report.
    pub fn reports(&self) -> Vec<Arc<NodeFeatureReport>> {
        self.reports.read().values().cloned().collect()
    }

    // ---- writes (also used by tests to fill the caches without a cluster)

    /// Adds or replaces a Feature and rebuilds the guard index.
    pub fn apply_feature(&self, feature: Feature) {
        self.features
            .write()
            .insert(feature_key(&feature), Arc::new(feature));
        self.features_changed();
    }

    /// Removes the Feature `namespace/name` and rebuilds the guard index.
    pub fn delete_feature(&self, key: &str) {
        self.features.write().remove(key);
        self.features_changed();
    }

    /// Adds or replaces a node's report.
    pub fn apply_report(&self, report: NodeFeatureReport) {
        self.reports.write().insert(report.name_any(), Arc::new(report));
        self.reports_changed();
    }

    /// Removes the report of `node`.
    pub fn delete_report(&self, node: &str) {
        self.reports.write().remove(node);
        self.reports_changed();
    }

    fn reports_changed(&self) {
        self.report_version.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn features_changed(&self) {
        let index = {
            let features = self.features.read();
            guard_index(features.values().map(|f| f.as_ref()))
        };
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
    }

    /// Watches Features and NodeFeatureReports until `stop`; errors are logged and retried with
    /// kube-runtime's default backoff.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let features = {
            let caches = self.clone();
            watch_into(
                "features",
                Api::<Feature>::all(client.clone()),
                stop.clone(),
                |f| f,
                move |change| match change {
                    Change::Apply(f) => caches.apply_feature(f),
                    Change::Delete(f) => caches.delete_feature(&feature_key(&f)),
                    Change::Replace(all) => {
                        *caches.features.write() =
                            all.into_iter().map(|f| (feature_key(&f), Arc::new(f))).collect();
                        caches.features.synced.store(true, Ordering::Release);
                        caches.features_changed();
                    }
                },
            )
        };
        let reports = {
            let caches = self.clone();
            watch_into(
                "nodefeaturereports",
                Api::<NodeFeatureReport>::all(client),
                stop.clone(),
                |r| r,
                move |change| match change {
                    Change::Apply(r) => caches.apply_report(r),
                    Change::Delete(r) => caches.delete_report(&r.name_any()),
                    Change::Replace(all) => {
                        *caches.reports.write() =
                            all.into_iter().map(|r| (r.name_any(), Arc::new(r))).collect();
                        caches.reports.synced.store(true, Ordering::Release);
                        caches.reports_changed();
                    }
                },
            )
        };
        tokio::join!(features, reports);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use nodewarden_api::features::NodeFeatureReportSpec;

    fn report(node: &str) -> NodeFeatureReport {
        NodeFeatureReport::new(node, NodeFeatureReportSpec { components: vec![] })
    }

    #[tokio::test]
    async fn a_burst_of_report_changes_is_one_trigger_and_triggers_are_spaced() {
        let caches = FeatureCaches::new();
        let gap = Duration::from_millis(100);
        let mut changes = std::pin::pin!(caches.report_changes(gap));
        for node in ["a", "b", "c"] {
            caches.apply_report(report(node));
        }
        let first = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
        assert_eq!(first.ok().flatten(), Some(()), "the burst triggers");
        let start = std::time::Instant::now();
        caches.apply_report(report("d"));
        caches.delete_report("a");
        let second = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
        assert_eq!(second.ok().flatten(), Some(()), "later changes trigger again");
        assert!(
            start.elapsed() >= gap,
            "not before the gap: {:?}",
            start.elapsed()
        );
        // both later changes were taken together: nothing is left to trigger
        let third = tokio::time::timeout(3 * gap, changes.next()).await;
        assert!(third.is_err(), "no change, no trigger");
        assert_eq!(caches.reports().len(), 3);
    }
}
