//! What an unauthenticated client can do to the webhook: each attack below runs against the real
//! `nodewarden-webhook` binary in a child process (no API server; the admission and admin ports
//! serve anyway) while two victims use it as the API server does: one open HTTP/2 connection
//! posting a pod review every 100 ms, and a new TLS connection with one review every second.
//!
//! For each attack it asserts what a cluster would notice: that the webhook lives, that its peak
//! resident memory (`VmHWM` of the child, reset before each attack through
//! `/proc/<pid>/clear_refs`) stays under the chart's 256 MiB limit, that every review on the open
//! connection and on each new connection is answered within the API server's timeout for the pod
//! webhook (the chart's `timeoutSeconds: 3`), and what the webhook did to the attacker. The
//! latencies (p50, p99, the slowest) are printed, not asserted: they measure the machine's load
//! as much as the webhook (figures from a quiet machine in docs/server.md). Everything goes
//! to 127.0.0.1, every attack is bounded in connections and stops after a few seconds.
//!
//! `cargo test -p nodewarden-webhook --test attacks -- --nocapture` prints one line per attack
//! (figures in docs/server.md). The child runs with `--write-timeout 2s` so that the stalled
//! answers' connections are seen closing within the test; every other limit is the default.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodewarden_certs::{Ca, CaConfig, ServingSpec};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

/// A port for the webhook binary to listen on (below the ephemeral range: see the function).
fn free_port() -> u16 {
    nodewarden_runtime::testing::free_port().expect("a free port")
}

const BIN: &str = env!("CARGO_BIN_EXE_nodewarden-webhook");
const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");
const MEMORY_LIMIT_KIB: u64 = 256 * 1024;
/// How long the API server waits for the pod webhook's answer (the chart's `timeoutSeconds: 3`
/// for `pods.rightsizing.nodewarden.io`): a review answered later is one it gave up on, and the
/// pod keeps its template's requests. A victim's review without an answer by then is a failure.
const API_SERVER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the kubelet waits for the liveness probe (the chart's `timeoutSeconds: 3`): three
/// probes in a row without an answer by then and it restarts the webhook.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// A debug build also meets attacks 1 to 4 and 6 with a quarter of the connections: at full size
/// they keep its one thread busy (its TLS, HTTP/2 and JSON are several times slower) and the
/// victims then measure that, not the limits. Attack 5 (slots) runs at full size: its point is to
/// pass the connection limit. Figures in docs/server.md are from release builds at full size.
const SCALE: usize = if cfg!(debug_assertions) { 4 } else { 1 };
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Each attack runs this long before the victims are measured, then this long while they are.
/// Ten seconds at one review each 100 ms: 100 reviews, so the p99 is the second slowest.
const RAMP: Duration = Duration::from_secs(2);
const MEASURED: Duration = Duration::from_secs(10);

struct Webhook {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    _dir: tempfile::TempDir,
}

impl Webhook {
    fn start() -> Webhook {
        let dir = tempfile::tempdir().expect("tmp");
        let ca = Ca::generate(&CaConfig {
            common_name: "attacks".into(),
            validity: Duration::from_secs(3600),
        })
        .expect("ca");
        let cert = ca
            .issue_serving(&ServingSpec {
                dns_names: vec!["localhost".into()],
                ip_addresses: vec![],
                validity: Duration::from_secs(3600),
            })
            .expect("cert");
        std::fs::write(dir.path().join("tls.crt"), &cert.cert_pem).expect("write");
        std::fs::write(dir.path().join("tls.key"), &cert.key_pem).expect("write");
        // a kubeconfig naming an API server that is not there: the watches retry, the ports serve
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
                free_port()
            ),
        )
        .expect("write");
        let (listen, admin) = (free_port(), free_port());
        let child = Command::new(BIN)
            .env("NODEWARDEN_LISTEN_ADDR", format!("127.0.0.1:{listen}"))
            .env("NODEWARDEN_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
            .env("NODEWARDEN_TLS_CERT_FILE", dir.path().join("tls.crt"))
            .env("NODEWARDEN_TLS_KEY_FILE", dir.path().join("tls.key"))
            .env("NODEWARDEN_KUBECONFIG", &kubeconfig)
            .env("NODEWARDEN_POD_NAMESPACE", "nodewarden")
            .env("NODEWARDEN_LOG_LEVEL", "error")
            .env("NODEWARDEN_WRITE_TIMEOUT", "2s")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca.cert_pem.as_bytes()) {
            roots.add(c.expect("pem")).expect("root");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        Webhook {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], listen)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            tls: Arc::new(tls),
            _dir: dir,
        }
    }

    fn kib(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Peak resident memory since the last [`Webhook::reset_peak`], in KiB.
    fn peak_kib(&self) -> u64 {
        self.kib("VmHWM:")
    }

    /// Resets the peak to the current resident memory (`clear_refs` 5, Linux 4.0+).
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn tls(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    alpn: &[u8],
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_over(TcpStream::connect(addr).await?, config, alpn).await
}

/// An attacker's socket, bound to 127.0.0.2: the victims connect from 127.0.0.1, so the
/// attackers' thousands of closed connections (their TIME_WAIT entries) never collide with a
/// victim's new connection, which would cost it a SYN retransmission (1 s) on loopback. The
/// traffic still goes to the webhook on 127.0.0.1.
fn attacker_socket() -> std::io::Result<tokio::net::TcpSocket> {
    attacker_socket_at(2)
}

/// An attacker's socket bound to 127.0.0.`last`: an attacker with several addresses, each under
/// the webhook's share per address (`--max-connections-per-source`).
fn attacker_socket_at(last: u8) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from(([127, 0, 0, last], 0)))?;
    Ok(socket)
}

