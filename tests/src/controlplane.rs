//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use nodewarden_certs::{Ca, CaConfig, IssuedCert, ServingSpec};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::process::{Processes, free_ports, pause, write_file};

/// The issuer every service-account token of the test cluster carries.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The Service IP range of the test cluster.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";

const CERT_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long start-up may take once the binaries are built.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Starts of a control plane tried when one of its processes finds its port taken.
const START_TRIES: u32 = 3;
/// What etcd, kube-apiserver and kube-controller-manager log when their port is taken.
const PORT_TAKEN: &str = "address already in use";

/// Binaries the control plane needs, from one folder.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub dir: PathBuf,
}

/// The Kubernetes version a test run's control plane runs: `$NODEWARDEN_KUBE_VERSION` (e.g.
/// `v1.30.14` or `1.37.2`; `cargo xtask compat` sets it), else the one pinned in
/// `controlplane/go.mod`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeVersion {
    /// `v1.30.14`, `v1.38.0-beta.0`
    pub text: String,
    pub minor: u32,
}

impl KubeVersion {
    /// `vMAJOR.MINOR.PATCH` with an optional pre-release; the leading `v` may be left out.
    pub fn parse(s: &str) -> Result<Self> {
        let text = format!("v{}", s.trim().trim_start_matches('v'));
        let core = text[1..].split('-').next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        let numbers: Option<Vec<u32>> = parts.iter().map(|p| p.parse().ok()).collect();
        match numbers.as_deref() {
            Some([1, minor, _patch]) => Ok(Self { minor: *minor, text }),
            _ => bail!("{s:?} is not a Kubernetes version (expected e.g. v1.30.14 or v1.38.0-beta.0)"),
        }
    }

    /// The version `controlplane/go.mod` pins (what `controlplane/build.sh` builds).
    pub fn pinned() -> Self {
        let gomod = include_str!("../controlplane/go.mod");
        let version = gomod
            .lines()
            .filter_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
            .map(str::trim)
            .find(|v| v.starts_with('v'))
            .expect("controlplane/go.mod requires k8s.io/kubernetes");
        Self::parse(version).expect("controlplane/go.mod pins a Kubernetes version")
    }

