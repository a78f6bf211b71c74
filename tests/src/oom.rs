//! A DaemonSet container OOM-killed in a loop on one node, and its rescue there (issue 43): the
//! real-node tests of both kinds (`realnode.rs` on this host's cgroup v1, `cgroupv2_node.rs` on
//! the cgroup v2 VM node) run it through [`rescue_an_oom_loop`].
//!
//! The DaemonSet `hog` requests 250 MiB of memory with a 300 MiB limit and holds 360 MiB on the
//! looping node (OOM-killed at each start: `CrashLoopBackOff`) and 16 MiB elsewhere, under an
//! autoscaler in `Recreate` mode for memory only, made before it (VPA users report that VPA
//! cannot rescue such pods: kubernetes/autoscaler issue 10141). The looping node's agent sees the
//! kill, raises that node's memory figure and evicts the pod at once (a kill soon after the
//! start; the pod, not Ready, needs no room in the DaemonSet's budget); the new pod gets the
//! raised request and a limit in proportion from the webhook and runs without a restart.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::shipper::{container_limits, container_requests};

/// The DaemonSet's (and its container's and autoscaler's) name.
pub const HOG: &str = "hog";
/// Its memory request and limit: the node's floor (250 MiB) as request, so that a node where it
/// fits sees no change; the limit below what it holds on the looping node.
pub const HOG_REQUEST_MIB: u64 = 250;
pub const HOG_LIMIT_MIB: u64 = 300;
/// What it holds: on the looping node more than its limit, elsewhere far less.
pub const HOG_LOOPING_MIB: u64 = 360;
pub const HOG_STEADY_MIB: u64 = 16;
/// How long the rescued container must then run without a restart.
const RESCUED_FOR: Duration = Duration::from_secs(20);
const RESCUE_TIMEOUT: Duration = Duration::from_secs(300);

/// Where the loop runs.
pub struct OomLoop<'a> {
    /// The namespace (it must exist).
    pub namespace: &'a str,
    /// The test image (`burn`), present on the nodes.
    pub image: &'a str,
    /// The node where the container holds more than its limit.
    pub looping: &'a str,
    /// A node where it fits, whose pod must be left as it is; `None`: the DaemonSet runs on the
    /// looping node only.
    pub steady: Option<&'a str>,
    /// Tolerations of the DaemonSet's pods (e.g. a virtual machine node's taint).
    pub tolerations: Value,
}

/// What the rescue took.
pub struct Rescue {
    /// The rescued pod, its container running.
    pub pod: Pod,
    /// OOM kills seen of the first pod's container.
    pub kills: usize,
    /// From the first kill's `finishedAt` to the rescued container's `startedAt`.
    pub took: Duration,
    /// The rescued pod's memory request and limit, bytes.
    pub memory: u64,
    pub limit: u64,
}

/// The hog's pod on `node`, if there is one.
async fn hog_on(pods: &Api<Pod>, node: &str) -> Result<Option<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("app={HOG}")))
        .await?
        .items
        .into_iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)))
}

/// The hog container's status in `pod`.
fn hog_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == HOG)
}

