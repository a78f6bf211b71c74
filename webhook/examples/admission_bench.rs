//! Admission throughput and latency of the TLS server, over keep-alive HTTP/2 and HTTP/1.1.
//!
//! Run with `cargo xtask bench admission` (release build). The server runs on one
//! current-thread runtime, i.e. one core; the load generator runs on another thread. Besides
//! the rate the client achieved, the server thread's own CPU time (from
//! `/proc/thread-self/schedstat`) gives reviews per second of one fully used core, which does
//! not depend on how fast the client is.
//!
//! Two phases per transport: closed loop (as fast as the connections go) for throughput, then
//! open loop at half that rate and one at a fixed rate (`--fixed-rate`, default 10,000/s) for
//! latency percentiles.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use nodewarden_webhook::admission::{AdmissionRequest, AdmissionResponse, Route};
use nodewarden_webhook::loadgen::{
    Alpn, BenchCerts, Load, Phase, SERVER_NAME, Server, any_answer, connect, current_tid, pin_thread,
    process_cpu_ns,
};

const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");

#[derive(Parser, Debug)]
#[command(about = "Admission throughput and latency over TLS keep-alive")]
struct Args {
    /// Length of each closed-loop and open-loop phase.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Concurrent requests in flight in the closed-loop phase.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/1.1 keep-alive connections (one request in flight each).
    #[arg(long, default_value_t = 16)]
    h1_connections: usize,
    /// HTTP/2 connections (requests multiplexed over them).
    #[arg(long, default_value_t = 2)]
    h2_connections: usize,
    /// Target size of the review body in bytes.
    #[arg(long, default_value_t = 10 * 1024)]
    review_bytes: usize,
    /// A further open-loop phase at this fixed rate (reviews/s): the latency goal is stated at
    /// half of the 20,000 reviews/s throughput goal. 0 skips it.
    #[arg(long, default_value_t = 10_000.0)]
    fixed_rate: f64,
    /// Closed-loop warm-up before each handler's phases (connections, allocator, caches).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    warm_up: Duration,
    /// Only the fixed-rate phase (after the warm-up): for comparing builds at one rate.
    #[arg(long)]
    fixed_only: bool,
    /// Only this transport (`h2` or `http1`); both when not given.
    #[arg(long, value_parser = ["h2", "http1"])]
    transport: Option<String>,
    /// Only this handler (`pipeline` or `parse`); both when not given.
    #[arg(long, value_parser = ["pipeline", "parse"])]
    handler: Option<String>,
    /// The server's logging: `deployed` is the webhook's default (JSON at `info`, here written
    /// to nowhere), `none` no subscriber at all (dependencies' disabled spans then still take
    /// the `log` crate's path).
    #[arg(long, default_value = "deployed", value_parser = ["deployed", "none"])]
    logging: String,
}

/// The real DaemonSet pod review, grown to `target` bytes with realistic content: more
/// environment variables on its container, as log shippers and CNI agents carry.
fn review_body(target: usize) -> Bytes {
    let mut review: serde_json::Value = serde_json::from_str(POD_REVIEW).expect("fixture parses");
    let mut i = 0;
    loop {
        let body = serde_json::to_vec(&review).expect("serializes");
        if body.len() >= target {
            return Bytes::from(body);
        }
        let env = &mut review["request"]["object"]["spec"]["containers"][0]["env"];
        if !env.is_array() {
            *env = serde_json::json!([]);
        }
        if let Some(list) = env.as_array_mut() {
            list.push(serde_json::json!({
                "name": format!("FLUENT_OUTPUT_{i}_HOST"),
                "valueFrom": {"configMapKeyRef": {"name": "log-outputs", "key": format!("output-{i}-host")}}
            }));
        }
        i += 1;
    }
}

/// The pipeline alone: decode, check, answer.
fn allow(req: &AdmissionRequest) -> AdmissionResponse {
    AdmissionResponse::allow(&req.uid)
}

/// The pipeline plus a full parse of the pod, as a capability that reads the whole object would do.
fn parse_pod(req: &AdmissionRequest) -> AdmissionResponse {
    match req.object_as::<k8s_openapi::api::core::v1::Pod>() {
        Ok(pod) if pod.spec.is_some() => AdmissionResponse::allow(&req.uid),
        Ok(_) => AdmissionResponse::deny(&req.uid, 400, "BadRequest", "no spec"),
        Err(e) => AdmissionResponse::deny(&req.uid, 400, "BadRequest", e),
    }
}

