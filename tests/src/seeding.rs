//! Day one on real nodes (issue 32), shared by `realnode.rs` and the demo: a real Prometheus
//! scraping the kubelets' `/metrics/cadvisor` as an operator's would ([`scrape_kubelets`]), the
//! history it gathers of the shipper before nodewarden is installed ([`wait_for_whole_step`]),
//! `kubectl nodewarden report --prometheus` over it ([`report_args`], [`report_figures`]), and
//! what each node's agent publishes when it starts seeded from it ([`wait_for_publish`],
//! [`check_seeded`]).
//!
//! Both run with a short CPU rate window ([`RATE_WINDOW`], the report's `--rate-window` and the
//! chart's `agent.history.rateWindow`) and a short scrape interval ([`SCRAPE_INTERVAL`]): with the
//! default 2 m window a run would wait a minute more for its first whole step of history.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::rightsizing::{ContainerRecommendation, NodeRecommendation};
use serde_json::json;

use crate::node::{KUBELET_DEFAULT_CERT_DIR, RealCluster};
use crate::prometheus::Prometheus;
use crate::shipper::{NAMESPACE, SHIPPER, SHIPPER_NS, cpu_milli, memory_bytes};

/// How often [`scrape_kubelets`]'s Prometheus scrapes each kubelet's `/metrics/cadvisor`.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(5);

/// CPU's `rate()` range the real-node tier and the demo give the report (`--rate-window`) and the
/// agents (`agent.history.rateWindow`). The kubelet's cAdvisor refreshes a container's figures
/// every 10 s plus a jitter of up to as much again (its housekeeping; the series carry the time
/// of that refresh, so scraping more often adds no point), and up to 15 s plus as much for a
/// container whose figures stay put: a window must hold two refreshes to give a rate. Measured
/// on the real nodes at a load of 4–5 (tests/README.md): refreshes 10.1–19.0 s apart, and a 30 s
/// window gave a rate at one step of three on the busy node; 45 s and 60 s at every step.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// The agents' and the report's resolution: one sample a minute (`agent`'s `seed::RESOLUTION`).
const STEP_MS: i64 = 60_000;

/// The namespace of Prometheus's ServiceAccount.
pub const MONITORING: &str = "monitoring";

/// [`RATE_WINDOW`] as the flag and the chart value take it.
pub fn rate_window_value() -> String {
    match RATE_WINDOW.as_secs() {
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A Prometheus on node a's address that scrapes each kubelet's `/metrics/cadvisor` every
/// [`SCRAPE_INTERVAL`] as an operator's would: with the bearer token of a ServiceAccount allowed
/// `get` on `nodes/metrics` (the kubelets authenticate it with a TokenReview and authorize it
/// with a SubjectAccessReview), TLS verified against the cluster CA, or for a node whose kubelet
/// signed its own certificate against that certificate (as the chart's agent trusts it), and each
/// target labelled with its node's name (what a `kubernetes_sd_configs` relabelling gives). Pods
/// reach it on the host address.
pub async fn scrape_kubelets(cluster: &RealCluster, client: &Client) -> Result<Prometheus> {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": MONITORING}}))?,
        )
        .await?;
    Api::<ServiceAccount>::namespaced(client.clone(), MONITORING)
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "prometheus"}}))?,
        )
        .await?;
    Api::<ClusterRole>::all(client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "prometheus-kubelet"},
                "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}],
            }))?,
        )
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "prometheus-kubelet"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "prometheus-kubelet"},
                "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}],
            }))?,
        )
        .await?;
    let token = cluster
        .cp
        .service_account_token(MONITORING, "prometheus", None)
        .await?;

    let dir = cluster.cp.dir().join("prometheus");
    std::fs::create_dir_all(&dir)?;
    let token_file = dir.join("token");
    let ca_file = dir.join("ca.crt");
    std::fs::write(&token_file, token)?;
    std::fs::write(&ca_file, cluster.cp.ca_pem())?;
    let interval = SCRAPE_INTERVAL.as_secs();
    let mut config =
        format!("global:\n  scrape_interval: {interval}s\n  scrape_timeout: {interval}s\nscrape_configs:\n");
    for node in &cluster.nodes {
        // a self-signed kubelet's certificate is for its name, not its address
        let tls = if node.self_signed_kubelet {
            format!(
                "ca_file: {KUBELET_DEFAULT_CERT_DIR}/kubelet.crt\n      server_name: {}",
                node.name
            )
        } else {
            format!("ca_file: {}", ca_file.display())
        };
        config.push_str(&format!(
            "- job_name: kubelet-cadvisor-{name}\n  scheme: https\n  metrics_path: /metrics/cadvisor\n  \
             authorization:\n    credentials_file: {token}\n  tls_config:\n      {tls}\n  static_configs:\n  \
             - targets: [\"{ip}:10250\"]\n    labels:\n      node: {name}\n",
            name = node.name,
            token = token_file.display(),
            ip = node.ip,
        ));
    }
    let listen = std::net::IpAddr::V4(cluster.nodes[0].ip);
    Prometheus::scraping(&config, listen).await
}

