//! Load generation for the admission benchmarks (`cargo xtask bench admission`, the
//! `rightsizing-bench` example and the tests crate's `rightsizing-vpa-bench`), behind the
//! `loadgen` feature.
//!
//! * [`Server`]: the real router and TLS server on one current-thread runtime (one core) in a
//!   thread of its own, with a clock of that thread's CPU time.
//! * [`connect`]: one keep-alive TLS connection, HTTP/2 or HTTP/1.1 as ALPN settles it.
//! * [`Load`]: closed-loop (as fast as the connections go) and open-loop (a fixed release
//!   rate) phases, each giving a [`Phase`] with an hdrhistogram of latencies in microseconds
//!   and the server's CPU time over the phase.
//!
//! CPU clocks read `/proc`, so figures are Linux-only; elsewhere they read zero.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodewarden_certs::{Ca, CaConfig, ServingSpec, service_dns_names};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::admission::{self, Route};
use crate::certificates::{CertResolver, certified_key, server_config};
use crate::metrics::Metrics;
use crate::server::serve_tls;

/// The name the benchmark server's certificate carries (the chart's Service).
pub const SERVER_NAME: &str = "nodewarden-webhook.nodewarden.svc";

/// Pins thread `tid` to `cpu` (`taskset`); the threads it starts afterwards inherit it. Says so on
/// stderr and goes on unpinned when it cannot (one core, no `taskset`).
pub fn pin_thread(tid: u32, cpu: usize) -> bool {
    let pinned = std::process::Command::new("taskset")
        .args(["-p", "-c", &cpu.to_string(), &tid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pinned {
        eprintln!("could not pin thread {tid} to CPU {cpu}; figures are unpinned");
    }
    pinned
}

/// The calling thread's id (0 when `/proc` cannot say).
pub fn current_tid() -> u32 {
    std::fs::read_link("/proc/thread-self").map_or(0, |task| tid_of(&task))
}

/// The thread id a `/proc/thread-self` link names (`<pid>/task/<tid>`), 0 when it names none.
fn tid_of(task: &Path) -> u32 {
    task.file_name()
        .and_then(|t| t.to_str())
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// CPU time consumed so far by the server under test, in nanoseconds.
pub type CpuClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Largest latency the histograms hold: one minute, in microseconds.
const MAX_LATENCY_US: u64 = 60_000_000;

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 min at 3 significant digits: constant bounds that hdrhistogram accepts
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("constant histogram bounds are valid")
}

/// A throwaway CA and a serving certificate for [`SERVER_NAME`], valid for an hour.
pub struct BenchCerts {
    /// The CA's certificate, PEM; clients trust it.
    pub ca_pem: String,
    /// The serving certificate, PEM.
    pub cert_pem: String,
    /// The serving certificate's private key, PEM.
    pub key_pem: String,
}

impl BenchCerts {
    /// Generates the CA and issues the serving certificate; fails only if certificate generation does.
    pub fn generate() -> Result<Self> {
        let ca = Ca::generate(&CaConfig {
            common_name: "bench".into(),
            validity: Duration::from_secs(3600),
        })
        .context("generating the benchmark CA")?;
        let cert = ca
            .issue_serving(&ServingSpec {
                dns_names: service_dns_names("nodewarden-webhook", "nodewarden"),
                ip_addresses: vec![],
                validity: Duration::from_secs(3600),
            })
            .context("issuing the benchmark serving certificate")?;
        Ok(BenchCerts {
            ca_pem: ca.cert_pem.clone(),
            cert_pem: cert.cert_pem,
            key_pem: cert.key_pem,
        })
    }
}

/// The admission router behind the TLS server, on one current-thread runtime in its own thread.
pub struct Server {
    /// The loopback address the server listens on.
    pub addr: SocketAddr,
    /// The server thread's id (for [`pin_thread`]).
    pub tid: u32,
    /// CPU time of the server's thread (`/proc/thread-self/schedstat`).
    pub cpu: CpuClock,
    stop: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts serving `routes` on a loopback port with the given certificate.
    pub fn start(cert_pem: &str, key_pem: &str, routes: Vec<Route>) -> Result<Server> {
        let resolver = Arc::new(CertResolver::default());
        resolver.set(
            certified_key(
                cert_pem.as_bytes(),
                key_pem.as_bytes(),
                Path::new("c"),
                Path::new("k"),
            )
            .context("loading the serving certificate")?,
        );
        let tls = server_config(resolver).context("building the TLS configuration")?;
        let stop = CancellationToken::new();
        let stop_server = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Result<(SocketAddr, PathBuf)>>();
        let thread = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(anyhow!("building the server runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                let bound = async {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .context("binding a loopback port")?;
                    let addr = listener.local_addr()?;
                    let task =
                        std::fs::read_link("/proc/thread-self").context("reading /proc/thread-self")?;
                    Ok::<_, anyhow::Error>((listener, addr, task))
                };
                let listener = match bound.await {
                    Ok((listener, addr, task)) => {
                        let _ = tx.send(Ok((addr, task)));
                        listener
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let app = admission::router(routes, Arc::new(Metrics::new()), 6 << 20);
                serve_tls(listener, tls, app, stop_server, Duration::from_secs(2)).await;
            });
        });
        let (addr, task) = rx.recv().context("the server thread ended before listening")??;
        let tid = tid_of(&task);
        let schedstat = Path::new("/proc").join(task).join("schedstat");
        let cpu: CpuClock = Arc::new(move || {
            std::fs::read_to_string(&schedstat)
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
                .unwrap_or(0)
        });
        Ok(Server {
            addr,
            tid,
            cpu,
            stop,
            thread,
        })
    }

    /// Stops the server and waits for its thread.
    pub fn shutdown(self) {
        self.stop.cancel();
        let _ = self.thread.join();
    }
}

/// CPU time of a whole process, in nanoseconds (utime + stime of `/proc/<pid>/stat`, at 100 Hz).
pub fn process_cpu_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 10_000_000
}

