//! A cgroup v2 Kubernetes node in a virtual machine: Debian with systemd on the unified cgroup
//! hierarchy, containerd 2.x with `SystemdCgroup = true` and a kubelet with `cgroupDriver: systemd`
//! and default settings otherwise (it refuses cgroup v1, signs its own serving certificate),
//! joining a [`RealCluster`]'s API server. For hosts whose own cgroups are v1 and must stay so.
//!
//! The guest runs under QEMU with software emulation (TCG; no KVM needed) from the image
//! `tests/node/vm/build.sh` builds and caches, behind a copy-on-write overlay of its own that goes
//! with the run. Its network is QEMU's user-mode network, restricted: the guest reaches nothing
//! but the API server, through one forwarding rule (each connection a `socat` on the host to the
//! API server's address). The guest's pods (`10.202.0.0/24`, inside the guest) reach the API
//! server through the `kubernetes` Service by the guest's own kube-proxy, masqueraded to the
//! guest's address. The harness talks to the guest through qemu-guest-agent on a virtio-serial
//! port (`guest-exec`), and writes the node's configuration, credentials and image archives into
//! a share folder (virtfs, read-only in the guest).
//!
//! The QEMU process is a process of the control plane: killed with it, and by its watchdog when
//! the test process dies. On the host the node adds two black-hole routes (its address and its pod
//! network, which nothing on the host can reach), which the cluster's host snapshot removes.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::node::{APISERVER_IP, ContainerCgroup, RealCluster, install_packages};
use crate::process::{pause, write_file};
use crate::registry::Registry;

/// Debian packages the host needs to run the guest (building its image needs more: see
/// `tests/node/vm/build.sh`).
pub const VM_HOST_PACKAGES: &[&str] = &["qemu-system-x86", "qemu-utils", "socat"];

/// The guest's address on its user-mode network, also its Node's InternalIP.
pub const VM_NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 30);
/// The user-mode network's own side (gateway and DNS addresses the guest is offered; neither
/// forwards anything).
const SLIRP_HOST: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
const SLIRP_DNS: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 3);
/// The guest's pod network (inside the guest; black-holed on the host).
pub const VM_POD_NETWORK: &str = "10.202.0.0/24";
/// The taint the node registers with: only pods that tolerate it run there (the chart's agent
/// tolerates everything; its webhook, which the API server must reach, does not).
pub const VM_TAINT_KEY: &str = "nodewarden.io/virtual-machine";

const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
const AGENT_REPLY_TIMEOUT: Duration = Duration::from_secs(20);
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(300);
const CERT_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Where the guest mounts the share folder (`guest/mnt-nodewarden.mount`).
const GUEST_SHARE: &str = "/mnt/nodewarden";
/// The address at which the guest reaches a [`Registry`] of the host (each connection a `socat`
/// on the host to the registry's loopback port): its serving certificate must name it.
pub const REGISTRY_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 4);
/// containerd's registry host folder in the guest (`config_path`), in the share folder.
const GUEST_REGISTRY_HOSTS: &str = "/mnt/nodewarden/certs.d";

/// What a [`VmNode`] starts with.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The Node's name.
    pub name: String,
    /// OCI image archives imported into the guest's containerd before its kubelet starts.
    pub images: Vec<PathBuf>,
    /// The sandbox ("pause") image; must be among `images`.
    pub sandbox_image: String,
    /// Virtual CPUs (software-emulated, one host thread each).
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
    /// A registry of the host that the guest's containerd pulls [`crate::registry::UPSTREAM`]'s
    /// images from (a mirror, at [`REGISTRY_IP`]); its certificate must name [`REGISTRY_IP`].
    pub registry: Option<Arc<Registry>>,
}

impl VmConfig {
    /// Two CPUs and 2 GiB, the given name and images.
    pub fn new(name: &str, images: Vec<PathBuf>, sandbox_image: &str) -> Self {
        Self {
            name: name.to_string(),
            images,
            sandbox_image: sandbox_image.to_string(),
            cpus: 2,
            memory_mib: 2048,
            registry: None,
        }
    }
}

/// How long the steps of a start took.
#[derive(Clone, Debug, Default)]
pub struct VmTimings {
    /// QEMU started → the guest agent answers.
    pub agent: Duration,
    /// QEMU started → systemd reports the system running (boot finished).
    pub systemd_ready: Duration,
    /// QEMU started → containerd up and the images imported.
    pub runtime_ready: Duration,
    /// QEMU started → the Node is Ready.
    pub node_ready: Duration,
}

