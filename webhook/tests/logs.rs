//! What the webhook writes to its JSON log for hostile reviews: one `message` key a line (the
//! denial's text under `reason`), one `name` key in the span (the object's is `object_name`),
//! and request fields clipped to 256 characters.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::Request;
use nodewarden_webhook::admission::{self, AdmissionRequest, AdmissionResponse, Route};
use serde_json::{Value, json};
use tower::ServiceExt;
use tracing_subscriber::EnvFilter;

const POD_REVIEW: &str = include_str!("../../tests/fixtures/admission/daemonset-pod-create.json");

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn deny(req: &AdmissionRequest) -> AdmissionResponse {
    AdmissionResponse::deny(&req.uid, 403, "Forbidden", "no pods here, by rule no-pods")
}

#[tokio::test(flavor = "current_thread")]
async fn a_denial_is_logged_with_one_message_key_its_reason_and_clipped_fields() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = nodewarden_runtime::telemetry::json(EnvFilter::new("info"), move || writer.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let mut review: Value = serde_json::from_str(POD_REVIEW).expect("fixture");
    let long_name = "n".repeat(100_000);
    review["request"]["name"] = json!(long_name);
    let app = admission::router(vec![Route::new("/deny", deny)], Arc::new(()), 1 << 20);
    let request = Request::post("/deny")
        .header("content-type", "application/json")
        .body(Body::from(review.to_string()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), 200);
    // a second review: the route's span is made once and entered again
    let again = Request::post("/deny")
        .header("content-type", "application/json")
        .body(Body::from(POD_REVIEW))
        .expect("request");
    assert_eq!(app.oneshot(again).await.expect("infallible").status(), 200);

    let text = String::from_utf8(lines.0.lock().expect("lines").clone()).expect("UTF-8");
    let denials: Vec<&str> = text.lines().filter(|l| l.contains("\"denied\"")).collect();
    assert_eq!(denials.len(), 2, "{text}");
    for line in &denials {
        assert!(
            line.contains("\"route\":\"/deny\""),
            "each denial names its route: {line}"
        );
    }
    let line = text
        .lines()
        .find(|l| l.contains("\"denied\""))
        .unwrap_or_else(|| panic!("no denial logged in {text}"));
    assert_eq!(line.matches("\"message\":").count(), 1, "{line}");
    let logged: Value = serde_json::from_str(line).expect("a JSON line");
    assert_eq!(logged["message"], "denied");
    assert_eq!(logged["reason"], "no pods here, by rule no-pods");
    assert_eq!(
        line.matches("\"name\":").count(),
        1,
        "the span's own name only: {line}"
    );
    let name = logged["span"]["object_name"]
        .as_str()
        .expect("object_name in the span");
    assert!(name.ends_with("… (100000 bytes)"), "{name}");
    assert_eq!(name.chars().filter(|&c| c == 'n').count(), 256);
    assert!(line.len() < 4096, "a {} byte log line", line.len());
}

#[test]
fn clip_cuts_by_characters_and_keeps_short_text() {
    assert_eq!(admission::clip("short"), "short");
    let long = "é".repeat(300);
    let clipped = admission::clip(&long);
    assert!(clipped.starts_with(&"é".repeat(256)));
    assert!(clipped.ends_with("… (600 bytes)"), "{clipped}");
}
