//! `cargo xtask demo`: nodewarden against a real control plane on this machine.
//!
//! Starts etcd, kube-apiserver and kube-controller-manager (built from their Go modules),
//! runs the real `nodewarden-webhook` binary against them on 127.0.0.1, registers its webhooks
//! with the API server, creates example objects and prints what happened. Everything it
//! started is stopped and removed at the end, also on failure. Where the machine allows it (Linux,
//! root), a last section runs two real nodes of this machine with a Prometheus scraping their
//! kubelets and a log shipper, prints `kubectl nodewarden report --prometheus` before anything of
//! nodewarden is installed, installs the chart with that Prometheus's URL, and shows each node's
//! agent publishing the report's figures at its start, then a re-created pod with its node's
//! figures and an in-place resize; the host is put back as it was afterwards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::{ClusterClaim, DaemonSetAutoscaler, NodeRecommendation};
use nodewarden_tests::{
    ControlPlane, Hook, Impersonate, LoopbackEndpoint, apply_crds, cgroupfs, chart_crd_files,
    create_ready_node, daemonset_pod_target_node, http_get, process, read_crds, register_mutating_webhooks,
    register_validating_webhooks, wait_for_daemonset_pods,
};
use serde_json::json;

#[path = "nodewarden-demo/features.rs"]
mod features;
#[path = "nodewarden-demo/realnode.rs"]
mod realnode;

const NAMESPACE: &str = "demo";
const AGENT_NAMESPACE: &str = "nodewarden";
const MIB: u64 = 1024 * 1024;

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("\ndemo failed: {err:#}");
        std::process::exit(1);
    }
}

struct Bins {
    webhook: PathBuf,
    agent: PathBuf,
    /// `kubectl-nodewarden`, the kubectl plugin.
    plugin: PathBuf,
}

fn usage() -> Result<Bins> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut webhook, mut agent, mut plugin) = (None, None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--webhook", Some(p)) => webhook = Some(PathBuf::from(p)),
            ("--agent", Some(p)) => agent = Some(PathBuf::from(p)),
            ("--plugin", Some(p)) => plugin = Some(PathBuf::from(p)),
            _ => break,
        }
    }
    let (Some(webhook), Some(agent), Some(plugin)) = (webhook, agent, plugin) else {
        bail!(
            "usage: nodewarden-demo --webhook <nodewarden-webhook binary> --agent <nodewarden-agent binary> \
             --plugin <kubectl-nodewarden binary> (run it as `cargo xtask demo`)"
        )
    };
    for bin in [&webhook, &agent, &plugin] {
        if !bin.is_file() {
            bail!(
                "{} is not a file: build it with `cargo build -p nodewarden-webhook -p nodewarden-agent -p nodewarden-cli`",
                bin.display()
            );
        }
    }
    Ok(Bins {
        webhook,
        agent,
        plugin,
    })
}

async fn run() -> Result<()> {
    let bins = usage()?;
    // the last section's real nodes start with the demo, beside the simulated sections: their
    // Prometheus gathers the log shipper's history meanwhile (realnode.rs)
    let (outcome, real) = tokio::join!(simulated(&bins), realnode::start());
    match outcome {
        Ok(()) => realnode::finish(real, &bins.plugin).await,
        Err(err) => {
            realnode::abandon(real);
            Err(err)
        }
    }
}

