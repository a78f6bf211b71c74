//! The log-shipper-like workload of the real-node tier and the demo: one DaemonSet of the test
//! image (`nodewarden-testbox burn`) that burns a known CPU rate and holds a known amount of memory
//! per node, and what a user looks at around it (the chart installed, the node's recommendation,
//! the pod re-created with the webhook's figures).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::NodeRecommendation;
use nodewarden_api::quantity::amount;
use nodewarden_api::rightsizing::ResourceName;
use serde_json::json;

use crate::helm::{Helm, chart_dir};
use crate::images::TestImages;
use crate::node::RealNode;

/// The namespace and release name the chart is installed as.
pub const NAMESPACE: &str = "nodewarden";
pub const RELEASE: &str = "nodewarden";
/// The shipper's namespace, DaemonSet, autoscaler and container name.
pub const SHIPPER_NS: &str = "logging";
pub const SHIPPER: &str = "shipper";

/// `helm install --wait` of the chart with default values but for the images (the test images,
/// `pullPolicy: Never`), the agents' checkpoint folder (`checkpoints`, which the caller makes
/// new and empty, so no agent starts from an earlier run's histograms) and `values` (each a
/// `--set` argument, e.g. `agent.history.prometheus.url=…`); fails with the pods' states when
/// it does not become ready.
pub async fn install_chart(
    helm: &Helm,
    client: &Client,
    images: &TestImages,
    checkpoints: &Path,
    values: &[String],
) -> Result<Duration> {
    let mut args: Vec<String> = vec![
        "install".into(),
        RELEASE.into(),
        chart_dir().display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--create-namespace".into(),
        "--wait".into(),
    ];
    args.extend(images.helm_set_args());
    for value in values {
        args.extend(["--set".to_string(), value.clone()]);
    }
    install_chart_with(helm, client, args, checkpoints).await
}

/// `helm <install>` (a `helm install … --wait` command line without `helm`) with the test's
/// settings added: a 5 min wait, the agents' pace (see [`install_chart`]) and the checkpoint
/// folder `checkpoints`, which must be empty; fails with the pods' states when it does not
/// become ready.
pub async fn install_chart_with(
    helm: &Helm,
    client: &Client,
    install: Vec<String>,
    checkpoints: &Path,
) -> Result<Duration> {
    let began = Instant::now();
    let mut args = install;
    args.extend(["--timeout".to_string(), "5m".to_string()]);
    // running pods follow the node's figures within seconds, not VPA's 12 h
    // (and figures are published as they move, not paced to a write per 10 minutes)
    for set in [
        "agent.update.interval=2s",
        "agent.update.minAge=5s",
        "agent.publishBudget=1s",
    ] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    if std::fs::read_dir(checkpoints)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
    {
        bail!("the checkpoint folder {} is not empty", checkpoints.display());
    }
    args.extend([
        "--set".to_string(),
        format!("agent.checkpoint.hostPath={}", checkpoints.display()),
    ]);
    let out = helm.run(&args).await?;
    if !out.success {
        bail!(
            "helm install failed:\n{}\n{}\n{}",
            out.stdout,
            out.stderr,
            describe_pods(client, NAMESPACE).await
        );
    }
    Ok(began.elapsed())
}

/// Creates the shipper's namespace and DaemonSet (burning `load` on each node), without an
/// autoscaler: a workload that runs before nodewarden is installed.
pub async fn create_shipper_daemonset(
    client: &Client,
    image: &str,
    nodes: &[(&RealNode, Load)],
) -> Result<()> {
    create_namespace(client, SHIPPER_NS).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), SHIPPER_NS);
    daemonsets
        .create(&PostParams::default(), &shipper_daemonset(image, nodes)?)
        .await?;
    Ok(())
}

/// Creates the shipper's DaemonSetAutoscaler (mode `Initial`, no policy); the CRDs must be
/// there.
pub async fn create_autoscaler(client: &Client) -> Result<()> {
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
    Ok(())
}

/// Deletes the shipper's pod on `node` and returns its replacement once it runs (created by the
/// DaemonSet controller, mutated by the webhook, bound by the scheduler, started by the kubelet).
pub async fn recreate_shipper_pod(client: &Client, node: &str) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SHIPPER_NS);
    let first = wait_for_running_shipper(client, node, None).await?;
    pods.delete(&first.name_any(), &DeleteParams::default()).await?;
    wait_for_running_shipper(client, node, first.uid()).await
}

