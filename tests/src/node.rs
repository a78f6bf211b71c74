//! Real nodes beside the control plane: a kubelet with containerd, runc and the bridge CNI plugin
//! per node, plus kube-scheduler and kube-proxy, all as plain processes of the control plane
//! (killed with it, and by its watchdog).
//!
//! What a node changes on the host (sysctls, iptables and nftables, mounts, network namespaces,
//! links, routes, cgroups, fixed folders, conntrack entries) is recorded before anything starts and
//! put back when the cluster stops, by `tests/node/host-state.sh`; the watchdog runs the same script
//! when the test process dies without stopping the cluster (kill -9). [`RealCluster::shutdown`]
//! returns an error naming whatever still differs.
//!
//! The network never leaves the machine: kube-apiserver and the kubelets listen on addresses of
//! their own (`10.200.0.0/24`, each a /32 on a veth of the host), pods live on one bridge per node
//! (`10.201.<n>.0/24`), Service IPs are black-holed on the host (kube-proxy rewrites them before
//! routing, so only a Service kube-proxy does not know is dropped), pod traffic to anything outside
//! the pod network is dropped, pods get no DNS, and kube-apiserver calls webhook Services at their
//! endpoints' pod IPs (`--enable-aggregator-routing`).
//!
//! Needs Linux, root, and Debian's containerd, runc, containernetworking-plugins, iptables and
//! conntrack, which [`RealCluster::start`] installs with `tests/node/packages.sh` when missing.
//! Works on cgroup v1 (cgroupfs driver) and v2 hosts.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use nodewarden_certs::ServingSpec;

use crate::controlplane::{ControlPlane, NodeNetwork, SERVICE_CLUSTER_IP_RANGE};
use crate::process::{free_ports, pause, write_file};

/// Debian packages a real node needs.
pub const NODE_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "conntrack",
];

/// kube-apiserver's address when real nodes join.
pub const APISERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// The pod network of all real nodes (node `n` gets `10.201.<n+1>.0/24`).
pub const POD_NETWORK: &str = "10.201.0.0/16";
const NODE_ADDRESSES: &str = "10.200.0.0/24";
/// Where Debian's CNI plugins live.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
const CERT_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why real nodes cannot run here, or `None` when they can (Linux, root).
pub fn unavailable_reason() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return Some("real nodes need Linux".to_string());
    }
    match std::process::Command::new("id").arg("-u").output() {
        Ok(out) if String::from_utf8_lossy(&out.stdout).trim() == "0" => None,
        Ok(_) => Some("real nodes need root (kubelet, containerd, iptables)".to_string()),
        Err(e) => Some(format!("cannot tell whether this is root: {e}")),
    }
}

/// For a test that needs real nodes: `Ok(true)` when they can run here. Elsewhere it prints a
/// loud line naming what is missing and returns `Ok(false)` (the test then returns early),
/// except under `CI=true`, where a missing real node is an error: CI never skips this tier.
pub fn require_real_nodes(test: &str) -> Result<bool> {
    let Some(reason) = unavailable_reason() else {
        return Ok(true);
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!("{test}: {reason}; CI runs the real-node tier and does not skip it");
    }
    eprintln!("\n*** SKIPPED {test}: {reason} (CI=true would fail here) ***\n");
    Ok(false)
}

/// What a [`RealCluster`] starts with.
#[derive(Clone, Debug)]
pub struct RealClusterConfig {
    /// How many real nodes (each with a containerd and a kubelet of its own).
    pub nodes: usize,
    /// OCI image archives imported into every node's containerd before its kubelet starts.
    pub images: Vec<PathBuf>,
    /// The sandbox ("pause") image every pod starts with; must be among `images`.
    pub sandbox_image: String,
    /// Nodes (by index) whose kubelet signs its own serving certificate, as kubeadm's and kind's
    /// do, into the default certificate folder [`KUBELET_DEFAULT_CERT_DIR`] (one node at most: the
    /// folder is the host's). The others serve a certificate of the cluster CA.
    pub self_signed_kubelets: Vec<usize>,
    /// containerd's registry host folder (`config_path`: `<registry>/hosts.toml` per registry),
    /// e.g. a mirror written by [`crate::registry::Registry::write_mirror`]; `None`: none.
    pub registry_hosts: Option<PathBuf>,
}

