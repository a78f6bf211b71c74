//! The generic AdmissionReview pipeline every capability plugs into.
//!
//! decode (the envelope and the handler's declared view of the object, in one pass) → check the
//! envelope → call the capability's [`Handler`] with the typed request → echo the uid → encode.
//! Each [`Route`] holds its handler behind [`Endpoint`], so the request type is fixed per path.
//! Bad input never panics and never becomes a 5xx: a review whose uid can be read gets HTTP 200
//! with `allowed: false` and a message; anything else gets a 4xx with a message.

pub mod review;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tracing::{Instrument, debug, info, info_span, warn};

pub use review::{
    AdmissionRequest, AdmissionResponse, Extras, Kept, Operation, ReviewIn, ReviewOut, Skipped, UserInfo,
};

/// A capability's admission decision: a pure function of the request (and whatever snapshot
/// of the caches the handler holds), or, through [`Handler::review_async`], of the request and
/// one bounded read from the API server.
///
/// A handler declares how it reads the request ([`Handler::Object`], [`Handler::Extras`]); the
/// pipeline decodes the envelope and that view of the object in one pass and hands it the typed
/// request ([`Request`]).
pub trait Handler: Send + Sync + 'static {
    /// How the request's `object` is read: `Box<RawValue>` keeps it as raw JSON (the handler
    /// parses what it needs, e.g. with [`AdmissionRequest::object_as`]); a view type reads only
    /// the fields the handler decides on, in the same pass as the envelope, so a large object is
    /// read once instead of scanned raw and then parsed again.
    type Object: DeserializeOwned + Send + Sync + 'static;
    /// What the handler keeps of the request's other fields: [`Kept`] (all) or [`Skipped`]
    /// (checked, not kept).
    type Extras: Extras;

    /// The answer to one request; it must not panic (the pipeline turns a panic into an error answer).
    fn review(&self, request: &Request<Self>) -> AdmissionResponse;

    /// Whether a fault in this handler (a panic) admits the request unchanged, as a webhook
    /// registered with `failurePolicy: Ignore` promises; otherwise it is denied with code 500.
    fn fails_open(&self) -> bool {
        false
    }

    /// The answer to one request, for handlers that must ask the API server before they decide
    /// (the eviction guard reads the evicted pod). The router awaits this; the default is
    /// [`Handler::review`]. Same contract: it must not panic, and a panic is answered as in
    /// [`Handler::fails_open`].
    fn review_async<'a>(&'a self, request: &'a Request<Self>) -> BoxFuture<'a, AdmissionResponse> {
        Box::pin(async move { self.review(request) })
    }

    /// The answer to a well-formed review whose object does not read as [`Handler::Object`]:
    /// the review decoded again with its object raw (a second pass, for such reviews only).
    /// The default denies it with code 400 and the reader's error; a handler with a raw object
    /// never gets here.
    fn review_unreadable(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let error = match request.object_as::<Self::Object>() {
            Err(error) => error,
            Ok(_) => "the request could not be read".to_string(),
        };
        deny_invalid(&request.uid, error)
    }
}

/// The request as `H` reads it.
pub type Request<H> = AdmissionRequest<<H as Handler>::Object, <H as Handler>::Extras>;

/// A handler whose faults admit the request unchanged ([`Handler::fails_open`]).
pub struct FailOpen<H>(pub H);

impl<H: Handler> Handler for FailOpen<H> {
    type Object = H::Object;
    type Extras = H::Extras;

    fn review(&self, request: &Request<Self>) -> AdmissionResponse {
        self.0.review(request)
    }

    fn fails_open(&self) -> bool {
        true
    }

    fn review_async<'a>(&'a self, request: &'a Request<Self>) -> BoxFuture<'a, AdmissionResponse> {
        self.0.review_async(request)
    }

    fn review_unreadable(&self, request: &AdmissionRequest) -> AdmissionResponse {
        self.0.review_unreadable(request)
    }
}