/// Switches the shipper's autoscaler to `InPlace` with a CPU floor of `min_cpu_milli`, and
/// returns the pod on `node` once its agent has resized it in place (same pod, same container)
/// to at least that request.
pub async fn resize_in_place(client: &Client, node: &str, min_cpu_milli: u64) -> Result<(Pod, Pod)> {
    let before = wait_for_running_shipper(client, node, None).await?;
    in_place_with_cpu_floor(client, min_cpu_milli).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), SHIPPER_NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pod = pods.get(&before.name_any()).await?;
        let applied = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| cpu_milli(r.get("cpu")).ok().flatten());
        if container_requests(&pod)?.0 >= min_cpu_milli && applied.is_some_and(|a| a >= min_cpu_milli) {
            return Ok((before, pod));
        }
        if Instant::now() > deadline {
            bail!(
                "the shipper pod on {node} was not resized in place to {min_cpu_milli}m within 120 s:\n{}",
                describe_pods(client, SHIPPER_NS).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The shipper's autoscaler set to `updateMode: InPlace` with a CPU floor for every container.
async fn in_place_with_cpu_floor(client: &Client, min_cpu_milli: u64) -> Result<()> {
    let autoscalers: Api<nodewarden_api::DaemonSetAutoscaler> = Api::namespaced(client.clone(), SHIPPER_NS);
    autoscalers
        .patch(
            SHIPPER,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {
                "updatePolicy": {"updateMode": "InPlace"},
                "resourcePolicy": {"containerPolicies": [
                    {"containerName": "*", "minAllowed": {"cpu": format!("{min_cpu_milli}m")}}
                ]},
            }})),
        )
        .await?;
    Ok(())
}

/// On a Kubernetes that serves no `pods/resize` (before 1.33 with its defaults): sets the
/// shipper's autoscaler to `InPlace` with a CPU floor of `min_cpu_milli`, which acts as
/// `Recreate` there. Waits for the agent to evict the running shipper pod on `node` and for the
/// DaemonSet controller's new one to run there. Returns the evicted pod, the new one and the
/// eviction Event's note (docs/compatibility.md, "In-place resize before 1.33").
pub async fn recreated_for_cpu_floor(
    cp: &crate::ControlPlane,
    client: &Client,
    node: &str,
    min_cpu_milli: u64,
) -> Result<(Pod, Pod, String)> {
    let before = wait_for_running_shipper(client, node, None).await?;
    in_place_with_cpu_floor(client, min_cpu_milli).await?;
    let note = crate::wait_for_event(cp, client, SHIPPER_NS, "Pod", &before.name_any(), "Evicted").await?;
    // the agent evicts within the DaemonSet's maxUnavailable (1): the other node's pod may go first
    let after = wait_for_running_shipper(client, node, before.uid()).await?;
    Ok((before, after, note))
}

/// The id and restart count of `pod`'s first container: the same after an in-place resize.
pub fn running_container(pod: &Pod) -> Option<(Option<String>, i32)> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| (c.container_id.clone(), c.restart_count))
}

/// What the shipper burns and holds on each node.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub millicores: u64,
    pub mib: u64,
}
impl Load {
    /// Whether a CPU target of `millicores` is near this load, as [`wait_for_recommendation`]
    /// takes it: 0.5–1.75 × the burn rate.
    pub fn cpu_near(&self, millicores: u64) -> bool {
        (self.millicores / 2..=self.millicores * 7 / 4).contains(&millicores)
    }

    /// Whether a memory target of `bytes` is near this load: 1.0–1.5 × what is held, or the
    /// 250 MiB floor.
    pub fn memory_near(&self, bytes: u64) -> bool {
        const MIB: u64 = 1024 * 1024;
        (self.mib * MIB..=(self.mib * MIB * 3 / 2).max(250 * MIB)).contains(&bytes)
    }
}

pub const BUSY: Load = Load {
    millicores: 300,
    mib: 300,
};
pub const QUIET: Load = Load {
    millicores: 60,
    mib: 100,
};

