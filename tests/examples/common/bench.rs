//! What the benchmarks against the real control plane share: the fleet's names, the pod
//! review each node's DaemonSet pod makes, and the webhook as its image holds it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bytes::Bytes;
use nodewarden_tests::ControlPlane;
use nodewarden_tests::process::write_file;
use serde_json::{Value, json};

const POD_REVIEW: &str = include_str!("../../fixtures/admission/daemonset-pod-create.json");

/// Node `i`'s name, as a cloud names its nodes.
pub fn node_name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

/// DaemonSet `k`'s namespace.
pub fn namespace(k: usize) -> String {
    format!("team-{k}")
}

/// DaemonSet `k`'s name (and its autoscaler's).
pub fn ds_name(k: usize) -> String {
    format!("agent-{k}")
}

/// The recorded review, moved to node `i` and DaemonSet `k`, with two containers (`agent` and
/// `sidecar`) and labelled for the DaemonSet's selector (the VPA matches pods by it).
pub fn review(i: usize, k: usize) -> Bytes {
    let mut r: Value = serde_json::from_str(POD_REVIEW).expect("fixture");
    r["request"]["uid"] = json!(format!("uid-{i}-{k}"));
    r["request"]["namespace"] = json!(namespace(k));
    let pod = &mut r["request"]["object"];
    pod["metadata"]["namespace"] = json!(namespace(k));
    pod["metadata"]["labels"]["app"] = json!(ds_name(k));
    pod["metadata"]["ownerReferences"][0]["name"] = json!(ds_name(k));
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchFields"][0]["values"] = json!([node_name(i)]);
    let mut sidecar = pod["spec"]["containers"][0].clone();
    sidecar["name"] = json!("sidecar");
    if let Some(list) = pod["spec"]["containers"].as_array_mut() {
        list.push(sidecar);
    }
    Bytes::from(serde_json::to_vec(&r).expect("json"))
}

/// The webhook's binary exactly as its image holds it (built now by the image build: static,
/// the image's profile and flags, symbols stripped), so the figures are the deployed program's.
/// A build of its own also keeps the benchmarks' `loadgen` feature out of the binary.
/// `NODEWARDEN_WEBHOOK_BIN` names another binary instead (a build with symbols, for profiling).
pub fn webhook_build() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("NODEWARDEN_WEBHOOK_BIN") {
        return Ok(PathBuf::from(bin));
    }
    use xtask::image::{self, BuildOptions, WEBHOOK};
    let mut opts = BuildOptions::for_repo(&image::repo_root()).context("image build options")?;
    opts.progress = true;
    image::build_static_binary(&opts, WEBHOOK.package, WEBHOOK.package, WEBHOOK.profile)
}

/// Writes a loopback serving certificate of the control plane's CA into `dir` (`tls.crt`,
/// `tls.key`) with the CA beside it (`ca.crt`).
pub fn write_serving_cert(cp: &ControlPlane, dir: &Path) -> Result<()> {
    let cert = cp.issue_loopback_serving_cert()?;
    write_file(&dir.join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
    write_file(&dir.join("tls.key"), cert.key_pem.as_bytes(), true)?;
    write_file(&dir.join("ca.crt"), cp.ca_pem().as_bytes(), false)?;
    Ok(())
}

/// The webhook's flags as the chart sets them (JSON logs at info), serving on `port` with the
/// certificate of [`write_serving_cert`] in `dir`, its admin port on `admin`, its leader-election
/// Lease in `namespace`.
pub fn webhook_args(
    cp: &ControlPlane,
    dir: &Path,
    (port, admin): (u16, u16),
    pod_name: &str,
    namespace: &str,
) -> Vec<String> {
    vec![
        format!("--listen-addr=127.0.0.1:{port}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--tls-cert-file={}", dir.join("tls.crt").display()),
        format!("--tls-key-file={}", dir.join("tls.key").display()),
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        format!("--namespace={namespace}"),
        format!("--pod-name={pod_name}"),
        "--log-format=json".to_string(),
        "--log-level=info".to_string(),
        "--worker-threads=1".to_string(),
    ]
}

/// A webhook started by [`start_webhook`].
pub struct Started {
    /// The process (killed when dropped).
    pub child: tokio::process::Child,
    /// Its pid, for CPU and memory.
    pub pid: u32,
    /// Its admission address (loopback).
    pub addr: std::net::SocketAddr,
}

/// When a started webhook counts as ready: it answers `review` with an answer `patched` accepts
/// (its watches have loaded what the review needs) within `within`.
pub struct ReadyWhen<F: Fn(&[u8]) -> bool> {
    /// The review sent.
    pub review: Bytes,
    /// Whether the answer is the expected patch.
    pub patched: F,
    /// How long to wait.
    pub within: std::time::Duration,
}

/// Starts `bin` with the chart's flags ([`webhook_args`]), its log in `dir/<name>.log`, pinned to
/// `cpu` when given (started on it, so it sizes itself to that core), its Lease in namespace
/// `nodewarden` or the one given (two builds side by side each lead in their own), and waits
/// until it is ready as `ready` says. On failure, the error ends with the log's last lines.
pub async fn start_webhook<F: Fn(&[u8]) -> bool>(
    cp: &ControlPlane,
    dir: &Path,
    bin: &Path,
    (name, cpu, lease_namespace): (&str, Option<usize>, Option<&str>),
    ready: ReadyWhen<F>,
) -> Result<Started> {
    let ReadyWhen {
        review,
        patched,
        within,
    } = ready;
    use nodewarden_tests::process::free_port;
    use nodewarden_tests::webhooks::http_get;
    use nodewarden_webhook::loadgen::{Alpn, connect};
    let (port, admin) = (free_port()?, free_port()?);
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log)?;
    let mut command = match cpu {
        Some(cpu) => {
            let mut c = tokio::process::Command::new("taskset");
            c.args(["-c", &cpu.to_string()]).arg(bin);
            c
        }
        None => tokio::process::Command::new(bin),
    };
    let mut child = command
        .args(webhook_args(
            cp,
            dir,
            (port, admin),
            name,
            lease_namespace.unwrap_or("nodewarden"),
        ))
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id().context("the webhook exited at once")?;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = std::time::Instant::now() + within;
    loop {
        if matches!(http_get(admin, "/readyz").await, Ok((200, _)))
            && let Ok(conn) = connect(addr, cp.ca_pem(), "127.0.0.1", Alpn::Either).await
            && let Some(answer) = conn.send("/mutate/pods", review.clone()).await
            && patched(&answer)
        {
            return Ok(Started { child, pid, addr });
        }
        let ended = child.try_wait().ok().flatten();
        if ended.is_some() || std::time::Instant::now() > deadline {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let what = match ended {
                Some(status) => format!("{name} exited: {status}"),
                None => format!("{name} never patched the review within {within:?}"),
            };
            anyhow::bail!("{what}; its log ends (newest first):\n{}", tail.join("\n"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}
