//! End-to-end: an agent seeded from a real Prometheus holding 8 days of backfilled cAdvisor
//! history, against the real control plane (issue 32).
//!
//! One Ready fake Node, a DaemonSet (template 100m / 64Mi) with a DaemonSetAutoscaler, its pod
//! bound to the node with the container status a kubelet reports, and a synthetic cgroup tree
//! for that container (CPU counter standing still, 300 MiB in use: the history's daily peak, so
//! the first live reading moves no percentile). The history: 0.2 core with 0.5 core in 3
//! minutes of every 20, 200 MiB with 300 MiB in the first hour of every day, and one OOM kill on
//! the day before the last that only kube-state-metrics shows (no `container_oom_events_total`).
//!
//! 1. A fresh agent (no checkpoint) with `--history-prometheus-url` publishes, within a minute,
//!    the figures `kubectl nodewarden report --prometheus --window 8d` prints for the node
//!    (within VPA's rounding: one 5 % bucket), with the history's sample count and first sample
//!    time in the NodeRecommendation. Both count the OOM kill and bump memory for it: the
//!    target is the 400 MiB bucket (the day's 300 MiB peak + 100 MiB) instead of the 300 MiB one.
//! 2. With a checkpoint holding this container's history, the agent does not seed it: its
//!    figures come from its own few samples.
//! 3. With the autoscaler deleted, a fresh agent starts (nothing to seed); once its sampling
//!    loop runs, the autoscaler is created again: the agent seeds the container when it first
//!    sees it and publishes, within a minute, a NodeRecommendation carrying the history's
//!    sample count, first sample time and OOM kill.
//! 4. With Prometheus unreachable, the agent starts empty within its budget and publishes from
//!    live samples: no crash, no wait beyond the budget; a Warning Event on the Node says why:
//!    the budget spent, and the last error seen (the refused connection).
//! 5. With a Prometheus whose answer is larger than the agent's limit (a stand-in at the I/O
//!    edge: a loopback server streaming a 1 GiB matrix, as a misconfigured or hostile one could),
//!    the agent refuses it as it arrives (it takes a few MiB of it, not the gigabyte it would
//!    need memory for), is not retried, stays up, starts empty and publishes live figures; the
//!    Node gets the `HistorySeedFailed` Warning Event naming the limit, its flag and chart value,
//!    and `/metrics` says `nodewarden_agent_history_seed{outcome="failed"}`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_agent::config::Config;
use nodewarden_agent::rightsizing::checkpoint::{self, Checkpoint};
use nodewarden_api::quantity::parse_milli;
use nodewarden_api::rightsizing::{AutoscalerRef, DaemonSetAutoscaler, NodeRecommendation};
use nodewarden_estimator::recommender::{EstimatorConfig, History};
use nodewarden_tests::prometheus::{OomSeries, Prometheus, Synthetic};
use nodewarden_tests::{
    TestEnv, apply_crds, cgroupfs, chart_crd_files, e2e, kubectl_nodewarden, read_crds, simple_daemonset,
    wait_for_daemonset_pods,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const DS: &str = "log-shipper";
const MIB: f64 = 1024.0 * 1024.0;
const DAY_MIN: usize = 24 * 60;
const DAYS: usize = 8;
/// The agents' `--history-window` and the report's `--window`: a day longer than the history.
const HISTORY_WINDOW: &str = "9d";
const CONTAINER_ID: &str = "5eed000000000000000000000000000000000000000000000000000000000001";
/// The container's instance before its OOM kill.
const PREVIOUS_ID: &str = "5eed000000000000000000000000000000000000000000000000000000000000";

/// Binds the DaemonSet's pod to `node` as the scheduler would and gives it the container status
/// a kubelet reports, its last run OOM-killed at `oom_ms` (the history's kill); returns its UID.
async fn run_pod(env: &TestEnv, pod: &Pod, node: &str, oom_ms: i64) -> Result<String> {
    let pods = env.api::<Pod>();
    let name = pod.name_any();
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    });
    pods.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
        .await
        .context("binding the DaemonSet pod")?;
    let status = json!({"status": {
        "phase": "Running", "startTime": "2026-11-21T07:00:00Z",
        "containerStatuses": [{
            "name": "agent", "image": "registry.invalid/agent:1", "imageID": "", "ready": true,
            "restartCount": 1, "started": true, "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
            "containerID": format!("containerd://{CONTAINER_ID}"),
            "lastState": {"terminated": {
                "exitCode": 137, "reason": "OOMKilled", "containerID": format!("containerd://{PREVIOUS_ID}"),
                "finishedAt": k8s_openapi::jiff::Timestamp::from_millisecond(oom_ms)?.to_string(),
            }},
        }],
    }});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .context("setting the pod's container status")?;
    pod.uid().ok_or_else(|| anyhow!("pod without uid"))
}