    /// `$NODEWARDEN_KUBE_VERSION` when set and not empty, else [`KubeVersion::pinned`].
    pub fn from_env() -> Result<Self> {
        match std::env::var("NODEWARDEN_KUBE_VERSION") {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v).context("NODEWARDEN_KUBE_VERSION"),
            _ => Ok(Self::pinned()),
        }
    }

    pub fn is_pinned(&self) -> bool {
        *self == Self::pinned()
    }

    /// Whether the API server serves `pods/resize` with its default feature gates: the
    /// subresource came in 1.32 behind `InPlacePodVerticalScaling`, on by default from 1.33.
    pub fn resize_by_default(&self) -> bool {
        self.minor >= 33
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Binaries {
    /// `$NODEWARDEN_CONTROLPLANE_BIN` when set, else the folder `tests/controlplane/build.sh`
    /// prints (building the binaries on first use, which takes many minutes on a cold cache),
    /// or, when `$NODEWARDEN_KUBE_VERSION` names another version than the pinned one, the
    /// folder `tests/controlplane/build-version.sh` prints for it.
    pub async fn locate() -> Result<Self> {
        if let Some(dir) = std::env::var_os("NODEWARDEN_CONTROLPLANE_BIN") {
            let b = Self {
                dir: PathBuf::from(dir),
            };
            b.check()?;
            return Ok(b);
        }
        let version = KubeVersion::from_env()?;
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane");
        let (script, args) = if version.is_pinned() {
            (folder.join("build.sh"), vec![])
        } else {
            (folder.join("build-version.sh"), vec![version.text.clone()])
        };
        eprintln!(
            "nodewarden-tests: running {} {} (first run builds Kubernetes {version}; later runs take seconds)",
            script.display(),
            args.join(" ")
        );
        let out = tokio::process::Command::new("bash")
            .arg(&script)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .output()
            .await
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!("{} {} failed ({})", script.display(), args.join(" "), out.status);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .ok_or_else(|| anyhow!("{} printed no folder", script.display()))?;
        let b = Self {
            dir: PathBuf::from(dir.trim()),
        };
        b.check()?;
        Ok(b)
    }

    fn check(&self) -> Result<()> {
        for name in ["etcd", "kube-apiserver", "kube-controller-manager", "helm"] {
            let p = self.dir.join(name);
            if !p.is_file() {
                bail!(
                    "{} is missing (set NODEWARDEN_CONTROLPLANE_BIN to a folder with etcd, kube-apiserver, kube-controller-manager and helm, or unset it to build them)",
                    p.display()
                );
            }
        }
        Ok(())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Who a client acts as when it impersonates (the admin credentials authenticate it).
#[derive(Clone, Debug, Default)]
pub struct Impersonate {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: HashMap<String, Vec<String>>,
}

impl Impersonate {
    pub fn user(name: &str, groups: &[&str]) -> Self {
        Self {
            user: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: HashMap::new(),
        }
    }

    pub fn with_extra(mut self, key: &str, values: &[&str]) -> Self {
        self.extra
            .insert(key.to_string(), values.iter().map(|v| v.to_string()).collect());
        self
    }
}

/// A running control plane. Dropping it kills the processes and removes its folder.
///
/// Tests in one test binary usually share one with [`ControlPlane::shared`], each test in a
/// namespace of its own (see [`crate::cluster::TestNamespace`]).
pub struct ControlPlane {
    dir: tempfile::TempDir,
    bins: Binaries,
    ca: Ca,
    apiserver_url: String,
    kubeconfig: PathBuf,
    admin_kubeconfig_yaml: String,
    processes: Mutex<Processes>,
    network: Option<NodeNetwork>,
    options: StartOptions,
    /// What kube-apiserver's `/version` says, read at start-up.
    version: KubeVersion,
}

/// What a control plane of its own starts with, besides the fixed flags
/// ([`ControlPlane::start_with_options`]).
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// kube-apiserver's `--admission-control-config-file`: an AdmissionConfiguration, e.g. one
    /// whose `WebhookAdmissionConfiguration` names a kubeconfig with client certificates for
    /// calling webhooks.
    pub admission_config_file: Option<PathBuf>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir.path())
            .field("apiserver_url", &self.apiserver_url)
            .finish_non_exhaustive()
    }
}

static SHARED: OnceCell<std::result::Result<ControlPlane, String>> = OnceCell::const_new();

/// Where a control plane serves when real nodes join it: kube-apiserver listens on `apiserver_ip`
/// (an address of the host's own, so kubelets and pods reach it), advertises it as the `kubernetes`
/// Service's endpoint, reaches kubelets by their InternalIP and webhook Services through their
/// endpoints. See [`crate::node`].
#[derive(Clone, Debug)]
pub struct NodeNetwork {
    pub apiserver_ip: Ipv4Addr,
}

