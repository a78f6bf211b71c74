//! `cargo xtask demo`: nodewarden against a real control plane on this machine.
//!
//! Starts etcd, kube-apiserver and kube-controller-manager (built from their Go modules),
//! runs the real `nodewarden-webhook` binary against them on 127.0.0.1, registers its webhooks
//! with the API server, creates example objects and prints what happened. Everything it
//! started is stopped and removed at the end, also on failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::ClusterClaim;
use nodewarden_tests::{
    ControlPlane, Hook, Impersonate, LoopbackEndpoint, apply_crds, chart_crd_files, create_ready_node,
    daemonset_pod_target_node, http_get, process, read_crds, register_mutating_webhooks,
    register_validating_webhooks, wait_for_daemonset_pods,
};
use serde_json::json;

#[path = "nodewarden-demo/features.rs"]
mod features;

const NAMESPACE: &str = "demo";

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("\ndemo failed: {err:#}");
        std::process::exit(1);
    }
}

fn usage() -> Result<PathBuf> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("--webhook"), Some(path)) => Ok(PathBuf::from(path)),
        _ => bail!(
            "usage: nodewarden-demo --webhook <path to the nodewarden-webhook binary> (run it as `cargo xtask demo`)"
        ),
    }
}

async fn run() -> Result<()> {
    let webhook_bin = usage()?;
    if !webhook_bin.is_file() {
        bail!(
            "{} is not a file: build it with `cargo build -p nodewarden-webhook`",
            webhook_bin.display()
        );
    }
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

    let webhook = Webhook::start(&cp, &webhook_bin).await?;
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
        &[Hook::new(
            "claims.nodewarden.io",
            "/validate/claims",
            "nodewarden.io",
            "v1alpha1",
            &["clusterclaims"],
            &["CREATE", "UPDATE", "DELETE"],
        )],
    )
    .await?;
    let mut pods_hook = Hook::new(
        "pods.rightsizing.nodewarden.io",
        "/mutate/pods",
        "",
        "v1",
        &["pods"],
        &["CREATE"],
    );
    pods_hook.failure_policy = "Ignore".to_string();
    pods_hook.timeout_seconds = 5;
    register_mutating_webhooks(&client, "nodewarden-demo-mutating", &endpoint, &[pods_hook]).await?;
    // the API server picks up new webhook configurations within a second or so
    tokio::time::sleep(Duration::from_secs(2)).await;

    let outcome = async {
        claims(&cp, &client).await?;
        features::features(&cp, &client).await?;
        daemonset_pods(&cp, &client).await
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
        for _ in 0..300 {
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
            "nodewarden-webhook did not become ready in 30 s:\n{}",
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

async fn daemonset_pods(cp: &ControlPlane, admin: &Client) -> Result<()> {
    step("a DaemonSet over three nodes: the real DaemonSet controller creates one pod per node");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let group = BTreeMap::from([("demo.nodewarden.io/pool".to_string(), "workers".to_string())]);
    let mut nodes = Vec::new();
    for name in ["worker-busy", "worker-quiet", "worker-new"] {
        create_ready_node(cp, admin, name, group.clone()).await?;
        nodes.push(name.to_string());
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "log-shipper", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": "log-shipper"}},
            "template": {
                "metadata": {"labels": {"app": "log-shipper"}},
                "spec": {
                    "nodeSelector": group,
                    "containers": [{
                        "name": "shipper",
                        "image": "registry.example/log-shipper:1.0",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
                    }]
                }
            }
        }
    }))?;
    Api::<DaemonSet>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &ds)
        .await?;
    let pods = wait_for_daemonset_pods(cp, admin, NAMESPACE, "log-shipper", &nodes).await?;
    println!();
    println!(
        "  {:<14} {:<20} {:>8} {:>10} {:>12}",
        "node", "pod", "cpu req", "mem req", "mem limit"
    );
    for node in &nodes {
        if let Some(pod) = pods.get(node) {
            print_pod(node, pod);
        }
    }
    println!();
    Ok(())
}

fn print_pod(node: &str, pod: &Pod) {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    let res = container.and_then(|c| c.resources.as_ref());
    let get = |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
               k: &str| {
        m.and_then(|m| m.get(k))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "-".to_string())
    };
    let requests = res.and_then(|r| r.requests.as_ref());
    let limits = res.and_then(|r| r.limits.as_ref());
    let target = daemonset_pod_target_node(pod).unwrap_or_default();
    debug_assert_eq!(target, node);
    println!(
        "  {:<14} {:<20} {:>8} {:>10} {:>12}",
        node,
        pod.metadata.name.as_deref().unwrap_or("?"),
        get(requests, "cpu"),
        get(requests, "memory"),
        get(limits, "memory"),
    );
}
