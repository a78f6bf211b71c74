//! Fleet scale through the real API server: 5,000 Nodes, 20 autoscalers grouped by instance
//! type, every node's NodeRecommendation written as the agent writes it, and the webhook as
//! deployed, its index filled by its own watches; then a minute of churn.
//!
//! Run with `cargo run --release -p nodewarden-tests --features loadgen --example fleet-scale-bench`
//! (`NODEWARDEN_SCALE_NODES` changes the node count; `NODEWARDEN_WEBHOOK_BIN` another webhook
//! binary, as in `rightsizing-vpa-bench`; `NODEWARDEN_WEBHOOK_BIN_B` a second build beside it,
//! with its own Lease so both lead, the same watches and the same review load, for before and
//! after in one run: the probe and the rollout use the first).
//!
//! * The control plane of the tests (etcd, kube-apiserver, kube-controller-manager with its
//!   garbage collector), built from Go modules.
//! * 5,000 Node objects over 8 instance types and 3 zones; 20 DaemonSetAutoscalers
//!   (`coldStart: Group` by `node.kubernetes.io/instance-type`), 2 containers each.
//! * Each node's NodeRecommendation (20 autoscalers × 2 containers) written the agent's way:
//!   the object of `nodewarden_estimator::figures::object` (owned by its Node), server-side apply
//!   with the agent's field manager, forced.
//! * The webhook: the binary of its image, the chart's flags and log level, logs to a file.
//! * Measured: how long the writes and the webhook's first sync take; the webhook's resident
//!   memory and CPU, and the API server's CPU, at rest and during the churn; the time from a
//!   NodeRecommendation write to the webhook patching a pod with it (p50, p99); review latency
//!   during the churn.
//! * The churn, for 60 s at once: agents rewriting 8.3 recommendations a second (every node
//!   once per 10 minutes, the upper bound on steady-state writes); a node replaced every
//!   2 s (deleted, its recommendation collected by the garbage collector; a new node of the same
//!   type created and published); 1,000 reviews a second over HTTP/2 (open loop, measured from
//!   when each was due); a probe writing one node's recommendation every 250 ms and timing how
//!   long the webhook takes to use it.
//!
//! * Last, the real DaemonSet controller rolls a DaemonSet out to the 1,250 nodes of two instance
//!   types, once in a namespace the webhook is not called for and once through it (its
//!   autoscaler's pods patched): the time until every pod is created, side by side. Its pace is
//!   kube-controller-manager's client rate (20 requests a second by default), so the wait for
//!   the pods grows with them: a minute and a second per 10 pods (6 min 15 s at 15,000 nodes).
//!
//! How many writes a node makes in steady state is the agent's publish decision over time: see
//! `cargo run --release -p nodewarden-agent --example synthetic -- --workload daily --duration 36h`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
};
use nodewarden_tests::{
    ControlPlane, Hook, LoopbackEndpoint, apply_crds, create_namespace, register_mutating_webhooks,
};
use nodewarden_webhook::loadgen::{Alpn, CpuClock, Load, connect, patched, process_cpu_ns, resident_bytes};
use serde_json::{Value, json};

#[path = "common/bench.rs"]
mod bench;
use bench::{
    ReadyWhen, ds_name, namespace, node_name, review, start_webhook, webhook_build, write_serving_cert,
};

const AUTOSCALERS: usize = 20;
const GROUP_LABEL: &str = "node.kubernetes.io/instance-type";
const TYPES: [&str; 8] = [
    "m5.large",
    "m5.xlarge",
    "m5.2xlarge",
    "c5.xlarge",
    "c5.2xlarge",
    "r5.xlarge",
    "r5.2xlarge",
    "m6i.4xlarge",
];
const CHURN: Duration = Duration::from_secs(60);
const REVIEW_RATE: f64 = 1000.0;
const LOOPBACK: &str = "127.0.0.1";

/// The fewest nodes the phases need: the first 2,000 take the probes and the review load, the
/// agents' churn writes to the ones after them, and the last 100 are left quiet.
const MIN_NODES: usize = 2200;

fn nodes() -> Result<usize> {
    let Some(text) = std::env::var_os("NODEWARDEN_SCALE_NODES") else {
        return Ok(5000);
    };
    let text = text.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if n >= MIN_NODES => Ok(n),
        _ => bail!("NODEWARDEN_SCALE_NODES={text}: expected a whole number of nodes, at least {MIN_NODES}"),
    }
}

