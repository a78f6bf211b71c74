//! The soak: nodewarden installed by its chart on a real node (two webhook replicas, the agent,
//! managed certificates whose CA rotates every minute), under everything at once for
//! `NODEWARDEN_SOAK_SECONDS` (300 in CI; an hour by hand, docs/benchmarks.md):
//!
//! - pod churn: a DaemonSet over simulated nodes (Node objects without a kubelet, tainted so
//!   nothing else lands there); one of its pods deleted every `1/NODEWARDEN_SOAK_RATE` s, the real
//!   DaemonSet controller makes it again and the webhook sizes it for its node; a rollout of the
//!   DaemonSet (a template annotation) now and then;
//! - NodeRecommendation updates: every simulated node's figures move every 20 s, as an agent's do;
//! - claims: every half second a valid ClusterClaim created (and deleted) and a bad `id.k8s.io`
//!   claim refused, through the webhook (`failurePolicy: Fail`);
//! - feature writes: two Features own fields of Leases in the soak's namespace (the chart's
//!   `features.ownedResources`), `soak-glow` off and `soak-shine` on; every half second a Lease
//!   setting the on feature's field is created (and deleted) and one setting the off feature's
//!   field is refused with the feature's reason (`failurePolicy: Fail`);
//! - disruptions, one every `min(duration/6, 3 min)`, in turn: a webhook pod deleted (graceful),
//!   a webhook process killed with SIGKILL (the kubelet restarts it), a `helm upgrade` (a new
//!   ReplicaSet rolls out);
//! - an attacker on the host, from an address of its own, opening silent TCP connections to one
//!   webhook replica at about 500 a second and holding the last 400, and from the same address
//!   four HTTP/2 connections each holding as many reviews open without a body as the replica
//!   allows (opened again as the replica answers or closes them).
//!
//! What a user would notice is asserted: every pod the DaemonSet controller made carries its own
//! node's figures (each node's are unique, so another node's or the template's are caught), every
//! valid claim and feature write was allowed and every bad one refused with the webhook's reason,
//! except within 20 s of a replica's SIGKILL: the reviews in flight on the killed process's
//! connections, and those sent to its endpoint before the readiness probe takes it out, fail, so
//! a pod may get the template's requests (`failurePolicy: Ignore`) and a claim or a feature write
//! be refused (`Fail`), as docs/server.md ("Faults") says. Those are counted and printed, and the
//! API server's fail-open count must not exceed the pods they explain. A graceful delete or a
//! `helm upgrade` must lose nothing: a replica retires during its shutdown delay (docs/server.md,
//! "Faults"; docs/benchmarks.md, "Soak", for the runs that showed it). What is recorded, per minute (printed, and a CSV under
//! `target/soak/`): pods, claims, the API server's p99 for nodewarden's webhooks, the webhook
//! processes' resident memory and open files, the agent's resident memory, the attacker's
//! connections.
//!
//! When a call failed, the API server's own words for it (`Failed calling webhook …`: refused,
//! reset, EOF, a certificate, a timeout) are printed with their time since the start, beside the
//! disruptions' times. `NODEWARDEN_SOAK_DISRUPTION_SECONDS` sets the disruptions' interval (to look
//! for a rare loss after one kind).
//!
//! Needs Linux and root (a real node); elsewhere it says so loudly and passes, except under
//! `CI=true`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nodewarden_api::features::Feature;
use nodewarden_api::rightsizing::{NodeRecommendation, NodeRecommendationSpec};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::shipper::{NAMESPACE, RELEASE, container_requests, install_chart, running_pods};
use nodewarden_tests::{
    RealCluster, RealClusterConfig, apply_crds, chart_crd_files, create_namespace, create_ready_node,
    daemonset_pod_target_node, failure_with, read_crds, require_real_nodes,
};
use nodewarden_tests::{images, procfs};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SOAK_NS: &str = "soak";
const CHURN: &str = "churn";
const SIMULATED_LABEL: &str = "soak.nodewarden.io/simulated";
const MIB: u64 = 1024 * 1024;
/// The Feature that is off; writes setting its field (a Lease's `spec.holderIdentity`) are refused.
const GLOW: &str = "soak-glow";
/// The start of the features guard's denial for [`GLOW`]'s field.
const GLOW_DENIED: &str = "feature soak/soak-glow is";
/// The Lease that sets [`GLOW`]'s field.
const HELD: &str = "soak-held";

/// Every figure (CPU millicores, memory bytes) published for each simulated node so far.
type Published = Arc<Mutex<HashMap<String, BTreeSet<(u64, u64)>>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_nothing_lost() -> Result<()> {
    if !require_real_nodes("soak_nothing_lost")? {
        return Ok(());
    }
    let seconds: u64 = env_number("NODEWARDEN_SOAK_SECONDS", 300)?;
    let rate: u64 = env_number("NODEWARDEN_SOAK_RATE", 5)?;
    let simulated: usize = env_number("NODEWARDEN_SOAK_NODES", 30)?;
    ensure!(
        (60..=86_400).contains(&seconds) && (1..=50).contains(&rate) && (1..=200).contains(&simulated),
        "NODEWARDEN_SOAK_SECONDS 60-86400, NODEWARDEN_SOAK_RATE 1-50, NODEWARDEN_SOAK_NODES 1-200"
    );
    let images = images::build_test_images().await?;
    let cluster = RealCluster::start(&RealClusterConfig::with_images(1, &images)).await?;
    // a disruption every this many seconds instead of min(duration/6, 180 s), to look for a rare
    // loss after one kind of disruption (0: the default)
    let disrupt_every = match env_number("NODEWARDEN_SOAK_DISRUPTION_SECONDS", 0u64)? {
        0 => None,
        s if (20..=3_600).contains(&s) => Some(Duration::from_secs(s)),
        s => bail!("NODEWARDEN_SOAK_DISRUPTION_SECONDS={s}: 20-3600, or 0 for the default"),
    };
    let result = soak(
        &cluster,
        &images,
        Duration::from_secs(seconds),
        rate,
        simulated,
        disrupt_every,
    )
    .await;
    let details = match &result {
        Err(_) => cluster.cp.log_tails(40),
        Ok(()) => String::new(),
    };
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "soak_nothing_lost", &details))?;
    restored
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v} is not a number")),
        Err(_) => Ok(default),
    }
}

