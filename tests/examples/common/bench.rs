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
/// certificate of [`write_serving_cert`] in `dir`, its admin port on `admin`.
pub fn webhook_args(cp: &ControlPlane, dir: &Path, port: u16, admin: u16, pod_name: &str) -> Vec<String> {
    vec![
        format!("--listen-addr=127.0.0.1:{port}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--tls-cert-file={}", dir.join("tls.crt").display()),
        format!("--tls-key-file={}", dir.join("tls.key").display()),
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        "--namespace=nodewarden".to_string(),
        format!("--pod-name={pod_name}"),
        "--log-format=json".to_string(),
        "--log-level=info".to_string(),
        "--worker-threads=1".to_string(),
    ]
}
