//! The demo's last section: the chart on two real nodes of this machine (a busy one and a quiet
//! one), when the machine allows it (Linux, root). Elsewhere it says so and what the sections
//! before it used instead.
//!
//! Day one as a user lives it (issue 32): a Prometheus already scrapes the kubelets and a log
//! shipper already runs; `kubectl nodewarden report --prometheus` (the real plugin binary)
//! prints each node's figures before anything of nodewarden is installed; `helm install` with
//! `agent.history.prometheus.url` then gives each node an agent that seeds from that history and
//! publishes the same figures within a minute of its start. Then a re-created pod gets its
//! node's figures, and with `updateMode: InPlace` the agents resize the running pods.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images;
use nodewarden_tests::node::unavailable_reason;
use nodewarden_tests::prometheus::Prometheus;
use nodewarden_tests::seeding::{
    self, Printed, check_seeded, report_args, report_args_until, report_figures, scrape_kubelets,
    seeded_until, seeding_values, wait_for_publish, wait_for_whole_step,
};
use nodewarden_tests::shipper::{
    BUSY, QUIET, container_limits, container_requests, create_autoscaler, create_shipper_daemonset,
    install_chart, recreate_shipper_pod, resize_in_place, wait_for_recommendation,
};
use nodewarden_tests::{RealCluster, RealClusterConfig, apply_crds, chart_crd_files, read_crds};

use crate::step;

const MIB: u64 = 1024 * 1024;

/// The real nodes, started beside the simulated sections: what [`finish`] goes on with.
pub struct Started {
    began: Instant,
    /// What happened while the simulated sections printed, said by [`finish`].
    notes: Vec<String>,
    images: images::TestImages,
    prometheus: Prometheus,
    shipper_created: Instant,
    // declared last: dropped (stopped) after Prometheus
    cluster: RealCluster,
}

/// What [`start`] gave: the real nodes running, or why they cannot run here.
pub type Start = Result<std::result::Result<Box<Started>, String>>;

/// Day one's beginning, before anything of nodewarden is installed: the images, two real nodes,
/// a Prometheus scraping their kubelets and the log shipper running. Prints nothing (the
/// simulated sections print meanwhile); on a failure after the nodes started, stops them.
pub async fn start() -> Start {
    if let Some(reason) = unavailable_reason() {
        return Ok(Err(reason));
    }
    let began = Instant::now();
    let images = images::build_test_images().await?;
    let built = began.elapsed();
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 2,
        images: images.archives(),
        sandbox_image: images.testbox_ref(),
        self_signed_kubelets: vec![],
        registry_hosts: None,
    })
    .await
    .context("starting the real nodes")?;
    let mut notes = vec![
        format!(
            "real nodes: the images (nodewarden-webhook, nodewarden-agent, the test image) built or found in {:.0}s",
            built.as_secs_f64()
        ),
        format!(
            "two real nodes up {:.0}s after the demo began: a kubelet with its own containerd, runc and bridge CNI each, \
             kube-scheduler, kube-proxy",
            began.elapsed().as_secs_f64()
        ),
    ];
    let client = match cluster.cp.admin_client().await {
        Ok(c) => c,
        Err(e) => return Err(stop(cluster, e)),
    };
    // day one: the cluster's monitoring and its workloads are there, nodewarden is not
    let prometheus = match scrape_kubelets(&cluster, &client).await {
        Ok(p) => p,
        Err(e) => return Err(stop(cluster, e)),
    };
    notes.push(format!(
        "a Prometheus at {} scrapes both kubelets' /metrics/cadvisor every {}s, as a cluster's monitoring does \
         (a ServiceAccount's token, TLS verified); nothing of nodewarden is installed",
        prometheus.url(),
        seeding::SCRAPE_INTERVAL.as_secs()
    ));
    let shipper_created = Instant::now();
    let nodes = [(&cluster.nodes[0], BUSY), (&cluster.nodes[1], QUIET)];
    if let Err(e) = create_shipper_daemonset(&client, &images.testbox_ref(), &nodes).await {
        drop(prometheus);
        return Err(stop(cluster, e));
    }
    notes.push(format!(
        "a log-shipper DaemonSet runs ({:.0}s after the demo began): its pods burn CPU and hold memory, \
         more on the busy node",
        began.elapsed().as_secs_f64()
    ));
    Ok(Ok(Box::new(Started {
        began,
        notes,
        images,
        prometheus,
        shipper_created,
        cluster,
    })))
}

/// Stops `cluster` after `err`; the error, with the stop's own if it failed.
fn stop(cluster: RealCluster, err: anyhow::Error) -> anyhow::Error {
    match cluster.shutdown() {
        Ok(()) => err,
        Err(e) => err.context(format!("and putting the host back failed: {e:#}")),
    }
}

/// The simulated sections failed: stop the real nodes without showing anything.
pub fn abandon(started: Start) {
    if let Ok(Ok(started)) = started {
        let Started {
            prometheus, cluster, ..
        } = *started;
        drop(prometheus);
        if let Err(e) = cluster.shutdown() {
            eprintln!("putting the host back after the real nodes failed: {e:#}");
        }
    }
}

