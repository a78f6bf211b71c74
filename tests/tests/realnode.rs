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
//! 6. `helm uninstall` leaves no nodewarden pod running.
//! 7. The host is as before the node started (sysctls, iptables, mounts, links, cgroups, folders).
//!
//! Needs Linux and root; elsewhere it says so loudly and passes, except under `CI=true`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images::{self, TestImages};
use nodewarden_tests::shipper::{
    BUSY, NAMESPACE, QUIET, RELEASE, SHIPPER_NS, container_limits, container_requests, create_shipper,
    describe_pods, install_chart, recreate_shipper_pod, resize_in_place, running_container, running_pods,
    wait_for_kubelet_gates, wait_for_recommendation,
};
use nodewarden_tests::{HostSnapshot, RealCluster, RealClusterConfig, failure_with, require_real_nodes};
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
        self_signed_kubelets: vec![1],
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

    // 6. uninstall leaves no nodewarden pod running
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