/// 8 days of the pod's history on `node`, ending a minute before `now_ms`.
fn history(namespace: &str, pod: &str, node: &str, now_ms: i64) -> Synthetic {
    let total = DAYS * DAY_MIN;
    let end_ms = now_ms.div_euclid(60_000) * 60_000 - 60_000;
    Synthetic {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        container: "agent".to_string(),
        node: node.to_string(),
        start_ms: end_ms - total as i64 * 60_000,
        cpu: (0..total).map(|m| if m % 20 < 3 { 0.5 } else { 0.2 }).collect(),
        memory: (0..total)
            .map(|m| {
                if m % DAY_MIN < 60 {
                    300.0 * MIB
                } else {
                    200.0 * MIB
                }
            })
            .collect(),
        // one OOM kill on the day before the last, at 10:00 of the history's day, shown by
        // kube-state-metrics only (no container_oom_events_total at all, as where cAdvisor does not
        // export it). Not on the last day: that day would weigh half of the peaks, and the live
        // reading's new day (300 MiB) would move the median, the lower bound
        oom_minutes: vec![(DAYS - 2) * DAY_MIN + 600],
        oom_series: OomSeries::KubeStateMetrics,
    }
}

fn agent_config(node: &str, dir: &Path, extra: &[&str]) -> Result<Config> {
    let cgroup = dir.join("cgroup");
    let checkpoint = dir.join("checkpoint");
    let mut args = vec![
        "nodewarden-agent",
        "--node-name",
        node,
        "--cgroup-root",
        cgroup.to_str().unwrap_or_default(),
        "--checkpoint-dir",
        checkpoint.to_str().unwrap_or_default(),
        "--log-format",
        "text",
    ];
    if !extra.contains(&"--admin-addr") {
        args.extend_from_slice(&["--admin-addr", "127.0.0.1:0"]);
    }
    if !extra.contains(&"--history-window") {
        // a day longer than the history: every sample is inside the window whenever the agent
        // reads it (an 8-day window would cut the history's first minutes by the clock)
        args.extend_from_slice(&["--history-window", HISTORY_WINDOW]);
    }
    if !extra.contains(&"--sample-interval") {
        // one tick a minute: the first (published at once) is the one compared
        args.extend_from_slice(&["--sample-interval", "1m"]);
    }
    args.extend_from_slice(extra);
    Ok(Config::try_from_args(args)?)
}

/// A synthetic cgroup tree under `dir` holding the pod's container: CPU standing still, 300 MiB
/// (every day's peak in the history: a first live reading that opens a new day changes no
/// percentile).
fn cgroup_tree(dir: &Path, pod_uid: &str) -> Result<()> {
    let root = dir.join("cgroup");
    cgroupfs::write_root(&root)?;
    cgroupfs::write_container(
        &cgroupfs::container_scope(&root, pod_uid, CONTAINER_ID),
        5_000_000,
        300 * 1024 * 1024,
    )
}

/// Runs an agent with `config` until it has published the node's NodeRecommendation (which is
/// deleted first); returns it and how long it took.
async fn first_recommendation(
    env: &TestEnv,
    node: &str,
    config: Config,
) -> Result<(NodeRecommendation, Duration)> {
    let (rec, took, _) = first_recommendation_and_metrics(env, node, config, None).await?;
    Ok((rec, took))
}