impl RealClusterConfig {
    /// `nodes` real nodes with nodewarden's images and the test image (the sandbox too), every
    /// kubelet serving a certificate of the cluster CA.
    pub fn with_images(nodes: usize, images: &crate::images::TestImages) -> Self {
        RealClusterConfig {
            nodes,
            images: images.archives(),
            sandbox_image: images.testbox_ref(),
            self_signed_kubelets: vec![],
            registry_hosts: None,
        }
    }
}

/// Where a kubelet keeps its certificates unless told otherwise (`--cert-dir`), and where the
/// chart's agent looks for the kubelet's own serving certificate.
pub const KUBELET_DEFAULT_CERT_DIR: &str = "/var/lib/kubelet/pki";

/// One real node.
#[derive(Debug, Clone)]
pub struct RealNode {
    /// The Node's name (also its `kubernetes.io/hostname`).
    pub name: String,
    /// Its InternalIP; the kubelet serves on `<ip>:10250`.
    pub ip: Ipv4Addr,
    /// The cgroup under which its kubelet puts every pod (`--cgroup-root`), e.g. `/nodewarden-node-a`.
    pub cgroup_root: String,
    /// Whether its kubelet signs its own serving certificate (into [`KUBELET_DEFAULT_CERT_DIR`],
    /// for the node's name), as [`RealClusterConfig::self_signed_kubelets`] asks.
    pub self_signed_kubelet: bool,
    dir: PathBuf,
}

impl RealNode {
    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    /// The node's own folder (kubelet root, containerd state, CNI configuration).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the kubelet applied to the cgroup of `pod`'s first container on this node (cgroupfs
    /// driver: `<cgroup root>/kubepods[/<qos>]/pod<uid>/<container id>`).
    pub fn container_cgroup(&self, pod: &Pod) -> Result<ContainerCgroup> {
        self.container_cgroup_of(pod, None)
    }

    /// [`container_cgroup`](Self::container_cgroup) of the container or native sidecar (an init
    /// container with `restartPolicy: Always`) named `name`, or of the first container.
    pub fn container_cgroup_of(&self, pod: &Pod, name: Option<&str>) -> Result<ContainerCgroup> {
        let uid = pod.metadata.uid.as_deref().context("the pod has no uid")?;
        let status = pod.status.as_ref().context("the pod has no status")?;
        let statuses = status.container_statuses.iter().flatten();
        let id = match name {
            None => statuses.take(1).next(),
            Some(name) => statuses
                .chain(status.init_container_statuses.iter().flatten())
                .find(|c| c.name == name),
        }
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.split_once("://"))
        .map(|(_, id)| id.to_string())
        .with_context(|| format!("the pod's container {} has no ID yet", name.unwrap_or("(first)")))?;
        let qos = match status.qos_class.as_deref() {
            Some("Guaranteed") => String::new(),
            Some(q) => format!("{}/", q.to_ascii_lowercase()),
            None => bail!("the pod has no QoS class"),
        };
        let rel = format!(
            "{}/kubepods/{qos}pod{uid}/{id}",
            self.cgroup_root.trim_start_matches('/')
        );
        let read = |path: PathBuf| -> Result<Option<u64>> {
            match std::fs::read_to_string(&path) {
                Ok(v) if v.trim() == "max" => Ok(None),
                Ok(v) => {
                    Ok(Some(v.trim().parse().with_context(|| {
                        format!("{}: {v:?} is not a number", path.display())
                    })?))
                }
                Err(e) => Err(anyhow!("reading {}: {e}", path.display())),
            }
        };
        let base = Path::new("/sys/fs/cgroup");
        if base.join("cgroup.controllers").exists() {
            let dir = base.join(&rel);
            Ok(ContainerCgroup {
                cpu_shares: None,
                cpu_weight: read(dir.join("cpu.weight"))?,
                memory_limit: read(dir.join("memory.max"))?,
            })
        } else {
            let memory_limit = read(base.join("memory").join(&rel).join("memory.limit_in_bytes"))?
                // v1 writes "no limit" as the largest page-aligned value
                .filter(|v| *v < (1 << 62));
            Ok(ContainerCgroup {
                cpu_shares: read(base.join("cpu").join(&rel).join("cpu.shares"))?,
                cpu_weight: None,
                memory_limit,
            })
        }
    }
}