async fn attacker_tcp(addr: SocketAddr) -> std::io::Result<TcpStream> {
    attacker_socket()?.connect(addr).await
}

async fn attacker_tcp_at(addr: SocketAddr, last: u8) -> std::io::Result<TcpStream> {
    attacker_socket_at(last)?.connect(addr).await
}

async fn attacker_tls(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    alpn: &[u8],
) -> std::io::Result<TlsStream<TcpStream>> {
    tls_over(attacker_tcp(addr).await?, config, alpn).await
}

async fn tls_over(
    tcp: TcpStream,
    config: &Arc<rustls::ClientConfig>,
    alpn: &[u8],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut config = (**config).clone();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tcp.set_nodelay(true)?;
    connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

fn review_body(uid: &str) -> Bytes {
    let mut review: serde_json::Value = serde_json::from_str(POD_REVIEW).expect("fixture");
    review["request"]["uid"] = serde_json::json!(uid);
    Bytes::from(review.to_string())
}

fn post() -> http::Request<()> {
    http::Request::post("https://localhost/mutate/pods")
        .header("content-type", "application/json")
        .body(())
        .expect("request")
}

type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

async fn victim_connection(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> Result<Sender, String> {
    let io = tls(addr, config, b"h2")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn victim_review(sender: &mut Sender, body: &Bytes) -> Result<(), String> {
    let request = http::Request::post("https://localhost/mutate/pods")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .expect("request");
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    if status != http::StatusCode::OK || !answer.starts_with(b"{") {
        return Err(format!("HTTP {status}"));
    }
    Ok(())
}

/// What the victims saw while they were measured.
#[derive(Default)]
struct Seen {
    open: Vec<Duration>,
    open_failures: Vec<String>,
    new: Vec<Duration>,
    new_failures: Vec<String>,
}

impl Seen {
    fn slowest(&self, n: usize) -> Vec<u128> {
        let mut sorted = self.open.clone();
        sorted.sort();
        sorted.iter().rev().take(n).map(|d| d.as_millis()).collect()
    }

    fn percentile(&self, p: f64) -> Duration {
        percentile(&self.open, p)
    }
}

fn percentile(of: &[Duration], p: f64) -> Duration {
    let mut sorted = of.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1);
    sorted.get(at).copied().unwrap_or(Duration::MAX)
}

/// Runs both victims from `measure_from` until `until`; the second opens a new connection every
/// `new_every`.
async fn victims(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    mut open: Sender,
    measure_from: Instant,
    until: Instant,
    new_every: Duration,
) -> Seen {
    let body = review_body("5f0c0f2e-4b8a-4d36-9d0e-victim000001");
    let new_conns = {
        let (config, body) = (config.clone(), body.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            tokio::time::sleep_until(measure_from.into()).await;
            let mut tick = tokio::time::interval(new_every);
            while Instant::now() < until {
                tick.tick().await;
                let (config, body) = (config.clone(), body.clone());
                seen.push(tokio::spawn(async move {
                    let started = Instant::now();
                    let answered = tokio::time::timeout(API_SERVER_TIMEOUT, async {
                        let mut sender = victim_connection(addr, &config).await?;
                        victim_review(&mut sender, &body).await
                    })
                    .await;
                    match answered {
                        Ok(Ok(())) => Ok(started.elapsed()),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(format!("no answer within {API_SERVER_TIMEOUT:?}")),
                    }
                }));
            }
            let mut results = Vec::new();
            for s in seen {
                results.push(s.await.unwrap_or_else(|e| Err(e.to_string())));
            }
            results
        })
    };
    let mut seen = Seen::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < until {
        tick.tick().await;
        let started = Instant::now();
        let answered = tokio::time::timeout(API_SERVER_TIMEOUT, victim_review(&mut open, &body)).await;
        let took = started.elapsed();
        if started < measure_from {
            continue;
        }
        match answered {
            Ok(Ok(())) => seen.open.push(took),
            Ok(Err(e)) => seen.open_failures.push(e),
            Err(_) => seen
                .open_failures
                .push(format!("no answer within {API_SERVER_TIMEOUT:?}")),
        }
    }
    for result in new_conns.await.unwrap_or_default() {
        match result {
            Ok(took) => seen.new.push(took),
            Err(e) => seen.new_failures.push(e),
        }
    }
    seen
}

/// Runs `attack` for [`RAMP`] + [`MEASURED`] while the victims run, stops it, and checks what
/// every attack must not do. Returns the attack's own report.
async fn under_attack<F, Fut>(webhook: &mut Webhook, name: &str, attack: F) -> (String, Vec<String>)
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    under_attack_with(webhook, name, Duration::from_secs(1), attack).await
}

