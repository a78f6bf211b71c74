//! The eviction guard: the agent on node N evicts only pods on node N. Requests are shaped as
//! kube-apiserver sends a `CREATE pods/eviction` made with a bound service-account token.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use futures::future::BoxFuture;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use nodewarden_webhook::admission::{self, AdmissionRequest, Handler, ReviewIn, Route};
use nodewarden_webhook::metrics::Metrics;
use nodewarden_webhook::node_reports::evictions::{
    ApiServerPods, EvictionCheck, EvictionGuard, PodNode, PodNodes, ROUTE, check, decide,
};
use nodewarden_webhook::node_reports::{NODE_NAME_EXTRA, NodeReportsPolicy};
use serde_json::{Value, json};
use tower::ServiceExt;

const AGENT: &str = "system:serviceaccount:nodewarden:nodewarden-agent";
const SA_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:nodewarden",
    "system:authenticated",
];

fn policy() -> NodeReportsPolicy {
    NodeReportsPolicy {
        agent_user: Some(AGENT.to_string()),
        allowed_groups: vec!["system:masters".to_string()],
    }
}

fn review(pod: &str, user: &str, groups: &[&str], token_nodes: &[&str]) -> Value {
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": ["JTI=77aa"],
        "authentication.kubernetes.io/pod-name": ["nodewarden-agent-q8x2z"],
        "authentication.kubernetes.io/pod-uid": ["0f1e2d3c-0000-4000-8000-000000000003"],
    });
    if !token_nodes.is_empty() {
        extra[NODE_NAME_EXTRA] = json!(token_nodes);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e1f2",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "eviction",
            "name": pod,
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": user, "uid": "5e6f", "groups": groups, "extra": extra},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": pod, "namespace": "shop"}},
            "oldObject": null,
            "dryRun": false,
        }
    })
}

fn request(review: Value) -> AdmissionRequest {
    let parsed: ReviewIn = serde_json::from_value(review).expect("review");
    parsed.request.expect("request")
}

fn read(pod: &str, node: &str) -> EvictionCheck {
    EvictionCheck::ReadPod {
        namespace: "shop".to_string(),
        name: pod.to_string(),
        token_node: node.to_string(),
    }
}

#[test]
fn table_of_requests() {
    let mut no_name = review("", AGENT, SA_GROUPS, &["node-a"]);
    no_name["request"]["object"]["metadata"]["name"] = json!("web-0");
    let mut delete = review("web-0", AGENT, SA_GROUPS, &["node-a"]);
    delete["request"]["operation"] = json!("DELETE");
    let mut resize = review("web-0", AGENT, SA_GROUPS, &["node-a"]);
    resize["request"]["operation"] = json!("UPDATE");
    resize["request"]["subResource"] = json!("resize");
    let cases: Vec<(&str, Value, EvictionCheck)> = vec![
        (
            "the agent's eviction: read the pod",
            review("web-0", AGENT, SA_GROUPS, &["node-a"]),
            read("web-0", "node-a"),
        ),
        (
            "the name from the Eviction when the request has none",
            no_name,
            read("web-0", "node-a"),
        ),
        (
            "another service account is not guarded",
            review(
                "web-0",
                "system:serviceaccount:kube-system:descheduler",
                SA_GROUPS,
                &["node-b"],
            ),
            EvictionCheck::Allow,
        ),
        (
            "a user is not guarded",
            review("web-0", "alice", &["system:authenticated"], &[]),
            EvictionCheck::Allow,
        ),
        ("not an eviction: DELETE", delete, EvictionCheck::Allow),
        ("not an eviction: resize", resize, EvictionCheck::Allow),
        (
            "the agent with a token bound to no node",
            review("web-0", AGENT, SA_GROUPS, &[]),
            EvictionCheck::Deny(format!(
                "pod shop/web-0 may be evicted by the nodewarden agent only from the pod's own node: the token of {AGENT} is not bound to a node (no {NODE_NAME_EXTRA} in userInfo.extra; use a projected service-account token of a pod on the node)"
            )),
        ),
        (
            "the agent with a token naming two nodes",
            review("web-0", AGENT, SA_GROUPS, &["node-a", "node-b"]),
            EvictionCheck::Deny(format!(
                "pod shop/web-0 may be evicted by the nodewarden agent only from the pod's own node: the token of {AGENT} names several nodes [\"node-a\", \"node-b\"]"
            )),
        ),
    ];
    for (name, review, want) in cases {
        assert_eq!(check(&policy(), &request(review)), want, "{name}");
    }

    // no agent pinned: the guard cannot tell the agent from a descheduler, and guards nothing
    let unpinned = NodeReportsPolicy {
        agent_user: None,
        ..policy()
    };
    assert_eq!(
        check(
            &unpinned,
            &request(review("web-0", AGENT, SA_GROUPS, &["node-a"]))
        ),
        EvictionCheck::Allow
    );
}

