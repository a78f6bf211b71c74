//! Hostile load on the real TLS server: every route gets the same mix of malformed, oversized,
//! deeply nested, badly encoded and pathological reviews, several at once, and the run counts
//! what a user of the webhook would notice: crashes (a connection that fails), HTTP 5xx,
//! requests that hang (no answer within 30 s), and the process's peak resident memory.
//!
//! `cargo run --release -p nodewarden-webhook --features loadgen,test-util --example hostile-load [-- --per-route N --parallel P]`
//!
//! The server runs as the benchmarks run it (one current-thread runtime, the default connection
//! limits, 6 MiB bodies, large reviews on its blocking pool) but in a child process of its own
//! (this binary with `--serve`), so its peak resident memory (`VmHWM`) and its CPU (user +
//! system of the whole process, blocking threads included) are the server's alone, without the
//! client's bodies. Figures are in docs/server.md.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nodewarden_webhook::admission::{FailOpen, Route};
use nodewarden_webhook::claims::{ClaimsGuard, ClaimsPolicy, Principals, StaticView};
use nodewarden_webhook::features::{FeatureCaches, FeaturesGuard};
use nodewarden_webhook::loadgen::{self, Alpn, BenchCerts, SERVER_NAME, Server};
use nodewarden_webhook::node_reports::{NodeReportsGuard, NodeReportsPolicy};
use nodewarden_webhook::rightsizing::{AutoscalerValidator, PodMutator, RightsizingCache};
use serde_json::json;

const HANG: Duration = Duration::from_secs(30);

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

/// Whole-process CPU of `pid` in seconds: user + system from `/proc/<pid>/stat` (fields 14 and
/// 15, in the kernel's fixed user-space clock of 100 ticks a second), dead threads included.
fn process_cpu(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // the command name may hold spaces: fields start after its closing parenthesis
            let rest = &s[s.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some((user + system) as f64 / 100.0)
        })
        .unwrap_or(0.0)
}