impl ControlPlane {
    /// The control plane shared by every test of this test binary, started on first use.
    /// It is never dropped: the watchdog kills it and removes its folder when the test
    /// process exits. A failed start is remembered, so later tests fail fast with it.
    pub async fn shared() -> Result<&'static ControlPlane> {
        let r = SHARED
            .get_or_init(|| async {
                ControlPlane::start_with(true, None, StartOptions::default())
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        r.as_ref()
            .map_err(|e| anyhow!("the shared control plane did not start: {e}"))
    }

    /// Starts a control plane of its own for the caller.
    pub async fn start() -> Result<ControlPlane> {
        Self::start_with(false, None, StartOptions::default()).await
    }

    /// Starts a control plane of its own for the caller, with `options`.
    pub async fn start_with_options(options: StartOptions) -> Result<ControlPlane> {
        Self::start_with(false, None, options).await
    }

    /// Starts a control plane that real nodes can join (see [`crate::node::RealCluster`]).
    /// `before_boot` runs once the folder and the watchdog exist and before any process starts:
    /// the real-node harness records the host's state there and sets up the addresses.
    pub(crate) async fn start_for_nodes(
        network: NodeNetwork,
        before_boot: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<ControlPlane> {
        Self::start_with(
            false,
            Some((network, Box::new(before_boot))),
            StartOptions::default(),
        )
        .await
    }

    #[allow(clippy::type_complexity)]
    async fn start_with(
        shared: bool,
        nodes: Option<(NodeNetwork, Box<dyn FnOnce(&Path) -> Result<()> + '_>)>,
        options: StartOptions,
    ) -> Result<ControlPlane> {
        let began = Instant::now();
        let bins = Binaries::locate().await?;
        let keep = std::env::var_os("NODEWARDEN_E2E_KEEP").is_some();
        let mut dir = tempfile::Builder::new().prefix("nodewarden-e2e-").tempdir()?;
        if keep {
            dir.disable_cleanup(true);
            eprintln!("nodewarden-tests: keeping {}", dir.path().display());
        }
        let root = dir.path().to_path_buf();
        // The watchdog removes the folder of a shared control plane (never dropped), and that of
        // one with real nodes, whose owner may be killed before it can drop it.
        let processes = Processes::new(&root, (shared || nodes.is_some()) && !keep)?;
        let network = match nodes {
            Some((network, before_boot)) => {
                before_boot(&root)?;
                Some(network)
            }
            None => None,
        };
        let pki = Pki::generate(network.as_ref())?;
        let mut cp = ControlPlane {
            dir,
            bins,
            ca: pki.ca.clone(),
            apiserver_url: String::new(),
            kubeconfig: root.join("admin.kubeconfig"),
            admin_kubeconfig_yaml: String::new(),
            processes: Mutex::new(processes),
            network,
            options,
            version: KubeVersion::pinned(),
        };
        let mut tries = 0;
        loop {
            tries += 1;
            match cp.boot(&pki).await {
                Ok(()) => {
                    eprintln!(
                        "nodewarden-tests: control plane (Kubernetes {}) ready at {} in {:.1}s (folder {})",
                        cp.version,
                        cp.apiserver_url,
                        began.elapsed().as_secs_f64(),
                        root.display()
                    );
                    return Ok(cp);
                }
                // a port chosen free was bound by someone else before the process bound it
                // (`free_ports` makes that rare): the same start again on other ports
                Err(e) if tries < START_TRIES && cp.log_tails(5).contains(PORT_TAKEN) => {
                    eprintln!(
                        "nodewarden-tests: control plane start-up: a port was taken ({e:#}); \
                         starting again on other ports ({tries} of {START_TRIES})"
                    );
                    cp.lock_processes().kill_children();
                    let _ = std::fs::remove_dir_all(root.join("etcd"));
                }
                Err(e) => {
                    let logs = cp.log_tails(60);
                    cp.lock_processes().kill_all();
                    return Err(crate::failure_with(
                        e,
                        "control plane start-up failed",
                        &format!("last log lines:\n{logs}"),
                    ));
                }
            }
        }
    }

    async fn boot(&mut self, pki: &Pki) -> Result<()> {
        let root = self.dir.path().to_path_buf();
        let [etcd_client, etcd_peer, apiserver_port, kcm_port]: [u16; 4] = free_ports(4)?
            .try_into()
            .map_err(|_| anyhow!("expected four ports"))?;

        let file = |name: &str, contents: &str, private: bool| -> Result<String> {
            let p = root.join(name);
            write_file(&p, contents.as_bytes(), private)?;
            Ok(p.display().to_string())
        };
        let ca_crt = file("ca.crt", &pki.ca.cert_pem, false)?;
        let ca_key = file("ca.key", &pki.ca.key_pem, true)?;
        let api_crt = file("apiserver.crt", &pki.apiserver.cert_pem, false)?;
        let api_key = file("apiserver.key", &pki.apiserver.key_pem, true)?;
        let kcm_crt = file("kcm-serving.crt", &pki.kcm_serving.cert_pem, false)?;
        let kcm_key = file("kcm-serving.key", &pki.kcm_serving.key_pem, true)?;
        let sa_key = file("sa.key", &pki.sa_key_pem, true)?;
        let sa_pub = file("sa.pub", &pki.sa_pub_pem, false)?;

        let address = self
            .network
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |n| n.apiserver_ip);
        self.apiserver_url = format!("https://{address}:{apiserver_port}");
        self.admin_kubeconfig_yaml = kubeconfig_yaml(&self.apiserver_url, &pki.ca.cert_pem, &pki.admin)?;
        write_file(&self.kubeconfig, self.admin_kubeconfig_yaml.as_bytes(), true)?;
        let kcm_kubeconfig = file(
            "kube-controller-manager.kubeconfig",
            &kubeconfig_yaml(&self.apiserver_url, &pki.ca.cert_pem, &pki.kcm_client)?,
            true,
        )?;

        let etcd_data = root.join("etcd");
        let etcd_args = vec![
            "--name=e2e".to_string(),
            format!("--data-dir={}", etcd_data.display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            format!("--initial-cluster=e2e=http://127.0.0.1:{etcd_peer}"),
            "--initial-cluster-state=new".to_string(),
            // A throw-away database: durability buys nothing and fsync costs seconds.
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        self.spawn("etcd", &etcd_args)?;

        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            format!("--secure-port={apiserver_port}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            format!("--tls-cert-file={api_crt}"),
            format!("--tls-private-key-file={api_key}"),
            format!("--client-ca-file={ca_crt}"),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!("--service-account-key-file={sa_pub}"),
            format!("--service-account-signing-key-file={sa_key}"),
            "--authorization-mode=Node,RBAC".to_string(),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            // Both are on by default; named so a reader sees the tests rely on them.
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook".to_string(),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        if let Some(file) = &self.options.admission_config_file {
            apiserver_args.push(format!("--admission-control-config-file={}", file.display()));
        }
        if self.network.is_some() {
            let kubelet_client = file(
                "apiserver-kubelet-client.crt",
                &pki.kubelet_client.cert_pem,
                false,
            )?;
            let kubelet_client_key = file("apiserver-kubelet-client.key", &pki.kubelet_client.key_pem, true)?;
            apiserver_args.extend([
                // Node names do not resolve here: reach kubelets (logs, exec) by their address.
                "--kubelet-preferred-address-types=InternalIP".to_string(),
                format!("--kubelet-client-certificate={kubelet_client}"),
                format!("--kubelet-client-key={kubelet_client_key}"),
                format!("--kubelet-certificate-authority={ca_crt}"),
                // Call webhook Services at their endpoints' pod IPs: no Service IP ever has to be
                // routed from the host.
                "--enable-aggregator-routing=true".to_string(),
            ]);
        } else {
            // Endpoints may not hold loopback addresses, so the `kubernetes` Service
            // endpoint reconciler would only log errors.
            apiserver_args.push("--endpoint-reconciler-type=none".to_string());
        }
        self.spawn("kube-apiserver", &apiserver_args)?;
        self.wait_ready("kube-apiserver /readyz", &self.apiserver_url.clone(), "/readyz")
            .await?;

        let kcm_args = vec![
            format!("--kubeconfig={kcm_kubeconfig}"),
            format!("--secure-port={kcm_port}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--tls-cert-file={kcm_crt}"),
            format!("--tls-private-key-file={kcm_key}"),
            "--use-service-account-credentials=true".to_string(),
            format!("--service-account-private-key-file={sa_key}"),
            format!("--root-ca-file={ca_crt}"),
            format!("--cluster-signing-cert-file={ca_crt}"),
            format!("--cluster-signing-key-file={ca_key}"),
            "--controllers=*".to_string(),
            "--leader-elect=false".to_string(),
            // Test nodes have no kubelet to renew their leases: without these the node
            // lifecycle controller marks them unreachable after 50 s and taints them, and
            // the DaemonSet controller stops creating pods for them.
            "--node-monitor-grace-period=87600h".to_string(),
            "--node-startup-grace-period=87600h".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        self.spawn("kube-controller-manager", &kcm_args)?;
        self.wait_ready(
            "kube-controller-manager /healthz",
            &format!("https://127.0.0.1:{kcm_port}"),
            "/healthz",
        )
        .await?;

        // The version the binaries say they are, checked against the one asked for: a matrix run
        // that silently tested another version would prove nothing.
        let client = self.admin_client().await?;
        let info = client
            .apiserver_version()
            .await
            .context("reading kube-apiserver's /version")?;
        self.version = KubeVersion::parse(&info.git_version)
            .with_context(|| format!("kube-apiserver's /version: {}", info.git_version))?;
        if std::env::var_os("NODEWARDEN_CONTROLPLANE_BIN").is_none() {
            let wanted = KubeVersion::from_env()?;
            if self.version != wanted {
                bail!(
                    "kube-apiserver in {} is {}, not {wanted} (NODEWARDEN_KUBE_VERSION)",
                    self.bins.dir.display(),
                    self.version
                );
            }
        }

        // The service-account controller creating `default` in `default` shows that the
        // controllers are running and can write.
        let sas: Api<ServiceAccount> = Api::namespaced(client, "default");
        self.poll(
            "the `default` ServiceAccount created by kube-controller-manager",
            || {
                let sas = sas.clone();
                async move { Ok(sas.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await?;
        Ok(())
    }

    fn spawn(&self, name: &str, args: &[String]) -> Result<()> {
        let program = self.bins.path(name);
        self.lock_processes().spawn(name, &program, args)?;
        Ok(())
    }

    /// Starts `program` as one more process of this control plane (killed with it, and by the
    /// watchdog), its output in `<dir>/<name>.log`. Returns its pid.
    pub fn spawn_program(&self, name: &str, program: &Path, args: &[String]) -> Result<u32> {
        self.lock_processes().spawn(name, program, args)
    }

    /// The Kubernetes version kube-apiserver reports (`/version`).
    pub fn kube_version(&self) -> &KubeVersion {
        &self.version
    }

    /// The binaries this control plane was started from (kubelet, kube-proxy and kube-scheduler too).
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// Fails when one of this control plane's processes has exited.
    pub fn check_running(&self) -> Result<()> {
        self.lock_processes().check_running()
    }

    /// A kubeconfig for a component that authenticates with `cert`.
    pub(crate) fn kubeconfig_for(&self, cert: &IssuedCert) -> Result<String> {
        kubeconfig_yaml(&self.apiserver_url, &self.ca.cert_pem, cert)
    }

    /// Kills every process and puts the host back as it was (see `tests/node/host-state.sh`),
    /// then returns what still differs from the snapshot: nothing, when all went well.
    pub(crate) fn stop_and_restore_host(&self) -> Result<Vec<String>> {
        self.lock_processes().kill_all();
        crate::node::host_state_diff(self.dir.path())
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Processes> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Polls `url + path` with the admin credentials (trusting the cluster CA) until it
    /// answers `ok`, failing early when a process has exited.
    async fn wait_ready(&self, what: &str, url: &str, path: &str) -> Result<()> {
        let yaml = self.admin_kubeconfig_yaml.replace(&self.apiserver_url, url);
        let client = client_from_yaml(&yaml, None).await?;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            self.lock_processes().check_running()?;
            let req = http::Request::get(path).body(Vec::new())?;
            let last = match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!("{what} not ready after {STARTUP_TIMEOUT:?}; last answer: {last}");
            }
            pause().await;
        }
    }

    /// Polls `f` until it yields `Some`, for at most two minutes, failing early when a
    /// control plane process has exited.
    pub async fn poll<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last_err = None;
        loop {
            self.lock_processes().check_running()?;
            match f().await {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last_err = Some(e),
            }
            if Instant::now() > deadline {
                return Err(match last_err {
                    Some(e) => e.context(format!("timed out waiting for {what}")),
                    None => anyhow!("timed out waiting for {what}"),
                });
            }
            pause().await;
        }
    }

    /// Kills kube-apiserver with SIGKILL (etcd and kube-controller-manager keep running) and
    /// returns the arguments it ran with, to start it again with [`start_apiserver`](Self::start_apiserver).
    pub fn kill_apiserver(&self) -> Result<Vec<String>> {
        self.kill_keeping_args("kube-apiserver")
    }

    /// Kills the newest process of this control plane started as `name` (one of its own
    /// binaries) with SIGKILL and returns the arguments it ran with.
    fn kill_keeping_args(&self, name: &str) -> Result<Vec<String>> {
        let mut processes = self.lock_processes();
        let pid = processes
            .pids()
            .into_iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, pid)| pid)
            .ok_or_else(|| anyhow!("{name} is not running"))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("reading the command line of {name} ({pid})"))?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        processes.kill_one(name)?;
        Ok(args)
    }

    /// Starts kube-controller-manager again without the controllers named (e.g.
    /// `endpoints-controller`, so that a test's own Endpoints object stays as written), and
    /// waits for its `/healthz`.
    pub async fn restart_controller_manager_without(&self, controllers: &[&str]) -> Result<()> {
        let mut args = self.kill_keeping_args("kube-controller-manager")?;
        let off: String = controllers.iter().map(|c| format!(",-{c}")).collect();
        let mut port = None;
        for a in &mut args {
            if let Some(list) = a.strip_prefix("--controllers=") {
                *a = format!("--controllers={list}{off}");
            }
            if let Some(p) = a.strip_prefix("--secure-port=") {
                port = Some(p.to_string());
            }
        }
        self.spawn("kube-controller-manager", &args)?;
        let port = port.ok_or_else(|| anyhow!("kube-controller-manager ran without --secure-port"))?;
        self.wait_ready(
            "kube-controller-manager /healthz",
            &format!("https://127.0.0.1:{port}"),
            "/healthz",
        )
        .await
    }

    /// Starts kube-apiserver with `args` (those [`kill_apiserver`](Self::kill_apiserver)
    /// returned, the same port and etcd, perhaps with more flags) and waits for its `/readyz`.
    pub async fn start_apiserver(&self, args: &[String]) -> Result<()> {
        self.spawn("kube-apiserver", args)?;
        let url = self.apiserver_url.clone();
        self.wait_ready("kube-apiserver /readyz", &url, "/readyz").await
    }

    /// Kills the newest process started as `name` with SIGKILL and forgets it (a fault:
    /// [`poll`](Self::poll) no longer fails for it having exited). Returns its pid.
    pub fn kill_program(&self, name: &str) -> Result<u32> {
        self.lock_processes().kill_one(name)
    }

    /// Stops the newest process started as `name` with SIGTERM, waits for it and forgets it.
    pub fn stop_program(&self, name: &str) -> Result<std::process::ExitStatus> {
        self.lock_processes().stop_one(name)
    }

    /// `https://127.0.0.1:<port>` of kube-apiserver.
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// The cluster CA (it signs the API server's serving certificate and every client
    /// certificate; it is also kube-controller-manager's root CA for service accounts).
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The cluster CA with its key, to issue more certificates (e.g. for a webhook).
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// A serving certificate for a webhook served by the test process on loopback
    /// (`127.0.0.1`, `::1`, `localhost`), signed by the cluster CA: register it with
    /// [`ControlPlane::ca_pem`] as the `caBundle`.
    pub fn issue_loopback_serving_cert(&self) -> Result<IssuedCert> {
        Ok(self.ca.issue_serving(&ServingSpec {
            dns_names: vec!["localhost".to_string()],
            ip_addresses: vec![
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            ],
            validity: CERT_VALIDITY,
        })?)
    }

    /// A kubeconfig file with the admin (`system:masters`) credentials, e.g. for helm.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The helm binary built with the control plane.
    pub fn helm_path(&self) -> PathBuf {
        self.bins.path("helm")
    }

    /// The folder holding certificates, kubeconfigs, the etcd data and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Names and process ids of the running processes (etcd, kube-apiserver,
    /// kube-controller-manager).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.lock_processes().pids()
    }

    /// The last `lines` lines of each process's log.
    pub fn log_tails(&self, lines: usize) -> String {
        self.lock_processes().log_tails(lines)
    }

    /// A client with the admin credentials (a client certificate in `system:masters`).
    ///
    /// Create clients inside the test that uses them: a client belongs to the Tokio runtime
    /// it was created on, and every `#[tokio::test]` has a runtime of its own.
    pub async fn admin_client(&self) -> Result<Client> {
        client_from_yaml(&self.admin_kubeconfig_yaml, None).await
    }

    /// A client that authenticates as the admin and impersonates `who`, so requests are
    /// authorized (and seen by webhooks) as that user, its groups and extra values.
    pub async fn client_as(&self, who: &Impersonate) -> Result<Client> {
        client_from_yaml(&self.admin_kubeconfig_yaml, Some(who)).await
    }

    /// Shorthand for [`ControlPlane::client_as`] without extra values.
    pub async fn client_as_user(&self, name: &str, groups: &[&str]) -> Result<Client> {
        self.client_as(&Impersonate::user(name, groups)).await
    }

    /// A client that sends `token` as its bearer token (and no client certificate).
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        Ok(Client::try_from(self.config_with_token(token).await?)?)
    }

    /// The client settings of [`client_with_token`](Self::client_with_token).
    pub async fn config_with_token(&self, token: &str) -> Result<Config> {
        let yaml = serde_yaml_ng::to_string(&json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.apiserver_url,
                "certificate-authority-data": b64(&self.ca.cert_pem),
            }}],
            "users": [{"name": "token", "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "token"}}],
            "current-context": "e2e",
        }))?;
        let kubeconfig = Kubeconfig::from_yaml(&yaml)?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A service-account token from the TokenRequest API, valid for an hour. With
    /// `bound_pod = Some((name, uid))` the token is bound to that pod (which must run as
    /// `service_account`); when the pod is bound to a node, the API server adds
    /// `authentication.kubernetes.io/node-name` and `node-uid` to the token's user extra.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        bound_pod: Option<(&str, &str)>,
    ) -> Result<String> {
        let client = self.admin_client().await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: None,
                expiration_seconds: Some(3600),
                bound_object_ref: bound_pod.map(|(name, uid)| BoundObjectReference {
                    api_version: Some("v1".to_string()),
                    kind: Some("Pod".to_string()),
                    name: Some(name.to_string()),
                    uid: Some(uid.to_string()),
                }),
            }),
            ..Default::default()
        };
        let answer = sas
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for {namespace}/{service_account}"))?;
        answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| anyhow!("TokenRequest for {namespace}/{service_account} returned no token"))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.lock_processes().kill_all();
    }
}