fn running(pod: &Pod) -> bool {
    hog_status(pod).is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// When the container's last run ended in an OOM kill: that kill's `finishedAt`.
fn last_oom_kill(pod: &Pod) -> Option<Timestamp> {
    hog_status(pod)
        .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
        .filter(|t| t.reason.as_deref() == Some("OOMKilled"))
        .and_then(|t| t.finished_at.as_ref())
        .map(|t| t.0)
}

/// The DaemonSet, its autoscaler first; the loop; its rescue; the rescued container running
/// for [`RESCUED_FOR`] without a restart; the steady node's pod (if any) as it was.
pub async fn rescue_an_oom_loop(client: &Client, setup: &OomLoop<'_>) -> Result<Rescue> {
    let node_selector = match setup.steady {
        Some(_) => json!({}),
        None => json!({"kubernetes.io/hostname": setup.looping}),
    };
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": HOG},
        "spec": {
            "selector": {"matchLabels": {"app": HOG}},
            "template": {
                "metadata": {"labels": {"app": HOG}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": node_selector,
                    "tolerations": setup.tolerations,
                    "containers": [{
                        "name": HOG,
                        "image": setup.image,
                        "imagePullPolicy": "Never",
                        "args": ["burn", "--cpu-millicores", "10", "--memory-mib", HOG_STEADY_MIB.to_string(),
                                 "--per-node", format!("{}=10:{HOG_LOOPING_MIB}", setup.looping)],
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "resources": {
                            "requests": {"cpu": "25m", "memory": format!("{HOG_REQUEST_MIB}Mi")},
                            "limits": {"memory": format!("{HOG_LIMIT_MIB}Mi")},
                        },
                    }],
                },
            },
        },
    }))?;
    // the user's autoscaler, there before the DaemonSet's pods: Recreate, memory only
    Api::<nodewarden_api::DaemonSetAutoscaler>::namespaced(client.clone(), setup.namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodewarden.io/v1alpha1",
                "kind": "DaemonSetAutoscaler",
                "metadata": {"name": HOG},
                "spec": {
                    "targetRef": {"kind": "DaemonSet", "name": HOG},
                    "updatePolicy": {"updateMode": "Recreate"},
                    "resourcePolicy": {"containerPolicies": [
                        {"containerName": "*", "controlledResources": ["memory"]},
                    ]},
                },
            }))?,
        )
        .await?;
    Api::<DaemonSet>::namespaced(client.clone(), setup.namespace)
        .create(&PostParams::default(), &daemonset)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), setup.namespace);

    // the loop: the first kill on the looping node, and the steady node's pod running
    let started = Instant::now();
    let (first, first_kill) = loop {
        if let Some(pod) = hog_on(&pods, setup.looping).await?
            && let Some(at) = last_oom_kill(&pod)
        {
            break (pod, at);
        }
        ensure!(
            started.elapsed() < RESCUE_TIMEOUT,
            "the hog on {} was not OOM-killed within {RESCUE_TIMEOUT:?}",
            setup.looping
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let before = match setup.steady {
        Some(node) => Some(wait_for_hog_running(&pods, node).await?),
        None => None,
    };
    eprintln!(
        "oom: the hog on {} OOM-killed at {first_kill} (holding {HOG_LOOPING_MIB} MiB under a {HOG_LIMIT_MIB} MiB limit)",
        setup.looping
    );

    // each kill of the first pod, until a pod of the looping node runs
    let mut kills = BTreeSet::from([first_kill]);
    let rescued = loop {
        if let Some(pod) = hog_on(&pods, setup.looping).await? {
            if pod.uid() == first.uid() {
                kills.extend(last_oom_kill(&pod));
            } else if running(&pod) {
                break pod;
            }
        }
        ensure!(
            started.elapsed() < RESCUE_TIMEOUT,
            "no new hog pod runs on {} {RESCUE_TIMEOUT:?} after the DaemonSet was made (kills seen: {})",
            setup.looping,
            kills.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (_, memory) = container_requests(&rescued)?;
    let (_, limit) = container_limits(&rescued)?;
    let limit = limit.context("the rescued pod keeps a memory limit")?;
    ensure!(
        memory > HOG_REQUEST_MIB << 20 && limit > HOG_LOOPING_MIB << 20,
        "the rescued pod requests {memory} B with a limit of {limit} B: not above what it holds ({HOG_LOOPING_MIB} MiB)"
    );
    let running_since = hog_status(&rescued)
        .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .context("the rescued container's start time")?
        .0;
    // and it stays up
    tokio::time::sleep(RESCUED_FOR).await;
    let now = pods.get(&rescued.name_any()).await?;
    let restarts = hog_status(&now).map_or(-1, |c| c.restart_count);
    ensure!(
        restarts == 0,
        "the rescued container restarted {restarts} times within {RESCUED_FOR:?}: {:?}",
        hog_status(&now).and_then(|c| c.last_state.clone())
    );

    // the steady node's pod is as it was
    if let (Some(node), Some(before)) = (setup.steady, before) {
        let after = hog_on(&pods, node)
            .await?
            .with_context(|| format!("the hog on {node} is gone"))?;
        ensure!(
            after.uid() == before.uid()
                && hog_status(&after).map(|c| c.restart_count) == Some(0)
                && container_requests(&after)? == container_requests(&before)?,
            "the hog on {node} changed: {:?} → {:?}",
            before.spec.as_ref().map(|s| &s.containers[0].resources),
            after.spec.as_ref().map(|s| &s.containers[0].resources)
        );
    }
    let took = running_since.duration_since(first_kill);
    Ok(Rescue {
        pod: rescued,
        kills: kills.len(),
        took: Duration::try_from(took).unwrap_or_default(),
        memory,
        limit,
    })
}

/// The hog's pod on `node` once its container runs.
async fn wait_for_hog_running(pods: &Api<Pod>, node: &str) -> Result<Pod> {
    let started = Instant::now();
    loop {
        if let Some(pod) = hog_on(pods, node).await?
            && running(&pod)
        {
            return Ok(pod);
        }
        ensure!(
            started.elapsed() < RESCUE_TIMEOUT,
            "the hog on {node} does not run after {RESCUE_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