/// The rest of the real nodes' section, after the simulated ones.
pub async fn finish(started: Start, plugin: &Path) -> Result<()> {
    let started = match started? {
        Ok(started) => started,
        Err(reason) => {
            step(&format!(
                "real nodes: not on this machine ({reason}); the right-sizing above ran on simulated nodes \
                 (Node objects without a kubelet, agents reading synthetic cgroup files)"
            ));
            return Ok(());
        }
    };
    let Started {
        began,
        notes,
        images,
        prometheus,
        shipper_created,
        cluster,
    } = *started;
    for note in &notes {
        step(note);
    }
    let outcome = show(&cluster, &images, plugin, prometheus, shipper_created).await;
    step("stopping the real nodes and putting the host back as it was (sysctls, iptables, mounts, cgroups)");
    let restored = cluster.shutdown();
    outcome?;
    restored?;
    step(&format!(
        "host restored: nothing the nodes changed is left (real nodes: {:.0}s since the demo began)",
        began.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// `kubectl nodewarden <args>` as kubectl runs the plugin: the binary with the words after
/// `kubectl nodewarden`, the cluster's kubeconfig in `KUBECONFIG`.
async fn kubectl_nodewarden(plugin: &Path, kubeconfig: &Path, args: &[String]) -> Result<String> {
    let out = tokio::process::Command::new(plugin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", plugin.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl nodewarden {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn clock(t: Timestamp) -> String {
    t.strftime("%H:%M:%S").to_string()
}

fn cpu_mem((cpu, mem): (u64, u64)) -> String {
    format!("{cpu}m {}Mi", mem.div_ceil(MIB))
}

async fn show(
    cluster: &RealCluster,
    images: &images::TestImages,
    plugin: &Path,
    prometheus: Prometheus,
    shipper_created: Instant,
) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let helm = Helm::for_control_plane(&cluster.cp)?;
    let nodes = [(&cluster.nodes[0], BUSY), (&cluster.nodes[1], QUIET)];
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    let url = prometheus.url();
    let history = wait_for_whole_step(&prometheus, &names).await?;
    step(&format!(
        "Prometheus holds a whole minute of the shipper's history ({:.0}s after the shipper was created; \
         its first samples at {} UTC)",
        shipper_created.elapsed().as_secs_f64(),
        history
            .first
            .values()
            .map(|t| clock(*t))
            .collect::<Vec<_>>()
            .join(" and ")
    ));

    // the report, before anything of nodewarden is installed, as the user types it
    let args = report_args(&url);
    step(&format!(
        "kubectl nodewarden {}   (the plugin, no CRDs, no autoscaler: the defaults)",
        args.join(" ")
    ));
    let kubeconfig = cluster.cp.kubeconfig_path();
    let table = kubectl_nodewarden(plugin, kubeconfig, &args).await?;
    println!();
    for line in table.lines() {
        println!("  {line}");
    }
    println!();
    let mut json_args = args.clone();
    json_args.extend(["-o".to_string(), "json".to_string()]);
    let report: serde_json::Value =
        serde_json::from_str(&kubectl_nodewarden(plugin, kubeconfig, &json_args).await?)
            .context("the report's JSON")?;
    let printed: Vec<Printed> = names
        .iter()
        .map(|n| report_figures(&report, n))
        .collect::<Result<_>>()?;

    // nodewarden: the CRDs and the shipper's autoscaler first (an agent seeds the autoscaled
    // containers it finds when it starts), then the chart with the Prometheus URL
    apply_crds(&cluster.cp, &client, &read_crds(&chart_crd_files()?)?).await?;
    create_autoscaler(&client).await?;
    step("kubectl apply of the chart's CRDs and a DaemonSetAutoscaler for the shipper (mode Initial)");
    let values = seeding_values(&url);
    let checkpoints = cluster.fresh_checkpoint_dir()?;
    // watched while helm waits: the first recommendation each agent publishes
    let (took, seeded) = tokio::try_join!(
        install_chart(&helm, &client, images, &checkpoints, &values),
        wait_for_publish(&client, &names, &[], Duration::from_secs(240), |_| true)
    )?;
    step(&format!(
        "helm install --wait of charts/nodewarden --set {}: ready in {:.0}s",
        values.join(" --set "),
        took.as_secs_f64()
    ));
    // the report again over exactly the history each agent read (--end at its last sample): the
    // agents started after the report above, and a minute more of history moves a young
    // percentile by far more than a bucket
    let mut same = Vec::new();
    for s in &seeded {
        let mut args = report_args_until(&url, seeded_until(s)?);
        args.extend(["-o".to_string(), "json".to_string()]);
        let report: serde_json::Value =
            serde_json::from_str(&kubectl_nodewarden(plugin, kubeconfig, &args).await?)
                .context("the report's JSON")?;
        let row = report_figures(&report, &s.node)?;
        check_seeded(s, &history, &row)?;
        same.push(row);
    }
    step(
        "each node's agent seeded its history from Prometheus and published at once what the report \
         gives for the same history (kubectl nodewarden report ... --end <the agent's last sample>)",
    );
    println!();
    println!(
        "  {:<18} {:>13} {:>10} {:>13} {:>13} {:>8} {:>16} {:>16} {:>16}",
        "node",
        "agent started",
        "published",
        "history from",
        "to",
        "samples",
        "report above",
        "report, same",
        "agent: target"
    );
    for ((s, p), same) in seeded.iter().zip(&printed).zip(&same) {
        println!(
            "  {:<18} {:>13} {:>10} {:>13} {:>13} {:>8} {:>16} {:>16} {:>16}",
            s.node,
            clock(s.started),
            format!("+{:.0}s", s.after_start()),
            s.first_sample.map_or("-".to_string(), clock),
            s.last_sample.map_or("-".to_string(), clock),
            s.sample_count,
            cpu_mem(p.target),
            cpu_mem(same.target),
            cpu_mem(s.figures.target),
        );
    }
    println!(
        "  (\"report above\" read the history up to {}; a few minutes of history are no days: the figures \
         firm up as it grows, and the report's HISTORY column says how long it is)",
        printed
            .iter()
            .filter_map(|p| p.last_sample.map(clock))
            .max()
            .unwrap_or_else(|| "-".to_string())
    );
    println!();
    drop(prometheus);

    // both nodes at once
    let rows = futures::future::try_join_all(nodes.iter().map(|&(node, load)| {
        let client = client.clone();
        async move {
            let (cpu, mem) = wait_for_recommendation(&client, &node.name, load).await?;
            let pod = recreate_shipper_pod(&client, &node.name).await?;
            let (req_cpu, req_mem) = container_requests(&pod)?;
            let (_, limit) = container_limits(&pod)?;
            let applied = node.container_cgroup(&pod)?;
            anyhow::Ok((
                node.name.clone(),
                load,
                cpu,
                mem,
                req_cpu,
                req_mem,
                limit,
                applied,
            ))
        }
    }))
    .await?;
    let targets: Vec<(u64, u64)> = rows.iter().map(|r| (r.2, r.3)).collect();
    step("each node's recommendation, and a re-created pod as the webhook and its kubelet set it up");
    println!();
    println!(
        "  {:<18} {:>14} {:>18} {:>18} {:>24}",
        "node", "uses", "recommended", "new pod requests", "cgroup (shares, limit)"
    );
    for (node, load, cpu, mem, req_cpu, req_mem, limit, applied) in rows {
        println!(
            "  {:<18} {:>14} {:>18} {:>18} {:>24}",
            node,
            format!("{}m {}Mi", load.millicores, load.mib),
            cpu_mem((cpu, mem)),
            cpu_mem((req_cpu, req_mem)),
            format!(
                "{} {}",
                applied
                    .cpu_shares
                    .or(applied.cpu_weight)
                    .map_or("-".to_string(), |v| v.to_string()),
                applied
                    .memory_limit
                    .or(limit)
                    .map_or("-".to_string(), |b| format!("{}Mi", b / MIB))
            ),
        );
    }
    println!();
    let floor = targets.iter().map(|(cpu, _)| *cpu).max().unwrap_or(0) + 100;
    step(&format!(
        "updateMode InPlace with a CPU floor of {floor}m: each node's agent resizes its running pod \
         through pods/resize, nobody deletes anything (a raise: on minutes of history, less than the \
         chart's agent.update.minHistory of 24h, an agent raises a running pod but never lowers it)"
    ));
    println!();
    println!(
        "  {:<18} {:>14} {:>14} {:>20} {:>14}",
        "node", "pod", "CPU request", "container restarts", "cgroup shares"
    );
    let resized = futures::future::try_join_all(
        nodes
            .iter()
            .map(|(node, _)| resize_in_place(&client, &node.name, floor)),
    )
    .await?;
    for ((node, _), (before, after)) in nodes.iter().zip(resized) {
        let restarts = |p: &k8s_openapi::api::core::v1::Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count)
        };
        let applied = node.container_cgroup(&after)?;
        println!(
            "  {:<18} {:>14} {:>14} {:>20} {:>14}",
            node.name,
            kube::ResourceExt::name_any(&after),
            format!(
                "{}m → {}m",
                container_requests(&before)?.0,
                container_requests(&after)?.0
            ),
            format!("{} → {}", restarts(&before), restarts(&after)),
            applied
                .cpu_shares
                .or(applied.cpu_weight)
                .map_or("-".to_string(), |v| v.to_string()),
        );
    }
    println!();
    let out = helm
        .run(&["uninstall", "nodewarden", "--namespace", "nodewarden", "--wait"])
        .await?;
    step(if out.success {
        "helm uninstall: done"
    } else {
        "helm uninstall failed (the nodes are stopped anyway)"
    });
    Ok(())
}