/// The warning of an answer that admitted a request because the handler failed.
pub const FAILED_OPEN_WARNING: &str =
    "nodewarden could not evaluate this request and admitted it unchanged (this webhook fails open)";

impl<F> Handler for F
where
    F: Fn(&AdmissionRequest) -> AdmissionResponse + Send + Sync + 'static,
{
    type Object = Box<RawValue>;
    type Extras = Kept;

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        self(request)
    }
}

/// A [`Handler`] behind the pipeline, its request type fixed by the handler: what a [`Route`]
/// holds. Every handler is one.
pub trait Endpoint: Send + Sync {
    /// [`process`] with this handler.
    fn process(&self, body: &[u8]) -> Processed;
    /// [`process_async`] with this handler.
    fn process_async<'a>(&'a self, body: &'a [u8]) -> BoxFuture<'a, Processed>;
}

impl<H: Handler> Endpoint for H {
    fn process(&self, body: &[u8]) -> Processed {
        process(body, self)
    }

    fn process_async<'a>(&'a self, body: &'a [u8]) -> BoxFuture<'a, Processed> {
        Box::pin(process_async(body, self))
    }
}

/// One admission endpoint.
#[derive(Clone)]
pub struct Route {
    /// URL path, e.g. `/validate/claims`.
    pub path: &'static str,
    /// What answers the reviews posted there.
    pub handler: Arc<dyn Endpoint>,
}

impl Route {
    /// A route at `path` served by `handler`.
    pub fn new(path: &'static str, handler: impl Handler) -> Self {
        Route {
            path,
            handler: Arc::new(handler),
        }
    }
}

/// Counts every answered review (the webhook's metrics, or nothing).
pub trait AdmissionObserver: Send + Sync {
    /// One review on `route` ended with `outcome` after `took`.
    fn observed(&self, route: &'static str, outcome: Outcome, took: std::time::Duration);
}

impl AdmissionObserver for () {
    fn observed(&self, _: &'static str, _: Outcome, _: std::time::Duration) {}
}

/// How a review ended, as counted in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed without a patch.
    Allowed,
    /// Allowed with a JSON patch.
    Patched,
    /// Denied by the handler.
    Denied,
    /// The review itself was malformed.
    Invalid,
    /// The handler failed; the review was answered with `allowed: false`.
    Error,
    /// The handler of a fail-open webhook failed; the review was allowed unchanged.
    FailedOpen,
}

impl Outcome {
    /// The `outcome` label of `nodewarden_admission_requests_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
            Outcome::FailedOpen => "failed_open",
        }
    }
}

/// Who and what a review was about, for spans and logs.
#[derive(Debug, Default, Clone)]
pub struct Ident {
    /// `request.kind.kind`.
    pub kind: String,
    /// `request.namespace`, empty for cluster-scoped objects.
    pub namespace: String,
    /// `request.name`, empty when the API server has not named the object yet.
    pub name: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'static str,
}

impl Ident {
    fn of<O, X: Extras>(request: &AdmissionRequest<O, X>) -> Self {
        Ident {
            kind: request.kind.kind.clone(),
            namespace: request.namespace.as_deref().unwrap_or_default().to_string(),
            name: request.name.as_deref().unwrap_or_default().to_string(),
            operation: request.operation.as_str(),
        }
    }
}

/// The result of running the pipeline on one body.
#[derive(Debug)]
pub enum Processed {
    /// An AdmissionReview answer (HTTP 200).
    Review(Box<ReviewOut>, Outcome, Ident),
    /// No uid could be read: HTTP 400 with this message.
    BadRequest(String),
}

/// A body read for a handler.
enum Read<H: Handler> {
    /// A well-formed review, its object read as the handler's view.
    Typed(Request<H>),
    /// A well-formed review whose object (or another field, as the handler reads it) does not
    /// read as the handler reads it, decoded again with its object raw (rare: boxed, so the
    /// usual variant stays small).
    Unreadable(Box<AdmissionRequest>),
    /// Not a well-formed review: its answer.
    Answered(Processed),
}

