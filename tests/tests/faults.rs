//! Faults, end to end on a real control plane of each test's own (one at a time: one kills
//! its API server, another restarts it with a flag more):
//!
//! 1. kube-apiserver killed (SIGKILL) and started again on the same port and etcd while an
//!    in-process webhook serves and two in-process agents publish: readiness during the outage,
//!    nothing an agent computed is lost, the webhook's caches catch up;
//! 2. one of two webhook replicas (the real binary, behind a Service with an EndpointSlice each)
//!    killed in the middle of a burst of pod creations: no creation fails;
//! 3. the webhook's managed CA rotated (short lifetimes) in the middle of a burst of reviews:
//!    no review fails;
//! 4. the real agent binary killed (SIGKILL) while it writes its checkpoint, again and again:
//!    the history resumes and no temporary file is left once it saved again.
//!
//! The figures are in docs/server.md, "Faults".

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodewarden_api::rightsizing::{DaemonSetAutoscaler, NodeRecommendation};
use nodewarden_api::{ClusterClaim, ClusterClaimSpec};
use nodewarden_certs::ServingSpec;
use nodewarden_tests::process::{free_port, free_ports, host_address, write_file};
use nodewarden_tests::webhooks::ServiceEndpoint;
use nodewarden_tests::{
    ControlPlane, Hook, InProcessWebhook, LoopbackEndpoint, apply_crds, cgroupfs, chart_crd_files,
    create_namespace, create_ready_node, http_get, read_crds, register_mutating_webhooks,
    register_validating_webhooks, unique_name, wait_for_daemonset_pods,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1024 * 1024;
const GROUP_LABEL: &str = "e2e.nodewarden.io/group";

/// One control plane at a time in this test binary (each test has its own, as it breaks it).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A control plane of the test's own, with the chart's CRDs and a namespace.
struct Faults {
    cp: ControlPlane,
    client: Client,
    ns: String,
    id: String,
}

impl Faults {
    async fn start(test: &str) -> Result<Self> {
        let cp = ControlPlane::start().await?;
        let client = cp.admin_client().await?;
        apply_crds(&cp, &client, &read_crds(&chart_crd_files()?)?).await?;
        let id = unique_name(test);
        create_namespace(&cp, &client, &id).await?;
        Ok(Self {
            cp,
            client,
            ns: id.clone(),
            id,
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// Runs `body` on a control plane of its own, after any other test of this binary; an error
/// fails the test with the control plane's log tails.
async fn with_faults<F, Fut>(test: &str, body: F)
where
    F: FnOnce(Arc<Faults>) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let faults = match Faults::start(test).await {
        Ok(f) => Arc::new(f),
        Err(e) => panic!("{test}: setting up: {e:#}"),
    };
    if let Err(e) = body(faults.clone()).await {
        eprintln!(
            "nodewarden-tests: {test} failed; control plane logs ({}):\n{}",
            faults.cp.dir().display(),
            faults.cp.log_tails(40)
        );
        panic!("{test}: {e:#}");
    }
}

/// Container ID of the autoscaled container, as a runtime reports it.
fn container_id() -> String {
    format!("fa17{:060x}", 1)
}

/// A DaemonSet `workload` over the `nodes` (labelled with the test's group) with an autoscaler;
/// each node's pod bound to it and running, as a kubelet would report. Returns the pod UIDs by node.
async fn autoscaled_pods(f: &Faults, nodes: &[String]) -> Result<BTreeMap<String, String>> {
    let selector = BTreeMap::from([(GROUP_LABEL.to_string(), f.id.clone())]);
    let ds = nodewarden_tests::simple_daemonset("workload", &selector)?;
    f.api::<DaemonSet>().create(&PostParams::default(), &ds).await?;
    let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "workload"},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "workload"}}
    }))?;
    f.api::<DaemonSetAutoscaler>()
        .create(&PostParams::default(), &dsa)
        .await?;
    let pods = wait_for_daemonset_pods(&f.cp, &f.client, &f.ns, "workload", nodes).await?;
    let api = f.api::<Pod>();
    let mut uids = BTreeMap::new();
    for (node, pod) in pods {
        let name = pod.name_any();
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        api.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding {name} to {node}"))?;
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Running", "startTime": "2026-11-21T07:00:00Z",
                "containerStatuses": [{"name": "agent", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
                    "containerID": format!("containerd://{}", container_id())}],
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T07:00:01Z"}]
            }})),
        )
        .await?;
        uids.insert(node, pod.uid().ok_or_else(|| anyhow!("pod without uid"))?);
    }
    Ok(uids)
}