/// The time of the first sample of the shipper's CPU counter that `prometheus` holds, per node
/// (the `node` label of the scrape target); nodes without one are missing.
pub async fn first_samples(prometheus: &Prometheus) -> Result<BTreeMap<String, Timestamp>> {
    let client = nodewarden_history::Prometheus::new(
        nodewarden_history::Endpoint {
            url: prometheus.url(),
            bearer_token_file: None,
            ca_file: None,
        },
        nodewarden_history::Limits::default(),
    )?;
    // timestamp() gives each evaluation the time of the sample it saw: the least is the first
    let query = format!(
        "min by (node) (min_over_time(timestamp(container_cpu_usage_seconds_total{{namespace=\"{SHIPPER_NS}\", container=\"{SHIPPER}\"}})[30m:1s]))"
    );
    let now = Timestamp::now().as_millisecond();
    let series = client
        .query_range(&query, now, now, Duration::from_secs(1))
        .await?;
    let mut first = BTreeMap::new();
    for s in series {
        let (Some(node), Some(&(_, secs))) = (s.labels.get("node"), s.points.first()) else {
            continue;
        };
        #[allow(clippy::cast_possible_truncation)]
        let at = Timestamp::from_millisecond((secs * 1000.0).round() as i64)?;
        first.insert(node.clone(), at);
    }
    Ok(first)
}

/// When the shipper's history was ready: the end of the first whole step, and each node's first
/// sample.
#[derive(Debug, Clone)]
pub struct HistoryReady {
    /// The first minute `M` (the agents' and the report's resolution) whose CPU rate window
    /// `(M − RATE_WINDOW, M]` begins after every node's first sample: the first step that does
    /// not average a container younger than the window.
    pub whole_step: Timestamp,
    /// The first CPU sample of the shipper on each node.
    pub first: BTreeMap<String, Timestamp>,
}

/// How long after a step its samples are settled: what a read (the agents' seeding, the report
/// without `--end`) leaves out at the end of its window, half the rate window (`cadvisor::settled_end` of nodewarden-history).
pub fn settle() -> Duration {
    RATE_WINDOW / 2
}

