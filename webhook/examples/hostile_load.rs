//! Hostile load on the real TLS server: every route gets the same mix of malformed, oversized,
//! deeply nested, badly encoded and pathological reviews, several at once, and the run counts
//! what a user of the webhook would notice: crashes (a connection that fails), HTTP 5xx,
//! requests that hang (no answer within 30 s), and the process's peak resident memory.
//!
//! `cargo run --release -p nodewarden-webhook --features loadgen,test-util --example hostile-load [-- --per-route N --parallel P]`
//!
//! The server runs as the benchmarks run it: one current-thread runtime (one core) in this
//! process, the default connection limits, 6 MiB bodies. Peak memory is this process's
//! (`VmHWM`: the client's bodies are in it too). Figures are in docs/server.md.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nodewarden_webhook::admission::{FailOpen, Route};
use nodewarden_webhook::claims::{ClaimsGuard, ClaimsPolicy, Principals, StaticView};
use nodewarden_webhook::features::{FeatureCaches, FeaturesGuard};
use nodewarden_webhook::loadgen::{self, Alpn, BenchCerts, SERVER_NAME, Server};
use nodewarden_webhook::node_reports::{NodeReportsGuard, NodeReportsPolicy};
use nodewarden_webhook::rightsizing::{AutoscalerValidator, PodMutator, RightsizingIndex};
use serde_json::json;

const HANG: Duration = Duration::from_secs(30);

fn kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A review envelope around `object` (raw JSON text) for a route's kind.
fn review(kind: (&str, &str, &str), resource: &str, name: &str, object: &str) -> String {
    let (group, version, kind) = kind;
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-1","kind":{{"group":"{group}","version":"{version}","kind":"{kind}"}},"resource":{{"group":"{group}","version":"{version}","resource":"{resource}"}},"name":{name},"namespace":"shippers","operation":"CREATE","userInfo":{{"username":"mallory","groups":["system:authenticated"]}},"object":{object}}}}}"#,
        name = serde_json::to_string(name).unwrap_or_default(),
    )
}

/// About `bytes` of `[[],[],…]`, the worst case for a generic JSON tree.
fn padding(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 8);
    s.push('[');
    while s.len() < bytes {
        s.push_str("[],");
    }
    s.push_str("[]]");
    s
}