/// What the kubelet applied to a container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroup {
    /// cgroup v1 `cpu.shares` (kubelet: millicores × 1024 / 1000, at least 2).
    pub cpu_shares: Option<u64>,
    /// cgroup v2 `cpu.weight` (kubelet: 1 + (shares − 2) × 9999 / 262142).
    pub cpu_weight: Option<u64>,
    /// The memory limit in bytes; `None` when there is none.
    pub memory_limit: Option<u64>,
}

impl ContainerCgroup {
    /// Whether the CPU figure is what the kubelet sets for a request of `millicores`.
    pub fn cpu_matches_request(&self, millicores: u64) -> bool {
        let shares = (millicores * 1024 / 1000).max(2);
        match (self.cpu_shares, self.cpu_weight) {
            (Some(s), _) => s == shares,
            (None, Some(w)) => w == 1 + (shares - 2) * 9999 / 262_142,
            (None, None) => false,
        }
    }

    /// Whether the memory limit is what the kubelet sets for a limit of `bytes`: the kernel keeps
    /// it in whole pages, rounded down.
    pub fn memory_matches_limit(&self, bytes: u64) -> bool {
        const PAGE: u64 = 4096;
        self.memory_limit == Some(bytes / PAGE * PAGE)
    }
}

/// A control plane with kube-scheduler, kube-proxy and real nodes.
pub struct RealCluster {
    pub cp: ControlPlane,
    pub nodes: Vec<RealNode>,
    /// Held while the cluster lives (declared last, so released after the host is restored).
    _host_lock: Option<std::fs::File>,
}

/// Set in a child process whose parent already holds the host lock for it.
pub const HOST_LOCK_HELD_ENV: &str = "NODEWARDEN_REAL_NODE_LOCK_HELD";

/// Real clusters use fixed addresses and change host-wide state: one at a time per machine, across
/// test binaries and processes. Blocks until the lock is free; the kernel releases it when the
/// holder dies. Whoever gets the lock first puts back what a run that died with its watchdog left
/// on the host (see [`recover_abandoned_host`]).
pub async fn lock_host() -> Result<std::fs::File> {
    let path = std::env::temp_dir().join("nodewarden-real-node.lock");
    tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        for done in recover_abandoned_host()? {
            eprintln!("nodewarden-tests: {done}");
        }
        Ok(file)
    })
    .await?
}

/// Names the `host-state` folder of the real cluster that runs now (first line) and the boot it
/// runs in (second line). Written once the host's state is recorded, removed once it is put back
/// (by the harness, or by the watchdog after the test process died).
pub(crate) fn host_record_path() -> PathBuf {
    std::env::temp_dir().join("nodewarden-real-node.record")
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Puts back what a real cluster left on the host when its test process and its watchdog both
/// died (a machine or session stopped mid-run, every process killed at once): the next run would
/// otherwise fail to create its links ("File exists") or start from a host full of the dead run's
/// rules. Call it holding [`lock_host`] (which does); returns what it did, one line each.
///
/// With the dead run's record (same boot), its `host-state.sh restore` runs: the complete undo.
/// Without one (the record's folder is gone, or the run was in another boot or mount namespace),
/// only what carries this harness's fixed names is removed: the `nw-*` links and `nwbr<n>` bridges,
/// the Service range's black hole and the pod network's FORWARD guard.
pub fn recover_abandoned_host() -> Result<Vec<String>> {
    let mut done = Vec::new();
    let record = host_record_path();
    if let Ok(text) = std::fs::read_to_string(&record) {
        let mut lines = text.lines();
        let state = PathBuf::from(lines.next().unwrap_or_default());
        let boot = lines.next().unwrap_or_default();
        let script = state.join("host-state.sh");
        if boot != boot_id() {
            done.push(format!(
                "a real cluster's record {} is from an earlier boot: dropped",
                state.display()
            ));
        } else if script.is_file() {
            // its watchdog may be restoring right now: let it finish first (a second restore
            // then finds nothing to do)
            let watchdog = format!(
                "nodewarden-e2e-watchdog .* {}",
                state.parent().unwrap_or(&state).display()
            );
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline
                && std::process::Command::new("pgrep")
                    .args(["-f", "--", &watchdog])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            {
                std::thread::sleep(Duration::from_millis(500));
            }
            run(
                "sh",
                &[
                    &script.display().to_string(),
                    "restore",
                    &state.display().to_string(),
                ],
            )?;
            done.push(format!(
                "a real cluster died without putting the host back: restored it from {}",
                state.display()
            ));
            if let Some(folder) = state.parent()
                && folder.join(crate::process::REMOVE_ON_EXIT).is_file()
            {
                std::fs::remove_dir_all(folder).with_context(|| format!("removing {}", folder.display()))?;
                done.push(format!("removed its folder {}", folder.display()));
            }
        }
        std::fs::remove_file(&record).with_context(|| format!("removing {}", record.display()))?;
    }

    let links = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .stdin(Stdio::null())
        .output()
        .context("running ip")?;
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        // a veth pair's other end (`-p`) goes with it; `nwbr<n>` is a node's CNI bridge
        let ours = name.starts_with("nw-apiserver") || name.starts_with("nw-node-");
        let bridge = name
            .strip_prefix("nwbr")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if ours && !name.ends_with("-p") || bridge {
            run("ip", &["link", "delete", name])?;
            done.push(format!("removed the link {name} a dead real cluster left"));
        }
    }
    let routes = std::process::Command::new("ip")
        .args(["route", "show", "type", "blackhole"])
        .stdin(Stdio::null())
        .output()
        .context("running ip")?;
    if String::from_utf8_lossy(&routes.stdout)
        .lines()
        .any(|l| l.split_whitespace().any(|w| w == SERVICE_CLUSTER_IP_RANGE))
    {
        run("ip", &["route", "del", "blackhole", SERVICE_CLUSTER_IP_RANGE])?;
        done.push(format!(
            "removed the black hole for {SERVICE_CLUSTER_IP_RANGE} a dead real cluster left"
        ));
    }
    let guard = ["FORWARD", "-s", POD_NETWORK, "!", "-d", POD_NETWORK, "-j", "DROP"];
    // bounded: the rule is added once per run
    for _ in 0..16 {
        let present = std::process::Command::new("iptables")
            .arg("-C")
            .args(guard)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            break;
        }
        let mut args = vec!["-D"];
        args.extend(guard);
        run("iptables", &args)?;
        done.push(format!(
            "removed the FORWARD guard for {POD_NETWORK} a dead real cluster left"
        ));
    }
    Ok(done)
}

