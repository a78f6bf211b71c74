//! The right-sizing loop of one node: the pod and autoscaler watches, the seeding from
//! Prometheus, a sample tick every sample interval, the publisher, the updater, the node's
//! allocatable, and the checkpoint. `lib.rs` starts it beside the admin server and the feature
//! gates (`features::run`), as the webhook's app starts each capability.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use nodewarden_estimator::figures::Figures;
use nodewarden_estimator::recommender::EstimatorConfig;
use nodewarden_runtime::admin::Readiness;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cgroup::Hierarchy;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::now_ms;
use crate::rightsizing::checkpoint::{self, Loaded};
use crate::rightsizing::sampler::Sampler;
use crate::rightsizing::{pods, publish, seed, seed_later, update};

/// The loop before it starts: the node's cgroup hierarchy found and the sampler made, with its
/// checkpoint loaded. Made before the admin server binds, so that an agent whose cgroups cannot
/// be read stops at once with the error.
pub struct Rightsizing {
    sampler: Sampler,
    hierarchy: Hierarchy,
    estimator: EstimatorConfig,
    resumed: bool,
}

impl Rightsizing {
    /// Finds the cgroup hierarchy, checks the estimator's flags and loads the checkpoint.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let hierarchy =
            Hierarchy::detect(&config.rightsizing.cgroup_root, config.rightsizing.cgroup_version)?;
        let estimator = config.rightsizing.estimator.estimator()?;
        if let Err(err) = std::fs::create_dir_all(&config.rightsizing.checkpoint_dir) {
            tracing::warn!(dir = %config.rightsizing.checkpoint_dir.display(), error = %err, "cannot create the checkpoint folder; history will not survive a restart");
        }
        let mut sampler = Sampler::new(
            config.node_name.clone(),
            hierarchy.clone(),
            estimator.clone(),
            config.rightsizing.publish(),
            metrics,
        );
        let resumed = restore(&mut sampler, config);
        Ok(Rightsizing {
            sampler,
            hierarchy,
            estimator,
            resumed,
        })
    }

    /// The cgroup hierarchy found.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// Runs until `shutdown`; sets [`crate::READY_CACHES`] in `readiness` once the watches
    /// have listed. Evictions go through `evictions` (see `run_with_kube_config`). Its tasks
    /// are stopped (each given 5 s) and the checkpoint written before it returns.
    pub async fn run(
        self,
        config: &Config,
        client: Client,
        evictions: Client,
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let Rightsizing {
            mut sampler,
            estimator,
            resumed,
            ..
        } = self;
        let stop = shutdown.child_token();
        let stores = pods::watch(client.clone(), &config.node_name, stop.clone());
        let (desired_tx, desired_rx) = watch::channel::<publish::Desired>(None);
        // the updater's last count of running pods per autoscaler, published with the figures
        let (pods_tx, mut pods_rx) = watch::channel::<Vec<nodewarden_api::rightsizing::NodePods>>(Vec::new());
        let updater = update::Updater::new(
            client.clone(),
            evictions,
            config.node_name.clone(),
            config.rightsizing.update.clone(),
            metrics.clone(),
        )
        .reporting_to(pods_tx);
        let updater = tokio::spawn(update::run(
            updater,
            stores.clone(),
            desired_rx.clone(),
            stop.clone(),
        ));
        let event_client = client.clone();
        // the node's allocatable: no published figure goes above it
        let (allocatable_tx, mut allocatable_rx) = watch::channel(Figures::default());
        let allocatable = tokio::spawn(publish::watch_allocatable(
            client.clone(),
            config.node_name.clone(),
            allocatable_tx,
            stop.clone(),
        ));
        let publisher = tokio::spawn(publish::run_publisher(
            client,
            config.node_name.clone(),
            desired_rx,
            metrics.clone(),
            stop.clone(),
            publish::backoff(),
        ));

        tokio::select! {
            _ = shutdown.cancelled() => {
                stop.cancel();
                return Ok(());
            }
            synced = stores.ready() => if !synced {
                stop.cancel();
                anyhow::bail!("the pod and autoscaler watches stopped before their first list");
            }
        }
        readiness.set(crate::READY_CACHES, true);
        let (targets, _) = stores.targets();
        tokio::select! {
            _ = shutdown.cancelled() => {
                stop.cancel();
                return Ok(());
            }
            () = seed_from_history(&mut sampler, &event_client, config, &targets, resumed, &estimator, &metrics) => {}
        }
        tracing::info!("caches synced; measuring");
        // containers first seen later: seeded off this loop, once each (docs/history.md)
        let mut later = config.rightsizing.history.seed().map(|seed| {
            let mut later = seed_later::SeedLater::new(seed, config.node_name.clone(), estimator.clone());
            later.mark_seen(targets.iter().map(|t| &t.key));
            later
        });

        // the first figures already within the node: wait briefly for its first read (a Node that
        // cannot be read leaves them uncapped, with a warning, and is read again later)
        if tokio::time::timeout(Duration::from_secs(5), allocatable_rx.changed())
            .await
            .is_ok_and(|r| r.is_ok())
        {
            sampler.set_allocatable(*allocatable_rx.borrow_and_update());
        }
        let mut ticker = tokio::time::interval(config.rightsizing.sample_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_checkpoint = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => {}
                finished = seed_finished(&mut later) => {
                    let url = config.rightsizing.history.history_prometheus_url.clone().unwrap_or_default();
                    let note = take_seeded(&mut sampler, &url, finished.keys.len(), finished.outcome, finished.took, &metrics);
                    if let Some(note) = note {
                        // not awaited: the Event's write must not hold the sampling back
                        let (client, node) = (event_client.clone(), config.node_name.clone());
                        tokio::spawn(async move { node_event(&client, &node, "Seed", "HistorySeedFailed", note).await });
                    }
                    if let Some(l) = later.as_mut() {
                        l.done(now_ms());
                    }
                    continue;
                }
            }
            let now = now_ms();
            let (mut targets, autoscalers) = stores.targets();
            if let Some(l) = later.as_mut() {
                l.offer(&targets, |key| sampler.history(key).is_some(), now);
                // a container waiting for its history is measured once it is there
                targets.retain(|t| !l.is_pending(&t.key));
            }
            if allocatable_rx.has_changed().unwrap_or(false) {
                sampler.set_allocatable(*allocatable_rx.borrow_and_update());
            }
            let tick = sampler.tick(now, &targets, &autoscalers);
            for unmapped in tick.unrecognised {
                // once per problem (the sampler says each once); not awaited, as above
                let (client, node) = (event_client.clone(), config.node_name.clone());
                let note = unmapped.to_string();
                tokio::spawn(async move {
                    node_event(&client, &node, "Measure", "CgroupsNotRecognised", note).await
                });
            }
            let pods_changed = pods_rx.has_changed().unwrap_or(false);
            let publish = match tick.publish {
                Some((reason, spec)) => Some((reason.as_str(), spec)),
                // new pod counts go out with the last figures (at most once per update round)
                None if pods_changed => desired_tx
                    .borrow()
                    .as_ref()
                    .map(|spec| ("pods", spec.as_ref().clone())),
                None => None,
            };
            if let Some((reason, mut spec)) = publish {
                spec.pods = pods_rx.borrow_and_update().clone();
                tracing::info!(
                    reason,
                    containers = spec.recommendations.len(),
                    "publishing NodeRecommendation"
                );
                desired_tx.send_replace(Some(Arc::new(spec)));
            }
            if last_checkpoint.elapsed() >= config.rightsizing.checkpoint_interval {
                write_checkpoint(&sampler, config, &metrics);
                last_checkpoint = Instant::now();
            }
            // glibc keeps the free space a round leaves below live chunks resident; give it back
            // once a round (docs/benchmarks.md, agent: about 1 MiB with `updateMode: InPlace`)
            nodewarden_sys::release_free_heap();
        }
        write_checkpoint(&sampler, config, &metrics);
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), publisher).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), updater).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), allocatable).await;
        Ok(())
    }
}

