//! A cgroup v2 node with the systemd cgroup driver, as users run them, beside a real cluster on a
//! host whose own cgroups are v1: a virtual machine (QEMU, software emulation) booting Debian with
//! systemd on the unified hierarchy, containerd 2.x with `SystemdCgroup = true`, and a kubelet with
//! `cgroupDriver: systemd` and default settings otherwise (it would refuse cgroup v1; it signs its
//! own serving certificate). See `tests/README.md`, "cgroup v2 node (virtual machine)".
//!
//! Everything runs from a release of this machine's platform (`cargo xtask release`, which the CI
//! prefetch builds first), published as the release workflow publishes it, into a registry the
//! harness starts (`nodewarden_tests::registry`, standing in for `ghcr.io`): the images with their
//! index under the chart's default names, the chart as an OCI artifact. Both nodes' containerd
//! have it as their mirror of `ghcr.io`, and no image of nodewarden's is imported on any node.
//! Then the README's user path ("Use it on a cluster"), with the lines the README itself holds
//! (`nodewarden_tests::release`): `sha256sum -c SHA256SUMS`; `helm install oci://…` from the
//! registry (its host the test registry's, with its CA), with the chart's default images; the
//! README's DaemonSetAutoscaler; the plugin unpacked from its archive, and `kubectl nodewarden
//! report`.
//!
//! What a user would see:
//! 0. The release's files check out, and the chart a registry would serve is the release's `.tgz`.
//!    The chart installs from the registry; the webhook's pod on the host node and the agent's pod
//!    on the VM node (which joins after the install) run the images each node pulled from the
//!    registry by the chart's default names: their image IDs are the pushed indexes' digests.
//! 1. The node joins and is Ready, running containerd 2.x, on cgroup v2 (`cgroup2fs`, with the
//!    cpu and memory controllers).
//! 2. A pod with requests and a memory limit runs there; its container's cgroup is
//!    `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`,
//!    with `cpu.weight` and `memory.max` as the kubelet derives them from the pod's resources.
//! 3. The chart installed from the release runs its agent there too (the agent tolerates
//!    the node's taint; the webhook stays on the host node, where the API server reaches it): for
//!    a log-shipper-like DaemonSet on the VM node, the agent reads the containers' v2 cgroup files
//!    and publishes `NodeRecommendation/<vm node>` with figures near what the shipper uses there,
//!    through the `kubernetes` Service (the guest's kube-proxy, then the forwarding rule).
//!    The agent also reads the guest kubelet's feature gates, verifying its self-signed serving
//!    certificate against the node's own (the chart's default). `kubectl nodewarden report -n
//!    logging`, the release's plugin binary, shows the VM node's row with the node's own figure
//!    (`node`), equal to that NodeRecommendation's target; so does its HTML page.
//! 4. A new pod of that DaemonSet on the VM node gets the node's figures from the webhook, and
//!    the guest's kubelet runs it with them: `cpu.weight` and `memory.max` of its scope.
//! 5. With `updateMode: InPlace` and a CPU floor above the node's figure, the agent resizes the
//!    running pod in place; the kubelet changes `cpu.weight` of the same container, no restart.
//! 6. A DaemonSet container OOM-killed in a loop on the VM node (`nodewarden_tests::oom`, under a
//!    `Recreate` autoscaler for memory) is re-created by the node's agent with the node's raised
//!    memory, and runs with that `memory.max` without a restart.
//! 7. The VM is gone afterwards, and the host is as before.
//!
//! Needs Linux and root; elsewhere it says so loudly and passes, except under `CI=true`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::{Api, Client};
use nodewarden_api::NodeRecommendation;
use nodewarden_cli::report::render;
use nodewarden_tests::footprint;
use nodewarden_tests::helm::Helm;
use nodewarden_tests::images::{self, TestImages};
use nodewarden_tests::oom;
use nodewarden_tests::registry::{Registry, UPSTREAM};
use nodewarden_tests::release::{self, HostRelease, UserPath};
use nodewarden_tests::seeding::targets_while;
use nodewarden_tests::shipper::{
    self, QUIET, SHIPPER, SHIPPER_NS, container_limits, container_requests, cpu_milli, describe_pods,
    install_chart_with, memory_bytes, recreate_shipper_pod, resize_in_place, running_container,
    wait_for_kubelet_gates, wait_for_recommendation,
};
use nodewarden_tests::vm::{self, VM_TAINT_KEY, VmConfig, VmNode};
use nodewarden_tests::{RealCluster, RealClusterConfig, create_namespace, failure_with, require_real_nodes};
use serde_json::json;

