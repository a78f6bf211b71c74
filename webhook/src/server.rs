//! The HTTPS listener: rustls, HTTP/2 and HTTP/1.1 by ALPN, keep-alive, graceful shutdown, and
//! the limits that keep a client from holding the server's connections or memory
//! ([`ServerLimits`]; what happens at each one is in docs/server.md).

use std::collections::{HashMap, hash_map};
use std::future::{Future, poll_fn};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use bytes::{Buf, Bytes};
use hyper::body::{Frame, Incoming, SizeHint};
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
pub mod frames;
pub mod sources;

/// The admission server's limits per connection and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections open at once; at the limit, the stalest makes room, else new ones wait
    /// in the listen backlog.
    pub max_connections: usize,
    /// Most connections one address holds while others hold some too; beyond it, one of its own
    /// stale connections makes room, else its new connection is closed at once.
    pub max_connections_per_source: usize,
    /// New connections one address may open a second (a token bucket of as many), checked before
    /// the TLS handshake; beyond it, a new connection is closed at once.
    pub max_connection_rate_per_source: u32,
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
    /// Most requests in flight on the whole server besides each connection's first one (which
    /// never waits for this); at the limit, further requests wait, reading nothing, until one
    /// ends or their request timeout answers them 408.
    pub max_requests_in_flight: usize,
    /// Most concurrent HTTP/2 streams a client may open on one connection.
    pub max_streams_per_connection: u32,
    /// How long an answer may wait to be sent (the client reads nothing, or opens no flow-control
    /// window) before its connection is closed; checked this often, so a stalled connection is
    /// closed between once and twice this after its answer was ready.
    pub write_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 512,
            max_connections_per_source: 128,
            max_connection_rate_per_source: 256,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            http2_keep_alive_interval: Duration::from_secs(30),
            http2_keep_alive_timeout: Duration::from_secs(10),
            max_requests_in_flight: 256,
            max_streams_per_connection: 32,
            write_timeout: Duration::from_secs(10),
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
    /// Answers made and not yet handed to the socket, by the parity of the watchdog's period
    /// they were made in ([`Activity::answers_stalled`]).
    unsent: [AtomicUsize; 2],
    period: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            since: Instant::now(),
            unsent: [AtomicUsize::new(0), AtomicUsize::new(0)],
            period: AtomicUsize::new(0),
        }
    }

    /// Called by the connection's watchdog once every write timeout: whether an answer made
    /// in the period before this one is still not sent, that is, has waited at least one whole
    /// period. Otherwise the next period begins (its answers count in the slot just found empty).
    ///
    /// Two counters and a period number, all atomics: an answer costs an increment and a
    /// decrement, no clock read, no lock. An answer that reads the period just as it ends counts
    /// in the older slot and is judged a period later, still at least a period after it was made.
    fn answers_stalled(&self) -> bool {
        let period = self.period.load(Ordering::SeqCst);
        if self.unsent[(period + 1) % 2].load(Ordering::SeqCst) > 0 {
            return true;
        }
        self.period.store(period.wrapping_add(1), Ordering::SeqCst);
        false
    }

    /// The connection's last sign of life: when a request last ended, or when it was accepted.
    fn progress(&self) -> Instant {
        self.last_end()
    }

    /// Whether no request has begun on the connection yet.
    fn never_began(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0 && self.last_end.load(Ordering::SeqCst) == 0
    }

    /// When a request last ended (when the connection began, before the first one did).
    fn last_end(&self) -> Instant {
        self.since + Duration::from_nanos(self.last_end.load(Ordering::SeqCst))
    }
}

struct InFlight(Arc<Activity>);

impl InFlight {
    /// A request begins; `true` when it is the only one in flight on its connection.
    fn begin(activity: &Arc<Activity>) -> (Self, bool) {
        let before = activity.in_flight.fetch_add(1, Ordering::SeqCst);
        (InFlight(activity.clone()), before == 0)
    }

