//! The agent's footprint on a node with 30 autoscaled containers (issue 42), shared by the host
//! nodes' benchmark (`realnode.rs`, cgroup v1 or v2 as the host has) and the cgroup v2 VM node's
//! (`cgroupv2_node.rs`): the workload (three DaemonSets of ten containers, as a node's log,
//! metrics and mesh agents, each container burning 2–5 millicores and holding 4 MiB, under
//! `Initial` autoscalers), the wait until the node's agent has published every container, and the
//! agent process's resident memory and CPU read from `/proc`, on the host or in the guest.
//! Figures only: nothing here is timed or compared with the goal (10 MiB, 2 millicores).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use crate::RealCluster;
use crate::helm::Helm;
use crate::images::TestImages;
use crate::procfs;
use crate::shipper::{NAMESPACE, RELEASE};
use crate::vm::VmNode;

/// The DaemonSets, ten containers each.
pub const DAEMONSETS: [&str; 3] = ["logs", "metrics", "mesh"];
/// Containers per DaemonSet.
pub const PER_DAEMONSET: usize = 10;

/// Where the workload runs: on every node, or on one (with the tolerations its taints need).
pub enum Placement<'a> {
    /// Every node.
    Everywhere,
    /// One node, tolerating these taints (a JSON list).
    On(&'a str, serde_json::Value),
}

/// Creates the DaemonSets and their `Initial` autoscalers in `namespace` (which must exist);
/// returns how many containers a node's agent will publish.
pub async fn create_workload(
    client: &Client,
    namespace: &str,
    testbox: &str,
    placement: &Placement<'_>,
) -> Result<usize> {
    let (node_selector, tolerations) = match placement {
        Placement::Everywhere => (json!(null), json!([])),
        Placement::On(node, tolerations) => (json!({"kubernetes.io/hostname": node}), tolerations.clone()),
    };
    for name in DAEMONSETS {
        let containers: Vec<serde_json::Value> = (0..PER_DAEMONSET)
            .map(|i| {
                json!({
                    "name": format!("{name}-{i}"), "image": testbox, "imagePullPolicy": "Never",
                    "args": ["burn", "--cpu-millicores", (2 + i % 4).to_string(), "--memory-mib", "4"],
                    "resources": {"requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                })
            })
            .collect();
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"terminationGracePeriodSeconds": 1, "containers": containers,
                             "nodeSelector": node_selector, "tolerations": tolerations},
                },
            },
        }))?;
        Api::<DaemonSet>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &ds)
            .await?;
        Api::<nodewarden_api::DaemonSetAutoscaler>::namespaced(client.clone(), namespace)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "nodewarden.io/v1alpha1", "kind": "DaemonSetAutoscaler",
                    "metadata": {"name": name},
                    "spec": {"targetRef": {"kind": "DaemonSet", "name": name},
                             "updatePolicy": {"updateMode": "Initial"}},
                }))?,
            )
            .await?;
    }
    Ok(DAEMONSETS.len() * PER_DAEMONSET)
}