/// Times a thread of this process went to sleep waiting (voluntary context switches).
fn sleeps(tid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// What one phase is measured by besides its [`Phase`]: the server thread's sleeps and the
/// process's CPU time when the phase started.
struct Marks {
    slept: u64,
    process_cpu_ns: u64,
}

impl Marks {
    fn now(server_tid: u32) -> Self {
        Marks {
            slept: sleeps(server_tid),
            process_cpu_ns: process_cpu_ns(std::process::id()),
        }
    }
}

/// One line of the table for a phase that started at `start`. The client's CPU is the whole
/// process's less the server thread's: when it nears 100 % of its core, the latency is partly
/// the client's own queueing, not the server's. The client lag is how late requests started
/// after they were due (open loop): that part of the p99 is the client's.
fn report(label: &str, p: &Phase, start: &Marks, server_tid: u32) {
    let slept = sleeps(server_tid).saturating_sub(start.slept);
    let client_ns = process_cpu_ns(std::process::id())
        .saturating_sub(start.process_cpu_ns)
        .saturating_sub(p.server_cpu.as_nanos() as u64);
    println!(
        "| {label:<34} | {:>9.0} | {:>5.0} % | {:>9.0} | {:>5.0} % | {:>5.2} | {:>7.3} | {:>7.3} | {:>7.3} | {:>7.3} | {:>4} |",
        p.rate(),
        p.cpu_share() * 100.0,
        p.per_core(),
        client_ns as f64 / p.wall.as_nanos().max(1) as f64 * 100.0,
        slept as f64 / p.reviews.max(1) as f64,
        p.ms(0.5),
        p.ms(0.99),
        p.max_ms(),
        p.lag_ms(0.99),
        p.failures,
    );
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.logging == "deployed" {
        let filter = tracing_subscriber::EnvFilter::new("info");
        let logs = nodewarden_runtime::telemetry::json(filter, std::io::sink);
        tracing::subscriber::set_global_default(logs)?;
    }
    let certs = BenchCerts::generate()?;
    let routes = vec![Route::new("/allow", allow), Route::new("/parse", parse_pod)];
    let server = Server::start(&certs.cert_pem, &certs.key_pem, routes)?;
    let body = review_body(args.review_bytes);
    // the server thread on one core, the client (this thread, which runs its current-thread
    // runtime) on the other, so neither queues behind the other
    let pinned = pin_thread(server.tid, 1) && pin_thread(current_tid(), 0);
    println!(
        "review body: {} bytes; phases of {:?}; server: 1 current-thread runtime (thread {}){}; client: 1 current-thread runtime, offering TLS cipher suites in the kube-apiserver's order; logging: {}",
        body.len(),
        args.duration,
        server.tid,
        if pinned {
            " on CPU 1, client on CPU 0"
        } else {
            " (unpinned)"
        },
        if args.logging == "deployed" {
            "as deployed (JSON at info, to nowhere)"
        } else {
            "no subscriber"
        }
    );
    println!(
        "\n| transport / handler / phase          | reviews/s | server CPU | reviews per server core-second | client CPU | server sleeps per review | p50 ms | p99 ms | max ms | client lag p99 ms | fail |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    // one thread: the open loop's timer, its requests and their connections (no thread wakes
    // another on the client's core)
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    client.block_on(async {
        for (transport, short, alpn, n) in [
            ("HTTP/2", "h2", Alpn::H2, args.h2_connections),
            ("HTTP/1.1", "http1", Alpn::Http1, args.h1_connections),
        ] {
            if args.transport.as_deref().is_some_and(|only| only != short) {
                continue;
            }
            let mut conns = Vec::new();
            for _ in 0..n {
                conns.push(connect(server.addr, &certs.ca_pem, SERVER_NAME, alpn).await?);
            }
            for (handler, short, path) in [
                ("pipeline", "pipeline", "/allow"),
                ("pipeline + Pod parse", "parse", "/parse"),
            ] {
                if args.handler.as_deref().is_some_and(|only| only != short) {
                    continue;
                }
                let load = Load {
                    conns: conns.clone(),
                    path,
                    bodies: Arc::from([body.clone()]),
                    accept: any_answer,
                    cpu: server.cpu.clone(),
                };
                // warm up connections and allocator
                let _ = load.closed_loop(args.warm_up, args.concurrency).await;
                if !args.fixed_only {
                    let start = Marks::now(server.tid);
                    let max = load.closed_loop(args.duration, args.concurrency).await;
                    report(&format!("{transport} {handler}, max"), &max, &start, server.tid);
                    let start = Marks::now(server.tid);
                    let open = load.open_loop(args.duration, max.rate() / 2.0).await;
                    report(
                        &format!("{transport} {handler}, at half"),
                        &open,
                        &start,
                        server.tid,
                    );
                }
                if args.fixed_rate > 0.0 {
                    let start = Marks::now(server.tid);
                    let fixed = load.open_loop(args.duration, args.fixed_rate).await;
                    report(
                        &format!("{transport} {handler}, at {:.0}/s", args.fixed_rate),
                        &fixed,
                        &start,
                        server.tid,
                    );
                }
            }
        }
        anyhow::Ok(())
    })?;
    server.shutdown();
    Ok(())
}
