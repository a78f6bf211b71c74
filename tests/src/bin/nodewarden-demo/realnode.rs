//! The demo's last section: the chart on two real nodes of this machine (a busy one and a quiet
//! one), when the machine allows it (Linux, root). Elsewhere it says so and what the sections
//! before it used instead.

use anyhow::{Context, Result};
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images;
use nodewarden_tests::node::unavailable_reason;
use nodewarden_tests::shipper::{
    BUSY, QUIET, container_limits, container_requests, create_shipper, install_chart, recreate_shipper_pod,
    resize_in_place, wait_for_recommendation,
};
use nodewarden_tests::{RealCluster, RealClusterConfig};

use crate::step;

const MIB: u64 = 1024 * 1024;

pub async fn real_nodes() -> Result<()> {
    if let Some(reason) = unavailable_reason() {
        step(&format!(
            "real nodes: not on this machine ({reason}); the right-sizing above ran on simulated nodes \
             (Node objects without a kubelet, agents reading synthetic cgroup files)"
        ));
        return Ok(());
    }
    step("real nodes: building the images (nodewarden-webhook, nodewarden-agent, the test image)");
    let images = images::build_test_images().await?;
    step(
        "starting two real nodes: a kubelet with its own containerd, runc and bridge CNI each, kube-scheduler, kube-proxy",
    );
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 2,
        images: images.archives(),
        sandbox_image: images.testbox_ref(),
        self_signed_kubelets: vec![],
    })
    .await
    .context("starting the real nodes")?;
    let outcome = show(&cluster, &images).await;
    step("stopping the real nodes and putting the host back as it was (sysctls, iptables, mounts, cgroups)");
    let restored = cluster.shutdown();
    outcome?;
    restored?;
    step("host restored: nothing the nodes changed is left");
    Ok(())
}

async fn show(cluster: &RealCluster, images: &images::TestImages) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let helm = Helm::for_control_plane(&cluster.cp)?;
    let took = install_chart(&helm, &client, images, &cluster.fresh_checkpoint_dir()?).await?;
    step(&format!(
        "helm install --wait of charts/nodewarden (default values, local images): ready in {:.0}s",
        took.as_secs_f64()
    ));
    let nodes = [(&cluster.nodes[0], BUSY), (&cluster.nodes[1], QUIET)];
    create_shipper(&client, &images.testbox_ref(), &nodes).await?;
    step(
        "a log-shipper DaemonSet with a DaemonSetAutoscaler: its pods burn CPU and hold memory, \
         more on the busy node; each node's agent measures them from the real cgroups (about a minute)",
    );
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (node, load) in nodes {
        let (cpu, mem) = wait_for_recommendation(&client, &node.name, load).await?;
        targets.push((cpu, mem));
        let pod = recreate_shipper_pod(&client, &node.name).await?;
        let (req_cpu, req_mem) = container_requests(&pod)?;
        let (_, limit) = container_limits(&pod)?;
        let applied = node.container_cgroup(&pod)?;
        rows.push((
            node.name.clone(),
            load,
            cpu,
            mem,
            req_cpu,
            req_mem,
            limit,
            applied,
        ));
    }
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
            format!("{cpu}m {}Mi", mem.div_ceil(MIB)),
            format!("{req_cpu}m {}Mi", req_mem.div_ceil(MIB)),
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
         through pods/resize, nobody deletes anything"
    ));
    println!();
    println!(
        "  {:<18} {:>14} {:>14} {:>20} {:>14}",
        "node", "pod", "CPU request", "container restarts", "cgroup shares"
    );
    for (node, _) in nodes {
        let (before, after) = resize_in_place(&client, &node.name, floor).await?;
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