    /// The request is answered: it is no longer in flight, and its answer is unsent until the
    /// guard returned is dropped (with the answer's last bytes, once they are written).
    fn answered(self) -> Unsent {
        let activity = self.0.clone();
        drop(self);
        let slot = activity.period.load(Ordering::SeqCst) % 2;
        activity.unsent[slot].fetch_add(1, Ordering::SeqCst);
        Unsent { activity, slot }
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

/// An answer not yet handed to the socket; counted in its connection's [`Activity`].
struct Unsent {
    activity: Arc<Activity>,
    slot: usize,
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.activity.unsent[self.slot].fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body whose last chunk carries the answer's [`Unsent`] guard, so the guard lives
/// exactly as long as hyper holds the answer's bytes: until HTTP/2 has written the last DATA
/// frame (a client that opens no flow-control window keeps it forever) or HTTP/1.1 has written
/// the body, or the connection ends. No allocation: the body is boxed once by axum already,
/// this wraps it by value.
struct Answer {
    body: Body,
    unsent: Option<Unsent>,
}

/// A chunk of an answer's body; the last one holds the answer's [`Unsent`] guard.
struct Chunk {
    bytes: Bytes,
    _unsent: Option<Unsent>,
}

impl Buf for Chunk {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }
    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }
    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
    }
}

impl hyper::body::Body for Answer {
    type Data = Chunk;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Chunk>, axum::Error>>> {
        let this = &mut *self;
        loop {
            let frame = match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(err)) => return Poll::Ready(Some(Err(err))),
                None => return Poll::Ready(None),
            };
            match frame.into_data() {
                Ok(bytes) => {
                    let last = hyper::body::Body::is_end_stream(&this.body);
                    let unsent = if last { this.unsent.take() } else { None };
                    return Poll::Ready(Some(Ok(Frame::data(Chunk {
                        bytes,
                        _unsent: unsent,
                    }))));
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.body)
    }
}

/// An open connection, as the [`Registry`] knows it.
struct Entry {
    id: u64,
    source: IpAddr,
    activity: Arc<Activity>,
    evict: CancellationToken,
}

impl Entry {
    /// The connection as one that may be closed to make room, if it is stale: it has not begun
    /// a request [`QUIET_EVICT_AFTER`] after it was accepted (a silent TCP connection, a
    /// handshake that never ends), or its last request ended (or, without one, it was accepted)
    /// at least [`EVICT_AFTER`] ago (an idle connection, or one trickling a request). Never one
    /// already asked to close.
    fn candidate(&self, now: Instant) -> Option<sources::Candidate> {
        if self.evict.is_cancelled() {
            return None;
        }
        let age = |at: Instant| now.saturating_duration_since(at);
        let activity = &self.activity;
        if activity.never_began() && age(activity.since) >= QUIET_EVICT_AFTER {
            return Some(sources::Candidate {
                source: self.source,
                quiet: true,
                stale_since: activity.since,
            });
        }
        let progress = activity.progress();
        (age(progress) >= EVICT_AFTER).then_some(sources::Candidate {
            source: self.source,
            quiet: false,
            stale_since: progress,
        })
    }
}

/// The open connections and how many each address holds, so that at a limit the right one can
/// make room.
#[derive(Default)]
struct Open {
    entries: Vec<Entry>,
    /// Connections not asked to close, per address; an address is here while it holds one, so
    /// this has at most as many entries as there are connections.
    held: HashMap<IpAddr, usize>,
}

impl Open {
    /// Asks the connection at `at` to close; it no longer counts for its address.
    fn evict(&mut self, at: usize) {
        let entry = &self.entries[at];
        entry.evict.cancel();
        release(&mut self.held, entry.source);
    }
}

fn release(held: &mut HashMap<IpAddr, usize>, source: IpAddr) {
    if let hash_map::Entry::Occupied(mut count) = held.entry(source) {
        *count.get_mut() -= 1;
        if *count.get() == 0 {
            count.remove();
        }
    }
}

/// The open connections, so that at the connection limit the stalest can make room.
#[derive(Default)]
struct Registry {
    open: Mutex<Open>,
    next: AtomicU64,
}

/// A connection's entry in the [`Registry`], removed when dropped.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