const NAMESPACE: &str = "cgroupv2";
const VM_NODE: &str = "nodewarden-vm-a";
const POD_RUNNING_TIMEOUT: Duration = Duration::from_secs(240);

/// The user's side of the README's path: the release, and what the user made of its files in a
/// folder of their own (the chart as a registry serves it, the plugin unpacked).
struct UserFiles {
    release: HostRelease,
    folder: tempfile::TempDir,
    chart: PathBuf,
    plugin: PathBuf,
    /// The README's DaemonSetAutoscaler.
    autoscaler: serde_json::Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_on_a_cgroup_v2_systemd_node() -> Result<()> {
    if !require_real_nodes("pod_on_a_cgroup_v2_systemd_node")? {
        return Ok(());
    }
    let began = Instant::now();
    let user = user_files().await?;
    // the release's two images; the test image is the pods' sandbox and the shipper's program
    let images = TestImages {
        webhook: user.release.webhook.clone(),
        agent: user.release.agent.clone(),
        testbox: images::build_testbox().await?,
    };
    eprintln!(
        "cgroupv2_node: the release checked and unpacked, test image built, {:.1}s after the start",
        began.elapsed().as_secs_f64()
    );
    // the registry the release is published to, a mirror of ghcr.io for both nodes
    let registry = Arc::new(Registry::prepare(&[vm::REGISTRY_IP]).await?);
    let cluster = RealCluster::start(&RealClusterConfig {
        nodes: 1,
        // the pods' test image only: nodewarden's are pulled from the registry
        images: vec![images.testbox.archive.clone()],
        sandbox_image: images.testbox_ref(),
        self_signed_kubelets: vec![],
        registry_hosts: Some(registry.mirror_for_host()?),
    })
    .await?;
    let pushed = match publish(&cluster, &registry, &user).await {
        Ok(pushed) => pushed,
        Err(e) => {
            if let Err(r) = cluster.shutdown() {
                eprintln!("cgroupv2_node: {r:#}");
            }
            return Err(e);
        }
    };
    let mut config = VmConfig::new(
        VM_NODE,
        vec![images.testbox.archive.clone()],
        &images.testbox_ref(),
    );
    config.registry = Some(registry.clone());
    // The chart is installed while the guest boots (its minutes of software emulation leave
    // the API server and the host node idle): the agent's DaemonSet gets the VM node's pod when
    // the node registers. The guest's image comes first, so its build on a fresh machine cannot
    // eat helm's --wait.
    let (vm, installed) = match vm::vm_image().await {
        Ok(_) => {
            tokio::join!(
                VmNode::start(&cluster, &config),
                install(&cluster, &user, &registry)
            )
        }
        Err(e) => (Err(e), Ok(())),
    };
    let vm = match vm {
        Ok(vm) => vm,
        Err(e) => {
            if let Err(r) = cluster.shutdown() {
                eprintln!("cgroupv2_node: {r:#}");
            }
            return Err(e);
        }
    };
    let result = match installed {
        Ok(()) => scenario(&cluster, &vm, &images, &user, &pushed).await,
        Err(e) => Err(e),
    };
    let details = match &result {
        Err(_) => failure_details(&cluster, &vm).await,
        Ok(()) => String::new(),
    };
    let stopped = vm.shutdown(&cluster);
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "pod_on_a_cgroup_v2_systemd_node", &details))?;
    stopped?;
    restored?;
    eprintln!("cgroupv2_node: done in {:.0}s", began.elapsed().as_secs_f64());
    Ok(())
}

