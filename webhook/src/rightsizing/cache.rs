//! What the right-sizing handler reads on the request path, kept in memory from watches:
//! autoscalers by (namespace, DaemonSet), node targets by node name, LimitRanges by namespace,
//! and the Nodes' labels (for the node groups of `scope: NodeGroup` and `coldStart: Group`).
//!
//! The index holds compact figures, not the objects: a `NodeRecommendation` becomes a list of
//! (slot, millicores, bytes), 24 bytes an entry, where the slot, interned, names the autoscaler
//! and the container (one copy shared by all nodes); the Nodes' labels are interned (key,
//! value) pairs. With 5,000 to 15,000 nodes × 20 autoscalers that is what keeps the cache small
//! (see docs/benchmarks.md).
//!
//! [`RightsizingCache::run`] fills it with kube-runtime watchers (list, then watch; a re-list
//! replaces a kind's contents at once when it is complete) until cancelled.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{LimitRange, Node};
use kube::core::PartialObjectMeta;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::domain::rightsizing::precedence;
use nodewarden_api::domain::sizing::{Amounts, StatusFigures, Targets, status_figures};
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, NodeRecommendation};
use tokio_util::sync::CancellationToken;

use crate::watch::{Change, watch_into};

/// (namespace, name).
pub type Key = (Arc<str>, Arc<str>);

/// What a node's entry is for: the autoscaler (namespace, name), the container, and which
/// figures the entry carries. Interned: every node's entry for the same container shares one.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The autoscaler (namespace and name) the figures are for.
    pub autoscaler: Key,
    /// The container.
    pub container: Arc<str>,
    cpu: bool,
    memory: bool,
}

/// One target of one node: its slot and its figures (24 bytes; a figure the slot says is absent
/// reads 0 here and `None` from [`amounts`](Self::amounts)).
#[derive(Clone, Debug)]
pub struct NodeEntry {
    slot: Arc<Slot>,
    cpu: u64,
    memory: u64,
}

impl NodeEntry {
    /// The autoscaler, the container and which figures there are.
    pub fn slot(&self) -> &Slot {
        &self.slot
    }

    /// The container's targets on this node.
    pub fn amounts(&self) -> Amounts {
        Amounts {
            cpu: self.slot.cpu.then_some(self.cpu),
            memory: self.slot.memory.then_some(self.memory),
        }
    }
}

/// One node's targets (one allocation per node).
pub type NodeTargets = Arc<[NodeEntry]>;

/// One label of a node, (key, value), interned: nodes with the same label share it.
pub type Label = Arc<(Arc<str>, Arc<str>)>;

/// One node's labels.
pub type NodeLabels = Box<[Label]>;

/// One node's pod counts: per autoscaler, its running pods there and how many are up to date.
pub type NodePodCounts = Arc<[(Key, i32, i32)]>;

/// An autoscaler with what its status gives every node, read once when it changes (so the
/// request path parses no quantity of the status).
#[derive(Debug)]
pub struct Prepared {
    /// The autoscaler.
    pub autoscaler: Arc<DaemonSetAutoscaler>,
    /// Its fleet and group figures.
    pub figures: StatusFigures,
}

impl Prepared {
    fn of(autoscaler: Arc<DaemonSetAutoscaler>) -> Arc<Self> {
        let figures = status_figures(&autoscaler);
        Arc::new(Prepared { autoscaler, figures })
    }
}

/// One shared copy of each value.
struct Interner<T: ?Sized> {
    values: std::sync::Mutex<HashSet<Arc<T>>>,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            values: std::sync::Mutex::new(HashSet::new()),
        }
    }
}

impl<T: ?Sized + Eq + Hash> Interner<T> {
    /// The shared copy of `value`, made by `make` the first time.
    fn get_or<Q>(&self, value: &Q, make: impl FnOnce() -> Arc<T>) -> Arc<T>
    where
        Q: ?Sized + Eq + Hash,
        Arc<T>: Borrow<Q>,
    {
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = values.get(value) {
            return found.clone();
        }
        let new = make();
        values.insert(new.clone());
        new
    }