/// Ready fake Nodes `<id>-node-<i>` in the test's group.
async fn nodes(f: &Faults, count: usize) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("{}-node-{i}", f.id);
        let labels = BTreeMap::from([
            (GROUP_LABEL.to_string(), f.id.clone()),
            ("kubernetes.io/hostname".to_string(), name.clone()),
        ]);
        create_ready_node(&f.cp, &f.client, &name, labels).await?;
        names.push(name);
    }
    Ok(names)
}

/// Writes the autoscaled container's cgroup under `root`: CPU standing still, `memory` in use.
fn write_cgroup(root: &Path, pod_uid: &str, memory: u64) -> Result<()> {
    cgroupfs::write_root(root)?;
    cgroupfs::write_container(
        &cgroupfs::container_scope(root, pod_uid, &container_id()),
        5_000_000,
        memory,
    )
}

/// The memory target of `node`'s recommendation as the API server holds it.
async fn published_memory(recs: &Api<NodeRecommendation>, node: &str) -> Result<Option<String>> {
    Ok(recs.get_opt(node).await?.and_then(|r| {
        r.spec
            .recommendations
            .first()
            .and_then(|c| c.target.as_ref())
            .and_then(|t| t.get("memory"))
            .map(|q| q.0.clone())
    }))
}

/// The memory target an agent computed last, from its `/metrics`.
async fn computed_memory(admin_port: u16) -> Result<Option<f64>> {
    let (_, text) = http_get(admin_port, "/metrics").await?;
    Ok(text
        .lines()
        .find(|l| {
            l.starts_with("nodewarden_agent_recommendation_target{") && l.contains("resource=\"memory\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok()))
}

/// A pod of DaemonSet `ds` (controller reference `ds_uid`) on `node`, with the template's requests.
fn daemonset_pod(name: &str, ds: &str, ds_uid: &str, node: &str, container: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"e2e.nodewarden.io/burst": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds, "uid": ds_uid,
                                 "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": node, "containers": [{"name": container, "image": "nodewarden-e2e/pause:never-pulled",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}}]}
    }))?)
}