/// Runs the pipeline on one request body with [`Handler::review`]. Pure apart from logging.
pub fn process<H: Handler>(body: &[u8], handler: &H) -> Processed {
    let fails_open = handler.fails_open();
    match read::<H>(body) {
        Read::Typed(request) => {
            let decided =
                std::panic::catch_unwind(AssertUnwindSafe(|| handler.review(&request))).map_err(|_| ());
            finish(request, decided, fails_open)
        }
        Read::Unreadable(request) => {
            let decided = std::panic::catch_unwind(AssertUnwindSafe(|| handler.review_unreadable(&request)))
                .map_err(|_| ());
            finish(*request, decided, fails_open)
        }
        Read::Answered(answered) => answered,
    }
}

/// Runs the pipeline on one request body with [`Handler::review_async`]: what the router does.
pub async fn process_async<H: Handler>(body: &[u8], handler: &H) -> Processed {
    let fails_open = handler.fails_open();
    match read::<H>(body) {
        Read::Typed(request) => {
            // a panic while the future is made is caught too, not only while it runs
            let decided = AssertUnwindSafe(async { handler.review_async(&request).await })
                .catch_unwind()
                .await
                .map_err(|_| ());
            finish(request, decided, fails_open)
        }
        Read::Unreadable(request) => {
            let decided = std::panic::catch_unwind(AssertUnwindSafe(|| handler.review_unreadable(&request)))
                .map_err(|_| ());
            finish(*request, decided, fails_open)
        }
        Read::Answered(answered) => answered,
    }
}

/// `body` read as `H` reads a request: envelope and object in one pass. A body that does not
/// read so is decoded again the usual way (object raw, every field kept), which gives a
/// malformed review the same answer whatever the handler's view, and a well-formed one whose
/// object the view cannot read to [`Handler::review_unreadable`]. A body that is not UTF-8 is
/// decoded the usual way only.
fn read<H: Handler>(body: &[u8]) -> Read<H> {
    // Checked as UTF-8 once, then read as text: read as bytes, serde_json would check every
    // string it skips inside the raw `object` again.
    let text = std::str::from_utf8(body).ok();
    // a handler that reads the request the usual way has its answer in one decode
    let usual = std::any::TypeId::of::<Request<H>>() == std::any::TypeId::of::<AdmissionRequest>();
    if text.is_some() && !usual {
        match decode::<H::Object, H::Extras>(body, text) {
            Ok(request) => return Read::Typed(request),
            Err(Refused::Answered(answered)) => return Read::Answered(answered),
            Err(Refused::Malformed(_)) => {}
        }
    }
    match decode::<Box<RawValue>, Kept>(body, text) {
        Ok(request) if usual => match reread(request) {
            Some(request) => Read::Typed(request),
            None => Read::Answered(Processed::BadRequest("the request could not be read".to_string())),
        },
        Ok(request) => Read::Unreadable(Box::new(request)),
        Err(Refused::Answered(answered)) => Read::Answered(answered),
        Err(Refused::Malformed(error)) => Read::Answered(malformed(body, error)),
    }
}

/// `request` as the request type `R`, when it is that type (a handler that reads the request
/// the usual way).
fn reread<R: 'static>(request: AdmissionRequest) -> Option<R> {
    let mut request = Some(request);
    (&mut request as &mut dyn std::any::Any)
        .downcast_mut::<Option<R>>()
        .and_then(Option::take)
}

/// Why a body was not read as a request.
enum Refused {
    /// It is not a review as the reader reads it (serde_json's error).
    Malformed(serde_json::Error),
    /// It was read, but is not one the pipeline answers: its answer.
    Answered(Processed),
}