/// The sections on a control plane of their own with simulated nodes (Node objects without a
/// kubelet, agents reading synthetic cgroup files).
async fn simulated(bins: &Bins) -> Result<()> {
    step(
        "starting a control plane: etcd, kube-apiserver, kube-controller-manager (first run builds them from Go modules)",
    );
    let cp = ControlPlane::start()
        .await
        .context("starting the control plane")?;
    let client = cp.admin_client().await?;
    let crds = read_crds(&chart_crd_files()?)?;
    apply_crds(&cp, &client, &crds)
        .await
        .context("applying nodewarden's CRDs")?;
    step(&format!(
        "control plane up at {}; {} nodewarden CRDs established",
        cp.apiserver_url(),
        crds.len()
    ));

    let webhook = Webhook::start(&cp, &bins.webhook).await?;
    step(&format!(
        "nodewarden-webhook ready on 127.0.0.1:{} (log: {})",
        webhook.port,
        webhook.log.display()
    ));
    let endpoint = LoopbackEndpoint {
        port: webhook.port,
        ca_pem: cp.ca_pem().to_string(),
    };
    register_validating_webhooks(
        &client,
        "nodewarden-demo-validating",
        &endpoint,
        &[
            Hook::new(
                "claims.nodewarden.io",
                "/validate/claims",
                "nodewarden.io",
                "v1alpha1",
                &["clusterclaims"],
                &["CREATE", "UPDATE", "DELETE"],
            ),
            Hook::node_reports(),
        ],
    )
    .await?;
    register_mutating_webhooks(&client, "nodewarden-demo-mutating", &endpoint, &[Hook::pods()]).await?;
    // the API server picks up new webhook configurations within a second or so: wait until it
    // calls them (a claim the guard refuses, sent as a dry run, is refused), or the table below
    // would show writes the webhook never saw
    webhooks_called(&client).await?;

    let outcome = async {
        claims(&cp, &client).await?;
        features::features(&cp, &client).await?;
        rightsizing(&cp, &client, &bins.agent).await
    }
    .await;
    webhook.stop().await;
    step("stopping nodewarden-webhook and the control plane; removing their files");
    drop(cp);
    outcome
}

fn step(text: &str) {
    println!("==> {text}");
}

/// The real `nodewarden-webhook` binary, configured through its environment variables as the
/// chart configures it.
struct Webhook {
    child: tokio::process::Child,
    port: u16,
    log: PathBuf,
}