/// Waits until Prometheus holds the shipper's CPU series for every node of `nodes` (up to 2 min),
/// then until its history holds a whole step ([`HistoryReady::whole_step`]) and that step is
/// settled ([`settle`]), and 2 s more: a read from then on (the report, an agent's seeding) ends
/// its window at that step or a later one, never before it.
pub async fn wait_for_whole_step(prometheus: &Prometheus, nodes: &[String]) -> Result<HistoryReady> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        let first = first_samples(prometheus).await?;
        if nodes.iter().all(|n| first.contains_key(n)) {
            break first;
        }
        if Instant::now() > deadline {
            bail!(
                "Prometheus has no CPU series of the shipper for every node after 120 s: {first:?}\n{}",
                prometheus.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let last_first = first.values().max().copied().context("no node")?;
    let window = SignedDuration::try_from(RATE_WINDOW)?;
    let ready_ms = (last_first + window + SignedDuration::from_secs(1)).as_millisecond();
    let whole_ms = (ready_ms + STEP_MS - 1).div_euclid(STEP_MS) * STEP_MS;
    let settle_ms = i64::try_from(settle().as_millis())?;
    let wait_ms = whole_ms + settle_ms + 2_000 - Timestamp::now().as_millisecond();
    if wait_ms > 0 {
        tokio::time::sleep(Duration::from_millis(wait_ms.unsigned_abs())).await;
    }
    Ok(HistoryReady {
        whole_step: Timestamp::from_millisecond(whole_ms)?,
        first,
    })
}

/// `kubectl nodewarden report` (the words after `kubectl nodewarden`) over the shipper's
/// history in the Prometheus at `url`, with the agents' rate window; add `-o json` for
/// [`report_figures`].
pub fn report_args(url: &str) -> Vec<String> {
    [
        "report",
        "-n",
        SHIPPER_NS,
        "--daemonset",
        SHIPPER,
        "--prometheus",
        url,
        "--rate-window",
        &rate_window_value(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// [`report_args`] over the history up to `end` (`--end`): with an agent's `lastSampleTime`,
/// the very samples that agent seeded from, whenever the report runs.
pub fn report_args_until(url: &str, end: Timestamp) -> Vec<String> {
    let mut args = report_args(url);
    args.extend(["--end".to_string(), end.to_string()]);
    args
}

/// The `--set` values that make the chart's agents seed from `url` as the report read it.
pub fn seeding_values(url: &str) -> Vec<String> {
    vec![
        format!("agent.history.prometheus.url={url}"),
        format!("agent.history.rateWindow={}", rate_window_value()),
    ]
}

/// A node's row of the report: (millicores, bytes) of each figure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Printed {
    /// What a new pod would request.
    pub target: (u64, u64),
    /// The recommendation's lower bound.
    pub lower: (u64, u64),
    /// Its upper bound.
    pub upper: (u64, u64),
    /// CPU samples behind the figures.
    pub sample_count: i64,
    /// The first and the last of them.
    pub first_sample: Option<Timestamp>,
    /// The last.
    pub last_sample: Option<Timestamp>,
}

/// The shipper's row for `node` in the report's JSON (`-o json`).
pub fn report_figures(report: &serde_json::Value, node: &str) -> Result<Printed> {
    let row = report["daemonsets"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["daemonset"] == SHIPPER))
        .and_then(|d| d["rows"].as_array())
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["node"] == node && r["container"] == SHIPPER)
        })
        .with_context(|| format!("the report has no row for {node}: {report}"))?;
    let pair = |field: &str| {
        (
            row[field]["cpuMillis"].as_u64().unwrap_or(0),
            row[field]["memoryBytes"].as_u64().unwrap_or(0),
        )
    };
    let time = |field: &str| -> Result<Option<Timestamp>> {
        row["history"][field]
            .as_str()
            .map(|t| t.parse::<Timestamp>())
            .transpose()
            .with_context(|| format!("the report's {field} for {node}: {row}"))
    };
    Ok(Printed {
        target: pair("target"),
        lower: pair("lowerBound"),
        upper: pair("upperBound"),
        sample_count: row["history"]["sampleCount"].as_i64().unwrap_or(0),
        first_sample: time("firstSampleTime")?,
        last_sample: time("lastSampleTime")?,
    })
}

/// (millicores, bytes) of a figure of a NodeRecommendation (0 where it is missing).
fn figure(list: Option<&BTreeMap<String, Quantity>>) -> Result<(u64, u64)> {
    Ok((
        cpu_milli(list.and_then(|l| l.get("cpu")))?.unwrap_or(0),
        memory_bytes(list.and_then(|l| l.get("memory")))?.unwrap_or(0),
    ))
}

/// What a user compares: the shipper's target (after the policy), the estimator's figure before
/// the policy (`uncappedTarget`: a CPU floor hides the target's CPU), and the bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// `target`.
    pub target: (u64, u64),
    /// `uncappedTarget`.
    pub uncapped: (u64, u64),
    /// `lowerBound`.
    pub lower: (u64, u64),
    /// `upperBound`.
    pub upper: (u64, u64),
}

impl Figures {
    /// The figures of one container's entry.
    pub fn of(r: &ContainerRecommendation) -> Result<Self> {
        Ok(Figures {
            target: figure(r.target.as_ref())?,
            uncapped: figure(r.uncapped_target.as_ref())?,
            lower: figure(r.lower_bound.as_ref())?,
            upper: figure(r.upper_bound.as_ref())?,
        })
    }
}

/// The shipper's entry of `NodeRecommendation/<node>`, if any.
pub async fn shipper_entry(
    client: &Client,
    node: &str,
) -> Result<Option<(NodeRecommendation, ContainerRecommendation)>> {
    let recs: Api<NodeRecommendation> = Api::all(client.clone());
    let Some(rec) = recs.get_opt(node).await? else {
        return Ok(None);
    };
    let entry = rec
        .spec
        .recommendations
        .iter()
        .find(|r| {
            r.autoscaler.namespace == SHIPPER_NS
                && r.autoscaler.name == SHIPPER
                && r.container_name == SHIPPER
        })
        .cloned();
    Ok(entry.map(|e| (rec, e)))
}