/// Benchmark (issue 42; figures only, checks only that every container is published): the
/// agent's footprint on the cgroup v2 + systemd VM node with 30 autoscaled containers, as
/// `realnode.rs`'s `agent_footprint` on the host nodes (`nodewarden_tests::footprint`): the
/// chart's defaults but for the images, the workload on the VM node only, the agent process read
/// from the guest's `/proc` every 10 s for `NODEWARDEN_BENCH_SECONDS` (600) after every container
/// is published. The guest's CPU is software-emulated, so its millicores are the emulator's, many
/// times a real CPU's; its memory is the agent's own. Run by hand:
///
/// ```sh
/// cargo test -p nodewarden-tests --test cgroupv2_node -- --ignored --nocapture agent_footprint
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run by hand, figures go to docs/benchmarks.md"]
async fn agent_footprint_on_the_vm_node_with_30_containers() -> Result<()> {
    if !require_real_nodes("agent_footprint_on_the_vm_node_with_30_containers")? {
        return Ok(());
    }
    let span = footprint::bench_span(600)?;
    let images = images::build_test_images().await?;
    vm::vm_image().await?;
    let cluster = RealCluster::start(&RealClusterConfig::with_images(1, &images)).await?;
    let config = VmConfig::new(VM_NODE, images.archives(), &images.testbox_ref());
    let vm = match VmNode::start(&cluster, &config).await {
        Ok(vm) => vm,
        Err(e) => {
            if let Err(r) = cluster.shutdown() {
                eprintln!("cgroupv2_node: {r:#}");
            }
            return Err(e);
        }
    };
    let result = vm_footprint(&cluster, &vm, &images, span).await;
    let details = match &result {
        Err(_) => failure_details(&cluster, &vm).await,
        Ok(()) => String::new(),
    };
    let stopped = vm.shutdown(&cluster);
    let restored = cluster.shutdown();
    result.map_err(|e| failure_with(e, "agent_footprint_on_the_vm_node_with_30_containers", &details))?;
    stopped?;
    restored
}

async fn vm_footprint(cluster: &RealCluster, vm: &VmNode, images: &TestImages, span: Duration) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    nodewarden_tests::apply_crds(
        &cluster.cp,
        &client,
        &nodewarden_tests::read_crds(&nodewarden_tests::chart_crd_files()?)?,
    )
    .await?;
    create_namespace(&cluster.cp, &client, NAMESPACE).await?;
    let on_the_vm = footprint::Placement::On(
        VM_NODE,
        json!([{"key": VM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]),
    );
    let wanted = footprint::create_workload(&client, NAMESPACE, &images.testbox_ref(), &on_the_vm).await?;
    footprint::install_chart_defaults(cluster, images).await?;
    // thirty containers start in an emulated guest: minutes, not seconds
    footprint::wait_published(&client, VM_NODE, wanted, Duration::from_secs(900), || {
        describe_pods(&client, NAMESPACE)
    })
    .await?;
    let process = footprint::AgentProcess::in_guest(vm).await?;
    let measured = footprint::measure(&process, span).await?;
    let published = footprint::published(&client, VM_NODE).await?;
    eprintln!(
        "footprint: the agent on the VM node (cgroup v2, systemd driver, software-emulated CPU, Kubernetes {}), \
         {published} autoscaled containers, {}",
        cluster.cp.kube_version(),
        measured.summary()
    );
    ensure!(
        published >= wanted,
        "every container is still published: {published} of {wanted}"
    );
    Ok(())
}

/// The release (found or built), then the README's first steps on its files: `sha256sum -c`,
/// the chart out of its OCI layout (it must be the release's `.tgz`), the plugin out of its
/// archive.
async fn user_files() -> Result<UserFiles> {
    let autoscaler = release::check_readme()?;
    let started = Instant::now();
    let release = release::host_release().await?;
    eprintln!(
        "cgroupv2_node: cargo xtask release --platform {} took {:.1}s ({})",
        release.target.platform(),
        started.elapsed().as_secs_f64(),
        release.dir.display()
    );
    let started = Instant::now();
    release::check_sums(
        &release,
        &[
            &release.chart_tgz(),
            &release.chart_layout(),
            &release.webhook.archive,
            &release.agent.archive,
            &release.plugin_archive(),
        ],
    )?;
    let folder = tempfile::Builder::new().prefix("nodewarden-user-").tempdir()?;
    let chart = release::chart_from_layout(&release.chart_layout(), &release.chart_version, folder.path())?;
    ensure!(
        std::fs::read(&chart)? == std::fs::read(release.chart_tgz())?,
        "the chart a registry serves from {} is not the release's {}",
        release.chart_layout().display(),
        release.chart_tgz().display()
    );
    // the plugin's archive, downloaded into the user's folder and unpacked there
    let archive = release.plugin_archive();
    std::fs::copy(
        &archive,
        folder
            .path()
            .join(archive.file_name().context("the plugin archive's name")?),
    )?;
    release::sh(folder.path(), &release.line(UserPath::UNPACK))?;
    let plugin = folder.path().join(xtask::release::PLUGIN_BIN);
    eprintln!(
        "cgroupv2_node: sha256sum -c, the chart out of its layout and the plugin unpacked in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(UserFiles {
        release,
        folder,
        chart,
        plugin,
        autoscaler,
    })
}

