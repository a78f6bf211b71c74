//! Right-sizing admission side by side with the VPA admission-controller, on the same pod
//! reviews, in the same run.
//!
//! Run with `cargo run --release -p nodewarden-tests --features loadgen --example rightsizing-vpa-bench`.
//!
//! * VPA: the admission-controller built from its Go module by `tests/vpa/build.sh`, against a
//!   control plane of its own (the harness), with one VerticalPodAutoscaler per DaemonSet (20
//!   by default) carrying a recommendation in its status, `GOMAXPROCS=1` (one core).
//! * nodewarden as deployed: the binary of its image (`nodewarden-webhook`, built first by the
//!   image build: static, release profile, stripped), with the
//!   chart's defaults (multi-thread runtime, every route and middleware, JSON logs at info
//!   written to a file as a container runtime would), against the same
//!   control plane, its index filled by its own watches from 20 DaemonSetAutoscalers and 5,000
//!   NodeRecommendations of 40 recommendations each.
//! * Both servers start pinned to the same one core (`taskset -c 1`), so each sizes its runtime
//!   to one core (one Tokio worker; `GOMAXPROCS=1`), the load generator (this process) is pinned
//!   to the other; server CPU is the whole process's on both sides (user + system of
//!   `/proc/<pid>/stat`: every thread, the Go runtime's GC and informers, nodewarden's watches
//!   and logging).
//! * The same 5,000 DaemonSet pod CREATE reviews (the recorded review, moved to each node and
//!   DaemonSet) go to both over keep-alive TLS (HTTP/2 when the server offers it), first closed
//!   loop (maximum), then open loop at the same rate for both (half the VPA's maximum) for
//!   latency, measured from when each request was due (no coordinated omission).
//! * Beside them, the floor (`common/floor.rs`): a TLS + HTTP/2 server on the same libraries,
//!   pinned to the same core, that reads each review and gives every one the answer nodewarden
//!   gave the first review, so what nodewarden's own work costs is the difference.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
};
use nodewarden_tests::process::free_port;
use nodewarden_tests::{ControlPlane, apply_crds, create_namespace};
use nodewarden_webhook::loadgen::{
    Alpn, CpuClock, Load, Phase, connect, patched, process_cpu_ns, resident_bytes,
};
use serde_json::{Value, json};

#[path = "common/bench.rs"]
mod bench;
#[path = "common/floor.rs"]
mod floor;
use bench::{
    ReadyWhen, ds_name, namespace, node_name, review, start_webhook, webhook_build, write_serving_cert,
};

const NODES: usize = 5000;
const AUTOSCALERS: usize = 20;
const CONCURRENCY: usize = 64;
const CONNECTIONS: usize = 2;
const PHASE: Duration = Duration::from_secs(5);
/// Both servers' certificates are for the loopback address.
const LOOPBACK: &str = "127.0.0.1";

fn vpa_build() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vpa/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running tests/vpa/build.sh")?;
    if !out.status.success() {
        bail!("tests/vpa/build.sh failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let dir = text
        .lines()
        .last()
        .ok_or_else(|| anyhow!("build.sh printed nothing"))?;
    Ok(PathBuf::from(dir.trim()))
}

async fn vpa_objects(cp: &ControlPlane, client: &Client, crd_file: &Path) -> Result<()> {
    let text = std::fs::read_to_string(crd_file)?;
    let mut crds = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        crds.push(serde_yaml_ng::from_value::<CustomResourceDefinition>(value)?);
    }
    apply_crds(cp, client, &crds).await?;
    let vpa = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("autoscaling.k8s.io", "v1", "VerticalPodAutoscaler"),
        "verticalpodautoscalers",
    );
    for k in 0..AUTOSCALERS {
        let ns = namespace(k);
        create_namespace(cp, client, &ns).await?;
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": ds_name(k)},
            "spec": {
                "selector": {"matchLabels": {"app": ds_name(k)}},
                "template": {
                    "metadata": {"labels": {"app": ds_name(k)}},
                    "spec": {
                        "nodeSelector": {"bench.nodewarden.io/none": "true"},
                        "containers": [
                            {"name": "agent", "image": "nodewarden-e2e/pause:never-pulled"},
                            {"name": "sidecar", "image": "nodewarden-e2e/pause:never-pulled"}
                        ]
                    }
                }
            }
        }))?;
        Api::<DaemonSet>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &ds)
            .await?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &vpa);
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "autoscaling.k8s.io/v1",
            "kind": "VerticalPodAutoscaler",
            "metadata": {"name": ds_name(k), "namespace": ns},
            "spec": {
                "targetRef": {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name(k)},
                "updatePolicy": {"updateMode": "Initial"},
                "resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"cpu": "2", "memory": "2Gi"}}]}
            }
        }))?;
        api.create(&PostParams::default(), &object).await?;
        let rec = |c: &str| {
            json!({"containerName": c, "target": {"cpu": "400m", "memory": "300Mi"},
                   "lowerBound": {"cpu": "300m", "memory": "250Mi"}, "upperBound": {"cpu": "600m", "memory": "400Mi"},
                   "uncappedTarget": {"cpu": "400m", "memory": "300Mi"}})
        };
        api.patch_status(
            &ds_name(k),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"recommendation": {"containerRecommendations": [rec("agent"), rec("sidecar")]}}})),
        )
        .await?;
    }
    Ok(())
}