/// Runs `work` while watching the shipper's target in `NodeRecommendation/<node>` (read before it
/// starts, every 500 ms while it runs, and once after): `work`'s result and every distinct target
/// seen, (millicores, bytes). A pod made meanwhile gets whichever target was current when the
/// webhook admitted it; the agent may publish anew in between (at most once per 30 s).
pub async fn targets_while<T>(
    client: &Client,
    node: &str,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, Vec<(u64, u64)>)> {
    async fn read(client: &Client, node: &str, seen: &mut Vec<(u64, u64)>) -> Result<()> {
        if let Some((_, entry)) = shipper_entry(client, node).await? {
            let target = Figures::of(&entry)?.target;
            if !seen.contains(&target) {
                seen.push(target);
            }
        }
        Ok(())
    }
    let mut seen = Vec::new();
    read(client, node, &mut seen).await?;
    tokio::pin!(work);
    let out = loop {
        tokio::select! {
            out = &mut work => break out?,
            () = tokio::time::sleep(Duration::from_millis(500)) => read(client, node, &mut seen).await?,
        }
    };
    read(client, node, &mut seen).await?;
    Ok((out, seen))
}

/// The chart's agent pod on `node` (running, not being deleted) and when its container started.
pub async fn agent_on(client: &Client, node: &str) -> Result<Option<(Pod, Timestamp)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=agent"))
        .await?;
    Ok(list.items.into_iter().find_map(|p| {
        let here = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let started = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            // not waiting for ready: its first NodeRecommendation may come before the readiness probe
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .map(|t| t.0);
        match started {
            Some(t) if here && p.metadata.deletion_timestamp.is_none() => Some((p, t)),
            _ => None,
        }
    }))
}

/// The first `NodeRecommendation` an agent published for the shipper after it started.
#[derive(Debug, Clone)]
pub struct Published {
    /// The node.
    pub node: String,
    /// The agent pod's uid.
    pub agent: String,
    /// When its container started (the kubelet's second).
    pub started: Timestamp,
    /// The recommendation's `updateTime`.
    pub published: Timestamp,
    /// The history's `firstSampleTime`.
    pub first_sample: Option<Timestamp>,
    /// The history's `sampleCount` (CPU samples).
    pub sample_count: i64,
    /// The history's `lastSampleTime`: with `--end` at it, the report reads the same samples.
    pub last_sample: Option<Timestamp>,
    /// The shipper's figures.
    pub figures: Figures,
}

impl Published {
    /// Seconds from the agent's start to the recommendation.
    pub fn after_start(&self) -> f64 {
        self.published.duration_since(self.started).as_secs_f64()
    }
}