/// Resident set size in bytes (`VmRSS` of `/proc/<pid>/status`; `None` for this process).
pub fn resident_bytes(pid: Option<u32>) -> u64 {
    let file = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Which protocols the client offers by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 only.
    H2,
    /// HTTP/1.1 only.
    Http1,
    /// Both, HTTP/2 first: the server picks.
    Either,
}

#[derive(Clone)]
enum Sender {
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One keep-alive TLS connection; clones share it (HTTP/1.1: one request in flight at a time).
#[derive(Clone)]
pub struct Conn {
    sender: Sender,
    authority: Arc<str>,
}

/// Connects to `addr`, trusting `ca_pem` and checking the certificate for `server_name`.
pub async fn connect(addr: SocketAddr, ca_pem: &str, server_name: &str, alpn: Alpn) -> Result<Conn> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.context("reading the CA bundle")?)?;
    }
    // The cipher suites in the order the kube-apiserver's client (Go's crypto/tls, on a CPU with
    // AES instructions) offers them, AES-128-GCM first; rustls offers AES-256-GCM first. The
    // server takes the client's order, so this is what it deciphers in a cluster.
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|s| as_go_orders(s.suite()));
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = match alpn {
        Alpn::H2 => vec![b"h2".to_vec()],
        Alpn::Http1 => vec![b"http/1.1".to_vec()],
        Alpn::Either => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(server_name)
        .with_context(|| format!("{server_name:?} is not a DNS name or IP address"))?
        .to_owned();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let sender = if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        Sender::H2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        Sender::H1(Arc::new(tokio::sync::Mutex::new(sender)))
    };
    Ok(Conn {
        sender,
        authority: server_name.into(),
    })
}

/// Where Go's crypto/tls puts a cipher suite in its default order when the CPU has AES
/// instructions (lower first); suites Go does not offer by default last.
fn as_go_orders(suite: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as S;
    match suite {
        S::TLS13_AES_128_GCM_SHA256 => 0,
        S::TLS13_AES_256_GCM_SHA384 => 1,
        S::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => 3,
        S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 4,
        S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => 5,
        S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 6,
        S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => 7,
        S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => 8,
        _ => 9,
    }
}

