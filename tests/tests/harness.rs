//! The harness itself: a control plane of one's own reports the Kubernetes version it was
//! built from and, once dropped, leaves no process and no folder behind.

use std::path::Path;

use anyhow::{Context, Result, anyhow, ensure};
use nodewarden_tests::ControlPlane;

/// The `k8s.io/kubernetes` version `tests/controlplane/go.mod` pins, e.g. `v1.36.3`.
fn pinned_kubernetes_version() -> Result<String> {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/go.mod");
    let text = std::fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("k8s.io/kubernetes "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no k8s.io/kubernetes requirement in {}", go_mod.display()))
}

async fn scenario() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let version = cp.admin_client().await?.apiserver_version().await?;
    let pinned = pinned_kubernetes_version()?;
    // helm and clients compare this against `kubeVersion` constraints.
    ensure!(
        version.git_version == pinned,
        "/version says {}, go.mod pins {pinned}",
        version.git_version
    );

    let pids = cp.pids();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(
        names == ["etcd", "kube-apiserver", "kube-controller-manager"],
        "processes {names:?}"
    );
    let dir = cp.dir().to_path_buf();
    drop(cp);
    for (name, pid) in &pids {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{name} (pid {pid}) still runs after drop"
        );
    }
    if std::env::var_os("NODEWARDEN_E2E_KEEP").is_none() {
        ensure!(!dir.exists(), "{} is left behind", dir.display());
    }
    Ok(())
}

#[tokio::test]
async fn own_control_plane_reports_its_version_and_cleans_up_on_drop() {
    if let Err(e) = scenario().await {
        panic!("{e:#}");
    }
}