/// What [`publish`] pushed: the images' references by the chart's default names, each with the
/// digest of its index.
struct Pushed {
    images: Vec<(String, String)>,
}

/// The chart's reference in the README's `helm install` line (`oci://ghcr.io/…/nodewarden`).
fn readme_chart_ref(user: &UserFiles) -> Result<String> {
    let line = user.release.line(UserPath::INSTALL);
    line.split_whitespace()
        .find(|w| w.starts_with("oci://"))
        .map(str::to_string)
        .with_context(|| format!("`{line}` installs no chart from an OCI registry"))
}

/// The release, published into `registry` (started as a process of the cluster) as the release workflow publishes it to ghcr.io:
/// each image with its index, under the repository the chart's values name by default and the
/// release's version as tag; the chart under the README's path.
async fn publish(cluster: &RealCluster, registry: &Registry, user: &UserFiles) -> Result<Pushed> {
    let started = Instant::now();
    registry.start(&cluster.cp).await?;
    let values: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/nodewarden/values.yaml"),
    )?)?;
    ensure!(
        values["global"]["imageRegistry"] == UPSTREAM,
        "the chart's default registry is {}, not {UPSTREAM}",
        values["global"]["imageRegistry"]
    );
    let mut images = Vec::new();
    for (component, image) in [("webhook", &user.release.webhook), ("agent", &user.release.agent)] {
        let repository = values[component]["image"]["repository"]
            .as_str()
            .with_context(|| format!("the chart's values name no {component} repository"))?;
        let digest = registry
            .push_image(&image.archive, repository, &user.release.version)
            .await?;
        images.push((
            format!("{UPSTREAM}/{repository}:{}", user.release.version),
            digest,
        ));
    }
    let chart = readme_chart_ref(user)?;
    let repository = chart
        .strip_prefix(&format!("oci://{UPSTREAM}/"))
        .and_then(|r| r.rsplit_once('/'))
        .map(|(repository, _)| repository)
        .with_context(|| format!("the README's chart {chart} is not under oci://{UPSTREAM}/"))?;
    registry
        .push_chart(&cluster.cp.helm_path(), &user.chart, repository)
        .await?;
    eprintln!(
        "cgroupv2_node: pushed {images:?} and the chart to the registry (for {chart}) in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(Pushed { images })
}

/// The README's `helm install` of the chart from the registry (`oci://` with the test
/// registry's host for ghcr.io's, and its CA), the chart's defaults otherwise (the images by
/// their ghcr.io names, which the nodes pull through their mirror), with the test's pace and an
/// empty checkpoint folder.
async fn install(cluster: &RealCluster, user: &UserFiles, registry: &Registry) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let helm = Helm::for_control_plane(&cluster.cp)?;
    let line = user.release.line(UserPath::INSTALL);
    let chart = readme_chart_ref(user)?;
    let here = chart.replacen(
        &format!("oci://{UPSTREAM}/"),
        &format!("oci://{}/", registry.host()),
        1,
    );
    let mut args: Vec<String> = line
        .split_whitespace()
        .skip(1)
        .map(|a| if a == chart { here.clone() } else { a.to_string() })
        .collect();
    ensure!(args.contains(&here), "`{line}` does not install {chart}");
    args.extend(["--ca-file".to_string(), registry.ca_pem().display().to_string()]);
    let took = install_chart_with(&helm, &client, args, &cluster.fresh_checkpoint_dir()?).await?;
    eprintln!(
        "cgroupv2_node: {line} took {:.1}s (beside the guest's boot)",
        took.as_secs_f64()
    );
    Ok(())
}

