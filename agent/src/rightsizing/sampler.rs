//! One sample tick, without I/O towards the API server: read the cgroups of the autoscaled
//! containers, feed the histories, compute this node's figures and decide whether to publish.
//!
//! The run loop in `lib.rs` calls [`Sampler::tick`] every sample interval; the synthetic
//! benchmark calls it directly.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use nodewarden_api::rightsizing::{AutoscalerRef, NodeRecommendationSpec};
use nodewarden_estimator::due::{self, Reason};
use nodewarden_estimator::figures::{self, Figures, Snapshot, entry};
use nodewarden_estimator::policy::{Key, Policy};
use nodewarden_estimator::recommender::{EstimatorConfig, History};

use crate::cgroup::{CgroupError, Hierarchy, Locator, Reading, Unmapped};
use crate::metrics::{self, Metrics};
use crate::rightsizing::checkpoint::{self, Checkpoint};
use crate::rightsizing::pods::Target;

/// What the sampler remembers about a container between ticks.
#[derive(Clone, Debug, PartialEq)]
struct Meta {
    containers_per_pod: usize,
    policy: Policy,
    cpu_request_milli: Option<u64>,
    memory_request_bytes: Option<u64>,
}

/// Publish settings.
#[derive(Clone, Debug)]
pub struct PublishConfig {
    /// 0.1: a target must move by more than 10 %.
    pub change_threshold: f64,
    /// Milliseconds after which an unchanged recommendation is written again.
    pub refresh_ms: i64,
    /// At most one write per this many milliseconds: a material change within it waits for
    /// its end (so writes stay bounded even with a very short sample interval).
    pub min_interval_ms: i64,
    /// On average at most one write per this many milliseconds, in bursts of at most
    /// [`PUBLISH_BURST`] (a token bucket); 0: no such budget. The first write, a changed set of
    /// containers and a new OOM kill are written at once all the same (and spend a token).
    pub budget_interval_ms: i64,
}

/// The writes a node may make at once before [`PublishConfig::budget_interval_ms`] paces it.
pub const PUBLISH_BURST: f64 = 3.0;

/// The write budget: a token bucket, full at the start.
#[derive(Debug, Default)]
struct Budget {
    tokens: f64,
    at_ms: Option<i64>,
}

impl Budget {
    fn refill(&mut self, now_ms: i64, interval_ms: i64) {
        self.tokens = match self.at_ms {
            None => PUBLISH_BURST,
            Some(at) => (self.tokens + (now_ms - at).max(0) as f64 / interval_ms as f64).min(PUBLISH_BURST),
        };
        self.at_ms = Some(now_ms);
    }

