//! Prometheus metrics of the agent, prefixed `nodewarden_agent_`.
//!
//! Per-container series carry (namespace, autoscaler, container, resource): only the autoscaled
//! containers on this node, removed when their history goes, so the label sets stay bounded.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use nodewarden_estimator::policy::Key;

/// Labels of a per-container, per-resource series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// Namespace of the autoscaler.
    pub namespace: String,
    /// Name of the autoscaler.
    pub autoscaler: String,
    /// Container name.
    pub container: String,
    /// `cpu` or `memory`.
    pub resource: &'static str,
}

/// Labels of a per-container series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    /// Namespace of the autoscaler.
    pub namespace: String,
    /// Name of the autoscaler.
    pub autoscaler: String,
    /// Container name.
    pub container: String,
}

/// Label of the publish decisions counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the sampler wrote or skipped the `NodeRecommendation` (or, for
    /// `unrecognised_cgroups`, why a cgroup tree cannot be mapped).
    pub reason: &'static str,
}

/// Labels of the feature gate scrape counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateScrapeLabels {
    /// `kubelet` or `kube-proxy`.
    pub component: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels of a per-autoscaler series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AutoscalerLabels {
    /// Namespace of the autoscaler.
    pub namespace: String,
    /// Name of the autoscaler.
    pub autoscaler: String,
}

/// Labels of the pod update counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpdateLabels {
    /// `resize` or `evict`.
    pub action: &'static str,
    /// `ok`, `refused`, `blocked` (a PodDisruptionBudget), `budget` (the DaemonSet's
    /// maxUnavailable), `too-soon`, `error`.
    pub outcome: &'static str,
}

/// Labels of the seeding's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `seeded`, `empty`, `failed` or `checkpoint`.
    pub outcome: &'static str,
}

/// Label of a write counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// CPU in cores, memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// CPU in cores; `None` removes the series.
    pub cpu_cores: Option<f64>,
    /// Memory in bytes; `None` removes the series.
    pub memory_bytes: Option<f64>,
}

/// The agent's Prometheus metrics, prefixed `nodewarden_agent_`.
pub struct Metrics {
    registry: Registry,
    usage: Family<ResourceLabels, FloatGauge>,
    request: Family<ResourceLabels, FloatGauge>,
    oom_kills: Family<ContainerLabels, Counter>,
    target: Family<ResourceLabels, FloatGauge>,
    lower: Family<ResourceLabels, FloatGauge>,
    upper: Family<ResourceLabels, FloatGauge>,
    samples: Family<ContainerLabels, Gauge>,
    writes: Counter,
    write_errors: Counter,
    publish_decisions: Family<ReasonLabels, Counter>,
    unreadable: Counter,
    unrecognised_cgroups: Family<ReasonLabels, Counter>,
    checkpoint_writes: Counter,
    checkpoint_errors: Counter,
    tracked: Gauge,
    gate_scrapes: Family<GateScrapeLabels, Counter>,
    feature_report_writes: Family<ResultLabels, Counter>,
    pod_updates: Family<UpdateLabels, Counter>,
    pods_running: Family<AutoscalerLabels, Gauge>,
    pods_up_to_date: Family<AutoscalerLabels, Gauge>,
    update_rounds: Counter,
    pods_left: Family<ReasonLabels, Gauge>,
    history_seed: Family<OutcomeLabels, Gauge>,
    history_seed_samples: Gauge,
}

fn labels(key: &Key, resource: &'static str) -> ResourceLabels {
    ResourceLabels {
        namespace: key.autoscaler.namespace.clone(),
        autoscaler: key.autoscaler.name.clone(),
        container: key.container.clone(),
        resource,
    }
}

fn container_labels(key: &Key) -> ContainerLabels {
    ContainerLabels {
        namespace: key.autoscaler.namespace.clone(),
        autoscaler: key.autoscaler.name.clone(),
        container: key.container.clone(),
    }
}