/// [`under_attack`] with the victim's new connections `new_every` apart.
async fn under_attack_with<F, Fut>(
    webhook: &mut Webhook,
    name: &str,
    new_every: Duration,
    attack: F,
) -> (String, Vec<String>)
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    // the victims run on a thread and runtime of their own, so that the attackers' tasks in
    // this process do not delay them: what they measure is the webhook
    let (addr, config) = (webhook.addr, webhook.tls.clone());
    let (connected, is_connected) = tokio::sync::oneshot::channel();
    let (go, start) = tokio::sync::oneshot::channel::<Instant>();
    let victims_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let open = victim_connection(addr, &config)
                .await
                .expect("the victim connects before the attack");
            let _ = connected.send(());
            let started = start.await.expect("started");
            victims(
                addr,
                config,
                open,
                started + RAMP,
                started + RAMP + MEASURED,
                new_every,
            )
            .await
        })
    });
    is_connected.await.expect("the victims connected");
    webhook.reset_peak();
    let before_kib = webhook.kib("VmRSS:");
    let stop = CancellationToken::new();
    let started = Instant::now();
    let attack_task = tokio::spawn(attack(stop.clone()));
    let _ = go.send(started);
    let seen = tokio::task::spawn_blocking(move || victims_thread.join())
        .await
        .expect("joined")
        .expect("the victims ran");
    let peak_kib = webhook.peak_kib();
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(20), attack_task)
        .await
        .expect("the attack stops")
        .expect("the attack ran");
    let (p50, p99) = (seen.percentile(0.5), seen.percentile(0.99));
    let slowest_new = seen.new.iter().max().copied().unwrap_or_default();
    eprintln!(
        "attack {name}: slowest open-connection reviews (ms) {:?}, new connections (ms) {:?}",
        seen.slowest(5),
        seen.new.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
    let (new_p50, new_p99) = (percentile(&seen.new, 0.5), percentile(&seen.new, 0.99));
    eprintln!(
        "attack {name}: webhook peak {} MiB (from {} MiB), open connection {} reviews p50 {:.1} ms p99 {:.1} ms, {} new connections answered p50 {:.1} ms p99 {:.1} ms, slowest {:.0} ms; {report}",
        peak_kib / 1024,
        before_kib / 1024,
        seen.open.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        seen.new.len(),
        new_p50.as_secs_f64() * 1e3,
        new_p99.as_secs_f64() * 1e3,
        slowest_new.as_secs_f64() * 1e3,
    );
    let mut failed = Vec::new();
    let mut check = |ok: bool, why: String| {
        if !ok {
            failed.push(why);
        }
    };
    check(webhook.alive(), format!("{name}: the webhook died"));
    check(
        peak_kib < MEMORY_LIMIT_KIB,
        format!("{name}: peak {peak_kib} KiB, over the 256 MiB limit"),
    );
    check(
        seen.open_failures.is_empty(),
        format!(
            "{name}: the open connection's reviews failed: {:?}",
            seen.open_failures
        ),
    );
    check(
        seen.open.len() >= 10,
        format!("{name}: only {} reviews answered", seen.open.len()),
    );
    check(
        seen.new_failures.is_empty() && seen.new.len() >= 8,
        format!(
            "{name}: new connections failed: {:?} ({} answered)",
            seen.new_failures,
            seen.new.len()
        ),
    );
    check(!report.starts_with("FAILED"), format!("{name}: {report}"));
    (report, failed)
}