fn autoscaler(k: usize) -> Result<DaemonSetAutoscaler> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": ds_name(k), "namespace": namespace(k)},
        "spec": {"targetRef": {"kind": "DaemonSet", "name": ds_name(k)},
                 "resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"cpu": "2", "memory": "2Gi"}}]}},
    }))?)
}

/// Node `i`'s CPU target for DaemonSet `k`, in millicores (every node differs).
fn cpu_millis(i: usize, k: usize) -> usize {
    50 + (i * 7 + k * 13) % 900
}

fn node_recommendation(i: usize) -> NodeRecommendation {
    let mut recs = Vec::new();
    for k in 0..AUTOSCALERS {
        for c in ["agent", "sidecar"] {
            let mem = 64 + (i * 11 + k * 5) % 900;
            recs.push(ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: namespace(k),
                    name: ds_name(k),
                },
                container_name: c.to_string(),
                target: Some(BTreeMap::from([
                    ("cpu".to_string(), Quantity(format!("{}m", cpu_millis(i, k)))),
                    ("memory".to_string(), Quantity(format!("{mem}Mi"))),
                ])),
                lower_bound: None,
                upper_bound: None,
                uncapped_target: None,
                sample_count: 8640,
                first_sample_time: None,
                last_sample_time: None,
                oom_count: 0,
                capped: None,
            });
        }
    }
    NodeRecommendation::new(
        &node_name(i),
        NodeRecommendationSpec {
            update_time: None,
            pods: Vec::new(),
            summary: None,
            recommendations: recs,
        },
    )
}

/// nodewarden's CRDs, an autoscaler per DaemonSet and every node's recommendation, written
/// through the API server (16 at a time).
async fn nodewarden_objects(cp: &ControlPlane, client: &Client) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    apply_crds(cp, client, &nodewarden_api::crdgen::crds()).await?;
    for k in 0..AUTOSCALERS {
        Api::<DaemonSetAutoscaler>::namespaced(client.clone(), &namespace(k))
            .create(&PostParams::default(), &autoscaler(k)?)
            .await?;
    }
    let started = Instant::now();
    let api: Api<NodeRecommendation> = Api::all(client.clone());
    futures::stream::iter(0..NODES)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &node_recommendation(i)).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "{NODES} NodeRecommendations written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Whether the answer patches node `i`'s pod of DaemonSet `k` with that node's CPU figure.
fn patched_for(answer: &[u8], i: usize, k: usize) -> bool {
    use base64::Engine;
    let Ok(v) = serde_json::from_slice::<Value>(answer) else {
        return false;
    };
    let patch = v["response"]["patch"].as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(patch)
        .is_ok_and(|p| String::from_utf8_lossy(&p).contains(&format!("\"{}m\"", cpu_millis(i, k))))
}

/// Pins the process `pid` (every thread) to `cpu`; says so and goes on when it cannot.
fn pin(pid: u32, cpu: usize) {
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("could not pin process {pid} to CPU {cpu} (taskset); figures are unpinned");
    }
}

/// The read and write system calls process `pid` has made (`syscr`, `syscw` of `/proc/<pid>/io`).
fn io_calls(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("syscr:"), field("syscw:"))
}