    /// Forgets values nothing else holds any more.
    fn prune(&self) {
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        values.retain(|n| Arc::strong_count(n) > 1);
        values.shrink_to_fit();
    }
}

impl Interner<str> {
    fn get(&self, name: &str) -> Arc<str> {
        self.get_or(name, || Arc::from(name))
    }
}

impl<T: Eq + Hash> Interner<T> {
    fn get_owned(&self, value: T) -> Arc<T> {
        let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = values.get(&value) {
            return found.clone();
        }
        let new = Arc::new(value);
        values.insert(new.clone());
        new
    }
}

/// The index's interned values: names, slots and labels.
#[derive(Default)]
struct Interned {
    names: Interner<str>,
    slots: Interner<Slot>,
    labels: Interner<(Arc<str>, Arc<str>)>,
}

impl Interned {
    fn get(&self, name: &str) -> Arc<str> {
        self.names.get(name)
    }

    /// Forgets what nothing else holds any more (slots and labels first: they hold names).
    fn prune(&self) {
        self.slots.prune();
        self.labels.prune();
        self.names.prune();
    }
}

fn key(namespace: &str, name: &str) -> Key {
    (Arc::from(namespace), Arc::from(name))
}

/// A map filled by a watcher: `Init` starts a fresh buffer, `InitDone` swaps it in.
struct Watched<K, V> {
    live: RwLock<HashMap<K, V>>,
    synced: AtomicBool,
}

impl<K: Eq + Hash, V> Default for Watched<K, V> {
    fn default() -> Self {
        Watched {
            live: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
        }
    }
}

