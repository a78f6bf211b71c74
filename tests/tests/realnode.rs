//! nodewarden on real nodes: the chart installed by Helm from the project's own images onto two
//! real kubelets (each with its own containerd, runc and bridge CNI) with kube-scheduler and
//! kube-proxy, default values but for the images and their pull policy.
//!
//! What a user would notice, in order (day one as a user lives it, issue 32):
//! 1. A real Prometheus scrapes both kubelets' `/metrics/cadvisor` (a ServiceAccount's bearer
//!    token the kubelets check with a TokenReview and authorize for `nodes/metrics`; TLS verified
//!    against the cluster CA, and against node b's own self-signed certificate), and a
//!    log-shipper-like DaemonSet (the test image burning a known CPU rate and holding a known
//!    amount of memory: more on the busy node, less on the quiet one) runs, before anything of
//!    nodewarden is installed.
//! 2. Once Prometheus holds a whole step of the shipper's history, `kubectl nodewarden report
//!    --prometheus` prints each node's figures from it, with nothing of nodewarden installed
//!    (`mode none`), near what the shipper uses there.
//! 3. The chart's CRDs and a DaemonSetAutoscaler for the shipper, then `helm install --wait` with
//!    `agent.history.prometheus.url` (and a short `agent.history.rateWindow`, as the report's):
//!    the webhook Deployment passes its probes with managed certificates and an injected
//!    caBundle, the agent DaemonSet runs on each node from an empty checkpoint folder.
//!    kube-apiserver calls the installed webhook through its Service: a bad `id.k8s.io` claim is
//!    denied with the webhook's reason. Each node's agent reports its kubelet's feature gates:
//!    node a's kubelet serves a certificate of the cluster CA, node b's signed its own (as
//!    kubeadm's and kind's do) and is verified against that certificate, with default values.
//! 4. Each node's agent has no checkpoint, seeds from Prometheus and publishes within a minute
//!    of its start a NodeRecommendation whose history began before it started (from the
//!    shipper's first sample in Prometheus), with the report's target (within one VPA bucket)
//!    and figures near the shipper's use.
//! 5. A new pod of the shipper on each node gets that node's figures from the webhook (the busy
//!    node more, the quiet one less), and the kubelet runs it with them: read back from the
//!    container's cgroup, not only from the Pod.
//! 6. `helm upgrade` without the Prometheus URL and with a new, empty checkpoint folder: each
//!    node's new agent measures the shipper live. With `updateMode: InPlace` and a CPU floor above
//!    both nodes' figures, each node's agent resizes its running shipper pod through
//!    `pods/resize`; the kubelet applies it to the same container without a restart (read back
//!    from the container's cgroup). The live agents' figures are close to the seeded ones.
//! 7. `helm uninstall` leaves no nodewarden pod running.
//! 8. The host is as before the node started (sysctls, iptables, mounts, links, cgroups, folders).
//!
//! Needs Linux and root; elsewhere it says so loudly and passes, except under `CI=true`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use nodewarden_tests::footprint;
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images::{self, TestImages};
use nodewarden_tests::oom;
use nodewarden_tests::seeding::{
    Printed, check_seeded, near, report_args, report_args_until, report_figures, scrape_kubelets,
    seeded_until, seeding_values, targets_while, wait_for_publish, wait_for_whole_step,
};
use nodewarden_tests::shipper::{
    BUSY, NAMESPACE, QUIET, RELEASE, SHIPPER_NS, container_limits, container_requests, create_autoscaler,
    create_shipper_daemonset, describe_pods, install_chart, recreate_shipper_pod, recreated_for_cpu_floor,
    resize_in_place, running_container, running_pods, wait_for_kubelet_gates, wait_for_running_shipper,
};
use nodewarden_tests::{
    HostSnapshot, RealCluster, RealClusterConfig, apply_crds, chart_crd_files, failure_with,
    kubectl_nodewarden, read_crds, require_real_nodes, wait_for_event,
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
        registry_hosts: None,
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

/// How far a seeded agent's memory figures may be from a live agent's: both read the same working
/// set; the scrape and the agent's sample are up to 10 s apart.
const MEMORY_TOLERANCE: f64 = 0.10;
/// The live agent's figures are compared once its history holds this many samples (10 s apart).
const LIVE_SAMPLES: i64 = 3;

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
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    let client = cp.admin_client().await?;

    // 1. a Prometheus scraping both kubelets' cAdvisor endpoints, as an operator's, and the
    //    shipper running, before nodewarden
    let prometheus = scrape_kubelets(cluster, &client).await?;
    let shipper_created = Instant::now();
    create_shipper_daemonset(&client, &images.testbox_ref(), &nodes).await?;
    let result = day_one(cluster, &client, images, &prometheus, &names)
        .await
        .map_err(|e| {
            e.context(format!(
                "Prometheus's last log lines:\n{}",
                prometheus.log_tail(20)
            ))
        });
    drop(prometheus);
    let seeded = result?;
    eprintln!(
        "realnode: shipper created → seeded recommendations on both nodes: {:.0}s",
        shipper_created.elapsed().as_secs_f64()
    );
    let helm = Helm::for_control_plane(cp)?;

    // 5. a new pod on each node (both at once) gets that node's figures, and its kubelet
    //    applies them
    let recreated = futures::future::try_join_all(nodes.iter().map(|(node, _)| {
        let client = client.clone();
        async move { targets_while(&client, &node.name, recreate_shipper_pod(&client, &node.name)).await }
    }))
    .await?;
    for ((node, _), (second, seen)) in nodes.iter().zip(recreated) {
        let requests = container_requests(&second)?;
        // (the seeded agent goes on measuring live: its figures may move while the pod is made,
        // and the webhook gives the pod whichever was current when the DaemonSet controller made it)
        ensure!(
            seen.contains(&requests),
            "the new pod on {} requests one of the node's targets while it was made {seen:?}, got {requests:?} \
             (annotations {:?})",
            node.name,
            second.annotations()
        );
        let applied = node.container_cgroup(&second)?;
        ensure!(
            applied.cpu_matches_request(requests.0),
            "the container's cgroup on {} has the CPU weight of a {}m request: {applied:?}",
            node.name,
            requests.0
        );
        if let (_, Some(limit)) = container_limits(&second)? {
            ensure!(
                applied.memory_matches_limit(limit),
                "the container's cgroup memory limit on {} is the pod's {limit} B: {applied:?}",
                node.name
            );
        }
    }

    // 6. agents that measure live: no Prometheus URL, a new, empty checkpoint folder
    let checkpoints = cp.dir().join("checkpoints-live");
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
            "agent.history.prometheus.url=".to_string(),
            "--set".to_string(),
            format!("agent.checkpoint.hostPath={}", checkpoints.display()),
            // figures written again every 5 s even when they moved less than 10 %, so that the
            // NodeRecommendation's sampleCount follows the agent's (an hour by default)
            "--set".to_string(),
            "agent.extraEnv[0].name=NODEWARDEN_REFRESH_INTERVAL".to_string(),
            "--set".to_string(),
            "agent.extraEnv[0].value=5s".to_string(),
            // where InPlace acts as Recreate (no pods/resize before 1.33), the second node's
            // eviction, held back by the DaemonSet's maxUnavailable, is retried within seconds
            "--set".to_string(),
            "agent.update.evictionRetryInterval=10s".to_string(),
        ])
        .await?;
    ensure!(
        out.success,
        "helm upgrade failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    let live_started = Instant::now();

    // …InPlace: with a CPU floor above both nodes' figures, each node's agent resizes its
    //    running pod in place; the kubelet applies it to the same container, without a restart.
    //    Where the API server serves no pods/resize (before 1.33), InPlace acts as Recreate: the
    //    agent evicts the pod, its Event names the version, and the new pod gets the floor.
    let floor = seeded.iter().map(|s| s.figures.target.0).max().unwrap_or(0) + 100;
    let version = cp.kube_version().clone();
    let raised = futures::future::try_join_all(nodes.iter().map(|(node, _)| {
        let (client, version) = (client.clone(), &version);
        async move {
            if version.resize_by_default() {
                let (before, after) = resize_in_place(&client, &node.name, floor).await?;
                Ok::<_, anyhow::Error>((before, after, None))
            } else {
                let (before, after, note) = recreated_for_cpu_floor(cp, &client, &node.name, floor).await?;
                Ok((before, after, Some(note)))
            }
        }
    }))
    .await?;
    for ((node, _), (before, after, evicted)) in nodes.iter().zip(raised) {
        let container = running_container;
        match &evicted {
            None => ensure!(
                container(&before) == container(&after),
                "resized in place on {}: same container, no restart ({:?} → {:?})",
                node.name,
                container(&before),
                container(&after)
            ),
            Some(note) => ensure!(
                note.contains("not in place") && note.contains(&version.text),
                "the shipper pod on {} was evicted with an Event naming the missing resize and {version}: {note}",
                node.name
            ),
        }
        let request = container_requests(&after)?.0;
        ensure!(
            request >= floor,
            "the shipper on {} requests at least the {floor}m floor: {request}m",
            node.name
        );
        let applied = node.container_cgroup(&after)?;
        ensure!(
            applied.cpu_matches_request(request),
            "the running container's cgroup on {} has the CPU weight of its new {request}m request: {applied:?}",
            node.name
        );
        match evicted {
            None => eprintln!(
                "realnode: {} resized in place to {request}m CPU (floor {floor}m), same container, cgroup {applied:?}",
                node.name
            ),
            Some(note) => eprintln!(
                "realnode: {} on {version}: evicted ({note}), the new pod requests {request}m CPU (floor {floor}m), cgroup {applied:?}",
                node.name
            ),
        }
    }

    // …and the live agents' figures are close to the seeded ones (docs/history.md, "Tolerances")
    let seeded_agents: Vec<String> = seeded.iter().map(|s| s.agent.clone()).collect();
    let live = wait_for_publish(&client, &names, &seeded_agents, Duration::from_secs(180), |e| {
        e.sample_count >= LIVE_SAMPLES
    })
    .await?;
    eprintln!(
        "realnode: live agents with {LIVE_SAMPLES}+ samples {:.0}s after helm upgrade",
        live_started.elapsed().as_secs_f64()
    );
    for (seeded, live) in seeded.iter().zip(&live) {
        let (s, l) = (seeded.figures, live.figures);
        eprintln!(
            "realnode: {} seeded {s:?}, live ({} samples since {:?}, agent started {}) {l:?}",
            seeded.node, live.sample_count, live.first_sample, live.started
        );
        // Memory: both read the same working set of a burner that holds what it allocated
        // (cAdvisor's and the agent's reading of one cgroup). CPU is not compared: 1-minute
        // rates from Prometheus and the live agent's 10-second readings minutes later are
        // different samples of a burner that gets what a loaded machine leaves it (the like-with-
        // like check is check_seeded's, against the report over the same history).
        ensure!(
            near(s.uncapped.1, l.uncapped.1, MEMORY_TOLERANCE)
                && near(s.target.1, l.target.1, MEMORY_TOLERANCE),
            "{}: the seeded agent's memory {s:?} is not the live agent's {l:?}",
            seeded.node
        );
    }
    // …and live, as seeded, the busy node's shipper is measured above the quiet one's (5× its
    // burn rate)
    ensure!(
        live[0].figures.uncapped.0 > live[1].figures.uncapped.0,
        "live, the busy node's shipper is measured above the quiet node's: {:?}, {:?}",
        live[0].figures,
        live[1].figures
    );

    // …and the autoscaler's status counts both pods up to date with their node's figures
    let autoscalers: Api<nodewarden_api::DaemonSetAutoscaler> = Api::namespaced(client.clone(), SHIPPER_NS);
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

    // …and a DaemonSet with a native sidecar: both resized in place, on each node
    native_sidecar_resized_in_place(cluster, &client, &images.testbox_ref()).await?;

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

/// The CPU request (millicores) of the container or native sidecar `name`: as the pod's spec asks
/// it and as the kubelet reports it applied (`status.containerStatuses[].resources`, and
/// `initContainerStatuses` for a sidecar).
fn cpu_of(pod: &Pod, name: &str) -> (Option<u64>, Option<u64>) {
    let milli = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| nodewarden_api::quantity::parse_milli(&q.0))
            .map(|m| m as u64)
    };
    let spec = pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| milli(r.get("cpu")))
    });
    let applied = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| milli(r.get("cpu")))
    });
    (spec, applied)
}

