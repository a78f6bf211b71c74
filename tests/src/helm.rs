//! Helm against the chart in `charts/nodewarden`: lint, template (parsed into objects), install and
//! uninstall. Helm's cache, config and data folders live in a temporary folder of their own, so
//! tests never read or write the user's helm settings.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use serde_json::Value;

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
