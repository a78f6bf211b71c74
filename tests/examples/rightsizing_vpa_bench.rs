//! Right-sizing admission side by side with the VPA admission-controller, on the same pod
//! reviews, in the same run.
//!
//! Run with `cargo run --release -p nodewarden-tests --example rightsizing-vpa-bench`.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
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
use nodewarden_webhook::admission::rightsizing::{PodMutator, RightsizingIndex};
use nodewarden_webhook::admission::{self, Route};
use nodewarden_webhook::metrics::Metrics;
use nodewarden_webhook::server::serve_tls;
use nodewarden_webhook::tls::{CertResolver, certified_key, server_config};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const POD_REVIEW: &str = include_str!("../fixtures/admission/daemonset-pod-create.json");
const NODES: usize = 5000;
const AUTOSCALERS: usize = 20;
const CONCURRENCY: usize = 64;
const CONNECTIONS: usize = 2;
const PHASE: Duration = Duration::from_secs(5);

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
                recommendations: recs,
            },
        ));
    }
    index
}

/// The nodewarden server on one current-thread runtime; returns its address, a reader of the
/// thread's CPU time, and the stop token.
fn start_nodewarden(cert_pem: &str, key_pem: &str) -> Result<(SocketAddr, CpuClock, CancellationToken)> {
    let resolver = Arc::new(CertResolver::default());
    resolver.set(certified_key(
        cert_pem.as_bytes(),
        key_pem.as_bytes(),
        Path::new("c"),
        Path::new("k"),
    )?);
    let tls = server_config(resolver)?;
    let handler = PodMutator::new(nodewarden_index());
    let stop = CancellationToken::new();
    let stop_server = stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let task = std::fs::read_link("/proc/thread-self").expect("procfs");
            tx.send((listener.local_addr().expect("addr"), task))
                .expect("send");
            let app = admission::router(
                vec![Route::new("/mutate/pods", handler)],
                Arc::new(Metrics::new()),
                6 << 20,
            );
            serve_tls(listener, tls, app, stop_server, Duration::from_secs(2)).await;
        });
    });
    let (addr, task) = rx.recv()?;
    let schedstat = Path::new("/proc").join(task).join("schedstat");
    let cpu = Box::new(move || {
        std::fs::read_to_string(&schedstat)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    });
    Ok((addr, cpu, stop))
}

/// CPU time of a whole process, in nanoseconds (utime + stime of `/proc/<pid>/stat`, at 100 Hz).
fn process_cpu_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 10_000_000
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[derive(Clone)]
enum Conn {
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
}

async fn connect(addr: SocketAddr, ca_pem: &str) -> Result<Conn> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp)
        .await?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        Ok(Conn::H2(sender))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        Ok(Conn::H1(Arc::new(tokio::sync::Mutex::new(sender))))
    }
}

