//! nodewarden on real nodes: the chart installed by Helm from the project's own images onto two
//! real kubelets (each with its own containerd, runc and bridge CNI) with kube-scheduler and
//! kube-proxy, default values but for the images and their pull policy.
//!
//! What a user would notice, in order:
//! 1. `helm install --wait` succeeds: the webhook Deployment passes its probes with managed
//!    certificates and an injected caBundle, the agent DaemonSet runs on the node.
//! 2. kube-apiserver calls the installed webhook through its Service: a bad `id.k8s.io` claim is
//!    denied with the webhook's reason.
//! 3. A log-shipper-like DaemonSet (the test image burning a known CPU rate and holding a known
//!    amount of memory: more on the busy node, less on the quiet one) gets a DaemonSetAutoscaler;
//!    each node's agent measures it from that node's real cgroups and publishes
//!    `NodeRecommendation/<node>` with figures near what it uses there.
//! 4. A new pod of that DaemonSet on each node gets that node's figures from the webhook (the busy
//!    node more, the quiet one less), and the kubelet runs it with them: read back from the
//!    container's cgroup, not only from the Pod.
//! 5. `helm uninstall` leaves no nodewarden pod running.
//! 6. The host is as before the node started (sysctls, iptables, mounts, links, cgroups, folders).
//!
//! Needs Linux and root; elsewhere it says so loudly and passes, except under `CI=true`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::NodeRecommendation;
use nodewarden_api::quantity::parse_milli;
use nodewarden_tests::helm::{Helm, chart_dir};
use nodewarden_tests::images::{self, TestImages};
use nodewarden_tests::{HostSnapshot, RealCluster, RealClusterConfig, require_real_nodes};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

const NAMESPACE: &str = "nodewarden";
const RELEASE: &str = "nodewarden";
const SHIPPER_NS: &str = "logging";
const SHIPPER: &str = "shipper";
/// What the shipper burns and holds on each node.
#[derive(Debug, Clone, Copy)]
struct Load {
    millicores: u64,
    mib: u64,
}
const BUSY: Load = Load {
    millicores: 300,
    mib: 300,
};
const QUIET: Load = Load {
    millicores: 60,
    mib: 100,
};

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
    })
    .await?;
    let result = scenario(&cluster, &images).await;
    let logs = match &result {
        Err(_) => cluster.cp.log_tails(60),
        Ok(()) => String::new(),
    };
    // The host is put back whatever happened; a failure to do so fails the test too.
    let restored = cluster.shutdown();
    result.map_err(|e| e.context(format!("last log lines:\n{logs}")))?;
    restored
}

async fn scenario(cluster: &RealCluster, images: &TestImages) -> Result<()> {
    let cp = &cluster.cp;
    let nodes = [(&cluster.nodes[0], BUSY), (&cluster.nodes[1], QUIET)];
    let client = cp.admin_client().await?;

    // 1. helm install with the project's images
    let helm = Helm::for_control_plane(cp)?;
    let began = Instant::now();
    let chart = chart_dir();
    let mut args: Vec<String> = vec![
        "install".into(),
        RELEASE.into(),
        chart.display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--create-namespace".into(),
        "--wait".into(),
        "--timeout".into(),
        "5m".into(),
    ];
    args.extend(images.helm_set_args());
    let out = helm.run(&args).await?;
    ensure!(
        out.success,
        "helm install failed:\n{}\n{}\n{}",
        out.stdout,
        out.stderr,
        describe_pods(&client, NAMESPACE).await
    );
    eprintln!(
        "realnode: helm install --wait took {:.1}s",
        began.elapsed().as_secs_f64()
    );

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

    // 3. a real log shipper, measured by the agent from the node's cgroups
    create_namespace(&client, SHIPPER_NS).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), SHIPPER_NS);
    daemonsets
        .create(
            &PostParams::default(),
            &shipper_daemonset(&images.testbox_ref(), &nodes)?,
        )
        .await?;
    let autoscalers: Api<nodewarden_api::DaemonSetAutoscaler> = Api::namespaced(client.clone(), SHIPPER_NS);
    autoscalers
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "DaemonSetAutoscaler",
                "metadata": {"name": SHIPPER},
                "spec": {
                    "targetRef": {"kind": "DaemonSet", "name": SHIPPER},
                    "updatePolicy": {"updateMode": "Initial"},
                },
            }))?,
        )
        .await?;
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
    let pods: Api<Pod> = Api::namespaced(client.clone(), SHIPPER_NS);
    for ((node, _), (cpu_target, mem_target)) in nodes.iter().zip(targets) {
        let first = wait_for_running_shipper(&client, &node.name, None).await?;
        pods.delete(&first.name_any(), &DeleteParams::default()).await?;
        let second = wait_for_running_shipper(&client, &node.name, first.uid()).await?;
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

    // 5. uninstall leaves no nodewarden pod running
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

fn shipper_daemonset(image: &str, nodes: &[(&nodewarden_tests::RealNode, Load)]) -> Result<DaemonSet> {
    let per_node: Vec<String> = nodes
        .iter()
        .map(|(n, l)| format!("{}={}:{}", n.name, l.millicores, l.mib))
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": SHIPPER},
        "spec": {
            "selector": {"matchLabels": {"app": SHIPPER}},
            "template": {
                "metadata": {"labels": {"app": SHIPPER}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": SHIPPER,
                        "image": image,
                        "imagePullPolicy": "Never",
                        "args": ["burn", "--per-node", per_node.join(",")],
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"memory": "1Gi"},
                        },
                    }],
                },
            },
        },
    }))?)
}