/// What the registry says of a new connection from an address at its share.
#[derive(Debug, PartialEq, Eq)]
enum AtShare {
    /// The address is the only one that holds connections: only the server's limit applies.
    Alone,
    /// One of its own stale connections was asked to close.
    MadeRoom,
    /// None of its connections is stale: the new one is to be closed.
    Full,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn register(
        self: &Arc<Self>,
        source: IpAddr,
        activity: Arc<Activity>,
        evict: CancellationToken,
    ) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut open = self.lock();
        open.entries.push(Entry {
            id,
            source,
            activity,
            evict,
        });
        *open.held.entry(source).or_insert(0) += 1;
        Registered {
            registry: self.clone(),
            id,
        }
    }

    /// For a new connection from `source`: when the address already holds `share` connections
    /// (not asked to close) and others hold some too, one of its own stale connections (quiet
    /// first, then the stalest) is asked to close, or, when none is stale, the caller is told to
    /// close the new one. `None` while the address is below its share.
    fn at_share(&self, source: IpAddr, share: usize) -> Option<AtShare> {
        let mut open = self.lock();
        if open.held.get(&source).copied().unwrap_or(0) < share {
            return None;
        }
        if open.held.len() == 1 {
            return Some(AtShare::Alone);
        }
        let now = Instant::now();
        let own = open
            .entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.source == source)
            .filter_map(|(at, entry)| Some((at, entry.candidate(now)?)));
        match sources::choose(own, |_| 0) {
            Some(at) => {
                open.evict(at);
                Some(AtShare::MadeRoom)
            }
            None => Some(AtShare::Full),
        }
    }

    /// At the server's connection limit, closes one stale connection ([`Entry::candidate`]) to
    /// make room: one of the address that holds the most connections, a quiet one before an
    /// idle one, the stalest first. `true` when one was asked to close.
    fn evict_stalest(&self) -> bool {
        let now = Instant::now();
        let mut open = self.lock();
        let candidates = open
            .entries
            .iter()
            .enumerate()
            .filter_map(|(at, entry)| Some((at, entry.candidate(now)?)));
        let held = &open.held;
        match sources::choose(candidates, |source| held.get(source).copied().unwrap_or(0)) {
            Some(at) => {
                open.evict(at);
                true
            }
            None => false,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.registry.lock();
        if let Some(at) = open.entries.iter().position(|entry| entry.id == self.id) {
            let entry = open.entries.swap_remove(at);
            // a connection asked to close no longer counted for its address
            if !entry.evict.is_cancelled() {
                release(&mut open.held, entry.source);
            }
        }
    }
}

/// At the connection limit, a connection whose last request ended (or that was accepted, if
/// none has) at least this long ago may be closed to make room for a new one. The API server's
/// connections in use end a request every few milliseconds; a connection that is idle or only
/// trickling a request is this stale.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// At the connection limit, a connection that has not begun a request this long after it was
/// accepted is closed first to make room for a new one: a TLS handshake and a request's head
/// take milliseconds.
pub const QUIET_EVICT_AFTER: Duration = Duration::from_millis(250);

/// An HTTP/2 stream's flow-control window: the most bytes of a request body a client may send
/// before the server has read them.
pub const STREAM_WINDOW_BYTES: u32 = 64 * 1024;

/// An HTTP/2 connection's flow-control window: the most request bytes all its streams may have
/// sent and the server not read. hyper's default is 1 MiB; 512 connections would hold 512 MiB
/// of bodies nobody reads (streams waiting for a turn, [`ServerLimits::max_requests_in_flight`]).
pub const CONNECTION_WINDOW_BYTES: u32 = 128 * 1024;

/// The largest request head (request line and headers) of an HTTP/1.1 client: hyper's read
/// buffer grows to this at most (its default is about 400 KB).
pub const HTTP1_MAX_BUF_BYTES: usize = 64 * 1024;

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
/// answer is not ready at the first poll, is such a timer. With this timer due at most `every`
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

/// Told of each connection the server closes early to stay fair to every address, with the
/// reason: `over-rate` and `share-full` (a new connection refused), `stalest-at-share` and
/// `stalest-at-limit` (an idle older connection closed to make room).
pub type Closed = Arc<dyn Fn(&'static str) + Send + Sync>;

/// How the server ends: `stop` stops accepting and drains (in-flight requests get the grace
/// period). `retire`, cancelled first (the webhook does so when it turns unready, a
/// `--shutdown-delay` before `stop`), tells its callers to go elsewhere while it still answers
/// every request: each HTTP/1.1 answer carries `Connection: close`, so a client's kept-alive
/// connection ends after its next answer instead of being closed under a request at `stop` (the
/// API server's HTTP/1.1 client does not retry a POST on a connection closed under it, and it
/// resolves a webhook Service to an endpoint only when it opens a connection, so a kept-alive
/// connection stays with its pod after the endpoint is gone); each HTTP/2 connection
/// gets a GOAWAY (its streams in flight finish, the client opens a new connection for the next
/// ones). New connections are still accepted and served until `stop`.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Cancelled when the server is to send its callers elsewhere (see above).
    pub retire: CancellationToken,
    /// Cancelled when the server is to stop accepting and drain.
    pub stop: CancellationToken,
}