/// The request of a well-formed review, its object read as `O`.
/// `text` is `body` when it is UTF-8; a body that is not is read as bytes for serde_json's message.
fn decode<O: DeserializeOwned, X: Extras>(
    body: &[u8],
    text: Option<&str>,
) -> Result<AdmissionRequest<O, X>, Refused> {
    let parsed = match text {
        Some(text) => serde_json::from_str::<ReviewIn<O, X>>(text),
        None => serde_json::from_slice::<ReviewIn<O, X>>(body),
    };
    let review = parsed.map_err(Refused::Malformed)?;
    let answered = |p| Err(Refused::Answered(p));
    let Some(request) = review.request else {
        return answered(Processed::BadRequest(
            "AdmissionReview has no request: expected {\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{...}}".to_string(),
        ));
    };
    if request.uid.is_empty() {
        return answered(Processed::BadRequest(
            "AdmissionReview request has an empty uid".to_string(),
        ));
    }
    if request.uid.len() > MAX_UID_BYTES {
        return answered(Processed::BadRequest(format!(
            "malformed AdmissionReview: {}",
            uid_too_long(request.uid.len())
        )));
    }
    if review.api_version != review::API_VERSION || review.kind != review::KIND {
        let message = format!(
            "unsupported AdmissionReview version: got apiVersion {:?} kind {:?}, expected {} {}",
            review.api_version,
            review.kind,
            review::API_VERSION,
            review::KIND
        );
        return answered(Processed::Review(
            Box::new(ReviewOut::new(deny_invalid(&request.uid, message))),
            Outcome::Invalid,
            Ident::of(&request),
        ));
    }
    Ok(request)
}

/// The answer to a body that is not a well-formed review (`error`, serde_json's).
fn malformed(body: &[u8], error: serde_json::Error) -> Processed {
    let message = format!("malformed AdmissionReview: {error}");
    match uid_of(body) {
        Some(Ok(uid)) => Processed::Review(
            Box::new(ReviewOut::new(deny_invalid(&uid, message))),
            Outcome::Invalid,
            Ident::default(),
        ),
        Some(Err(len)) => Processed::BadRequest(format!("{message}; {}", uid_too_long(len))),
        None => Processed::BadRequest(message),
    }
}

/// The review answering `request` with the handler's answer, or `Err` when the handler panicked.
fn finish<O, X: Extras>(
    request: AdmissionRequest<O, X>,
    decided: Result<AdmissionResponse, ()>,
    fails_open: bool,
) -> Processed {
    let (mut response, outcome) = match decided {
        Ok(response) => {
            let outcome = if !response.allowed {
                Outcome::Denied
            } else if response.patch.is_some() {
                Outcome::Patched
            } else {
                Outcome::Allowed
            };
            (response, outcome)
        }
        Err(_) if fails_open => {
            tracing::error!(uid = %clip(&request.uid), "admission handler panicked; admitting unchanged (fail-open)");
            let mut allowed = AdmissionResponse::allow(&request.uid);
            allowed.warnings.push(FAILED_OPEN_WARNING.to_string());
            allowed
                .audit_annotations
                .insert("failed-open".to_string(), "handler panicked".to_string());
            (allowed, Outcome::FailedOpen)
        }
        Err(_) => {
            tracing::error!(uid = %clip(&request.uid), "admission handler panicked; answering allowed=false");
            (
                AdmissionResponse::deny(
                    &request.uid,
                    500,
                    "InternalError",
                    "nodewarden could not evaluate this request; see the webhook's logs",
                ),
                Outcome::Error,
            )
        }
    };
    // whatever the handler did, the uid must be the request's; who and what the review was
    // about is copied only when its outcome line will be written
    let ident = if outcome_logged(outcome) {
        Ident::of(&request)
    } else {
        Ident::default()
    };
    response.uid = request.uid;
    Processed::Review(Box::new(ReviewOut::new(response)), outcome, ident)
}