impl Webhook {
    async fn start(cp: &ControlPlane, bin: &Path) -> Result<Self> {
        let dir = cp.dir().join("webhook");
        std::fs::create_dir_all(&dir)?;
        let cert = cp.issue_loopback_serving_cert()?;
        process::write_file(&dir.join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
        process::write_file(&dir.join("tls.key"), cert.key_pem.as_bytes(), true)?;
        let ports = process::free_ports(2)?;
        let log = dir.join("nodewarden-webhook.log");
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(bin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NODEWARDEN_LISTEN_ADDR", format!("127.0.0.1:{}", ports[0]))
            .env("NODEWARDEN_ADMIN_ADDR", format!("127.0.0.1:{}", ports[1]))
            .env("NODEWARDEN_TLS_CERT_FILE", dir.join("tls.crt"))
            .env("NODEWARDEN_TLS_KEY_FILE", dir.join("tls.key"))
            .env("NODEWARDEN_KUBECONFIG", cp.kubeconfig_path())
            .env("NODEWARDEN_POD_NAMESPACE", "kube-system")
            .env("NODEWARDEN_POD_NAME", "nodewarden-webhook-demo")
            .env("NODEWARDEN_LOG_FORMAT", "text")
            .env("NODEWARDEN_CLAIMS_ALLOWED_GROUPS", "system:masters")
            .env(
                "NODEWARDEN_AGENT_SERVICE_ACCOUNT",
                format!("{AGENT_NAMESPACE}:nodewarden-agent"),
            )
            .env("NODEWARDEN_RIGHTSIZING_STATUS_INTERVAL", "1s")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut webhook = Webhook {
            child,
            port: ports[0],
            log,
        };
        // 120 s: on a fresh machine the real-node section builds its images beside this
        for _ in 0..1200 {
            if let Some(status) = webhook.child.try_wait()? {
                bail!(
                    "nodewarden-webhook exited ({status}):\n{}",
                    process::tail(&webhook.log, 30)
                );
            }
            if http_get(ports[1], "/readyz").await.ok().map(|(status, _)| status) == Some(200) {
                return Ok(webhook);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "nodewarden-webhook did not become ready in 120 s:\n{}",
            process::tail(&webhook.log, 30)
        )
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SIGTERM first, as the kubelet does; the webhook drains and exits
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// Waits (up to 60 s) until the API server calls the claims guard: a dry-run create of a claim
/// it refuses (an `id.k8s.io` that is no ID) is refused.
async fn webhooks_called(client: &Client) -> Result<()> {
    let claims: Api<ClusterClaim> = Api::all(client.clone());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = claims.create(&dry_run, &claim("id.k8s.io", "Not_An_ID")).await;
        match answer {
            Err(kube::Error::Api(status)) if status.message.contains("Not_An_ID") => return Ok(()),
            other if std::time::Instant::now() > deadline => {
                bail!("the API server did not call the claims guard within 60 s: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn claim(name: &str, value: &str) -> ClusterClaim {
    ClusterClaim::new(
        name,
        nodewarden_api::ClusterClaimSpec {
            value: value.to_string(),
        },
    )
}

/// Who tried what on which claim, and what the API server answered.
struct Row {
    who: &'static str,
    action: String,
    result: String,
}

fn outcome<T>(r: Result<T, kube::Error>) -> String {
    match r {
        Ok(_) => "allowed".to_string(),
        Err(kube::Error::Api(s)) => format!("denied ({}): {}", s.code, s.message),
        Err(e) => format!("error: {e}"),
    }
}

async fn claims(cp: &ControlPlane, admin: &Client) -> Result<()> {
    step("cluster identity claims (KEP-2149), guarded by the validating webhook");
    // alice may write claims as far as RBAC goes; the webhook decides the rest
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "demo-claims-editor"},
        "rules": [{"apiGroups": ["nodewarden.io"], "resources": ["clusterclaims"], "verbs": ["*"]}]
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "demo-claims-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "demo-claims-editor"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]
    }))?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let alice = cp
        .client_as(&Impersonate::user("alice", &["system:authenticated"]))
        .await?;

    let kube_system_uid = Api::<Namespace>::all(admin.clone())
        .get("kube-system")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    let as_admin: Api<ClusterClaim> = Api::all(admin.clone());
    let as_alice: Api<ClusterClaim> = Api::all(alice);
    let pp = PostParams::default();
    let mut rows = Vec::new();
    let mut record = |who, action: &str, result: String| {
        rows.push(Row {
            who,
            action: action.to_string(),
            result,
        })
    };

    record(
        "admin",
        &format!("create id.k8s.io = {kube_system_uid}"),
        outcome(as_admin.create(&pp, &claim("id.k8s.io", &kube_system_uid)).await),
    );
    record(
        "admin",
        "create clusterset.k8s.io = demo-set",
        outcome(
            as_admin
                .create(&pp, &claim("clusterset.k8s.io", "demo-set"))
                .await,
        ),
    );
    record(
        "alice",
        "create region.example.com = eu-west",
        outcome(
            as_alice
                .create(&pp, &claim("region.example.com", "eu-west"))
                .await,
        ),
    );
    let rename = Patch::Merge(json!({"spec": {"value": "other-cluster"}}));
    record(
        "alice",
        "change id.k8s.io to other-cluster",
        outcome(
            as_alice
                .patch("id.k8s.io", &PatchParams::default(), &rename)
                .await,
        ),
    );
    record(
        "admin",
        "change id.k8s.io to other-cluster",
        outcome(
            as_admin
                .patch("id.k8s.io", &PatchParams::default(), &rename)
                .await,
        ),
    );
    record(
        "admin",
        "create cluster.clusterset.k8s.io = Not_A_Label",
        outcome(
            as_admin
                .create(&pp, &claim("cluster.clusterset.k8s.io", "Not_A_Label"))
                .await,
        ),
    );
    println!();
    println!("  {:<6} {:<54} result", "who", "action");
    for r in &rows {
        println!("  {:<6} {:<54} {}", r.who, r.action, r.result);
    }
    println!();
    Ok(())
}

/// What the demo's log shipper does on each node, in the synthetic cgroup tree its agent reads.
struct Load {
    node: &'static str,
    /// CPU the container uses, in millicores.
    cpu_millis: u64,
    /// Its working set.
    memory: u64,
}

const LOADS: [Load; 2] = [
    Load {
        node: "worker-busy",
        cpu_millis: 600,
        memory: 700 * MIB,
    },
    Load {
        node: "worker-quiet",
        cpu_millis: 20,
        memory: 150 * MIB,
    },
];
const NODES: [&str; 3] = ["worker-busy", "worker-quiet", "worker-new"];

/// Container ID the demo's "runtime" reports for the shipper on `node` (64 hex digits).
fn container_id(node: &str) -> String {
    let n = NODES.iter().position(|x| *x == node).unwrap_or(0);
    format!("{:064x}", 0xd3a0_0000_u64 + n as u64)
}

/// Binds a DaemonSet pod to its node (no scheduler runs here) and reports its container
/// running, as a kubelet would, so the node's agent can find it.
async fn run_on_node(pods: &Api<Pod>, pod: &Pod, node: &str) -> Result<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    pods.create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding)
        .await?;
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "shipper", "image": "registry.example/log-shipper:1.0", "imageID": "", "ready": true,
        "restartCount": 0, "started": true, "state": {"running": {"startedAt": "2026-11-21T07:00:00Z"}},
        "containerID": format!("containerd://{}", container_id(node))}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(pod.metadata.uid.clone().unwrap_or_default())
}

/// The agent's ServiceAccount with the chart's agent ClusterRole, as `helm install` sets it up.
async fn agent_rbac(admin: &Client) -> Result<()> {
    let helm = nodewarden_tests::helm::Helm::locate().await?;
    let rendered = helm.template("nw", AGENT_NAMESPACE, &[] as &[&str]).await?;
    let mut role = rendered.get("ClusterRole", "nw-nodewarden-agent")?.clone();
    role["metadata"] = json!({"name": "nodewarden-agent"});
    let role: ClusterRole = serde_json::from_value(role)?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "nodewarden-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodewarden-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "nodewarden-agent", "namespace": AGENT_NAMESPACE}]
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": AGENT_NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "nodewarden-agent"}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), AGENT_NAMESPACE)
        .create(&PostParams::default(), &sa)
        .await?;
    Ok(())
}

/// A kubeconfig for the agent on `node`: a token bound to an agent pod on that node, so the API
/// server puts the node's name in the agent's user info, as in a real cluster.
async fn agent_kubeconfig(cp: &ControlPlane, admin: &Client, node: &str, dir: &Path) -> Result<PathBuf> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("nodewarden-agent-{node}")},
        "spec": {"nodeName": node, "serviceAccountName": "nodewarden-agent",
                 "containers": [{"name": "agent", "image": "nodewarden-agent:demo"}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let token = cp
        .service_account_token(
            AGENT_NAMESPACE,
            "nodewarden-agent",
            Some((
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.metadata.uid.as_deref().unwrap_or_default(),
            )),
        )
        .await?;
    std::fs::create_dir_all(dir)?;
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, cp.ca_pem())?;
    let kubeconfig = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: agent\n  context:\n    cluster: demo\n    user: agent\n    namespace: {AGENT_NAMESPACE}\ncurrent-context: agent\n",
        cp.apiserver_url(),
        ca.display()
    );
    process::write_file(&kubeconfig, text.as_bytes(), true)?;
    Ok(kubeconfig)
}