/// The container IDs and restart counts of every container and init container of `pod`, by name.
fn container_ids(pod: &Pod) -> Vec<(String, Option<String>, i32)> {
    let mut ids: Vec<_> = pod
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|c| (c.name.clone(), c.container_id.clone(), c.restart_count))
        .collect();
    ids.sort();
    ids
}

/// Native sidecars on real nodes (issue 42): a relay DaemonSet whose pod runs a forwarder as an
/// init container with `restartPolicy: Always` beside its container, as log and mesh agents ship.
/// With `InPlace` and a CPU floor above both, each node's agent resizes the container and the
/// sidecar of its running pod in one PATCH of `pods/resize`; the kubelet applies both (read back
/// from each one's cgroup) without restarting either. Where the API server serves no
/// `pods/resize` (before 1.33), the agent evicts the pod instead (its Event names the version)
/// and the new pod's container and sidecar get the floor from the webhook.
async fn native_sidecar_resized_in_place(
    cluster: &RealCluster,
    client: &kube::Client,
    image: &str,
) -> Result<()> {
    const RELAY: &str = "relay";
    const FLOOR: u64 = 120;
    let burn = |name: &str, cpu: &str, requests: serde_json::Value| {
        json!({
            "name": name, "image": image, "imagePullPolicy": "Never",
            "args": ["burn", "--cpu-millicores", cpu, "--memory-mib", "16"],
            "resources": {"requests": requests, "limits": {"memory": "256Mi"}},
        })
    };
    let mut forwarder = burn("forwarder", "10", json!({"cpu": "20m", "memory": "32Mi"}));
    forwarder["restartPolicy"] = json!("Always");
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": RELAY},
        "spec": {
            "selector": {"matchLabels": {"app": RELAY}},
            "template": {
                "metadata": {"labels": {"app": RELAY}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "initContainers": [forwarder],
                    "containers": [burn(RELAY, "20", json!({"cpu": "30m", "memory": "32Mi"}))],
                },
            },
        },
    }))?;
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), SHIPPER_NS)
        .create(&PostParams::default(), &ds)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SHIPPER_NS);
    let running_on = |node: String, not_uid: Option<String>| {
        let (pods, client) = (pods.clone(), client.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                let found = pods
                    .list(&ListParams::default().labels(&format!("app={RELAY}")))
                    .await?
                    .items
                    .into_iter()
                    .find(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                            && p.uid() != not_uid
                            && p.metadata.deletion_timestamp.is_none()
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                            && container_ids(p).iter().all(|(_, id, _)| id.is_some())
                            && container_ids(p).len() == 2
                    });
                if let Some(pod) = found {
                    return Ok::<Pod, anyhow::Error>(pod);
                }
                ensure!(
                    Instant::now() < deadline,
                    "the relay pod on {node} does not run both containers after 180 s:\n{}",
                    describe_pods(&client, SHIPPER_NS).await
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let mut before = Vec::new();
    for node in &cluster.nodes {
        before.push(running_on(node.name.clone(), None).await?);
    }
    Api::<nodewarden_api::DaemonSetAutoscaler>::namespaced(client.clone(), SHIPPER_NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "DaemonSetAutoscaler",
                "metadata": {"name": RELAY},
                "spec": {
                    "targetRef": {"kind": "DaemonSet", "name": RELAY},
                    "updatePolicy": {"updateMode": "InPlace"},
                    "resourcePolicy": {"containerPolicies": [
                        {"containerName": "*", "minAllowed": {"cpu": format!("{FLOOR}m")}}
                    ]},
                },
            }))?,
        )
        .await?;
    let version = cluster.cp.kube_version();
    for (node, first) in cluster.nodes.iter().zip(&before) {
        if !version.resize_by_default() {
            // no pods/resize: InPlace acts as Recreate; the new pod gets the floor for both
            let note = wait_for_event(
                &cluster.cp,
                client,
                SHIPPER_NS,
                "Pod",
                &first.name_any(),
                "Evicted",
            )
            .await?;
            ensure!(
                note.contains("not in place") && note.contains(&version.text),
                "the relay pod on {} was evicted with an Event naming the missing resize and {version}: {note}",
                node.name
            );
            let recreated = running_on(node.name.clone(), first.uid()).await?;
            for name in [RELAY, "forwarder"] {
                let request = cpu_of(&recreated, name).0.unwrap_or_default();
                ensure!(
                    request >= FLOOR,
                    "the new relay pod's {name} on {} requests at least the {FLOOR}m floor: {request}m",
                    node.name
                );
                let applied = node.container_cgroup_of(&recreated, Some(name))?;
                ensure!(
                    applied.cpu_matches_request(request),
                    "the cgroup of {name} on {} has the CPU weight of its {request}m request: {applied:?}",
                    node.name
                );
                eprintln!(
                    "realnode: {name} (sidecar: {}) on {} on {version}: evicted, re-created with {request}m, cgroup {applied:?}",
                    name == "forwarder",
                    node.name
                );
            }
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        let resized = loop {
            let pod = pods.get(&first.name_any()).await?;
            let done = [RELAY, "forwarder"].iter().all(|c| {
                let (spec, applied) = cpu_of(&pod, c);
                spec.is_some_and(|m| m >= FLOOR) && applied == spec
            });
            if done {
                break pod;
            }
            ensure!(
                Instant::now() < deadline,
                "the relay pod on {} was not resized in place to {FLOOR}m+ for both its container and its \
                 sidecar within 180 s: relay {:?}, forwarder {:?}",
                node.name,
                cpu_of(&pod, RELAY),
                cpu_of(&pod, "forwarder")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        ensure!(
            container_ids(first) == container_ids(&resized),
            "resized in place on {}: same containers, no restart ({:?} → {:?})",
            node.name,
            container_ids(first),
            container_ids(&resized)
        );
        for name in [RELAY, "forwarder"] {
            let request = cpu_of(&resized, name).0.unwrap_or_default();
            let applied = node.container_cgroup_of(&resized, Some(name))?;
            ensure!(
                applied.cpu_matches_request(request),
                "the cgroup of {name} on {} has the CPU weight of its new {request}m request: {applied:?}",
                node.name
            );
            eprintln!(
                "realnode: {name} (sidecar: {}) on {} resized in place to {request}m, cgroup {applied:?}",
                name == "forwarder",
                node.name
            );
        }
    }
    Ok(())
}

/// Steps 2 to 4: the report from Prometheus before anything is installed, then the chart with
/// the Prometheus URL, and each node's agent seeded from it. Returns what each agent published
/// first.
async fn day_one(
    cluster: &RealCluster,
    client: &kube::Client,
    images: &TestImages,
    prometheus: &nodewarden_tests::prometheus::Prometheus,
    names: &[String],
) -> Result<Vec<nodewarden_tests::seeding::Published>> {
    let cp = &cluster.cp;
    let loads = [BUSY, QUIET];
    for node in names {
        wait_for_running_shipper(client, node, None).await?;
    }
    // 2. the report, once the history holds a whole step (the agents' rate window after each
    //    node's first sample), before anything of nodewarden is installed
    let waited = Instant::now();
    let history = wait_for_whole_step(prometheus, names).await?;
    eprintln!(
        "realnode: waited {:.0}s for a whole step of the shipper's history (first samples {:?}, step {})",
        waited.elapsed().as_secs_f64(),
        history.first,
        history.whole_step
    );
    let url = prometheus.url();
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let mut args = report_args(&url);
    args.splice(1..1, ["--kubeconfig".to_string(), kubeconfig]);
    args.extend(["-o".to_string(), "json".to_string()]);
    let out = kubectl_nodewarden(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let report: serde_json::Value =
        serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
    ensure!(
        report["daemonsets"][0]["mode"] == "none",
        "the report before the install uses the defaults (mode none): {report}"
    );
    let printed: Vec<Printed> = names
        .iter()
        .map(|n| report_figures(&report, n))
        .collect::<Result<_>>()?;
    for ((node, p), load) in names.iter().zip(&printed).zip(loads) {
        eprintln!("realnode: report before the install, {node}: {p:?}");
        ensure!(
            load.cpu_near(p.target.0) && load.memory_near(p.target.1),
            "{node}: the report's target {p:?} is not near the shipper's use there ({load:?})"
        );
    }

    // 3. the CRDs and the shipper's autoscaler (an agent seeds the autoscaled containers it
    //    finds at its start), then helm install with the Prometheus URL
    apply_crds(cp, client, &read_crds(&chart_crd_files()?)?).await?;
    create_autoscaler(client).await?;
    let helm = Helm::for_control_plane(cp)?;
    let (checkpoints, values) = (cluster.fresh_checkpoint_dir()?, seeding_values(&url));
    // the first recommendation each agent publishes, watched while helm waits
    let (took, seeded) = tokio::try_join!(
        install_chart(&helm, client, images, &checkpoints, &values),
        wait_for_publish(client, names, &[], Duration::from_secs(240), |_| true)
    )?;
    eprintln!("realnode: helm install --wait took {:.1}s", took.as_secs_f64());

    let webhook_pods = running_pods(client, NAMESPACE, "app.kubernetes.io/component=webhook").await?;
    ensure!(
        webhook_pods.len() == 2,
        "two webhook replicas run: {webhook_pods:?}"
    );
    let agent_pods = running_pods(client, NAMESPACE, "app.kubernetes.io/component=agent").await?;
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

    // …the API server calls the installed webhook through its Service
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
        let gates = wait_for_kubelet_gates(client, &node.name).await?;
        eprintln!(
            "realnode: NodeFeatureReport/{}: kubelet read, {gates} gates",
            node.name
        );
    }

    // 4. each node's agent seeded from Prometheus: published within a minute of its start, a
    //    history from before it, the report's figures, near the shipper's use
    for ((s, p), load) in seeded.iter().zip(&printed).zip(loads) {
        eprintln!(
            "realnode: {} seeded agent started {}, published {:.0}s after: {} samples since {:?}; seeded {:?}, \
             report {p:?}",
            s.node,
            s.started,
            s.after_start(),
            s.sample_count,
            s.first_sample,
            s.figures
        );
        // the report over exactly the history this agent read: --end at its last sample
        let mut args = report_args_until(&url, seeded_until(s)?);
        args.splice(
            1..1,
            [
                "--kubeconfig".to_string(),
                cp.kubeconfig_path().display().to_string(),
            ],
        );
        args.extend(["-o".to_string(), "json".to_string()]);
        let out = kubectl_nodewarden(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        let same: serde_json::Value =
            serde_json::from_str(&out).with_context(|| format!("report JSON: {out}"))?;
        let same = report_figures(&same, &s.node)?;
        eprintln!("realnode: report over the same history, {}: {same:?}", s.node);
        check_seeded(s, &history, &same)?;
        ensure!(
            load.cpu_near(s.figures.target.0) && load.memory_near(s.figures.target.1),
            "{}: the seeded target {:?} is not near the shipper's use there ({load:?})",
            s.node,
            s.figures.target
        );
    }
    let (busy, quiet) = (seeded[0].figures.target, seeded[1].figures.target);
    ensure!(
        busy.0 > quiet.0 && busy.1 > quiet.1,
        "the busy node's shipper is recommended more than the quiet node's: busy {busy:?}, quiet {quiet:?}"
    );
    Ok(seeded)
}

const CHILD_ENV: &str = "NODEWARDEN_REALNODE_CHILD";
const CHILD_READY: &str = "nodewarden-realnode-child: node up";

/// A test process killed with SIGKILL cannot stop its node: its watchdog must put the host back.
/// The test runs itself as a child process that starts a real node with one pod (so containers,
/// their mounts and network namespaces exist), kills it with SIGKILL once the node is up, and
/// waits for the host to be as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_restores_the_host_after_kill_9() -> Result<()> {
    const NAME: &str = "watchdog_restores_the_host_after_kill_9";
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_holds_a_real_node().await;
    }
    if !require_real_nodes(NAME)? {
        return Ok(());
    }
    // built here, not in the child: a build (minutes when cold) must not count against the
    // child's start-up below
    images::build_testbox().await?;
    // the child runs under this lock, so no other real node changes the host meanwhile
    let _lock = nodewarden_tests::node::lock_host().await?;
    let tmp = tempfile::tempdir()?;
    let before = HostSnapshot::take(&tmp.path().join("before"))?;
    let mut child = child_with_a_real_node(NAME).await?;
    let changed = before.diff()?;
    ensure!(
        !changed.is_empty(),
        "a running node changes the host (else this test proves nothing)"
    );

    child.start_kill()?; // SIGKILL
    child.wait().await?;
    // the watchdog notices within a second, kills the node's processes and restores the host
    wait_host_as_before(&before, "kill -9", Duration::from_secs(90)).await
}

/// When a run's test process and its watchdog die together (a machine or session stopped
/// mid-run), nothing is left to put the host back, and the next real cluster would fail to create
/// its links ("File exists"). The next run that takes the host lock restores the dead run's
/// record. Here the child's watchdog is killed first, then the child; the host stays changed,
/// and what `lock_host` runs on the way in puts it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_run_puts_back_what_a_run_and_its_watchdog_left() -> Result<()> {
    const NAME: &str = "the_next_run_puts_back_what_a_run_and_its_watchdog_left";
    if std::env::var_os(CHILD_ENV).is_some() {
        return child_holds_a_real_node().await;
    }
    if !require_real_nodes(NAME)? {
        return Ok(());
    }
    images::build_testbox().await?;
    let _lock = nodewarden_tests::node::lock_host().await?;
    let tmp = tempfile::tempdir()?;
    let before = HostSnapshot::take(&tmp.path().join("before"))?;
    let mut child = child_with_a_real_node(NAME).await?;
    let pid = child.id().context("the child's pid")?;

    // the child's watchdog: `sh -c <script> nodewarden-e2e-watchdog <child pid> <dir> ...`
    let watchdog = format!("nodewarden-e2e-watchdog {pid} ");
    let found = tokio::process::Command::new("pgrep")
        .args(["-f", "--", &watchdog])
        .output()
        .await?;
    let watchdogs: Vec<String> = String::from_utf8_lossy(&found.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    ensure!(
        !watchdogs.is_empty(),
        "the child's watchdog is running (else this test proves nothing)"
    );
    for w in &watchdogs {
        let status = tokio::process::Command::new("kill")
            .args(["-KILL", w])
            .status()
            .await?;
        ensure!(status.success(), "kill -KILL {w} (the child's watchdog)");
    }
    child.start_kill()?;
    child.wait().await?;
    // both are gone: nothing puts the host back on its own
    let deadline = Instant::now() + Duration::from_secs(10);
    while watchdogs
        .iter()
        .any(|w| std::path::Path::new(&format!("/proc/{w}")).exists())
    {
        ensure!(Instant::now() < deadline, "the child's watchdog did not die");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = before.diff()?;
    ensure!(
        left.iter().any(|l| l.contains("nw-apiserver")),
        "the dead run left its links on the host (else this test proves nothing): {left:?}"
    );

    let done = nodewarden_tests::node::recover_abandoned_host()?;
    ensure!(
        done.iter().any(|d| d.contains("restored it from")),
        "the next run restores from the dead run's record: {done:?}"
    );
    ensure!(
        done.iter().any(|d| d.contains("removed its folder")),
        "the dead run's folder (its containerd and kubelet state) goes too: {done:?}"
    );
    wait_host_as_before(&before, "the next run's recovery", Duration::from_secs(30)).await?;
    ensure!(
        nodewarden_tests::node::recover_abandoned_host()?.is_empty(),
        "a second recovery finds nothing left"
    );
    Ok(())
}

/// Starts this test binary again as a child running `test` with [`CHILD_ENV`] set (it brings up
/// one real node with a running pod, under the lock this process holds) and returns once the
/// child says its node is up.
async fn child_with_a_real_node(test: &str) -> Result<tokio::process::Child> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
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
    Ok(child)
}

/// Polls until the host is as `before` recorded it, or fails after `limit` naming what differs.
async fn wait_host_as_before(before: &HostSnapshot, after: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let left = before.diff()?;
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{} s after {after} the host still differs:\n  {}",
            limit.as_secs(),
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
        registry_hosts: None,
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

/// Benchmark (issue 42; not a timed test: it prints figures and checks only what a user would
/// notice, every container published): the agent's footprint on a real node with 30 autoscaled
/// containers (three DaemonSets of ten, as a node's log, metrics and mesh agents), the chart's
/// default values but for the images (its default 10 s sample interval). Over
/// `NODEWARDEN_BENCH_SECONDS` (600) after every container is published: the agent process's
/// resident memory (mean, peak, last, sampled every 10 s) and its CPU (millicores on average),
/// against the goal of 10 MiB and 2 millicores. Runs on whichever cgroup version the host has,
/// and at `NODEWARDEN_KUBE_VERSION`. Run by hand (about 13 minutes):
///
/// ```sh
/// cargo test -p nodewarden-tests --test realnode -- --ignored --nocapture agent_footprint
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand, figures go to docs/benchmarks.md"]
async fn agent_footprint_on_a_real_node_with_30_containers() -> Result<()> {
    if !require_real_nodes("agent_footprint_on_a_real_node_with_30_containers")? {
        return Ok(());
    }
    let span = footprint::bench_span(600)?;
    let images = images::build_test_images().await?;
    let cluster = RealCluster::start(&RealClusterConfig::with_images(1, &images)).await?;
    let result = agent_footprint(&cluster, &images, span).await;
    let details = match &result {
        Err(_) => failure_details(&cluster).await,
        Ok(()) => String::new(),
    };
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "agent_footprint_on_a_real_node_with_30_containers", &details))?;
    restored
}