/// [`first_recommendation`], and the agent's `/metrics` read on `admin_port` once it has
/// published (while it still runs).
async fn first_recommendation_and_metrics(
    env: &TestEnv,
    node: &str,
    config: Config,
    admin_port: Option<u16>,
) -> Result<(NodeRecommendation, Duration, String)> {
    let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
    if recs.get_opt(node).await?.is_some() {
        recs.delete(node, &Default::default()).await?;
        env.cp
            .poll("the old NodeRecommendation gone", || {
                let recs = recs.clone();
                let node = node.to_string();
                async move { Ok(recs.get_opt(&node).await?.is_none().then_some(())) }
            })
            .await?;
    }
    let stop = CancellationToken::new();
    let started = Instant::now();
    let agent = tokio::spawn(nodewarden_agent::run_with_client(
        config,
        env.client.clone(),
        stop.clone(),
    ));
    let rec = env
        .cp
        .poll("the agent's NodeRecommendation", || {
            let recs = recs.clone();
            let node = node.to_string();
            async move {
                Ok(recs
                    .get_opt(&node)
                    .await?
                    .filter(|r| !r.spec.recommendations.is_empty()))
            }
        })
        .await;
    let took = started.elapsed();
    let metrics = match (admin_port, &rec) {
        (Some(port), Ok(_)) => nodewarden_tests::webhooks::http_get(port, "/metrics").await?.1,
        _ => String::new(),
    };
    ensure!(!agent.is_finished(), "the agent stopped: {:?}", agent.await);
    stop.cancel();
    agent.await??;
    Ok((rec?, took, metrics))
}

/// The size of the matrix [`oversized_prometheus`] offers: far more than an agent's memory.
const OVERSIZED_BODY: usize = 1 << 30;

/// A stand-in for a Prometheus that answers too much: a loopback server that answers every
/// request with `200 OK` and a matrix of [`OVERSIZED_BODY`] bytes, written as fast as the client
/// takes it; its URL and the body bytes clients took.
async fn oversized_prometheus() -> Result<(String, Arc<AtomicUsize>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let sent = Arc::new(AtomicUsize::new(0));
    let taken = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let taken = taken.clone();
            tokio::spawn(async move {
                // the request (its head and form come in one read from this client)
                let mut request = vec![0u8; 64 * 1024];
                if stream.read(&mut request).await.is_err() {
                    return;
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {OVERSIZED_BODY}\r\n\r\n"
                );
                let start = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"pod":"p"},"values":["#;
                if stream
                    .write_all(format!("{head}{start}").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                let chunk = r#"[1700000000,"0.123456789"],"#.repeat(4096);
                let mut body = start.len();
                while body + chunk.len() < OVERSIZED_BODY {
                    if stream.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    body += chunk.len();
                    taken.fetch_add(chunk.len(), Ordering::Relaxed);
                }
            });
        }
    });
    Ok((url, sent))
}