#[test]
fn table_of_pods() {
    let cases: Vec<(&str, PodNode, Result<(), String>)> = vec![
        ("on the agent's node", PodNode::Bound("node-a".into()), Ok(())),
        (
            "on another node",
            PodNode::Bound("node-b".into()),
            Err("pod shop/web-0 is on node node-b; the nodewarden agent on node node-a may evict only pods on node node-a".into()),
        ),
        (
            "on no node",
            PodNode::Unbound,
            Err("pod shop/web-0 is not bound to a node; the nodewarden agent on node node-a may evict only pods on node node-a".into()),
        ),
        ("gone: the eviction answers 404 itself", PodNode::NotFound, Ok(())),
        (
            "unreadable",
            PodNode::Unknown("the API server did not answer within 2s".into()),
            Err("nodewarden could not read pod shop/web-0 to check that it is on node node-a (the API server did not answer within 2s); the nodewarden agent evicts nothing that cannot be checked".into()),
        ),
    ];
    for (name, pod, want) in cases {
        assert_eq!(decide("shop", "web-0", "node-a", &pod), want, "{name}");
    }
}

/// Pods by name; counts the reads.
struct FakePods {
    nodes: BTreeMap<String, PodNode>,
    reads: std::sync::atomic::AtomicUsize,
}

impl PodNodes for FakePods {
    fn node_of<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, PodNode> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let node = self
            .nodes
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .unwrap_or(PodNode::NotFound);
        Box::pin(async move {
            tokio::task::yield_now().await;
            node
        })
    }
}

async fn post(app: axum::Router, body: &Value) -> Value {
    let req = Request::post(ROUTE)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = app.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).expect("json")
}

#[tokio::test]
async fn the_router_reads_the_pod_once_and_answers_403_with_both_nodes() {
    let pods = Arc::new(FakePods {
        nodes: BTreeMap::from([
            ("shop/web-0".to_string(), PodNode::Bound("node-a".to_string())),
            ("shop/web-1".to_string(), PodNode::Bound("node-b".to_string())),
        ]),
        reads: Default::default(),
    });
    let guard = EvictionGuard::new(policy(), pods.clone());
    let app = admission::router(vec![Route::new(ROUTE, guard)], Arc::new(Metrics::new()), 1 << 20);

    let out = post(app.clone(), &review("web-0", AGENT, SA_GROUPS, &["node-a"])).await;
    assert_eq!(out["response"]["uid"], "e1f2");
    assert_eq!(out["response"]["allowed"], true, "{out}");

    let out = post(app.clone(), &review("web-1", AGENT, SA_GROUPS, &["node-a"])).await;
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 403);
    assert_eq!(out["response"]["status"]["reason"], "Forbidden");
    assert_eq!(
        out["response"]["status"]["message"],
        "pod shop/web-1 is on node node-b; the nodewarden agent on node node-a may evict only pods on node node-a"
    );
    assert_eq!(pods.reads.load(std::sync::atomic::Ordering::SeqCst), 2);

    // someone else's eviction is allowed without a read
    let out = post(app, &review("web-1", "alice", &["system:authenticated"], &[])).await;
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(pods.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn without_an_api_server_client_the_agent_evicts_nothing() {
    let guard = EvictionGuard::new(policy(), Arc::new(ApiServerPods::new(Duration::from_secs(1))));
    let app = admission::router(vec![Route::new(ROUTE, guard)], Arc::new(Metrics::new()), 1 << 20);
    let out = post(app, &review("web-0", AGENT, SA_GROUPS, &["node-a"])).await;
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(
        out["response"]["status"]["message"],
        "nodewarden could not read pod shop/web-0 to check that it is on node node-a (the webhook has no API server client yet); the nodewarden agent evicts nothing that cannot be checked"
    );
}

#[test]
fn the_synchronous_path_denies_what_needs_the_pod() {
    let guard = EvictionGuard::new(policy(), Arc::new(ApiServerPods::new(Duration::from_secs(1))));
    let denied = guard.review(&request(review("web-0", AGENT, SA_GROUPS, &["node-a"])));
    assert!(!denied.allowed);
    let allowed = guard.review(&request(review("web-0", "alice", &[], &[])));
    assert!(allowed.allowed);
}