/// Keys and certificates of one control plane.
struct Pki {
    ca: Ca,
    apiserver: IssuedCert,
    kcm_serving: IssuedCert,
    admin: IssuedCert,
    kcm_client: IssuedCert,
    kubelet_client: IssuedCert,
    sa_key_pem: String,
    sa_pub_pem: String,
}

impl Pki {
    fn generate(network: Option<&NodeNetwork>) -> Result<Self> {
        let ca = Ca::generate(&CaConfig {
            common_name: "nodewarden-e2e-ca".to_string(),
            validity: CERT_VALIDITY,
        })?;
        let loopback = vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ];
        let mut api_ips = loopback.clone();
        // First address of the Service range: the `kubernetes` Service's ClusterIP.
        api_ips.push(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)));
        if let Some(n) = network {
            api_ips.push(IpAddr::V4(n.apiserver_ip));
        }
        let apiserver = ca.issue_serving(&ServingSpec {
            dns_names: [
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            ip_addresses: api_ips,
            validity: CERT_VALIDITY,
        })?;
        let kcm_serving = ca.issue_serving(&ServingSpec {
            dns_names: vec!["localhost".to_string()],
            ip_addresses: loopback,
            validity: CERT_VALIDITY,
        })?;
        let admin = ca.issue_client("nodewarden-e2e-admin", &["system:masters"], CERT_VALIDITY)?;
        // The identity RBAC's bootstrap policy grants kube-controller-manager.
        let kcm_client = ca.issue_client("system:kube-controller-manager", &[], CERT_VALIDITY)?;
        // What kube-apiserver presents to kubelets (logs, exec, port-forward).
        let kubelet_client = ca.issue_client(
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            CERT_VALIDITY,
        )?;
        let sa = rcgen::KeyPair::generate().context("generating the service-account signing key")?;
        Ok(Self {
            ca,
            apiserver,
            kcm_serving,
            admin,
            kcm_client,
            kubelet_client,
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
        })
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

/// A kubeconfig for `server` that authenticates with a client certificate.
fn kubeconfig_yaml(server: &str, ca_pem: &str, cert: &IssuedCert) -> Result<String> {
    Ok(serde_yaml_ng::to_string(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "e2e", "user": {
            "client-certificate-data": b64(&cert.cert_pem),
            "client-key-data": b64(&cert.key_pem),
        }}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e", "namespace": "default"}}],
        "current-context": "e2e",
    }))?)
}