/// Waits (up to `within`) until the agent on each of `nodes`, other than the agent pods `skip`
/// (uids of agents it replaced), has published a shipper entry for which `accept` holds with an
/// `updateTime` at or after its start; returns the first such for each node, in the order of
/// `nodes`.
pub async fn wait_for_publish(
    client: &Client,
    nodes: &[String],
    skip: &[String],
    within: Duration,
    accept: impl Fn(&ContainerRecommendation) -> bool,
) -> Result<Vec<Published>> {
    let deadline = Instant::now() + within;
    let mut found: Vec<Option<Published>> = vec![None; nodes.len()];
    while found.iter().any(Option::is_none) {
        for (i, node) in nodes.iter().enumerate() {
            if found[i].is_some() {
                continue;
            }
            let Some((pod, started)) = agent_on(client, node).await? else {
                continue;
            };
            let uid = pod.uid().unwrap_or_default();
            if skip.contains(&uid) {
                continue;
            }
            let Some((rec, entry)) = shipper_entry(client, node).await? else {
                continue;
            };
            let Some(published) = rec.spec.update_time.as_ref().map(|t| t.0) else {
                continue;
            };
            if published >= started && accept(&entry) {
                found[i] = Some(Published {
                    node: node.clone(),
                    agent: uid,
                    started,
                    published,
                    first_sample: entry.first_sample_time.as_ref().map(|t| t.0),
                    sample_count: entry.sample_count,
                    last_sample: entry.last_sample_time.as_ref().map(|t| t.0),
                    figures: Figures::of(&entry)?,
                });
            }
        }
        ensure!(
            Instant::now() < deadline,
            "within {within:?}, not every node's agent published for the shipper: {:?}",
            nodes
                .iter()
                .zip(&found)
                .map(|(n, f)| (n, f.is_some()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(found.into_iter().flatten().collect())
}

/// Whether `a` and `b` are within `share` of the larger (and 2 units, for rounding) of each other.
pub fn near(a: u64, b: u64, share: f64) -> bool {
    (a as f64 - b as f64).abs() <= share * a.max(b) as f64 + 2.0
}

/// One of VPA's histogram buckets: figures this close are the same recommendation in effect
/// (docs/history.md, "Tolerances").
pub const BUCKET: f64 = 0.05;

/// The end of the history an agent seeded from: its `lastSampleTime`, on a step of Prometheus's
/// history before the agent started (a live sample would be at no particular millisecond, after
/// it). Run the report with `--end` at it ([`report_args_until`]) to read the same samples.
pub fn seeded_until(seeded: &Published) -> Result<Timestamp> {
    let node = &seeded.node;
    let last = seeded
        .last_sample
        .with_context(|| format!("{node}: the seeded recommendation has no last sample time"))?;
    ensure!(
        last.as_millisecond() % STEP_MS == 0 && last < seeded.started,
        "{node}: the last sample ({last}) is not a step of Prometheus's history before the agent started ({}): \
         the first recommendation already holds a live sample",
        seeded.started
    );
    Ok(last)
}

/// What a seeded agent's first recommendation must show (docs/history.md): published within a
/// minute of the agent's start; a history whose first sample is a step (a whole minute) of the
/// shipper's history in Prometheus, before the agent started; at least one sample; and, against
/// `same` (the report over the same history: `--end` at [`seeded_until`]), the same samples (count,
/// first and last) and the same target: CPU to the millicore (within 1 % for rounding), memory
/// within one 5 % bucket (the agent's first round adds a live memory reading to the interval's
/// peak; CPU needs two readings).
pub fn check_seeded(seeded: &Published, history: &HistoryReady, same: &Printed) -> Result<()> {
    let node = &seeded.node;
    let after = seeded.after_start();
    ensure!(
        after <= 60.0,
        "{node}: the seeded agent published {after:.0}s after its start"
    );
    let first = seeded
        .first_sample
        .with_context(|| format!("{node}: the seeded recommendation has no first sample time"))?;
    let shipper_first = history
        .first
        .get(node)
        .with_context(|| format!("{node}: no first sample in Prometheus"))?;
    // the history began before the agent, on a step of Prometheus's history of the shipper: it
    // can only come from Prometheus (an agent without a checkpoint takes its first live CPU
    // sample a sample interval after it starts, at no particular millisecond)
    ensure!(
        first.as_millisecond() % STEP_MS == 0
            && first >= *shipper_first - SignedDuration::from_secs(1)
            && first <= history.whole_step
            && first < seeded.started,
        "{node}: the first sample ({first}) is not a step of the shipper's history in Prometheus (from \
         {shipper_first}, a whole step at {}) before the agent started ({})",
        history.whole_step,
        seeded.started
    );
    ensure!(
        seeded.sample_count >= 1,
        "{node}: no sample in the seeded history"
    );
    let until = seeded_until(seeded)?;
    ensure!(
        same.sample_count == seeded.sample_count
            && same.first_sample == Some(first)
            && same.last_sample == Some(until),
        "{node}: the report over the agent's history (--end {until}) read other samples: {} from {:?} to {:?}, \
         the agent {} from {first} to {until}",
        same.sample_count,
        same.first_sample,
        same.last_sample,
        seeded.sample_count
    );
    let (cpu, memory) = seeded.figures.target;
    ensure!(
        near(cpu, same.target.0, 0.01) && near(memory, same.target.1, BUCKET),
        "{node}: the seeded agent's target {cpu}m / {memory} B is not the report's {}m / {} B over the same \
         {} samples (CPU within 1 %, memory within one 5 % bucket); seeded {:?}, report {same:?}",
        same.target.0,
        same.target.1,
        seeded.sample_count,
        seeded.figures
    );
    Ok(())
}
