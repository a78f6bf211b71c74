//! nodewarden on real nodes: the chart installed by Helm from the project's own images onto two
//! real kubelets (each with its own containerd, runc and bridge CNI) with kube-scheduler and
//! kube-proxy, default values but for the images and their pull policy.
//!
//! What a user would notice, in order:
//! 1. `helm install --wait` succeeds: the webhook Deployment passes its probes with managed
//!    certificates and an injected caBundle, the agent DaemonSet runs on the node.
//!    Each agent starts from an empty checkpoint folder.
//! 2. kube-apiserver calls the installed webhook through its Service: a bad `id.k8s.io` claim is
//!    denied with the webhook's reason. Each node's agent reports its kubelet's feature gates:
//!    node a's kubelet serves a certificate of the cluster CA, node b's signed its own (as
//!    kubeadm's and kind's do) and is verified against that certificate, with default values.
//! 3. A log-shipper-like DaemonSet (the test image burning a known CPU rate and holding a known
//!    amount of memory: more on the busy node, less on the quiet one) gets a DaemonSetAutoscaler;
//!    each node's agent measures it from that node's real cgroups and publishes
//!    `NodeRecommendation/<node>` with figures near what it uses there.
//! 4. A new pod of that DaemonSet on each node gets that node's figures from the webhook (the busy
//!    node more, the quiet one less), and the kubelet runs it with them: read back from the
//!    container's cgroup, not only from the Pod.
//! 5. With `updateMode: InPlace` and a CPU floor above both nodes' figures, each node's agent
//!    resizes its running shipper pod through `pods/resize`; the kubelet applies it to the same
//!    container without a restart (read back from the container's cgroup).
//! 6. Seeding from Prometheus: a real Prometheus has scraped both kubelets' `/metrics/cadvisor`
//!    from the start (a ServiceAccount's bearer token the kubelets check with a TokenReview and
//!    authorize for `nodes/metrics`; TLS verified against the cluster CA, and against node b's
//!    own self-signed certificate). `kubectl nodewarden report --prometheus` prints each node's
//!    figures from that history; then `helm upgrade` sets `agent.history.prometheus.url` and a new,
//!    empty checkpoint folder, so each node's new agent has no checkpoint, seeds from Prometheus
//!    and publishes within a minute of its start a NodeRecommendation whose history began before
//!    it started, with figures close to the live agent's it replaced and to the report's.
//! 7. `helm uninstall` leaves no nodewarden pod running.
//! 8. The host is as before the node started (sysctls, iptables, mounts, links, cgroups, folders).
//!
//! Needs Linux and root; elsewhere it says so loudly and passes, except under `CI=true`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_api::rightsizing::{ContainerRecommendation, NodeRecommendation};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images::{self, TestImages};
use nodewarden_tests::prometheus::Prometheus;
use nodewarden_tests::shipper::{
    BUSY, NAMESPACE, QUIET, RELEASE, SHIPPER, SHIPPER_NS, container_limits, container_requests, cpu_milli,
    create_shipper, describe_pods, install_chart, memory_bytes, recreate_shipper_pod, resize_in_place,
    running_container, running_pods, wait_for_kubelet_gates, wait_for_recommendation,
};
use nodewarden_tests::{
    HostSnapshot, RealCluster, RealClusterConfig, failure_with, kubectl_nodewarden, require_real_nodes,
};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_on_a_real_node() -> Result<()> {
    if !require_real_nodes("chart_on_a_real_node")? {
        return Ok(());
    }
    let images = images::build_test_images().await?;
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 2,
        images: images.archives(),
        sandbox_image: images.testbox_ref(),
        // node b's kubelet signs its own serving certificate, as kubeadm's do
        self_signed_kubelets: vec![SELF_SIGNED],
    })
    .await?;
    let result = scenario(&cluster, &images).await;
    let details = match &result {
        Err(_) => failure_details(&cluster).await,
        Ok(()) => String::new(),
    };
    // The host is put back whatever happened; a failure to do so fails the test too.
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "chart_on_a_real_node", &details))?;
    restored
}

/// The node whose kubelet signs its own serving certificate (node b).
const SELF_SIGNED: usize = 1;