/// What a command in the guest printed and how it ended.
#[derive(Clone, Debug)]
pub struct ExecOutput {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// A running guest that is (once [`VmNode::start`] returns) a Ready node of the cluster.
#[derive(Debug)]
pub struct VmNode {
    pub name: String,
    pub ip: Ipv4Addr,
    pub timings: VmTimings,
    dir: PathBuf,
    process: String,
    /// The registry's port on the host, when the guest pulls from one.
    registry_port: Option<u16>,
}

/// Builds (or finds in the cache) the guest's image with `tests/node/vm/build.sh`; returns its
/// folder (`root.img`, `vmlinuz`, `initrd.img`, `info`). `NODEWARDEN_VM_IMAGE=<folder>` uses
/// that folder instead.
pub async fn vm_image() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("NODEWARDEN_VM_IMAGE") {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/vm/build.sh");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .context("vm/build.sh printed no folder")?;
    for file in ["root.img", "vmlinuz", "initrd.img"] {
        ensure!(dir.join(file).is_file(), "{} has no {file}", dir.display());
    }
    Ok(dir)
}

impl VmNode {
    /// Boots a guest for `cluster` from the cached image, starts containerd (importing
    /// `config.images`), the kubelet and kube-proxy in it, and returns once its Node is Ready.
    pub async fn start(cluster: &RealCluster, config: &VmConfig) -> Result<VmNode> {
        let cp = &cluster.cp;
        ensure!(
            cp.dir().join("host-state/host-state.sh").is_file(),
            "a virtual-machine node joins a real cluster (whose host state is recorded)"
        );
        install_packages(VM_HOST_PACKAGES).await?;
        let image = vm_image().await?;
        let dir = cp.dir().join("vms").join(&config.name);
        let share = dir.join("share");
        for sub in ["share/images", "share/cni"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let mut node = VmNode {
            name: config.name.clone(),
            ip: VM_NODE_IP,
            timings: VmTimings::default(),
            process: format!("vm-{}", config.name),
            dir,
            registry_port: config.registry.as_ref().map(|r| r.port()),
        };
        let archives = node.write_share(cluster, config, &share)?;

        // Nothing on the host can reach the guest's addresses: make sure nothing tries by the
        // default route (the host snapshot removes these routes with the cluster).
        for dest in [format!("{VM_NODE_IP}/32"), VM_POD_NETWORK.to_string()] {
            run_host("ip", &["route", "replace", "blackhole", &dest])?;
        }

        let overlay = node.dir.join("root.qcow2");
        run_host(
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                path_str(&image.join("root.img"))?,
                path_str(&overlay)?,
            ],
        )?;
        let began = Instant::now();
        let args = node.qemu_args(cluster, config, &image, &overlay, &share)?;
        cp.spawn_program(&node.process, Path::new("qemu-system-x86_64"), &args)?;

        let result = node.bring_up(cluster, &archives, began).await;
        if let Err(e) = result {
            let serial = crate::process::tail(&node.serial_log(), 30);
            let journal = match node
                .sh("journalctl -b --no-pager -n 40 -u containerd -u kubelet -u kube-proxy")
                .await
            {
                Ok(o) => o.stdout,
                Err(e) => format!("(no journal: {e:#})"),
            };
            // the run's folder (console log, overlay) goes with the cluster's
            let _ = cp.kill_program(&node.process);
            return Err(crate::failure_with(
                e,
                &format!("virtual-machine node {} did not come up", node.name),
                &format!("guest journal:\n{journal}\nserial console:\n{serial}"),
            ));
        }
        eprintln!(
            "nodewarden-tests: VM node {} Ready in {:.1}s (guest agent {:.1}s, systemd ready {:.1}s, containerd with images {:.1}s)",
            node.name,
            node.timings.node_ready.as_secs_f64(),
            node.timings.agent.as_secs_f64(),
            node.timings.systemd_ready.as_secs_f64(),
            node.timings.runtime_ready.as_secs_f64(),
        );
        Ok(node)
    }