impl RealCluster {
    /// Installs what is missing, records the host's state, and starts the control plane, the
    /// scheduler, every node (containerd with the images imported, then the kubelet) and
    /// kube-proxy; returns once every node is Ready and kube-proxy has programmed its rules.
    pub async fn start(config: &RealClusterConfig) -> Result<RealCluster> {
        if let Some(reason) = unavailable_reason() {
            bail!("{reason}");
        }
        if config.nodes == 0 || config.nodes > 8 {
            bail!("a real cluster has 1 to 8 nodes, not {}", config.nodes);
        }
        if config.self_signed_kubelets.len() > 1
            || config.self_signed_kubelets.iter().any(|i| *i >= config.nodes)
        {
            bail!(
                "at most one of the {} nodes can have a self-signed kubelet (they share {KUBELET_DEFAULT_CERT_DIR}), not {:?}",
                config.nodes,
                config.self_signed_kubelets
            );
        }
        install_packages(NODE_PACKAGES).await?;
        let host_lock = if std::env::var_os(HOST_LOCK_HELD_ENV).is_some() {
            None
        } else {
            Some(lock_host().await?)
        };
        let began = Instant::now();
        let nodes: Vec<(String, Ipv4Addr, String)> = (0..config.nodes)
            .map(|i| {
                let letter = (b'a' + i as u8) as char;
                (
                    format!("nodewarden-node-{letter}"),
                    Ipv4Addr::new(10, 200, 0, 11 + i as u8),
                    format!("/nodewarden-node-{letter}"),
                )
            })
            .collect();
        let prepare_nodes = nodes.clone();
        let cp = ControlPlane::start_for_nodes(
            NodeNetwork {
                apiserver_ip: APISERVER_IP,
            },
            move |root| prepare_host(root, &prepare_nodes),
        )
        .await?;
        for name in ["kube-scheduler", "kubelet", "kube-proxy"] {
            if !cp.binaries().path(name).is_file() {
                bail!(
                    "{} is missing: tests/controlplane/build.sh builds it with the control plane",
                    cp.binaries().path(name).display()
                );
            }
        }
        let cluster = RealCluster {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, (name, ip, cgroup_root))| RealNode {
                    name: name.clone(),
                    ip: *ip,
                    cgroup_root: cgroup_root.clone(),
                    self_signed_kubelet: config.self_signed_kubelets.contains(&i),
                    dir: cp.dir().join("nodes").join(name),
                })
                .collect(),
            cp,
            _host_lock: host_lock,
        };
        let result = async {
            cluster.start_scheduler()?;
            for (i, node) in cluster.nodes.iter().enumerate() {
                cluster.start_node(i, node, config).await?;
            }
            cluster.start_proxy().await?;
            for node in &cluster.nodes {
                cluster.wait_node_ready(&node.name).await?;
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = result {
            let logs = cluster.cp.log_tails(40);
            return Err(crate::failure_with(
                e,
                "real cluster start-up failed",
                &format!("last log lines:\n{logs}"),
            ));
        }
        eprintln!(
            "nodewarden-tests: {} real node(s) Ready in {:.1}s",
            cluster.nodes.len(),
            began.elapsed().as_secs_f64()
        );
        Ok(cluster)
    }

    fn start_scheduler(&self) -> Result<()> {
        let cp = &self.cp;
        let cert = cp
            .ca()
            .issue_client("system:kube-scheduler", &[], CERT_VALIDITY)?;
        let kubeconfig = cp.dir().join("kube-scheduler.kubeconfig");
        write_file(&kubeconfig, cp.kubeconfig_for(&cert)?.as_bytes(), true)?;
        let [port]: [u16; 1] = free_ports(1)?
            .try_into()
            .map_err(|_| anyhow!("expected one port"))?;
        let k = kubeconfig.display().to_string();
        cp.spawn_program(
            "kube-scheduler",
            &cp.binaries().path("kube-scheduler"),
            &[
                format!("--kubeconfig={k}"),
                format!("--authentication-kubeconfig={k}"),
                format!("--authorization-kubeconfig={k}"),
                format!("--secure-port={port}"),
                "--bind-address=127.0.0.1".to_string(),
                "--leader-elect=false".to_string(),
                "--v=1".to_string(),
            ],
        )?;
        Ok(())
    }

    async fn start_node(&self, index: usize, node: &RealNode, config: &RealClusterConfig) -> Result<()> {
        let cp = &self.cp;
        let dir = &node.dir;
        for sub in ["containerd", "kubelet", "cni/net.d", "cni/ipam", "certs"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let socket = node.containerd_socket();
        let containerd_config = dir.join("containerd/config.toml");
        write_file(
            &containerd_config,
            containerd_toml(
                dir,
                &socket,
                &config.sandbox_image,
                config.registry_hosts.as_deref(),
            )
            .as_bytes(),
            false,
        )?;
        write_file(
            &dir.join("cni/net.d/10-nodewarden.conflist"),
            cni_conflist(index, dir).as_bytes(),
            false,
        )?;
        cp.spawn_program(
            &format!("containerd-{}", node.name),
            Path::new("containerd"),
            &[format!("--config={}", containerd_config.display())],
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while ctr(&socket, &["version"]).await.is_err() {
            cp.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "containerd of {} did not answer on {} within 30 s",
                    node.name,
                    socket.display()
                );
            }
            pause().await;
        }
        for archive in &config.images {
            import_image(&socket, archive).await?;
        }

        let ca = cp.ca();
        let client = ca.issue_client(
            &format!("system:node:{}", node.name),
            &["system:nodes"],
            CERT_VALIDITY,
        )?;
        let serving = ca.issue_serving(&ServingSpec {
            dns_names: vec![node.name.clone()],
            ip_addresses: vec![IpAddr::V4(node.ip)],
            validity: CERT_VALIDITY,
        })?;
        let certs = dir.join("certs");
        write_file(&certs.join("ca.crt"), cp.ca_pem().as_bytes(), false)?;
        let self_signed = config.self_signed_kubelets.contains(&index);
        if !self_signed {
            write_file(&certs.join("kubelet.crt"), serving.cert_pem.as_bytes(), false)?;
            write_file(&certs.join("kubelet.key"), serving.key_pem.as_bytes(), true)?;
        }
        write_file(
            &dir.join("kubelet.kubeconfig"),
            cp.kubeconfig_for(&client)?.as_bytes(),
            true,
        )?;
        let [healthz]: [u16; 1] = free_ports(1)?
            .try_into()
            .map_err(|_| anyhow!("expected one port"))?;
        write_file(
            &dir.join("kubelet.yaml"),
            kubelet_config(node, &socket, &certs, healthz, self_signed).as_bytes(),
            false,
        )?;
        let mut args = vec![
            format!("--config={}", dir.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", dir.join("kubelet.kubeconfig").display()),
            format!("--root-dir={}", dir.join("kubelet").display()),
            format!("--hostname-override={}", node.name),
            format!("--node-ip={}", node.ip),
            "--v=1".to_string(),
        ];
        if cp.kube_version().minor < 37 {
            // the kubelet's cAdvisor finds containerd at its default socket, where a node's own
            // containerd is not here: without this, /metrics/cadvisor has no pod or container
            // labels (a cAdvisor flag the kubelet took up to 1.36; 1.37 refuses it)
            args.push(format!("--containerd={}", socket.display()));
        }
        if self_signed {
            // no tlsCertFile: the kubelet signs its own certificate (for its host name) and writes
            // it where kubeadm's kubelets keep theirs; the host snapshot removes the folder after
            args.push(format!("--cert-dir={KUBELET_DEFAULT_CERT_DIR}"));
        }
        cp.spawn_program(
            &format!("kubelet-{}", node.name),
            &cp.binaries().path("kubelet"),
            &args,
        )?;
        Ok(())
    }

    async fn start_proxy(&self) -> Result<()> {
        let cp = &self.cp;
        let cert = cp.ca().issue_client("system:kube-proxy", &[], CERT_VALIDITY)?;
        let kubeconfig = cp.dir().join("kube-proxy.kubeconfig");
        write_file(&kubeconfig, cp.kubeconfig_for(&cert)?.as_bytes(), true)?;
        let [metrics, healthz]: [u16; 2] = free_ports(2)?
            .try_into()
            .map_err(|_| anyhow!("expected two ports"))?;
        // One kube-proxy serves every node: the rules are the host's, and a second one would fight
        // the first over them.
        let first = self.nodes.first().context("no node")?;
        cp.spawn_program(
            "kube-proxy",
            &cp.binaries().path("kube-proxy"),
            &[
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--hostname-override={}", first.name),
                "--proxy-mode=iptables".to_string(),
                format!("--cluster-cidr={POD_NETWORK}"),
                format!("--metrics-bind-address=127.0.0.1:{metrics}"),
                format!("--healthz-bind-address=127.0.0.1:{healthz}"),
                // Leave the host's conntrack settings alone.
                "--conntrack-max-per-core=0".to_string(),
                "--conntrack-tcp-timeout-established=0".to_string(),
                "--conntrack-tcp-timeout-close-wait=0".to_string(),
                "--iptables-localhost-nodeports=false".to_string(),
                "--v=1".to_string(),
            ],
        )?;
        // healthy once it has synced its rules (the `kubernetes` Service among them)
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            cp.check_running()?;
            if let Ok((200, _)) = crate::webhooks::http_get(healthz, "/healthz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("kube-proxy not healthy on 127.0.0.1:{healthz} after 60 s");
            }
            pause().await;
        }
    }

    /// A new, empty folder for the agents' checkpoints (the chart's `agent.checkpoint.hostPath`),
    /// inside the cluster's folder, so it goes with the cluster and no run starts from an
    /// earlier run's histograms.
    pub fn fresh_checkpoint_dir(&self) -> Result<PathBuf> {
        let dir = self.cp.dir().join("checkpoints");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    /// Waits until the Node reports Ready.
    pub async fn wait_node_ready(&self, name: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.cp.admin_client().await?);
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            self.cp.check_running()?;
            if let Some(node) = nodes.get_opt(name).await? {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("node {name} not Ready after {NODE_READY_TIMEOUT:?}");
            }
            pause().await;
        }
    }

    /// Imports an OCI image archive into every node's containerd (namespace `k8s.io`).
    pub async fn import_image(&self, archive: &Path) -> Result<()> {
        for node in &self.nodes {
            import_image(&node.containerd_socket(), archive).await?;
        }
        Ok(())
    }

    /// Stops everything, puts the host back as it was and fails, naming each difference, when
    /// anything the nodes changed is still there.
    pub fn shutdown(self) -> Result<()> {
        let diff = self.cp.stop_and_restore_host()?;
        if !diff.is_empty() {
            bail!(
                "the host is not as before the real nodes started:\n  {}",
                diff.join("\n  ")
            );
        }
        Ok(())
    }
}

