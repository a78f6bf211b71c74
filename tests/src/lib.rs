//! End-to-end test harness for nodewarden: a real control plane (etcd, kube-apiserver,
//! kube-controller-manager, built from Go modules by `controlplane/build.sh`) on loopback,
//! with helpers for what the tests set up in it.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use nodewarden_tests::{ControlPlane, TestEnv};
//! let env = TestEnv::new("my-test").await?; // shared control plane + a namespace of its own
//! let nodes = env.create_nodes(3).await?;   // Ready fake Nodes the DaemonSet controller uses
//! let cp: &ControlPlane = env.cp;
//! let kubeconfig = cp.kubeconfig_path();     // for helm: cp.helm_path()
//! # let _ = (nodes, kubeconfig); Ok(()) }
//! ```
//!
//! See `tests/README.md` for how to run the tests and what they need.

pub mod cgroupfs;
pub mod cluster;
pub mod controlplane;
pub mod footprint;
pub mod helm;
pub mod images;
pub mod node;
pub mod oom;
pub mod process;
pub mod procfs;
pub mod prometheus;
pub mod recorder;
pub mod registry;
pub mod release;
pub mod seeding;
pub mod shipper;
pub mod vm;
pub mod vpa;
pub mod webhooks;

pub use cgroupfs::{container_scope, write_container};
pub use cluster::{
    TestEnv, apply_crds, chart_crd_files, create_namespace, create_ready_node, daemonset_pod_target_node,
    e2e, read_crds, simple_daemonset, target_recommendation, unique_name, wait_for_daemonset_pods,
    wait_for_event,
};
pub use controlplane::{Binaries, ControlPlane, Impersonate, KubeVersion};
pub use node::{ContainerCgroup, HostSnapshot, RealCluster, RealClusterConfig, RealNode, require_real_nodes};
pub use recorder::{RecordingWebhook, Responder, allow_all, allow_with_patch};
pub use webhooks::{
    Hook, InProcessWebhook, LoopbackEndpoint, http_get, register_mutating_webhooks,
    register_validating_webhooks,
};

/// A failure with what helps to explain it (log tails, pod states) *after* the failure itself:
/// test output is often cut in the middle, and a long report put first would hide the cause.
/// The cause chain is kept as the message's first line(s), `what: outer: …: root`.
pub fn failure_with(e: anyhow::Error, what: &str, details: &str) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e:#}\n\n{details}")
}

/// `kubectl nodewarden <args>` through the plugin's library with real flags; its output as text.
pub async fn kubectl_nodewarden(args: &[&str]) -> Result<String, nodewarden_cli::Error> {
    use clap::Parser as _;
    let argv = std::iter::once("kubectl-nodewarden").chain(args.iter().copied());
    let cli = nodewarden_cli::Cli::try_parse_from(argv)
        .map_err(|e| nodewarden_cli::Error::Config(e.to_string()))?;
    let mut out = Vec::new();
    nodewarden_cli::run(&cli, &mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