/// Each simulated node's figures in version `v` (0 or 1): CPU unique per node and version, so a
/// pod with another node's figures, or the template's (100m), is caught.
fn figures(node: usize, v: usize) -> (u64, u64) {
    (
        150 + 2 * node as u64 + v as u64,
        (96 + node as u64 + v as u64) * MIB,
    )
}

async fn soak(
    cluster: &RealCluster,
    images: &images::TestImages,
    duration: Duration,
    rate: u64,
    simulated: usize,
    disrupt_every: Option<Duration>,
) -> Result<()> {
    let cp = &cluster.cp;
    let client = cp.admin_client().await?;
    apply_crds(cp, &client, &read_crds(&chart_crd_files()?)?).await?;
    create_namespace(cp, &client, SOAK_NS).await?;

    // managed certificates whose CA is replaced every minute (a new one staged a minute into
    // each CA's four-minute life, served 20 s later)
    let values: Vec<String> = [
        "certificates.managed.caValidity=4m",
        "certificates.managed.caRenewBefore=3m",
        "certificates.managed.caPropagation=20s",
        "certificates.managed.certValidity=4m",
        "certificates.managed.renewBefore=2m",
        "certificates.managed.checkInterval=5s",
        // the feature writes: Leases are owned resources, in the soak's namespace only (a
        // node's or a controller's own Lease must never wait for this webhook)
        "features.ownedResources[0].apiGroups[0]=coordination.k8s.io",
        "features.ownedResources[0].apiVersions[0]=v1",
        "features.ownedResources[0].resources[0]=leases",
        "features.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=soak",
    ]
    .map(String::from)
    .to_vec();
    let helm = Helm::for_control_plane(cp)?;
    let checkpoints = cluster.fresh_checkpoint_dir()?;
    let took = install_chart(&helm, &client, images, &checkpoints, &values).await?;
    eprintln!("soak: helm install --wait took {:.1}s", took.as_secs_f64());
    let webhooks = running_pods(&client, NAMESPACE, "app.kubernetes.io/component=webhook").await?;
    ensure!(webhooks.len() == 2, "two webhook replicas run: {webhooks:?}");

    // the simulated nodes, after the install (its --wait would wait for agents there): no kubelet,
    // a taint only the churn DaemonSet (and the agent's, whose pods stay pending there) tolerates
    let mut nodes = Vec::new();
    for i in 0..simulated {
        let name = format!("soak-sim-{i:03}");
        let labels = BTreeMap::from([(SIMULATED_LABEL.to_string(), "true".to_string())]);
        create_ready_node(cp, &client, &name, labels).await?;
        Api::<Node>::all(client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": SIMULATED_LABEL, "value": "true", "effect": "NoSchedule"}
                ]}})),
            )
            .await?;
        nodes.push(name);
    }
    // every node's figures, version 0, published before anything asks for them
    let published: Published = Arc::default();
    let refused_reports: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    publish(&client, &nodes, 0, &published, &refused_reports).await?;

    // the churn DaemonSet and its autoscaler
    Api::<nodewarden_api::DaemonSetAutoscaler>::namespaced(client.clone(), SOAK_NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "DaemonSetAutoscaler",
                "metadata": {"name": CHURN},
                "spec": {"targetRef": {"kind": "DaemonSet", "name": CHURN},
                         "updatePolicy": {"updateMode": "Initial"}},
            }))?,
        )
        .await?;
    // the Features, and the off one's guard in force before anything is counted
    create_features(&client).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), SOAK_NS);
    let waited = Instant::now();
    loop {
        match leases
            .create(
                &PostParams::default(),
                &lease(HELD, json!({"holderIdentity": "soak"}))?,
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains(GLOW_DENIED) => break,
            Ok(_) => {
                let _ = leases.delete(HELD, &DeleteParams::default()).await;
            }
            Err(_) => {}
        }
        ensure!(
            waited.elapsed() < Duration::from_secs(60),
            "the webhook did not refuse a write to {GLOW}'s field within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let checked = Arc::new(Checked::default());
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    // the watch starts before the DaemonSet, so it sees every pod the controller makes
    tasks.spawn(watch_pods(
        client.clone(),
        published.clone(),
        checked.clone(),
        stop.clone(),
    ));
    Api::<DaemonSet>::namespaced(client.clone(), SOAK_NS)
        .create(&PostParams::default(), &churn_daemonset(&images.testbox_ref())?)
        .await?;

    let apiserver_before = apiserver_webhook_metrics(&client).await?;
    let started = Instant::now();
    let started_wall = std::time::SystemTime::now();
    let claims = Arc::new(Decisions::default());
    let feature_writes = Arc::new(Decisions::default());
    let attacks = Arc::new(AtomicU64::new(0));
    let streams = Arc::new(AtomicU64::new(0));
    tasks.spawn(churn(client.clone(), rate, stop.clone()));
    tasks.spawn(move_figures(
        client.clone(),
        nodes.clone(),
        published.clone(),
        refused_reports.clone(),
        stop.clone(),
    ));
    tasks.spawn(decisions_loop(
        claim_writes(client.clone())?,
        claims.clone(),
        stop.clone(),
    ));
    let source = IpAddr::V4(cluster.nodes[0].ip);
    tasks.spawn(decisions_loop(
        lease_writes(client.clone())?,
        feature_writes.clone(),
        stop.clone(),
    ));
    tasks.spawn(attack(client.clone(), source, attacks.clone(), stop.clone()));
    tasks.spawn(stream_attack(
        client.clone(),
        source,
        streams.clone(),
        stop.clone(),
    ));
    let rotations = Arc::new(Mutex::new(BTreeSet::new()));
    tasks.spawn(watch_ca(client.clone(), rotations.clone(), stop.clone()));

    // the disruptions, and a sample of the processes every 5 s, minute by minute
    let interval = match disrupt_every {
        Some(every) => every,
        None => (duration / 6).min(Duration::from_secs(180)),
    };
    let mut next_disruption = started + interval;
    let mut disruptions = Vec::new();
    let mut kills = Vec::new();
    let mut minutes: Vec<Minute> = Vec::new();
    let mut minute = Minute::default();
    let mut minute_started = Instant::now();
    let mut metrics_at_minute = apiserver_before.clone();
    let (mut pods_at_minute, mut claims_at_minute, mut attacks_at_minute) = (0, 0, 0);
    let (mut features_at_minute, mut streams_at_minute) = (0, 0);
    let mut rollout = 0;
    while started.elapsed() < duration {
        if let Some(e) = tasks.try_join_next() {
            bail!("a soak task ended early: {:?}", e.map_err(anyhow::Error::from));
        }
        if Instant::now() >= next_disruption {
            let what = match disruptions.len() % 3 {
                0 => delete_webhook_pod(&client).await?,
                1 => {
                    kills.push(Instant::now());
                    kill_webhook_process(cluster)?
                }
                _ => {
                    rollout += 1;
                    let h = helm_upgrade(&helm, rollout).await?;
                    patch_churn_template(&client, rollout).await?;
                    h
                }
            };
            eprintln!("soak: {:>4.0}s {what}", started.elapsed().as_secs_f64());
            disruptions.push(what);
            next_disruption += interval;
        }
        let sample = sample_processes(cluster);
        minute.absorb(&sample);
        if minute_started.elapsed() >= Duration::from_secs(60) {
            let now = apiserver_webhook_metrics(&client).await?;
            minute.p99_ms = now.p99_ms_since(&metrics_at_minute);
            minute.reviews = now.reviews - metrics_at_minute.reviews;
            let pods = checked.total();
            let claim_total = claims.total();
            let attack_total = attacks.load(Ordering::Relaxed);
            minute.pods = pods - pods_at_minute;
            minute.claims = claim_total - claims_at_minute;
            minute.connections = attack_total - attacks_at_minute;
            let feature_total = feature_writes.total();
            let stream_total = streams.load(Ordering::Relaxed);
            minute.feature_writes = feature_total - features_at_minute;
            minute.streams = stream_total - streams_at_minute;
            (features_at_minute, streams_at_minute) = (feature_total, stream_total);
            eprintln!("soak: minute {}: {}", minutes.len() + 1, minute.line());
            (pods_at_minute, claims_at_minute, attacks_at_minute) = (pods, claim_total, attack_total);
            metrics_at_minute = now;
            minutes.push(std::mem::take(&mut minute));
            minute_started = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    stop.cancel();
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let after = apiserver_webhook_metrics(&client).await?;
    let csv = write_csv(&minutes)?;
    let good = checked.good.load(Ordering::Relaxed);
    let (lost_after_kill, lost) = after_kills(checked.lost(), &kills, started);
    let wrong = claims.wrong.lock().map(|w| w.clone()).unwrap_or_default();
    let (refused_after_kill, wrong) = after_kills(wrong, &kills, started);
    let feature_wrong = feature_writes.wrong.lock().map(|w| w.clone()).unwrap_or_default();
    let (features_after_kill, feature_wrong) = after_kills(feature_wrong, &kills, started);
    let reports = refused_reports.lock().map(|r| r.clone()).unwrap_or_default();
    let (reports_after_kill, reports_refused) = after_kills(reports, &kills, started);
    let made = good + (lost_after_kill.len() + lost.len()) as u64;
    let failed_open = after.failed_open - apiserver_before.failed_open;
    eprintln!(
        "soak: {:.0}s, {made} pods made by the DaemonSet controller, {good} with their node's figures, {} without \
         within {}s of a SIGKILL, {} otherwise; claims {} allowed, {} refused as they should, {} refused \
         within {}s of a SIGKILL; feature writes {} allowed, {} refused as they should, {} refused within {}s of \
         a SIGKILL; {} CA rotations seen; {} connections and {} held HTTP/2 streams from the attacker; API \
         server: {} reviews, {failed_open} failed open, p99 at most {:.0} ms (its histogram bucket); per minute: {}",
        started.elapsed().as_secs_f64(),
        lost_after_kill.len(),
        KILL_WINDOW.as_secs(),
        lost.len(),
        claims.allowed.load(Ordering::Relaxed),
        claims.refused.load(Ordering::Relaxed),
        refused_after_kill.len(),
        KILL_WINDOW.as_secs(),
        feature_writes.allowed.load(Ordering::Relaxed),
        feature_writes.refused.load(Ordering::Relaxed),
        features_after_kill.len(),
        KILL_WINDOW.as_secs(),
        rotations.lock().map(|r| r.len().saturating_sub(1)).unwrap_or(0),
        attacks.load(Ordering::Relaxed),
        streams.load(Ordering::Relaxed),
        after.reviews - apiserver_before.reviews,
        after.p99_ms_since(&apiserver_before),
        csv.display()
    );
    // an API error repeats the message three times: the first 200 characters say it
    let short = |s: &String| s.chars().take(200).collect::<String>();
    for l in &lost_after_kill {
        eprintln!("soak: without figures after a SIGKILL: {l}");
    }
    for r in &refused_after_kill {
        eprintln!("soak: claim refused after a SIGKILL: {}", short(r));
    }
    for r in &features_after_kill {
        eprintln!("soak: feature write refused after a SIGKILL: {}", short(r));
    }
    for r in &reports_after_kill {
        eprintln!("soak: write refused after a SIGKILL (retried): {}", short(r));
    }
    // why the API server failed a call: its own words, with their time since the start
    let apiserver_log = std::fs::read_to_string(cp.dir().join("kube-apiserver.log")).unwrap_or_default();
    for line in failed_calls(&apiserver_log, started_wall) {
        eprintln!("soak: API server: {line}");
    }

    // what a user would notice
    let expected_min = rate * duration.as_secs() / 2;
    ensure!(
        made >= expected_min,
        "the churn made {made} pods in {duration:?}, fewer than half the {} asked for",
        rate * duration.as_secs()
    );
    ensure!(
        lost.is_empty(),
        "{} of {made} pods were created without their node's figures away from any SIGKILL: {lost:?}",
        lost.len()
    );
    ensure!(
        failed_open <= lost_after_kill.len() as u64,
        "the API server failed open on {failed_open} reviews, more than the {} pods a SIGKILL explains",
        lost_after_kill.len()
    );
    ensure!(
        wrong.is_empty(),
        "claims wrongly decided away from any SIGKILL: {wrong:?}"
    );
    ensure!(
        feature_wrong.is_empty(),
        "feature writes wrongly decided away from any SIGKILL: {feature_wrong:?}"
    );
    ensure!(
        reports_refused.is_empty(),
        "NodeRecommendation writes refused away from any SIGKILL: {reports_refused:?}"
    );
    ensure!(
        claims.allowed.load(Ordering::Relaxed) > 0 && claims.refused.load(Ordering::Relaxed) > 0,
        "claims were written"
    );
    ensure!(
        feature_writes.allowed.load(Ordering::Relaxed) > 0
            && feature_writes.refused.load(Ordering::Relaxed) > 0,
        "feature writes were made"
    );
    let seen = rotations.lock().map(|r| r.len()).unwrap_or(0);
    ensure!(seen >= 2, "the managed CA rotated at least once: {seen} CAs seen");
    ensure!(
        disruptions.len() >= 3,
        "every kind of disruption ran: {disruptions:?}"
    );
    Ok(())
}

/// The churn DaemonSet: the test image idling, on the simulated nodes only.
fn churn_daemonset(image: &str) -> Result<DaemonSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": CHURN},
        "spec": {
            "selector": {"matchLabels": {"app": CHURN}},
            "template": {
                "metadata": {"labels": {"app": CHURN}},
                "spec": {
                    "nodeSelector": {SIMULATED_LABEL: "true"},
                    "tolerations": [{"key": SIMULATED_LABEL, "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "worker",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "args": ["pause"],
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "limits": {"cpu": "200m", "memory": "128Mi"},
                        },
                    }],
                },
            },
        },
    }))?)
}