async fn agent_footprint(cluster: &RealCluster, images: &TestImages, span: Duration) -> Result<()> {
    const NS: &str = "agents";
    let cp = &cluster.cp;
    let node = &cluster.nodes[0];
    let client = cp.admin_client().await?;
    apply_crds(cp, &client, &read_crds(&chart_crd_files()?)?).await?;
    nodewarden_tests::create_namespace(cp, &client, NS).await?;
    let wanted = footprint::create_workload(
        &client,
        NS,
        &images.testbox_ref(),
        &footprint::Placement::Everywhere,
    )
    .await?;
    footprint::install_chart_defaults(cluster, images).await?;
    footprint::wait_published(&client, &node.name, wanted, Duration::from_secs(300), || {
        describe_pods(&client, NS)
    })
    .await?;
    let pids = nodewarden_tests::procfs::processes_in(&node.cgroup_root, "nodewarden-agent");
    let [pid] = pids[..] else {
        bail!("one agent process on the node, found {pids:?}");
    };
    let measured = footprint::measure(&footprint::AgentProcess::Host(pid), span).await?;
    let cgroup = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "cgroup v2"
    } else {
        "cgroup v1"
    };
    let published = footprint::published(&client, &node.name).await?;
    eprintln!(
        "footprint: the agent on a real node ({cgroup}, Kubernetes {}), {published} autoscaled containers, {}",
        cp.kube_version(),
        measured.summary()
    );
    ensure!(
        published >= wanted,
        "every container is still published: {published} of {wanted}"
    );
    Ok(())
}