impl<K: Eq + Hash, V> Watched<K, V> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<K, V>> {
        self.live.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<K, V>> {
        self.live.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The right-sizing caches.
#[derive(Default)]
pub struct RightsizingCache {
    /// Autoscalers by their own (namespace, name).
    autoscalers: Watched<Key, Arc<DaemonSetAutoscaler>>,
    /// (namespace, DaemonSet) → the autoscalers that target it, oldest first.
    by_target: RwLock<HashMap<Key, Vec<Arc<Prepared>>>>,
    /// Node name → its targets.
    nodes: Watched<Arc<str>, NodeTargets>,
    /// Node name → per autoscaler, its running pods there and how many are up to date.
    pods: Watched<Arc<str>, NodePodCounts>,
    /// Node name → its labels (from a metadata-only watch of the Nodes).
    node_labels: Watched<Arc<str>, NodeLabels>,
    /// (namespace, name) → LimitRange.
    limit_ranges: Watched<Key, Arc<LimitRange>>,
    /// Namespace → its LimitRanges.
    by_namespace: RwLock<HashMap<Arc<str>, Vec<Arc<LimitRange>>>>,
    names: Interned,
}

impl RightsizingCache {
    /// An empty index, not synced.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether every kind has been listed once.
    pub fn is_synced(&self) -> bool {
        self.autoscalers.synced.load(Ordering::Acquire)
            && self.nodes.synced.load(Ordering::Acquire)
            && self.limit_ranges.synced.load(Ordering::Acquire)
            && self.node_labels.synced.load(Ordering::Acquire)
    }

    /// Resolves once [`is_synced`](Self::is_synced).
    pub async fn wait_synced(&self) {
        while !self.is_synced() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The autoscaler for DaemonSet `daemonset` in `namespace`: the oldest, when (against the
    /// validating webhook) there are several.
    pub fn autoscaler_for(&self, namespace: &str, daemonset: &str) -> Option<Arc<DaemonSetAutoscaler>> {
        Some(self.prepared_for(namespace, daemonset)?.autoscaler.clone())
    }

    /// [`autoscaler_for`](Self::autoscaler_for) with its fleet and group figures.
    pub fn prepared_for(&self, namespace: &str, daemonset: &str) -> Option<Arc<Prepared>> {
        let map = self.by_target.read().unwrap_or_else(|p| p.into_inner());
        map.get(&key(namespace, daemonset))?.first().cloned()
    }

    /// Every autoscaler that targets DaemonSet `daemonset` in `namespace`, oldest first.
    pub fn autoscalers_for(&self, namespace: &str, daemonset: &str) -> Vec<Arc<DaemonSetAutoscaler>> {
        let map = self.by_target.read().unwrap_or_else(|p| p.into_inner());
        map.get(&key(namespace, daemonset))
            .map(|list| list.iter().map(|p| p.autoscaler.clone()).collect())
            .unwrap_or_default()
    }

    /// Every autoscaler.
    pub fn autoscalers(&self) -> Vec<Arc<DaemonSetAutoscaler>> {
        self.autoscalers.read().values().cloned().collect()
    }

    /// What node `node` recommends for the containers of autoscaler `namespace/name`.
    pub fn node_targets(&self, node: &str, namespace: &str, name: &str) -> Option<Targets> {
        let nodes = self.nodes.read();
        let targets = targets_of(nodes.get(node)?, namespace, name);
        (!targets.is_empty()).then_some(targets)
    }

    /// Every node's targets for autoscaler `namespace/name`, by node.
    pub fn all_node_targets(&self, namespace: &str, name: &str) -> Vec<(Arc<str>, Targets)> {
        let nodes = self.nodes.read();
        nodes
            .iter()
            .map(|(node, t)| (node.clone(), targets_of(t, namespace, name)))
            .filter(|(_, t)| !t.is_empty())
            .collect()
    }

    /// Autoscaler `namespace/name`'s running pods and how many are up to date, summed over the
    /// nodes that report them; `None` when no node does.
    pub fn pods_of(&self, namespace: &str, name: &str) -> Option<(i32, i32)> {
        let pods = self.pods.read();
        let mut sum: Option<(i32, i32)> = None;
        for entries in pods.values() {
            for (key, running, up_to_date) in entries.iter() {
                if &*key.0 == namespace && &*key.1 == name {
                    let s = sum.get_or_insert((0, 0));
                    s.0 = s.0.saturating_add(*running);
                    s.1 = s.1.saturating_add(*up_to_date);
                }
            }
        }
        sum
    }

    /// The value of label `key` on node `node`; `None` when the node or the label is unknown.
    pub fn node_label(&self, node: &str, key: &str) -> Option<Arc<str>> {
        let labels = self.node_labels.read();
        labels
            .get(node)?
            .iter()
            .find(|label| &*label.0 == key)
            .map(|label| label.1.clone())
    }

    /// Number of Nodes whose labels are known.
    pub fn labelled_node_count(&self) -> usize {
        self.node_labels.read().len()
    }

    /// Number of nodes with a recommendation of any autoscaler.
    pub fn node_count(&self) -> usize {
        self.nodes.read().len()
    }

    /// The LimitRanges of `namespace`.
    pub fn limit_ranges(&self, namespace: &str) -> Vec<LimitRange> {
        let map = self.by_namespace.read().unwrap_or_else(|p| p.into_inner());
        map.get(namespace)
            .map(|v| v.iter().map(|lr| lr.as_ref().clone()).collect())
            .unwrap_or_default()
    }

    // ---- writes (also used by tests and benchmarks to fill the index without a cluster)

    /// Adds or replaces an autoscaler.
    pub fn apply_autoscaler(&self, autoscaler: DaemonSetAutoscaler) {
        let k = key(
            &autoscaler.namespace().unwrap_or_default(),
            &autoscaler.name_any(),
        );
        self.autoscalers.write().insert(k, Arc::new(autoscaler));
        self.rebuild_targets();
    }

    /// Forgets an autoscaler.
    pub fn delete_autoscaler(&self, namespace: &str, name: &str) {
        self.autoscalers.write().remove(&key(namespace, name));
        self.rebuild_targets();
    }

    fn replace_autoscalers(&self, all: HashMap<Key, Arc<DaemonSetAutoscaler>>) {
        *self.autoscalers.write() = all;
        self.rebuild_targets();
    }

    fn rebuild_targets(&self) {
        // an autoscaler that did not change keeps its figures, read once
        let old: HashMap<*const DaemonSetAutoscaler, Arc<Prepared>> = self
            .by_target
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .map(|p| (Arc::as_ptr(&p.autoscaler), p.clone()))
            .collect();
        let mut map: HashMap<Key, Vec<Arc<Prepared>>> = HashMap::new();
        for a in self.autoscalers.read().values() {
            let ns = a.namespace().unwrap_or_default();
            let prepared = match old.get(&Arc::as_ptr(a)) {
                Some(p) => p.clone(),
                None => Prepared::of(a.clone()),
            };
            map.entry(key(&ns, &a.spec.target_ref.name))
                .or_default()
                .push(prepared);
        }
        for list in map.values_mut() {
            list.sort_by(|a, b| precedence(&a.autoscaler, &b.autoscaler));
        }
        *self.by_target.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    /// Adds or replaces a node's recommendation.
    pub fn apply_node_recommendation(&self, rec: &NodeRecommendation) {
        let node = self.names.get(&rec.name_any());
        let compact = self.compact(rec);
        self.set_pods(&node, self.pod_counts(rec));
        self.nodes.write().insert(node, compact);
    }

    /// A node's pod counts, names interned; `up_to_date` never above `running`.
    pub fn pod_counts(&self, rec: &NodeRecommendation) -> NodePodCounts {
        rec.spec
            .pods
            .iter()
            .map(|p| {
                let key = (
                    self.names.get(&p.autoscaler.namespace),
                    self.names.get(&p.autoscaler.name),
                );
                (key, p.running.max(0), p.up_to_date.clamp(0, p.running.max(0)))
            })
            .collect()
    }

    fn set_pods(&self, node: &Arc<str>, pods: NodePodCounts) {
        if pods.is_empty() {
            self.pods.write().remove(node);
        } else {
            self.pods.write().insert(node.clone(), pods);
        }
    }

    /// A node's recommendation reduced to the figures the mutation reads, names interned.
    pub fn compact(&self, rec: &NodeRecommendation) -> NodeTargets {
        rec.spec
            .recommendations
            .iter()
            .map(|r| (r, Amounts::from_list(r.target.as_ref())))
            .filter(|(_, amounts)| !amounts.is_empty())
            .map(|(r, amounts)| NodeEntry {
                slot: self.names.slots.get_owned(Slot {
                    autoscaler: (
                        self.names.get(&r.autoscaler.namespace),
                        self.names.get(&r.autoscaler.name),
                    ),
                    container: self.names.get(&r.container_name),
                    cpu: amounts.cpu.is_some(),
                    memory: amounts.memory.is_some(),
                }),
                cpu: amounts.cpu.unwrap_or(0),
                memory: amounts.memory.unwrap_or(0),
            })
            .collect()
    }

    /// Forgets a node's recommendation.
    pub fn delete_node_recommendation(&self, node: &str) {
        self.nodes.write().remove(node);
        self.pods.write().remove(node);
    }

    /// Adds or replaces a node's labels.
    pub fn apply_node_labels<'a>(&self, node: &str, labels: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let compact = self.compact_labels(labels);
        self.node_labels.write().insert(self.names.get(node), compact);
    }

    /// Forgets a node's labels.
    pub fn delete_node_labels(&self, node: &str) {
        self.node_labels.write().remove(node);
    }

    fn compact_labels<'a>(&self, labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> NodeLabels {
        labels
            .into_iter()
            .map(|(k, v)| {
                self.names
                    .labels
                    .get_owned((self.names.get(k), self.names.get(v)))
            })
            .collect()
    }

    /// Adds or replaces a LimitRange.
    pub fn apply_limit_range(&self, lr: LimitRange) {
        let k = key(&lr.namespace().unwrap_or_default(), &lr.name_any());
        self.limit_ranges.write().insert(k, Arc::new(lr));
        self.rebuild_namespaces();
    }

    fn rebuild_namespaces(&self) {
        let mut map: HashMap<Arc<str>, Vec<Arc<LimitRange>>> = HashMap::new();
        for ((ns, _), lr) in self.limit_ranges.read().iter() {
            map.entry(ns.clone()).or_default().push(lr.clone());
        }
        *self.by_namespace.write().unwrap_or_else(|p| p.into_inner()) = map;
    }

    /// Watches the four kinds until `stop`. Watch errors are logged and retried with
    /// kube-runtime's default backoff.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let autoscalers = {
            let index = self.clone();
            watch_into(
                "daemonsetautoscalers",
                Api::<DaemonSetAutoscaler>::all(client.clone()),
                stop.clone(),
                |a| a,
                move |change| match change {
                    Change::Apply(a) => index.apply_autoscaler(a),
                    Change::Delete(a) => {
                        index.delete_autoscaler(&a.namespace().unwrap_or_default(), &a.name_any())
                    }
                    Change::Replace(all) => {
                        index.replace_autoscalers(
                            all.into_iter()
                                .map(|a| {
                                    (
                                        key(&a.namespace().unwrap_or_default(), &a.name_any()),
                                        Arc::new(a),
                                    )
                                })
                                .collect(),
                        );
                        index.autoscalers.synced.store(true, Ordering::Release);
                    }
                },
            )
        };
        let nodes = {
            let index = self.clone();
            let compactor = self.clone();
            watch_into(
                "noderecommendations",
                Api::<NodeRecommendation>::all(client.clone()),
                stop.clone(),
                move |r| {
                    let node = compactor.names.get(&r.name_any());
                    (node, (compactor.compact(&r), compactor.pod_counts(&r)))
                },
                move |change| match change {
                    Change::Apply((node, (targets, pods))) => {
                        index.set_pods(&node, pods);
                        index.nodes.write().insert(node, targets);
                    }
                    Change::Delete((node, _)) => index.delete_node_recommendation(&node),
                    Change::Replace(all) => {
                        let mut nodes = HashMap::new();
                        let mut counts = HashMap::new();
                        for (node, (targets, pods)) in all {
                            if !pods.is_empty() {
                                counts.insert(node.clone(), pods);
                            }
                            nodes.insert(node, targets);
                        }
                        *index.pods.write() = counts;
                        *index.nodes.write() = nodes;
                        index.names.prune();
                        index.nodes.synced.store(true, Ordering::Release);
                    }
                },
            )
        };
        let limit_ranges = {
            let index = self.clone();
            watch_into(
                "limitranges",
                Api::<LimitRange>::all(client.clone()),
                stop.clone(),
                |lr| lr,
                move |change| match change {
                    Change::Apply(lr) => index.apply_limit_range(lr),
                    Change::Delete(lr) => {
                        index
                            .limit_ranges
                            .write()
                            .remove(&key(&lr.namespace().unwrap_or_default(), &lr.name_any()));
                        index.rebuild_namespaces();
                    }
                    Change::Replace(all) => {
                        *index.limit_ranges.write() = all
                            .into_iter()
                            .map(|lr| {
                                (
                                    key(&lr.namespace().unwrap_or_default(), &lr.name_any()),
                                    Arc::new(lr),
                                )
                            })
                            .collect();
                        index.rebuild_namespaces();
                        index.limit_ranges.synced.store(true, Ordering::Release);
                    }
                },
            )
        };
        let node_labels = {
            let index = self.clone();
            let compactor = self.clone();
            watch_into(
                "nodes",
                Api::<PartialObjectMeta<Node>>::all(client),
                stop.clone(),
                move |n| {
                    let labels = n.labels().iter().map(|(k, v)| (k.as_str(), v.as_str()));
                    (
                        compactor.names.get(&n.name_any()),
                        compactor.compact_labels(labels),
                    )
                },
                move |change| match change {
                    Change::Apply((node, labels)) => {
                        index.node_labels.write().insert(node, labels);
                    }
                    Change::Delete((node, _)) => index.delete_node_labels(&node),
                    Change::Replace(all) => {
                        *index.node_labels.write() = all.into_iter().collect();
                        index.names.prune();
                        index.node_labels.synced.store(true, Ordering::Release);
                    }
                },
            )
        };
        tokio::join!(autoscalers, nodes, limit_ranges, node_labels);
    }
}

/// The targets of autoscaler `namespace/name` among a node's entries.
fn targets_of(entries: &[NodeEntry], namespace: &str, name: &str) -> Targets {
    entries
        .iter()
        .filter(|e| &*e.slot.autoscaler.0 == namespace && &*e.slot.autoscaler.1 == name)
        .map(|e| (e.slot.container.to_string(), e.amounts()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use nodewarden_api::rightsizing::{AutoscalerRef, ContainerRecommendation, NodeRecommendationSpec};

    use super::*;

    fn rec(node: &str, targets: &[(&str, &[(&str, &str)])]) -> NodeRecommendation {
        let recommendations = targets
            .iter()
            .map(|(container, list)| ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: "ns".to_string(),
                    name: "agent".to_string(),
                },
                container_name: container.to_string(),
                target: Some(
                    list.iter()
                        .map(|(r, q)| (r.to_string(), Quantity(q.to_string())))
                        .collect::<BTreeMap<_, _>>(),
                ),
                lower_bound: None,
                upper_bound: None,
                uncapped_target: None,
                sample_count: 1,
                first_sample_time: None,
                last_sample_time: None,
                oom_count: 0,
                capped: None,
            })
            .collect();
        NodeRecommendation::new(
            node,
            NodeRecommendationSpec {
                update_time: None,
                pods: Vec::new(),
                summary: None,
                recommendations,
            },
        )
    }

    #[test]
    fn a_compact_entry_gives_back_the_figures_it_was_given() {
        let index = RightsizingCache::new();
        index.apply_node_recommendation(&rec(
            "n1",
            &[
                ("both", &[("cpu", "250m"), ("memory", "64Mi")]),
                ("cpu-only", &[("cpu", "0")]),
                ("memory-only", &[("memory", "1Gi")]),
                ("neither", &[("gpu", "1")]),
            ],
        ));
        let targets = index.node_targets("n1", "ns", "agent").expect("targets");
        assert_eq!(targets.len(), 3, "{targets:?}");
        assert_eq!(
            targets["both"],
            Amounts {
                cpu: Some(250),
                memory: Some(64 << 20)
            }
        );
        assert_eq!(
            targets["cpu-only"],
            Amounts {
                cpu: Some(0),
                memory: None
            }
        );
        assert_eq!(
            targets["memory-only"],
            Amounts {
                cpu: None,
                memory: Some(1 << 30)
            }
        );
        assert_eq!(index.node_targets("n1", "ns", "other"), None);
        assert_eq!(index.node_targets("n2", "ns", "agent"), None);
    }

    #[test]
    fn nodes_share_one_slot_and_one_label_per_value() {
        let index = RightsizingCache::new();
        for node in ["n1", "n2"] {
            index.apply_node_recommendation(&rec(node, &[("c", &[("cpu", "1"), ("memory", "1Mi")])]));
            index.apply_node_labels(node, [("zone", "a"), ("kubernetes.io/hostname", node)]);
        }
        let nodes = index.nodes.read();
        assert!(Arc::ptr_eq(&nodes["n1"][0].slot, &nodes["n2"][0].slot));
        let labels = index.node_labels.read();
        assert!(Arc::ptr_eq(&labels["n1"][0], &labels["n2"][0]));
        assert!(!Arc::ptr_eq(&labels["n1"][1], &labels["n2"][1]));
        assert_eq!(
            index.node_label("n2", "kubernetes.io/hostname").as_deref(),
            Some("n2")
        );
        assert_eq!(index.node_label("n2", "missing"), None);
        drop((nodes, labels));
        // a node gone, and its unique values with it once pruned
        index.delete_node_recommendation("n2");
        index.delete_node_labels("n2");
        index.names.prune();
        assert_eq!(index.names.labels.values.lock().unwrap().len(), 2);
        assert_eq!(index.names.slots.values.lock().unwrap().len(), 1);
        assert!(!index.names.names.values.lock().unwrap().contains("n2"));
    }
}