/// Writes every node's figures of version `v` (as each node's agent would) and remembers them. A
/// refused write is retried every half second, as the agent retries (the node-reports guard has
/// `failurePolicy: Fail`), and recorded in `refused` with its time; after a minute it fails.
async fn publish(
    client: &Client,
    nodes: &[String],
    v: usize,
    published: &Mutex<HashMap<String, BTreeSet<(u64, u64)>>>,
    refused: &Mutex<Vec<(Instant, String)>>,
) -> Result<()> {
    let api: Api<NodeRecommendation> = Api::all(client.clone());
    for (i, node) in nodes.iter().enumerate() {
        let (cpu, memory) = figures(i, v);
        // remembered first: a pod made right after the write may carry them
        published
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .entry(node.clone())
            .or_default()
            .insert((cpu, memory));
        let rec = NodeRecommendation::new(
            node,
            NodeRecommendationSpec {
                update_time: None,
                pods: Vec::new(),
                summary: None,
                recommendations: vec![nodewarden_tests::target_recommendation(
                    SOAK_NS,
                    CHURN,
                    "worker",
                    &format!("{cpu}m"),
                    &memory.to_string(),
                )],
            },
        );
        let params = PatchParams::apply("soak-agent").force();
        let mut value = serde_json::to_value(&rec)?;
        value["apiVersion"] = json!("nodewarden.io/v1alpha1");
        value["kind"] = json!("NodeRecommendation");
        let mut tries = 0;
        while let Err(e) = api.patch(node, &params, &Patch::Apply(value.clone())).await {
            tries += 1;
            ensure!(tries < 120, "NodeRecommendation {node} refused for a minute: {e}");
            if let Ok(mut r) = refused.lock() {
                r.push((Instant::now(), format!("NodeRecommendation {node}: {e}")));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// Every 20 s, each node's figures move to the other version.
async fn move_figures(
    client: Client,
    nodes: Vec<String>,
    published: Published,
    refused: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: CancellationToken,
) -> Result<()> {
    let mut v = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(20)) => {}
        }
        v = 1 - v;
        publish(&client, &nodes, v, &published, &refused).await?;
    }
}

/// The pods checked: how many had their node's figures, and when each other one was seen.
#[derive(Default)]
struct Checked {
    good: AtomicU64,
    lost: Mutex<Vec<(Instant, String)>>,
}

impl Checked {
    fn total(&self) -> u64 {
        self.good.load(Ordering::Relaxed) + self.lost().len() as u64
    }
    fn lost(&self) -> Vec<(Instant, String)> {
        self.lost.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// How long after a replica's SIGKILL a review may still fail: the requests in flight on its
/// connections, and new ones sent to its endpoint until the kubelet's readiness probe has failed
/// and the endpoint is no longer ready (docs/server.md, "Faults").
const KILL_WINDOW: Duration = Duration::from_secs(20);

/// Splits `events` (when, what) into those within [`KILL_WINDOW`] after one of `kills` and the
/// rest, each said with its time since `started` (to match it with the disruptions printed).
fn after_kills(
    events: Vec<(Instant, String)>,
    kills: &[Instant],
    started: Instant,
) -> (Vec<String>, Vec<String>) {
    let (near, far): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|(t, _)| kills.iter().any(|k| *t >= *k && *t - *k <= KILL_WINDOW));
    let said = |(t, e): (Instant, String)| format!("at {:.0}s: {e}", (t - started).as_secs_f64());
    (
        near.into_iter().map(said).collect(),
        far.into_iter().map(said).collect(),
    )
}

/// The API server's log lines about webhook calls that failed (klog's `Failed calling webhook`,
/// which says whether it failed open and why: refused, reset, EOF, a certificate, a timeout),
/// each with its time since `started` (klog writes the time of day; this machine's clock is UTC),
/// at most 50, each cut at 400 characters.
fn failed_calls(log: &str, started: std::time::SystemTime) -> Vec<String> {
    let day = 86_400.0;
    let start = started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() % day)
        .unwrap_or(0.0);
    log.lines()
        .filter(|l| l.contains("Failed calling webhook") || l.contains("failed calling webhook"))
        .take(50)
        .map(|l| {
            // "W1128 16:05:01.123456 ..." : the time of day is bytes 6..21
            let since = l.get(6..21).and_then(|t| {
                let mut parts = t.split(':');
                let h: f64 = parts.next()?.parse().ok()?;
                let m: f64 = parts.next()?.parse().ok()?;
                let s: f64 = parts.next()?.parse().ok()?;
                Some((h * 3600.0 + m * 60.0 + s - start).rem_euclid(day))
            });
            let line: String = l.chars().take(400).collect();
            match since {
                Some(s) => format!("at {s:.1}s: {line}"),
                None => line,
            }
        })
        .collect()
}

/// Checks each churn pod the first time it is seen: its requests are one of its node's
/// published figures.
async fn watch_pods(
    client: Client,
    published: Published,
    checked: Arc<Checked>,
    stop: CancellationToken,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client, SOAK_NS);
    let config = watcher::Config::default().labels(&format!("app={CHURN}"));
    let mut stream = std::pin::pin!(watcher(pods, config));
    let mut seen = BTreeSet::new();
    // bounded: the uids of the pods seen, at most the churn's total
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            e = stream.next() => e,
        };
        let Some(event) = event else {
            bail!("the pod watch ended");
        };
        let pod = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
            Ok(_) => continue,
            // the watcher re-lists on its own after an error
            Err(e) => {
                eprintln!("soak: pod watch: {e}");
                continue;
            }
        };
        let Some(uid) = pod.uid() else { continue };
        if !seen.insert(uid) {
            continue;
        }
        let node = daemonset_pod_target_node(&pod).unwrap_or_default();
        let requests = container_requests(&pod)?;
        let ok = published
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .get(&node)
            .is_some_and(|set| set.contains(&requests));
        if ok {
            checked.good.fetch_add(1, Ordering::Relaxed);
        } else if let Ok(mut lost) = checked.lost.lock() {
            // bounded by the churn's pods; a broken webhook fails the test long before memory
            lost.push((
                Instant::now(),
                format!(
                    "{} on {node}: {}m / {} MiB, annotations {:?}",
                    pod.name_any(),
                    requests.0,
                    requests.1 / MIB,
                    pod.annotations()
                ),
            ));
        }
    }
}