fn row(label: &str, p: &Phase) {
    println!(
        "| {label} | {:.0} | {:.0} % | {:.0} | {:.2} | {:.2} | {} |",
        p.rate(),
        100.0 * p.cpu_share(),
        p.per_core(),
        p.ms(0.5),
        p.ms(0.99),
        p.failures
    );
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(floor::FLAG) {
        return floor::serve(&args[2..]);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(bench())
}

/// Starts the floor server on `port`, pinned to core 1, answering every review with `answer`;
/// returns once it answers with a patch.
async fn start_floor(
    dir: &Path,
    port: u16,
    answer: &[u8],
    ca_pem: &str,
    review: Bytes,
) -> Result<tokio::process::Child> {
    let answer_file = dir.join("floor-answer.json");
    std::fs::write(&answer_file, answer)?;
    let mut child = tokio::process::Command::new("taskset")
        .args(["-c", "1"])
        .arg(std::env::current_exe()?)
        .arg(floor::FLAG)
        .arg(dir.join("tls.crt"))
        .arg(dir.join("tls.key"))
        .arg(port.to_string())
        .arg(&answer_file)
        .kill_on_drop(true)
        .spawn()
        .context("starting the floor server")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(conn) = connect(addr, ca_pem, LOOPBACK, Alpn::Either).await
            && let Some(answer) = conn.send("/mutate/pods", review.clone()).await
            && patched(&answer)
        {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("the floor server exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("the floor server did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn bench() -> Result<()> {
    let bin = vpa_build()?;
    let webhook_bin = webhook_build()?;
    let cp = ControlPlane::start().await?;
    let client = cp.admin_client().await?;
    vpa_objects(&cp, &client, &bin.join("vpa-v1-crd-gen.yaml")).await?;
    nodewarden_objects(&cp, &client).await?;
    pin(std::process::id(), 0);

    let dir = tempfile::tempdir()?;
    write_serving_cert(&cp, dir.path())?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("vpa.log"))?;
    // both servers start on the one core they get (`taskset`), so each sizes its own runtime
    // to it, as in a cpuset of one core
    let mut vpa = tokio::process::Command::new("taskset")
        .env("GOMAXPROCS", "1")
        .args(["-c".to_string(), "1".to_string()])
        .arg(bin.join("vpa-admission-controller"))
        .args([
            format!("--kubeconfig={}", cp.kubeconfig_path().display()),
            format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
            format!("--tls-cert-file={}", dir.path().join("tls.crt").display()),
            format!("--tls-private-key={}", dir.path().join("tls.key").display()),
            format!("--port={port}"),
            format!("--address=127.0.0.1:{}", free_port()?),
            "--register-webhook=false".to_string(),
            "--v=1".to_string(),
        ])
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting vpa-admission-controller")?;
    let vpa_pid = vpa.id().ok_or_else(|| anyhow!("no pid"))?;

    // nodewarden with the chart's settings (its environment variables' values), logs to a file;
    // a second build beside it when `NODEWARDEN_WEBHOOK_BIN_B` names one (A/B in one run)
    let mut builds = vec![("nodewarden (image binary)".to_string(), webhook_bin)];
    if let Some(b) = std::env::var_os("NODEWARDEN_WEBHOOK_BIN_B") {
        builds.push(("nodewarden (B)".to_string(), PathBuf::from(b)));
    }
    let bodies: Arc<[Bytes]> = (0..NODES).map(|i| review(i, i % AUTOSCALERS)).collect();
    let mut webhooks = Vec::new();
    for (n, (name, path)) in builds.into_iter().enumerate() {
        // ready once it patches the last node's pod with that node's figure (its watches have
        // loaded every NodeRecommendation)
        let last = NODES - 1;
        // each build leads in a namespace of its own (its Lease there), as one deployed alone does
        let lease_namespace = format!("nodewarden-bench-{n}");
        create_namespace(&cp, &client, &lease_namespace).await?;
        let started = start_webhook(
            &cp,
            dir.path(),
            &path,
            (
                &format!("nodewarden-webhook-bench-{n}"),
                Some(1),
                Some(&lease_namespace),
            ),
            ReadyWhen {
                review: bodies[last].clone(),
                patched: |answer: &[u8]| patched_for(answer, last, last % AUTOSCALERS),
                within: Duration::from_secs(180),
            },
        )
        .await?;
        webhooks.push((name, started.child, started.pid, started.addr));
    }

    // wait until the VPA answers with a patch (its informers have synced)
    let vpa_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        if let Ok(conn) = connect(vpa_addr, cp.ca_pem(), LOOPBACK, Alpn::Either).await
            && let Some(answer) = conn.send("/", bodies[0].clone()).await
            && let Ok(v) = serde_json::from_slice::<Value>(&answer)
            && v["response"]["patch"].is_string()
        {
            break v;
        }
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(dir.path().join("vpa.log")).unwrap_or_default();
            bail!("the VPA admission-controller never patched a pod; its log:\n{text}");
        }
        if let Ok(Some(status)) = vpa.try_wait() {
            bail!("vpa-admission-controller exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let patch = first["response"]["patch"].as_str().unwrap_or_default();
    println!("VPA patch of the first review (base64): {} bytes", patch.len());

    // the floor gives every review the answer nodewarden gives the first one
    let ours = connect(webhooks[0].3, cp.ca_pem(), LOOPBACK, Alpn::Either)
        .await?
        .send("/mutate/pods", bodies[0].clone())
        .await
        .ok_or_else(|| anyhow!("nodewarden did not answer the first review"))?;
    println!("nodewarden's answer to the first review: {} bytes", ours.len());
    let floor_port = free_port()?;
    let mut floor_server = start_floor(dir.path(), floor_port, &ours, cp.ca_pem(), bodies[0].clone()).await?;
    let floor_pid = floor_server.id().ok_or_else(|| anyhow!("no pid"))?;

    let mut servers: Vec<(String, SocketAddr, &str, CpuClock)> = Vec::new();
    for (name, _, pid, addr) in &webhooks {
        let pid = *pid;
        servers.push((
            name.clone(),
            *addr,
            "/mutate/pods",
            Arc::new(move || process_cpu_ns(pid)) as CpuClock,
        ));
    }
    servers.push((
        "floor (TLS + HTTP/2, a fixed answer)".to_string(),
        format!("127.0.0.1:{floor_port}").parse()?,
        "/mutate/pods",
        Arc::new(move || process_cpu_ns(floor_pid)) as CpuClock,
    ));
    servers.push((
        "VPA admission-controller".to_string(),
        vpa_addr,
        "/",
        Arc::new(move || process_cpu_ns(vpa_pid)) as CpuClock,
    ));
    let mut targets = Vec::new();
    for (name, addr, path, cpu) in servers {
        let mut conns = Vec::new();
        for _ in 0..CONNECTIONS {
            conns.push(connect(addr, cp.ca_pem(), LOOPBACK, Alpn::Either).await?);
        }
        let h2 = conns[0].is_h2();
        println!("{name}: {}", if h2 { "HTTP/2" } else { "HTTP/1.1" });
        let load = Load {
            conns,
            path,
            bodies: bodies.clone(),
            accept: patched,
            cpu,
        };
        targets.push((name, load));
    }
    println!(
        "\nreviews: {} bytes each; {NODES} nodes × {AUTOSCALERS} DaemonSets; {CONCURRENCY} in flight over {CONNECTIONS} connections; phases of {PHASE:?}\n",
        bodies[0].len()
    );
    println!(
        "| server / phase | reviews/s | server CPU (whole process) | reviews per server core-second | p50 ms | p99 ms | fail |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let vpa_at = targets.len() - 1;
    let floor_at = targets.len() - 2;
    let mut pids: Vec<u32> = webhooks.iter().map(|w| w.2).collect();
    pids.push(floor_pid);
    pids.push(vpa_pid);
    let mut max = Vec::new();
    let mut syscalls = Vec::new();
    for ((name, load), pid) in targets.iter().zip(&pids) {
        let _ = load.closed_loop(PHASE, CONCURRENCY).await; // warm-up
        let before = io_calls(*pid);
        let p = load.closed_loop(PHASE, CONCURRENCY).await;
        let after = io_calls(*pid);
        row(&format!("{name}, max"), &p);
        let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / (p.reviews + p.failures).max(1) as f64;
        syscalls.push(format!(
            "{name}: {:.2} read and {:.2} write system calls per review at the maximum",
            per(before.0, after.0),
            per(before.1, after.1)
        ));
        max.push(p);
    }
    let rate = max[vpa_at].rate() / 2.0;
    let mut open = Vec::new();
    for (name, load) in &targets {
        let p = load.open_loop(PHASE, rate).await;
        row(&format!("{name}, open loop at {rate:.0}/s"), &p);
        open.push(p);
    }
    println!();
    for line in &syscalls {
        println!("{line}");
    }
    for (n, (name, _, pid, _)) in webhooks.iter().enumerate() {
        if max[vpa_at].per_core() > 0.0 && open[vpa_at].ms(0.99) > 0.0 {
            println!(
                "{name} answers {:.1}× the VPA's reviews per core-second; at {rate:.0}/s its p99 is {:.2}× the VPA's",
                max[n].per_core() / max[vpa_at].per_core(),
                open[n].ms(0.99) / open[vpa_at].ms(0.99)
            );
        }
        if max[floor_at].per_core() > 0.0 {
            println!(
                "{name} answers {:.2}× the floor's reviews per core-second ({:.1} µs of server CPU a review against the floor's {:.1} µs); at {rate:.0}/s its p99 is {:.2}× the floor's",
                max[n].per_core() / max[floor_at].per_core(),
                1e6 / max[n].per_core(),
                1e6 / max[floor_at].per_core(),
                open[n].ms(0.99) / open[floor_at].ms(0.99).max(f64::MIN_POSITIVE)
            );
        }
        println!(
            "resident memory: {name} {:.1} MiB",
            resident_bytes(Some(*pid)) as f64 / (1024.0 * 1024.0)
        );
    }
    println!(
        "resident memory: the floor {:.1} MiB",
        resident_bytes(Some(floor_pid)) as f64 / (1024.0 * 1024.0)
    );
    println!(
        "resident memory: VPA admission-controller {:.1} MiB",
        resident_bytes(Some(vpa_pid)) as f64 / (1024.0 * 1024.0)
    );
    for (_, mut webhook, _, _) in webhooks {
        let _ = webhook.kill().await;
    }
    let _ = floor_server.kill().await;
    let _ = vpa.kill().await;
    Ok(())
}
