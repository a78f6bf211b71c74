//! An OCI registry as users install from: the CNCF Distribution registry (built from its Go module
//! by `tests/registry/build.sh`), serving TLS with a certificate of a CA of its own, a process of
//! the test cluster's control plane (killed with it, and by its watchdog).
//!
//! A release is pushed into it as the release workflow pushes it to `ghcr.io`: the images with
//! their index (`skopeo copy --all`, Debian's skopeo), the chart as an OCI artifact (`helm push`).
//! Nodes reach it as a mirror of the registry the chart's defaults name ([`UPSTREAM`]): containerd's
//! `config_path` folder holds `<upstream>/hosts.toml`, which sends every pull of `<upstream>/…` to
//! this registry (and trusts its CA), so the chart installs with its default image names and the
//! nodes pull them as they would from the real registry. No image is imported by hand, and a node
//! that joins later pulls by itself.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use nodewarden_certs::{Ca, CaConfig, ServingSpec};

use crate::controlplane::ControlPlane;
use crate::node::install_packages;
use crate::process::{cached_build, free_port, write_file};

/// Debian packages the pushes need.
pub const REGISTRY_PACKAGES: &[&str] = &["skopeo"];
/// The registry the chart's default image names point at (`global.imageRegistry`), and where
/// the release workflow pushes: the nodes get this test registry as its mirror.
pub const UPSTREAM: &str = "ghcr.io";

const CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The process's name among the control plane's.
const PROCESS: &str = "registry";

/// A registry's folder, port and TLS material; [`Registry::start`] runs it.
#[derive(Debug)]
pub struct Registry {
    dir: tempfile::TempDir,
    port: u16,
    /// The registry program.
    bin: PathBuf,
}

impl Registry {
    /// Builds the registry (or finds it built) and the pushes' tools, picks a port and writes
    /// the configuration, with a serving certificate for loopback and for `also` (where other
    /// machines, e.g. a virtual machine's guest, reach it). Nothing listens yet: the nodes'
    /// mirror configuration ([`Registry::write_mirror`]) can be written before the cluster starts.
    pub async fn prepare(also: &[Ipv4Addr]) -> Result<Registry> {
        install_packages(REGISTRY_PACKAGES).await?;
        let bin = tokio::task::spawn_blocking(|| cached_build("registry/build.sh", &["registry"]))
            .await??
            .join("registry");
        let dir = tempfile::Builder::new()
            .prefix("nodewarden-registry-")
            .tempdir()?;
        let port = free_port()?;
        let ca = Ca::generate(&CaConfig {
            common_name: "nodewarden-test-registry-ca".to_string(),
            validity: CERT_VALIDITY,
        })?;
        let mut ip_addresses = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        ip_addresses.extend(also.iter().copied().map(IpAddr::V4));
        let serving = ca.issue_serving(&ServingSpec {
            dns_names: vec!["localhost".to_string()],
            ip_addresses,
            validity: CERT_VALIDITY,
        })?;
        let registry = Registry { dir, port, bin };
        put(&registry.ca_pem(), ca.cert_pem.as_bytes(), false)?;
        // skopeo's --dest-cert-dir takes a folder of `*.crt` CAs
        put(
            &registry.dir.path().join("client/ca.crt"),
            ca.cert_pem.as_bytes(),
            false,
        )?;
        put(
            &registry.dir.path().join("tls/serving.pem"),
            serving.cert_pem.as_bytes(),
            false,
        )?;
        put(
            &registry.dir.path().join("tls/serving-key.pem"),
            serving.key_pem.as_bytes(),
            true,
        )?;
        let config = serde_json::json!({
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": false}},
            "storage": {
                "filesystem": {"rootdirectory": registry.dir.path().join("data")},
                "delete": {"enabled": false},
            },
            "http": {
                // loopback only: other machines' forwarders (a guest's socat) connect from the host
                "addr": format!("127.0.0.1:{port}"),
                "tls": {
                    "certificate": registry.dir.path().join("tls/serving.pem"),
                    "key": registry.dir.path().join("tls/serving-key.pem"),
                },
            },
        });
        // YAML is a superset of JSON: the registry reads this as its YAML configuration
        put(&registry.config_path(), config.to_string().as_bytes(), false)?;
        Ok(registry)
    }