/// Deletes churn pods at `rate` a second (round the nodes, grace 0); pods a rollout left
/// terminating (no kubelet finishes them) go too.
async fn churn(client: Client, rate: u64, stop: CancellationToken) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client, SOAK_NS);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut turn = 0usize;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let list = pods
            .list(&ListParams::default().labels(&format!("app={CHURN}")))
            .await?
            .items;
        for p in list.iter().filter(|p| p.metadata.deletion_timestamp.is_some()) {
            let _ = pods.delete(&p.name_any(), &now).await;
        }
        let live: Vec<&Pod> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if live.is_empty() {
            continue;
        }
        turn = (turn + 1) % live.len();
        // gone already (a race with the controller) is fine
        let _ = pods.delete(&live[turn].name_any(), &now).await;
    }
}

/// Writes through a guard with `failurePolicy: Fail`: the good ones allowed, the bad ones
/// refused with the guard's reason, and any other outcome with its time.
#[derive(Default)]
struct Decisions {
    allowed: AtomicU64,
    refused: AtomicU64,
    wrong: Mutex<Vec<(Instant, String)>>,
}

impl Decisions {
    fn total(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed) + self.refused.load(Ordering::Relaxed)
    }
    fn wrong(&self, what: String) {
        if let Ok(mut w) = self.wrong.lock()
            && w.len() < 1000
        {
            w.push((Instant::now(), what));
        }
    }
}