/// Longest `request.uid` answered, in bytes. The API server sends a UUID (36 characters); the
/// answer echoes the uid, so without a limit a client chose the size of every answer (a 60 KB
/// uid made a 60 KB answer) and the memory each answer held while it waited to be sent. A longer
/// uid is answered HTTP 400, and the uid is not echoed.
pub const MAX_UID_BYTES: usize = 128;

fn uid_too_long(len: usize) -> String {
    format!("request.uid is {len} bytes, longer than the limit of {MAX_UID_BYTES}")
}

fn deny_invalid(uid: &str, message: String) -> AdmissionResponse {
    AdmissionResponse::deny(uid, 400, "BadRequest", message)
}

/// The request uid of a body that is JSON but not a well-formed review, if it has one.
///
/// Read in one streaming pass that keeps nothing but the uid (borrowed from `body` unless it
/// has escapes): a malformed review costs about its own size, not a generic JSON tree of it.
/// `Err` holds the length of a uid longer than [`MAX_UID_BYTES`], which is not copied.
fn uid_of(body: &[u8]) -> Option<Result<String, usize>> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        request: Option<UidOnly<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct UidOnly<'a> {
        #[serde(borrow, default)]
        uid: Option<std::borrow::Cow<'a, str>>,
    }
    let envelope: Envelope<'_> = serde_json::from_slice(body).ok()?;
    let uid = envelope.request?.uid?;
    match uid.len() {
        0 => None,
        len if len > MAX_UID_BYTES => Some(Err(len)),
        _ => Some(Ok(uid.into_owned())),
    }
}

/// Reviews with a body of at least this many bytes are decided on the blocking thread pool, not
/// on the async workers: a large review's decoding and decision may take milliseconds, and
/// other connections must not wait behind it. Nearly every real review (a pod is a few KiB) is
/// below it and stays on the fast path.
pub const LARGE_REVIEW_BYTES: usize = 256 * 1024;

/// Most large reviews ([`LARGE_REVIEW_BYTES`]) decided at once; further ones wait for a turn,
/// at most until the server's request timeout answers them with 408. So large reviews, however
/// many arrive, occupy at most this many cores.
pub const LARGE_REVIEWS_AT_ONCE: usize = 2;

/// The first bytes of every request body are read freely: a real review (a pod is a few KiB)
/// never waits for memory. At the connection limit these are at most 512 × 64 KiB = 32 MiB.
pub const FREE_BODY_BYTES: usize = 64 * 1024;

/// Bytes of request bodies beyond [`FREE_BODY_BYTES`] held by all requests at once (bodies being
/// read and bodies being decided), or the largest body allowed if that is more. A request with a
/// larger body takes its share (its `content-length`, or the largest body when it sent none)
/// before reading past the free part; if the budget cannot give it, it waits, reading nothing
/// more (the client's TCP or HTTP/2 window fills), until others finish, at most until the
/// server's request timeout answers it with 408. Without it,
/// forty clients sending 6 MiB bodies at once took the process to 300 MiB, over the chart's
/// 256 MiB limit.
pub const BODY_BUDGET_BYTES: usize = 48 << 20;

/// The admission router: one POST route per capability, 404 for any other path. Bodies over
/// `max_body_bytes` get 413; all bodies together stay within [`BODY_BUDGET_BYTES`].
pub fn router(routes: Vec<Route>, metrics: Arc<dyn AdmissionObserver>, max_body_bytes: usize) -> Router {
    let paths: Arc<Vec<&'static str>> = Arc::new(routes.iter().map(|r| r.path).collect());
    let large_turns = Arc::new(tokio::sync::Semaphore::new(LARGE_REVIEWS_AT_ONCE));
    let bodies = Arc::new(BodyBudget::new(max_body_bytes));
    let mut app = Router::new();
    for route in routes {
        let state = RouteState {
            path: route.path,
            span: Arc::default(),
            handler: route.handler,
            metrics: metrics.clone(),
            large_turns: large_turns.clone(),
            bodies: bodies.clone(),
            max_body_bytes,
        };
        app = app.route(route.path, post(serve_review).with_state(state));
    }
    app.fallback(move |uri: Uri| {
        let paths = paths.clone();
        async move {
            let served = if paths.is_empty() {
                "none yet".to_string()
            } else {
                paths.join(", ")
            };
            (
                StatusCode::NOT_FOUND,
                format!("no admission handler at {}; served paths: {served}\n", uri.path()),
            )
        }
    })
    // the limit is enforced while reading (`read_body`); axum's own is lifted so the two agree
    .layer(DefaultBodyLimit::disable())
}