/// The hostile inputs for one route: (what it is, the body).
fn inputs(kind: (&str, &str, &str), resource: &str, pathological: String) -> Vec<(&'static str, Bytes)> {
    let mut bad_utf8 = review(kind, resource, "x", r#"{"metadata":{"name":"AAAA"}}"#).into_bytes();
    if let Some(at) = bad_utf8.windows(4).position(|w| w == b"AAAA") {
        bad_utf8[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    }
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    vec![
        ("not JSON", Bytes::from_static(b"\x00\x01GET / HTTP/1.1 {{{")),
        ("empty body", Bytes::new()),
        ("bad UTF-8 in a string", Bytes::from(bad_utf8)),
        (
            "100,000 nested arrays",
            Bytes::from(review(kind, resource, "x", &deep)),
        ),
        (
            "wrong types",
            Bytes::from_static(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":42,"kind":7}}"#),
        ),
        (
            "5 MB of [[],[],...] as the object",
            Bytes::from(review(kind, resource, "x", &padding(5 << 20))),
        ),
        (
            "1 MB name",
            Bytes::from(review(kind, resource, &"n".repeat(1 << 20), r#"{"metadata":{}}"#)),
        ),
        ("7 MB body (over the limit)", Bytes::from(vec![b' '; 7 << 20])),
        (
            "quantities at the top of the range",
            Bytes::from(review(
                kind,
                resource,
                "x",
                r#"{"metadata":{"name":"x"},"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"9223372036854775807","memory":"999999999Ei"},"limits":{"cpu":"1e308"}}}],"value":"x"}}"#,
            )),
        ),
        ("the route's pathological shape", Bytes::from(pathological)),
    ]
}

#[derive(Default)]
struct Tally {
    sent: u64,
    by_status: BTreeMap<u16, u64>,
    failed: u64,
    hung: u64,
    slowest: Duration,
}

fn main() -> anyhow::Result<()> {
    let arg = |name: &str, default: usize| {
        std::env::args()
            .skip_while(|a| a != name)
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let per_route = arg("--per-route", 6000);
    let parallel = arg("--parallel", 8);

    let pods = ("", "v1", "Pod");
    let dsa = ("nodewarden.io", "v1alpha1", "DaemonSetAutoscaler");
    let claim = ("about.k8s.io", "v1beta1", "ClusterProperty");
    let noderec = ("nodewarden.io", "v1alpha1", "NodeRecommendation");
    let feature_pod = ("", "v1", "Pod");
    let containers = |n: usize| {
        (0..n)
            .map(|_| json!({"name": "c", "image": "x"}))
            .collect::<Vec<_>>()
    };
    let pod_object = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "ds", "uid": "u", "controller": true}]}, "spec": {"nodeName": "n", "containers": containers(40_000)}})
    .to_string();
    let policies: Vec<_> = (0..60_000)
        .map(|i| json!({"containerName": format!("c{i}"), "minAllowed": {"cpu": "1m"}}))
        .collect();
    let dsa_object = json!({"metadata": {"name": "a", "namespace": "shippers"}, "spec": {
        "targetRef": {"kind": "DaemonSet", "name": "ds"}, "resourcePolicy": {"containerPolicies": policies}}})
    .to_string();
    let claim_object =
        json!({"metadata": {"name": "id.k8s.io"}, "spec": {"value": "v".repeat(5 << 20)}}).to_string();
    let rec_object = json!({"metadata": {"name": "n"}, "spec": {"recommendations":
        (0..40_000).map(|i| json!({"autoscaler": {"namespace": "a", "name": "b"}, "containerName": format!("c{i}")})).collect::<Vec<_>>()}})
    .to_string();

    let index = RightsizingIndex::new();
    let routes = vec![
        Route::new("/mutate/pods", FailOpen(PodMutator::new(index.clone()))),
        Route::new("/validate/autoscalers", AutoscalerValidator::new(index)),
        Route::new(
            "/validate/claims",
            ClaimsGuard::new(
                ClaimsPolicy {
                    principals: Principals::new([], ["system:masters".to_string()], []),
                    id_subdomain: false,
                },
                Arc::new(StaticView::empty()),
                Arc::new(()),
            ),
        ),
        Route::new(
            "/validate/node-reports",
            NodeReportsGuard::new(NodeReportsPolicy::default()),
        ),
        Route::new("/validate/features", FeaturesGuard::new(FeatureCaches::new())),
    ];
    let per_route_inputs: Vec<(&str, Vec<(&str, Bytes)>)> = vec![
        (
            "/mutate/pods",
            inputs(pods, "pods", review(pods, "pods", "p", &pod_object)),
        ),
        (
            "/validate/autoscalers",
            inputs(
                dsa,
                "daemonsetautoscalers",
                review(dsa, "daemonsetautoscalers", "a", &dsa_object),
            ),
        ),
        (
            "/validate/claims",
            inputs(
                claim,
                "clusterproperties",
                review(claim, "clusterproperties", "id.k8s.io", &claim_object),
            ),
        ),
        (
            "/validate/node-reports",
            inputs(
                noderec,
                "noderecommendations",
                review(noderec, "noderecommendations", "n", &rec_object),
            ),
        ),
        (
            "/validate/features",
            inputs(feature_pod, "pods", review(feature_pod, "pods", "p", &pod_object)),
        ),
    ];

    let certs = BenchCerts::generate()?;
    let server = Server::start(&certs.cert_pem, &certs.key_pem, routes)?;
    let cpu_before = (server.cpu)();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let rss_start = kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").ok();
    let started = Instant::now();
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    runtime.block_on(async {
        for (route, inputs) in &per_route_inputs {
            let tally = tallies.entry(route).or_default();
            let mut sent = 0usize;
            let mut conns = Vec::new();
            for i in 0..parallel {
                let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::Http1 };
                conns.push(loadgen::connect(server.addr, &certs.ca_pem, SERVER_NAME, alpn).await?);
            }
            while sent < per_route {
                let batch: Vec<_> = (0..parallel.min(per_route - sent))
                    .map(|i| {
                        let (_, body) = &inputs[(sent + i) % inputs.len()];
                        let conn = conns[i].clone();
                        let body = body.clone();
                        let route = *route;
                        tokio::spawn(async move {
                            let t = Instant::now();
                            let answer = tokio::time::timeout(HANG, conn.send_status(route, body)).await;
                            (answer, t.elapsed())
                        })
                    })
                    .collect();
                for (i, handle) in batch.into_iter().enumerate() {
                    let (answer, took) = handle.await?;
                    tally.sent += 1;
                    tally.slowest = tally.slowest.max(took);
                    match answer {
                        Err(_) => tally.hung += 1,
                        Ok(Err(_)) => {
                            tally.failed += 1;
                            // a closed connection (e.g. after a 413 on HTTP/1.1) is replaced
                            let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::Http1 };
                            conns[i] =
                                loadgen::connect(server.addr, &certs.ca_pem, SERVER_NAME, alpn).await?;
                        }
                        Ok(Ok((status, _))) => *tally.by_status.entry(status).or_default() += 1,
                    }
                }
                sent += parallel;
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let took = started.elapsed();
    let cpu_ms = ((server.cpu)() - cpu_before) as f64 / 1e6;
    let peak = kib("VmHWM:");
    println!("| route | reviews | answers by HTTP status | connection failed | hung (> 30 s) | slowest |");
    println!("|---|---:|---|---:|---:|---:|");
    for (route, t) in &tallies {
        let statuses: Vec<String> = t.by_status.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        println!(
            "| `{route}` | {} | {} | {} | {} | {:.0} ms |",
            t.sent,
            statuses.join(", "),
            t.failed,
            t.hung,
            t.slowest.as_secs_f64() * 1000.0
        );
    }
    let five_xx: u64 = tallies
        .values()
        .flat_map(|t| t.by_status.iter().filter(|(s, _)| **s >= 500).map(|(_, n)| *n))
        .sum();
    println!(
        "\n{} reviews in {:.1} s, {parallel} at once; server thread CPU {:.1} s; HTTP 5xx: {five_xx}; \
         resident memory {} MiB at the start, peak {} MiB",
        tallies.values().map(|t| t.sent).sum::<u64>(),
        took.as_secs_f64(),
        cpu_ms / 1000.0,
        rss_start / 1024,
        peak / 1024
    );
    server.shutdown();
    Ok(())
}