/// One guard's writes for [`decisions_loop`]: the n-th allowed object, the refused one, and
/// what the guard's refusal says.
struct Guarded<K> {
    api: Api<K>,
    /// The n-th write the guard allows, created then deleted (eight names in turn).
    good: fn(u64) -> Result<K>,
    /// The write the guard refuses.
    bad: K,
    /// Part of the guard's reason, in the refusal's message.
    reason: &'static str,
    /// What the two writes are, for the messages of what went wrong.
    good_is: &'static str,
    bad_is: &'static str,
}

/// Every half second, until `stop`: the guard's good write created then deleted, its bad
/// write refused with the guard's reason; each decided right is counted, anything else kept.
async fn decisions_loop<K>(writes: Guarded<K>, counts: Arc<Decisions>, stop: CancellationToken) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Guarded {
        api,
        good,
        bad,
        reason,
        good_is,
        bad_is,
    } = writes;
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        n += 1;
        let object = good(n)?;
        let name = object.name_any();
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                counts.allowed.fetch_add(1, Ordering::Relaxed);
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            // left over from a create whose answer was lost: not the webhook's doing
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            Err(e) => counts.wrong(format!("{good_is} ({name}) refused: {e}")),
        }
        match api.create(&PostParams::default(), &bad).await {
            Ok(_) => {
                counts.wrong(format!("{bad_is} was allowed"));
                let _ = api.delete(&bad.name_any(), &DeleteParams::default()).await;
            }
            Err(kube::Error::Api(s)) if s.message.contains(reason) => {
                counts.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => counts.wrong(format!("{bad_is} refused without the guard's reason: {e}")),
        }
    }
}

fn claim(name: &str, value: &str) -> Result<nodewarden_api::ClusterClaim> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ClusterClaim",
        "metadata": {"name": name},
        "spec": {"value": value},
    }))?)
}