impl Metrics {
    /// Registers every metric, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodewarden_agent");
        registry.register(
            "build",
            "The agent's version and the Rust target it was built for (always 1)",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("program", "nodewarden-agent"),
                ("arch", std::env::consts::ARCH),
            ]),
        );
        let usage = Family::<ResourceLabels, FloatGauge>::default();
        registry.register(
            "container_usage",
            "Last measured usage of an autoscaled container: cpu in cores, memory working set in bytes",
            usage.clone(),
        );
        let request = Family::<ResourceLabels, FloatGauge>::default();
        registry.register(
            "container_request",
            "Request of an autoscaled container's running pod (cpu in cores, memory in bytes); absent when not set",
            request.clone(),
        );
        let oom_kills = Family::<ContainerLabels, Counter>::default();
        registry.register(
            "oom_kills",
            "OOM kills of an autoscaled container seen on this node; each bumps the memory recommendation",
            oom_kills.clone(),
        );
        let target = Family::<ResourceLabels, FloatGauge>::default();
        registry.register(
            "recommendation_target",
            "Recommended request (cpu in cores, memory in bytes)",
            target.clone(),
        );
        let lower = Family::<ResourceLabels, FloatGauge>::default();
        registry.register(
            "recommendation_lower_bound",
            "Lower bound of the recommendation (cpu in cores, memory in bytes)",
            lower.clone(),
        );
        let upper = Family::<ResourceLabels, FloatGauge>::default();
        registry.register(
            "recommendation_upper_bound",
            "Upper bound of the recommendation (cpu in cores, memory in bytes); absent until there is confidence",
            upper.clone(),
        );
        let samples = Family::<ContainerLabels, Gauge>::default();
        registry.register(
            "samples",
            "CPU samples behind the recommendation of a container",
            samples.clone(),
        );
        let writes = Counter::default();
        registry.register(
            "recommendation_writes",
            "NodeRecommendation writes that succeeded",
            writes.clone(),
        );
        let write_errors = Counter::default();
        registry.register(
            "recommendation_write_errors",
            "NodeRecommendation writes that failed (each is retried with backoff)",
            write_errors.clone(),
        );
        let publish_decisions = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "publish_decisions",
            "Why a write was decided: first, containers-changed, target-moved, bound-crossed-request, refresh",
            publish_decisions.clone(),
        );
        let unreadable = Counter::default();
        registry.register(
            "unreadable_containers",
            "Container cgroup readings that failed (missing or malformed files); the other containers go on",
            unreadable.clone(),
        );
        let unrecognised_cgroups = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "unrecognised_cgroups",
            "Cgroup trees in a form the agent cannot map to containers, each counted once, by reason \
             (outside_pod, unknown_form, no_pod_cgroups, no_kubepods); their containers are not measured",
            unrecognised_cgroups.clone(),
        );
        let checkpoint_writes = Counter::default();
        registry.register(
            "checkpoint_writes",
            "Checkpoint files written",
            checkpoint_writes.clone(),
        );
        let checkpoint_errors = Counter::default();
        registry.register(
            "checkpoint_write_errors",
            "Checkpoint writes that failed",
            checkpoint_errors.clone(),
        );
        let tracked = Gauge::default();
        registry.register(
            "tracked_containers",
            "Autoscaled containers running on this node",
            tracked.clone(),
        );
        let gate_scrapes = Family::<GateScrapeLabels, Counter>::default();
        registry.register(
            "gate_scrapes",
            "Reads of a node component's feature gates, by component and result (ok, error)",
            gate_scrapes.clone(),
        );
        let feature_report_writes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "feature_report_writes",
            "NodeFeatureReport writes, by result (ok, error)",
            feature_report_writes.clone(),
        );
        let pod_updates = Family::<UpdateLabels, Counter>::default();
        registry.register(
            "pod_updates",
            "Resizes and evictions of running pods on this node, by action (resize, evict) and outcome",
            pod_updates.clone(),
        );
        let pods_running = Family::<AutoscalerLabels, Gauge>::default();
        registry.register(
            "update_pods",
            "Running pods on this node of autoscalers that act on running pods (InPlace, Recreate)",
            pods_running.clone(),
        );
        let pods_up_to_date = Family::<AutoscalerLabels, Gauge>::default();
        registry.register(
            "update_pods_up_to_date",
            "Of those, the pods whose requests and limits are already this node's figures",
            pods_up_to_date.clone(),
        );
        let update_rounds = Counter::default();
        registry.register(
            "update_rounds",
            "Update rounds over this node's running pods (one per --update-interval while the agent works)",
            update_rounds.clone(),
        );
        let pods_left = Family::<ReasonLabels, Gauge>::default();
        registry.register(
            "update_pods_left",
            "Running pods the last update round left as they are, by reason (mode, up-to-date, resize-underway, \
             too-young, small-change, short-history: figures on less CPU history than --update-min-history \
             would lower them)",
            pods_left.clone(),
        );
        let history_seed = Family::<OutcomeLabels, Gauge>::default();
        registry.register(
            "history_seed",
            "1 for how the last seeding from Prometheus ended, at start or for containers first seen later \
             (seeded, empty: no history found, failed: Prometheus could not be read, checkpoint: not tried at \
             start, every container had a checkpointed history); absent without --history-prometheus-url",
            history_seed.clone(),
        );
        let history_seed_samples = Gauge::default();
        registry.register(
            "history_seed_samples",
            "Samples (CPU and memory) read from Prometheus into the histories by the last seeding",
            history_seed_samples.clone(),
        );
        Metrics {
            history_seed,
            history_seed_samples,
            pod_updates,
            pods_running,
            pods_up_to_date,
            update_rounds,
            pods_left,
            gate_scrapes,
            feature_report_writes,
            registry,
            usage,
            request,
            oom_kills,
            target,
            lower,
            upper,
            samples,
            writes,
            write_errors,
            publish_decisions,
            unreadable,
            unrecognised_cgroups,
            checkpoint_writes,
            checkpoint_errors,
            tracked,
        }
    }

    fn set(family: &Family<ResourceLabels, FloatGauge>, key: &Key, f: Option<Figures>) {
        for (resource, v) in [
            ("cpu", f.and_then(|f| f.cpu_cores)),
            ("memory", f.and_then(|f| f.memory_bytes)),
        ] {
            let l = labels(key, resource);
            match v {
                Some(v) => {
                    family.get_or_create(&l).set(v);
                }
                None => {
                    family.remove(&l);
                }
            }
        }
    }

    /// The container's last measured usage: cpu in cores, memory working set in bytes.
    pub fn usage(&self, key: &Key, cpu_cores: Option<f64>, memory_bytes: f64) {
        Self::set(
            &self.usage,
            key,
            Some(Figures {
                cpu_cores,
                memory_bytes: Some(memory_bytes),
            }),
        );
    }

    /// The requests of the container's running pod (millicores, bytes).
    pub fn request(&self, key: &Key, cpu_milli: Option<u64>, memory_bytes: Option<u64>) {
        Self::set(
            &self.request,
            key,
            Some(Figures {
                cpu_cores: cpu_milli.map(|m| m as f64 / 1000.0),
                memory_bytes: memory_bytes.map(|b| b as f64),
            }),
        );
    }

    /// `n` OOM kills of the container seen.
    pub fn oom_killed(&self, key: &Key, n: u64) {
        self.oom_kills.get_or_create(&container_labels(key)).inc_by(n);
    }

    /// The container's recommendation (target, lower and upper bounds, no upper bound removing
    /// its series) and how many samples it rests on.
    pub fn recommendation(
        &self,
        key: &Key,
        target: Figures,
        lower: Figures,
        upper: Option<Figures>,
        samples: u64,
    ) {
        Self::set(&self.target, key, Some(target));
        Self::set(&self.lower, key, Some(lower));
        Self::set(&self.upper, key, upper);
        self.samples
            .get_or_create(&container_labels(key))
            .set(i64::try_from(samples).unwrap_or(i64::MAX));
    }

    /// Drops every series of a container whose history is gone.
    pub fn forget(&self, key: &Key) {
        for f in [&self.usage, &self.request, &self.target, &self.lower, &self.upper] {
            Self::set(f, key, None);
        }
        self.samples.remove(&container_labels(key));
        self.oom_kills.remove(&container_labels(key));
    }

    /// After an update round: how many running pods it left as they are, per reason (the
    /// [`Leave`](nodewarden_api::domain::update::Leave) labels; a reason absent this round reads 0).
    pub fn pods_left(&self, reasons: &[&'static str], left: &std::collections::BTreeMap<&'static str, i64>) {
        for reason in reasons {
            self.pods_left
                .get_or_create(&ReasonLabels { reason })
                .set(left.get(reason).copied().unwrap_or(0));
        }
    }

    /// After an update round: per autoscaler, its running pods here and how many are up to date.
    pub fn update_round(&self, counts: &std::collections::BTreeMap<(String, String), (i64, i64)>) {
        self.update_rounds.inc();
        self.pods_running.clear();
        self.pods_up_to_date.clear();
        for ((namespace, autoscaler), (running, up_to_date)) in counts {
            let labels = AutoscalerLabels {
                namespace: namespace.clone(),
                autoscaler: autoscaler.clone(),
            };
            self.pods_running.get_or_create(&labels).set(*running);
            self.pods_up_to_date.get_or_create(&labels).set(*up_to_date);
        }
    }

    /// One resize or eviction attempt and its outcome.
    /// One pod update attempt (`action`, `outcome`: see [`UpdateLabels`]).
    pub fn pod_update(&self, action: &'static str, outcome: &'static str) {
        self.pod_updates
            .get_or_create(&UpdateLabels { action, outcome })
            .inc();
    }

    /// How many containers are tracked now.
    pub fn tracked(&self, n: usize) {
        self.tracked.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One successful `NodeRecommendation` write.
    pub fn write_ok(&self) {
        self.writes.inc();
    }

    /// One failed `NodeRecommendation` write.
    pub fn write_error(&self) {
        self.write_errors.inc();
    }

    /// Successful `NodeRecommendation` writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.get()
    }

    /// One publish decision, by reason.
    pub fn decided(&self, reason: &'static str) {
        self.publish_decisions
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// One container whose cgroup could not be read.
    pub fn unreadable_container(&self) {
        self.unreadable.inc();
    }

    /// One cgroup tree the agent cannot map, by reason ([`crate::cgroup::Unmapped::reason`]).
    pub fn unrecognised_cgroup(&self, reason: &'static str) {
        self.unrecognised_cgroups
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Cgroup trees not recognised so far, for one reason.
    pub fn unrecognised_count(&self, reason: &'static str) -> u64 {
        self.unrecognised_cgroups
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Unreadable container cgroups counted so far.
    pub fn unreadable_count(&self) -> u64 {
        self.unreadable.get()
    }

    /// One read of a component's feature gates.
    pub fn gate_scrape(&self, component: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.gate_scrapes
            .get_or_create(&GateScrapeLabels { component, result })
            .inc();
    }

    /// One NodeFeatureReport write.
    pub fn feature_report_write(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.feature_report_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// How seeding from Prometheus ended (`seeded`, `empty`, `failed`, `checkpoint`), and the
    /// samples it read.
    pub fn history_seed(&self, outcome: &'static str, samples: u64) {
        self.history_seed.clear();
        self.history_seed.get_or_create(&OutcomeLabels { outcome }).set(1);
        self.history_seed_samples
            .set(i64::try_from(samples).unwrap_or(i64::MAX));
    }

    /// One checkpoint write, successful or not.
    pub fn checkpoint(&self, ok: bool) {
        if ok {
            self.checkpoint_writes.inc();
        } else {
            self.checkpoint_errors.inc();
        }
    }

    /// OpenMetrics text of every metric, followed by the process's own (`process_*`: CPU, memory,
    /// open files, threads, start time).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = nodewarden_runtime::process::encode(&mut out, &self.registry) {
            tracing::error!(%err, "encoding metrics failed");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
