//! Right-sizing admission with a large cache: 5,000 nodes × 20 autoscalers by default.
//!
//! Run with `cargo run --release -p nodewarden-webhook --features loadgen --example rightsizing-bench`.
//!
//! 1. Memory: growth of the resident set size while the right-sizing index is filled with one
//!    `NodeRecommendation` per node, each with one entry per autoscaler, and, for comparison,
//!    of the same objects kept whole (as a kube-runtime reflector store would keep them).
//!    Then the Nodes' labels (13 per node, as a managed cloud's nodes carry) the webhook keeps
//!    for node groups.
//! 2. Node groups: the status controller's pass over the index for each autoscaler grouped by
//!    instance type (what the leader computes every interval), its time and the status's size.
//! 3. The handler alone, on one thread: DaemonSet pod reviews (a different node and autoscaler
//!    each time) through the admission pipeline (decode, decide, patch, encode), with the
//!    autoscalers as they are (`scope: Node`) and grouped (`scope: NodeGroup`), alternating in one
//!    run.
//! 4. Over TLS: the real router and server on one current-thread runtime (one core); a client
//!    on another thread sends the same reviews over keep-alive HTTP/2, closed loop; the server
//!    thread's CPU time gives reviews per second of one fully used core.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use nodewarden_api::rightsizing::{
    AutoscalerRef, ContainerRecommendation, DaemonSetAutoscaler, NodeRecommendation, NodeRecommendationSpec,
};
use nodewarden_webhook::admission::{self, Processed, Route};
use nodewarden_webhook::loadgen::{
    Alpn, BenchCerts, Load, SERVER_NAME, Server, any_answer, connect, resident_bytes,
};
use nodewarden_webhook::rightsizing::controller::desired_from_index;
use nodewarden_webhook::rightsizing::{PodMutator, RightsizingCache};
use serde_json::{Value, json};

/// Resident set size of this process, in bytes.
fn rss() -> i64 {
    resident_bytes(None) as i64
}

const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");