/// A DaemonSet container OOM-killed in a loop on node a, under a `Recreate` autoscaler for
/// memory made before it (`nodewarden_tests::oom`): node a's agent re-creates the pod with that
/// node's raised memory, its container runs without a restart with that limit (read back from
/// its cgroup), and node b's pod is left as it was. Prints the time from the first kill to the
/// rescued container's start, and the kills seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_loop_on_one_node_is_rescued_there() -> Result<()> {
    if !require_real_nodes("an_oom_loop_on_one_node_is_rescued_there")? {
        return Ok(());
    }
    let images = images::build_test_images().await?;
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 2,
        images: images.archives(),
        sandbox_image: images.testbox_ref(),
        self_signed_kubelets: vec![],
        registry_hosts: None,
    })
    .await?;
    let result = oom_loop(&cluster, &images).await;
    let details = match &result {
        Err(_) => failure_details(&cluster).await,
        Ok(()) => String::new(),
    };
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "an_oom_loop_on_one_node_is_rescued_there", &details))?;
    restored
}

async fn oom_loop(cluster: &RealCluster, images: &TestImages) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let helm = Helm::for_control_plane(&cluster.cp)?;
    install_chart(&helm, &client, images, &cluster.fresh_checkpoint_dir()?, &[]).await?;
    let (looping, steady) = (&cluster.nodes[0], &cluster.nodes[1]);
    nodewarden_tests::shipper::create_namespace(&client, SHIPPER_NS).await?;
    let rescue = oom::rescue_an_oom_loop(
        &client,
        &oom::OomLoop {
            namespace: SHIPPER_NS,
            image: &images.testbox_ref(),
            looping: &looping.name,
            steady: Some(&steady.name),
            tolerations: json!([]),
        },
    )
    .await?;
    let applied = looping.container_cgroup(&rescue.pod)?;
    ensure!(
        applied.memory_matches_limit(rescue.limit),
        "the rescued container's cgroup has not its pod's limit {} B: {applied:?}",
        rescue.limit
    );
    eprintln!(
        "realnode: OOM loop rescued on {}: kills seen {}, first kill → rescued container running {:.0} s; \
         now {} MiB request, {} MiB limit (cgroup {applied:?}); the pod on {} unchanged",
        looping.name,
        rescue.kills,
        rescue.took.as_secs_f64(),
        rescue.memory >> 20,
        rescue.limit >> 20,
        steady.name
    );
    Ok(())
}