/// Sends one review; the decoded response, or `None` on failure.
async fn send(conn: &Conn, path: &str, body: Bytes) -> Option<Value> {
    let req = http::Request::post(format!("https://127.0.0.1{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .ok()?;
    let resp = match conn {
        Conn::H2(s) => s.clone().send_request(req).await,
        Conn::H1(s) => {
            let mut s = s.lock().await;
            s.ready().await.ok()?;
            s.send_request(req).await
        }
    }
    .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&bytes).ok()
}

struct Phase {
    reviews: u64,
    failures: u64,
    wall: Duration,
    cpu: Duration,
    latency: hdrhistogram::Histogram<u64>,
}

/// CPU time consumed so far by one side of the comparison, in nanoseconds.
type CpuClock = Box<dyn Fn() -> u64 + Send>;

struct Target {
    name: &'static str,
    conns: Vec<Conn>,
    path: &'static str,
    cpu_ns: CpuClock,
}

/// `rate = None`: closed loop with `CONCURRENCY` in flight; else open loop at `rate` per second.
async fn phase(t: &Target, bodies: &Arc<Vec<Bytes>>, rate: Option<f64>) -> Phase {
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let cpu0 = (t.cpu_ns)();
    let started = Instant::now();
    let deadline = started + PHASE;
    let mut tasks = tokio::task::JoinSet::new();
    match rate {
        None => {
            for w in 0..CONCURRENCY {
                let conn = t.conns[w % t.conns.len()].clone();
                let (bodies, next, failed, tx, path) =
                    (bodies.clone(), next.clone(), failed.clone(), tx.clone(), t.path);
                tasks.spawn(async move {
                    while Instant::now() < deadline {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let s = Instant::now();
                        match send(&conn, path, bodies[i % bodies.len()].clone()).await {
                            Some(v) if v["response"]["patch"].is_string() => {
                                let _ = tx.send(s.elapsed().as_micros() as u64);
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        }
        Some(rate) => {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            let mut released = 0u64;
            while Instant::now() < deadline {
                tick.tick().await;
                let due = (started.elapsed().as_secs_f64() * rate) as u64;
                while released < due {
                    let conn = t.conns[released as usize % t.conns.len()].clone();
                    let body = bodies[released as usize % bodies.len()].clone();
                    let (failed, tx, path) = (failed.clone(), tx.clone(), t.path);
                    tasks.spawn(async move {
                        let s = Instant::now();
                        match send(&conn, path, body).await {
                            Some(v) if v["response"]["patch"].is_string() => {
                                let _ = tx.send(s.elapsed().as_micros() as u64);
                            }
                            _ => {
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                    released += 1;
                }
                while tasks.try_join_next().is_some() {}
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    drop(tx);
    let wall = started.elapsed();
    let mut latency = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    let mut reviews = 0;
    while let Some(us) = rx.recv().await {
        let _ = latency.record(us);
        reviews += 1;
    }
    Phase {
        reviews,
        failures: failed.load(Ordering::Relaxed),
        wall,
        cpu: Duration::from_nanos((t.cpu_ns)().saturating_sub(cpu0)),
        latency,
    }
}

fn row(label: &str, p: &Phase) {
    let rate = p.reviews as f64 / p.wall.as_secs_f64();
    let per_core = p.reviews as f64 / p.cpu.as_secs_f64().max(1e-9);
    println!(
        "| {label} | {rate:.0} | {:.0} % | {per_core:.0} | {:.2} | {:.2} | {} |",
        100.0 * p.cpu.as_secs_f64() / p.wall.as_secs_f64(),
        p.latency.value_at_quantile(0.5) as f64 / 1000.0,
        p.latency.value_at_quantile(0.99) as f64 / 1000.0,
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

    let (nw_addr, nw_cpu, nw_stop) = start_nodewarden(&cert.cert_pem, &cert.key_pem)?;
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..NODES).map(|i| review(i, i % AUTOSCALERS)).collect());

    // wait until the VPA answers with a patch (its informers have synced)
    let vpa_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        if let Ok(conn) = connect(vpa_addr, cp.ca_pem()).await
            && let Some(v) = send(&conn, "/", bodies[0].clone()).await
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
        ("nodewarden", nw_addr, "/mutate/pods", nw_cpu),
        (
            "VPA admission-controller",
            vpa_addr,
            "/",
            Box::new(move || process_cpu_ns(vpa_pid)) as CpuClock,
        ),
    ] {
        let mut conns = Vec::new();
        for _ in 0..CONNECTIONS {
            conns.push(connect(addr, cp.ca_pem()).await?);
        }
        let h2 = matches!(conns[0], Conn::H2(_));
        println!("{name}: {}", if h2 { "HTTP/2" } else { "HTTP/1.1" });
        targets.push(Target {
            name,
            conns,
            path,
            cpu_ns: cpu,
        });
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
    for t in &targets {
        let _ = phase(t, &bodies, None).await; // warm-up
        let p = phase(t, &bodies, None).await;
        row(&format!("{}, max", t.name), &p);
        max.push(p.reviews as f64 / p.wall.as_secs_f64());
    }
    let rate = max[1] / 2.0;
    for t in &targets {
        let p = phase(t, &bodies, Some(rate)).await;
        row(&format!("{}, open loop at {rate:.0}/s", t.name), &p);
    }
    println!(
        "\nVPA admission-controller resident memory: {:.1} MiB",
        rss_mib(vpa_pid)
    );
    nw_stop.cancel();
    let _ = vpa.kill().await;
    Ok(())
}