/// The webhook's pod (on the host node) and the agent's pod on the VM node, which joined after
/// the install, each run (its init containers too) the image by the chart's default name, with
/// the digest of the index pushed under it: the node pulled it from the registry (no node has
/// it otherwise).
async fn pulled_from_the_registry(client: &Client, pushed: &Pushed) -> Result<()> {
    let pods = Api::<Pod>::namespaced(client.clone(), "nodewarden");
    let started = Instant::now();
    loop {
        let mut running = Vec::new();
        let mut waiting = Vec::new();
        for pod in pods.list(&Default::default()).await? {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let status = pod.status.unwrap_or_default();
            let statuses = status
                .init_container_statuses
                .unwrap_or_default()
                .into_iter()
                .chain(status.container_statuses.unwrap_or_default());
            for c in statuses {
                let Some((_, digest)) = pushed.images.iter().find(|(name, _)| *name == c.image) else {
                    bail!(
                        "{node}'s container {} runs {}, not an image pushed to the registry",
                        c.name,
                        c.image
                    );
                };
                if c.image_id.is_empty() {
                    waiting.push(format!("{node}: {}", c.name));
                    continue;
                }
                let name = c.image.rsplit_once(':').map(|(n, _)| n).unwrap_or(&c.image);
                ensure!(
                    c.image_id == format!("{name}@{digest}"),
                    "{node}'s container {} runs {} as {}, not the index pushed ({digest})",
                    c.name,
                    c.image,
                    c.image_id
                );
                running.push((node.clone(), c.image.clone()));
            }
        }
        let agent_on_vm = running
            .iter()
            .any(|(node, image)| node == VM_NODE && image.contains("nodewarden-agent"));
        let webhook = running
            .iter()
            .any(|(node, image)| node != VM_NODE && image.contains("nodewarden-webhook"));
        if agent_on_vm && webhook {
            eprintln!("cgroupv2_node: pulled from the registry by their chart-default names: {running:?}");
            return Ok(());
        }
        ensure!(
            started.elapsed() < POD_RUNNING_TIMEOUT,
            "after {POD_RUNNING_TIMEOUT:?}, no agent on {VM_NODE} and webhook elsewhere run the pushed images: \
             running {running:?}, pulling {waiting:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `NodeRecommendation/<node>`'s target for the shipper's container: millicores and bytes.
async fn shipper_target(client: &Client, node: &str) -> Result<Option<(u64, u64)>> {
    let Some(rec) = Api::<NodeRecommendation>::all(client.clone())
        .get_opt(node)
        .await?
    else {
        return Ok(None);
    };
    let Some(target) = rec.spec.recommendations.iter().find_map(|r| {
        (r.autoscaler.namespace == SHIPPER_NS && r.autoscaler.name == SHIPPER && r.container_name == SHIPPER)
            .then_some(r.target.as_ref())
            .flatten()
    }) else {
        return Ok(None);
    };
    Ok(cpu_milli(target.get("cpu"))?.zip(memory_bytes(target.get("memory"))?))
}

/// Runs the README's `line` (`kubectl nodewarden …`, up to any `>`) as kubectl runs a plugin:
/// the unpacked `kubectl-nodewarden` with the words after `kubectl nodewarden`, against the test
/// cluster's kubeconfig; returns what it printed.
async fn run_plugin(cluster: &RealCluster, user: &UserFiles, line: &str) -> Result<String> {
    let words: Vec<&str> = line.split_whitespace().take_while(|w| *w != ">").collect();
    let args = words
        .strip_prefix(&["kubectl", "nodewarden"])
        .with_context(|| format!("`{line}` is not a kubectl nodewarden command"))?;
    let mut command = tokio::process::Command::new(&user.plugin);
    command
        .args(args)
        .current_dir(user.folder.path())
        .env("KUBECONFIG", cluster.cp.kubeconfig_path())
        .kill_on_drop(true);
    for proxy in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        command.env_remove(proxy);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .with_context(|| format!("`{line}` did not end within 60 s"))??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "`{line}` failed ({}): {}{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// `kubectl nodewarden report -n logging` (the release's plugin) shows `node`'s own figure for
/// the shipper, equal to its NodeRecommendation's target, and so does `-o html`. The agent may
/// publish a new figure meanwhile: the target is read before and after, and a report between
/// two different reads is taken again.
async fn report_shows_the_node_target(cluster: &RealCluster, user: &UserFiles, node: &str) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let daemonset = format!("{SHIPPER_NS}/{SHIPPER}");
    let mut last = String::new();
    for _ in 0..5 {
        let before = shipper_target(&client, node).await?;
        let table = run_plugin(cluster, user, UserPath::REPORT).await?;
        let html = run_plugin(cluster, user, UserPath::REPORT_HTML).await?;
        let after = shipper_target(&client, node).await?;
        let Some((cpu, memory)) = before.filter(|_| before == after) else {
            last = format!("the target moved from {before:?} to {after:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let expected = format!("{} / {}", render::cpu(cpu as i64), render::memory(memory as i64));
        let row = release::report_row(&table, &daemonset, node)?;
        ensure!(
            row.get("TARGET") == Some(&expected) && row.get("SOURCE").map(String::as_str) == Some("node"),
            "`{}` shows {row:?} for {node}; its NodeRecommendation's target is {expected} (source node):\n{table}",
            UserPath::REPORT
        );
        let cell = format!("data-v=\"{cpu}\" data-w=\"{memory}\">{expected}</td>");
        ensure!(
            html.contains(&format!("<td>{node}</td>")) && html.contains(&cell),
            "`{}` has no row for {node} with its target {expected} ({} bytes)",
            UserPath::REPORT_HTML,
            html.len()
        );
        std::fs::write(user.folder.path().join("report.html"), &html)?;
        eprintln!("cgroupv2_node: {}: {node} {row:?}", UserPath::REPORT);
        return Ok(());
    }
    bail!("no report between two equal reads of NodeRecommendation/{node} in 5 tries: {last}")
}

/// The README's DaemonSetAutoscaler, for the test's shipper (the README's is for `fluent-bit`).
fn readme_autoscaler(user: &UserFiles) -> Result<nodewarden_api::DaemonSetAutoscaler> {
    let mut autoscaler = user.autoscaler.clone();
    ensure!(
        autoscaler["metadata"]["namespace"] == SHIPPER_NS,
        "the README's autoscaler is not in {SHIPPER_NS}: {autoscaler}"
    );
    autoscaler["metadata"]["name"] = json!(SHIPPER);
    autoscaler["spec"]["targetRef"]["name"] = json!(SHIPPER);
    Ok(serde_json::from_value(autoscaler)?)
}

async fn scenario(
    cluster: &RealCluster,
    vm: &VmNode,
    images: &TestImages,
    user: &UserFiles,
    pushed: &Pushed,
) -> Result<()> {
    let client = cluster.cp.admin_client().await?;
    let image = images.testbox_ref();

    // 0. nodewarden's pods run the images their nodes pulled from the registry
    pulled_from_the_registry(&client, pushed).await?;

    // 1. a Ready node on cgroup v2 with containerd 2.x
    let node = Api::<Node>::all(client.clone()).get(VM_NODE).await?;
    let info = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .context("the VM node has no nodeInfo")?;
    ensure!(
        info.container_runtime_version.starts_with("containerd://2."),
        "the VM node runs containerd 2.x: {}",
        info.container_runtime_version
    );
    // the kubelet of the run's version (NODEWARDEN_KUBE_VERSION, else the pinned one), as the
    // API server's: the guest's image bakes in the version's kubelet
    let version = cluster.cp.kube_version();
    ensure!(
        info.kubelet_version == version.text,
        "the VM node's kubelet is {}, the run's version {version}",
        info.kubelet_version
    );
    eprintln!(
        "cgroupv2_node: {VM_NODE} runs kubelet {} and {} on cgroup v2",
        info.kubelet_version, info.container_runtime_version
    );
    let fs = vm.checked(&["stat", "-fc", "%T", "/sys/fs/cgroup"]).await?;
    ensure!(fs.trim() == "cgroup2fs", "/sys/fs/cgroup in the guest is {fs:?}");
    let controllers = vm.read_file("/sys/fs/cgroup/cgroup.controllers").await?;
    let controllers: Vec<&str> = controllers.split_whitespace().collect();
    ensure!(
        controllers.contains(&"cpu") && controllers.contains(&"memory"),
        "the guest's root cgroup offers cpu and memory: {controllers:?}"
    );
    // no tlsCertFile: the kubelet signed its own serving certificate
    vm.checked(&["test", "-s", "/var/lib/kubelet/pki/kubelet.crt"])
        .await
        .context("the guest kubelet's self-signed certificate")?;

    // 2. a pod with requests and a memory limit; its container's cgroup in the guest
    create_namespace(&cluster.cp, &client, NAMESPACE).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sized"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": VM_NODE},
            "tolerations": [{"key": VM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["pause"],
                "resources": {
                    "requests": {"cpu": "250m", "memory": "64Mi"},
                    "limits": {"memory": "96Mi"},
                },
            }],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let started = Instant::now();
    let pod = loop {
        let pod = pods.get("sized").await?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        match phase.as_deref() {
            Some("Running") => break pod,
            Some("Failed") | Some("Succeeded") => bail!("the pod ended: {:?}", pod.status),
            _ if started.elapsed() > POD_RUNNING_TIMEOUT => {
                bail!(
                    "the pod is not running after {POD_RUNNING_TIMEOUT:?}: {:?}",
                    pod.status
                )
            }
            _ => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    };
    eprintln!(
        "cgroupv2_node: pod Running on {VM_NODE} {:.1}s after it was created",
        started.elapsed().as_secs_f64()
    );
    let (path, cgroup) = vm.container_cgroup(&pod).await?;
    let uid = pod.metadata.uid.as_deref().unwrap_or_default().replace('-', "_");
    ensure!(
        path.starts_with(&format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-"
        )) && path.ends_with(".scope"),
        "the container's cgroup is the systemd driver's: {path}"
    );
    ensure!(
        cgroup.cpu_matches_request(250),
        "cpu.weight for a 250m request: {cgroup:?} ({path})"
    );
    ensure!(
        cgroup.memory_matches_limit(96 * 1024 * 1024),
        "memory.max for a 96Mi limit: {cgroup:?} ({path})"
    );
    eprintln!("cgroupv2_node: /sys/fs/cgroup/{path}: {cgroup:?}");

    // 3. the chart's agent on the VM node measures the DaemonSet there from v2 files and publishes
    shipper::create_namespace(&client, SHIPPER_NS).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), SHIPPER_NS);
    daemonsets
        .create(&PostParams::default(), &vm_shipper(&image)?)
        .await?;
    // the README's autoscaler, as `kubectl apply` would create it
    Api::<nodewarden_api::DaemonSetAutoscaler>::namespaced(client.clone(), SHIPPER_NS)
        .create(&PostParams::default(), &readme_autoscaler(user)?)
        .await?;
    let shipper_created = Instant::now();
    let (cpu, memory) = wait_for_recommendation(&client, VM_NODE, QUIET).await?;
    eprintln!(
        "cgroupv2_node: NodeRecommendation/{VM_NODE} target {cpu}m, {} MiB ({:.0}s after the shipper was created)",
        memory / (1024 * 1024),
        shipper_created.elapsed().as_secs_f64()
    );

    // …and the agent reads the guest kubelet's feature gates, its self-signed certificate pinned
    // from the node's own PKI folder with the chart's default values
    let gates = wait_for_kubelet_gates(&client, VM_NODE).await?;
    eprintln!("cgroupv2_node: NodeFeatureReport/{VM_NODE}: kubelet read, {gates} gates");

    // …and the release's plugin shows the user that figure, the node's own
    report_shows_the_node_target(cluster, user, VM_NODE).await?;

    // 4. a new shipper pod on the VM node gets the node's figures from the webhook, and the
    //    guest's kubelet runs it with them: read back from the v2 files of its systemd scope
    //    (the agent may publish anew while the pod is made: the pod gets whichever target was
    //    current when the webhook admitted it)
    let (second, seen) = targets_while(&client, VM_NODE, recreate_shipper_pod(&client, VM_NODE)).await?;
    let requests = container_requests(&second)?;
    ensure!(
        requests == (cpu, memory) || seen.contains(&requests),
        "the new pod on {VM_NODE} requests the node's target {cpu}m / {memory} B (or one published while it \
         was made: {seen:?}), got {}m / {} B (annotations {:?})",
        requests.0,
        requests.1,
        second.metadata.annotations
    );
    let (path, applied) = vm.container_cgroup(&second).await?;
    ensure!(
        applied.cpu_matches_request(requests.0),
        "cpu.weight of the new pod's container is that of a {}m request: {applied:?} ({path})",
        requests.0
    );
    let (_, limit) = container_limits(&second)?;
    let limit = limit.context("the shipper keeps a memory limit")?;
    ensure!(
        applied.memory_matches_limit(limit),
        "memory.max of the new pod's container is the pod's {limit} B limit: {applied:?} ({path})"
    );
    eprintln!(
        "cgroupv2_node: the re-created pod runs with {}m / {} B, limit {limit} B: {applied:?}",
        requests.0, requests.1
    );

    // 5. InPlace: with a CPU floor above the node's figure, the agent resizes the running pod
    //    through pods/resize, and the guest's kubelet changes cpu.weight of the same container
    let floor = requests.0.max(cpu) + 100;
    let (before, after) = resize_in_place(&client, VM_NODE, floor).await?;
    let container = running_container;
    ensure!(
        container(&before) == container(&after),
        "resized in place on {VM_NODE}: same container, no restart ({:?} → {:?})",
        container(&before),
        container(&after)
    );
    let request = container_requests(&after)?.0;
    let (path, applied) = vm.container_cgroup(&after).await?;
    ensure!(
        applied.cpu_matches_request(request),
        "cpu.weight of the running container is that of its new {request}m request: {applied:?} ({path})"
    );
    eprintln!(
        "cgroupv2_node: resized in place to {request}m CPU (floor {floor}m), same container, {applied:?}"
    );

    // 6. an OOM loop on the VM node, under a Recreate autoscaler for memory: the node's agent
    //    re-creates the pod with the node's raised memory, and the guest's kubelet runs it with
    //    that limit (memory.max of its scope), without a restart
    let rescue = oom::rescue_an_oom_loop(
        &client,
        &oom::OomLoop {
            namespace: SHIPPER_NS,
            image: &image,
            looping: VM_NODE,
            steady: None,
            tolerations: json!([{"key": VM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]),
        },
    )
    .await?;
    let (path, applied) = vm.container_cgroup(&rescue.pod).await?;
    ensure!(
        applied.memory_matches_limit(rescue.limit),
        "memory.max of the rescued container is its pod's {} B limit: {applied:?} ({path})",
        rescue.limit
    );
    eprintln!(
        "cgroupv2_node: OOM loop rescued on {VM_NODE}: kills seen {}, first kill → rescued container running {:.0} s; \
         now {} MiB request, {} MiB limit, {applied:?}",
        rescue.kills,
        rescue.took.as_secs_f64(),
        rescue.memory >> 20,
        rescue.limit >> 20
    );
    Ok(())
}

/// The log-shipper-like DaemonSet on the VM node only (it tolerates the node's taint), burning
/// and holding the quiet node's load.
fn vm_shipper(image: &str) -> Result<DaemonSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": SHIPPER},
        "spec": {
            "selector": {"matchLabels": {"app": SHIPPER}},
            "template": {
                "metadata": {"labels": {"app": SHIPPER}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": VM_NODE},
                    "tolerations": [{"key": VM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": SHIPPER,
                        "image": image,
                        "imagePullPolicy": "Never",
                        "args": ["burn", "--per-node", format!("{VM_NODE}={}:{}", QUIET.millicores, QUIET.mib)],
                        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"memory": "1Gi"},
                        },
                    }],
                },
            },
        },
    }))?)
}