/// The claims guard's writes: a valid claim, and an `id.k8s.io` claim of the wrong format.
fn claim_writes(client: Client) -> Result<Guarded<nodewarden_api::ClusterClaim>> {
    Ok(Guarded {
        api: Api::all(client),
        good: |n| claim(&format!("zone{}.soak.example", n % 8), "eu-1"),
        bad: claim("id.k8s.io", "Cluster_A")?,
        reason: "id-format",
        good_is: "a valid claim",
        bad_is: "a bad id.k8s.io claim",
    })
}

/// `soak-glow` (off, owning a Lease's `spec.holderIdentity`) and `soak-shine` (on, owning
/// `spec.leaseDurationSeconds`). Their gates are reported by no node, so each settles at once.
async fn create_features(client: &Client) -> Result<()> {
    let features: Api<Feature> = Api::namespaced(client.clone(), SOAK_NS);
    for (name, gate, desired, path) in [
        (GLOW, "SoakGlow", "Off", "spec.holderIdentity"),
        ("soak-shine", "SoakShine", "On", "spec.leaseDurationSeconds"),
    ] {
        let feature: Feature = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "Feature",
            "metadata": {"name": name},
            "spec": {"desired": desired, "gate": gate, "fields": [{
                "group": "coordination.k8s.io", "version": "v1", "resource": "leases", "path": path
            }]},
        }))?;
        features
            .create(&PostParams::default(), &feature)
            .await
            .with_context(|| format!("creating the Feature {name}"))?;
    }
    Ok(())
}

fn lease(name: &str, spec: serde_json::Value) -> Result<Lease> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

/// The feature guard's writes: a Lease setting the on feature's field, and one setting the off
/// feature's field.
fn lease_writes(client: Client) -> Result<Guarded<Lease>> {
    Ok(Guarded {
        api: Api::namespaced(client, SOAK_NS),
        good: |n| {
            lease(
                &format!("soak-lease-{}", n % 8),
                json!({"leaseDurationSeconds": 15}),
            )
        },
        bad: lease(HELD, json!({"holderIdentity": "soak"}))?,
        reason: GLOW_DENIED,
        good_is: "a write to the on feature's field",
        bad_is: "a write setting soak-glow's field",
    })
}

/// One webhook pod's address and admission port.
async fn webhook_pod_address(client: &Client) -> Result<SocketAddr> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await?;
    let ip = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| p.status.as_ref()?.pod_ip.clone())
        .context("no webhook pod with an IP")?;
    Ok(SocketAddr::new(ip.parse()?, 8443))
}

/// Silent TCP connections from `source` to a webhook replica at about 500 a second, the last 400
/// held open (each closed when it leaves the window, or by the server). A replica that goes away
/// (the disruptions) is replaced by whichever runs.
async fn attack(
    client: Client,
    source: IpAddr,
    opened: Arc<AtomicU64>,
    stop: CancellationToken,
) -> Result<()> {
    let mut held = VecDeque::new();
    let mut target = None;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let Some(addr) = target else {
            target = webhook_pod_address(&client).await.ok();
            if target.is_none() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            continue;
        };
        // out of local ports or files (a long run): the attacker waits and goes on
        let socket = match tokio::net::TcpSocket::new_v4().and_then(|s| {
            s.bind(SocketAddr::new(source, 0))?;
            Ok(s)
        }) {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match tokio::time::timeout(Duration::from_millis(300), socket.connect(addr)).await {
            Ok(Ok(stream)) => {
                opened.fetch_add(1, Ordering::Relaxed);
                held.push_back(stream);
                if held.len() > 400 {
                    held.pop_front();
                }
            }
            // refused or silent: the replica is gone, or at its limit; look again
            _ => target = None,
        }
    }
}

/// HTTP/2 from `source` to a webhook replica: four connections, each holding as many reviews
/// open as the replica allows, their headers sent and their bodies never, each opened again as
/// the replica answers it (`--request-timeout`) or closes the connection. `held` counts the
/// streams opened.
async fn stream_attack(
    client: Client,
    source: IpAddr,
    held: Arc<AtomicU64>,
    stop: CancellationToken,
) -> Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let mut connections = tokio::task::JoinSet::new();
    let mut target = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        while connections.try_join_next().is_some() {}
        if connections.len() >= 4 {
            continue;
        }
        let Some(addr) = target else {
            target = webhook_pod_address(&client).await.ok();
            continue;
        };
        let connect = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            let tcp = socket.connect(addr).await?;
            let name = rustls::pki_types::ServerName::try_from("nodewarden-webhook")?;
            let io = tls.connect(name, tcp).await?;
            let (sender, connection) = h2::client::handshake(io).await?;
            anyhow::Ok((sender, connection))
        };
        match tokio::time::timeout(Duration::from_secs(2), connect).await {
            Ok(Ok((sender, connection))) => {
                let held = held.clone();
                connections.spawn(async move {
                    // the connection's driver on a task of its own (stopped with this one), so
                    // that opening streams never keeps it from reading and writing
                    let mut driver = tokio::task::JoinSet::new();
                    driver.spawn(connection);
                    hold_streams(sender, held).await;
                });
            }
            // refused, at its limit, or gone: look for a replica again
            _ => target = None,
        }
    }
}

/// Opens reviews on `sender` without their bodies as fast as the server's stream limit lets
/// it (at most 64 waiting for an answer at once), until the connection ends.
async fn hold_streams(mut sender: h2::client::SendRequest<bytes::Bytes>, held: Arc<AtomicU64>) {
    let mut open = tokio::task::JoinSet::new();
    loop {
        while open.try_join_next().is_some() {}
        if open.len() >= 64 {
            open.join_next().await;
        }
        tokio::task::yield_now().await;
        sender = match sender.ready().await {
            Ok(ready) => ready,
            Err(_) => return,
        };
        let Ok(request) = http::Request::post("https://nodewarden-webhook/mutate/pods")
            .header("content-type", "application/json")
            .body(())
        else {
            return;
        };
        let Ok((response, body)) = sender.send_request(request, false) else {
            return;
        };
        held.fetch_add(1, Ordering::Relaxed);
        // the body's sender kept (never written) until the server answers or resets
        open.spawn(async move {
            let _body = body;
            let _ = response.await;
        });
    }
}