/// The shared allowance of body bytes beyond [`FREE_BODY_BYTES`], in KiB permits.
struct BodyBudget {
    kib: Arc<tokio::sync::Semaphore>,
    total_kib: usize,
}

impl BodyBudget {
    fn new(max_body_bytes: usize) -> Self {
        // at least one body of the largest size fits, so any allowed body can be read
        Self::of_kib(BODY_BUDGET_BYTES.max(max_body_bytes).div_ceil(1024))
    }

    fn of_kib(total_kib: usize) -> Self {
        let total_kib = total_kib.min(tokio::sync::Semaphore::MAX_PERMITS);
        BodyBudget {
            kib: Arc::new(tokio::sync::Semaphore::new(total_kib)),
            total_kib,
        }
    }
}

/// Why a body was not read whole.
enum BodyError {
    TooLarge(usize),
    Read(String),
}

/// Reads a request body of at most `max` bytes, drawing the part beyond [`FREE_BODY_BYTES`]
/// from the budget; the permit returned is held while the body lives.
async fn read_body(
    mut body: axum::body::Body,
    max: usize,
    budget: &BodyBudget,
) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), BodyError> {
    use http_body_util::BodyExt;
    let hint = axum::body::HttpBody::size_hint(&body);
    let exact = hint.exact().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if exact.is_some_and(|n| n > max) {
        return Err(BodyError::TooLarge(max));
    }
    // A request takes its whole share at once, never a part while waiting for the rest (forty
    // bodies each holding a part and waiting for more would wait for each other until the
    // timeout): its length when the client sent one, else the most a body may be.
    let share = |len: usize| {
        let kib = len
            .saturating_sub(FREE_BODY_BYTES)
            .div_ceil(1024)
            .min(budget.total_kib);
        u32::try_from(kib).unwrap_or(u32::MAX)
    };
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    let take = |kib: u32| {
        // the semaphore is never closed
        budget.kib.clone().acquire_many_owned(kib)
    };
    if let Some(len) = exact.filter(|&n| n > FREE_BODY_BYTES) {
        held = Some(
            take(share(len))
                .await
                .map_err(|e| BodyError::Read(e.to_string()))?,
        );
    }
    let mut buf = bytes::BytesMut::with_capacity(exact.unwrap_or(0).min(max));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        let len = buf.len().saturating_add(data.len());
        if len > max {
            return Err(BodyError::TooLarge(max));
        }
        if held.is_none() && len > FREE_BODY_BYTES {
            // no length given (or a wrong one): the largest share
            held = Some(
                take(share(max))
                    .await
                    .map_err(|e| BodyError::Read(e.to_string()))?,
            );
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf.freeze(), held))
}

#[derive(Clone)]
struct RouteState {
    path: &'static str,
    /// The route's span, made at its first request and entered by every request after it.
    span: Arc<std::sync::OnceLock<tracing::Span>>,
    handler: Arc<dyn Endpoint>,
    metrics: Arc<dyn AdmissionObserver>,
    large_turns: Arc<tokio::sync::Semaphore>,
    bodies: Arc<BodyBudget>,
    max_body_bytes: usize,
}