impl Conn {
    /// Whether the server has closed this connection (as HTTP/1.1 does after answering a body
    /// over the limit); a client opens a new one then.
    pub fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H2(s) => s.is_closed(),
            Sender::H1(s) => s.try_lock().is_ok_and(|s| s.is_closed()),
        }
    }

    /// Whether the connection speaks HTTP/2 (the server chose `h2` by ALPN).
    pub fn is_h2(&self) -> bool {
        matches!(self.sender, Sender::H2(_))
    }

    /// POSTs one review to `path`; the whole answer if the status is 2xx, else `None`.
    pub async fn send(&self, path: &str, body: Bytes) -> Option<Bytes> {
        let req = http::Request::post(format!("https://{}{path}", self.authority))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .ok()?;
        let resp = match &self.sender {
            Sender::H2(s) => s.clone().send_request(req).await,
            Sender::H1(s) => {
                let mut s = s.lock().await;
                s.ready().await.ok()?;
                s.send_request(req).await
            }
        }
        .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        Some(resp.into_body().collect().await.ok()?.to_bytes())
    }
}

impl Conn {
    /// POSTs `body` to `path`: the status and the whole answer, or why there was none (the
    /// connection failed or closed).
    pub async fn send_status(&self, path: &str, body: Bytes) -> Result<(u16, Bytes), String> {
        let req = http::Request::post(format!("https://{}{path}", self.authority))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let resp = match &self.sender {
            Sender::H2(s) => s.clone().send_request(req).await,
            Sender::H1(s) => {
                let mut s = s.lock().await;
                s.ready().await.map_err(|e| e.to_string())?;
                s.send_request(req).await
            }
        }
        .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

/// Counts any 2xx answer as a success.
pub fn any_answer(_: &[u8]) -> bool {
    true
}

/// Counts an AdmissionReview answer carrying a patch as a success.
pub fn patched(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["response"]["patch"].is_string())
}

/// What one phase sends, where, and how it is judged.
pub struct Load {
    /// Requests go round-robin over these connections.
    pub conns: Vec<Conn>,
    /// The request path, such as an admission route.
    pub path: &'static str,
    /// Request bodies, taken in turn.
    pub bodies: Arc<[Bytes]>,
    /// Whether an answer counts as a success (its latency is recorded) or a failure.
    pub accept: fn(&[u8]) -> bool,
    /// The server's CPU clock.
    pub cpu: CpuClock,
}

/// The outcome of one phase.
pub struct Phase {
    /// Requests answered with an accepted answer.
    pub reviews: u64,
    /// Requests that failed or whose answer was not accepted.
    pub failures: u64,
    /// Wall time of the phase.
    pub wall: Duration,
    /// CPU time the server's thread used during the phase.
    pub server_cpu: Duration,
    /// Latency of each successful review, in microseconds.
    pub latency: Histogram<u64>,
    /// How late each request's task first ran after the request was due, in microseconds: the
    /// client's own share of the latency on the sending side (open loop; empty in the closed
    /// loop). When its tail nears the latency's, the client, not the server, set the tail.
    pub start_lag: Histogram<u64>,
}

impl Phase {
    /// Successful reviews per second of wall time.
    pub fn rate(&self) -> f64 {
        self.reviews as f64 / self.wall.as_secs_f64()
    }

    /// Server CPU time as a share of wall time (1.0 = one core fully used).
    pub fn cpu_share(&self) -> f64 {
        self.server_cpu.as_secs_f64() / self.wall.as_secs_f64()
    }

    /// Successful reviews per second of server CPU time (0 when no CPU time was seen).
    pub fn per_core(&self) -> f64 {
        if self.server_cpu.is_zero() {
            0.0
        } else {
            self.reviews as f64 / self.server_cpu.as_secs_f64()
        }
    }

    /// Latency at quantile `q`, in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }

    /// Largest latency, in milliseconds.
    pub fn max_ms(&self) -> f64 {
        self.latency.max() as f64 / 1000.0
    }