impl From<CancellationToken> for Shutdown {
    /// A server that drains at `stop` with no retiring phase before.
    fn from(stop: CancellationToken) -> Self {
        Shutdown {
            retire: CancellationToken::new(),
            stop,
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled; then stops accepting,
/// lets in-flight requests finish for at most `grace`, and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: CancellationToken,
    grace: Duration,
) {
    serve_tls_with(
        listener,
        tls,
        app,
        shutdown,
        grace,
        ServerLimits::default(),
        Arc::new(|_| {}),
    )
    .await;
}

/// [`serve_tls`] with the given limits.
/// `shutdown` is a [`Shutdown`], or the token that stops it (no retiring phase).
pub async fn serve_tls_with(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    shutdown: impl Into<Shutdown>,
    grace: Duration,
    limits: ServerLimits,
    closed: Closed,
) {
    let Shutdown {
        retire,
        stop: shutdown,
    } = shutdown.into();
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(HTTP1_MAX_BUF_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keep_alive_interval)
        .keep_alive_timeout(limits.http2_keep_alive_timeout)
        .max_concurrent_streams(limits.max_streams_per_connection.max(1))
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES);
    let builder = Arc::new(builder);
    let max_connections = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let connections = Arc::new(Semaphore::new(max_connections));
    let requests = Arc::new(Semaphore::new(
        limits.max_requests_in_flight.min(Semaphore::MAX_PERMITS),
    ));
    let registry = Arc::new(Registry::default());
    let share = limits.max_connections_per_source.clamp(1, max_connections);
    let mut rate = sources::ConnectionRate::new(
        limits.max_connection_rate_per_source,
        max_connections,
        Instant::now(),
    );
    let write_timeout = limits.write_timeout.max(Duration::from_millis(10));
    // asks open connections to finish their requests and close
    let draining = CancellationToken::new();
    // drops the connections still open when the grace period is over
    let closing = CancellationToken::new();
    // every timer the server arms per request or connection is at least this long
    let shortest = limits
        .request_timeout
        .min(limits.header_read_timeout)
        .min(limits.tls_handshake_timeout)
        .min(write_timeout);
    // stopped when this function returns or its future is dropped
    let _armed = AbortOnDropHandle::new(tokio::spawn(keep_a_timer_armed(
        (shortest / 2).max(Duration::from_millis(1)),
    )));

    loop {
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
        // fair to every address: a new connection beyond its address's rate, or beyond its
        // share with none of its own stale, is closed at once (a reset: nothing kept for it)
        let source = sources::source_of(peer.ip());
        if !rate.admit(source, Instant::now()) {
            tracing::debug!(%peer, "closed: over the connection rate of its address");
            closed("over-rate");
            refuse(stream);
            continue;
        }
        match registry.at_share(source, share) {
            Some(AtShare::Full) => {
                tracing::debug!(%peer, "closed: its address holds its share of connections, all in use");
                closed("share-full");
                refuse(stream);
                continue;
            }
            Some(AtShare::MadeRoom) => {
                tracing::debug!(%peer, "at its address's share: closed its stalest connection");
                closed("stalest-at-share");
            }
            Some(AtShare::Alone) | None => {}
        }
        // at the limit, a stale connection of the address holding the most makes room for this
        // one; otherwise this one waits for a slot, and further ones wait in the listen backlog
        let permit = match connections.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let mut retry = tokio::time::interval(Duration::from_millis(250));
                let permit = loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break None,
                        permit = connections.clone().acquire_owned() => break permit.ok(),
                        _ = retry.tick() => {
                            if registry.evict_stalest() {
                                closed("stalest-at-limit");
                                tracing::debug!(%peer, "at the connection limit: closed a stale connection of the address holding the most");
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
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let draining = draining.clone();
        let closing = closing.clone();
        let retire = retire.clone();
        let requests = requests.clone();
        let activity = Arc::new(Activity::new());
        let evicted = CancellationToken::new();
        let registered = registry.register(source, activity.clone(), evicted.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _registered = registered;
            let tls = tokio::select! {
                _ = draining.cancelled() => return,
                _ = evicted.cancelled() => return,
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
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            // an HTTP/2 connection open when retiring begins gets a GOAWAY then; one opened
            // while retiring is served (its GOAWAY comes at the stop, as every connection's)
            let goaway_on_retire = h2 && !retire.is_cancelled();
            let per_request = activity.clone();
            let retiring = retire.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (in_flight, first) = InFlight::begin(&per_request);
                // a connection's first request in flight never waits; others take a turn of
                // the whole server's (an atomic when one is free)
                let turns = (!first).then(|| requests.clone());
                let answer = app.clone().oneshot(request.map(Body::new));
                // retiring when the request began: this HTTP/1.1 connection ends after its
                // answer (hyper closes it once written), the client's next request opens a new one
                let close = !h2 && retiring.is_cancelled();
                async move {
                    let answered = tokio::time::timeout(limits.request_timeout, async {
                        let _turn = match &turns {
                            // the semaphore is never closed; were it, the request would not wait
                            Some(turns) => turns.acquire().await.ok(),
                            None => None,
                        };
                        answer.await
                    })
                    .await;
                    let unsent = in_flight.answered();
                    let mut response = match answered {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => timed_out(limits.request_timeout),
                    };
                    if close {
                        response.headers_mut().insert(
                            axum::http::header::CONNECTION,
                            axum::http::HeaderValue::from_static("close"),
                        );
                    }
                    Ok::<_, std::convert::Infallible>(response.map(|body| Answer {
                        body,
                        unsent: Some(unsent),
                    }))
                }
            });
            // what the connection writes in one turn leaves in one TLS write (batch.rs); an
            // HTTP/2 client's control frames are counted as they are read (frames.rs)
            let frames = h2.then(|| frames::ControlFrames::new(frames::CONTROL_FRAMES_PER_SECOND));
            let (io, write_out) = batch::batched(tls, frames);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let mut asked_to_close = false;
            // answers and bytes that cannot leave are looked for once every write timeout
            let mut watchdog =
                tokio::time::interval_at((Instant::now() + write_timeout).into(), write_timeout);
            watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut written = 0;
            // a connection asked to close gets its in-flight requests' time and a write
            // timeout, then is dropped: a client may hold it open after GOAWAY
            let hard_close = tokio::time::sleep(Duration::ZERO);
            tokio::pin!(hard_close);
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
                let ask_to_close = tokio::select! {
                    ended = turn => break ended,
                    _ = closing.cancelled() => return,
                    _ = evicted.cancelled() => {
                        tracing::debug!(%peer, "closed to make room at the connection limit");
                        return;
                    }
                    _ = watchdog.tick() => {
                        if activity.answers_stalled() || write_out.stalled(&mut written) {
                            tracing::debug!(%peer, timeout = ?write_timeout, "closing a connection whose answers could not be sent");
                            return;
                        }
                        false
                    }
                    _ = &mut hard_close, if asked_to_close => {
                        tracing::debug!(%peer, "closing a connection that stayed open after it was asked to close");
                        return;
                    }
                    _ = draining.cancelled(), if !asked_to_close => true,
                    // retiring: an HTTP/2 client is told (GOAWAY) to open its next streams elsewhere
                    _ = retire.cancelled(), if goaway_on_retire && !asked_to_close => {
                        tracing::debug!(%peer, "retiring: GOAWAY to an HTTP/2 connection");
                        true
                    }
                    _ = idle_for(&activity, limits.idle_timeout), if !asked_to_close => {
                        tracing::debug!(%peer, "closing an idle connection");
                        true
                    }
                };
                if ask_to_close {
                    asked_to_close = true;
                    conn.as_mut().graceful_shutdown();
                    hard_close.as_mut().reset(
                        later(
                            Instant::now(),
                            limits.request_timeout.saturating_add(write_timeout),
                        )
                        .into(),
                    );
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
                Err(err) => match write_out.calmed() {
                    // too many control frames: GOAWAY with ENHANCE_YOUR_CALM, then close
                    Some((why, last_stream)) => {
                        tracing::debug!(%peer, %why, "closing a connection that sent too many control frames");
                        write_out.queue(&frames::goaway(last_stream, frames::ENHANCE_YOUR_CALM));
                        let close = poll_fn(|cx| write_out.poll_close(cx));
                        let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                    }
                    None => tracing::debug!(%peer, %err, "connection ended with an error"),
                },
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

/// Closes a connection refused before its handshake at once, with a reset (`SO_LINGER` 0), so
/// that the server keeps no `TIME_WAIT` entry for it.
fn refuse(stream: tokio::net::TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
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
