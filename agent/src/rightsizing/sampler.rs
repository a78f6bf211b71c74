//! One sample tick, without I/O towards the API server: read the cgroups of the autoscaled
//! containers, feed the histories, compute this node's figures and decide whether to publish.
//!
//! The run loop in `lib.rs` calls [`Sampler::tick`] every sample interval; the synthetic
//! benchmark calls it directly.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use nodewarden_api::rightsizing::{
    AutoscalerRef, CapReason, Capped, CappedResources, NodeRecommendationSpec, history_text,
};

use crate::cgroup::{CgroupError, Hierarchy, Locator, Reading, Unmapped};
use crate::metrics::{self, Metrics};
use crate::rightsizing::checkpoint::{self, Checkpoint};
use crate::rightsizing::pods::{Key, Policy, Target};
use crate::rightsizing::publish::{self, Entry, Figures, Reason, Snapshot};
use crate::rightsizing::recommender::{Estimate, EstimatorConfig, History, Resources};

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

fn ceil_u64(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        // saturating float → int conversion
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.ceil() as u64;
        n
    } else {
        0
    }
}

/// The lower of `maxAllowed` and the node's allocatable, with which one it is (maxAllowed on a
/// tie: the user's own word).
fn cap_of(max: Option<f64>, allocatable: Option<u64>) -> Option<(f64, CapReason)> {
    let node = allocatable.map(|a| (a as f64, CapReason::NodeAllocatable));
    match (max.map(|m| (m, CapReason::MaxAllowed)), node) {
        (Some(m), Some(a)) => Some(if a.0 < m.0 { a } else { m }),
        (m, a) => m.or(a),
    }
}

/// One figure (millicores or bytes) within the policy and the node: raised to `minAllowed`,
/// then held at the cap, with the cap's reason when it held it. `None`: VPA's figure is
/// unbounded (no confidence), so the cap is the figure, or none without one.
fn within(
    v: Option<f64>,
    min: Option<f64>,
    cap: Option<(f64, CapReason)>,
) -> (Option<u64>, Option<CapReason>) {
    let v = v.map(|v| min.map_or(v, |m| v.max(m)));
    match (v, cap) {
        (Some(v), Some((c, why))) if ceil_u64(v) > ceil_u64(c) => (Some(ceil_u64(c)), Some(why)),
        (None, Some((c, why))) => (Some(ceil_u64(c)), Some(why)),
        (v, _) => (v.map(ceil_u64), None),
    }
}

/// One figure of each resource within the policy and the node; `None` for a resource the
/// autoscaler does not control or that has no measurement yet.
fn bounded(
    r: Option<Resources>,
    policy: &Policy,
    node: Figures,
    measured: (bool, bool),
) -> (Figures, CappedResources) {
    let l = &policy.limits;
    let (cpu, cpu_why) = within(
        r.map(|r| r.cpu_cores * 1000.0),
        l.min_cpu_milli,
        cap_of(l.max_cpu_milli, node.cpu_milli),
    );
    let (memory, memory_why) = within(
        r.map(|r| r.memory_bytes),
        l.min_memory_bytes,
        cap_of(l.max_memory_bytes, node.memory_bytes),
    );
    let cpu_on = policy.cpu && measured.0;
    let memory_on = policy.memory && measured.1;
    (
        Figures {
            cpu_milli: cpu.filter(|_| cpu_on),
            memory_bytes: memory.filter(|_| memory_on),
        },
        CappedResources {
            cpu: cpu_why.filter(|_| cpu_on),
            memory: memory_why.filter(|_| memory_on),
        },
    )
}

