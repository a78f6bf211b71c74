//! Helm against the chart in `charts/nodewarden`: lint, template (parsed into objects), install and
//! uninstall. Helm's cache, config and data folders live in a temporary folder of their own, so
//! tests never read or write the user's helm settings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::controlplane::{Binaries, ControlPlane};

/// The chart folder, `charts/nodewarden`.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/nodewarden")
}

/// A values file under `tests/fixtures/helm/`.
pub fn helm_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/helm")
        .join(name)
}

/// What one helm command did.
#[derive(Debug, Clone)]
pub struct HelmOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// The helm binary built with the control plane, with private helm folders, and optionally the
/// kubeconfig of a control plane.
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// Helm without a cluster (lint, template): finds the binaries like the control plane does.
    pub async fn locate() -> Result<Self> {
        let bins = Binaries::locate().await?;
        Self::new(bins.path("helm"), None)
    }

    /// Helm talking to `cp` with its admin kubeconfig.
    pub fn for_control_plane(cp: &ControlPlane) -> Result<Self> {
        Self::new(cp.helm_path(), Some(cp.kubeconfig_path().to_path_buf()))
    }

    fn new(bin: PathBuf, kubeconfig: Option<PathBuf>) -> Result<Self> {
        let home = tempfile::Builder::new().prefix("nodewarden-helm-").tempdir()?;
        Ok(Self {
            bin,
            home,
            kubeconfig,
        })
    }

    /// Runs `helm <args>` and returns what it printed, whether it succeeded or not.
    pub async fn run<S: AsRef<str>>(&self, args: &[S]) -> Result<HelmOutput> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        let home = self.home.path();
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            // helm's Kubernetes client keeps a discovery cache under ~/.kube/cache otherwise.
            .env("KUBECACHEDIR", home.join("kube-cache"))
            .env("HOME", home)
            .env_remove("KUBECONFIG")
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE");
        for proxy in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            cmd.env_remove(proxy);
        }
        cmd.args(args.iter().map(|a| a.as_ref()));
        if let Some(kubeconfig) = &self.kubeconfig {
            cmd.arg("--kubeconfig").arg(kubeconfig);
        }
        let out = cmd
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("running {}", self.bin.display()))?;
        Ok(HelmOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs `helm <args>` and fails with its output unless it succeeded; returns stdout.
    pub async fn ok<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        let out = self.run(args).await?;
        if !out.success {
            let line: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
            bail!(
                "helm {} failed:\n{}\n{}",
                line.join(" "),
                out.stdout.trim(),
                out.stderr.trim()
            );
        }
        Ok(out.stdout)
    }

    /// `helm template <release> <chart> --namespace <namespace>` plus `extra` (e.g. `-f file`,
    /// `--set a=b`), parsed into objects.
    pub async fn template<S: AsRef<str>>(
        &self,
        release: &str,
        namespace: &str,
        extra: &[S],
    ) -> Result<Rendered> {
        let out = self.template_raw(release, namespace, extra).await?;
        if !out.success {
            bail!("helm template failed:\n{}", out.stderr.trim());
        }
        Ok(Rendered {
            objects: parse_manifests(&out.stdout)?,
        })
    }

    /// Like [`Helm::template`], unparsed and without failing when helm does.
    pub async fn template_raw<S: AsRef<str>>(
        &self,
        release: &str,
        namespace: &str,
        extra: &[S],
    ) -> Result<HelmOutput> {
        let chart = chart_dir();
        let mut args: Vec<String> = vec![
            "template".into(),
            release.into(),
            chart.display().to_string(),
            "--namespace".into(),
            namespace.into(),
        ];
        args.extend(extra.iter().map(|a| a.as_ref().to_string()));
        self.run(&args).await
    }
}

/// Every object in a multi-document YAML stream (empty documents skipped).
pub fn parse_manifests(text: &str) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).with_context(|| format!("YAML document {i} of the manifests"))?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// The objects `helm template` rendered.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub objects: Vec<Value>,
}