/// Loads the checkpoint into `sampler`, logging what happened: whether there was one to resume.
fn restore(sampler: &mut Sampler, config: &Config) -> bool {
    let now_secs = u64::try_from(now_ms() / 1000).unwrap_or(0);
    match checkpoint::load(&config.rightsizing.checkpoint_dir, &config.node_name, now_secs) {
        Loaded::Missing => {
            tracing::info!(dir = %config.rightsizing.checkpoint_dir.display(), "no checkpoint; starting without history");
            false
        }
        Loaded::Found(c) => {
            if c.node != config.node_name {
                tracing::warn!(checkpoint_node = %c.node, node = %config.node_name, "checkpoint was written on another node; using it anyway");
            }
            sampler.restore(&c);
            tracing::info!(
                histories = sampler.history_count(),
                "resumed history from the checkpoint"
            );
            true
        }
        Loaded::MovedAside { moved_to, why } => {
            tracing::warn!(
                moved_to = %moved_to.display(), why = %why, "checkpoint unusable; moved aside, starting without history"
            );
            false
        }
        Loaded::Unreadable { why } => {
            tracing::warn!(why = %why, "checkpoint unreadable; starting without history");
            false
        }
    }
}

/// Seeds the histories of this node's autoscaled containers from Prometheus when
/// `--history-prometheus-url` is set, for the containers without a checkpointed history (the
/// checkpoint wins), within `--history-budget`; any failure is logged and counted, and the agent
/// goes on empty.
async fn seed_from_history(
    sampler: &mut Sampler,
    client: &Client,
    config: &Config,
    targets: &[pods::Target],
    resumed: bool,
    estimator: &nodewarden_estimator::recommender::EstimatorConfig,
    metrics: &Metrics,
) {
    let Some(seed) = config.rightsizing.history.seed() else {
        return;
    };
    let fresh: Vec<pods::Target> = targets
        .iter()
        .filter(|t| sampler.history(&t.key).is_none())
        .cloned()
        .collect();
    if resumed && fresh.is_empty() {
        tracing::info!("every autoscaled container has a checkpointed history; not seeding from Prometheus");
        metrics.history_seed("checkpoint", 0);
        return;
    }
    let started = Instant::now();
    let outcome = seed::seed(&seed, &config.node_name, &fresh, estimator, now_ms()).await;
    if let Some(note) = take_seeded(
        sampler,
        &seed.endpoint.url,
        fresh.len(),
        outcome,
        started.elapsed(),
        metrics,
    ) {
        node_event(client, &config.node_name, "Seed", "HistorySeedFailed", note).await;
    }
}