pub fn shipper_daemonset(image: &str, nodes: &[(&RealNode, Load)]) -> Result<DaemonSet> {
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

pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
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
pub async fn wait_for_running_shipper(client: &Client, node: &str, not_uid: Option<String>) -> Result<Pod> {
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
pub async fn wait_for_recommendation(client: &Client, node: &str, load: Load) -> Result<(u64, u64)> {
    let api: Api<NodeRecommendation> = Api::all(client.clone());
    let cpu_ok = |m: u64| load.cpu_near(m);
    let mem_ok = |b: u64| load.memory_near(b);
    // a condition, so a long bound costs nothing when it holds: the cgroup v2 guest under
    // software emulation took 131 s at a load of 4–5 and ran out of 240 s at a load of 7
    let deadline = Instant::now() + Duration::from_secs(480);
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

/// Waits until `node`'s agent reports its kubelet's feature gates (read from the kubelet's
/// `/metrics` over TLS, verified against the cluster CA or the kubelet's own certificate) without
/// an error; returns how many gates it reported.
pub async fn wait_for_kubelet_gates(client: &Client, node: &str) -> Result<usize> {
    let reports: Api<nodewarden_api::features::NodeFeatureReport> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let kubelet = reports
            .get_opt(node)
            .await?
            .and_then(|r| r.spec.components.into_iter().find(|c| c.name == "kubelet"));
        match &kubelet {
            Some(c) if c.error.is_none() && !c.gates.is_empty() => return Ok(c.gates.len()),
            _ if Instant::now() > deadline => {
                bail!("the agent on {node} did not report its kubelet's gates within 90 s: {kubelet:?}")
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// A CPU quantity in millicores (`None` when absent), by the shared quantity codec.
pub fn cpu_milli(q: Option<&Quantity>) -> Result<Option<u64>> {
    amount_of(ResourceName::Cpu, q)
}

/// A memory quantity in bytes (`None` when absent), by the shared quantity codec.
pub fn memory_bytes(q: Option<&Quantity>) -> Result<Option<u64>> {
    amount_of(ResourceName::Memory, q)
}

fn amount_of(resource: ResourceName, q: Option<&Quantity>) -> Result<Option<u64>> {
    q.map(|q| amount(resource, q).ok_or_else(|| anyhow!("{:?} is not a {resource:?} quantity", q.0)))
        .transpose()
}

/// The shipper container's (cpu, memory) requests.
pub fn container_requests(pod: &Pod) -> Result<(u64, u64)> {
    let r = container_resources(pod, |r| r.requests.clone());
    Ok((
        cpu_milli(r.get("cpu"))?.context("a cpu request")?,
        memory_bytes(r.get("memory"))?.context("a memory request")?,
    ))
}

/// The shipper container's (cpu, memory) limits.
pub fn container_limits(pod: &Pod) -> Result<(Option<u64>, Option<u64>)> {
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
pub async fn running_pods(client: &Client, namespace: &str, selector: &str) -> Result<Vec<String>> {
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

/// A short account of the namespace's pods, for failure messages: a line each with its node,
/// phase and conditions, then a line per container with its readiness, restarts, state and the
/// reason and exit code of its last end (an OOM kill, a crash, an eviction show there).
pub async fn describe_pods(client: &Client, namespace: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods.list(&ListParams::default()).await {
        Ok(list) => list.items.iter().map(describe_pod).collect::<Vec<_>>().join("\n"),
        Err(e) => format!("(listing pods in {namespace}: {e})"),
    }
}

fn describe_pod(p: &Pod) -> String {
    use k8s_openapi::api::core::v1::ContainerState;
    let status = p.status.clone().unwrap_or_default();
    let state = |s: Option<&ContainerState>| -> String {
        let Some(s) = s else { return "-".into() };
        if let Some(t) = &s.terminated {
            format!(
                "terminated({} exit {}{})",
                t.reason.as_deref().unwrap_or("?"),
                t.exit_code,
                t.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
            )
        } else if let Some(w) = &s.waiting {
            format!("waiting({})", w.reason.as_deref().unwrap_or("?"))
        } else if s.running.is_some() {
            "running".into()
        } else {
            "-".into()
        }
    };
    let conditions: Vec<String> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    let mut out = format!(
        "{} on {}: {}{} [{}]",
        p.name_any(),
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("(unbound)"),
        status.phase.as_deref().unwrap_or("?"),
        status
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        conditions.join(" ")
    );
    for c in status.container_statuses.iter().flatten() {
        out.push_str(&format!(
            "\n  {}: ready={} restarts={} now {} last {}",
            c.name,
            c.ready,
            c.restart_count,
            state(c.state.as_ref()),
            state(c.last_state.as_ref())
        ));
    }
    out
}
