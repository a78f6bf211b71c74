//! The HTTPS listener: rustls, HTTP/2 and HTTP/1.1 by ALPN, keep-alive, graceful shutdown, and
//! the limits that keep a client from holding the server's connections or memory
//! ([`ServerLimits`]; what happens at each one is in docs/server.md).

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tower::ServiceExt;

mod batch;

/// The admission server's limits per connection and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections open at once; at the limit, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// How long a client may take to finish the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long an HTTP/1.1 client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a request may take from its headers to its answer (reading the body included).
    pub request_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is pinged.
    pub http2_keep_alive_interval: Duration,
    /// How long an HTTP/2 ping may go unanswered before the connection is closed.
    pub http2_keep_alive_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 512,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(10),
        }
    }
}

/// Requests in flight on one connection, and when the last one ended.
///
/// Nothing here wakes the connection's task: its idle check ([`idle_for`]) is one timer that
/// looks at these when it fires, so a request costs two atomic updates and a clock read, not a
/// timer of its own.
struct Activity {
    in_flight: AtomicUsize,
    /// When a request last ended, in nanoseconds after `since`.
    last_end: AtomicU64,
    since: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// When a request last ended (when the connection began, before the first one did).
    fn last_end(&self) -> Instant {
        self.since + Duration::from_nanos(self.last_end.load(Ordering::SeqCst))
    }
}

struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        let since = u64::try_from(activity.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        activity.last_end.fetch_max(since, Ordering::SeqCst);
        activity.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves once the connection has had no request in flight for `idle`.
///
/// One timer, re-armed only when it fires: to `idle` after the last request ended, or, with a
/// request in flight, to `idle` from now. The connection therefore closes `idle` after its last
/// request ended, give or take the timer's millisecond.
async fn idle_for(activity: &Activity, idle: Duration) {
    let check = tokio::time::sleep(idle);
    tokio::pin!(check);
    loop {
        check.as_mut().await;
        let now = Instant::now();
        let next = if activity.in_flight.load(Ordering::SeqCst) == 0 {
            let quiet_until = later(activity.last_end(), idle);
            if quiet_until <= now {
                return;
            }
            quiet_until
        } else {
            later(now, idle)
        };
        check.as_mut().reset(next.into());
    }
}

/// `at + by`, or about 30 years after `at` when that cannot be represented (the flags take
/// any duration).
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(30 * 365 * 86_400))
}

/// Keeps a timer armed in the runtime for as long as the server runs, `every` apart.
///
/// Tokio wakes its I/O driver (a write to an eventfd, and one more `epoll_wait` to take it back)
/// whenever a timer is armed with a deadline earlier than the driver's next wake, even while the
/// runtime is busy polling tasks (tokio-rs/tokio#5207). A request's timeout, armed whenever the
/// answer is not ready at the first poll, was such a timer: about one wasted system call pair for
/// every two reviews at 10,000 reviews/s (docs/benchmarks.md). With this timer due at most `every`
/// from now, every timer of at least `every` is due after the driver's next wake, and arming it
/// wakes nothing. It costs one wake-up every `every`.
async fn keep_a_timer_armed(every: Duration) {
    loop {
        tokio::time::sleep(every).await;
    }
}

/// Bytes read from a connection's socket at once, below TLS.
///
/// rustls asks for at most 4 KiB more than it holds, so a 10 KB review took three `recvfrom`
/// calls; with this buffer it takes one, at the cost of a copy and this much memory per open
/// connection (at most 8 MiB with the default `--max-connections`, docs/server.md).
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled; then stops accepting,
/// lets in-flight requests finish for at most `grace`, and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: CancellationToken,
    grace: Duration,
) {
    serve_tls_with(listener, tls, app, shutdown, grace, ServerLimits::default()).await;
}