/// The pipeline on a large body: on the blocking pool, one of [`LARGE_REVIEWS_AT_ONCE`].
async fn process_large(state: &RouteState, body: Bytes, span: tracing::Span) -> Processed {
    // the semaphore is never closed; were it, the review would simply not wait
    let _turn = state.large_turns.acquire().await.ok();
    let handler = state.handler.clone();
    let runtime = tokio::runtime::Handle::current();
    let decided = tokio::task::spawn_blocking(move || {
        // async handlers (one bounded API read) are driven from this thread
        runtime.block_on(handler.process_async(&body).instrument(span))
    })
    .await;
    match decided {
        Ok(processed) => processed,
        // `process_async` catches the handler's panics; this is a fault of the pipeline itself
        Err(err) => {
            tracing::error!(%err, "deciding a large review failed");
            Processed::BadRequest("nodewarden could not evaluate this request".to_string())
        }
    }
}

async fn serve_review(State(state): State<RouteState>, body: axum::body::Body) -> Response {
    let started = Instant::now();
    // the permit is held until the answer is made: the body's bytes live that long
    let (body, _budget) = match read_body(body, state.max_body_bytes, &state.bodies).await {
        Ok(read) => read,
        Err(BodyError::TooLarge(max)) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the AdmissionReview is larger than the limit of {max} bytes\n"),
            )
                .into_response();
        }
        Err(BodyError::Read(err)) => {
            debug!(%err, "reading a request body failed");
            return (StatusCode::BAD_REQUEST, "could not read the request body\n").into_response();
        }
    };
    // handlers' own lines carry the route; the outcome line adds the request's identity. One
    // span per route, made once, so a request makes none and the log layer formats its field
    // once. A root span: it outlives the request that made it, so it takes no parent from it.
    let span = state
        .span
        .get_or_init(|| info_span!(parent: None, "admission", route = state.path))
        .clone();
    // the span is entered around each poll, never held across an await
    let processed = if body.len() >= LARGE_REVIEW_BYTES {
        process_large(&state, body, span.clone()).await
    } else {
        state.handler.process_async(&body).instrument(span.clone()).await
    };
    let _entered = span.enter();
    match processed {
        Processed::Review(out, outcome, ident) => {
            state.metrics.observed(state.path, outcome, started.elapsed());
            log_outcome(state.path, &out, outcome, &ident);
            match out.to_json() {
                Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
                Err(err) => {
                    tracing::error!(%err, "encoding the AdmissionReview response failed");
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "could not encode the response\n",
                    )
                        .into_response()
                }
            }
        }
        Processed::BadRequest(message) => {
            state
                .metrics
                .observed(state.path, Outcome::Invalid, started.elapsed());
            warn!(reason = %clip(&message), "rejected a malformed AdmissionReview");
            (StatusCode::BAD_REQUEST, format!("{message}\n")).into_response()
        }
    }
}

/// Whether the outcome line of a review that ended with `outcome` is written ([`log_outcome`]).
fn outcome_logged(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Allowed | Outcome::Patched => tracing::enabled!(tracing::Level::DEBUG),
        Outcome::Denied => tracing::enabled!(tracing::Level::INFO),
        Outcome::Invalid => tracing::enabled!(tracing::Level::WARN),
        Outcome::Error | Outcome::FailedOpen => tracing::enabled!(tracing::Level::ERROR),
    }
}

/// Longest request field or message written to a log line, in characters.
pub const LOG_FIELD_CHARS: usize = 256;

