//! Right-sizing admission side by side with the VPA admission-controller, on the same pod
//! reviews, in the same run.
//!
//! Run with `cargo run --release -p nodewarden-tests --features loadgen --example rightsizing-vpa-bench`.
//!
//! * VPA: the admission-controller built from its Go module by `tests/vpa/build.sh`, against a
//!   control plane of its own (the harness), with one VerticalPodAutoscaler per DaemonSet (20
//!   by default) carrying a recommendation in its status, `GOMAXPROCS=1` (one core).
//! * nodewarden: the `/mutate/pods` handler with 5,000 nodes × 20 autoscalers in its index,
//!   served by the real TLS server on one current-thread runtime (one core).
//! * The same 5,000 DaemonSet pod CREATE reviews (the recorded review, moved to each node and
//!   DaemonSet) go to both over keep-alive TLS (HTTP/2 when the server offers it), first closed
//!   loop (maximum), then open loop at the same rate for both (half the VPA's maximum) for
//!   latency. Server CPU: the server thread's (nodewarden) or the process's (VPA) CPU time.

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
use nodewarden_tests::process::{free_port, write_file};
use nodewarden_tests::{ControlPlane, apply_crds, create_namespace};
use nodewarden_webhook::admission::Route;
use nodewarden_webhook::loadgen::{
    Alpn, CpuClock, Load, Phase, Server, connect, patched, process_cpu_ns, resident_bytes,
};
use nodewarden_webhook::rightsizing::{PodMutator, RightsizingIndex};
use serde_json::{Value, json};

const POD_REVIEW: &str = include_str!("../fixtures/admission/daemonset-pod-create.json");
const NODES: usize = 5000;
const AUTOSCALERS: usize = 20;
const CONCURRENCY: usize = 64;
const CONNECTIONS: usize = 2;
const PHASE: Duration = Duration::from_secs(5);
/// Both servers' certificates are for the loopback address.
const LOOPBACK: &str = "127.0.0.1";

fn node_name(i: usize) -> String {
    format!(
        "ip-10-{}-{}-{}.eu-west-1.compute.internal",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}
fn namespace(k: usize) -> String {
    format!("team-{k}")
}
fn ds_name(k: usize) -> String {
    format!("agent-{k}")
}

/// The recorded review for node `i` and DaemonSet `k`, two containers, labelled for the
/// DaemonSet's selector (the VPA matches pods by it).
fn review(i: usize, k: usize) -> Bytes {
    let mut r: Value = serde_json::from_str(POD_REVIEW).expect("fixture");
    r["request"]["uid"] = json!(format!("uid-{i}-{k}"));
    r["request"]["namespace"] = json!(namespace(k));
    let pod = &mut r["request"]["object"];
    pod["metadata"]["namespace"] = json!(namespace(k));
    pod["metadata"]["labels"]["app"] = json!(ds_name(k));
    pod["metadata"]["ownerReferences"][0]["name"] = json!(ds_name(k));
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchFields"][0]["values"] = json!([node_name(i)]);
    let mut sidecar = pod["spec"]["containers"][0].clone();
    sidecar["name"] = json!("sidecar");
    if let Some(list) = pod["spec"]["containers"].as_array_mut() {
        list.push(sidecar);
    }
    Bytes::from(serde_json::to_vec(&r).expect("json"))
}

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

fn nodewarden_index() -> Arc<RightsizingIndex> {
    let index = RightsizingIndex::new();
    for k in 0..AUTOSCALERS {
        let a: DaemonSetAutoscaler = serde_json::from_value(json!({
            "apiVersion": "nodewarden.io/v1alpha1",
            "kind": "DaemonSetAutoscaler",
            "metadata": {"name": ds_name(k), "namespace": namespace(k)},
            "spec": {"targetRef": {"kind": "DaemonSet", "name": ds_name(k)},
                     "resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"cpu": "2", "memory": "2Gi"}}]}},
        }))
        .expect("autoscaler");
        index.apply_autoscaler(a);
    }
    for i in 0..NODES {
        let mut recs = Vec::new();
        for k in 0..AUTOSCALERS {
            for c in ["agent", "sidecar"] {
                let cpu = 50 + (i * 7 + k * 13) % 900;
                let mem = 64 + (i * 11 + k * 5) % 900;
                recs.push(ContainerRecommendation {
                    autoscaler: AutoscalerRef {
                        namespace: namespace(k),
                        name: ds_name(k),
                    },
                    container_name: c.to_string(),
                    target: Some(BTreeMap::from([
                        ("cpu".to_string(), Quantity(format!("{cpu}m"))),
                        ("memory".to_string(), Quantity(format!("{mem}Mi"))),
                    ])),
                    lower_bound: None,
                    upper_bound: None,
                    uncapped_target: None,
                    sample_count: 8640,
                    first_sample_time: None,
                    last_sample_time: None,
                    oom_count: 0,
                });
            }
        }
        index.apply_node_recommendation(&NodeRecommendation::new(
            &node_name(i),
            NodeRecommendationSpec {
                update_time: None,
                pods: Vec::new(),
                summary: None,
                recommendations: recs,
            },
        ));
    }
    index
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

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<()> {
    let bin = vpa_build()?;
    let cp = ControlPlane::start().await?;
    let client = cp.admin_client().await?;
    vpa_objects(&cp, &client, &bin.join("vpa-v1-crd-gen.yaml")).await?;

    let dir = tempfile::tempdir()?;
    let cert = cp.issue_loopback_serving_cert()?;
    write_file(&dir.path().join("tls.crt"), cert.cert_pem.as_bytes(), false)?;
    write_file(&dir.path().join("tls.key"), cert.key_pem.as_bytes(), true)?;
    write_file(&dir.path().join("ca.crt"), cp.ca_pem().as_bytes(), false)?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("vpa.log"))?;
    let mut vpa = tokio::process::Command::new(bin.join("vpa-admission-controller"))
        .env("GOMAXPROCS", "1")
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

    let nodewarden = Server::start(
        &cert.cert_pem,
        &cert.key_pem,
        vec![Route::new("/mutate/pods", PodMutator::new(nodewarden_index()))],
    )?;
    let bodies: Arc<[Bytes]> = (0..NODES).map(|i| review(i, i % AUTOSCALERS)).collect();

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

    let mut targets = Vec::new();
    for (name, addr, path, cpu) in [
        (
            "nodewarden",
            nodewarden.addr,
            "/mutate/pods",
            nodewarden.cpu.clone(),
        ),
        (
            "VPA admission-controller",
            vpa_addr,
            "/",
            Arc::new(move || process_cpu_ns(vpa_pid)) as CpuClock,
        ),
    ] {
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
        "| server / phase | reviews/s | server CPU | reviews per server core-second | p50 ms | p99 ms | fail |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut max = Vec::new();
    for (name, load) in &targets {
        let _ = load.closed_loop(PHASE, CONCURRENCY).await; // warm-up
        let p = load.closed_loop(PHASE, CONCURRENCY).await;
        row(&format!("{name}, max"), &p);
        max.push(p.rate());
    }
    let rate = max[1] / 2.0;
    for (name, load) in &targets {
        let p = load.open_loop(PHASE, rate).await;
        row(&format!("{name}, open loop at {rate:.0}/s"), &p);
    }
    println!(
        "\nVPA admission-controller resident memory: {:.1} MiB",
        resident_bytes(Some(vpa_pid)) as f64 / (1024.0 * 1024.0)
    );
    nodewarden.shutdown();
    let _ = vpa.kill().await;
    Ok(())
}