/// The attacker's TLS: any server certificate will do.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Records each CA the webhook's Secret holds (the first, then one per rotation).
async fn watch_ca(client: Client, seen: Arc<Mutex<BTreeSet<String>>>, stop: CancellationToken) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    loop {
        if let Ok(Some(s)) = secrets.get_opt(&format!("{RELEASE}-webhook-tls")).await
            && let Ok(certs) = nodewarden_certs::read_tls_secret(&s)
            && let Ok(mut seen) = seen.lock()
        {
            seen.insert(certs.ca.cert_pem.clone());
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

async fn delete_webhook_pod(client: &Client) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=webhook"))
        .await?;
    let pod = list
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .context("no webhook pod to delete")?;
    pods.delete(&pod.name_any(), &DeleteParams::default()).await?;
    Ok(format!("webhook pod {} deleted (graceful)", pod.name_any()))
}

fn kill_webhook_process(cluster: &RealCluster) -> Result<String> {
    let pids = node_processes(cluster, "nodewarden-webhook");
    let pid = *pids.first().context("no webhook process on the node")?;
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -KILL {pid}");
    Ok(format!("webhook process {pid} killed (SIGKILL)"))
}

async fn helm_upgrade(helm: &Helm, round: u32) -> Result<String> {
    let out = helm
        .run(&[
            "upgrade".to_string(),
            RELEASE.to_string(),
            nodewarden_tests::helm::chart_dir().display().to_string(),
            "--namespace".to_string(),
            NAMESPACE.to_string(),
            "--reuse-values".to_string(),
            "--set".to_string(),
            format!("webhook.podAnnotations.soak-round=\"{round}\""),
        ])
        .await?;
    ensure!(out.success, "helm upgrade: {}\n{}", out.stdout, out.stderr);
    Ok(format!("helm upgrade (round {round}): the webhook rolls out"))
}

async fn patch_churn_template(client: &Client, round: u32) -> Result<()> {
    Api::<DaemonSet>::namespaced(client.clone(), SOAK_NS)
        .patch(
            CHURN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                "soak.nodewarden.io/rollout": round.to_string()
            }}}}})),
        )
        .await?;
    Ok(())
}

/// Pids of the processes named `program` (argv[0]'s file name) in the real node's cgroups.
fn node_processes(cluster: &RealCluster, program: &str) -> Vec<u32> {
    procfs::processes_in(&cluster.nodes[0].cgroup_root, program)
}

#[derive(Default)]
struct Sample {
    webhook: Vec<(u64, u64)>,
    agent: Vec<u64>,
}

fn sample_processes(cluster: &RealCluster) -> Sample {
    Sample {
        webhook: node_processes(cluster, "nodewarden-webhook")
            .into_iter()
            .filter_map(procfs::rss_and_open_files)
            .collect(),
        agent: node_processes(cluster, "nodewarden-agent")
            .into_iter()
            .filter_map(procfs::rss_and_open_files)
            .map(|(rss, _)| rss)
            .collect(),
    }
}

/// One minute of the soak.
#[derive(Default, Clone)]
struct Minute {
    pods: u64,
    claims: u64,
    feature_writes: u64,
    reviews: u64,
    p99_ms: f64,
    webhook_rss_max: u64,
    webhook_fds_max: u64,
    agent_rss_max: u64,
    connections: u64,
    streams: u64,
}

impl Minute {
    fn absorb(&mut self, s: &Sample) {
        for (rss, fds) in &s.webhook {
            self.webhook_rss_max = self.webhook_rss_max.max(*rss);
            self.webhook_fds_max = self.webhook_fds_max.max(*fds);
        }
        for rss in &s.agent {
            self.agent_rss_max = self.agent_rss_max.max(*rss);
        }
    }

    fn line(&self) -> String {
        format!(
            "{} pods, {} claims, {} feature writes, {} reviews (p99 ≤ {:.0} ms), webhook RSS max {:.1} MiB, fds max {}, \
             agent RSS max {:.1} MiB, attacker {} connections and {} HTTP/2 streams",
            self.pods,
            self.claims,
            self.feature_writes,
            self.reviews,
            self.p99_ms,
            self.webhook_rss_max as f64 / MIB as f64,
            self.webhook_fds_max,
            self.agent_rss_max as f64 / MIB as f64,
            self.connections,
            self.streams
        )
    }
}

fn write_csv(minutes: &[Minute]) -> Result<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/soak");
    std::fs::create_dir_all(&dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let path = dir.join(format!("soak-{stamp}.csv"));
    let mut text = String::from(
        "minute,pods,claims,feature_writes,reviews,p99_ms,webhook_rss_max_mib,webhook_fds_max,agent_rss_max_mib,\
         attacker_connections,attacker_streams\n",
    );
    for (i, m) in minutes.iter().enumerate() {
        text.push_str(&format!(
            "{},{},{},{},{},{:.1},{:.2},{},{:.2},{},{}\n",
            i + 1,
            m.pods,
            m.claims,
            m.feature_writes,
            m.reviews,
            m.p99_ms,
            m.webhook_rss_max as f64 / MIB as f64,
            m.webhook_fds_max,
            m.agent_rss_max as f64 / MIB as f64,
            m.connections,
            m.streams
        ));
    }
    std::fs::write(&path, text)?;
    std::fs::write(path.with_extension("svg"), memory_plot(minutes))?;
    Ok(path)
}