fn memory_request(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// A serving certificate pair in a new folder, from the cluster CA.
fn serving_files(cp: &ControlPlane, spec: &ServingSpec) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let cert = cp.ca().issue_serving(spec)?;
    write_file(&dir.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
    write_file(&dir.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
    Ok(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_killed_and_restarted_while_the_webhook_serves_and_agents_publish() {
    with_faults("fault-apiserver", |f| async move {
        let cp = &f.cp;
        let nodes = nodes(&f, 2).await?;
        let uids = autoscaled_pods(&f, &nodes).await?;
        let ds_uid = f.api::<DaemonSet>().get("workload").await?.uid().unwrap_or_default();

        // the webhook, in this process, on loopback
        let ports = free_ports(2)?;
        let certs = serving_files(
            cp,
            &ServingSpec {
                dns_names: vec!["localhost".into()],
                ip_addresses: vec![IpAddr::from([127, 0, 0, 1])],
                validity: Duration::from_secs(3600),
            },
        )?;
        let args = vec![
            format!("--listen-addr=127.0.0.1:{}", ports[0]),
            format!("--admin-addr=127.0.0.1:{}", ports[1]),
            format!("--tls-cert-file={}", certs.path().join("tls.crt").display()),
            format!("--tls-key-file={}", certs.path().join("tls.key").display()),
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            format!("--namespace={}", f.ns),
            "--pod-name=faults-webhook".to_string(),
            "--log-format=text".to_string(),
            "--log-level=warn".to_string(),
            "--shutdown-grace=2s".to_string(),
        ];
        let webhook = InProcessWebhook::start(&args, ports[1]).await?;
        let hook = Hook::pods().only_namespace(&f.ns).timeout_seconds(10);
        let endpoint = LoopbackEndpoint {
            port: ports[0],
            ca_pem: cp.ca_pem().to_string(),
        };
        register_mutating_webhooks(&f.client, &format!("nw-pods-{}", f.id), &endpoint, &[hook]).await?;

        // two agents in this process, each with its node's cgroups: 300 MiB in use
        let stop = CancellationToken::new();
        let tmp = tempfile::tempdir()?;
        let mut agents = Vec::new();
        for node in &nodes {
            let root = tmp.path().join(node).join("cgroup");
            write_cgroup(&root, &uids[node], 300 * MIB)?;
            let admin = free_port()?;
            let checkpoints = tmp.path().join(node).join("checkpoint");
            let admin_addr = format!("127.0.0.1:{admin}");
            let config = nodewarden_agent::config::Config::try_from_args([
                "nodewarden-agent",
                "--node-name",
                node,
                "--cgroup-root",
                root.to_str().unwrap_or_default(),
                "--checkpoint-dir",
                checkpoints.to_str().unwrap_or_default(),
                "--admin-addr",
                &admin_addr,
                "--sample-interval",
                "200ms",
                "--min-publish-interval",
                "1s",
                "--publish-budget",
                "1s",
                "--log-format",
                "text",
            ])?;
            let client = cp.admin_client().await?;
            let task = tokio::spawn(nodewarden_agent::run_with_client(config, client, stop.clone()));
            agents.push((node.clone(), root, admin, task));
        }
        let recs: Api<NodeRecommendation> = Api::all(f.client.clone());
        for node in &nodes {
            cp.poll(&format!("NodeRecommendation/{node}"), || async {
                published_memory(&recs, node).await
            })
            .await?;
        }
        // a pod review uses node 0's figures (once the API server has loaded the registration
        // and the webhook's index has the recommendation)
        let pods = f.api::<Pod>();
        let probe = daemonset_pod("probe-0", "workload", &ds_uid, &nodes[0], "agent")?;
        cp.poll(&format!("before the fault, a pod review on {} using its figures", nodes[0]), || async {
            let got = pods.create(&dry_run(), &probe).await?;
            let want = published_memory(&recs, &nodes[0]).await?;
            Ok((Some(memory_request(&got)) == want).then_some(()))
        })
        .await?;
        ensure!(http_get(ports[1], "/readyz").await?.0 == 200, "webhook not ready before the fault");

        // the fault: kube-apiserver killed; meanwhile the workloads grow to 900 MiB
        let apiserver_args = cp.kill_apiserver()?;
        let outage = Instant::now();
        for (node, root, _, _) in &agents {
            write_cgroup(root, &uids[node], 900 * MIB)?;
        }
        let mut readiness = BTreeMap::<String, usize>::new();
        let mut computed = BTreeMap::new();
        // the agents compute their new targets while nothing can be written; readiness is
        // sampled all along, and for a few seconds more once the watches have failed
        let deadline = Instant::now() + Duration::from_secs(120);
        while computed.len() < agents.len() || outage.elapsed() < Duration::from_secs(10) {
            ensure!(Instant::now() < deadline, "agents never computed their new targets");
            let (status, body) = http_get(ports[1], "/readyz").await?;
            *readiness.entry(format!("{status} {}", body.trim())).or_default() += 1;
            for (node, _, admin, _) in &agents {
                if let Some(m) = computed_memory(*admin).await?
                    && m > (800 * MIB) as f64
                {
                    computed.insert(node.clone(), m);
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let down_for = outage.elapsed();
        cp.start_apiserver(&apiserver_args).await?;
        eprintln!(
            "faults: kube-apiserver down {:.1}s; webhook /readyz during the outage: {readiness:?}; agents computed {computed:?}",
            down_for.as_secs_f64()
        );
        // Readiness follows the caches' first sync and the certificates, not the health of
        // the watches: during the outage the webhook keeps answering from its last-known
        // caches (docs/server.md, "Faults").
        ensure!(
            readiness.keys().all(|k| k.starts_with("200")),
            "webhook readiness during the outage: {readiness:?}"
        );
        cp.poll("webhook /readyz after the restart", || async {
            Ok((http_get(ports[1], "/readyz").await?.0 == 200).then_some(()))
        })
        .await?;

        // nothing lost: what each agent computed last is what the API server holds
        for (node, _, admin, _) in &agents {
            let held = cp
                .poll(&format!("NodeRecommendation/{node} with the figures computed during the outage"), || async {
                    let Some(m) = computed_memory(*admin).await? else {
                        return Ok(None);
                    };
                    Ok(published_memory(&recs, node)
                        .await?
                        .filter(|p| p.parse::<f64>().is_ok_and(|p| (p - m).abs() <= 1.0)))
                })
                .await?;
            eprintln!("faults: {node}: the API server holds {held} bytes, the agent computed it");
        }
        // the webhook's caches catch up: a pod review on each node uses its new figures
        for (i, node) in nodes.iter().enumerate() {
            let want = published_memory(&recs, node).await?.unwrap_or_default();
            let pod = daemonset_pod(&format!("probe-{i}"), "workload", &ds_uid, node, "agent")?;
            cp.poll(&format!("a pod review on {node} using {want}"), || async {
                let got = pods.create(&dry_run(), &pod).await?;
                Ok((memory_request(&got) == want).then_some(()))
            })
            .await?;
        }

        stop.cancel();
        for (node, _, _, task) in agents {
            task.await?.with_context(|| format!("the agent of {node}"))?;
        }
        webhook.stop().await?;
        Ok(())
    })
    .await;
}

/// The binary `bin` of workspace package `package`, built by cargo with this test's profile
/// into this test's target folder (cargo does nothing when it is up to date).
fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // <target>/<profile folder>/deps/faults-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| anyhow!("{} is not in <target>/<profile>/deps", exe.display()))?;
    let target = profile_dir
        .parent()
        .ok_or_else(|| anyhow!("no target folder above {}", profile_dir.display()))?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            "--bin",
            bin,
            "--profile",
            &profile,
            "--target-dir",
        ])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .with_context(|| format!("running cargo build -p {package}"))?;
    ensure!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed ({status})"
    );
    let path = profile_dir.join(bin);
    ensure!(path.is_file(), "{} missing after cargo build", path.display());
    Ok(path)
}

/// A `nodewarden-webhook` process of the control plane (its log `<name>.log` in its folder).
struct Replica {
    name: String,
    port: u16,
    admin: u16,
}

impl Replica {
    async fn start(f: &Faults, bin: &Path, name: &str, address: &str, certs: &Path) -> Result<Self> {
        let [port, admin]: [u16; 2] = free_ports(2)?.try_into().map_err(|_| anyhow!("two ports"))?;
        let args = [
            format!("--listen-addr={address}:{port}"),
            format!("--admin-addr=127.0.0.1:{admin}"),
            format!("--tls-cert-file={}", certs.join("tls.crt").display()),
            format!("--tls-key-file={}", certs.join("tls.key").display()),
            format!("--kubeconfig={}", f.cp.kubeconfig_path().display()),
            format!("--namespace={}", f.ns),
            format!("--pod-name={name}"),
            "--log-format=text".to_string(),
        ];
        f.cp.spawn_program(name, bin, &args)?;
        f.cp.poll(&format!("{name} /readyz"), || async {
            Ok(matches!(http_get(admin, "/readyz").await, Ok((200, _))).then_some(()))
        })
        .await?;
        Ok(Self {
            name: name.to_string(),
            port,
            admin,
        })
    }

    /// Pod reviews this replica has answered (its `/metrics`).
    async fn reviews(&self) -> Result<u64> {
        let (_, text) = http_get(self.admin, "/metrics").await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("nodewarden_admission_requests_total{") && l.contains("/mutate/pods"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }
}

/// An EndpointSlice of Service `nodewarden-webhook` with one endpoint, `address:port`.
async fn endpoint_slice(f: &Faults, name: &str, address: &str, port: u16, ready: bool) -> Result<()> {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/service-name": "nodewarden-webhook",
            "endpointslice.kubernetes.io/managed-by": "e2e.nodewarden.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": ready}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }))?;
    f.api::<EndpointSlice>()
        .patch(
            name,
            &PatchParams::apply("e2e.nodewarden.io").force(),
            &Patch::Apply(&slice),
        )
        .await?;
    Ok(())
}

