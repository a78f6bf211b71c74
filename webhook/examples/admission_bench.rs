//! Admission throughput and latency of the TLS server, over keep-alive HTTP/2 and HTTP/1.1.
//!
//! Run with `cargo xtask bench admission` (release build). The server runs on one
//! current-thread runtime, i.e. one core; the load generator runs on another thread. Besides
//! the rate the client achieved, the server thread's own CPU time (from
//! `/proc/thread-self/schedstat`) gives reviews per second of one fully used core, which does
//! not depend on how fast the client is.
//!
//! Two phases per transport: closed loop (as fast as the connections go) for throughput, then
//! open loop at half that rate for latency percentiles.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodewarden_certs::{Ca, CaConfig, ServingSpec, service_dns_names};
use nodewarden_webhook::admission::{self, AdmissionRequest, AdmissionResponse, Route};
use nodewarden_webhook::metrics::Metrics;
use nodewarden_webhook::server::serve_tls;
use nodewarden_webhook::tls::{CertResolver, certified_key, server_config};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");
const SERVER_NAME: &str = "nodewarden-webhook.nodewarden.svc";

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

struct ServerHandle {
    addr: SocketAddr,
    stop: CancellationToken,
    cpu_ns: Arc<dyn Fn() -> u64 + Send + Sync>,
    thread: std::thread::JoinHandle<()>,
}

fn start_server(ca: &Ca) -> ServerHandle {
    let cert = ca
        .issue_serving(&ServingSpec {
            dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
            ip_addresses: vec![],
            validity: Duration::from_secs(3600),
        })
        .expect("serving cert");
    let resolver = Arc::new(CertResolver::default());
    resolver.set(
        certified_key(
            cert.cert_pem.as_bytes(),
            cert.key_pem.as_bytes(),
            Path::new("c"),
            Path::new("k"),
        )
        .expect("pair"),
    );
    let tls = server_config(resolver).expect("tls");
    let stop = CancellationToken::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let stop_server = stop.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let task_dir = std::fs::read_link("/proc/thread-self").expect("procfs");
            tx.send((listener.local_addr().expect("addr"), task_dir))
                .expect("send");
            let routes = vec![Route::new("/allow", allow), Route::new("/parse", parse_pod)];
            let app = admission::router(routes, Arc::new(Metrics::new()), 6 << 20);
            serve_tls(listener, tls, app, stop_server, Duration::from_secs(2)).await;
        });
    });
    let (addr, task_dir) = rx.recv().expect("server started");
    let schedstat = Path::new("/proc").join(task_dir).join("schedstat");
    let cpu_ns = Arc::new(move || {
        std::fs::read_to_string(&schedstat)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    });
    ServerHandle {
        addr,
        stop,
        cpu_ns,
        thread,
    }
}

#[derive(Clone)]
enum Conn {
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

async fn connect(addr: SocketAddr, ca_pem: &str, h2: bool) -> Conn {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(SERVER_NAME).expect("name"), tcp)
        .await
        .expect("handshake");
    let io = TokioIo::new(tls);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        Conn::H2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        Conn::H1(Arc::new(tokio::sync::Mutex::new(sender)))
    }
}

