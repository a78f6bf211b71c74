//! The AdmissionReview pipeline driven through the axum router, without TLS.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use nodewarden_webhook::admission::{self, AdmissionRequest, AdmissionResponse, FailOpen, Route};
use nodewarden_webhook::metrics::Metrics;
use serde_json::{Value, json};
use tower::ServiceExt;

/// A DaemonSet pod CREATE as kube-apiserver 1.36 sent it to a webhook (recorded by the e2e harness).
const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");
const MAX_BODY: usize = 64 * 1024;

/// Denies pods in namespace `forbidden`, patches everything else with one annotation.
fn test_handler(req: &AdmissionRequest) -> AdmissionResponse {
    if req.namespace.as_deref() == Some("forbidden") {
        return AdmissionResponse::deny(&req.uid, 403, "Forbidden", "pods may not be created in forbidden");
    }
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"seen-by": "test"}}
    ]))
    .expect("patch");
    AdmissionResponse::allow("handler-may-get-the-uid-wrong")
        .with_patch(&patch)
        .expect("encode")
}

fn app(metrics: Arc<Metrics>) -> axum::Router {
    let routes = vec![
        Route::new("/mutate/test", test_handler),
        Route::new("/panics", |_: &AdmissionRequest| -> AdmissionResponse {
            panic!("handler bug")
        }),
        Route::new(
            "/panics-open",
            FailOpen(|_: &AdmissionRequest| -> AdmissionResponse { panic!("handler bug") }),
        ),
    ];
    admission::router(routes, metrics, MAX_BODY)
}

async fn post(path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    post_with(app(Arc::new(Metrics::new())), path, body).await
}

async fn post_with(app: axum::Router, path: &str, body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .expect("request");
    let resp = app.oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, bytes)
}

fn review() -> Value {
    serde_json::from_str(POD_REVIEW).expect("fixture parses")
}

fn uid() -> String {
    review()["request"]["uid"].as_str().expect("uid").to_string()
}