/// (millicores, bytes) of a figure of the NodeRecommendation.
fn pair(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> (u64, u64) {
    let get = |name: &str, scale: u128| {
        list.and_then(|l| l.get(name))
            .and_then(|q| parse_milli(&q.0))
            .map_or(0, |m| u64::try_from(m.div_ceil(scale)).unwrap_or(u64::MAX))
    };
    (get("cpu", 1), get("memory", 1000))
}

fn report_pair(row: &Value, field: &str) -> (u64, u64) {
    (
        row[field]["cpuMillis"].as_u64().unwrap_or(0),
        row[field]["memoryBytes"].as_u64().unwrap_or(0),
    )
}

/// Upper edge of the VPA histogram bucket holding `v` (first bucket `first`, ratio 1.05).
fn edge(first: f64, v: f64) -> f64 {
    let n = ((v * 0.05 / first + 1.0).ln() / 1.05f64.ln()).floor();
    first * (1.05f64.powi(n as i32 + 1) - 1.0) / 0.05
}

/// Within one VPA bucket (5 %) of each other.
fn close(a: (u64, u64), b: (u64, u64)) -> bool {
    let near = |x: u64, y: u64| (x as f64 - y as f64).abs() <= 0.05 * x.max(y) as f64 + 1.0;
    near(a.0, b.0) && near(a.1, b.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_a_checkpoint_seeds_from_prometheus_and_agrees_with_the_report() {
    e2e("history-seed", |env| async move {
        apply_crds(env.cp, &env.client, &read_crds(&chart_crd_files()?)?).await?;
        let kubeconfig = env.cp.kubeconfig_path().display().to_string();
        let node = env.create_nodes(1).await?.remove(0);
        let ds = simple_daemonset(DS, &env.node_selector())?;
        env.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
        let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": DS},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": DS}, "updatePolicy": {"updateMode": "Initial"}}
        }))?;
        env.api::<DaemonSetAutoscaler>()
            .create(&PostParams::default(), &dsa)
            .await?;
        let pods = wait_for_daemonset_pods(env.cp, &env.client, &env.namespace, DS, std::slice::from_ref(&node)).await?;
        let pod = pods.values().next().context("the DaemonSet's pod")?.clone();
        let now_ms = nodewarden_agent::now_ms();
        let series = history(&env.namespace, &pod.name_any(), &node, now_ms);
        // the pod's status still shows the kill (15 s into its minute), as a kubelet's would; not
        // counted again (a day old, VPA's rule drops it; a recent one is left out as the history's
        // own: agent/tests/sampler.rs)
        let oom_ms = series.start_ms + series.oom_minutes[0] as i64 * 60_000 + 15_000;
        let pod_uid = run_pod(&env, &pod, &node, oom_ms).await?;
        let prometheus = Prometheus::start(std::slice::from_ref(&series), None).await?;
        let url = prometheus.url();

        // 1. a fresh agent seeds and publishes the report's figures within a minute
        let fresh = tempfile::tempdir()?;
        cgroup_tree(fresh.path(), &pod_uid)?;
        let config = agent_config(&node, fresh.path(), &["--history-prometheus-url", &url])?;
        let (rec, took) = first_recommendation(&env, &node, config).await?;
        eprintln!("history_seed: seeded agent published in {:.1}s", took.as_secs_f64());
        ensure!(took < Duration::from_secs(60), "published after {took:?}");
        let r = &rec.spec.recommendations[0];
        let agent = (
            pair(r.target.as_ref()),
            pair(r.lower_bound.as_ref()),
            pair(r.upper_bound.as_ref()),
        );
        // what the report prints for the node from the same Prometheus, over the very history
        // the agent read: --end at its last sample, a window longer than the history
        let until = r.last_sample_time.as_ref().context("no last sample time")?.0.to_string();
        let out = kubectl_nodewarden(&[
            "report",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &env.namespace,
            "--prometheus",
            &url,
            "--window",
            HISTORY_WINDOW,
            "--end",
            &until,
            "--daemonset",
            DS,
            "-o",
            "json",
        ])
        .await
        .map_err(|e| anyhow!("{e}\n{}", prometheus.log_tail(30)))?;
        let json: Value = serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
        let row = json["daemonsets"][0]["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["node"] == node.as_str()))
            .with_context(|| format!("no row for {node}: {json}"))?
            .clone();
        let report = (
            report_pair(&row, "target"),
            report_pair(&row, "lowerBound"),
            report_pair(&row, "upperBound"),
        );
        eprintln!("history_seed: report {report:?}, seeded agent {agent:?}");
        ensure!(
            row["history"]["sampleCount"] == r.sample_count
                && row["history"]["lastSampleTime"] == until.as_str(),
            "the report over the agent's history (--end {until}) read other samples: {}, the agent {} samples",
            row["history"],
            r.sample_count
        );
        ensure!(
            close(agent.0, report.0) && close(agent.1, report.1) && close(agent.2, report.2),
            "the seeded agent publishes {agent:?} (target, lower, upper), the report {report:?}"
        );
        // a 2-minute rate blends the 3-minute bursts: between the steady 0.2 core and the
        // bursts' 0.5 (588m with a 1-minute rate), + 15 %
        ensure!(report.0.0 > 230 && report.0.0 < 588, "the busy history's target: {report:?}");
        // the OOM kill kube-state-metrics shows: counted, and the day's peak bumped to
        // max(300Mi + 100Mi, 300Mi × 1.2) = 400Mi, which weighs about a quarter of the days'
        // peaks (half-life one day) → the target (p90) is its bucket (without the kill: the
        // 300 MiB bucket)
        let bumped = (edge(1e7, 400.0 * MIB) * 1.15).ceil() as u64;
        ensure!(
            row["oomKills"] == 1 && report.0.1 == bumped,
            "the report must count the OOM kill and bump memory to {bumped} bytes: {row}"
        );
        // once: from the history, not again from the pod's status
        ensure!(
            r.oom_count == 1 && agent.0.1 >= bumped,
            "the seeded agent must count the OOM kill once ({}) and bump memory to {bumped} bytes: {agent:?}",
            r.oom_count
        );
        // the history's samples and first sample time are on the recommendation
        let expected = (DAYS * DAY_MIN) as i64;
        ensure!(
            r.sample_count >= expected - 5 && r.sample_count <= expected + 5,
            "sample count {} for {expected} minutes of history",
            r.sample_count
        );
        let first = r.first_sample_time.as_ref().context("no first sample time")?;
        let first_ms = first.0.as_millisecond();
        ensure!(
            (first_ms - series.start_ms - 60_000).abs() <= 5 * 60_000,
            "first sample at {first_ms}, the history starts at {}",
            series.start_ms
        );
        ensure!(
            checkpoint::path(&fresh.path().join("checkpoint"), &node).exists(),
            "the seeded agent checkpoints on stop"
        );

        // 2. a checkpointed history wins: no seeding, the figures are the agent's own (the
        // checkpoint's 3 samples and the live ones)
        let resumed = tempfile::tempdir()?;
        cgroup_tree(resumed.path(), &pod_uid)?;
        let dir = resumed.path().join("checkpoint");
        std::fs::create_dir_all(&dir)?;
        let cfg = EstimatorConfig::default();
        let mut own = History::new(&cfg)?;
        let now_ms = nodewarden_agent::now_ms();
        for i in 0..3 {
            own.add_cpu(&cfg, now_ms - (3 - i) * 10_000, 0.1);
            own.add_memory(&cfg, now_ms - (3 - i) * 10_000, 100.0 * MIB);
        }
        checkpoint::save(
            &dir,
            &Checkpoint {
                version: checkpoint::VERSION,
                node: node.clone(),
                saved_at_ms: now_ms,
                entries: vec![checkpoint::Entry {
                    autoscaler: AutoscalerRef {
                        namespace: env.namespace.clone(),
                        name: DS.to_string(),
                    },
                    container: "agent".to_string(),
                    containers_per_pod: 1,
                    history: own.to_stored(),
                }],
            },
        )?;
        let config = agent_config(&node, resumed.path(), &["--history-prometheus-url", &url])?;
        let (rec, _) = first_recommendation(&env, &node, config).await?;
        let r = &rec.spec.recommendations[0];
        ensure!(
            r.sample_count >= 3 && r.sample_count < 10,
            "with a checkpointed history the agent must not seed it: {} samples",
            r.sample_count
        );

        // 3. an autoscaler created after the agent started: its container is seeded when the
        // agent first sees it, off the sampling loop, and published with the history's count
        let late = tempfile::tempdir()?;
        cgroup_tree(late.path(), &pod_uid)?;
        let dsas = env.api::<DaemonSetAutoscaler>();
        dsas.delete(DS, &Default::default()).await?;
        let recs: Api<NodeRecommendation> = Api::all(env.client.clone());
        if recs.get_opt(&node).await?.is_some() {
            recs.delete(&node, &Default::default()).await?;
        }
        let config = agent_config(
            &node,
            late.path(),
            &[
                "--history-prometheus-url",
                &url,
                "--sample-interval",
                "1s",
                "--checkpoint-interval",
                "1s",
            ],
        )?;
        let stop = CancellationToken::new();
        let agent = tokio::spawn(nodewarden_agent::run_with_client(
            config,
            env.client.clone(),
            stop.clone(),
        ));
        // its sampling loop runs (past the start's seeding) once it has written a checkpoint
        let written = checkpoint::path(&late.path().join("checkpoint"), &node);
        env.cp
            .poll("the late agent's first checkpoint", || {
                let written = written.clone();
                async move { Ok(written.exists().then_some(())) }
            })
            .await?;
        ensure!(!agent.is_finished(), "the agent stopped: {:?}", agent.await);
        let created = Instant::now();
        dsas.create(&PostParams::default(), &dsa).await?;
        let rec = env
            .cp
            .poll("the late autoscaler's NodeRecommendation", || {
                let recs = recs.clone();
                let node = node.clone();
                async move {
                    Ok(recs
                        .get_opt(&node)
                        .await?
                        .filter(|r| !r.spec.recommendations.is_empty()))
                }
            })
            .await;
        let took = created.elapsed();
        ensure!(!agent.is_finished(), "the agent stopped: {:?}", agent.await);
        stop.cancel();
        agent.await??;
        let rec = rec?;
        eprintln!(
            "history_seed: an autoscaler created after the agent started: published in {:.1}s",
            took.as_secs_f64()
        );
        ensure!(took < Duration::from_secs(60), "published after {took:?}");
        let r = &rec.spec.recommendations[0];
        ensure!(
            r.sample_count >= expected - 5 && r.sample_count <= expected + 5,
            "the late autoscaler's container: sample count {} for {expected} minutes of history",
            r.sample_count
        );
        let late_first = r.first_sample_time.as_ref().context("no first sample time")?;
        ensure!(
            (late_first.0.as_millisecond() - series.start_ms - 60_000).abs() <= 5 * 60_000,
            "the late autoscaler's container: first sample at {}, the history starts at {}",
            late_first.0.as_millisecond(),
            series.start_ms
        );
        ensure!(r.oom_count == 1, "the late seeding's OOM kill: {}", r.oom_count);
        drop(prometheus);

        // 4. Prometheus gone: the agent starts empty within its budget and publishes live
        let down = tempfile::tempdir()?;
        cgroup_tree(down.path(), &pod_uid)?;
        let config = agent_config(
            &node,
            down.path(),
            &["--history-prometheus-url", &url, "--history-budget", "5s"],
        )?;
        let (rec, took) = first_recommendation(&env, &node, config).await?;
        eprintln!("history_seed: agent with Prometheus down published in {:.1}s", took.as_secs_f64());
        ensure!(took < Duration::from_secs(30), "published after {took:?}");
        ensure!(rec.spec.recommendations[0].sample_count < 10, "{:?}", rec.spec);
        // and says so on the Node, naming the budget and the last error seen (the refused
        // connection: the retries' 1 s + 2 s + 4 s do not fit in 5 s)
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
        let notes: Vec<String> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("HistorySeedFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str())
            })
            .filter_map(|e| e.note)
            .collect();
        eprintln!("history_seed: Events {notes:?}");
        let want = [
            "seeding from Prometheus failed".to_string(),
            "longer than the budget of 5s".to_string(),
            format!("the last error: cannot reach Prometheus at {url}"),
        ];
        ensure!(
            notes.iter().any(|n| want.iter().all(|w| n.contains(w.as_str()))),
            "no HistorySeedFailed Event on the Node naming {want:?}: {notes:?}"
        );

        // 5. a Prometheus answering more than the agent's limit (the default, 4 MiB): refused as it
        // arrives, not retried; the agent stays up, starts empty, publishes live, and says why
        let (big_url, taken) = oversized_prometheus().await?;
        let big = tempfile::tempdir()?;
        cgroup_tree(big.path(), &pod_uid)?;
        let admin = nodewarden_tests::process::free_port()?;
        let admin_addr = format!("127.0.0.1:{admin}");
        let config = agent_config(
            &node,
            big.path(),
            &["--history-prometheus-url", &big_url, "--admin-addr", &admin_addr],
        )?;
        let (rec, took, metrics) = first_recommendation_and_metrics(&env, &node, config, Some(admin)).await?;
        let taken = taken.load(Ordering::Relaxed);
        eprintln!(
            "history_seed: agent with an oversized answer published in {:.1}s, took {:.1} MiB of the {} MiB answer",
            took.as_secs_f64(),
            taken as f64 / MIB,
            OVERSIZED_BODY >> 20
        );
        // the budget (2 minutes) is not waited for: an answer over the limit is not retried
        ensure!(took < Duration::from_secs(30), "published after {took:?}");
        ensure!(rec.spec.recommendations[0].sample_count < 10, "{:?}", rec.spec);
        // what it read of the answer: the limit and what the sockets buffer, far below the
        // chart's 64 MiB memory limit
        ensure!(
            taken < 48 << 20,
            "the agent took {taken} bytes of a {OVERSIZED_BODY}-byte answer"
        );
        ensure!(
            metrics.contains("nodewarden_agent_history_seed{outcome=\"failed\"} 1"),
            "/metrics does not say the seeding failed:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("history_seed"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let notes: Vec<String> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("HistorySeedFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str())
            })
            .filter_map(|e| e.note)
            .collect();
        let want = [
            format!("Prometheus at {big_url} sent an answer larger than the agent's limit of 4194304 bytes"),
            "--history-max-answer-size, chart agent.history.maxAnswerSize".to_string(),
            "agent.resources.limits.memory".to_string(),
        ];
        ensure!(
            notes.iter().any(|n| want.iter().all(|w| n.contains(w.as_str()))),
            "no HistorySeedFailed Event on the Node naming {want:?}: {notes:?}"
        );
        Ok(())
    })
    .await;
}