/// The real `nodewarden-agent` binary for one node.
async fn start_agent(bin: &Path, node: &str, dir: &Path, kubeconfig: &Path) -> Result<tokio::process::Child> {
    let log = std::fs::File::create(dir.join("nodewarden-agent.log"))?;
    tokio::process::Command::new(bin)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("NODEWARDEN_NODE_NAME", node)
        .env("NODEWARDEN_CGROUP_ROOT", dir.join("cgroup"))
        .env("NODEWARDEN_CHECKPOINT_DIR", dir.join("checkpoint"))
        .env(
            "NODEWARDEN_ADMIN_ADDR",
            format!("127.0.0.1:{}", process::free_port()?),
        )
        .env("NODEWARDEN_SAMPLE_INTERVAL", "500ms")
        // a demo of minutes: figures go out as they move, not paced to one write per 10 minutes
        .env("NODEWARDEN_PUBLISH_BUDGET", "1s")
        .env("NODEWARDEN_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}

/// What the right-sizing section runs beside the control plane: the agent processes and the
/// task that plays the kernel's CPU counters. Stopped on every way out of the section, so
/// nothing writes into the control plane's folder after it is removed.
#[derive(Default)]
struct Simulation {
    agents: Vec<tokio::process::Child>,
    stop: tokio_util::sync::CancellationToken,
    kernel: Option<tokio::task::JoinHandle<()>>,
}

impl Simulation {
    async fn stop(self) {
        self.stop.cancel();
        if let Some(kernel) = self.kernel {
            let _ = kernel.await;
        }
        for mut agent in self.agents {
            let _ = agent.kill().await;
        }
    }
}

async fn rightsizing(cp: &ControlPlane, admin: &Client, agent_bin: &Path) -> Result<()> {
    let mut sim = Simulation::default();
    let result = rightsizing_steps(cp, admin, agent_bin, &mut sim).await;
    sim.stop().await;
    result
}

async fn rightsizing_steps(
    cp: &ControlPlane,
    admin: &Client,
    agent_bin: &Path,
    sim: &mut Simulation,
) -> Result<()> {
    step(
        "per-node right-sizing (KEP-4943): a log shipper DaemonSet over three nodes, one busy, one quiet, one new",
    );
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let pool = BTreeMap::from([("demo.nodewarden.io/pool".to_string(), "workers".to_string())]);
    let nodes: Vec<String> = NODES.iter().map(|n| n.to_string()).collect();
    for node in &nodes {
        create_ready_node(cp, admin, node, pool.clone()).await?;
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "log-shipper", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": "log-shipper"}},
            "template": {
                "metadata": {"labels": {"app": "log-shipper"}},
                "spec": {
                    "nodeSelector": pool,
                    "containers": [{
                        "name": "shipper",
                        "image": "registry.example/log-shipper:1.0",
                        "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
                    }]
                }
            }
        }
    }))?;
    Api::<DaemonSet>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &ds)
        .await?;
    let dsa: DaemonSetAutoscaler = serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
        "metadata": {"name": "log-shipper", "namespace": NAMESPACE},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": "log-shipper"}, "coldStart": "Fleet"}
    }))?;
    Api::<DaemonSetAutoscaler>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &dsa)
        .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let first = wait_for_daemonset_pods(cp, admin, NAMESPACE, "log-shipper", &nodes).await?;
    println!();
    print_pods(
        "first pods: no node has history yet, so every pod keeps the template's requests",
        &nodes,
        &first,
    );

    // one agent per measured node, each with its own node-bound token and cgroup tree
    agent_rbac(admin).await?;
    let mut scopes = Vec::new();
    for load in &LOADS {
        let pod = first
            .get(load.node)
            .ok_or_else(|| anyhow::anyhow!("no pod on {}", load.node))?;
        let uid = run_on_node(&pods, pod, load.node).await?;
        let dir = cp.dir().join("agents").join(load.node);
        let scope = cgroupfs::container_scope(&dir.join("cgroup"), &uid, &container_id(load.node));
        cgroupfs::write_root(&dir.join("cgroup"))?;
        cgroupfs::write_container(&scope, 0, load.memory)?;
        let kubeconfig = agent_kubeconfig(cp, admin, load.node, &dir).await?;
        sim.agents
            .push(start_agent(agent_bin, load.node, &dir, &kubeconfig).await?);
        scopes.push((scope, load));
    }
    step(
        "two nodewarden-agent processes measure the shipper's cgroups: 600m and 700Mi on worker-busy, 20m and 150Mi on worker-quiet",
    );
    // the "kernel": CPU counters advance at each node's rate
    let stop = sim.stop.clone();
    sim.kernel = Some(tokio::spawn(async move {
        let started = std::time::Instant::now();
        loop {
            for (scope, load) in &scopes {
                let used = started.elapsed().as_micros() as u64 * load.cpu_millis / 1000;
                let _ = cgroupfs::write_container(scope, used, load.memory);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }));
    let recs: Api<NodeRecommendation> = Api::all(admin.clone());
    let published = std::time::Instant::now();
    for load in &LOADS {
        cp.poll(&format!("NodeRecommendation/{}", load.node), || {
            let recs = recs.clone();
            async move {
                Ok(recs
                    .get_opt(load.node)
                    .await?
                    .filter(|r| !r.spec.recommendations.is_empty()))
            }
        })
        .await?;
    }
    step(&format!(
        "both agents published their node's recommendation ({:.0?} after start)",
        published.elapsed()
    ));
    // a few seconds of history, so the figures rest on more than one CPU reading; agents
    // publish again only when a figure moves materially (the busy node's CPU will)
    tokio::time::sleep(Duration::from_secs(5)).await;

    // one node cannot write another's figures: the node-reports guard compares token and object
    let quiet_token = {
        let dir = cp.dir().join("agents").join("worker-quiet");
        let kubeconfig = kube::config::Kubeconfig::read_from(dir.join("kubeconfig"))?;
        let options = kube::config::KubeConfigOptions::default();
        Client::try_from(kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?)?
    };
    let forged = recs.get("worker-busy").await?;
    let forged_rec = NodeRecommendation::new("worker-busy", forged.spec.clone());
    let answer = Api::<NodeRecommendation>::all(quiet_token)
        .patch(
            "worker-busy",
            &PatchParams::apply("nodewarden-agent").force(),
            &Patch::Apply(&forged_rec),
        )
        .await;
    println!(
        "\n  the agent of worker-quiet writes NodeRecommendation/worker-busy: {}\n",
        outcome(answer)
    );

    // the fleet figure the new node will get, once the status controller has both nodes'
    // figures: the 90th percentile of the node targets, at most twice their median, so that
    // one busy node cannot set it alone. With the busy node's figure in, it is above the median.
    let dsas: Api<DaemonSetAutoscaler> = Api::namespaced(admin.clone(), NAMESPACE);
    let fleet = cp
        .poll("the autoscaler's fleet figure", || {
            let dsas = dsas.clone();
            async move {
                Ok(dsas
                    .get("log-shipper")
                    .await?
                    .status
                    .filter(|s| s.nodes_with_recommendation == Some(2))
                    .and_then(|s| {
                        s.fleet
                            .into_iter()
                            .find(|f| cpu_millis(f.target.as_ref()) > cpu_millis(f.median.as_ref()))
                    }))
            }
        })
        .await?;
    step(&format!(
        "fleet figure for a node without history: {}m CPU, the 90th percentile of the nodes' targets capped at twice their median ({}m)",
        cpu_millis(fleet.target.as_ref()),
        cpu_millis(fleet.median.as_ref()),
    ));

    // pods are right-sized when they are created: replace them, as a rollout would
    // (no kubelet confirms a graceful deletion here, so they go at once)
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for pod in first.values() {
        pods.delete(pod.metadata.name.as_deref().unwrap_or_default(), &now)
            .await?;
    }
    let old: Vec<_> = first.values().filter_map(|p| p.metadata.uid.clone()).collect();
    let second = cp
        .poll("the DaemonSet controller to re-create the pods", || {
            let pods = pods.clone();
            let old = old.clone();
            async move {
                let fresh: BTreeMap<String, Pod> = pods
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| !old.contains(u)))
                    .filter_map(|p| Some((daemonset_pod_target_node(&p)?, p)))
                    .collect();
                Ok((fresh.len() == NODES.len()).then_some(fresh))
            }
        })
        .await?;
    print_pods(
        "re-created pods: each gets its own node's figures (the new node the fleet's)",
        &nodes,
        &second,
    );
    Ok(())
}