    /// Takes a token when there is one.
    fn try_take(&mut self, now_ms: i64, interval_ms: i64) -> bool {
        if interval_ms <= 0 {
            return true;
        }
        self.refill(now_ms, interval_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Spends a token for a write that does not wait (down to none).
    fn spend(&mut self, now_ms: i64, interval_ms: i64) {
        if interval_ms > 0 {
            self.refill(now_ms, interval_ms);
            self.tokens = (self.tokens - 1.0).max(0.0);
        }
    }
}

/// The agent's state between ticks: the histories, the cgroup locator, the counters read last
/// and what was last published.
pub struct Sampler {
    cfg: EstimatorConfig,
    publish: PublishConfig,
    node: String,
    hierarchy: Hierarchy,
    locator: Locator,
    histories: BTreeMap<Key, History>,
    meta: HashMap<Key, Meta>,
    /// Last cpu.stat usage_usec and when, per container ID.
    cpu_counters: HashMap<String, (u64, i64)>,
    /// Last memory.events oom_kill, per container ID.
    oom_counters: HashMap<String, u64>,
    /// Container IDs whose OOM kill is already in a history.
    oom_recorded: HashSet<String>,
    /// Container IDs already warned about (one warning per unreadable container).
    warned: HashSet<String>,
    /// Cgroup trees already reported as not recognised, by [`Unmapped::key`] (one warning per
    /// problem, for as long as the locator still finds it).
    unrecognised: HashSet<String>,
    last_published: Option<(Snapshot, i64)>,
    budget: Budget,
    metrics: Arc<Metrics>,
    /// The node's allocatable millicores and bytes, once read: no figure goes above them.
    allocatable: Figures,
}

/// A tick's outcome: the spec to write, if a write is due.
#[derive(Debug)]
pub struct Tick {
    /// Containers measured in this tick.
    pub tracked: usize,
    /// Why and what to write to `NodeRecommendation/<node>`, when a write is due.
    pub publish: Option<(Reason, NodeRecommendationSpec)>,
    /// Cgroup trees found in a form the agent cannot map to containers, each said once (the
    /// run loop makes each a Warning Event on the node).
    pub unrecognised: Vec<Unmapped>,
}

impl Sampler {
    /// `cgroup`: the detected hierarchy, or a path (a cgroup v2 root).
    pub fn new(
        node: String,
        cgroup: impl Into<Hierarchy>,
        cfg: EstimatorConfig,
        publish: PublishConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let hierarchy = cgroup.into();
        Sampler {
            cfg,
            publish,
            node,
            locator: Locator::new(hierarchy.walk_root().to_path_buf()),
            hierarchy,
            histories: BTreeMap::new(),
            meta: HashMap::new(),
            cpu_counters: HashMap::new(),
            oom_counters: HashMap::new(),
            oom_recorded: HashSet::new(),
            warned: HashSet::new(),
            unrecognised: HashSet::new(),
            last_published: None,
            budget: Budget::default(),
            metrics,
            allocatable: Figures::default(),
        }
    }

    /// Resumes the histories of a checkpoint. Entries that do not fit the current estimator
    /// settings (other bucket layout) are skipped with a warning.
    pub fn restore(&mut self, checkpoint: &Checkpoint) {
        for e in &checkpoint.entries {
            let key = Key {
                autoscaler: e.autoscaler.clone(),
                container: e.container.clone(),
            };
            match History::from_stored(&e.history, &self.cfg) {
                Ok(h) => {
                    self.histories.insert(key.clone(), h);
                    self.meta.insert(
                        key,
                        Meta {
                            containers_per_pod: e.containers_per_pod.max(1),
                            policy: Policy::default(),
                            cpu_request_milli: None,
                            memory_request_bytes: None,
                        },
                    );
                }
                Err(err) => tracing::warn!(
                    namespace = %e.autoscaler.namespace, autoscaler = %e.autoscaler.name, container = %e.container,
                    error = %err, "checkpointed history does not fit the current settings; starting it afresh"
                ),
            }
        }
    }

    /// Starts the history of `key` from `history` (seeded from Prometheus), unless it already
    /// has one: returns whether it was taken.
    pub fn seed(&mut self, key: Key, history: History, containers_per_pod: usize) -> bool {
        if self.histories.contains_key(&key) {
            return false;
        }
        self.meta.entry(key.clone()).or_insert(Meta {
            containers_per_pod: containers_per_pod.max(1),
            policy: Policy::default(),
            cpu_request_milli: None,
            memory_request_bytes: None,
        });
        self.histories.insert(key, history);
        true
    }

    /// The histories as a checkpoint saved at `now_ms`.
    pub fn checkpoint(&self, now_ms: i64) -> Checkpoint {
        Checkpoint {
            version: checkpoint::VERSION,
            node: self.node.clone(),
            saved_at_ms: now_ms,
            entries: self
                .histories
                .iter()
                .map(|(k, h)| checkpoint::Entry {
                    autoscaler: k.autoscaler.clone(),
                    container: k.container.clone(),
                    containers_per_pod: self.meta.get(k).map_or(1, |m| m.containers_per_pod),
                    history: h.to_stored(),
                })
                .collect(),
        }
    }

    /// The node's allocatable millicores and bytes (its Node's `status.allocatable`): from the
    /// next tick on, no published figure is above them.
    pub fn set_allocatable(&mut self, allocatable: Figures) {
        self.allocatable = allocatable;
    }

    /// The history of one container, if there is one.
    pub fn history(&self, key: &Key) -> Option<&History> {
        self.histories.get(key)
    }

    /// How often the cgroup tree was walked to find containers (only when one is new).
    pub fn locator_walks(&self) -> u64 {
        self.locator.walks
    }

    /// How many histories are kept.
    pub fn history_count(&self) -> usize {
        self.histories.len()
    }

    /// The last written snapshot was published: remember it for the next decision.
    fn published(&mut self, snapshot: Snapshot, now_ms: i64) {
        self.last_published = Some((snapshot, now_ms));
    }

    /// Reads the cgroups of `targets` and runs one tick. `autoscalers` are the ones that
    /// exist; histories of others are dropped.
    pub fn tick(
        &mut self,
        now_ms: i64,
        targets: &[Target],
        autoscalers: &BTreeMap<AutoscalerRef, ()>,
    ) -> Tick {
        let paths = self.locator.locate(
            targets
                .iter()
                .map(|t| (t.cgroup_uid.as_str(), t.container_id.as_str())),
        );
        let readings: HashMap<String, Result<Reading, CgroupError>> = paths
            .into_iter()
            .map(|(id, path)| {
                let r = self.hierarchy.read(&path);
                (id, r)
            })
            .collect();
        let unrecognised = self.newly_unrecognised();
        let mut tick = self.observe(now_ms, targets, autoscalers, &readings);
        tick.unrecognised = unrecognised;
        tick
    }

    /// The locator's diagnoses not said yet: each is logged once, counted, and returned.
    /// Containers it cannot map get no reading, so nothing is published for them.
    fn newly_unrecognised(&mut self) -> Vec<Unmapped> {
        let current: HashSet<String> = self.locator.unmapped().iter().map(Unmapped::key).collect();
        self.unrecognised.retain(|k| current.contains(k));
        let mut new = Vec::new();
        for u in self.locator.unmapped() {
            if self.unrecognised.insert(u.key()) {
                self.metrics.unrecognised_cgroup(u.reason());
                tracing::warn!(
                    path = %u.path().display(), reason = u.reason(),
                    "cgroup tree not recognised; its containers are not measured: {u}"
                );
                new.push(u.clone());
            }
        }
        new
    }

    /// [`Sampler::tick`] with the readings already taken.
    pub fn observe(
        &mut self,
        now_ms: i64,
        targets: &[Target],
        autoscalers: &BTreeMap<AutoscalerRef, ()>,
        readings: &HashMap<String, Result<Reading, CgroupError>>,
    ) -> Tick {
        let cfg = self.cfg.clone();
        // OOM kills of previous instances, from the pod status (first, so that a kill just before
        // the first reading opens the memory interval)
        for t in targets {
            let Some((id, at)) = &t.last_oom else { continue };
            if self.oom_recorded.contains(id) {
                continue;
            }
            if !self.histories.contains_key(&t.key)
                && let Ok(h) = History::new(&cfg)
            {
                // an OOM kill before the first reading still counts
                self.histories.insert(t.key.clone(), h);
            }
            if let Some(h) = self.histories.get_mut(&t.key)
                && *at > h.last_oom_ms
            {
                h.record_oom(&cfg, *at, t.memory_request_bytes.unwrap_or(0) as f64);
                self.metrics.oom_killed(&t.key, 1);
                tracing::info!(pod = %t.pod_name, container = %t.key.container, "container was OOM-killed; memory recommendation bumped");
            }
            self.oom_recorded.insert(id.clone());
        }
        for t in targets {
            self.meta.insert(
                t.key.clone(),
                Meta {
                    containers_per_pod: t.containers_per_pod.max(1),
                    policy: t.policy.clone(),
                    cpu_request_milli: t.cpu_request_milli,
                    memory_request_bytes: t.memory_request_bytes,
                },
            );
            let reading = match readings.get(&t.container_id) {
                None => {
                    tracing::debug!(pod = %t.pod_name, container = %t.key.container, "no cgroup for the container yet");
                    continue;
                }
                Some(Err(err)) => {
                    self.metrics.unreadable_container();
                    if self.warned.insert(t.container_id.clone()) {
                        tracing::warn!(
                            namespace = %t.pod_namespace, pod = %t.pod_name, container = %t.key.container,
                            error = %err, "cannot read the container's cgroup; skipping it, the others go on"
                        );
                    }
                    continue;
                }
                Some(Ok(r)) => *r,
            };
            let history = match self.histories.get_mut(&t.key) {
                Some(h) => h,
                None => match History::new(&cfg) {
                    Ok(h) => self.histories.entry(t.key.clone()).or_insert(h),
                    Err(err) => {
                        tracing::error!(error = %err, "invalid estimator settings");
                        continue;
                    }
                },
            };
            // CPU: the rate since the last reading of the same container
            let mut cpu_cores = None;
            if let Some(&(usec, at)) = self.cpu_counters.get(&t.container_id)
                && reading.cpu_usage_usec >= usec
                && now_ms > at
            {
                let cores = (reading.cpu_usage_usec - usec) as f64 / ((now_ms - at) as f64 * 1000.0);
                history.add_cpu(&cfg, now_ms, cores);
                cpu_cores = Some(cores);
            }
            self.cpu_counters
                .insert(t.container_id.clone(), (reading.cpu_usage_usec, now_ms));
            // memory: the working set feeds this interval's peak
            let ws = reading.working_set() as f64;
            history.add_memory(&cfg, now_ms, ws);
            // OOM kills seen by the kernel counter of this cgroup
            let request_mem = t.memory_request_bytes.unwrap_or(0) as f64;
            if let Some(&before) = self.oom_counters.get(&t.container_id)
                && reading.oom_kill > before
            {
                history.record_oom(&cfg, now_ms, request_mem);
                history.oom_count = history.oom_count.saturating_add(reading.oom_kill - before - 1);
                self.metrics.oom_killed(&t.key, reading.oom_kill - before);
                self.oom_recorded.insert(t.container_id.clone());
                tracing::info!(pod = %t.pod_name, container = %t.key.container, "OOM kill seen; memory recommendation bumped");
            }
            self.oom_counters.insert(t.container_id.clone(), reading.oom_kill);
            self.metrics.usage(&t.key, cpu_cores, ws);
            self.metrics
                .request(&t.key, t.cpu_request_milli, t.memory_request_bytes);
        }
        // forget what no longer exists
        let live_ids: HashSet<&str> = targets
            .iter()
            .map(|t| t.container_id.as_str())
            .chain(
                targets
                    .iter()
                    .filter_map(|t| t.last_oom.as_ref().map(|(id, _)| id.as_str())),
            )
            .collect();
        self.cpu_counters.retain(|id, _| live_ids.contains(id.as_str()));
        self.oom_counters.retain(|id, _| live_ids.contains(id.as_str()));
        self.oom_recorded.retain(|id| live_ids.contains(id.as_str()));
        self.warned.retain(|id| live_ids.contains(id.as_str()));
        let gone: Vec<Key> = self
            .histories
            .iter()
            .filter(|(k, h)| !autoscalers.contains_key(&k.autoscaler) || h.is_expired(&cfg, now_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.histories.remove(&k);
            self.meta.remove(&k);
            self.metrics.forget(&k);
        }

        let snapshot = self.snapshot();
        let running: BTreeSet<&Key> = targets.iter().map(|t| &t.key).collect();
        self.metrics.tracked(running.len());
        let too_soon = self
            .last_published
            .as_ref()
            .is_some_and(|(_, at)| now_ms - at < self.publish.min_interval_ms);
        let decision = if too_soon {
            None
        } else {
            due::decide(
                self.last_published.as_ref().map(|(s, at)| (s, *at)),
                &snapshot,
                now_ms,
                self.publish.change_threshold,
                self.publish.refresh_ms,
            )
        };
        // the budget paces what can wait; the first write, new containers and OOM kills cannot
        let oom_rose = self.last_published.as_ref().is_some_and(|(prev, _)| {
            snapshot
                .iter()
                .any(|(k, e)| prev.get(k).is_some_and(|p| e.oom_count > p.oom_count))
        });
        let interval = self.publish.budget_interval_ms;
        let decision = decision.filter(|reason| {
            if oom_rose || matches!(reason, Reason::First | Reason::ContainersChanged) {
                self.budget.spend(now_ms, interval);
                true
            } else if self.budget.try_take(now_ms, interval) {
                true
            } else {
                tracing::debug!(
                    reason = reason.as_str(),
                    "write budget spent; the change waits for the next token"
                );
                false
            }
        });
        let publish = decision.map(|reason| {
            self.metrics.decided(reason.as_str());
            let spec = figures::spec(&snapshot, now_ms);
            self.published(snapshot, now_ms);
            (reason, spec)
        });
        Tick {
            tracked: running.len(),
            publish,
            unrecognised: Vec::new(),
        }
    }

    /// Current figures of every history with something in it.
    pub fn snapshot(&self) -> Snapshot {
        let mut out = Snapshot::new();
        for (key, h) in &self.histories {
            if h.is_empty() {
                continue;
            }
            let meta = self.meta.get(key);
            let cpp = meta.map_or(1, |m| m.containers_per_pod);
            let default_policy = Policy::default();
            let policy = meta.map_or(&default_policy, |m| &m.policy);
            let est = h.estimate(&self.cfg, cpp);
            // nothing before the first measurement
            let Some(e) = entry(
                &est,
                h,
                policy,
                (
                    meta.and_then(|m| m.cpu_request_milli),
                    meta.and_then(|m| m.memory_request_bytes),
                ),
                self.allocatable,
            ) else {
                continue;
            };
            let as_metric = |f: &Figures| metrics::Figures {
                cpu_cores: f.cpu_milli.map(|m| m as f64 / 1000.0),
                memory_bytes: f.memory_bytes.map(|b| b as f64),
            };
            self.metrics.recommendation(
                key,
                as_metric(&e.target),
                as_metric(&e.lower),
                e.upper.as_ref().map(as_metric),
                h.sample_count,
            );
            out.insert(key.clone(), e);
        }
        out
    }
}