/// Runs `tests/node/packages.sh` for `packages` (installs what is missing).
pub async fn install_packages(packages: &[&str]) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/packages.sh");
    let status = tokio::process::Command::new("bash")
        .arg(&script)
        .args(packages)
        .stdin(Stdio::null())
        .status()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("{} {} failed ({status})", script.display(), packages.join(" "));
    }
    Ok(())
}

async fn ctr(socket: &Path, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running ctr (Debian's containerd package)")?;
    if !out.status.success() {
        bail!(
            "ctr {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn import_image(socket: &Path, archive: &Path) -> Result<()> {
    let path = archive.to_str().context("image archive path is not UTF-8")?;
    ctr(socket, &["images", "import", "--no-unpack", path])
        .await
        .with_context(|| format!("importing {}", archive.display()))?;
    Ok(())
}

/// Records the host's state and sets up what the nodes share: the addresses, the black hole for
/// Service IPs, the guard that keeps pod traffic on the machine, and each node's cgroup root.
fn prepare_host(root: &Path, nodes: &[(String, Ipv4Addr, String)]) -> Result<()> {
    let state = root.join("host-state");
    let script = state.join("host-state.sh");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/host-state.sh");
    run(
        "sh",
        &[
            &source.display().to_string(),
            "snapshot",
            &state.display().to_string(),
        ],
    )?;
    // the watchdog runs this copy, so it must not depend on the source tree
    std::fs::copy(&source, &script).with_context(|| format!("copying {}", source.display()))?;
    // from here on the host is this run's to put back, also by the next run if this one and its
    // watchdog die together
    write_file(
        &host_record_path(),
        format!("{}\n{}\n", state.display(), boot_id()).as_bytes(),
        false,
    )?;
    write_file(
        &state.join("owner"),
        format!("{}\n", root.display()).as_bytes(),
        false,
    )?;
    let roots: String = nodes.iter().fold(String::new(), |mut s, (_, _, cg)| {
        let _ = writeln!(s, "{}", cg.trim_start_matches('/'));
        s
    });
    write_file(&state.join("cgroup-roots"), roots.as_bytes(), false)?;
    write_file(
        &state.join("conntrack-ranges"),
        format!("{NODE_ADDRESSES}\n{POD_NETWORK}\n{SERVICE_CLUSTER_IP_RANGE}\n").as_bytes(),
        false,
    )?;

    let mut addresses = vec![("nw-apiserver".to_string(), APISERVER_IP)];
    for (i, (_, ip, _)) in nodes.iter().enumerate() {
        addresses.push((format!("nw-node-{i}"), *ip));
    }
    for (link, ip) in &addresses {
        // dummy links are not available everywhere; a veth pair is
        run(
            "ip",
            &[
                "link",
                "add",
                link,
                "type",
                "veth",
                "peer",
                "name",
                &format!("{link}-p"),
            ],
        )?;
        run("ip", &["addr", "add", &format!("{ip}/32"), "dev", link])?;
        run("ip", &["link", "set", link, "up"])?;
        run("ip", &["link", "set", &format!("{link}-p"), "up"])?;
    }
    run("ip", &["route", "add", "blackhole", SERVICE_CLUSTER_IP_RANGE])?;
    run(
        "iptables",
        &[
            "-I",
            "FORWARD",
            "-s",
            POD_NETWORK,
            "!",
            "-d",
            POD_NETWORK,
            "-j",
            "DROP",
        ],
    )?;
    for (_, _, cgroup_root) in nodes {
        create_cgroup_root(cgroup_root)?;
    }
    Ok(())
}

/// Creates `/sys/fs/cgroup/<hierarchy><root>` in every cgroup v1 hierarchy (the kubelet expects its
/// `--cgroup-root` to exist), or `/sys/fs/cgroup<root>` on a cgroup v2 host.
fn create_cgroup_root(root: &str) -> Result<()> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        let dir = base.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        return Ok(());
    }
    for entry in std::fs::read_dir(base).with_context(|| format!("reading {}", base.display()))? {
        let hierarchy = entry?.path();
        if !hierarchy.join("cgroup.procs").exists() {
            continue; // a symlink such as cpuacct -> cpu,cpuacct is created once, at its target
        }
        let dir = hierarchy.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // a new cpuset cgroup has no CPUs or memory nodes: give it its parent's
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(dir.join(file), v.trim())
                    .with_context(|| format!("writing {}", dir.join(file).display()))?;
            }
        }
    }
    Ok(())
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Puts the host back as `<dir>/host-state` recorded it, when it did (a real-node control plane).
pub(crate) fn restore_host_state(dir: &Path) {
    let state = dir.join("host-state");
    let script = state.join("host-state.sh");
    if script.is_file() {
        let _ = std::process::Command::new("sh")
            .arg(&script)
            .arg("restore")
            .arg(&state)
            .stdin(Stdio::null())
            .status();
        forget_host_record(&state);
    }
}