/// `text` as logged: at most [`LOG_FIELD_CHARS`] characters, then `…` and the original length.
pub fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(LOG_FIELD_CHARS) {
        None => std::borrow::Cow::Borrowed(text),
        Some((cut, _)) => std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

/// Writes the review's outcome line, if its level is on: in a span named `admission` holding
/// the route and the request's identity, as a child of the request's span.
///
/// Levels: a denial `info`, a malformed review `warn`, a handler's failure `error`; an allowed or
/// patched review `debug`. A line per admitted pod would be a line per pod the cluster creates;
/// what each review decided is counted in `nodewarden_admission_requests_total` instead, and the
/// API server's audit log records every patch a webhook makes.
///
/// The span is made with every field at once, so the JSON of its fields is encoded once, and
/// only when the line is logged.
fn log_outcome(route: &'static str, out: &ReviewOut, outcome: Outcome, ident: &Ident) {
    if !outcome_logged(outcome) {
        return;
    }
    // every field comes from the request: clipped, so one review cannot write a 10 MB line
    let span = info_span!(
        "admission",
        route,
        uid = clip(&out.response.uid).as_ref(),
        kind = clip(&ident.kind).as_ref(),
        namespace = clip(&ident.namespace).as_ref(),
        // not `name`: the JSON log writes the span's own name under that key
        object_name = clip(&ident.name).as_ref(),
        operation = ident.operation
    );
    let _entered = span.enter();
    let reason = clip(
        out.response
            .status
            .as_ref()
            .map(|s| s.message.as_str())
            .unwrap_or(""),
    );
    // the denial's text is `reason`: a field named `message` would be a second `message` key
    match outcome {
        Outcome::Allowed => debug!("allowed"),
        Outcome::Patched => debug!("patched"),
        Outcome::Denied => info!(%reason, "denied"),
        Outcome::Invalid => warn!(%reason, "invalid review"),
        Outcome::Error => tracing::error!(%reason, "handler error"),
        Outcome::FailedOpen => tracing::error!("handler error; admitted unchanged (fail-open)"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn body(len: usize) -> axum::body::Body {
        // in 16 KiB chunks and without a length, as an HTTP/2 body arrives
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![b'x'; len]
            .chunks(16 * 1024)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        axum::body::Body::from_stream(futures::stream::iter(chunks))
    }

    #[tokio::test]
    async fn small_bodies_take_nothing_from_the_budget_and_large_ones_give_it_back() {
        let budget = BodyBudget::of_kib(1024);
        let (bytes, permit) = read_body(body(FREE_BODY_BYTES), 1 << 20, &budget)
            .await
            .ok()
            .expect("read");
        assert_eq!(bytes.len(), FREE_BODY_BYTES);
        assert!(permit.is_none());
        let (bytes, permit) = read_body(body(FREE_BODY_BYTES + 100 * 1024), 1 << 20, &budget)
            .await
            .ok()
            .expect("read");
        assert_eq!(bytes.len(), FREE_BODY_BYTES + 100 * 1024);
        let held = 1024 - budget.kib.available_permits();
        assert!((100..=1024).contains(&held), "held {held} KiB");
        drop(permit);
        assert_eq!(budget.kib.available_permits(), 1024);
        // with a known length, exactly the part beyond the free bytes
        let known = axum::body::Body::from(vec![b'x'; FREE_BODY_BYTES + 100 * 1024]);
        let (_, permit) = read_body(known, 1 << 20, &budget).await.ok().expect("read");
        assert_eq!(budget.kib.available_permits(), 1024 - 100);
        drop(permit);
    }

    #[tokio::test]
    async fn a_body_waits_while_others_hold_the_budget() {
        let budget = BodyBudget::of_kib(600);
        let len = FREE_BODY_BYTES + 400 * 1024;
        let (_first, held) = read_body(body(len), 1 << 20, &budget).await.ok().expect("first");
        let second = read_body(body(len), 1 << 20, &budget);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), second.as_mut())
                .await
                .is_err(),
            "a second body was read beyond the budget"
        );
        drop(held);
        let (bytes, _) = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("read once the first was done")
            .ok()
            .expect("second");
        assert_eq!(bytes.len(), len);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_without_reading_it_all() {
        let budget = BodyBudget::of_kib(64);
        let refused = read_body(body(300 * 1024), 200 * 1024, &budget).await;
        assert!(matches!(refused, Err(BodyError::TooLarge(max)) if max == 200 * 1024));
        // what it held while being read is given back
        assert_eq!(budget.kib.available_permits(), 64);
    }
}