/// The VM node's conditions, the test's pods, the guest's journal for its node services and the
/// cluster's last log lines.
async fn failure_details(cluster: &RealCluster, vm: &VmNode) -> String {
    let mut out = String::new();
    if let Ok(client) = cluster.cp.admin_client().await {
        match Api::<Node>::all(client.clone()).get(VM_NODE).await {
            Ok(n) => {
                let conditions: Vec<String> = n
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .map(|c| {
                        format!(
                            "{}={} ({})",
                            c.type_,
                            c.status,
                            c.message.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                out.push_str(&format!("node {VM_NODE}: {}\n", conditions.join("; ")));
            }
            Err(e) => out.push_str(&format!("(node {VM_NODE}: {e})\n")),
        }
        for ns in [NAMESPACE, shipper::NAMESPACE, SHIPPER_NS] {
            out.push_str(&format!("pods in {ns}:\n{}\n", describe_pods(&client, ns).await));
        }
    }
    match vm
        .sh("journalctl -b --no-pager -n 60 -u containerd -u kubelet -u kube-proxy")
        .await
    {
        Ok(o) => out.push_str(&format!("guest journal:\n{}\n", o.stdout)),
        Err(e) => out.push_str(&format!("(guest journal: {e:#})\n")),
    }
    out.push_str("last log lines:\n");
    out.push_str(&cluster.cp.log_tails(40));
    out
}