#[derive(Parser, Debug, Clone)]
#[command(about = "Right-sizing admission throughput, latency and cache memory")]
struct Args {
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    #[arg(long, default_value_t = 20)]
    autoscalers: usize,
    /// Containers per autoscaled DaemonSet (each has a recommendation).
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// Length of each measured phase.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Requests in flight over TLS.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    h2_connections: usize,
    /// Only this many reviews through the pipeline (decode, decide, patch, encode) one after
    /// another, then exit: for instruction counts under callgrind (docs/benchmarks.md).
    #[arg(long)]
    profile_reviews: Option<usize>,
    /// With `--profile-reviews`: through the route as the router calls it (its future awaited on
    /// a one-thread runtime) instead of the synchronous `admission::process`.
    #[arg(long)]
    profile_route: bool,
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

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

fn container_name(c: usize) -> String {
    if c == 0 {
        "agent".to_string()
    } else {
        format!("sidecar-{c}")
    }
}

fn autoscaler(k: usize) -> DaemonSetAutoscaler {
    serde_json::from_value(json!({
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": "DaemonSetAutoscaler",
        "metadata": {"name": ds_name(k), "namespace": namespace(k)},
        "spec": {
            "targetRef": {"kind": "DaemonSet", "name": ds_name(k)},
            "coldStart": "Fleet",
            "resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"cpu": "2", "memory": "2Gi"}}]},
        },
        "status": {"fleet": [{"containerName": "agent", "target": {"cpu": "400m", "memory": "300Mi"}}]},
    }))
    .expect("autoscaler")
}

/// Instance types the nodes are spread over.
const INSTANCE_TYPES: [&str; 8] = [
    "m5.large",
    "m5.xlarge",
    "m5.2xlarge",
    "c5.xlarge",
    "c5.2xlarge",
    "r5.xlarge",
    "r5.2xlarge",
    "m6i.4xlarge",
];

/// Autoscaler `k` grouped by instance type (`scope: NodeGroup`), with the status the leader
/// computed from `index`.
fn grouped(k: usize, index: &RightsizingCache) -> DaemonSetAutoscaler {
    let mut a = autoscaler(k);
    a.spec.scope = nodewarden_api::rightsizing::Scope::NodeGroup;
    a.spec.node_group_label = Some("node.kubernetes.io/instance-type".to_string());
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    a.status = Some(desired_from_index(index, &a, true, &now));
    a
}

/// The labels of node `i`, as a managed cloud's node carries them.
fn node_labels(i: usize) -> Vec<(String, String)> {
    let zone = ["eu-west-1a", "eu-west-1b", "eu-west-1c"][i % 3];
    let kind = INSTANCE_TYPES[i % INSTANCE_TYPES.len()];
    [
        ("kubernetes.io/hostname", node_name(i)),
        ("kubernetes.io/os", "linux".to_string()),
        ("kubernetes.io/arch", "amd64".to_string()),
        ("beta.kubernetes.io/os", "linux".to_string()),
        ("beta.kubernetes.io/arch", "amd64".to_string()),
        ("node.kubernetes.io/instance-type", kind.to_string()),
        ("beta.kubernetes.io/instance-type", kind.to_string()),
        ("topology.kubernetes.io/zone", zone.to_string()),
        ("failure-domain.beta.kubernetes.io/zone", zone.to_string()),
        ("topology.kubernetes.io/region", "eu-west-1".to_string()),
        ("eks.amazonaws.com/nodegroup", format!("pool-{}", i % 10)),
        (
            "eks.amazonaws.com/capacityType",
            ["ON_DEMAND", "SPOT"][i % 2].to_string(),
        ),
        (
            "eks.amazonaws.com/nodegroup-image",
            "ami-0123456789abcdef0".to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn recommendation(i: usize, args: &Args) -> NodeRecommendation {
    let mut recs = Vec::new();
    for k in 0..args.autoscalers {
        for c in 0..args.containers {
            let cpu = 50 + (i * 7 + k * 13 + c) % 900;
            let mem = 64 + (i * 11 + k * 5 + c) % 900;
            let q = |s: String| Quantity(s);
            let list = |f: f64| {
                BTreeMap::from([
                    ("cpu".to_string(), q(format!("{}m", (cpu as f64 * f) as u64))),
                    ("memory".to_string(), q(format!("{}Mi", (mem as f64 * f) as u64))),
                ])
            };
            recs.push(ContainerRecommendation {
                autoscaler: AutoscalerRef {
                    namespace: namespace(k),
                    name: ds_name(k),
                },
                container_name: container_name(c),
                target: Some(list(1.0)),
                lower_bound: Some(list(0.8)),
                upper_bound: Some(list(1.5)),
                uncapped_target: Some(list(1.0)),
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

/// The recorded DaemonSet pod review, moved to autoscaler `k`'s DaemonSet and to node `i`.
fn review(i: usize, k: usize, args: &Args) -> Bytes {
    let mut r: Value = serde_json::from_str(POD_REVIEW).expect("fixture");
    r["request"]["uid"] = json!(format!("uid-{i}-{k}"));
    r["request"]["namespace"] = json!(namespace(k));
    let pod = &mut r["request"]["object"];
    pod["metadata"]["namespace"] = json!(namespace(k));
    pod["metadata"]["ownerReferences"][0]["name"] = json!(ds_name(k));
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchFields"][0]["values"] = json!([node_name(i)]);
    let first = pod["spec"]["containers"][0].clone();
    for c in 1..args.containers {
        let mut more = first.clone();
        more["name"] = json!(container_name(c));
        if let Some(list) = pod["spec"]["containers"].as_array_mut() {
            list.push(more);
        }
    }
    Bytes::from(serde_json::to_vec(&r).expect("json"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();

    // 1. memory
    let before = rss();
    let recs: Vec<NodeRecommendation> = (0..args.nodes).map(|i| recommendation(i, &args)).collect();
    let whole = rss() - before;
    let before = rss();
    let index = RightsizingCache::new();
    for k in 0..args.autoscalers {
        index.apply_autoscaler(autoscaler(k));
    }
    for rec in &recs {
        index.apply_node_recommendation(rec);
    }
    let indexed = rss() - before;
    // the labels are measured while the objects still hold their memory, so that what the
    // labels take is new memory, not the objects' freed memory reused
    let labels: Vec<Vec<(String, String)>> = (0..args.nodes).map(node_labels).collect();
    let before = rss();
    for (i, l) in labels.iter().enumerate() {
        index.apply_node_labels(&node_name(i), l.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
    let labelled = rss() - before;
    drop(labels);
    drop(recs);
    println!(
        "cache: {} nodes × {} autoscalers × {} containers = {} container recommendations",
        args.nodes,
        args.autoscalers,
        args.containers,
        args.nodes * args.autoscalers * args.containers
    );
    println!("| what | resident memory |");
    println!("|---|---:|");
    println!(
        "| right-sizing index (what the webhook keeps) | {:.1} MiB |",
        mib(indexed)
    );
    println!(
        "| the same NodeRecommendation objects kept whole | {:.1} MiB |",
        mib(whole)
    );

    println!(
        "| the Nodes' labels (13 per node, interned) | {:.1} MiB |",
        mib(labelled)
    );

    // 2. node groups: the leader's pass per autoscaler
    let started = Instant::now();
    let grouped: Vec<DaemonSetAutoscaler> = (0..args.autoscalers).map(|k| grouped(k, &index)).collect();
    let pass = started.elapsed();
    let status = grouped[0].status.as_ref().expect("status");
    println!(
        "\nnode groups: {} autoscalers grouped by instance type ({} groups of about {} nodes): \
         the status pass over the index took {:.1} ms in all, {:.2} ms per autoscaler; \
         one status is {} bytes of JSON",
        args.autoscalers,
        status.groups.len(),
        args.nodes / INSTANCE_TYPES.len(),
        pass.as_secs_f64() * 1e3,
        pass.as_secs_f64() * 1e3 / args.autoscalers as f64,
        serde_json::to_vec(status).expect("json").len()
    );
    assert_eq!(status.groups.len(), INSTANCE_TYPES.len().min(args.nodes));

    let bodies: Vec<Bytes> = (0..args.nodes.min(5000))
        .map(|i| review(i, i % args.autoscalers, &args))
        .collect();
    let handler = PodMutator::new(index.clone());

    // sanity: every review is patched
    for body in bodies.iter().take(50) {
        match admission::process(body, &handler) {
            Processed::Review(out, _, _) => assert!(out.response.patch.is_some(), "review not patched"),
            Processed::BadRequest(m) => panic!("bad request: {m}"),
        }
    }

    if let (Some(n), true) = (args.profile_reviews, args.profile_route) {
        let route = Route::new("/mutate/pods", handler);
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let started = Instant::now();
        let bytes = runtime.block_on(async {
            let mut bytes = 0;
            for i in 0..n {
                let body: &[u8] = &bodies[i % bodies.len()];
                if let Processed::Review(out, _, _) = route.handler.process_async(body).await {
                    bytes += out.to_json().map_or(0, |v| v.len());
                }
            }
            bytes
        });
        println!(
            "{n} reviews through the route in {:.1} ms ({:.2} µs each; {bytes} bytes of answers)",
            started.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e6 / n as f64
        );
        return Ok(());
    }

    if let Some(n) = args.profile_reviews {
        let started = Instant::now();
        let mut bytes = 0;
        for i in 0..n {
            if let Processed::Review(out, _, _) = admission::process(&bodies[i % bodies.len()], &handler) {
                bytes += out.to_json().map_or(0, |v| v.len());
            }
        }
        println!(
            "{n} reviews in {:.1} ms ({:.2} µs each; {bytes} bytes of answers)",
            started.elapsed().as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e6 / n as f64
        );
        return Ok(());
    }

    // 3. the handler alone, the autoscalers as they are and grouped, alternating
    let plain: Vec<DaemonSetAutoscaler> = (0..args.autoscalers).map(autoscaler).collect();
    println!(
        "\nreview body: {} bytes (the recorded DaemonSet pod review with {} containers)",
        bodies[0].len(),
        args.containers
    );
    println!(
        "\n| path | reviews/s | server CPU | reviews per server core-second | p50 ms | p99 ms | max ms | fail |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for round in 0..4 {
        let (what, set) = if round % 2 == 0 {
            ("scope Node", &plain)
        } else {
            ("scope NodeGroup", &grouped)
        };
        for a in set {
            index.apply_autoscaler(a.clone());
        }
        if round % 2 == 1 {
            // the group's figure is what the pod gets
            match admission::process(&bodies[0], &handler) {
                Processed::Review(out, _, _) => {
                    let patch = out.response.decoded_patch().expect("patched");
                    let text = serde_json::to_string(&patch).expect("json");
                    assert!(text.contains("agent=group"), "not the group's figure: {text}");
                }
                Processed::BadRequest(m) => panic!("bad request: {m}"),
            }
        }
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
        let started = Instant::now();
        let mut n = 0usize;
        while started.elapsed() < args.duration / 2 {
            let body = &bodies[n % bodies.len()];
            let t = Instant::now();
            let out = match admission::process(body, &handler) {
                Processed::Review(out, _, _) => out.to_json().expect("encode"),
                Processed::BadRequest(m) => panic!("bad request: {m}"),
            };
            std::hint::black_box(out);
            let _ = hist.record(t.elapsed().as_nanos() as u64);
            n += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        println!(
            "| handler alone, 1 thread, {what} | {rate:.0} | 100 % | {rate:.0} | {:.3} | {:.3} | {:.3} | 0 |",
            hist.value_at_quantile(0.5) as f64 / 1e6,
            hist.value_at_quantile(0.99) as f64 / 1e6,
            hist.max() as f64 / 1e6
        );
    }
    for a in &plain {
        index.apply_autoscaler(a.clone());
    }

    // 3. over TLS
    let certs = BenchCerts::generate()?;
    let server = Server::start(
        &certs.cert_pem,
        &certs.key_pem,
        vec![Route::new("/mutate/pods", handler)],
    )?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    client.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..args.h2_connections {
            conns.push(connect(server.addr, &certs.ca_pem, SERVER_NAME, Alpn::H2).await?);
        }
        let load = Load {
            conns,
            path: "/mutate/pods",
            bodies: Arc::from(bodies),
            accept: any_answer,
            cpu: server.cpu.clone(),
        };
        let _ = load.closed_loop(Duration::from_millis(500), args.concurrency).await;
        let p = load.closed_loop(args.duration, args.concurrency).await;
        println!(
            "| TLS HTTP/2, {} connections, {} in flight | {:.0} | {:.0} % | {:.0} | {:.3} | {:.3} | {:.3} | {} |",
            args.h2_connections,
            args.concurrency,
            p.rate(),
            p.cpu_share() * 100.0,
            p.per_core(),
            p.ms(0.5),
            p.ms(0.99),
            p.max_ms(),
            p.failures
        );
        anyhow::Ok(())
    })?;
    server.shutdown();
    Ok(())
}