fn cpu_millis(i: usize, k: usize, round: usize) -> usize {
    50 + (i * 7 + k * 13 + round * 101) % 900
}

fn autoscaler(k: usize) -> Result<DaemonSetAutoscaler> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": ds_name(k), "namespace": namespace(k)},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": ds_name(k)},
                 "coldStart": "Group", "nodeGroupLabel": GROUP_LABEL},
    }))?)
}

/// Node `i`'s spec as the agent publishes it; `round` moves the figures.
fn spec(i: usize, round: usize) -> NodeRecommendationSpec {
    let mut recs = Vec::new();
    for k in 0..AUTOSCALERS {
        for c in ["agent", "sidecar"] {
            let mem = 64 + (i * 11 + k * 5 + round * 7) % 900;
            recs.push(ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: namespace(k),
                    name: ds_name(k),
                },
                container_name: c.to_string(),
                target: Some(BTreeMap::from([
                    (
                        "cpu".to_string(),
                        Quantity(format!("{}m", cpu_millis(i, k, round))),
                    ),
                    ("memory".to_string(), Quantity(format!("{mem}Mi"))),
                ])),
                lower_bound: None,
                upper_bound: None,
                uncapped_target: None,
                sample_count: 8640,
                first_sample_time: None,
                last_sample_time: None,
                oom_count: 0,
                capped: None,
            });
        }
    }
    NodeRecommendationSpec {
        update_time: None,
        pods: Vec::new(),
        summary: None,
        recommendations: recs,
    }
}

/// Creates node `i` (instance type `TYPES[i % 8]`) and returns its uid.
async fn create_node(nodes: &Api<Node>, i: usize) -> Result<String> {
    let zone = ["eu-west-1a", "eu-west-1b", "eu-west-1c"][i % 3];
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": node_name(i), "labels": {
            "kubernetes.io/hostname": node_name(i),
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            GROUP_LABEL: TYPES[i % TYPES.len()],
            "topology.kubernetes.io/zone": zone,
            "topology.kubernetes.io/region": "eu-west-1",
        }},
    }))?;
    let node = nodes.create(&PostParams::default(), &node).await?;
    node.uid().ok_or_else(|| anyhow!("node {i} without uid"))
}

