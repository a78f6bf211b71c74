//! Bounded memory for hostile reviews: a malformed review, a huge claim value or a huge
//! unnamed node report costs about its own size, never a generic JSON tree of it (which is
//! 10–20 × the text).
//!
//! Measured as the process's peak resident memory (Linux `VmHWM`, reset through
//! `/proc/self/clear_refs` before each measurement); the tests of this binary take turns (a
//! mutex), so none measures another's allocations.

use std::sync::Mutex;

use nodewarden_webhook::admission::{self, AdmissionRequest, AdmissionResponse, Processed, ReviewIn};
use nodewarden_webhook::claims::{self, ClaimsPolicy, Principals, StaticView};
use nodewarden_webhook::node_reports::{self, NodeReportsPolicy};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn status_kib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// How far the peak resident memory rose above the resident memory at the start while `f` ran.
fn peak_during<T>(f: impl FnOnce() -> T) -> (usize, T) {
    // "5" resets the peak (VmHWM) to the current resident size
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak resident size");
    let start = status_kib("VmRSS:");
    let out = f();
    let peak = status_kib("VmHWM:");
    let rose = peak.saturating_sub(start) * 1024;
    eprintln!("peak resident memory rose by {rose} bytes");
    (rose, out)
}

/// About 5 MB of many tiny JSON values: `[[],[],…]`, the worst case for a generic tree.
fn padding() -> String {
    let mut s = String::with_capacity(5 * 1024 * 1024 + 16);
    s.push('[');
    while s.len() < 5 * 1024 * 1024 {
        s.push_str("[],");
    }
    s.push_str("[]]");
    s
}

fn never_called(_: &AdmissionRequest) -> AdmissionResponse {
    panic!("a malformed review must not reach the handler")
}

#[test]
fn a_malformed_5mb_review_is_denied_with_its_uid_for_about_its_own_size() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // well-formed JSON with a readable uid, but `operation` is not an operation
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-1","padding":{},"kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"operation":42}}}}"#,
        padding()
    );
    let (peak, processed) = peak_during(|| admission::process(body.as_bytes(), &never_called));
    match processed {
        Processed::Review(out, outcome, _) => {
            assert_eq!(out.response.uid, "u-1");
            assert!(!out.response.allowed);
            assert_eq!(outcome, admission::Outcome::Invalid);
        }
        Processed::BadRequest(m) => panic!("the uid was readable: {m}"),
    }
    assert!(
        peak < body.len(),
        "a {} byte malformed review took {peak} bytes of resident memory",
        body.len()
    );
}

fn request(object: &str) -> AdmissionRequest {
    let review = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-2","kind":{{"group":"about.k8s.io","version":"v1beta1","kind":"ClusterProperty"}},"resource":{{"group":"about.k8s.io","version":"v1beta1","resource":"clusterproperties"}},"operation":"CREATE","userInfo":{{"username":"someone","groups":["system:authenticated"]}},"object":{object}}}}}"#
    );
    let parsed: ReviewIn = serde_json::from_str(&review).expect("review parses");
    parsed.request.expect("request")
}

#[test]
fn a_5mb_claim_value_that_is_not_a_string_is_denied_for_about_its_own_size() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let object = format!(
        r#"{{"metadata":{{"name":"custom.example.com"}},"spec":{{"value":{}}}}}"#,
        padding()
    );
    let req = request(&object);
    let policy = ClaimsPolicy {
        principals: Principals::new([], ["system:masters".to_string()], []),
        id_subdomain: false,
    };
    let view = StaticView::empty();
    let (peak, decision) = peak_during(|| claims::decide(&req, &policy, &view));
    let response = decision.into_response("u-2");
    assert!(!response.allowed);
    let message = response.status.map(|s| s.message).unwrap_or_default();
    assert!(
        message.contains("spec.value must be a string, got an array"),
        "{message}"
    );
    assert!(
        peak < object.len(),
        "a {} byte object took {peak} bytes of resident memory",
        object.len()
    );
}

#[test]
fn a_5mb_unnamed_node_report_is_decided_for_about_its_own_size() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let object = format!(
        r#"{{"metadata":{{"name":"node-a"}},"spec":{{"padding":{}}}}}"#,
        padding()
    );
    let mut req = request(&object);
    req.kind.kind = "NodeRecommendation".to_string();
    req.name = None;
    let (peak, decided) = peak_during(|| node_reports::decide(&NodeReportsPolicy::default(), &req));
    let message = decided.expect_err("someone is not the agent");
    assert!(message.contains("NodeRecommendation/node-a"), "{message}");
    assert!(
        peak < object.len(),
        "a {} byte object took {peak} bytes of resident memory",
        object.len()
    );
}