/// [`serve_tls`] with the given limits.
pub async fn serve_tls_with(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: CancellationToken,
    grace: Duration,
    limits: ServerLimits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keep_alive_interval)
        .keep_alive_timeout(limits.http2_keep_alive_timeout)
        .max_concurrent_streams(256);
    let builder = Arc::new(builder);
    let max_connections = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let connections = Arc::new(Semaphore::new(max_connections));
    // asks open connections to finish their requests and close
    let draining = CancellationToken::new();
    // drops the connections still open when the grace period is over
    let closing = CancellationToken::new();
    // every timer the server arms per request or connection is at least this long
    let shortest = limits
        .request_timeout
        .min(limits.header_read_timeout)
        .min(limits.tls_handshake_timeout);
    // stopped when this function returns or its future is dropped
    let _armed = AbortOnDropHandle::new(tokio::spawn(keep_a_timer_armed(
        (shortest / 2).max(Duration::from_millis(1)),
    )));

    loop {
        // at the limit, wait for a connection to close before accepting the next one
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // e.g. too many open files: back off briefly rather than spin
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let draining = draining.clone();
        let closing = closing.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = tokio::select! {
                _ = draining.cancelled() => return,
                r = tokio::time::timeout(
                    limits.tls_handshake_timeout,
                    acceptor.accept(BufReader::with_capacity(READ_BUFFER_BYTES, stream)),
                ) => r,
            };
            let tls = match tls {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let activity = Arc::new(Activity::new());
            let per_request = activity.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let in_flight = InFlight::begin(&per_request);
                let answer = app.clone().oneshot(request.map(Body::new));
                async move {
                    let answered = tokio::time::timeout(limits.request_timeout, answer).await;
                    drop(in_flight);
                    Ok::<_, std::convert::Infallible>(match answered {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => timed_out(limits.request_timeout),
                    })
                }
            });
            // what the connection writes in one turn leaves in one TLS write (batch.rs)
            let (io, write_out) = batch::batched(tls);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let mut asked_to_close = false;
            let ended = loop {
                let turn = poll_fn(|cx| {
                    let polled = conn.as_mut().poll(cx);
                    if polled.is_pending() {
                        // the connection did all it could: its answers leave now. An error is
                        // kept for the connection's next read or write; poll it again to see it.
                        if let Poll::Ready(Err(err)) = write_out.poll_write_out(cx) {
                            tracing::debug!(%peer, %err, "writing to the connection failed");
                            cx.waker().wake_by_ref();
                        }
                    }
                    polled
                });
                tokio::select! {
                    ended = turn => break ended,
                    _ = closing.cancelled() => return,
                    _ = draining.cancelled(), if !asked_to_close => {
                        asked_to_close = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = idle_for(&activity, limits.idle_timeout), if !asked_to_close => {
                        tracing::debug!(%peer, "closing an idle connection");
                        asked_to_close = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            };
            match ended {
                // hyper shuts the stream down (which writes out) when it closes; this is for
                // a connection that ended without doing so
                // (bounded: a peer that reads nothing holds it at most --request-timeout, and
                // never past the grace period)
                Ok(()) => {
                    let last = poll_fn(|cx| write_out.poll_write_out(cx));
                    tokio::select! {
                        _ = tokio::time::timeout(limits.request_timeout, last) => {}
                        _ = closing.cancelled() => {}
                    }
                }
                Err(err) => tracing::debug!(%peer, %err, "connection ended with an error"),
            }
        });
    }
    drop(listener);
    draining.cancel();
    tracing::info!(grace = ?grace, "stopped accepting connections; waiting for in-flight requests");
    let all_closed = u32::try_from(max_connections).unwrap_or(u32::MAX);
    match tokio::time::timeout(grace, connections.acquire_many(all_closed)).await {
        Ok(_) => tracing::info!("all connections closed"),
        Err(_) => {
            tracing::warn!("grace period over; closing the remaining connections");
            closing.cancel();
        }
    }
}

fn timed_out(limit: Duration) -> Response<Body> {
    let mut response = Response::new(Body::from(format!(
        "the request was not read and answered within {}\n",
        humantime::format_duration(limit)
    )));
    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_what_an_instant_holds_is_thirty_years_out() {
        let now = Instant::now();
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(29 * 365 * 86_400));
        assert_eq!(later(now, Duration::from_secs(1)), now + Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_its_timeout_after_its_last_request_ended() {
        let idle = Duration::from_millis(150);
        let activity = Arc::new(Activity::new());
        let request = InFlight::begin(&activity);
        let busy = tokio::time::timeout(idle * 3, idle_for(&activity, idle)).await;
        assert!(busy.is_err(), "idle with a request in flight");

        drop(request);
        let ended = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), idle_for(&activity, idle))
            .await
            .expect("idle once the request ended");
        assert!(
            ended.elapsed() >= idle - Duration::from_millis(5),
            "idle too early"
        );
    }

    #[tokio::test]
    async fn a_request_that_ends_late_pushes_the_idle_check_back() {
        let idle = Duration::from_millis(200);
        let activity = Arc::new(Activity::new());
        let watch = {
            let activity = activity.clone();
            tokio::spawn(async move { idle_for(&activity, idle).await })
        };
        // a request starts and ends before the first check: the check moves to `idle` after it
        tokio::time::sleep(idle / 2).await;
        drop(InFlight::begin(&activity));
        let ended = Instant::now();
        watch.await.expect("the idle check ends");
        assert!(
            ended.elapsed() >= idle - Duration::from_millis(5),
            "idle too early"
        );
    }
}