/// An attacker's HTTP/2 connection through the `h2` crate (which answers pings and keeps to the
/// server's stream and window limits, as a careful attacker would).
async fn h2_attacker(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    window: u32,
) -> Option<(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>)> {
    h2_attacker_at(addr, config, window, 2).await
}

/// [`h2_attacker`] from 127.0.0.`last`.
async fn h2_attacker_at(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    window: u32,
    last: u8,
) -> Option<(h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>)> {
    let tcp = attacker_tcp_at(addr, last).await.ok()?;
    let io = tls_over(tcp, config, b"h2").await.ok()?;
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .max_concurrent_streams(1000)
        .handshake::<_, Bytes>(io)
        .await
        .ok()?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    // the server's SETTINGS (its stream limit) arrive before the streams are opened
    tokio::time::sleep(Duration::from_millis(100)).await;
    Some((client, driver))
}

/// Opens up to `streams` requests on `client` (fewer when the server allows fewer at once).
async fn open_streams(
    client: &mut h2::client::SendRequest<Bytes>,
    streams: usize,
    mut each: impl FnMut(&mut h2::SendStream<Bytes>),
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
    let mut held = Vec::new();
    for _ in 0..streams {
        match tokio::time::timeout(Duration::from_millis(300), client.clone().ready()).await {
            Ok(Ok(ready)) => *client = ready,
            _ => break,
        }
        let Ok((response, mut body)) = client.send_request(post(), false) else {
            break;
        };
        each(&mut body);
        held.push((response, body));
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_survives_every_attack_and_keeps_serving() {
    let mut webhook = Webhook::start();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut sender) = victim_connection(webhook.addr, &webhook.tls).await
            && victim_review(&mut sender, &review_body("ready")).await.is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the webhook never answered");
        assert!(webhook.alive(), "the webhook exited at start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (addr, admin, config) = (webhook.addr, webhook.admin, webhook.tls.clone());
    let suite = Instant::now();

    // 1. bodies pinned: 100 connections each open as many streams as allowed (250 tried), each
    //    sending 65,535 bytes of a body and never its end
    let mut failures = Vec::new();
    if wanted(1) {
        let cfg = config.clone();
        let (_, failed) = under_attack(&mut webhook, "1 pinned bodies", move |stop| async move {
            let streams = Arc::new(AtomicUsize::new(0));
            let chunk = Bytes::from(vec![b' '; 65_535]);
            let mut tasks = Vec::new();
            for _ in 0..100 / SCALE {
                let (cfg, stop, streams, chunk) = (cfg.clone(), stop.clone(), streams.clone(), chunk.clone());
                tasks.push(tokio::spawn(async move {
                    let Some((mut client, driver)) = h2_attacker(addr, &cfg, 65_535).await else {
                        return;
                    };
                    let held = open_streams(&mut client, 250, |body| {
                        let _ = body.send_data(chunk.clone(), false);
                    })
                    .await;
                    streams.fetch_add(held.len(), Ordering::Relaxed);
                    stop.cancelled().await;
                    driver.abort();
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            format!(
                "{} streams asked for with bodies, on {} connections",
                streams.load(Ordering::Relaxed),
                100 / SCALE
            )
        })
        .await;
        failures.extend(failed);
    }

    // 2. answers that cannot be sent: a receive window of 0, pings answered, 32 reviews per
    //    connection, half with a 128-byte uid, half with a 60 KB uid; reconnects when closed
    if wanted(2) {
        let cfg = config.clone();
        let (_, failed) = under_attack(&mut webhook, "2 unsendable answers", move |stop| async move {
            let closed = Arc::new(AtomicUsize::new(0));
            let slowest_close_ms = Arc::new(AtomicU64::new(0));
            let small = review_body(&"u".repeat(128));
            let large = review_body(&"u".repeat(60_000));
            let mut tasks = Vec::new();
            for _ in 0..20 / SCALE {
                let (cfg, stop, closed, slowest) = (
                    cfg.clone(),
                    stop.clone(),
                    closed.clone(),
                    slowest_close_ms.clone(),
                );
                let (small, large) = (small.clone(), large.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let Some((mut client, mut driver)) = h2_attacker(addr, &cfg, 0).await else {
                            return;
                        };
                        let mut n = 0;
                        let held = open_streams(&mut client, 32, |body| {
                            n += 1;
                            let review = if n % 2 == 0 { large.clone() } else { small.clone() };
                            let _ = body.send_data(review, true);
                        })
                        .await;
                        let sent = Instant::now();
                        tokio::select! {
                            _ = stop.cancelled() => { driver.abort(); return; }
                            _ = &mut driver => {
                                closed.fetch_add(1, Ordering::Relaxed);
                                slowest.fetch_max(sent.elapsed().as_millis() as u64, Ordering::Relaxed);
                            }
                        }
                        drop(held);
                        // re-opened after a pause: this attack is about memory held, not a flood
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            let slowest = Duration::from_millis(slowest_close_ms.load(Ordering::Relaxed));
            if closed.load(Ordering::Relaxed) < 20 / SCALE
                || slowest > WRITE_TIMEOUT * 2 + Duration::from_secs(1)
            {
                return format!(
                    "FAILED: {} stalled connections closed, the slowest after {slowest:?}",
                    closed.load(Ordering::Relaxed)
                );
            }
            format!(
                "{} stalled connections closed by the server, the slowest {:.1} s after its reviews",
                closed.load(Ordering::Relaxed),
                slowest.as_secs_f64()
            )
        })
        .await;
        failures.extend(failed);
    }

    // 3. open streams with no body: 200 connections, as many streams as allowed (256 tried),
    //    each sending one byte of its body a second
    if wanted(3) {
        let cfg = config.clone();
        let (_, failed) = under_attack(&mut webhook, "3 streams without bodies", move |stop| async move {
            let streams = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for i in 0..200 / SCALE {
                let (cfg, stop, streams) = (cfg.clone(), stop.clone(), streams.clone());
                tasks.push(tokio::spawn(async move {
                    // from two addresses, each under the share of one (128)
                    let last = 2 + (i % 2) as u8;
                    let Some((mut client, driver)) = h2_attacker_at(addr, &cfg, 65_535, last).await else {
                        return;
                    };
                    let mut held = open_streams(&mut client, 256, |_| {}).await;
                    streams.fetch_add(held.len(), Ordering::Relaxed);
                    let mut tick = tokio::time::interval(Duration::from_secs(1));
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tick.tick() => {
                                for (_, body) in held.iter_mut() {
                                    let _ = body.send_data(Bytes::from_static(b" "), false);
                                }
                            }
                        }
                    }
                    driver.abort();
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            format!(
                "{} streams trickling a byte a second, on {} connections",
                streams.load(Ordering::Relaxed),
                200 / SCALE
            )
        })
        .await;
        failures.extend(failed);
    }

    // 4. the admin port: 300 connections trickling a request head, 20 sending 1 MB heads, 20
    //    pipelining scrapes without reading; a probe every 200 ms must be answered within 1 s
    if wanted(4) {
        let (_, failed) = under_attack(&mut webhook, "4 admin port", move |stop| async move {
            let mut tasks = Vec::new();
            let refused = Arc::new(AtomicUsize::new(0));
            for i in 0..340 / SCALE {
                let (stop, refused) = (stop.clone(), refused.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let Ok(mut tcp) = attacker_tcp(admin).await else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        let until_closed = async {
                            if i < 300 / SCALE {
                                tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                                    .await?;
                                loop {
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                    tcp.write_all(b"a").await?;
                                }
                            } else if i < 320 / SCALE {
                                tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ")
                                    .await?;
                                let big = vec![b'a'; 64 * 1024];
                                for _ in 0..16 {
                                    tcp.write_all(&big).await?;
                                }
                                tcp.write_all(b"\r\n\r\n").await?;
                                let mut answer = Vec::new();
                                tcp.read_to_end(&mut answer).await?;
                                Ok::<_, std::io::Error>(())
                            } else {
                                // pipelined scrapes whose answers are never read
                                tcp.write_all(&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000))
                                    .await?;
                                let mut byte = [0u8; 1];
                                while tcp.peek(&mut byte).await? > 0 {
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                }
                                Ok(())
                            }
                        };
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = until_closed => { refused.fetch_add(1, Ordering::Relaxed); }
                        }
                        // re-opened after a pause: this attack is about what a connection holds
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }));
            }
            // the probe, as the kubelet sends it: a new connection each time
            let probe = tokio::spawn({
                let stop = stop.clone();
                async move {
                    let mut slowest = Duration::ZERO;
                    let mut failed = 0;
                    let mut answered = 0;
                    while !stop.is_cancelled() {
                        let started = Instant::now();
                        let got = tokio::time::timeout(PROBE_TIMEOUT, async {
                            let mut tcp = TcpStream::connect(admin).await?;
                            tcp.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                                .await?;
                            let mut answer = Vec::new();
                            tcp.read_to_end(&mut answer).await?;
                            Ok::<_, std::io::Error>(answer.starts_with(b"HTTP/1.1 200"))
                        })
                        .await;
                        match got {
                            Ok(Ok(true)) => {
                                answered += 1;
                                slowest = slowest.max(started.elapsed());
                            }
                            _ => failed += 1,
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    (answered, failed, slowest)
                }
            });
            for t in tasks {
                let _ = t.await;
            }
            let (answered, failed, slowest) = probe.await.expect("probe");
            if failed > 0 || answered < 10 {
                return format!(
                    "FAILED: {failed} probes failed, {answered} answered, the slowest took {slowest:?}"
                );
            }
            format!(
                "{answered} probes answered, slowest {:.0} ms; attacker connections closed by the server: {}",
                slowest.as_secs_f64() * 1e3,
                refused.load(Ordering::Relaxed)
            )
        })
        .await;
        failures.extend(failed);
    }

    // 5. connection slots: 450 silent TCP connections re-opened when closed and 100 TLS
    //    connections trickling an HTTP/1.1 request, together over --max-connections (512), from
    //    five addresses (110 each, under the share of one address, 128)
    if wanted(5) {
        let cfg = config.clone();
        let (_, failed) = under_attack(&mut webhook, "5 connection slots", move |stop| async move {
            let reopened = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for i in 0..550 {
                let (cfg, stop, reopened) = (cfg.clone(), stop.clone(), reopened.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let last = 2 + (i % 5) as u8;
                        let held = async {
                            if i < 450 {
                                let mut tcp = attacker_tcp_at(addr, last).await?;
                                let mut byte = [0u8; 1];
                                let _ = tcp.read(&mut byte).await;
                            } else {
                                let tcp = attacker_tcp_at(addr, last).await?;
                                let mut io = tls_over(tcp, &cfg, b"http/1.1").await?;
                                io.write_all(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{").await?;
                                loop {
                                    tokio::time::sleep(Duration::from_secs(1)).await;
                                    io.write_all(b" ").await?;
                                }
                            }
                            Ok::<_, std::io::Error>(())
                        };
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = held => { reopened.fetch_add(1, Ordering::Relaxed); }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            format!(
                "attacker connections closed by the server (and re-opened): {}",
                reopened.load(Ordering::Relaxed)
            )
        })
        .await;
        failures.extend(failed);
    }

    // 6. SETTINGS flood: 20 connections, each with 32 streams open, sending SETTINGS that
    //    change the initial window as fast as they can
    if wanted(6) {
        let cfg = config.clone();
        let (_, failed) = under_attack(&mut webhook, "6 SETTINGS flood", move |stop| async move {
            let calmed = Arc::new(AtomicUsize::new(0));
            let sent = Arc::new(AtomicU64::new(0));
            let mut tasks = Vec::new();
            for _ in 0..20 / SCALE {
                let (cfg, stop, calmed, sent) = (cfg.clone(), stop.clone(), calmed.clone(), sent.clone());
                tasks.push(tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let Ok(io) = attacker_tls(addr, &cfg, b"h2").await else { return };
                        let (mut read, mut write) = tokio::io::split(io);
                        let reader = tokio::spawn(async move { read_until_goaway(&mut read).await });
                        let flood = async {
                            let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                            opening.extend(frame(0x4, 0, 0, &[]));
                            for stream in 0..32u32 {
                                opening.extend(frame(0x1, 0x4, 2 * stream + 1, &request_headers()));
                            }
                            write.write_all(&opening).await?;
                            let mut batch = Vec::new();
                            for i in 0..64u32 {
                                batch.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, (i % 2) as u8, 0]));
                            }
                            loop {
                                write.write_all(&batch).await?;
                                sent.fetch_add(64, Ordering::Relaxed);
                            }
                            #[allow(unreachable_code)]
                            Ok::<_, std::io::Error>(())
                        };
                        tokio::select! {
                            _ = stop.cancelled() => { reader.abort(); return; }
                            _ = flood => {}
                        }
                        if let Ok(true) = reader.await {
                            calmed.fetch_add(1, Ordering::Relaxed);
                        }
                        // re-opened after a pause: a handshake flood is another attack
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            let calmed = calmed.load(Ordering::Relaxed);
            if calmed < 20 / SCALE {
                return format!("FAILED: only {calmed} flooding connections got GOAWAY ENHANCE_YOUR_CALM");
            }
            format!(
                "{calmed} flooding connections closed with GOAWAY ENHANCE_YOUR_CALM after {} SETTINGS frames sent in all",
                sent.load(Ordering::Relaxed)
            )
        })
        .await;
        failures.extend(failed);
    }

    // 7. (beyond the issue's list) HTTP/1.1 clients that send requests and read nothing: 5
    //    connections with a 4 KiB receive buffer pipelining 40,000 requests each (each
    //    answered 404); the answers fill the socket and stall. Release builds only: a debug
    //    build had not filled the sockets within the attack's 12 s (not looked into further)
    if wanted(7) && !cfg!(debug_assertions) {
        let cfg = config.clone();
        let (_, failed) = under_attack(
            &mut webhook,
            "7 HTTP/1.1 readers that read nothing",
            move |stop| async move {
                let closed = Arc::new(AtomicUsize::new(0));
                // a request for a path nothing serves: answered 404 with the served paths, the
                // cheapest answer there is, so the answers pile up faster than anything else
                let request = "GET /nothing-here HTTP/1.1\r\nHost: x\r\n\r\n";
                let pipelined = Bytes::from(request.repeat(40_000));
                let mut tasks = Vec::new();
                for _ in 0..5 {
                    let (cfg, stop, closed, pipelined) =
                        (cfg.clone(), stop.clone(), closed.clone(), pipelined.clone());
                    tasks.push(tokio::spawn(async move {
                        while !stop.is_cancelled() {
                            let held = async {
                                let socket = attacker_socket()?;
                                socket.set_recv_buffer_size(4096)?;
                                let io = tls_over(socket.connect(addr).await?, &cfg, b"http/1.1").await?;
                                let (read, mut write) = tokio::io::split(io);
                                write.write_all(&pipelined).await?;
                                // read nothing; a write fails once the server has closed
                                let _unread = read;
                                loop {
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                    write.write_all(b"\r\n").await?;
                                    write.flush().await?;
                                }
                                #[allow(unreachable_code)]
                                Ok::<_, std::io::Error>(())
                            };
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                _ = held => { closed.fetch_add(1, Ordering::Relaxed); }
                            }
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
                let closed = closed.load(Ordering::Relaxed);
                if closed < 5 {
                    return format!("FAILED: only {closed} connections that read nothing were closed");
                }
                format!("{closed} connections that read nothing closed by the server (their writes failed)")
            },
        )
        .await;
        failures.extend(failed);
    }

    // 8. connection slots at a high rate (issue 45): one address opening silent TCP connections,
    //    about 1,000 a second (10 every 10 ms), each held until the server closes it, at most
    //    4,000 held at once; a victim's new connection every 100 ms (100 measured)
    if wanted(8) {
        let (_, failed) = under_attack_with(
            &mut webhook,
            "8 silent connections at a high rate",
            Duration::from_millis(100),
            move |stop| async move {
                const HELD: u32 = 4000;
                let opened = Arc::new(AtomicUsize::new(0));
                let closed = Arc::new(AtomicUsize::new(0));
                let held = Arc::new(tokio::sync::Semaphore::new(HELD as usize));
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let started = Instant::now();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    for _ in 0..10 {
                        let Ok(slot) = held.clone().try_acquire_owned() else { break };
                        let (opened, closed, stop) = (opened.clone(), closed.clone(), stop.clone());
                        tokio::spawn(async move {
                            let _slot = slot;
                            let Ok(mut tcp) = attacker_tcp(addr).await else { return };
                            opened.fetch_add(1, Ordering::Relaxed);
                            let mut byte = [0u8; 1];
                            tokio::select! {
                                _ = stop.cancelled() => {}
                                _ = tcp.read(&mut byte) => { closed.fetch_add(1, Ordering::Relaxed); }
                            }
                        });
                    }
                }
                let took = started.elapsed().as_secs_f64();
                let _ = tokio::time::timeout(Duration::from_secs(10), held.acquire_many(HELD)).await;
                let (opened, closed) = (opened.load(Ordering::Relaxed), closed.load(Ordering::Relaxed));
                if closed == 0 {
                    return format!("FAILED: the server closed none of {opened} silent connections");
                }
                format!(
                    "{opened} silent connections opened from one address ({:.0} a second), {closed} closed by the server",
                    opened as f64 / took
                )
            },
        )
        .await;
        failures.extend(failed);
    }

    eprintln!("attacks: the suite took {:.1} s", suite.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Whether attack `n` runs: all of them, or those listed in `NODEWARDEN_ATTACKS` (e.g. `2,7`).
fn wanted(n: u32) -> bool {
    std::env::var("NODEWARDEN_ATTACKS")
        .map(|only| only.split(',').any(|a| a.trim() == n.to_string()))
        .unwrap_or(true)
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A POST's header block: HPACK literals without indexing, new names, no Huffman coding.
fn request_headers() -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/mutate/pods"),
        (":authority", "localhost"),
        ("content-type", "application/json"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// Reads the server's frames until the connection ends; whether a GOAWAY with
/// ENHANCE_YOUR_CALM came.
async fn read_until_goaway(read: &mut (impl tokio::io::AsyncRead + Unpin)) -> bool {
    let mut calm = false;
    let mut header = [0u8; 9];
    loop {
        if read.read_exact(&mut header).await.is_err() {
            return calm;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        if read.read_exact(&mut payload).await.is_err() {
            return calm;
        }
        if header[3] == 0x7 && payload.get(4..8) == Some(&[0, 0, 0, 0xb][..]) {
            calm = true;
        }
    }
}