/// Puts what a seeding read into `sampler`, logging and counting how it ended; returns the note
/// of the Warning Event to publish when it failed.
fn take_seeded(
    sampler: &mut Sampler,
    url: &str,
    containers: usize,
    outcome: Result<seed::Seeded, seed::SeedError>,
    took: Duration,
    metrics: &Metrics,
) -> Option<String> {
    match outcome {
        Ok(seeded) if seeded.histories.is_empty() => {
            tracing::info!(
                prometheus = %url, containers,
                "Prometheus has no history of these autoscaled containers; starting them without history"
            );
            metrics.history_seed("empty", 0);
            None
        }
        Ok(seeded) => {
            let mut taken = 0;
            for (key, history, per_pod) in seeded.histories {
                taken += usize::from(sampler.seed(key, history, per_pod));
            }
            tracing::info!(
                prometheus = %url,
                histories = taken,
                samples = seeded.samples,
                first_sample_ms = seeded.first_sample_ms,
                largest_answer_bytes = seeded.largest_answer_bytes,
                took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                "seeded history from Prometheus"
            );
            metrics.history_seed("seeded", seeded.samples);
            None
        }
        Err(err) => {
            tracing::warn!(prometheus = %url, error = %err, "seeding from Prometheus failed; starting without history");
            metrics.history_seed("failed", 0);
            Some(format!(
                "seeding from Prometheus failed, starting without history: {err}"
            ))
        }
    }
}

/// The next read of `later` that ends; never, without seeding.
async fn seed_finished(later: &mut Option<seed_later::SeedLater>) -> seed_later::Finished {
    match later {
        Some(l) => l.next().await,
        None => std::future::pending().await,
    }
}

/// Publishes a Warning Event about this node (`kubectl describe node` shows it), waiting at
/// most 10 s; a failure is logged only.
async fn node_event(client: &Client, node: &str, action: &str, reason: &str, note: String) {
    let recorder = nodewarden_runtime::events::recorder(client, "nodewarden-agent", Some(node.to_string()));
    let regarding = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Node".to_string()),
        name: Some(node.to_string()),
        ..Default::default()
    };
    let publish = nodewarden_runtime::events::publish(&recorder, &regarding, true, action, reason, note);
    if tokio::time::timeout(Duration::from_secs(10), publish)
        .await
        .is_err()
    {
        tracing::warn!(reason, "publishing an Event took longer than 10s; left");
    }
}

fn write_checkpoint(sampler: &Sampler, config: &Config, metrics: &Metrics) {
    match checkpoint::save(&config.rightsizing.checkpoint_dir, &sampler.checkpoint(now_ms())) {
        Ok(()) => metrics.checkpoint(true),
        Err(err) => {
            metrics.checkpoint(false);
            tracing::warn!(error = %err, "checkpoint not written");
        }
    }
}
