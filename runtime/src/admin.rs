//! The plain-HTTP admin port: `/livez`, `/readyz`, `/metrics`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Named readiness conditions; ready when every one of them holds.
#[derive(Debug, Default)]
pub struct Readiness {
    conditions: Mutex<BTreeMap<&'static str, bool>>,
}

impl Readiness {
    /// Adds a condition that starts unmet.
    pub fn require(&self, name: &'static str) {
        self.lock().entry(name).or_insert(false);
    }

    /// Sets a condition, adding it if it is new.
    pub fn set(&self, name: &'static str, ok: bool) {
        self.lock().insert(name, ok);
    }

    /// Whether every condition holds, and the ones that do not.
    pub fn check(&self) -> (bool, Vec<&'static str>) {
        let unmet: Vec<_> = self
            .lock()
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(n, _)| *n)
            .collect();
        (unmet.is_empty(), unmet)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, bool>> {
        self.conditions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The OpenMetrics text of a binary's metrics.
pub type MetricsText = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: MetricsText,
}

/// The admin routes: `/livez` always answers, `/readyz` answers 503 naming the unmet
/// conditions, `/metrics` serves `metrics()`.
pub fn router(readiness: Arc<Readiness>, metrics: MetricsText) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { readiness, metrics })
}

/// Most connections open on the admin port at once. At the limit, a new connection closes the
/// oldest open one if that is at least [`ADMIN_EVICT_AFTER`] old (a probe or a scrape takes a
/// few milliseconds; a connection open longer is idle, slow or hostile) and takes its slot, so a
/// probe is never locked out by clients that hold connections; otherwise it waits for a slot.
/// Each costs at most [`ADMIN_MAX_BUF_BYTES`] of buffer: 128 are at most 2 MiB.
pub const ADMIN_MAX_CONNECTIONS: usize = 128;
/// See [`ADMIN_MAX_CONNECTIONS`].
pub const ADMIN_EVICT_AFTER: Duration = Duration::from_millis(10);
/// How long a client may take to send a request's head (request line and headers).
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head, and the most hyper buffers per connection (its default is about
/// 400 KB; a probe's request is about 100 bytes).
pub const ADMIN_MAX_BUF_BYTES: usize = 16 * 1024;
/// A connection is asked to close (after its request in flight) this long after it opened,
/// and dropped 5 s later if it has not: a scraper reconnects, an idle or stalled one goes.
pub const ADMIN_MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// After `stop`, how long open connections may take to finish their requests.
const ADMIN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` (plain HTTP/1.1) on `listener` until `stop`, then lets in-flight requests finish
/// (at most 5 s). Unauthenticated clients reach this port, so it is bounded: at most
/// [`ADMIN_MAX_CONNECTIONS`] connections (the oldest closes for a new one), heads of at most
/// [`ADMIN_MAX_BUF_BYTES`] sent within [`ADMIN_HEADER_READ_TIMEOUT`], connections at most
/// [`ADMIN_MAX_CONNECTION_AGE`] old. It shares the process with what it reports on: without these
/// limits a client could exhaust the process's memory through it.
pub fn serve(listener: TcpListener, app: Router, stop: CancellationToken) -> JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(ADMIN_HEADER_READ_TIMEOUT)
            .max_buf_size(ADMIN_MAX_BUF_BYTES)
            .keep_alive(true);
        let http = Arc::new(http);
        let slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
        // open connections, oldest first
        let open: Arc<Mutex<VecDeque<(u64, std::time::Instant, CancellationToken)>>> = Arc::default();
        let tasks = tokio_util::task::TaskTracker::new();
        let mut next_id = 0u64;
        loop {
            let (tcp, _) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        tracing::warn!(%err, "admin port: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let permit = match slots.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    let mut retry = tokio::time::interval(ADMIN_EVICT_AFTER);
                    let permit = loop {
                        tokio::select! {
                            _ = stop.cancelled() => break None,
                            permit = slots.clone().acquire_owned() => break permit.ok(),
                            _ = retry.tick() => {
                                let mut open = lock(&open);
                                if open.front().is_some_and(|(_, since, _)| since.elapsed() >= ADMIN_EVICT_AFTER)
                                    && let Some((_, _, oldest)) = open.pop_front()
                                {
                                    oldest.cancel();
                                }
                            }
                        }
                    };
                    match permit {
                        Some(permit) => permit,
                        None => break,
                    }
                }
            };
            let id = next_id;
            next_id += 1;
            // cancelled to make room at the limit: the connection is dropped at once
            let evict = CancellationToken::new();
            lock(&open).push_back((id, std::time::Instant::now(), evict.clone()));
            let (http, app, open, stop) = (http.clone(), app.clone(), open.clone(), stop.clone());
            tasks.spawn(async move {
                let _permit = permit;
                let service = hyper_util::service::TowerToHyperService::new(app);
                let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
                tokio::pin!(conn);
                let age = tokio::time::sleep(ADMIN_MAX_CONNECTION_AGE);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = age => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(ADMIN_GRACE, conn.as_mut()).await;
                    }
                    _ = stop.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(ADMIN_GRACE, conn.as_mut()).await;
                    }
                    _ = evict.cancelled() => {}
                }
                lock(&open).retain(|(open_id, _, _)| *open_id != id);
            });
        }
        drop(listener);
        tasks.close();
        // every connection saw `stop` and is finishing its request
        let _ = tokio::time::timeout(ADMIN_GRACE * 2, tasks.wait()).await;
        Ok(())
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.check() {
        (true, _) => (StatusCode::OK, "ok\n".to_string()),
        (false, unmet) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", unmet.join(", ")),
        ),
    }
}

async fn metrics_text(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        (state.metrics)(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        let response = app.oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = response.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn probe(addr: std::net::SocketAddr, head: &[u8]) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.write_all(head).await?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    #[tokio::test]
    async fn the_port_is_bounded_and_a_probe_gets_through_clients_that_hold_it() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = router(Arc::new(Readiness::default()), Arc::new(|| "# EOF\n".to_string()));
        let stop = CancellationToken::new();
        let server = serve(listener, app, stop.clone());
        // more connections than the limit, each trickling a request head
        let mut held = Vec::new();
        for _ in 0..ADMIN_MAX_CONNECTIONS + 8 {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                .await
                .expect("write");
            held.push(tcp);
        }
        tokio::time::sleep(ADMIN_EVICT_AFTER).await;
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            probe(
                addr,
                b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            ),
        )
        .await
        .expect("answered while the port is held")
        .expect("probe");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
        // a request head larger than the buffer is refused, not buffered
        let mut big = b"GET /livez HTTP/1.1\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 64 * 1024));
        big.extend_from_slice(b"\r\n\r\n");
        let answer = probe(addr, &big).await.unwrap_or_default();
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
        drop(held);
        stop.cancel();
        server.await.expect("task").expect("served");
    }

    #[tokio::test]
    async fn readiness_names_the_unmet_conditions() {
        let readiness = Arc::new(Readiness::default());
        readiness.require("caches");
        readiness.set("certificates", true);
        let app = router(readiness.clone(), Arc::new(|| "# EOF\n".to_string()));
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (StatusCode::SERVICE_UNAVAILABLE, "not ready: caches\n".to_string())
        );
        readiness.set("caches", true);
        assert_eq!(
            get(app.clone(), "/readyz").await,
            (StatusCode::OK, "ok\n".to_string())
        );
        assert_eq!(get(app, "/metrics").await.1, "# EOF\n");
    }
}