    /// Start lag ([`Phase::start_lag`]) at quantile `q`, in milliseconds (0 in the closed loop).
    pub fn lag_ms(&self, q: f64) -> f64 {
        self.start_lag.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Sends one review; its latency if the answer is accepted.
async fn one(conn: &Conn, path: &str, body: Bytes, accept: fn(&[u8]) -> bool) -> Option<Duration> {
    let t = Instant::now();
    let answer = conn.send(path, body).await?;
    accept(&answer).then(|| t.elapsed())
}

impl Load {
    /// Closed loop: `concurrency` workers, each sending back to back until `duration` is over.
    pub async fn closed_loop(&self, duration: Duration, concurrency: usize) -> Phase {
        let next = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + duration;
        let cpu0 = (self.cpu)();
        let started = Instant::now();
        let mut workers = Vec::new();
        for w in 0..concurrency {
            let conn = self.conns[w % self.conns.len()].clone();
            let (bodies, next, failed) = (self.bodies.clone(), next.clone(), failed.clone());
            let (path, accept) = (self.path, self.accept);
            workers.push(tokio::spawn(async move {
                let mut hist = histogram();
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let body = bodies[i % bodies.len()].clone();
                    match one(&conn, path, body, accept).await {
                        Some(took) => {
                            done += 1;
                            let _ = hist.record(took.as_micros() as u64);
                        }
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                (done, hist)
            }));
        }
        let mut latency = histogram();
        let mut reviews = 0;
        for w in workers {
            if let Ok((done, hist)) = w.await {
                reviews += done;
                let _ = latency.add(hist);
            }
        }
        Phase {
            reviews,
            failures: failed.load(Ordering::Relaxed),
            wall: started.elapsed(),
            server_cpu: Duration::from_nanos((self.cpu)().saturating_sub(cpu0)),
            latency,
            start_lag: histogram(),
        }
    }

    /// Open loop: request `n` is due at `n / rate` seconds after the start and is sent then,
    /// whether or not earlier ones have finished. The loop waits for each request's time on a
    /// [`PreciseTimer`] in the runtime's own poll (microseconds, not the runtime's 1 ms tick,
    /// which released each millisecond's requests in one burst) and spawns it: on a
    /// current-thread runtime nothing but the runtime's thread wakes for a request (a pacing
    /// thread cost the client's core 10–15 % at 10,000/s, and a wake-up of the runtime per
    /// request). Latency runs from when the request was due to the last byte of its answer, not
    /// from when its task first ran: a client (or server) that falls behind shows its queueing
    /// in the tail instead of hiding it (no coordinated omission; the correction wrk2 and
    /// HdrHistogram make). How late each task first ran is kept apart ([`Phase::start_lag`]).
    pub async fn open_loop(&self, duration: Duration, rate: f64) -> Phase {
        let failed = Arc::new(AtomicU64::new(0));
        // per request: how late its task started, and its latency if the answer was accepted
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Option<u64>)>();
        let cpu0 = (self.cpu)();
        let timer = PreciseTimer::new();
        let started = Instant::now();
        let total = (duration.as_secs_f64() * rate.max(0.0)) as u64;
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..total {
            let due_at = started + Duration::from_secs_f64(n as f64 / rate);
            timer.sleep_until(due_at).await;
            let conn = self.conns[n as usize % self.conns.len()].clone();
            let body = self.bodies[n as usize % self.bodies.len()].clone();
            let (path, accept, tx, failed) = (self.path, self.accept, tx.clone(), failed.clone());
            tasks.spawn(async move {
                let lag = due_at.elapsed().as_micros() as u64;
                let answer = conn.send(path, body).await;
                let took = answer
                    .filter(|a| accept(a))
                    .map(|_| due_at.elapsed().as_micros() as u64);
                if took.is_none() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                let _ = tx.send((lag, took));
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
        drop(tx);
        let wall = started.elapsed();
        let (mut latency, mut start_lag) = (histogram(), histogram());
        let mut reviews = 0;
        while let Some((lag, took)) = rx.recv().await {
            let _ = start_lag.record(lag);
            if let Some(us) = took {
                let _ = latency.record(us);
                reviews += 1;
            }
        }
        Phase {
            reviews,
            failures: failed.load(Ordering::Relaxed),
            wall,
            server_cpu: Duration::from_nanos((self.cpu)().saturating_sub(cpu0)),
            latency,
            start_lag,
        }
    }
}

/// A one-shot timer of microsecond precision that the runtime polls with its sockets: a
/// timerfd (Tokio's own timers tick in milliseconds). Falls back to Tokio's timer, with a
/// warning, where no timerfd can be made.
struct PreciseTimer(Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>);

impl PreciseTimer {
    // `AsyncFd::new` is deprecated because a caller could close the descriptor while it is
    // registered; the `OwnedFd` here is moved into the `AsyncFd`, which deregisters it before
    // dropping it, and `register`, its replacement, is `unsafe` (forbidden in this workspace).
    #[allow(deprecated)]
    fn new() -> Self {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .map_err(std::io::Error::from)
        .and_then(tokio::io::unix::AsyncFd::new);
        match fd {
            Ok(fd) => PreciseTimer(Some(fd)),
            Err(err) => {
                // a bench tool's warning: on its terminal, with or without a log subscriber
                eprintln!("loadgen: no timerfd ({err}): requests are released on Tokio's 1 ms timer");
                PreciseTimer(None)
            }
        }
    }

    /// Returns at `due` (at once when it has passed), on Tokio's timer if the timerfd fails.
    async fn sleep_until(&self, due: Instant) {
        let Some(wait) = due
            .checked_duration_since(Instant::now())
            .filter(|w| !w.is_zero())
        else {
            return;
        };
        let on_fd = match &self.0 {
            Some(fd) => Self::wait_on(fd, wait).await,
            None => Err(std::io::ErrorKind::Unsupported.into()),
        };
        if on_fd.is_err() {
            tokio::time::sleep_until(due.into()).await;
        }
    }

    /// Arms the timerfd to fire once after `wait` and waits until it has.
    async fn wait_on(
        fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        wait: Duration,
    ) -> std::io::Result<()> {
        Self::fire_once_in(fd, wait)?;
        loop {
            let mut ready = fd.readable().await?;
            let mut expirations = [0u8; 8];
            match ready
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut expirations).map_err(std::io::Error::from))
            {
                Ok(read) => return read.map(drop),
                // woken without an expiration to read: wait again
                Err(_would_block) => continue,
            }
        }
    }

    fn fire_once_in(
        fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        wait: Duration,
    ) -> std::io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let value = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(wait.subsec_nanos()),
            },
        };
        timerfd_settime(fd.get_ref(), TimerfdTimerFlags::empty(), &value)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{AdmissionRequest, AdmissionResponse};

    fn allow(request: &AdmissionRequest) -> AdmissionResponse {
        AdmissionResponse::allow(&request.uid)
    }

    const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"default","operation":"CREATE","userInfo":{"username":"loadgen"},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}}}"#;

    /// A client that falls behind shows it. Its one thread is blocked for a while just after
    /// the first request: the requests due meanwhile go out late, and their latency runs from
    /// when they were due (so it holds the stall), not from when they were sent; their start
    /// lag says the delay was the client's. Every request due is sent and answered.
    #[tokio::test]
    async fn the_open_loop_counts_a_stalled_client_in_the_latency() {
        const STALL: Duration = Duration::from_millis(200);
        let certs = BenchCerts::generate().expect("certificates");
        let server = Server::start(&certs.cert_pem, &certs.key_pem, vec![Route::new("/allow", allow)])
            .expect("server");
        let conn = connect(server.addr, &certs.ca_pem, SERVER_NAME, Alpn::H2)
            .await
            .expect("connected");
        let load = Load {
            conns: vec![conn],
            path: "/allow",
            bodies: Arc::from([Bytes::from_static(REVIEW.as_bytes())]),
            accept: any_answer,
            cpu: server.cpu.clone(),
        };
        // runs at the open loop's first wait (for the request due 10 ms in), just after the first
        // request was spawned
        tokio::spawn(async { std::thread::sleep(STALL) });
        let phase = load.open_loop(Duration::from_millis(500), 100.0).await;
        drop(load);
        tokio::task::spawn_blocking(move || server.shutdown())
            .await
            .expect("server stopped");

        assert_eq!(
            (phase.reviews, phase.failures),
            (50, 0),
            "every request due answered"
        );
        assert_eq!(phase.start_lag.len(), 50, "a start lag for every request");
        // the request due 10 ms in could not be sent before the stall ended, 200 ms in
        let least = (STALL - Duration::from_millis(10)).as_secs_f64() * 1000.0;
        assert!(
            phase.max_ms() >= least,
            "the stall is missing from the latency: max {} ms",
            phase.max_ms()
        );
        assert!(
            phase.lag_ms(1.0) >= least,
            "the stall is missing from the start lag: max {} ms",
            phase.lag_ms(1.0)
        );
        assert!(
            phase.max_ms() >= phase.lag_ms(1.0) - 1.0,
            "latency includes the lag"
        );
    }
}