/// Removes the record of a real cluster's host state when it names `state` (put back now).
pub(crate) fn forget_host_record(state: &Path) {
    let record = host_record_path();
    if std::fs::read_to_string(&record).is_ok_and(|t| t.lines().next() == Some(&*state.to_string_lossy())) {
        let _ = std::fs::remove_file(&record);
    }
}

/// What differs from the host state recorded in `<dir>/host-state` (empty: nothing, or no record).
pub(crate) fn host_state_diff(dir: &Path) -> Result<Vec<String>> {
    let state = dir.join("host-state");
    if !state.join("host-state.sh").is_file() {
        return Ok(Vec::new());
    }
    HostSnapshot { dir: state }.diff()
}

/// A record of the host's state (see `tests/node/host-state.sh`), to compare with later.
#[derive(Debug)]
pub struct HostSnapshot {
    dir: PathBuf,
}

impl HostSnapshot {
    /// Records the host's state into `dir` (a folder that does not exist yet).
    pub fn take(dir: &Path) -> Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/host-state.sh");
        run(
            "sh",
            &[
                &script.display().to_string(),
                "snapshot",
                &dir.display().to_string(),
            ],
        )?;
        std::fs::copy(&script, dir.join("host-state.sh"))
            .with_context(|| format!("copying {}", script.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// What differs from the record now, one line per difference (empty: the host is as before).
    pub fn diff(&self) -> Result<Vec<String>> {
        let out = std::process::Command::new("sh")
            .arg(self.dir.join("host-state.sh"))
            .arg("diff")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .context("running host-state.sh diff")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect())
    }
}

fn containerd_toml(dir: &Path, socket: &Path, sandbox_image: &str, registry_hosts: Option<&Path>) -> String {
    let d = dir.join("containerd");
    let registry = registry_hosts
        .map(|hosts| {
            format!(
                "  [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"{}\"\n",
                hosts.display()
            )
        })
        .unwrap_or_default();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # without it, creating a sandbox fails where oom_score_adj cannot be lowered (no CAP_SYS_RESOURCE)
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
{registry}"#,
        root = d.join("root").display(),
        state = d.join("state").display(),
        socket = socket.display(),
        opt = d.join("opt").display(),
        cni_bin = CNI_BIN_DIR,
        cni_conf = dir.join("cni/net.d").display(),
    )
}