/// The published entry for one history: the estimate within the container policy and the
/// node's allocatable (`node`: millicores and bytes, `None` each when not known).
///
/// Nothing before the first measurement: `None` for a history without a CPU sample, unless an
/// OOM kill was seen (then memory figures only: the kill is a measurement, CPU has none yet).
/// No figure above the node's allocatable or `maxAllowed`: where VPA's is, the cap is published
/// and `capped` says which and on how much history; with a single CPU sample VPA's upper bound
/// is unbounded, so the upper bound is the cap (none when no cap is known).
pub fn entry(
    estimate: &Estimate,
    history: &History,
    policy: &Policy,
    requests: (Option<u64>, Option<u64>),
    node: Figures,
) -> Option<Entry> {
    let cpu_measured = history.sample_count > 0;
    if !cpu_measured && history.oom_count == 0 {
        return None;
    }
    let measured = (cpu_measured, true);
    let (target, target_why) = bounded(Some(estimate.target), policy, node, measured);
    let (lower, lower_why) = bounded(Some(estimate.lower_bound), policy, node, measured);
    let (upper, upper_why) = bounded(estimate.upper_bound, policy, node, measured);
    let upper = (upper.cpu_milli.is_some() || upper.memory_bytes.is_some()).then_some(upper);
    let raw = |v: f64, on: bool| on.then(|| ceil_u64(v));
    let uncapped_target = Figures {
        cpu_milli: raw(estimate.target.cpu_cores * 1000.0, policy.cpu && cpu_measured),
        memory_bytes: raw(estimate.target.memory_bytes, policy.memory),
    };
    let some = |c: CappedResources| (!c.is_empty()).then_some(c);
    let capped = Capped {
        target: some(target_why),
        lower_bound: some(lower_why),
        upper_bound: some(upper_why),
        // a span of 0 is one sample (or an OOM kill alone): said as such, not as "0s"
        history: match history.sample_count {
            0 => "no CPU sample".to_string(),
            1 => "1 sample".to_string(),
            _ => history_text(history.last_sample_ms - history.first_sample_ms),
        },
    };
    let any = capped.target.is_some() || capped.lower_bound.is_some() || capped.upper_bound.is_some();
    Some(Entry {
        target,
        lower,
        upper,
        uncapped_target,
        capped: any.then_some(capped),
        request_cpu_milli: requests.0,
        request_memory_bytes: requests.1,
        sample_count: history.sample_count,
        first_sample_ms: history.first_sample_ms,
        last_sample_ms: history.last_sample_ms,
        oom_count: history.oom_count,
    })
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
            publish::decide(
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
            if oom_rose
                || matches!(
                    reason,
                    publish::Reason::First | publish::Reason::ContainersChanged
                )
            {
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
            let spec = publish::spec(&snapshot, now_ms);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsizing::pods::Limits;
    use crate::rightsizing::recommender::MIB;

    const T0: i64 = 1_700_000_000_000;
    const GIB: f64 = 1024.0 * MIB;

    /// A node of 4 cores and 16 GiB.
    const NODE: Figures = Figures {
        cpu_milli: Some(4000),
        memory_bytes: Some(16 << 30),
    };

    fn history(cpu: &[(i64, f64)], memory: &[(i64, f64)]) -> History {
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        for &(t, v) in cpu {
            assert!(h.add_cpu(&cfg, t, v));
        }
        for &(t, v) in memory {
            assert!(h.add_memory(&cfg, t, v));
        }
        h
    }

    fn published(h: &History, policy: &Policy, node: Figures) -> Option<Entry> {
        let est = h.estimate(&EstimatorConfig::default(), 1);
        entry(&est, h, policy, (Some(500), None), node)
    }

    #[test]
    fn nothing_is_published_before_the_first_cpu_sample() {
        // memory only: VPA's aggregate has no sample and gives no recommendation
        let h = history(&[], &[(T0, 300.0 * MIB)]);
        assert_eq!(published(&h, &Policy::default(), NODE), None);
        // an OOM kill before any CPU sample is a measurement of memory: memory figures only
        let cfg = EstimatorConfig::default();
        let mut h = History::new(&cfg).unwrap();
        h.record_oom(&cfg, T0, 64.0 * MIB).unwrap();
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        assert_eq!(e.target.cpu_milli, None);
        assert_eq!(e.lower.cpu_milli, None);
        assert!(e.target.memory_bytes.unwrap() as f64 > 164.0 * MIB);
        assert_eq!(e.uncapped_target.cpu_milli, None);
    }

    #[test]
    fn a_single_sample_has_the_node_as_its_upper_bound() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        // VPA: upper unbounded (1e14); nodewarden: what the node has, and says so
        assert_eq!(e.upper, Some(NODE));
        let capped = e.capped.expect("capped");
        assert_eq!(
            capped.upper_bound,
            Some(CappedResources {
                cpu: Some(CapReason::NodeAllocatable),
                memory: Some(CapReason::NodeAllocatable),
            })
        );
        assert_eq!(capped.history, "1 sample");
        assert_eq!((capped.target, capped.lower_bound), (None, None));
        // lower: the floor (VPA's factor is 0); target: the one sample's bucket plus the margin
        assert_eq!(e.lower.cpu_milli, Some(25));
        assert!(e.target.cpu_milli.unwrap() < 200);
        // without a known cap, no upper bound (as before the node was read)
        let e = published(&h, &Policy::default(), Figures::default()).expect("an entry");
        assert_eq!((e.upper, e.capped), (None, None));
    }

    #[test]
    fn a_short_history_is_capped_at_the_node_and_a_long_one_is_vpas() {
        // two minutes at 273m and 300 MiB: VPA's upper bound is hundreds of cores
        let cpu: Vec<(i64, f64)> = (0..=12).map(|i| (T0 + i * 10_000, 0.273)).collect();
        let h = history(&cpu, &[(T0, 300.0 * MIB)]);
        let raw = h.estimate(&EstimatorConfig::default(), 1).upper_bound.unwrap();
        assert!(raw.cpu_cores > 100.0 && raw.memory_bytes > 100.0 * GIB, "{raw:?}");
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        assert_eq!(e.upper, Some(NODE));
        assert_eq!(e.capped.as_ref().map(|c| c.history.as_str()), Some("2m"));
        assert_eq!(
            e.capped.unwrap().describe(),
            "upper cpu+memory at node allocatable (history 2m)"
        );
        // a day at a sample a minute: VPA's bound (twice the p95) is below the node: kept
        let cpu: Vec<(i64, f64)> = (0..=1440).map(|i| (T0 + i * 60_000, 0.273)).collect();
        let h = history(&cpu, &[(T0, 300.0 * MIB)]);
        let e = published(&h, &Policy::default(), NODE).expect("an entry");
        let raw = h.estimate(&EstimatorConfig::default(), 1).upper_bound.unwrap();
        assert_eq!(
            e.upper.unwrap().cpu_milli,
            Some((raw.cpu_cores * 1000.0).ceil() as u64)
        );
        assert_eq!(e.capped, None);
    }

    #[test]
    fn max_allowed_below_the_node_is_the_cap_and_named() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let policy = Policy {
            limits: Limits {
                max_cpu_milli: Some(1000.0),
                max_memory_bytes: Some(64.0 * GIB),
                ..Limits::default()
            },
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(
            e.upper,
            Some(Figures {
                cpu_milli: Some(1000),
                memory_bytes: NODE.memory_bytes,
            })
        );
        assert_eq!(
            e.capped.unwrap().upper_bound,
            Some(CappedResources {
                cpu: Some(CapReason::MaxAllowed),
                memory: Some(CapReason::NodeAllocatable),
            })
        );
        // a target above the node (a tiny node, a big minAllowed) is held at the node too
        let policy = Policy {
            limits: Limits {
                min_cpu_milli: Some(8000.0),
                ..Limits::default()
            },
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(e.target.cpu_milli, Some(4000));
        assert_eq!(
            e.capped.unwrap().target.and_then(|t| t.cpu),
            Some(CapReason::NodeAllocatable)
        );
    }

    #[test]
    fn an_uncontrolled_resource_has_no_figure_and_no_cap() {
        let h = history(&[(T0, 0.1)], &[(T0, 300.0 * MIB)]);
        let policy = Policy {
            memory: false,
            ..Policy::default()
        };
        let e = published(&h, &policy, NODE).expect("an entry");
        assert_eq!(
            e.upper,
            Some(Figures {
                cpu_milli: Some(4000),
                memory_bytes: None
            })
        );
        assert_eq!(e.capped.unwrap().upper_bound.unwrap().memory, None);
    }
}