impl Rendered {
    /// All objects of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The object of `kind` named `name`, or an error listing what was rendered.
    pub fn get(&self, kind: &str, name: &str) -> Result<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .ok_or_else(|| anyhow!("no {kind} {name} rendered; rendered: {:?}", self.names()))
    }

    /// Whether an object of `kind` named `name` was rendered.
    pub fn has(&self, kind: &str, name: &str) -> bool {
        self.get(kind, name).is_ok()
    }

    /// `Kind/name` of every object.
    pub fn names(&self) -> Vec<String> {
        self.objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }
}

// ---- what the chart's tests read from a rendering (tests/tests/helm_render.rs, helm_install.rs)

/// The namespace and release name the chart's tests render and install as.
pub const NS: &str = "nodewarden";
pub const RELEASE: &str = "nodewarden";
pub const FIXTURES: [&str; 3] = ["cert-manager.yaml", "secret-mode.yaml", "everything-on.yaml"];
/// The APIs of the Prometheus Operator and cert-manager, as `helm template` learns them from a
/// cluster that has their CRDs (the fixtures ask for their objects).
pub const CRD_APIS: [&str; 4] = [
    "--api-versions",
    "monitoring.coreos.com/v1",
    "--api-versions",
    "cert-manager.io/v1",
];

pub async fn render_default() -> Result<Rendered> {
    Helm::locate().await?.template::<&str>(RELEASE, NS, &[]).await
}

pub async fn render_with_fixture(file: &str) -> Result<Rendered> {
    let path = helm_fixture(file).display().to_string();
    let mut args = vec!["-f", path.as_str()];
    args.extend(CRD_APIS);
    Helm::locate().await?.template(RELEASE, NS, &args).await
}

pub fn webhook<'a>(config: &'a Value, name: &str) -> Result<&'a Value> {
    config["webhooks"]
        .as_array()
        .and_then(|hs| hs.iter().find(|h| h["name"] == name))
        .ok_or_else(|| anyhow!("no webhook {name} in {}", config["metadata"]["name"]))
}

pub fn container<'a>(workload: &'a Value, name: &str) -> Result<&'a Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .ok_or_else(|| anyhow!("no container {name} in {}", workload["metadata"]["name"]))
}

pub fn volume<'a>(workload: &'a Value, name: &str) -> Result<&'a Value> {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == name))
        .ok_or_else(|| anyhow!("no volume {name} in {}", workload["metadata"]["name"]))
}

pub fn mount<'a>(container: &'a Value, name: &str) -> Result<&'a Value> {
    container["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .ok_or_else(|| anyhow!("no volumeMount {name} in container {}", container["name"]))
}

pub fn env_entry<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)
}

pub fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    env_entry(container, name)?["value"].as_str()
}

pub fn env_field_ref<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    env_entry(container, name)?["valueFrom"]["fieldRef"]["fieldPath"].as_str()
}

pub fn ports_by_name(container: &Value) -> BTreeMap<String, i64> {
    container["ports"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| Some((p["name"].as_str()?.to_string(), p["containerPort"].as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

pub fn rules_for<'a>(role: &'a Value, resource: &str) -> Vec<&'a Value> {
    role["rules"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter(|r| {
                    r["resources"]
                        .as_array()
                        .is_some_and(|xs| xs.iter().any(|x| x == resource))
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn assert_hardened(c: &Value) -> Result<()> {
    let sc = &c["securityContext"];
    ensure!(sc["runAsNonRoot"] == true, "runAsNonRoot: {sc}");
    ensure!(
        sc["readOnlyRootFilesystem"] == true,
        "readOnlyRootFilesystem: {sc}"
    );
    ensure!(
        sc["allowPrivilegeEscalation"] == false,
        "allowPrivilegeEscalation: {sc}"
    );
    ensure!(sc["capabilities"]["drop"] == json!(["ALL"]), "capabilities: {sc}");
    ensure!(sc["privileged"] != true, "privileged: {sc}");
    Ok(())
}