/// Installs the chart with its defaults (a sample every 10 s, an update round a minute) but for
/// the test images and a fresh checkpoint folder, and waits for it.
pub async fn install_chart_defaults(cluster: &RealCluster, images: &TestImages) -> Result<()> {
    let helm = Helm::for_control_plane(&cluster.cp)?;
    let mut install: Vec<String> = [
        "install",
        RELEASE,
        &crate::helm::chart_dir().display().to_string(),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
    ]
    .map(String::from)
    .to_vec();
    install.extend(images.helm_set_args());
    install.extend([
        "--set".to_string(),
        format!(
            "agent.checkpoint.hostPath={}",
            cluster.fresh_checkpoint_dir()?.display()
        ),
    ]);
    let out = helm.run(&install).await?;
    ensure!(
        out.success,
        "helm install failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// How many containers `node`'s NodeRecommendation holds now.
pub async fn published(client: &Client, node: &str) -> Result<usize> {
    let recs: Api<nodewarden_api::NodeRecommendation> = Api::all(client.clone());
    Ok(recs
        .get_opt(node)
        .await?
        .map_or(0, |r| r.spec.recommendations.len()))
}

/// Waits until `node`'s agent has published `wanted` containers (the first CPU sample needs two
/// readings a sample interval apart); fails after `within` with what `describe` says.
pub async fn wait_published<F, Fut>(
    client: &Client,
    node: &str,
    wanted: usize,
    within: Duration,
    describe: F,
) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let deadline = Instant::now() + within;
    loop {
        let n = published(client, node).await?;
        if n >= wanted {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the agent of {node} published {n} of {wanted} containers after {within:?}:\n{}",
                describe().await
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The agent process, on this host or in the VM node's guest.
pub enum AgentProcess<'a> {
    /// A process of this host.
    Host(u32),
    /// A process of the guest, with the guest's clock ticks a second.
    Guest(&'a VmNode, u32, f64),
}

impl<'a> AgentProcess<'a> {
    /// The one `nodewarden-agent` process in the guest.
    pub async fn in_guest(vm: &'a VmNode) -> Result<AgentProcess<'a>> {
        let out = vm
            .checked(&[
                "/bin/sh",
                "-c",
                // argv[0]'s file name (`comm` is cut at 15 characters)
                "for p in /proc/[0-9]*; do a=$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | head -n 1); \
                 [ \"${a##*/}\" = nodewarden-agent ] && echo ${p#/proc/}; done; true",
            ])
            .await?;
        let pids: Vec<u32> = out.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        let [pid] = pids[..] else {
            bail!("one agent process in the guest, found {pids:?}");
        };
        let hz = vm
            .checked(&["/usr/bin/getconf", "CLK_TCK"])
            .await
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0);
        Ok(AgentProcess::Guest(vm, pid, hz))
    }

    async fn read(&self, file: &str) -> Result<String> {
        match self {
            AgentProcess::Host(pid) => std::fs::read_to_string(format!("/proc/{pid}/{file}"))
                .with_context(|| format!("reading /proc/{pid}/{file} (the agent process is gone?)")),
            AgentProcess::Guest(vm, pid, _) => vm.read_file(&format!("/proc/{pid}/{file}")).await,
        }
    }

    /// `utime + stime`, in seconds.
    pub async fn cpu_seconds(&self) -> Result<f64> {
        let stat = self.read("stat").await?;
        let ticks = procfs::cpu_ticks_of(&stat).context("reading the agent's /proc stat")?;
        let hz = match self {
            AgentProcess::Host(_) => procfs::clock_ticks_per_second(),
            AgentProcess::Guest(_, _, hz) => *hz,
        };
        Ok(ticks as f64 / hz)
    }

    /// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`).
    pub async fn status_kib(&self, field: &str) -> Result<u64> {
        let status = self.read("status").await?;
        procfs::status_field_kib(&status, field)
            .with_context(|| format!("no {field} in the agent's /proc status"))
    }
}

/// What [`measure`] saw.
#[derive(Clone, Debug)]
pub struct Footprint {
    /// Seconds measured.
    pub elapsed: f64,
    /// CPU over them, in millicores.
    pub millicores: f64,
    /// Resident memory every 10 s, in KiB.
    pub rss_kib: Vec<u64>,
    /// The process's peak resident memory (`VmHWM`) at the end, in KiB.
    pub hwm_kib: u64,
}

impl Footprint {
    /// One line: mean, peak and last resident memory, the high-water mark and the CPU.
    pub fn summary(&self) -> String {
        let mib = |kib: f64| kib / 1024.0;
        let mean = self.rss_kib.iter().sum::<u64>() as f64 / self.rss_kib.len().max(1) as f64;
        let peak = self.rss_kib.iter().copied().max().unwrap_or(0);
        let last = self.rss_kib.last().copied().unwrap_or(0);
        format!(
            "over {:.0} s: resident memory mean {:.1} MiB, peak {:.1} MiB, last {:.1} MiB (VmHWM {:.1} MiB); \
             CPU {:.2} millicores on average (goal: 10 MiB, 2 millicores)",
            self.elapsed,
            mib(mean),
            mib(peak as f64),
            mib(last as f64),
            mib(self.hwm_kib as f64),
            self.millicores
        )
    }
}

/// Samples `process`'s resident memory every 10 s for `span`, and its CPU over the span.
pub async fn measure(process: &AgentProcess<'_>, span: Duration) -> Result<Footprint> {
    let cpu_before = process.cpu_seconds().await?;
    let began = Instant::now();
    let mut rss_kib = Vec::new();
    while began.elapsed() < span {
        rss_kib.push(process.status_kib("VmRSS:").await?);
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let cpu_after = process
        .cpu_seconds()
        .await
        .context("the agent process ended during the measurement (restarted?)")?;
    let elapsed = began.elapsed().as_secs_f64();
    ensure!(
        cpu_after >= cpu_before,
        "the agent's CPU time went back: restarted?"
    );
    Ok(Footprint {
        elapsed,
        millicores: (cpu_after - cpu_before) / elapsed * 1000.0,
        rss_kib,
        hwm_kib: process.status_kib("VmHWM:").await?,
    })
}

/// `NODEWARDEN_BENCH_SECONDS` (30 to 86,400), else `default`.
pub fn bench_span(default: u64) -> Result<Duration> {
    match std::env::var("NODEWARDEN_BENCH_SECONDS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|s| (30..=86_400).contains(s))
            .map(Duration::from_secs)
            .with_context(|| format!("NODEWARDEN_BENCH_SECONDS={v}: 30 to 86400")),
        Err(_) => Ok(Duration::from_secs(default)),
    }
}