    async fn bring_up(&mut self, cluster: &RealCluster, archives: &[String], began: Instant) -> Result<()> {
        let cp = &cluster.cp;
        let deadline = began + BOOT_TIMEOUT;
        loop {
            cp.check_running()?;
            if self
                .agent_call("guest-ping", None, Duration::from_secs(3))
                .await
                .is_ok()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("the guest agent did not answer within {BOOT_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.timings.agent = began.elapsed();
        loop {
            cp.check_running()?;
            let state = self.exec(&["systemctl", "is-system-running"]).await?;
            match state.stdout.trim() {
                "running" => break,
                "degraded" => {
                    let failed = self.sh("systemctl --failed --no-legend --plain").await?;
                    bail!("the guest booted degraded: {}", failed.stdout.trim());
                }
                _ if Instant::now() > deadline => {
                    bail!("the guest's systemd did not finish booting within {BOOT_TIMEOUT:?}")
                }
                _ => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
        self.timings.systemd_ready = began.elapsed();

        self.checked(&["systemctl", "start", "containerd.service"])
            .await?;
        for archive in archives {
            self.checked(&[
                "/usr/local/bin/ctr",
                "--namespace",
                "k8s.io",
                "images",
                "import",
                archive,
            ])
            .await
            .with_context(|| format!("importing {archive} in the guest"))?;
        }
        self.timings.runtime_ready = began.elapsed();
        // kube-proxy sets conntrack limits at start and fails when the module is not loaded yet
        // (nothing has used conntrack in a freshly booted guest)
        self.checked(&["/sbin/modprobe", "nf_conntrack"]).await?;
        self.checked(&["systemctl", "start", "kubelet.service", "kube-proxy.service"])
            .await?;
        self.wait_ready(cluster, began + NODE_READY_TIMEOUT.max(BOOT_TIMEOUT))
            .await?;
        self.timings.node_ready = began.elapsed();
        Ok(())
    }

    /// Writes the node's configuration, credentials and images into the share folder; returns the
    /// archives' paths as the guest sees them.
    fn write_share(&self, cluster: &RealCluster, config: &VmConfig, share: &Path) -> Result<Vec<String>> {
        let cp = &cluster.cp;
        let ca = cp.ca();
        write_file(&share.join("ca.crt"), cp.ca_pem().as_bytes(), false)?;
        let kubelet = ca.issue_client(
            &format!("system:node:{}", self.name),
            &["system:nodes"],
            CERT_VALIDITY,
        )?;
        write_file(
            &share.join("kubelet.kubeconfig"),
            cp.kubeconfig_for(&kubelet)?.as_bytes(),
            true,
        )?;
        let proxy = ca.issue_client("system:kube-proxy", &[], CERT_VALIDITY)?;
        write_file(
            &share.join("kube-proxy.kubeconfig"),
            cp.kubeconfig_for(&proxy)?.as_bytes(),
            true,
        )?;
        write_file(&share.join("kubelet.yaml"), kubelet_config().as_bytes(), false)?;
        write_file(
            &share.join("kubelet.env"),
            format!(
                "KUBELET_ARGS=--config={GUEST_SHARE}/kubelet.yaml --kubeconfig={GUEST_SHARE}/kubelet.kubeconfig --hostname-override={name} --node-ip={VM_NODE_IP} --v=1\n",
                name = self.name
            )
            .as_bytes(),
            false,
        )?;
        write_file(
            &share.join("kube-proxy.env"),
            format!(
                "KUBE_PROXY_ARGS=--kubeconfig={GUEST_SHARE}/kube-proxy.kubeconfig --hostname-override={name} --proxy-mode=iptables --cluster-cidr={VM_POD_NETWORK} --v=1\n",
                name = self.name
            )
            .as_bytes(),
            false,
        )?;
        write_file(
            &share.join("containerd.toml"),
            containerd_toml(&config.sandbox_image, config.registry.is_some()).as_bytes(),
            false,
        )?;
        if let Some(registry) = &config.registry {
            registry.write_mirror(
                &share.join("certs.d"),
                REGISTRY_IP,
                Path::new(GUEST_REGISTRY_HOSTS),
            )?;
        }
        write_file(
            &share.join("cni/10-nodewarden.conflist"),
            cni_conflist().as_bytes(),
            false,
        )?;
        let mut archives = Vec::new();
        for (i, archive) in config.images.iter().enumerate() {
            let file = format!("{i}.oci.tar");
            let to = share.join("images").join(&file);
            // a hard link when the archive is on the same file system, else a copy
            if std::fs::hard_link(archive, &to).is_err() {
                std::fs::copy(archive, &to)
                    .with_context(|| format!("copying {} into the share folder", archive.display()))?;
            }
            archives.push(format!("{GUEST_SHARE}/images/{file}"));
        }
        Ok(archives)
    }

    fn qemu_args(
        &self,
        cluster: &RealCluster,
        config: &VmConfig,
        image: &Path,
        overlay: &Path,
        share: &Path,
    ) -> Result<Vec<String>> {
        let port = apiserver_port(cluster.cp.apiserver_url())?;
        // every connection the guest opens to the API server's address is one socat on the host;
        // `restrict=on`: nothing else leaves the guest
        let mut netdev = format!(
            "user,id=net0,restrict=on,ipv6=off,net=10.200.0.0/24,host={SLIRP_HOST},dns={SLIRP_DNS},dhcpstart={VM_NODE_IP},guestfwd=tcp:{APISERVER_IP}:{port}-cmd:socat STDIO TCP:{APISERVER_IP}:{port}"
        );
        // and to the registry, when it pulls from one
        if let Some(registry) = &config.registry {
            let port = registry.port();
            netdev.push_str(&format!(
                ",guestfwd=tcp:{REGISTRY_IP}:{port}-cmd:socat STDIO TCP:127.0.0.1:{port}"
            ));
        }
        Ok(vec![
            "-name".to_string(),
            self.name.clone(),
            "-nodefaults".to_string(),
            "-no-user-config".to_string(),
            "-no-reboot".to_string(),
            "-display".to_string(),
            "none".to_string(),
            "-monitor".to_string(),
            "none".to_string(),
            "-accel".to_string(),
            "tcg,thread=multi".to_string(),
            "-cpu".to_string(),
            "max".to_string(),
            "-smp".to_string(),
            config.cpus.to_string(),
            "-m".to_string(),
            config.memory_mib.to_string(),
            "-kernel".to_string(),
            path_str(&image.join("vmlinuz"))?.to_string(),
            "-initrd".to_string(),
            path_str(&image.join("initrd.img"))?.to_string(),
            "-append".to_string(),
            "root=/dev/vda rw console=ttyS0 panic=-1 quiet net.ifnames=0 systemd.unified_cgroup_hierarchy=1"
                .to_string(),
            "-drive".to_string(),
            // the overlay is thrown away with the run: no need to flush it
            format!("file={},if=virtio,format=qcow2,cache=unsafe", path_str(overlay)?),
            "-serial".to_string(),
            format!("file:{}", path_str(&self.serial_log())?),
            "-virtfs".to_string(),
            format!(
                "local,path={},mount_tag=nodewarden,security_model=none,readonly=on,id=share",
                path_str(share)?
            ),
            "-netdev".to_string(),
            netdev,
            "-device".to_string(),
            "virtio-net-pci,netdev=net0".to_string(),
            "-chardev".to_string(),
            format!(
                "socket,id=qga,path={},server=on,wait=off",
                path_str(&self.agent_socket())?
            ),
            "-device".to_string(),
            "virtio-serial".to_string(),
            "-device".to_string(),
            "virtserialport,chardev=qga,name=org.qemu.guest_agent.0".to_string(),
        ])
    }

    /// The guest's serial console, as QEMU writes it (kernel and systemd messages).
    pub fn serial_log(&self) -> PathBuf {
        self.dir.join("serial.log")
    }

    fn agent_socket(&self) -> PathBuf {
        self.dir.join("qga.sock")
    }

    /// Waits until the Node reports Ready (until `deadline`).
    pub async fn wait_ready(&self, cluster: &RealCluster, deadline: Instant) -> Result<()> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(cluster.cp.admin_client().await?);
        loop {
            cluster.cp.check_running()?;
            let node = nodes.get_opt(&self.name).await?;
            let ready = node
                .as_ref()
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let state = match &node {
                    None => "not registered".to_string(),
                    Some(n) => format!("{:?}", n.status.as_ref().and_then(|s| s.conditions.as_ref())),
                };
                bail!("node {} not Ready in time: {state}", self.name);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Runs `argv` in the guest (as root, through the guest agent) and returns its output, whatever
    /// its exit code; fails when it cannot run or outlives two minutes.
    pub async fn exec(&self, argv: &[&str]) -> Result<ExecOutput> {
        let (path, args) = argv.split_first().context("exec needs a program")?;
        let started = self
            .agent_call(
                "guest-exec",
                Some(json!({"path": path, "arg": args, "capture-output": true})),
                AGENT_REPLY_TIMEOUT,
            )
            .await?;
        let pid = started["pid"]
            .as_i64()
            .with_context(|| format!("guest-exec gave no pid: {started}"))?;
        let deadline = Instant::now() + EXEC_TIMEOUT;
        loop {
            let status = self
                .agent_call(
                    "guest-exec-status",
                    Some(json!({"pid": pid})),
                    AGENT_REPLY_TIMEOUT,
                )
                .await?;
            if status["exited"].as_bool() == Some(true) {
                let text = |key: &str| -> Result<String> {
                    use base64::Engine;
                    let data = status[key].as_str().unwrap_or("");
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(data)
                        .with_context(|| format!("guest-exec {key} is not base64"))?;
                    Ok(String::from_utf8_lossy(&bytes).into_owned())
                };
                return Ok(ExecOutput {
                    // killed by a signal: no exit code
                    code: status["exitcode"].as_i64().unwrap_or(-1),
                    stdout: text("out-data")?,
                    stderr: text("err-data")?,
                });
            }
            if Instant::now() > deadline {
                bail!(
                    "`{}` in the guest still running after {EXEC_TIMEOUT:?}",
                    argv.join(" ")
                );
            }
            pause().await;
        }
    }

    /// `sh -c script` in the guest.
    pub async fn sh(&self, script: &str) -> Result<ExecOutput> {
        self.exec(&["/bin/sh", "-c", script]).await
    }

    /// Runs `argv` in the guest and fails, with its stderr, unless it exits 0; returns its stdout.
    pub async fn checked(&self, argv: &[&str]) -> Result<String> {
        let out = self.exec(argv).await?;
        if out.code != 0 {
            bail!(
                "`{}` in the guest exited {}: {}",
                argv.join(" "),
                out.code,
                out.stderr.trim()
            );
        }
        Ok(out.stdout)
    }

    /// A file of the guest, as text.
    pub async fn read_file(&self, path: &str) -> Result<String> {
        self.checked(&["/bin/cat", path]).await
    }

    /// One request to the guest agent on a connection of its own: a `guest-sync` with a fresh id
    /// first (whatever an earlier, abandoned connection left unread is skipped), then `command`.
    async fn agent_call(&self, command: &str, arguments: Option<Value>, wait: Duration) -> Result<Value> {
        let socket = self.agent_socket();
        let call = async {
            let stream = UnixStream::connect(&socket)
                .await
                .with_context(|| format!("connecting to {}", socket.display()))?;
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            let id = next_sync_id();
            write
                .write_all(
                    format!("{}\n", json!({"execute": "guest-sync", "arguments": {"id": id}})).as_bytes(),
                )
                .await?;
            loop {
                let line = lines
                    .next_line()
                    .await?
                    .context("the guest agent closed the connection")?;
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && v["return"].as_u64() == Some(id)
                {
                    break;
                }
            }
            let mut request = json!({"execute": command});
            if let Some(a) = arguments {
                request["arguments"] = a;
            }
            write.write_all(format!("{request}\n").as_bytes()).await?;
            loop {
                let line = lines
                    .next_line()
                    .await?
                    .context("the guest agent closed the connection")?;
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(e) = v.get("error") {
                    bail!("guest agent: {command} failed: {e}");
                }
                if let Some(r) = v.get("return") {
                    return Ok(r.clone());
                }
            }
        };
        tokio::time::timeout(wait, call)
            .await
            .map_err(|_| anyhow!("the guest agent did not answer {command} within {wait:?}"))?
    }

    /// What the kubelet applied to the cgroup of `pod`'s first container in the guest, with the
    /// cgroup's path (systemd driver:
    /// `kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice/cri-containerd-<id>.scope`).
    pub async fn container_cgroup(&self, pod: &Pod) -> Result<(String, ContainerCgroup)> {
        let path = systemd_container_cgroup(pod)?;
        let dir = format!("/sys/fs/cgroup/{path}");
        let read = |v: String, file: &str| -> Result<Option<u64>> {
            match v.trim() {
                "max" => Ok(None),
                v => {
                    Ok(Some(v.parse().with_context(|| {
                        format!("{dir}/{file}: {v:?} is not a number")
                    })?))
                }
            }
        };
        let weight = read(self.read_file(&format!("{dir}/cpu.weight")).await?, "cpu.weight")?;
        let memory = read(self.read_file(&format!("{dir}/memory.max")).await?, "memory.max")?;
        Ok((
            path,
            ContainerCgroup {
                cpu_shares: None,
                cpu_weight: weight,
                memory_limit: memory,
            },
        ))
    }

    /// Kills QEMU, deletes the run's overlay, share folder and console log, and fails when a
    /// process of the guest's (QEMU, a forwarding socat) is still there after a few seconds.
    pub fn shutdown(self, cluster: &RealCluster) -> Result<()> {
        let killed = cluster.cp.kill_program(&self.process);
        let port = apiserver_port(cluster.cp.apiserver_url())?;
        let forwarder = format!("socat STDIO TCP:{APISERVER_IP}:{port}");
        let registry = self
            .registry_port
            .map(|port| format!("socat STDIO TCP:127.0.0.1:{port}"));
        let dir = self.dir.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        let left = loop {
            let left = processes_matching(|cmdline| {
                cmdline.contains(&dir) || cmdline == forwarder || Some(cmdline) == registry.as_deref()
            });
            if left.is_empty() || Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("removing {}", self.dir.display()))?;
        killed.with_context(|| format!("stopping the VM node {}", self.name))?;
        ensure!(
            left.is_empty(),
            "processes of the VM node {} still run: {left:?}",
            self.name
        );
        Ok(())
    }
}

/// The cgroup (relative to `/sys/fs/cgroup`) the systemd driver gives `pod`'s first container.
pub fn systemd_container_cgroup(pod: &Pod) -> Result<String> {
    let uid = pod.metadata.uid.as_deref().context("the pod has no uid")?;
    let status = pod.status.as_ref().context("the pod has no status")?;
    let id = status
        .container_statuses
        .as_ref()
        .and_then(|s| s.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .context("the pod's first container has no containerd ID yet")?;
    let pod_part = uid.replace('-', "_");
    Ok(match status.qos_class.as_deref() {
        Some("Guaranteed") => {
            format!("kubepods.slice/kubepods-pod{pod_part}.slice/cri-containerd-{id}.scope")
        }
        Some(qos) => {
            let qos = qos.to_ascii_lowercase();
            format!(
                "kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{pod_part}.slice/cri-containerd-{id}.scope"
            )
        }
        None => bail!("the pod has no QoS class"),
    })
}

/// Command lines (NUL turned into spaces, trimmed) of the processes for which `matches` holds.
fn processes_matching(matches: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id().to_string();
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.bytes().all(|b| b.is_ascii_digit()) && name != me
        })
        .filter_map(|e| {
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw)
                .replace('\0', " ")
                .trim()
                .to_string();
            matches(&cmdline).then(|| format!("{} {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// A `guest-sync` id no other call of this process uses (the process id in the high bits, so two
/// test processes never expect each other's answers).
fn next_sync_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    u64::from(std::process::id()) << 32 | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn apiserver_port(url: &str) -> Result<u16> {
    url.rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in the API server's URL {url}"))
}

fn path_str(p: &Path) -> Result<&str> {
    let s = p
        .to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))?;
    // QEMU's option syntax splits at commas
    ensure!(
        !s.contains(','),
        "{s} contains a comma, which QEMU options cannot hold"
    );
    Ok(s)
}

fn run_host(program: &str, args: &[&str]) -> Result<()> {
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

/// The guest kubelet's configuration: the systemd cgroup driver and the defaults (cgroup v1
/// refused, a self-signed serving certificate), but for what a shared test machine needs (no
/// evictions, no image garbage collection, no DNS) and the taint.
fn kubelet_config() -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{GUEST_SHARE}/ca.crt"
authorization:
  mode: Webhook
# no tlsCertFile: the kubelet signs its own serving certificate into /var/lib/kubelet/pki
resolvConf: ""
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerWithTaints:
- key: "{VM_TAINT_KEY}"
  value: "true"
  effect: NoSchedule
"#
    )
}

/// containerd 2.x (configuration version 3): runc through systemd (`SystemdCgroup = true`), the
/// test image as the sandbox image, the CNI configuration from the share folder, and with
/// `registry` the registry host folder there.
fn containerd_toml(sandbox_image: &str, registry: bool) -> String {
    let registry = if registry {
        format!(
            "  [plugins.'io.containerd.cri.v1.images'.registry]\n    config_path = '{GUEST_REGISTRY_HOSTS}'\n"
        )
    } else {
        String::new()
    };
    format!(
        r#"version = 3

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox_image}'
{registry}
[plugins.'io.containerd.cri.v1.runtime']
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '/usr/sbin/runc'
        SystemdCgroup = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{GUEST_SHARE}/cni'
"#
    )
}

/// The guest's pod network: one bridge, masqueraded to the guest's address (the only address the
/// user-mode network forwards for), so pods reach the API server through its Service.
fn cni_conflist() -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "nodewarden-vm",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": VM_POD_NETWORK}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}