/// The CPU of a fleet figure's list, in millicores (0 when it has none).
fn cpu_millis(list: Option<&BTreeMap<String, Quantity>>) -> u128 {
    list.and_then(|t| t.get("cpu"))
        .and_then(|q| nodewarden_api::quantity::parse_milli(&q.0))
        .unwrap_or(0)
}

/// Memory in MiB for the table (the pod keeps the exact figure).
fn mebibytes(q: &str) -> String {
    match nodewarden_api::quantity::parse_milli(q) {
        Some(milli) => format!("{}Mi", (milli / 1000).div_ceil(1 << 20)),
        None => q.to_string(),
    }
}

fn print_pods(title: &str, nodes: &[String], pods: &BTreeMap<String, Pod>) {
    println!("  {title}");
    println!(
        "  {:<14} {:>8} {:>10} {:>10}  source",
        "node", "cpu req", "mem req", "mem limit"
    );
    for node in nodes {
        let Some(pod) = pods.get(node) else { continue };
        let container = pod.spec.as_ref().and_then(|s| s.containers.first());
        let res = container.and_then(|c| c.resources.as_ref());
        let get = |m: Option<&BTreeMap<String, Quantity>>, k: &str| {
            m.and_then(|m| m.get(k))
                .map(|q| q.0.clone())
                .unwrap_or_else(|| "-".to_string())
        };
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        let source = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("rightsizing.nodewarden.io/source"))
            .map(|s| s.trim_start_matches("shipper=").to_string())
            .unwrap_or_else(|| "template (no change)".to_string());
        println!(
            "  {:<14} {:>8} {:>10} {:>10}  {}",
            daemonset_pod_target_node(pod).unwrap_or_else(|| node.clone()),
            get(requests, "cpu"),
            mebibytes(&get(requests, "memory")),
            mebibytes(&get(limits, "memory")),
            source
        );
    }
    println!();
}