fn kib_of(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The child: serves every route until its stdin closes. Certificates come in the environment,
/// the address goes out as the first line of stdout.
fn serve(routes: Vec<Route>) -> anyhow::Result<()> {
    let cert = std::env::var("HOSTILE_CERT_PEM")?;
    let key = std::env::var("HOSTILE_KEY_PEM")?;
    let server = Server::start(&cert, &key, routes)?;
    println!("{}", server.addr);
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {}
    Ok(())
}

/// Every route, as the webhook mounts them (the caches empty).
fn routes() -> Vec<Route> {
    let index = RightsizingCache::new();
    vec![
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
    ]
}

#[derive(Default)]
struct Tally {
    sent: u64,
    by_status: BTreeMap<u16, u64>,
    failed: u64,
    hung: u64,
    slowest: Duration,
    /// Connections the server closed between requests (replaced).
    reopened: u64,
    /// Why connections failed, and how often.
    errors: BTreeMap<String, u64>,
}

fn main() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--serve") {
        return serve(routes());
    }
    let arg = |name: &str, default: usize| {
        std::env::args()
            .skip_while(|a| a != name)
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let per_route = arg("--per-route", 6000);
    let parallel = arg("--parallel", 8);
    // `--only TEXT`: only the inputs whose description contains TEXT (to find what costs)
    let only: Option<String> = std::env::args().skip_while(|a| a != "--only").nth(1);

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

    let mut per_route_inputs: Vec<(&str, Vec<(&str, Bytes)>)> = vec![
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

    // `--route PATH`: only that route
    if let Some(route) = std::env::args().skip_while(|a| a != "--route").nth(1) {
        per_route_inputs.retain(|(path, _)| *path == route);
        anyhow::ensure!(!per_route_inputs.is_empty(), "no route {route:?}");
    }
    if let Some(only) = &only {
        for (_, inputs) in &mut per_route_inputs {
            inputs.retain(|(what, _)| what.contains(only.as_str()));
        }
        anyhow::ensure!(
            per_route_inputs.iter().all(|(_, i)| !i.is_empty()),
            "no input matches --only {only:?}"
        );
    }
    let certs = BenchCerts::generate()?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("--serve")
        .env("HOSTILE_CERT_PEM", &certs.cert_pem)
        .env("HOSTILE_KEY_PEM", &certs.key_pem)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let mut first = String::new();
    if let Some(out) = child.stdout.as_mut() {
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut first)?;
    }
    let addr: std::net::SocketAddr = first
        .trim()
        .parse()
        .map_err(|e| anyhow::anyhow!("the server child printed {first:?}: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let rss_start = kib_of(pid, "VmRSS:");
    let cpu_before = process_cpu(pid);
    let started = Instant::now();
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut by_input: BTreeMap<&str, Tally> = BTreeMap::new();
    runtime.block_on(async {
        for (route, inputs) in &per_route_inputs {
            let tally = tallies.entry(route).or_default();
            let mut sent = 0usize;
            let mut conns = Vec::new();
            for i in 0..parallel {
                let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::Http1 };
                conns.push(loadgen::connect(addr, &certs.ca_pem, SERVER_NAME, alpn).await?);
            }
            let mut round = 0usize;
            while sent < per_route {
                // a connection the server closed (HTTP/1.1 after a 413) is replaced before the
                // next request, as a real client does; only requests sent and not answered
                // count as failed
                for (i, conn) in conns.iter_mut().enumerate() {
                    if conn.is_closed() {
                        tally.reopened += 1;
                        let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::Http1 };
                        *conn = loadgen::connect(addr, &certs.ca_pem, SERVER_NAME, alpn).await?;
                    }
                }
                round += 1;
                let batch: Vec<_> = (0..parallel.min(per_route - sent))
                    .map(|i| {
                        // every connection (both protocols) gets every input in turn
                        let (what, body) = &inputs[(round + i) % inputs.len()];
                        let what = *what;
                        let conn = conns[i].clone();
                        let body = body.clone();
                        let route = *route;
                        tokio::spawn(async move {
                            let t = Instant::now();
                            let answer = tokio::time::timeout(HANG, conn.send_status(route, body)).await;
                            (what, answer, t.elapsed())
                        })
                    })
                    .collect();
                for (i, handle) in batch.into_iter().enumerate() {
                    let (what, answer, took) = handle.await?;
                    let input = by_input.entry(what).or_default();
                    for t in [&mut *tally, input] {
                        t.sent += 1;
                        t.slowest = t.slowest.max(took);
                        match &answer {
                            Err(_) => t.hung += 1,
                            Ok(Err(e)) => {
                                t.failed += 1;
                                *t.errors.entry(e.chars().take(100).collect()).or_default() += 1;
                            }
                            Ok(Ok((status, _))) => *t.by_status.entry(*status).or_default() += 1,
                        }
                    }
                    match answer {
                        Err(_) => {}
                        Ok(Err(_)) => {
                            // a closed connection (e.g. after a 413 on HTTP/1.1) is replaced
                            let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::Http1 };
                            conns[i] = loadgen::connect(addr, &certs.ca_pem, SERVER_NAME, alpn).await?;
                        }
                        Ok(Ok(_)) => {}
                    }
                }
                sent += parallel;
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let took = started.elapsed();
    let cpu = process_cpu(pid) - cpu_before;
    let peak = kib_of(pid, "VmHWM:");
    drop(child.stdin.take());
    child.wait()?;
    let row = |name: &str, t: &Tally| {
        let statuses: Vec<String> = t.by_status.iter().map(|(s, n)| format!("{s}: {n}")).collect();
        println!(
            "| {name} | {} | {} | {} | {} | {:.0} ms |",
            t.sent,
            statuses.join(", "),
            t.failed,
            t.hung,
            t.slowest.as_secs_f64() * 1000.0
        );
    };
    println!("| input | reviews | answers by HTTP status | connection failed | hung (> 30 s) | slowest |");
    println!("|---|---:|---|---:|---:|---:|");
    for (what, t) in &by_input {
        row(what, t);
    }
    for (what, t) in &by_input {
        for (e, n) in &t.errors {
            println!("- {what}: {n} × {e}");
        }
    }
    println!();
    println!("| route | reviews | answers by HTTP status | connection failed | hung (> 30 s) | slowest |");
    println!("|---|---:|---|---:|---:|---:|");
    for (route, t) in &tallies {
        row(&format!("`{route}`"), t);
    }
    println!(
        "\nconnections closed by the server between requests (replaced): {}",
        tallies.values().map(|t| t.reopened).sum::<u64>()
    );
    let five_xx: u64 = tallies
        .values()
        .flat_map(|t| t.by_status.iter().filter(|(s, _)| **s >= 500).map(|(_, n)| *n))
        .sum();
    println!(
        "\n{} reviews in {:.1} s, {parallel} at once; server process CPU {:.1} s; HTTP 5xx: {five_xx}; \
         server resident memory {} MiB at the start, peak {} MiB",
        tallies.values().map(|t| t.sent).sum::<u64>(),
        took.as_secs_f64(),
        cpu,
        rss_start / 1024,
        peak / 1024
    );
    Ok(())
}