/// The namespace of Prometheus's ServiceAccount.
const MONITORING: &str = "monitoring";

/// A Prometheus on node a's address that scrapes each kubelet's `/metrics/cadvisor` every 10 s
/// as an operator's would: with the bearer token of a ServiceAccount allowed `get` on
/// `nodes/metrics` (the kubelets authenticate it with a TokenReview and authorize it with a
/// SubjectAccessReview), TLS verified against the cluster CA (node a) or against node b's own
/// self-signed certificate (as the chart's agent trusts it), and each target labelled with its
/// node's name (what a `kubernetes_sd_configs` relabelling gives).
async fn start_prometheus(cluster: &RealCluster, client: &kube::Client) -> Result<Prometheus> {
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
    let mut config = String::from("global:\n  scrape_interval: 10s\n  scrape_timeout: 5s\nscrape_configs:\n");
    for (i, node) in cluster.nodes.iter().enumerate() {
        // node b's kubelet signed its own certificate (for its name, not its address)
        let tls = if i == SELF_SIGNED {
            format!(
                "ca_file: {}/kubelet.crt\n      server_name: {}",
                nodewarden_tests::node::KUBELET_DEFAULT_CERT_DIR,
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

/// (millicores, bytes) of a figure of a NodeRecommendation (0 where it is missing).
fn figure(list: Option<&std::collections::BTreeMap<String, Quantity>>) -> Result<(u64, u64)> {
    Ok((
        cpu_milli(list.and_then(|l| l.get("cpu")))?.unwrap_or(0),
        memory_bytes(list.and_then(|l| l.get("memory")))?.unwrap_or(0),
    ))
}

/// What a user compares: the shipper's target (after the policy), the estimator's figure before
/// the policy (`uncappedTarget`: the CPU floor of step 5 hides the target's CPU), and the bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    target: (u64, u64),
    uncapped: (u64, u64),
    lower: (u64, u64),
    upper: (u64, u64),
}

/// The shipper's entry of `NodeRecommendation/<node>`, if any.
async fn shipper_entry(
    client: &kube::Client,
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

fn figures_of(r: &ContainerRecommendation) -> Result<Figures> {
    Ok(Figures {
        target: figure(r.target.as_ref())?,
        uncapped: figure(r.uncapped_target.as_ref())?,
        lower: figure(r.lower_bound.as_ref())?,
        upper: figure(r.upper_bound.as_ref())?,
    })
}

/// The agent pod on `node` (not one being deleted) and when its container started.
async fn agent_on(client: &kube::Client, node: &str) -> Result<Option<(Pod, Timestamp)>> {
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
            .and_then(|c| c.iter().find(|c| c.ready))
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

/// Whether `a` and `b` are within `share` of the larger (and 2 units, for rounding) of each other.
fn near(a: u64, b: u64, share: f64) -> bool {
    (a as f64 - b as f64).abs() <= share * a.max(b) as f64 + 2.0
}

/// Step 6: the report from Prometheus, then agents without a checkpoint seeding from it.
async fn seeding(
    cluster: &RealCluster,
    client: &kube::Client,
    helm: &Helm,
    prometheus: &Prometheus,
    shipper_created: Timestamp,
) -> Result<()> {
    // The seeding reads 1-minute steps of a 2-minute `rate()`: a step whose window began before
    // the shipper did averages its burning over the whole window, and reads low. Wait (about a
    // minute here) until the last whole minute before the agents start is at least 2 min 5 s
    // after the shipper was created, so that the history holds one full step.
    let full_step = shipper_created + SignedDuration::from_secs(125);
    let step_ms = 60_000;
    let ready_ms = (full_step.as_millisecond() + step_ms - 1).div_euclid(step_ms) * step_ms + 2_000;
    let wait_ms = ready_ms - Timestamp::now().as_millisecond();
    if wait_ms > 0 {
        eprintln!(
            "realnode: waiting {:.0}s for a full step of the shipper's history",
            wait_ms as f64 / 1000.0
        );
        tokio::time::sleep(Duration::from_millis(wait_ms.unsigned_abs())).await;
    }

    let url = prometheus.url();
    // what the live agents publish, and what the report prints from Prometheus alone
    let kubeconfig = cluster.cp.kubeconfig_path().display().to_string();
    let out = kubectl_nodewarden(&[
        "report",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        SHIPPER_NS,
        "--prometheus",
        &url,
        "--window",
        "1h",
        "--daemonset",
        SHIPPER,
        "-o",
        "json",
    ])
    .await?;
    let report: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
    let mut live = Vec::new();
    for node in &cluster.nodes {
        let (_, entry) = shipper_entry(client, &node.name)
            .await?
            .with_context(|| format!("no live NodeRecommendation/{} for the shipper", node.name))?;
        let row = report["daemonsets"][0]["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["node"] == node.name.as_str()))
            .with_context(|| format!("the report has no row for {}: {report}", node.name))?;
        let pair = |field: &str| {
            (
                row[field]["cpuMillis"].as_u64().unwrap_or(0),
                row[field]["memoryBytes"].as_u64().unwrap_or(0),
            )
        };
        let printed = (pair("target"), pair("lowerBound"), pair("upperBound"));
        let (old, _) = agent_on(client, &node.name)
            .await?
            .with_context(|| format!("no agent running on {}", node.name))?;
        live.push((figures_of(&entry)?, printed, old.uid()));
    }

    // a new, empty checkpoint folder and the Prometheus URL: every agent restarts without history
    let checkpoints = cluster.cp.dir().join("checkpoints-seeded");
    std::fs::create_dir_all(&checkpoints)?;
    let out = helm
        .run(&[
            "upgrade".to_string(),
            RELEASE.to_string(),
            nodewarden_tests::helm::chart_dir().display().to_string(),
            "--namespace".to_string(),
            NAMESPACE.to_string(),
            "--reuse-values".to_string(),
            "--set".to_string(),
            format!("agent.history.prometheus.url={url}"),
            "--set".to_string(),
            format!("agent.checkpoint.hostPath={}", checkpoints.display()),
        ])
        .await?;
    ensure!(
        out.success,
        "helm upgrade failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );

    // each node's new agent publishes its first NodeRecommendation
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut seeded: Vec<Option<(Timestamp, NodeRecommendation, ContainerRecommendation)>> =
        vec![None; cluster.nodes.len()];
    while seeded.iter().any(Option::is_none) {
        for (i, node) in cluster.nodes.iter().enumerate() {
            if seeded[i].is_some() {
                continue;
            }
            let Some((pod, started)) = agent_on(client, &node.name).await? else {
                continue;
            };
            if pod.uid() == live[i].2 {
                continue;
            }
            if let Some((rec, entry)) = shipper_entry(client, &node.name).await?
                && rec.spec.update_time.as_ref().is_some_and(|t| t.0 >= started)
            {
                seeded[i] = Some((started, rec, entry));
            }
        }
        ensure!(
            Instant::now() < deadline,
            "within 180 s of helm upgrade, not every node's new agent published: {:?}",
            seeded.iter().map(Option::is_some).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    for (i, node) in cluster.nodes.iter().enumerate() {
        let Some((started, rec, entry)) = &seeded[i] else {
            continue;
        };
        let (live_figures, printed, _) = live[i];
        let figures = figures_of(entry)?;
        let published = rec.spec.update_time.as_ref().map(|t| t.0).unwrap_or(*started);
        let after = published.duration_since(*started).as_secs_f64();
        let first = entry
            .first_sample_time
            .as_ref()
            .map(|t| t.0)
            .context("the seeded recommendation has no first sample time")?;
        let history_min = started.duration_since(first).as_secs_f64() / 60.0;
        eprintln!(
            "realnode: {} seeded agent published {after:.0}s after its start: {} samples since {first} \
             ({history_min:.1} min before it started); seeded {figures:?}, live {live_figures:?}, report \
             (target, lower, upper) {printed:?}",
            node.name, entry.sample_count
        );
        ensure!(
            after <= 60.0,
            "{}: the seeded agent published {after:.0}s after its start",
            node.name
        );
        // the history began before the agent, with the shipper: it can only come from Prometheus
        // (an agent without a checkpoint takes its first live sample after it starts)
        ensure!(
            first >= shipper_created - SignedDuration::from_secs(60)
                && first + SignedDuration::from_secs(10) <= *started,
            "{}: the first sample ({first}) is not from the shipper's history before the agent started \
             ({started}; shipper created {shipper_created})",
            node.name
        );
        // one sample per minute of history from Prometheus (half of them, for scrapes a loaded
        // machine missed), and the live ones since
        ensure!(
            entry.sample_count as f64 >= (history_min / 2.0).floor().max(1.0),
            "{}: {} samples for {history_min:.1} minutes of history",
            node.name,
            entry.sample_count
        );
        // close to the live agent's figures (docs/history.md, "Tolerances")
        let close =
            |a: (u64, u64), b: (u64, u64)| near(a.0, b.0, CPU_TOLERANCE) && near(a.1, b.1, MEMORY_TOLERANCE);
        // (the CPU target is step 5's floor for the new agent; the live agent's last publish may
        // predate the floor, so CPU is compared before the policy, memory after it too)
        ensure!(
            close(figures.uncapped, live_figures.uncapped)
                && near(figures.target.1, live_figures.target.1, MEMORY_TOLERANCE),
            "{}: the seeded agent's figures {figures:?} are not close to the live agent's {live_figures:?}",
            node.name
        );
        // and to what the report printed from the same Prometheus, before
        ensure!(
            near(figures.target.1, printed.0.1, MEMORY_TOLERANCE),
            "{}: the seeded agent's memory target {} is not close to the report's {printed:?}",
            node.name,
            figures.target.1
        );
    }
    Ok(())
}

/// How far a seeded agent's CPU figure may be from the live agent's (docs/history.md): the live
/// agent's samples are 10 s apart, Prometheus's 1-minute rates average them.
const CPU_TOLERANCE: f64 = 0.25;
/// The same for memory: both read the same working set; the scrape and the agent's sample are
/// up to 10 s apart.
const MEMORY_TOLERANCE: f64 = 0.10;

/// Waits until `NodeFeatureReport/<node>` holds the kubelet's gates without an error; returns how
/// many gates it lists. Fails with the report's error (e.g. a certificate not verified).
/// What explains a failure: the nodes' conditions, every nodewarden and shipper pod's state
/// (restarts, OOM kills, evictions), then the processes' last log lines.
async fn failure_details(cluster: &RealCluster) -> String {
    let mut out = String::new();
    if let Ok(client) = cluster.cp.admin_client().await {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        match nodes.list(&ListParams::default()).await {
            Ok(list) => {
                for n in list.items {
                    let conditions: Vec<String> = n
                        .status
                        .iter()
                        .flat_map(|s| s.conditions.iter().flatten())
                        .map(|c| format!("{}={}", c.type_, c.status))
                        .collect();
                    out.push_str(&format!("node {}: {}\n", n.name_any(), conditions.join(" ")));
                }
            }
            Err(e) => out.push_str(&format!("(listing nodes: {e})\n")),
        }
        for ns in [NAMESPACE, SHIPPER_NS] {
            out.push_str(&format!("pods in {ns}:\n{}\n", describe_pods(&client, ns).await));
        }
    }
    out.push_str("last log lines:\n");
    out.push_str(&cluster.cp.log_tails(60));
    out
}

async fn scenario(cluster: &RealCluster, images: &TestImages) -> Result<()> {
    let cp = &cluster.cp;
    let nodes = [(&cluster.nodes[0], BUSY), (&cluster.nodes[1], QUIET)];
    let client = cp.admin_client().await?;

    // 0. a Prometheus scraping both kubelets' cAdvisor endpoints from the start, as an operator's
    let prometheus = start_prometheus(cluster, &client).await?;

    // 1. helm install with the project's images
    let helm = Helm::for_control_plane(cp)?;
    let took = install_chart(&helm, &client, images, &cluster.fresh_checkpoint_dir()?).await?;
    eprintln!("realnode: helm install --wait took {:.1}s", took.as_secs_f64());

    let webhook_pods = running_pods(&client, NAMESPACE, "app.kubernetes.io/component=webhook").await?;
    ensure!(
        webhook_pods.len() == 2,
        "two webhook replicas run: {webhook_pods:?}"
    );
    let agent_pods = running_pods(&client, NAMESPACE, "app.kubernetes.io/component=agent").await?;
    ensure!(agent_pods.len() == 2, "one agent on each node: {agent_pods:?}");
    let mutating: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(client.clone());
    let bundles: Vec<usize> = mutating
        .list(&ListParams::default().labels("app.kubernetes.io/instance=nodewarden"))
        .await?
        .items
        .iter()
        .flat_map(|c| c.webhooks.iter().flatten())
        .map(|w| w.client_config.ca_bundle.as_ref().map_or(0, |b| b.0.len()))
        .collect();
    ensure!(
        !bundles.is_empty() && bundles.iter().all(|n| *n > 0),
        "the webhook injected its caBundle: {bundles:?}"
    );

    // 2. the API server calls the installed webhook through its Service
    let claims: Api<nodewarden_api::ClusterClaim> = Api::all(client.clone());
    let bad: nodewarden_api::ClusterClaim = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "ClusterClaim",
        "metadata": {"name": "id.k8s.io"},
        "spec": {"value": "Cluster_A"},
    }))?;
    let denial = match claims.create(&PostParams::default(), &bad).await {
        Ok(_) => bail!("a bad id.k8s.io claim was accepted through the installed webhook"),
        Err(kube::Error::Api(status)) => status.message,
        Err(e) => return Err(e.into()),
    };
    ensure!(
        denial.contains("id-format") && denial.contains("Cluster_A"),
        "the denial names the rule and the value: {denial}"
    );

    // …and each node's agent reads its kubelet's feature gates, node b's self-signed kubelet too
    for node in &cluster.nodes {
        let gates = wait_for_kubelet_gates(&client, &node.name).await?;
        eprintln!(
            "realnode: NodeFeatureReport/{}: kubelet read, {gates} gates",
            node.name
        );
    }

    // 3. a real log shipper, measured by each node's agent from that node's cgroups
    let shipper_created = Timestamp::now();
    create_shipper(&client, &images.testbox_ref(), &nodes).await?;
    let mut targets = Vec::new();
    for (node, load) in nodes {
        let (cpu, mem) = wait_for_recommendation(&client, &node.name, load).await?;
        eprintln!(
            "realnode: NodeRecommendation/{}: cpu target {cpu}m, memory target {} MiB (burning {}m, holding {} MiB)",
            node.name,
            mem / (1024 * 1024),
            load.millicores,
            load.mib
        );
        targets.push((cpu, mem));
    }
    let (busy, quiet) = (targets[0], targets[1]);
    ensure!(
        busy.0 > quiet.0 && busy.1 > quiet.1,
        "the busy node's shipper is recommended more than the quiet node's: busy {busy:?}, quiet {quiet:?}"
    );

    // 4. a new pod on each node gets that node's figures, and its kubelet applies them
    for ((node, _), (cpu_target, mem_target)) in nodes.iter().zip(targets) {
        let second = recreate_shipper_pod(&client, &node.name).await?;
        let requests = container_requests(&second)?;
        ensure!(
            requests == (cpu_target, mem_target),
            "the new pod on {} requests the node's target {cpu_target}m / {mem_target} B, got {}m / {} B (annotations {:?})",
            node.name,
            requests.0,
            requests.1,
            second.annotations()
        );
        let applied = node.container_cgroup(&second)?;
        ensure!(
            applied.cpu_matches_request(cpu_target),
            "the container's cgroup on {} has the CPU weight of a {cpu_target}m request: {applied:?}",
            node.name
        );
        if let (_, Some(limit)) = container_limits(&second)? {
            ensure!(
                applied.memory_matches_limit(limit),
                "the container's cgroup memory limit on {} is the pod's {limit} B: {applied:?}",
                node.name
            );
        }
    }

    // 5. InPlace: with a CPU floor above both nodes' figures, each node's agent resizes its
    //    running pod in place; the kubelet applies it to the same container, without a restart
    let floor = busy.0.max(quiet.0) + 100;
    for (node, _) in nodes {
        let (before, after) = resize_in_place(&client, &node.name, floor).await?;
        let container = running_container;
        ensure!(
            container(&before) == container(&after),
            "resized in place on {}: same container, no restart ({:?} → {:?})",
            node.name,
            container(&before),
            container(&after)
        );
        let request = container_requests(&after)?.0;
        let applied = node.container_cgroup(&after)?;
        ensure!(
            applied.cpu_matches_request(request),
            "the running container's cgroup on {} has the CPU weight of its new {request}m request: {applied:?}",
            node.name
        );
        eprintln!(
            "realnode: {} resized in place to {request}m CPU (floor {floor}m), same container, cgroup {applied:?}",
            node.name
        );
    }

    // …and the autoscaler's status counts both pods up to date with their node's figures
    let autoscalers: Api<nodewarden_api::DaemonSetAutoscaler> =
        Api::namespaced(client.clone(), nodewarden_tests::shipper::SHIPPER_NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = autoscalers
            .get(nodewarden_tests::shipper::SHIPPER)
            .await?
            .status
            .unwrap_or_default();
        if (status.pods_running, status.pods_up_to_date) == (Some(2), Some(2)) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the autoscaler's status does not count 2 of 2 pods up to date: {status:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // 6. agents without a checkpoint seed from Prometheus and agree with the live ones
    seeding(cluster, &client, &helm, &prometheus, shipper_created)
        .await
        .map_err(|e| {
            e.context(format!(
                "Prometheus's last log lines:\n{}",
                prometheus.log_tail(20)
            ))
        })?;
    drop(prometheus);

    // 7. uninstall leaves no nodewarden pod running
    let out = helm
        .run(&[
            "uninstall",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ])
        .await?;
    ensure!(
        out.success,
        "helm uninstall failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = running_pods(&client, NAMESPACE, "app.kubernetes.io/instance=nodewarden").await?;
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "nodewarden pods still there after uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

const CHILD_ENV: &str = "NODEWARDEN_REALNODE_CHILD";
const CHILD_READY: &str = "nodewarden-realnode-child: node up";

/// A test process killed with SIGKILL cannot stop its node: its watchdog must put the host back.
/// The test runs itself as a child process that starts a real node with one pod (so containers,
/// their mounts and network namespaces exist), kills it with SIGKILL once the node is up, and
/// waits for the host to be as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_restores_the_host_after_kill_9() -> Result<()> {
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_holds_a_real_node().await;
    }
    if !require_real_nodes("watchdog_restores_the_host_after_kill_9")? {
        return Ok(());
    }
    // built here, not in the child: a build (minutes when cold) must not count against the
    // child's start-up below
    images::build_testbox().await?;
    // the child runs under this lock, so no other real node changes the host meanwhile
    let _lock = nodewarden_tests::node::lock_host().await?;
    let tmp = tempfile::tempdir()?;
    let before = HostSnapshot::take(&tmp.path().join("before"))?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "watchdog_restores_the_host_after_kill_9",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env(nodewarden_tests::node::HOST_LOCK_HELD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("the child's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(300), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains(CHILD_READY) {
                return Ok(true);
            }
        }
        anyhow::Ok(false)
    })
    .await;
    ensure!(
        matches!(ready, Ok(Ok(true))),
        "the child did not bring its node up: {ready:?}"
    );
    let changed = before.diff()?;
    ensure!(
        !changed.is_empty(),
        "a running node changes the host (else this test proves nothing)"
    );

    child.start_kill()?; // SIGKILL
    child.wait().await?;
    // the watchdog notices within a second, kills the node's processes and restores the host
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = before.diff()?;
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "90 s after kill -9 the host still differs:\n  {}",
            left.join("\n  ")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn child_holds_a_real_node() -> Result<()> {
    let testbox = images::build_testbox().await?;
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 1,
        images: vec![testbox.archive.clone()],
        sandbox_image: testbox.reference.clone(),
        self_signed_kubelets: vec![],
    })
    .await?;
    let client = cluster.cp.admin_client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "sleeper"},
            "spec": {
                "nodeName": cluster.nodes[0].name,
                "containers": [{"name": "sleeper", "image": testbox.reference, "imagePullPolicy": "Never", "args": ["pause"]}],
            },
        }))?,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pod = pods.get("sleeper").await?;
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the child's pod is not running: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("{CHILD_READY}");
    // wait for SIGKILL; never stop the node here
    std::future::pending::<()>().await;
    Ok(())
}