async fn client_from_yaml(yaml: &str, impersonate: Option<&Impersonate>) -> Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(yaml)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    if let Some(who) = impersonate {
        config.auth_info.impersonate = Some(who.user.clone());
        if !who.groups.is_empty() {
            config.auth_info.impersonate_groups = Some(who.groups.clone());
        }
        if !who.extra.is_empty() {
            config.auth_info.impersonate_user_extra = Some(who.extra.clone());
        }
    }
    Ok(Client::try_from(config)?)
}

#[cfg(test)]
mod version_tests {
    use super::KubeVersion;

    #[test]
    fn versions_parse_with_or_without_v_and_with_a_pre_release() {
        let v = KubeVersion::parse("1.30.14").unwrap();
        assert_eq!((v.text.as_str(), v.minor), ("v1.30.14", 30));
        let v = KubeVersion::parse("v1.38.0-beta.0").unwrap();
        assert_eq!((v.text.as_str(), v.minor), ("v1.38.0-beta.0", 38));
        assert!(!v.is_pinned());
        assert!(!KubeVersion::parse("v1.32.13").unwrap().resize_by_default());
        assert!(KubeVersion::parse("v1.33.13").unwrap().resize_by_default());
    }

    #[test]
    fn other_text_is_refused_with_what_was_expected() {
        for bad in ["", "1.30", "v2.0.0", "v1.x.3", "latest"] {
            let err = KubeVersion::parse(bad).unwrap_err().to_string();
            assert!(err.contains("expected e.g. v1.30.14"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_pinned_version_is_go_mods() {
        let pinned = KubeVersion::pinned();
        assert!(pinned.is_pinned());
        assert!(
            include_str!("../controlplane/go.mod").contains(&format!("k8s.io/kubernetes {pinned}\n")),
            "{pinned}"
        );
    }
}