#[tokio::test]
async fn a_review_is_answered_with_its_uid_and_a_base64_json_patch() {
    let (status, body) = post("/mutate/test", POD_REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(
        out["response"]["uid"],
        uid().as_str(),
        "uid echoed even when the handler set another"
    );
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(out["response"]["patchType"], "JSONPatch");
    let patch = out["response"]["patch"]
        .as_str()
        .expect("patch is a base64 string, not a byte array");
    let resp: AdmissionResponse = serde_json::from_value(out["response"].clone()).expect("response");
    let decoded = resp.decoded_patch().expect("decodes");
    assert_eq!(
        serde_json::to_value(decoded).expect("json")[0]["value"]["seen-by"],
        "test"
    );
    assert!(!patch.is_empty());
}

#[tokio::test]
async fn a_denial_carries_code_and_message() {
    let mut r = review();
    r["request"]["namespace"] = json!("forbidden");
    let (status, body) = post("/mutate/test", r.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 403);
    assert_eq!(
        out["response"]["status"]["message"],
        "pods may not be created in forbidden"
    );
    assert!(out["response"].get("patch").is_none());
}

#[tokio::test]
async fn malformed_json_without_a_readable_uid_is_a_400_with_a_message() {
    let truncated = &POD_REVIEW[..POD_REVIEW.len() / 2];
    let (status, body) = post("/mutate/test", truncated.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let text = String::from_utf8(body).expect("utf8");
    assert!(text.starts_with("malformed AdmissionReview:"), "{text}");
}

#[tokio::test]
async fn a_wrong_shape_with_a_uid_is_denied_with_the_uid() {
    let mut r = review();
    r["request"]["operation"] = json!("EXPLODE");
    let (status, body) = post("/mutate/test", r.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["response"]["uid"], uid().as_str());
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 400);
    let message = out["response"]["status"]["message"].as_str().expect("message");
    assert!(
        message.contains("malformed AdmissionReview") && message.contains("EXPLODE"),
        "{message}"
    );
}

#[tokio::test]
async fn another_apiversion_or_kind_is_denied_naming_what_is_expected() {
    for (field, value) in [
        ("apiVersion", "admission.k8s.io/v1beta1"),
        ("kind", "TokenReview"),
    ] {
        let mut r = review();
        r[field] = json!(value);
        let (status, body) = post("/mutate/test", r.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        let out: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(out["response"]["allowed"], false);
        let message = out["response"]["status"]["message"].as_str().expect("message");
        assert!(
            message.contains(value) && message.contains("admission.k8s.io/v1 AdmissionReview"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn a_review_without_request_or_uid_is_a_400() {
    let (status, body) = post(
        "/mutate/test",
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("has no request"));
    let mut r = review();
    r["request"]["uid"] = json!("");
    let (status, body) = post("/mutate/test", r.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("empty uid"));
}

#[tokio::test]
async fn a_uid_over_128_bytes_is_a_400_that_does_not_echo_it() {
    // at the limit: answered, uid echoed
    let mut r = review();
    r["request"]["uid"] = json!("u".repeat(admission::MAX_UID_BYTES));
    let (status, body) = post("/mutate/test", r.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["response"]["uid"], "u".repeat(admission::MAX_UID_BYTES));
    // one past it, on a well-formed and on a malformed review: 400, the uid not in the answer
    let long = "u".repeat(60_000);
    let mut r = review();
    r["request"]["uid"] = json!(long);
    let mut malformed = review();
    malformed["request"]["uid"] = json!(long);
    malformed["request"]["operation"] = json!(42);
    for body in [r.to_string(), malformed.to_string()] {
        let (status, answer) = post("/mutate/test", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.contains("request.uid is 60000 bytes, longer than the limit of 128"),
            "{text}"
        );
        assert!(
            answer.len() < 1024,
            "the answer echoes the uid: {} bytes",
            answer.len()
        );
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413() {
    let mut r = review();
    r["request"]["object"]["metadata"]["annotations"] = json!({"big": "x".repeat(MAX_BODY)});
    let (status, _) = post("/mutate/test", r.to_string()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_path_without_a_handler_is_a_404_not_an_allow() {
    let (status, body) = post("/validate/nothing-here", POD_REVIEW).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let text = String::from_utf8(body).expect("utf8");
    assert!(
        text.contains("/validate/nothing-here") && text.contains("/mutate/test"),
        "{text}"
    );
    let empty = admission::router(Vec::new(), Arc::new(Metrics::new()), MAX_BODY);
    let (status, _) = post_with(empty, "/mutate/pods", POD_REVIEW).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_panicking_handler_answers_allowed_false_without_internals() {
    let (status, body) = post("/panics", POD_REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 500);
    let message = out["response"]["status"]["message"].as_str().expect("message");
    assert!(
        !message.contains("handler bug"),
        "no internals in the answer: {message}"
    );
}

#[tokio::test]
async fn a_panicking_fail_open_handler_admits_unchanged_with_a_warning_and_a_metric() {
    let metrics = Arc::new(Metrics::new());
    let (status, body) = post_with(app(metrics.clone()), "/panics-open", POD_REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    let out: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(out["response"]["uid"], uid().as_str());
    assert!(out["response"]["patch"].is_null(), "admitted unchanged: {out}");
    assert_eq!(out["response"]["warnings"][0], admission::FAILED_OPEN_WARNING);
    assert!(admission::FAILED_OPEN_WARNING.len() < 120);
    assert_eq!(
        out["response"]["auditAnnotations"]["failed-open"],
        "handler panicked"
    );
    let text = metrics.encode();
    let want = r#"nodewarden_admission_requests_total{route="/panics-open",outcome="failed_open"} 1"#;
    assert!(text.contains(want), "missing {want} in\n{text}");
}

#[tokio::test]
async fn outcomes_are_counted_per_route() {
    let metrics = Arc::new(Metrics::new());
    let mut denied = review();
    denied["request"]["namespace"] = json!("forbidden");
    for body in [
        POD_REVIEW.to_string(),
        POD_REVIEW.to_string(),
        denied.to_string(),
        "{".to_string(),
    ] {
        post_with(app(metrics.clone()), "/mutate/test", body).await;
    }
    let text = metrics.encode();
    for want in [
        r#"nodewarden_admission_requests_total{route="/mutate/test",outcome="patched"} 2"#,
        r#"nodewarden_admission_requests_total{route="/mutate/test",outcome="denied"} 1"#,
        r#"nodewarden_admission_requests_total{route="/mutate/test",outcome="invalid"} 1"#,
        r#"nodewarden_admission_duration_seconds_count{route="/mutate/test"} 4"#,
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
}

/// Corruptions of a real review: truncations and byte flips. None may panic or produce a 5xx.
#[tokio::test]
async fn corrupted_reviews_never_cause_a_5xx() {
    let bytes = POD_REVIEW.as_bytes();
    let mut bodies: Vec<Vec<u8>> = (0..bytes.len())
        .step_by(97)
        .map(|n| bytes[..n].to_vec())
        .collect();
    for (i, pos) in (0..bytes.len()).step_by(61).enumerate() {
        let mut b = bytes.to_vec();
        b[pos] = [b'"', b'{', b']', 0xff, b'\\', b'0'][i % 6];
        bodies.push(b);
    }
    bodies.push(Vec::new());
    bodies.push(b"null".to_vec());
    bodies.push(b"[]".to_vec());
    bodies.push(br#"{"request":{"uid":7}}"#.to_vec());
    let app = app(Arc::new(Metrics::new()));
    for body in bodies {
        let (status, answer) = post_with(app.clone(), "/mutate/test", body.clone()).await;
        assert!(
            status == StatusCode::OK || status.is_client_error(),
            "{status} for body starting {:?}",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
        if status == StatusCode::OK {
            let out: Value = serde_json::from_slice(&answer).expect("a 200 is always a review");
            assert!(out["response"]["uid"].is_string());
        }
    }
}

/// A large review is decided off the async workers: while its handler blocks, a small review on
/// the same single-threaded runtime is still answered. (Decided on the worker, the large one
/// would hold the only thread until its wait ran out, and answer "not released".)
#[tokio::test]
async fn a_large_review_does_not_hold_up_small_ones() {
    use std::sync::Mutex;
    use std::sync::mpsc;
    use std::time::Duration;

    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let blocking = move |req: &AdmissionRequest| -> AdmissionResponse {
        let waited = released
            .lock()
            .map(|r| r.recv_timeout(Duration::from_secs(60)).is_ok())
            .unwrap_or(false);
        if waited {
            AdmissionResponse::allow(&req.uid)
        } else {
            AdmissionResponse::deny(&req.uid, 500, "Timeout", "not released")
        }
    };
    let routes = vec![Route::new("/large", blocking), Route::new("/small", test_handler)];
    let app = admission::router(routes, Arc::new(Metrics::new()), 1 << 20);

    let mut large = review();
    large["request"]["object"]["metadata"]["annotations"] =
        json!({"padding": "x".repeat(admission::LARGE_REVIEW_BYTES)});
    let large = serde_json::to_vec(&large).expect("json");
    assert!(large.len() >= admission::LARGE_REVIEW_BYTES);
    let pending = tokio::spawn(post_with(app.clone(), "/large", large));

    let (status, body) = post_with(app, "/small", POD_REVIEW).await;
    assert_eq!(status, StatusCode::OK);
    let small: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(small["response"]["allowed"], true);
    release.send(()).expect("the large review's handler waits");

    let (status, body) = pending.await.expect("the large review's task");
    assert_eq!(status, StatusCode::OK);
    let large: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(large["response"]["allowed"], true, "{large}");
    assert_eq!(large["response"]["uid"], uid());
}

/// A handler that declares its view of the object: the pod's name, required.
struct NameOnly;

#[derive(serde::Deserialize)]
struct Named {
    metadata: NamedMeta,
}

#[derive(serde::Deserialize)]
struct NamedMeta {
    name: String,
}

impl admission::Handler for NameOnly {
    type Object = Named;
    type Extras = admission::Skipped;

    fn review(&self, request: &admission::Request<Self>) -> AdmissionResponse {
        let name = request.object.as_ref().map_or("", |o| o.metadata.name.as_str());
        AdmissionResponse::deny(&request.uid, 403, "Forbidden", format!("read {name}"))
    }
}

/// A handler that declares a view receives the request typed, read in one pass; a body that is
/// not a well-formed review gets the answer every handler gives it, and a review whose object
/// does not read as the view gets the default answer, a 400 naming the reader's error.
#[test]
fn a_handler_receives_the_view_it_declares_and_malformed_reviews_their_usual_answers() {
    use admission::{Endpoint, Processed};
    let answer = |handler: &dyn Endpoint, review: &Value| match handler.process(review.to_string().as_bytes())
    {
        Processed::Review(out, outcome, _) => Ok((out.response, outcome)),
        Processed::BadRequest(message) => Err(message),
    };
    let raw = |r: &AdmissionRequest| AdmissionResponse::allow(&r.uid);

    let mut named = review();
    named["request"]["object"]["metadata"]["name"] = json!("agent-x");
    let (read, outcome) = answer(&NameOnly, &named).expect("a review");
    assert_eq!(read.status.map(|s| s.message).as_deref(), Some("read agent-x"));
    assert_eq!(outcome, admission::Outcome::Denied);
    assert_eq!(read.uid, named["request"]["uid"]);

    let mut unnamed = review();
    unnamed["request"]["object"]["metadata"] = json!({"generateName": "agent-"});
    let (unreadable, outcome) = answer(&NameOnly, &unnamed).expect("a review");
    let status = unreadable.status.expect("a denial");
    assert_eq!(status.code, Some(400));
    assert!(
        status
            .message
            .starts_with("request.object could not be read: missing field `name`"),
        "{}",
        status.message
    );
    assert_eq!(outcome, admission::Outcome::Denied);
    // the usual handler admits the same review: only the view refused it
    assert!(answer(&raw, &unnamed).expect("a review").0.allowed);

    let mut malformed = Vec::new();
    let mut edit = |f: &dyn Fn(&mut Value)| {
        let mut r = review();
        f(&mut r);
        malformed.push(r);
    };
    edit(&|r| r["request"]["operation"] = json!("EXPLODE"));
    edit(&|r| r["request"]["userInfo"] = json!({"groups": "not a list"}));
    edit(&|r| r["request"]["uid"] = json!(""));
    edit(&|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1"));
    edit(&|r| r["request"]["uid"] = json!("u".repeat(admission::MAX_UID_BYTES + 1)));
    edit(&|r| drop(r.as_object_mut().map(|o| o.remove("request"))));
    for review in &malformed {
        let usual = answer(&raw, review);
        assert!(
            usual.as_ref().map_or(true, |(r, _)| !r.allowed),
            "{review}: {usual:?}"
        );
        assert_eq!(answer(&NameOnly, review), usual, "{review}");
    }
}