/// What a burst of pod creations came to.
#[derive(Debug, Default)]
struct Burst {
    created: usize,
    failed: Vec<String>,
    /// Created with the node's figures (the webhook patched them).
    patched: usize,
    /// Created as the template says (the failure policy `Ignore` let them through).
    unpatched: usize,
}

/// Pods of DaemonSet `burst` on one node, and the memory request its figures give them.
#[derive(Clone)]
struct BurstPods {
    pods: Api<Pod>,
    ds_uid: String,
    node: String,
    want_memory: String,
}

/// Creates `count` pods named `<prefix>-<i>`, `parallel` at a time; `done` counts the finished
/// creations as they finish.
async fn pod_burst(
    target: &BurstPods,
    prefix: &str,
    count: usize,
    parallel: usize,
    done: Arc<AtomicUsize>,
) -> Result<Burst> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel {
        let (target, next, done) = (target.clone(), next.clone(), done.clone());
        let prefix = prefix.to_string();
        workers.spawn(async move {
            let mut burst = Burst::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(burst);
                }
                let name = format!("{prefix}-{i}");
                let pod = daemonset_pod(&name, "burst", &target.ds_uid, &target.node, "app")?;
                match target.pods.create(&PostParams::default(), &pod).await {
                    Ok(got) => {
                        burst.created += 1;
                        if memory_request(&got) == target.want_memory {
                            burst.patched += 1;
                        } else {
                            burst.unpatched += 1;
                        }
                    }
                    Err(e) => burst.failed.push(format!("{name}: {e}")),
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut total = Burst::default();
    while let Some(b) = workers.join_next().await {
        let b = b??;
        total.created += b.created;
        total.patched += b.patched;
        total.unpatched += b.unpatched;
        total.failed.extend(b.failed);
    }
    Ok(total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_webhook_replica_killed_in_the_middle_of_a_burst_of_pod_creations() {
    with_faults("fault-replica", |f| async move {
        let cp = &f.cp;
        let address = host_address()?;
        let bin = workspace_binary("nodewarden-webhook", "nodewarden-webhook")?;
        // The API server calls a Service's webhook at its endpoints only with aggregator
        // routing (a real node's control plane runs with it): start it again with that flag.
        let mut args = cp.kill_apiserver()?;
        args.push("--enable-aggregator-routing=true".to_string());
        cp.start_apiserver(&args).await?;

        // the autoscaled DaemonSet (its own pods go nowhere: no node matches) and a node's figures
        let none = BTreeMap::from([(GROUP_LABEL.to_string(), format!("{}-none", f.id))]);
        let ds = f
            .api::<DaemonSet>()
            .create(&PostParams::default(), &nodewarden_tests::simple_daemonset("burst", &none)?)
            .await?;
        let ds_uid = ds.uid().unwrap_or_default();
        let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
            "metadata": {"name": "burst"}, "spec": {"targetRef": {"kind": "DaemonSet", "name": "burst"}}
        }))?;
        f.api::<DaemonSetAutoscaler>().create(&PostParams::default(), &dsa).await?;
        let node = format!("{}-node", f.id);
        let rec: NodeRecommendation = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1", "kind": "NodeRecommendation", "metadata": {"name": node},
            "spec": {"recommendations": [{"autoscaler": {"namespace": f.ns, "name": "burst"}, "containerName": "app",
                     "target": {"cpu": "250m", "memory": "300Mi"}, "sampleCount": 1440}]}
        }))?;
        Api::<NodeRecommendation>::all(f.client.clone()).create(&PostParams::default(), &rec).await?;

        // two replicas behind Service nodewarden-webhook, one EndpointSlice each
        let service = format!("nodewarden-webhook.{}.svc", f.ns);
        let certs = serving_files(
            cp,
            &ServingSpec { dns_names: vec![service], ip_addresses: vec![], validity: Duration::from_secs(3600) },
        )?;
        let replicas = [
            Replica::start(&f, &bin, "replica-a", &address, certs.path()).await?,
            Replica::start(&f, &bin, "replica-b", &address, certs.path()).await?,
        ];
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "nodewarden-webhook"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}
        }))?;
        f.api::<Service>().create(&PostParams::default(), &svc).await?;
        for r in &replicas {
            endpoint_slice(&f, &r.name, &address, r.port, true).await?;
        }
        // the chart's pod hook (`Ignore`: a pod is never refused for want of the webhook), with
        // the 10 s timeout this test has always given it
        let behind_the_service = ServiceEndpoint {
            namespace: f.ns.clone(),
            name: "nodewarden-webhook".to_string(),
            port: 443,
            ca_pem: cp.ca_pem().to_string(),
        };
        register_mutating_webhooks(
            &f.client,
            &format!("nw-pods-{}", f.id),
            &behind_the_service,
            &[Hook::pods().only_namespace(&f.ns).timeout_seconds(10)],
        )
        .await?;

        // The API server resolves the Service each time it opens a connection, and keeps it: a
        // replica answers the requests sent over the connections that landed on it.
        let pods = f.api::<Pod>();
        let probe = daemonset_pod("probe", "burst", &ds_uid, &node, "app")?;
        cp.poll("a replica answering pod reviews through the Service", || async {
            let got = pods.create(&dry_run(), &probe).await?;
            Ok((memory_request(&got) == "300Mi").then_some(()))
        })
        .await?;
        let answered = || async {
            let mut counts = Vec::new();
            for r in &replicas {
                counts.push(r.reviews().await?);
            }
            Ok::<_, anyhow::Error>(counts)
        };

        const BURST: usize = 200;
        let done = Arc::new(AtomicUsize::new(0));
        let target = BurstPods {
            pods: pods.clone(),
            ds_uid: ds_uid.clone(),
            node: node.clone(),
            want_memory: "300Mi".to_string(),
        };
        let before = answered().await?;
        let burst = tokio::spawn({
            let (target, done) = (target.clone(), done.clone());
            async move { pod_burst(&target, "burst", BURST, 8, done).await }
        });
        // (watched closely: the burst may take only a few seconds)
        let deadline = Instant::now() + Duration::from_secs(120);
        while done.load(Ordering::Relaxed) < BURST / 4 {
            ensure!(Instant::now() < deadline, "a quarter of the burst took two minutes");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // the replica that has answered most of the burst so far is killed, with SIGKILL, as the
        // OOM killer or a failed node would
        let at_kill = answered().await?;
        let share: Vec<u64> = at_kill.iter().zip(&before).map(|(n, b)| n - b).collect();
        let busy = if share[0] >= share[1] { 0 } else { 1 };
        let (killed, survivor) = (replicas[busy].name.clone(), replicas[1 - busy].name.clone());
        cp.kill_program(&killed)?;
        let killed_at = done.load(Ordering::Relaxed);
        let during = burst.await??;
        let took_over = replicas[1 - busy].reviews().await? - at_kill[1 - busy];
        eprintln!(
            "faults: {killed} killed after {killed_at} of {BURST} creations (reviews of the burst so far: \
             {killed} {}, {survivor} {}); {survivor} answered {took_over} more; the burst: {during:?}",
            share[busy],
            share[1 - busy]
        );
        ensure!(during.failed.is_empty(), "pod creations failed: {:?}", during.failed);
        ensure!(during.created == BURST, "{during:?}");
        ensure!(took_over > 0, "{survivor} never took over");

        // the killed replica's pod goes NotReady, and its endpoint with it (what the EndpointSlice
        // controller does): from then on every pod gets its node's figures
        endpoint_slice(&f, &killed, &address, replicas[busy].port, false).await?;
        let after = pod_burst(&target, "after", 100, 8, Arc::default()).await?;
        eprintln!("faults: after {killed}'s endpoint is not ready: {after:?}");
        ensure!(after.failed.is_empty() && after.created == 100, "{after:?}");
        // the API server's endpoint cache may lag the EndpointSlice by a moment
        ensure!(
            after.unpatched <= 8,
            "pods created without their figures after the endpoint left: {after:?}"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_rotation_in_the_middle_of_a_burst_of_reviews() {
    with_faults("fault-ca-rotation", |f| async move {
        let cp = &f.cp;
        let ports = free_ports(2)?;
        let config_name = format!("nw-claims-{}", f.id);
        const LABEL: &str = "e2e.nodewarden.io/test";
        // registered as the chart does in managed mode: no caBundle
        let hook = Hook::claims()
            .only_group("nodewarden.io")
            .operations(&["CREATE", "UPDATE"])
            .only_labelled(LABEL, &f.id);
        let endpoint = LoopbackEndpoint {
            port: ports[0],
            ca_pem: String::new(),
        };
        register_validating_webhooks(&f.client, &config_name, &endpoint, &[hook]).await?;

        // Managed certificates with lifetimes of a minute: a new CA is staged 15 s into each
        // CA's life, served 5 s later, and the old one leaves the bundle when it expires.
        let missing = cp.dir().join("no-certificate-files");
        let args: Vec<String> = vec![
            format!("--listen-addr=127.0.0.1:{}", ports[0]),
            format!("--admin-addr=127.0.0.1:{}", ports[1]),
            format!("--tls-cert-file={}", missing.join("tls.crt").display()),
            format!("--tls-key-file={}", missing.join("tls.key").display()),
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            format!("--namespace={}", f.ns),
            "--pod-name=faults-certs".to_string(),
            "--cert-mode=managed".to_string(),
            "--cert-secret=nodewarden-webhook-tls".to_string(),
            "--cert-service=nodewarden-webhook".to_string(),
            "--cert-ip-addresses=127.0.0.1".to_string(),
            format!("--webhook-configurations={config_name}"),
            "--cert-ca-validity=60s".to_string(),
            "--cert-ca-renew-before=45s".to_string(),
            "--cert-validity=60s".to_string(),
            "--cert-renew-before=30s".to_string(),
            "--cert-ca-propagation=5s".to_string(),
            "--cert-check-interval=1s".to_string(),
            "--log-format=text".to_string(),
            "--log-level=warn".to_string(),
            "--shutdown-grace=2s".to_string(),
        ];
        let webhook = InProcessWebhook::start(&args, ports[1]).await?;

        let claims: Api<ClusterClaim> = Api::all(f.client.clone());
        let claim = |name: &str, value: &str| {
            let mut c = ClusterClaim::new(
                name,
                ClusterClaimSpec {
                    value: value.to_string(),
                },
            );
            c.metadata.labels = Some(BTreeMap::from([(LABEL.to_string(), f.id.clone())]));
            c
        };
        // A review the webhook answers: an ID claim that is not a DNS label is denied by it
        // (anything else, an error calling it included, is a failed review).
        let bad = claim("cluster.clusterset.k8s.io", "Not_A_Label");
        let denied_by_webhook = |r: &kube::Result<ClusterClaim>| {
            matches!(r, Err(kube::Error::Api(s)) if s.message.contains("claims.nodewarden.io") && s.message.contains("RFC 1123"))
        };
        cp.poll("the webhook answering through the injected caBundle", || async {
            Ok(denied_by_webhook(&claims.create(&dry_run(), &bad).await).then_some(()))
        })
        .await?;

        let secrets: Api<Secret> = f.api();
        let served = || async {
            let s = secrets.get("nodewarden-webhook-tls").await?;
            let c = nodewarden_certs::read_tls_secret(&s)?;
            Ok::<_, anyhow::Error>((c.ca.cert_pem.clone(), c.serving.cert_pem.clone()))
        };
        let (first_ca, first_serving) = served().await?;

        // the burst: four clients, half the reviews allowed, half denied, until two rotations
        let stop = CancellationToken::new();
        let mut workers = tokio::task::JoinSet::new();
        for w in 0..4 {
            let (claims, stop) = (claims.clone(), stop.clone());
            let (good, bad) = (claim(&format!("zone.w{w}.{}.example", f.id), "eu-1"), bad.clone());
            workers.spawn(async move {
                let (mut reviews, mut failed) = (0usize, Vec::new());
                while !stop.is_cancelled() {
                    let allowed = claims.create(&dry_run(), &good).await;
                    if let Err(e) = allowed {
                        failed.push(format!("allowed claim: {e}"));
                    }
                    let denied = claims.create(&dry_run(), &bad).await;
                    if !denied_by_webhook(&denied) {
                        failed.push(format!("denied claim: {denied:?}"));
                    }
                    reviews += 2;
                }
                (reviews, failed)
            });
        }
        let started = Instant::now();
        let mut cas = vec![first_ca.clone()];
        let mut servings = vec![first_serving.clone()];
        let deadline = started + Duration::from_secs(180);
        // two serving certificates from new CAs, and a few seconds of reviews after the last
        while servings.len() < 3 {
            ensure!(Instant::now() < deadline, "no two rotations in three minutes: {} CAs", cas.len());
            let (ca, serving) = served().await?;
            if !cas.contains(&ca) {
                cas.push(ca);
            }
            if !servings.contains(&serving) {
                servings.push(serving);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.cancel();
        let (mut reviews, mut failed) = (0, Vec::new());
        while let Some(w) = workers.join_next().await {
            let (r, f) = w?;
            reviews += r;
            failed.extend(f);
        }
        eprintln!(
            "faults: {reviews} reviews in {:.0}s through {} CAs and {} serving certificates; failed: {}",
            started.elapsed().as_secs_f64(),
            cas.len(),
            servings.len(),
            failed.len()
        );
        ensure!(failed.is_empty(), "{} of {reviews} reviews failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
        ensure!(cas.len() >= 3, "the CA was not rotated twice: {} CAs", cas.len());
        webhook.stop().await?;
        Ok(())
    })
    .await;
}

/// Samples behind the recommendation (every container summed) and the first sample's time.
fn history_of(rec: &NodeRecommendation) -> (i64, Option<String>) {
    let count = rec.spec.recommendations.iter().map(|c| c.sample_count).sum();
    let first = rec
        .spec
        .recommendations
        .first()
        .and_then(|c| c.first_sample_time.as_ref())
        .map(|t| t.0.to_string());
    (count, first)
}

/// Samples in a checkpoint file (every history summed); fails when the file is not a whole
/// checkpoint.
fn checkpoint_samples(file: &Path) -> Result<u64> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let c: nodewarden_agent::rightsizing::checkpoint::Checkpoint = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a whole checkpoint", file.display()))?;
    Ok(c.entries.iter().map(|e| e.history.sample_count).sum())
}

/// The files in `dir`, sorted.
fn files_in(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_during_checkpoint_writes_resumes_its_history() {
    with_faults("fault-checkpoint", |f| async move {
        let cp = &f.cp;
        let node = nodes(&f, 1).await?.remove(0);
        let uid = autoscaled_pods(&f, std::slice::from_ref(&node)).await?.remove(&node).unwrap_or_default();
        let bin = workspace_binary("nodewarden-agent", "nodewarden-agent")?;
        let tmp = tempfile::tempdir()?;
        let cgroup = tmp.path().join("cgroup");
        write_cgroup(&cgroup, &uid, 300 * MIB)?;
        let checkpoints = tmp.path().join("checkpoint");
        let file = nodewarden_agent::rightsizing::checkpoint::path(&checkpoints, &node);
        // the real binary, as a process of the control plane (`agent.log` in its folder):
        // samples and checkpoints every 100 ms, publishes at least every second
        let start = || -> Result<u32> {
            let mut args: Vec<String> = vec![
                "-i".into(),
                format!("KUBECONFIG={}", cp.kubeconfig_path().display()),
                bin.display().to_string(),
                format!("--node-name={node}"),
                format!("--admin-addr=127.0.0.1:{}", free_port()?),
                format!("--cgroup-root={}", cgroup.display()),
                format!("--checkpoint-dir={}", checkpoints.display()),
            ];
            args.extend(
                [
                    "--sample-interval=100ms",
                    "--checkpoint-interval=100ms",
                    "--min-publish-interval=200ms",
                    "--publish-budget=200ms",
                    "--refresh-interval=1s",
                    "--log-format=text",
                ]
                .map(String::from),
            );
            // `env` clears the environment and then becomes the agent (same pid)
            cp.spawn_program("agent", Path::new("env"), &args)
        };
        let recs: Api<NodeRecommendation> = Api::all(f.client.clone());
        // published by a process that started at `since`, with at least `samples` behind it
        let published_since = |since: k8s_openapi::jiff::Timestamp, samples: i64| {
            let (recs, node) = (recs.clone(), node.clone());
            async move {
                let rec = recs.get_opt(&node).await?;
                Ok(rec.filter(|r| {
                    let last = r.spec.recommendations.first().and_then(|c| c.last_sample_time.as_ref());
                    last.is_some_and(|t| t.0 > since) && history_of(r).0 >= samples
                }))
            }
        };

        let mut first_sample = None;
        let mut resumed_from = 0u64;
        let (mut kills, mut in_write) = (0, 0);
        const KILLS: usize = 8;
        for round in 0..=KILLS {
            let since = k8s_openapi::jiff::Timestamp::now();
            let pid = start()?;
            // the history resumes: the first figures this process publishes stand on every
            // sample the last checkpoint held, and start where the first run started
            let rec = cp
                .poll(&format!("round {round}: a NodeRecommendation from the new process"), || {
                    published_since(since, 1)
                })
                .await?;
            let (count, first) = history_of(&rec);
            ensure!(
                count >= i64::try_from(resumed_from)?,
                "round {round}: {count} samples published after a restart from a checkpoint with {resumed_from}"
            );
            match &first_sample {
                None => first_sample = first,
                Some(was) => ensure!(
                    first.as_ref() == Some(was),
                    "round {round}: history restarted at {first:?} (it began at {was})"
                ),
            }
            if round == KILLS {
                // the next save after the last restart: only the checkpoint is in the folder
                let before = std::fs::metadata(&file)?.modified()?;
                cp.poll("a checkpoint written after the restart", || async {
                    Ok((std::fs::metadata(&file)?.modified()? > before).then_some(()))
                })
                .await?;
                // (a save of the running process may be under way as the folder is read)
                let own = format!(".tmp-{pid}");
                let mut left = files_in(&checkpoints)?;
                left.retain(|n| !n.ends_with(&own));
                let name = file.file_name().unwrap_or_default().to_string_lossy().into_owned();
                ensure!(
                    left == [name.clone()],
                    "after the restart and a save the checkpoint folder holds {left:?}"
                );
                // and a clean stop leaves only the checkpoint
                let stopper = f.clone();
                let exit = tokio::task::spawn_blocking(move || stopper.cp.stop_program("agent")).await??;
                ensure!(exit.success(), "the agent stopped with {exit}");
                let left = files_in(&checkpoints)?;
                ensure!(left == [name], "after a clean stop the checkpoint folder holds {left:?}");
                break;
            }
            // let a few more samples in, then kill it the moment a save has begun
            cp.poll(&format!("round {round}: more samples"), || published_since(since, count + 5))
                .await?;
            let tmp_name = format!(
                ".{}.tmp-{pid}",
                file.file_name().unwrap_or_default().to_string_lossy()
            );
            let (tmp_file, killer) = (checkpoints.join(&tmp_name), f.clone());
            let caught = tokio::task::spawn_blocking(move || {
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut caught = false;
                while Instant::now() < deadline {
                    if tmp_file.exists() {
                        caught = true;
                        break;
                    }
                    std::hint::spin_loop();
                }
                killer.cp.kill_program("agent").map(|_| caught)
            })
            .await??;
            kills += 1;
            // its temporary file left behind: the kill landed inside a save
            if caught && files_in(&checkpoints)?.contains(&tmp_name) {
                in_write += 1;
            }
            // whatever the moment, the checkpoint is a whole file: the last completed save
            resumed_from = checkpoint_samples(&file)?;
        }
        eprintln!(
            "faults: agent binary killed {kills} times, {in_write} of them inside a checkpoint save (temporary file left); \
             history kept: the last restart resumed from {resumed_from} samples, first sample {first_sample:?}"
        );
        ensure!(in_write > 0, "no kill landed inside a checkpoint save: the test did not test that");
        Ok(())
    })
    .await;
}