fn cni_conflist(index: usize, dir: &Path) -> String {
    let subnet = format!("10.201.{}.0/24", index + 1);
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("nodewarden-{index}"),
        "plugins": [
            {
                "type": "bridge",
                "bridge": format!("nwbr{index}"),
                "isGateway": true,
                // no masquerading: nothing a pod sends may leave the machine
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

fn kubelet_config(
    node: &RealNode,
    socket: &Path,
    certs: &Path,
    healthz_port: u16,
    self_signed: bool,
) -> String {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let serving = if self_signed {
        "# no serving certificate: the kubelet signs its own (kubeadm's and kind's default)\n".to_string()
    } else {
        format!(
            "tlsCertFile: \"{}\"\ntlsPrivateKeyFile: \"{}\"\n",
            certs.join("kubelet.crt").display(),
            certs.join("kubelet.key").display()
        )
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{ip}"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
cgroupDriver: cgroupfs
cgroupRoot: "{cgroup_root}"
# cgroup v1 hosts still run kubelet 1.36 when asked to
failCgroupV1: {fail_v1}
containerRuntimeEndpoint: "unix://{socket}"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{ca}"
authorization:
  mode: Webhook
{serving}# pods get no DNS: nothing they resolve could be reached anyway
resolvConf: ""
failSwapOn: false
# a shared test machine whose disk other work fills and empties: evict nothing, collect no
# images ("0%" switches a signal off; one left out would get its default, 10 % of a disk)
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
staticPodPath: ""
"#,
        ip = node.ip,
        cgroup_root = node.cgroup_root,
        fail_v1 = if v2 { "true" } else { "false" },
        socket = socket.display(),
        ca = certs.join("ca.crt").display(),
    )
}