/// Writes node `i`'s recommendation as the agent does: its object, owned by the Node, by
/// server-side apply with the agent's field manager.
async fn publish(recs: &Api<NodeRecommendation>, i: usize, uid: &str, round: usize) -> Result<()> {
    let obj = nodewarden_estimator::figures::object(&node_name(i), uid, spec(i, round));
    recs.patch(
        &node_name(i),
        &PatchParams::apply(nodewarden_agent::rightsizing::publish::FIELD_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await?;
    Ok(())
}

/// Whether the answer patches the pod's CPU request to `millis`.
fn patches_cpu(answer: &[u8], millis: usize) -> bool {
    use base64::Engine;
    let Ok(v) = serde_json::from_slice::<Value>(answer) else {
        return false;
    };
    let patch = v["response"]["patch"].as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(patch)
        .is_ok_and(|p| String::from_utf8_lossy(&p).contains(&format!("\"{millis}m\"")))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// CPU of processes over a span, as a share of one core.
struct Usage {
    at: Instant,
    cpu: Vec<u64>,
    pids: Vec<u32>,
}

impl Usage {
    fn start(pids: &[u32]) -> Self {
        Usage {
            at: Instant::now(),
            cpu: pids.iter().map(|p| process_cpu_ns(*p)).collect(),
            pids: pids.to_vec(),
        }
    }

    /// Per process, the share of one core used since `start`.
    fn shares(&self) -> Vec<f64> {
        let wall = self.at.elapsed().as_nanos() as f64;
        self.pids
            .iter()
            .zip(&self.cpu)
            .map(|(p, c)| process_cpu_ns(*p).saturating_sub(*c) as f64 / wall)
            .collect()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n = nodes()?;
    let webhook_bin = webhook_build()?;
    let cp = ControlPlane::start().await?;
    let client: Client = cp.admin_client().await?;
    let apiserver = cp
        .pids()
        .into_iter()
        .find(|(name, _)| name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .ok_or_else(|| anyhow!("no kube-apiserver process"))?;
    apply_crds(&cp, &client, &nodewarden_api::crdgen::crds()).await?;
    // the webhook's own namespace: its leader-election Lease
    create_namespace(&cp, &client, "nodewarden").await?;
    for k in 0..AUTOSCALERS {
        create_namespace(&cp, &client, &namespace(k)).await?;
        Api::<DaemonSetAutoscaler>::namespaced(client.clone(), &namespace(k))
            .create(&PostParams::default(), &autoscaler(k)?)
            .await?;
    }

    let nodes_api: Api<Node> = Api::all(client.clone());
    let recs: Api<NodeRecommendation> = Api::all(client.clone());
    let started = Instant::now();
    let uids: Vec<String> = futures::stream::iter(0..n)
        .map(|i| {
            let api = nodes_api.clone();
            async move { create_node(&api, i).await }
        })
        .buffered(16)
        .try_collect()
        .await?;
    let nodes_took = started.elapsed();
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let recs = recs.clone();
            let uid = uids[i].clone();
            async move { publish(&recs, i, &uid, 0).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let recs_took = started.elapsed();
    println!(
        "{n} Nodes created in {:.1} s; {n} NodeRecommendations ({} recommendations each) applied in {:.1} s ({:.0}/s)",
        nodes_took.as_secs_f64(),
        AUTOSCALERS * 2,
        recs_took.as_secs_f64(),
        n as f64 / recs_took.as_secs_f64()
    );

    let dir = tempfile::tempdir()?;
    write_serving_cert(&cp, dir.path())?;
    let started = Instant::now();
    // ready, and patching the last node's pod with that node's figure
    let last = n - 1;
    let webhook = start_webhook(
        &cp,
        dir.path(),
        &webhook_bin,
        ("nodewarden-webhook-scale", None, None),
        ReadyWhen {
            review: review(last, 0),
            patched: |answer: &[u8]| patches_cpu(answer, cpu_millis(last, 0, 0)),
            within: Duration::from_secs(300),
        },
    )
    .await?;
    let (mut webhook, pid, addr) = (webhook.child, webhook.pid, webhook.addr);
    let log_path = dir.path().join("nodewarden-webhook-scale.log");
    let synced = started.elapsed();
    // the leader's first status pass: every autoscaler has its 8 groups
    let autoscalers: Api<DaemonSetAutoscaler> = Api::all(client.clone());
    loop {
        let list = autoscalers.list(&Default::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.groups.len() == TYPES.len().min(n))
            })
            .count();
        if done == AUTOSCALERS {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            bail!(
                "only {done} of {AUTOSCALERS} autoscalers have their groups; the webhook's log ends:\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let grouped = started.elapsed();
    println!(
        "webhook: ready and patching with the last node's figures {:.1} s after start; every autoscaler's groups in its status after {:.1} s",
        synced.as_secs_f64(),
        grouped.as_secs_f64()
    );
    // a second build beside the first (before and after in one run), leading in its own namespace
    let mut second = None;
    if let Some(bin) = std::env::var_os("NODEWARDEN_WEBHOOK_BIN_B") {
        create_namespace(&cp, &client, "nodewarden-b").await?;
        let started = Instant::now();
        let b = start_webhook(
            &cp,
            dir.path(),
            std::path::Path::new(&bin),
            ("nodewarden-webhook-scale-b", None, Some("nodewarden-b")),
            ReadyWhen {
                review: review(last, 0),
                patched: |answer: &[u8]| patches_cpu(answer, cpu_millis(last, 0, 0)),
                within: Duration::from_secs(300),
            },
        )
        .await?;
        println!(
            "webhook B ({}): ready {:.1} s after start",
            std::path::Path::new(&bin).display(),
            started.elapsed().as_secs_f64()
        );
        second = Some(b);
    }
    let pid_b = second.as_ref().map(|b| b.pid);
    // the first's pid, the API server's, and the second's when there is one
    let mut watched = vec![pid, apiserver];
    watched.extend(pid_b);

    // at rest
    let rest = Usage::start(&watched);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let at_rest = rest.shares();
    let rss_rest = resident_bytes(Some(pid));
    let rss_rest_b = pid_b.map(|p| resident_bytes(Some(p)));

    // the churn
    let writes = Arc::new(AtomicUsize::new(0));
    let churn = Usage::start(&watched);
    let deadline = Instant::now() + CHURN;
    let agents = {
        let recs = recs.clone();
        let uids = uids.clone();
        let writes = writes.clone();
        async move {
            // every node once per 10 minutes: n / 600 a second
            let every = Duration::from_secs_f64(600.0 / n as f64);
            let mut tick = tokio::time::interval(every);
            let mut i = 0usize;
            while Instant::now() < deadline {
                tick.tick().await;
                let node = 2000 + i % (n.saturating_sub(2100).max(1));
                if publish(&recs, node, &uids[node], 1 + i / n).await.is_ok() {
                    writes.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }
    };
    let replaced = Arc::new(AtomicUsize::new(0));
    let replacing = {
        let nodes_api = nodes_api.clone();
        let recs = recs.clone();
        let replaced = replaced.clone();
        async move {
            let mut j = 0usize;
            while Instant::now() < deadline {
                let old = n - 1 - j;
                let _ = nodes_api.delete(&node_name(old), &DeleteParams::default()).await;
                // a new name, the same instance type as the node it replaces (`TYPES[i % 8]`)
                let new_index = n.next_multiple_of(TYPES.len()) + j * TYPES.len() + old % TYPES.len();
                if let Ok(uid) = create_node(&nodes_api, new_index).await
                    && publish(&recs, new_index, &uid, 0).await.is_ok()
                {
                    replaced.fetch_add(1, Ordering::Relaxed);
                }
                j += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let probe = {
        let recs = recs.clone();
        let uids = uids.clone();
        let ca = cp.ca_pem().to_string();
        async move {
            let conn = connect(addr, &ca, LOOPBACK, Alpn::H2).await?;
            let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3)?;
            let mut missed = 0usize;
            let mut round = 100usize;
            while Instant::now() < deadline {
                let node = round % 2000;
                let want = cpu_millis(node, 0, round);
                if want == cpu_millis(node, 0, 0) {
                    round += 1;
                    continue;
                }
                let written = Instant::now();
                publish(&recs, node, &uids[node], round).await?;
                let body = review(node, 0);
                loop {
                    if let Some(answer) = conn.send("/mutate/pods", body.clone()).await
                        && patches_cpu(&answer, want)
                    {
                        let _ = hist.record(written.elapsed().as_micros() as u64);
                        break;
                    }
                    if written.elapsed() > Duration::from_secs(30) {
                        missed += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            anyhow::Ok((hist, missed))
        }
    };
    let load = {
        let mut conns = Vec::new();
        for _ in 0..2 {
            conns.push(connect(addr, cp.ca_pem(), LOOPBACK, Alpn::H2).await?);
        }
        Load {
            conns,
            path: "/mutate/pods",
            bodies: (0..2000).map(|i| review(i, i % AUTOSCALERS)).collect(),
            accept: patched,
            cpu: Arc::new(move || process_cpu_ns(pid)) as CpuClock,
        }
    };
    let load_b = match &second {
        Some(b) => {
            let mut conns = Vec::new();
            for _ in 0..2 {
                conns.push(connect(b.addr, cp.ca_pem(), LOOPBACK, Alpn::H2).await?);
            }
            let pid_b = b.pid;
            Some(Load {
                conns,
                path: "/mutate/pods",
                bodies: (0..2000).map(|i| review(i, i % AUTOSCALERS)).collect(),
                accept: patched,
                cpu: Arc::new(move || process_cpu_ns(pid_b)) as CpuClock,
            })
        }
        None => None,
    };
    let reviews_b = async {
        match &load_b {
            Some(load) => Some(load.open_loop(CHURN, REVIEW_RATE).await),
            None => None,
        }
    };
    let (_, _, probed, reviews, reviews_b) = tokio::join!(
        agents,
        replacing,
        probe,
        load.open_loop(CHURN, REVIEW_RATE),
        reviews_b
    );
    let in_churn = churn.shares();
    let rss_churn = resident_bytes(Some(pid));
    let rss_churn_b = pid_b.map(|p| resident_bytes(Some(p)));
    let (hist, missed) = probed?;
    if let Ok(Some(status)) = webhook.try_wait() {
        bail!("nodewarden-webhook exited during the churn: {status}");
    }

    println!("\n| | at rest (30 s) | during the churn (60 s) |");
    println!("|---|---:|---:|");
    println!(
        "| webhook CPU (whole process, share of one core) | {:.1} % | {:.1} % |",
        at_rest[0] * 100.0,
        in_churn[0] * 100.0
    );
    println!(
        "| webhook resident memory | {:.1} MiB | {:.1} MiB |",
        mib(rss_rest),
        mib(rss_churn)
    );
    println!(
        "| kube-apiserver CPU (share of one core) | {:.1} % | {:.1} % |",
        at_rest[1] * 100.0,
        in_churn[1] * 100.0
    );
    if let (Some(rest_b), Some(churn_b)) = (rss_rest_b, rss_churn_b) {
        println!(
            "| webhook B CPU (whole process, share of one core) | {:.1} % | {:.1} % |",
            at_rest.get(2).copied().unwrap_or_default() * 100.0,
            in_churn.get(2).copied().unwrap_or_default() * 100.0
        );
        println!(
            "| webhook B resident memory | {:.1} MiB | {:.1} MiB |",
            mib(rest_b),
            mib(churn_b)
        );
    }
    println!(
        "\nchurn: {} recommendations rewritten by agents, {} nodes replaced (deleted, created, published), \
         {:.0} reviews/s with p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} failed",
        writes.load(Ordering::Relaxed),
        replaced.load(Ordering::Relaxed),
        reviews.rate(),
        reviews.ms(0.5),
        reviews.ms(0.99),
        reviews.max_ms(),
        reviews.failures
    );
    if let Some(b) = &reviews_b {
        println!(
            "webhook B in the churn: {:.0} reviews/s with p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {} failed",
            b.rate(),
            b.ms(0.5),
            b.ms(0.99),
            b.max_ms(),
            b.failures
        );
    }
    if let Some(mut b) = second.take()
        && let Ok(Some(status)) = b.child.try_wait()
    {
        bail!("webhook B exited during the churn: {status}");
    }
    println!(
        "a NodeRecommendation write to the webhook patching with it: {} probes, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {missed} not seen within 30 s",
        hist.len(),
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
        hist.max() as f64 / 1e3
    );

    // the DaemonSet controller through the webhook, and without it
    let endpoint = LoopbackEndpoint {
        port: addr.port(),
        ca_pem: cp.ca_pem().to_string(),
    };
    let hook = Hook::pods().only_namespace(&namespace(0));
    register_mutating_webhooks(&client, "nodewarden-scale", &endpoint, &[hook]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await; // the API server picks the configuration up
    create_namespace(&cp, &client, "plain").await?;
    let want = (0..n).filter(|i| i % TYPES.len() < 2).count();
    println!(
        "\n| rollout of a DaemonSet to {want} nodes (the real DaemonSet controller) | every pod created after | pods patched |"
    );
    println!("|---|---:|---:|");
    for (label, ns) in [
        ("without the webhook", "plain"),
        ("through the webhook", namespace(0).as_str()),
    ] {
        let (took, patched) = rollout(&client, ns, &ds_name(0), want).await?;
        println!("| {label} | {:.1} s | {patched} |", took.as_secs_f64());
    }
    let _ = webhook.kill().await;
    Ok(())
}

/// Creates DaemonSet `name` in `namespace` on the nodes of the first two instance types
/// and waits until the DaemonSet controller has created its `want` pods; returns how long that
/// took and how many of them the webhook patched.
async fn rollout(client: &Client, namespace: &str, name: &str, want: usize) -> Result<(Duration, usize)> {
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": GROUP_LABEL, "operator": "In", "values": [TYPES[0], TYPES[1]]}]}]}}},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {"name": "agent", "image": "nodewarden-e2e/pause:never-pulled",
                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                       "limits": {"cpu": "200m", "memory": "128Mi"}}},
                        {"name": "sidecar", "image": "nodewarden-e2e/pause:never-pulled",
                         "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                       "limits": {"cpu": "200m", "memory": "128Mi"}}},
                    ],
                },
            },
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &ds)
        .await?;
    // The DaemonSet controller creates pods at kube-controller-manager's client rate (20 a second
    // by default), so the wait grows with the pods: a minute, and a second per 10 pods.
    let within =
        Duration::from_secs(60) + Duration::from_millis(100) * u32::try_from(want).unwrap_or(u32::MAX);
    loop {
        // metadata only: the count and each pod's annotations
        let list = pods.list_metadata(&Default::default()).await?;
        if list.items.len() >= want {
            let took = started.elapsed();
            let patched = list
                .iter()
                .filter(|p| p.annotations().contains_key("rightsizing.nodewarden.io/source"))
                .count();
            return Ok((took, patched));
        }
        if started.elapsed() > within {
            bail!(
                "{} of {want} pods of DaemonSet {namespace}/{name} created within {within:?}",
                list.items.len()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