async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    Ok(())
}

/// The shipper's pod on `node` once it runs (not the one with `not_uid`).
async fn wait_for_running_shipper(client: &Client, node: &str, not_uid: Option<String>) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SHIPPER_NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for pod in pods
            .list(&ListParams::default().labels(&format!("app={SHIPPER}")))
            .await?
        {
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            if running && here && pod.uid() != not_uid && pod.metadata.deletion_timestamp.is_none() {
                return Ok(pod);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "the shipper pod on {node} is not running after 120 s:\n{}",
                describe_pods(client, SHIPPER_NS).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the node's recommendation for the shipper is near what it uses there; returns the
/// target (millicores, bytes).
///
/// VPA's estimator puts the CPU target at the 90th percentile bucket's upper edge plus a 15 %
/// margin, and memory at the peak's bucket plus 15 %: about 1.15–1.25 × the use, with floors of
/// 25m and 250 MiB per pod. The tolerance is wide for CPU (0.5–1.75 × the burn rate), since the
/// burner shares two cores with everything else in the test run; memory is 1.0–1.5 × what is held,
/// or the 250 MiB floor.
async fn wait_for_recommendation(client: &Client, node: &str, load: Load) -> Result<(u64, u64)> {
    let api: Api<NodeRecommendation> = Api::all(client.clone());
    const MIB: u64 = 1024 * 1024;
    let cpu_ok = |m: u64| (load.millicores / 2..=load.millicores * 7 / 4).contains(&m);
    let mem_ok = |b: u64| (load.mib * MIB..=(load.mib * MIB * 3 / 2).max(250 * MIB)).contains(&b);
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last = String::from("no NodeRecommendation yet");
    loop {
        if let Some(rec) = api.get_opt(node).await? {
            last = serde_json::to_string(&rec.spec)?;
            let target = rec.spec.recommendations.iter().find_map(|r| {
                (r.autoscaler.namespace == SHIPPER_NS
                    && r.autoscaler.name == SHIPPER
                    && r.container_name == SHIPPER)
                    .then_some(r.target.as_ref())
                    .flatten()
            });
            if let Some(target) = target {
                let cpu = cpu_milli(target.get("cpu"))?;
                let mem = memory_bytes(target.get("memory"))?;
                if cpu.is_some_and(cpu_ok) && mem.is_some_and(mem_ok) {
                    return Ok((cpu.unwrap_or_default(), mem.unwrap_or_default()));
                }
            }
        }
        if Instant::now() > deadline {
            bail!("NodeRecommendation/{node} did not reach the shipper's use within 240 s; last: {last}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A CPU quantity in millicores (`None` when absent).
fn cpu_milli(q: Option<&Quantity>) -> Result<Option<u64>> {
    q.map(|q| {
        parse_milli(&q.0)
            .and_then(|m| u64::try_from(m).ok())
            .ok_or_else(|| anyhow!("{:?} is not a CPU quantity", q.0))
    })
    .transpose()
}

/// A memory quantity in bytes (`None` when absent).
fn memory_bytes(q: Option<&Quantity>) -> Result<Option<u64>> {
    q.map(|q| {
        parse_milli(&q.0)
            .and_then(|m| u64::try_from(m.div_ceil(1000)).ok())
            .ok_or_else(|| anyhow!("{:?} is not a memory quantity", q.0))
    })
    .transpose()
}

/// The shipper container's (cpu, memory) requests.
fn container_requests(pod: &Pod) -> Result<(u64, u64)> {
    let r = container_resources(pod, |r| r.requests.clone());
    Ok((
        cpu_milli(r.get("cpu"))?.context("a cpu request")?,
        memory_bytes(r.get("memory"))?.context("a memory request")?,
    ))
}

/// The shipper container's (cpu, memory) limits.
fn container_limits(pod: &Pod) -> Result<(Option<u64>, Option<u64>)> {
    let l = container_resources(pod, |r| r.limits.clone());
    Ok((cpu_milli(l.get("cpu"))?, memory_bytes(l.get("memory"))?))
}

fn container_resources(
    pod: &Pod,
    which: impl Fn(&k8s_openapi::api::core::v1::ResourceRequirements) -> Option<BTreeMap<String, Quantity>>,
) -> BTreeMap<String, Quantity> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(which)
        .unwrap_or_default()
}

/// Names of the pods matching `selector` that run (or are about to), not yet being deleted.
async fn running_pods(client: &Client, namespace: &str, selector: &str) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .iter()
        .filter(|p| {
            matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Running" | "Pending")
            )
        })
        .map(|p| p.name_any())
        .collect())
}

/// A short account of the namespace's pods, for failure messages.
async fn describe_pods(client: &Client, namespace: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(|p| {
                format!(
                    "{} on {:?}: {}",
                    p.name_any(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    serde_json::to_string(&p.status).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(listing pods in {namespace}: {e})"),
    }
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