/// The webhook's and the agent's resident memory per minute (each minute's highest sample), as
/// an SVG line chart: what docs/benchmarks.md shows for the hour-long soak.
fn memory_plot(minutes: &[Minute]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 240.0;
    const LEFT: f64 = 48.0;
    const BOTTOM: f64 = 28.0;
    let mib = |b: u64| b as f64 / MIB as f64;
    let top = minutes
        .iter()
        .map(|m| mib(m.webhook_rss_max).max(mib(m.agent_rss_max)))
        .fold(8.0f64, f64::max);
    let top = (top / 8.0).ceil() * 8.0;
    let x = |i: usize| LEFT + (W - LEFT - 8.0) * (i as f64 + 1.0) / minutes.len().max(1) as f64;
    let y = |v: f64| (H - BOTTOM) - (H - BOTTOM - 8.0) * v / top;
    let line = |value: &dyn Fn(&Minute) -> f64| {
        minutes
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{:.1},{:.1}", x(i), y(value(m))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n"
    );
    for k in 0..=4 {
        let v = top * k as f64 / 4.0;
        svg.push_str(&format!(
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"4\" y=\"{:.1}\">{v:.0} MiB</text>\n",
            W - 8.0,
            y(v) + 4.0,
            y = y(v)
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{LEFT}\" y=\"{}\">minute 1</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">minute {}</text>\n",
        H - 8.0,
        W - 8.0,
        H - 8.0,
        minutes.len()
    ));
    svg.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>\n\
         <polyline fill=\"none\" stroke=\"#ff7f0e\" stroke-width=\"2\" points=\"{}\"/>\n\
         <text x=\"{}\" y=\"20\" fill=\"#1f77b4\">nodewarden-webhook (each minute's highest replica)</text>\n\
         <text x=\"{}\" y=\"34\" fill=\"#ff7f0e\">nodewarden-agent</text>\n</svg>\n",
        line(&|m| mib(m.webhook_rss_max)),
        line(&|m| mib(m.agent_rss_max)),
        LEFT + 8.0,
        LEFT + 8.0
    ));
    svg
}

/// The API server's own figures for nodewarden's webhooks: reviews, failed-open calls and the
/// latency histogram (cumulative buckets, summed over the webhooks).
#[derive(Clone, Default)]
struct ApiserverFigures {
    reviews: u64,
    failed_open: u64,
    buckets: BTreeMap<u64, f64>,
}

impl ApiserverFigures {
    /// The 99th percentile between `before` and now, in ms (the bucket's upper bound).
    fn p99_ms_since(&self, before: &ApiserverFigures) -> f64 {
        let deltas: Vec<(u64, f64)> = self
            .buckets
            .iter()
            .map(|(le, n)| (*le, n - before.buckets.get(le).copied().unwrap_or(0.0)))
            .collect();
        let total = deltas.last().map(|(_, n)| *n).unwrap_or(0.0);
        if total <= 0.0 {
            return 0.0;
        }
        deltas
            .iter()
            .find(|(_, n)| *n >= total * 0.99)
            .map(|(le, _)| *le as f64 / 1000.0)
            .unwrap_or(f64::INFINITY)
    }
}

async fn apiserver_webhook_metrics(client: &Client) -> Result<ApiserverFigures> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut f = ApiserverFigures::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !series.contains("nodewarden.io") {
            continue;
        }
        let value: f64 = value.parse().unwrap_or(0.0);
        let name = series.split('{').next().unwrap_or_default();
        match name {
            "apiserver_admission_webhook_request_total" => f.reviews += value as u64,
            "apiserver_admission_webhook_fail_open_count" => f.failed_open += value as u64,
            "apiserver_admission_webhook_admission_duration_seconds_bucket" => {
                let le = series
                    .split("le=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .unwrap_or("+Inf");
                // microseconds as the key; +Inf last
                let key = if le == "+Inf" {
                    u64::MAX
                } else {
                    (le.parse::<f64>().unwrap_or(0.0) * 1e6) as u64
                };
                *f.buckets.entry(key).or_default() += value;
            }
            _ => {}
        }
    }
    Ok(f)
}

/// The plot has a line per program with a point per minute, inside the chart, and a scale that
/// covers the highest figure.
#[test]
fn memory_plot_has_a_point_per_minute_for_each_program() {
    let minutes: Vec<Minute> = [(20, 8), (24, 9), (23, 9)]
        .into_iter()
        .map(|(w, a)| Minute {
            webhook_rss_max: w * MIB,
            agent_rss_max: a * MIB,
            ..Minute::default()
        })
        .collect();
    let svg = memory_plot(&minutes);
    let lines: Vec<&str> = svg
        .lines()
        .filter_map(|l| l.split("points=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(lines.len(), 2, "{svg}");
    for points in lines {
        let xy: Vec<(f64, f64)> = points
            .split(' ')
            .filter_map(|p| {
                let (x, y) = p.split_once(',')?;
                Some((x.parse().ok()?, y.parse().ok()?))
            })
            .collect();
        assert_eq!(xy.len(), 3, "{points}");
        assert!(
            xy.iter()
                .all(|(x, y)| (0.0..=640.0).contains(x) && (0.0..=240.0).contains(y))
        );
    }
    assert!(
        svg.contains(">24 MiB<"),
        "the scale reaches the highest figure: {svg}"
    );
    assert!(svg.contains("minute 3"), "{svg}");
}

#[test]
fn failed_calls_are_timed_from_the_start() {
    let start = std::time::UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 16 * 3600 + 5 * 60);
    let log = "I1128 16:04:00.000000   77 logs.go:1] unrelated\n\
               W1128 16:05:12.500000   77 dispatcher.go:210] Failed calling webhook, failing open pods.nodewarden.io: \
               failed calling webhook \"pods.nodewarden.io\": Post \"https://10.0.0.5:8443/mutate/pods\": EOF\n\
               W1128 16:04:59.000000   77 dispatcher.go:210] Failed calling webhook, failing open: before the start\n";
    let lines = failed_calls(log, start);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("at 12.5s: W1128 16:05:12.500000"),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with(": EOF"), "{}", lines[0]);
    // a line from before the start wraps to the day's end rather than going negative
    assert!(lines[1].starts_with("at 86399.0s:"), "{}", lines[1]);
}