async fn send(conn: &Conn, path: &str, body: Bytes) -> bool {
    let req = http::Request::post(format!("https://{SERVER_NAME}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("request");
    let resp = match conn {
        Conn::H2(s) => s.clone().send_request(req).await,
        Conn::H1(s) => {
            let mut s = s.lock().await;
            if s.ready().await.is_err() {
                return false;
            }
            s.send_request(req).await
        }
    };
    match resp {
        Ok(resp) if resp.status().is_success() => resp.into_body().collect().await.is_ok(),
        _ => false,
    }
}

struct Phase {
    reviews: u64,
    failures: u64,
    wall: Duration,
    server_cpu: Duration,
    latency: Histogram<u64>,
}

/// Closed loop: `concurrency` workers, each sending back to back.
async fn closed_loop(conns: &[Conn], path: &'static str, body: Bytes, a: &Args, s: &ServerHandle) -> Phase {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + a.duration;
    let cpu0 = (s.cpu_ns)();
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..a.concurrency {
        let conn = conns[w % conns.len()].clone();
        let (body, done, failed) = (body.clone(), done.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            while Instant::now() < deadline {
                let t = Instant::now();
                if send(&conn, path, body.clone()).await {
                    done.fetch_add(1, Ordering::Relaxed);
                    let _ = hist.record(t.elapsed().as_micros() as u64);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            hist
        }));
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    for w in workers {
        latency.add(w.await.expect("worker")).expect("merge");
    }
    Phase {
        reviews: done.load(Ordering::Relaxed),
        failures: failed.load(Ordering::Relaxed),
        wall: started.elapsed(),
        server_cpu: Duration::from_nanos((s.cpu_ns)().saturating_sub(cpu0)),
        latency,
    }
}

/// Open loop: requests are released every millisecond at `rate` per second, whether or not
/// earlier ones have finished; latency is measured from release to the last byte of the answer.
async fn open_loop(
    conns: &[Conn],
    path: &'static str,
    body: Bytes,
    rate: f64,
    a: &Args,
    s: &ServerHandle,
) -> Phase {
    let failed = Arc::new(AtomicU64::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let cpu0 = (s.cpu_ns)();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut released: u64 = 0;
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < a.duration {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        while released < due {
            let conn = conns[(released as usize) % conns.len()].clone();
            let (body, tx, failed) = (body.clone(), tx.clone(), failed.clone());
            tasks.spawn(async move {
                let t = Instant::now();
                if send(&conn, path, body).await {
                    let _ = tx.send(t.elapsed().as_micros() as u64);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            });
            released += 1;
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let wall = started.elapsed();
    drop(tx);
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    let mut reviews = 0;
    while let Some(us) = rx.recv().await {
        let _ = latency.record(us);
        reviews += 1;
    }
    Phase {
        reviews,
        failures: failed.load(Ordering::Relaxed),
        wall,
        server_cpu: Duration::from_nanos((s.cpu_ns)().saturating_sub(cpu0)),
        latency,
    }
}

fn report(label: &str, p: &Phase) {
    let rate = p.reviews as f64 / p.wall.as_secs_f64();
    let cpu = p.server_cpu.as_secs_f64() / p.wall.as_secs_f64();
    let per_core = if p.server_cpu.is_zero() {
        0.0
    } else {
        p.reviews as f64 / p.server_cpu.as_secs_f64()
    };
    println!(
        "| {label:<34} | {rate:>9.0} | {:>5.0} % | {per_core:>9.0} | {:>7.3} | {:>7.3} | {:>7.3} | {:>4} |",
        cpu * 100.0,
        p.latency.value_at_quantile(0.5) as f64 / 1000.0,
        p.latency.value_at_quantile(0.99) as f64 / 1000.0,
        p.latency.max() as f64 / 1000.0,
        p.failures,
    );
}

fn main() {
    let args = Args::parse();
    let ca = Ca::generate(&CaConfig {
        common_name: "bench".into(),
        validity: Duration::from_secs(3600),
    })
    .expect("ca");
    let server = start_server(&ca);
    let body = review_body(args.review_bytes);
    println!(
        "review body: {} bytes; phases of {:?}; server: 1 current-thread runtime; client: 1 worker thread",
        body.len(),
        args.duration
    );
    println!(
        "\n| transport / handler / phase          | reviews/s | server CPU | reviews per server core-second | p50 ms | p99 ms | max ms | fail |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("rt");
    client.block_on(async {
        for (transport, h2, n) in [
            ("HTTP/2", true, args.h2_connections),
            ("HTTP/1.1", false, args.h1_connections),
        ] {
            let mut conns = Vec::new();
            for _ in 0..n {
                conns.push(connect(server.addr, &ca.cert_pem, h2).await);
            }
            for (handler, path) in [("pipeline", "/allow"), ("pipeline + Pod parse", "/parse")] {
                // warm up connections and allocator
                let _ = closed_loop(
                    &conns,
                    path,
                    body.clone(),
                    &Args {
                        duration: Duration::from_millis(500),
                        ..args_clone(&args)
                    },
                    &server,
                )
                .await;
                let max = closed_loop(&conns, path, body.clone(), &args, &server).await;
                report(&format!("{transport} {handler}, max"), &max);
                let half = max.reviews as f64 / max.wall.as_secs_f64() / 2.0;
                let open = open_loop(&conns, path, body.clone(), half, &args, &server).await;
                report(&format!("{transport} {handler}, at half"), &open);
            }
        }
    });
    server.stop.cancel();
    let _ = server.thread.join();
}

fn args_clone(a: &Args) -> Args {
    Args {
        duration: a.duration,
        concurrency: a.concurrency,
        h1_connections: a.h1_connections,
        h2_connections: a.h2_connections,
        review_bytes: a.review_bytes,
    }
}