    /// `127.0.0.1:<port>`: the registry as the host names it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA that signed its serving certificate (PEM file).
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yml")
    }

    /// Writes containerd's registry host folder (what its `config_path` names) into `folder`:
    /// `<UPSTREAM>/hosts.toml`, sending pulls of `UPSTREAM`'s images to this registry at
    /// `address` (its port), and `<UPSTREAM>/ca.crt`, which the node reads under `seen_at`
    /// (the path under which the node sees `folder`, e.g. a guest's mount point).
    pub fn write_mirror(&self, folder: &Path, address: Ipv4Addr, seen_at: &Path) -> Result<()> {
        let ca = std::fs::read(self.ca_pem())?;
        put(&folder.join(UPSTREAM).join("ca.crt"), &ca, false)?;
        let hosts = format!(
            r#"# pulls of {UPSTREAM}'s images go to the test registry, a mirror of it
server = "https://{UPSTREAM}"

[host."https://{address}:{port}"]
  capabilities = ["pull", "resolve"]
  ca = "{ca}"
"#,
            port = self.port,
            ca = seen_at.join(UPSTREAM).join("ca.crt").display(),
        );
        put(&folder.join(UPSTREAM).join("hosts.toml"), hosts.as_bytes(), false)
    }

    /// The registry host folder for containerd on this host (its nodes): [`Registry::write_mirror`]
    /// at loopback, in the registry's folder; returns the folder.
    pub fn mirror_for_host(&self) -> Result<PathBuf> {
        let folder = self.dir.path().join("hosts");
        self.write_mirror(&folder, Ipv4Addr::LOCALHOST, &folder)?;
        Ok(folder)
    }

    /// Starts it as a process of `cp`; returns once it listens.
    pub async fn start(&self, cp: &ControlPlane) -> Result<()> {
        let config = self.config_path();
        cp.spawn_program(
            PROCESS,
            &self.bin,
            &["serve".to_string(), config.display().to_string()],
        )?;
        let address = self.host();
        let began = Instant::now();
        // listening means the configuration and the TLS files were read; the first push checks TLS
        loop {
            match tokio::net::TcpStream::connect(&address).await {
                Ok(_) => return Ok(()),
                Err(e) if began.elapsed() > START_TIMEOUT => bail!(
                    "the registry does not listen on {address} after {START_TIMEOUT:?} ({e}); the logs:\n{}",
                    cp.log_tails(20)
                ),
                Err(_) => {
                    cp.check_running()?;
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
            }
        }
    }

    /// Pushes an image archive (an OCI layout in a tar) with its index and every platform's
    /// manifest, as the release workflow does: `skopeo copy --all oci-archive:<archive>
    /// docker://<registry>/<repository>:<tag>`. Returns the index's digest.
    pub async fn push_image(&self, archive: &Path, repository: &str, tag: &str) -> Result<String> {
        let digest = self.dir.path().join("digest");
        let out = tokio::process::Command::new("skopeo")
            .args(["copy", "--all", "--quiet", "--dest-cert-dir"])
            .arg(self.dir.path().join("client"))
            .arg("--digestfile")
            .arg(&digest)
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{}/{repository}:{tag}", self.host()))
            .env("HOME", self.dir.path())
            .output()
            .await
            .context("running skopeo (Debian's package)")?;
        ensure!(
            out.status.success(),
            "skopeo copy of {} to {repository}:{tag} failed ({}): {}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(std::fs::read_to_string(&digest)?.trim().to_string())
    }

    /// Pushes a chart `.tgz` as an OCI artifact under `oci://<registry>/<repository>` with
    /// `helm push`.
    pub async fn push_chart(&self, helm: &Path, chart: &Path, repository: &str) -> Result<()> {
        let out = tokio::process::Command::new(helm)
            .arg("push")
            .arg(chart)
            .arg(format!("oci://{}/{repository}", self.host()))
            .arg("--ca-file")
            .arg(self.ca_pem())
            .env("HELM_REGISTRY_CONFIG", self.dir.path().join("helm-registry.json"))
            .env("HELM_CACHE_HOME", self.dir.path().join("helm-cache"))
            .output()
            .await
            .context("running helm push")?;
        ensure!(
            out.status.success(),
            "helm push {} failed ({}): {}",
            chart.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

/// `write_file` after making its folder.
fn put(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    if let Some(folder) = path.parent() {
        std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    write_file(path, contents, private)
}
