//! The node-reports guard: node N's reports are written only by the agent on node N (by the node
//! name in its bound token), or by an allowed group. Requests are shaped as kube-apiserver sends
//! them for a bound service-account token.

use clap::Parser;
use nodewarden_webhook::admission::{AdmissionRequest, Handler, ReviewIn};
use nodewarden_webhook::node_reports::{
    NODE_NAME_EXTRA, NodeReportsArgs, NodeReportsGuard, NodeReportsPolicy, decide, parse_service_account,
};
use serde_json::{Value, json};

const AGENT: &str = "system:serviceaccount:nodewarden:nodewarden-agent";

fn policy() -> NodeReportsPolicy {
    NodeReportsPolicy {
        agent_user: Some(AGENT.to_string()),
        allowed_groups: vec!["system:masters".to_string()],
    }
}

fn request(
    kind: &str,
    name: &str,
    operation: &str,
    user: &str,
    groups: &[&str],
    token_nodes: &[&str],
) -> AdmissionRequest {
    let plural = if kind == "NodeRecommendation" {
        "noderecommendations"
    } else {
        "nodefeaturereports"
    };
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": ["JTI=6a1b"],
        "authentication.kubernetes.io/pod-name": ["nodewarden-agent-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["0f1e2d3c-0000-4000-8000-000000000001"],
    });
    if !token_nodes.is_empty() {
        extra[NODE_NAME_EXTRA] = json!(token_nodes);
        extra["authentication.kubernetes.io/node-uid"] = json!(["4a5b6c7d-0000-4000-8000-000000000002"]);
    }
    let review: Value = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "9d1c",
            "kind": {"group": "nodewarden.io", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "nodewarden.io", "version": "v1alpha1", "resource": plural},
            "name": name,
            "operation": operation,
            "userInfo": {"username": user, "uid": "5e6f", "groups": groups, "extra": extra},
            "object": {"apiVersion": "nodewarden.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": {}},
        }
    });
    let parsed: ReviewIn = serde_json::from_value(review).expect("review");
    parsed.request.expect("request")
}

const SA_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:nodewarden",
    "system:authenticated",
];

#[test]
fn table_of_writers() {
    struct Case {
        name: &'static str,
        request: AdmissionRequest,
        want: Result<(), String>,
    }
    let cases = vec![
        Case {
            name: "agent on node-a writes NodeRecommendation/node-a",
            request: request(
                "NodeRecommendation",
                "node-a",
                "CREATE",
                AGENT,
                SA_GROUPS,
                &["node-a"],
            ),
            want: Ok(()),
        },
        Case {
            name: "agent on node-a updates NodeFeatureReport/node-a",
            request: request(
                "NodeFeatureReport",
                "node-a",
                "UPDATE",
                AGENT,
                SA_GROUPS,
                &["node-a"],
            ),
            want: Ok(()),
        },
        Case {
            name: "agent on node-a writes NodeRecommendation/node-b",
            request: request(
                "NodeRecommendation",
                "node-b",
                "CREATE",
                AGENT,
                SA_GROUPS,
                &["node-a"],
            ),
            want: Err(format!(
                "NodeRecommendation/node-b can only be written by the nodewarden agent on node node-b: the token of {AGENT} is bound to node node-a, not node-b"
            )),
        },
        Case {
            name: "agent on node-a updates NodeFeatureReport/node-b",
            request: request(
                "NodeFeatureReport",
                "node-b",
                "UPDATE",
                AGENT,
                SA_GROUPS,
                &["node-a"],
            ),
            want: Err(format!(
                "NodeFeatureReport/node-b can only be written by the nodewarden agent on node node-b: the token of {AGENT} is bound to node node-a, not node-b"
            )),
        },
        Case {
            name: "agent token not bound to a node",
            request: request("NodeRecommendation", "node-a", "CREATE", AGENT, SA_GROUPS, &[]),
            want: Err(format!(
                "NodeRecommendation/node-a can only be written by the nodewarden agent on node node-a: the token of {AGENT} is not bound to a node (no {NODE_NAME_EXTRA} in userInfo.extra; use a projected service-account token of a pod on the node)"
            )),
        },
        Case {
            name: "another service account on the right node",
            request: request(
                "NodeRecommendation",
                "node-a",
                "CREATE",
                "system:serviceaccount:default:default",
                SA_GROUPS,
                &["node-a"],
            ),
            want: Err(format!(
                "NodeRecommendation/node-a can only be written by the nodewarden agent on node node-a ({AGENT} with a token bound to that node) or by a member of system:masters; user \"system:serviceaccount:default:default\" is neither"
            )),
        },
        Case {
            name: "a cluster admin",
            request: request(
                "NodeRecommendation",
                "node-b",
                "UPDATE",
                "kubernetes-admin",
                &["system:masters", "system:authenticated"],
                &[],
            ),
            want: Ok(()),
        },
        Case {
            name: "a plain user",
            request: request(
                "NodeFeatureReport",
                "node-b",
                "CREATE",
                "jane",
                &["system:authenticated"],
                &[],
            ),
            want: Err(format!(
                "NodeFeatureReport/node-b can only be written by the nodewarden agent on node node-b ({AGENT} with a token bound to that node) or by a member of system:masters; user \"jane\" is neither"
            )),
        },
        Case {
            name: "DELETE is not guarded",
            request: request(
                "NodeRecommendation",
                "node-b",
                "DELETE",
                "jane",
                &["system:authenticated"],
                &[],
            ),
            want: Ok(()),
        },
        Case {
            name: "other kinds pass",
            request: request(
                "Feature",
                "node-b",
                "CREATE",
                "jane",
                &["system:authenticated"],
                &[],
            ),
            want: Ok(()),
        },
    ];
    for case in cases {
        assert_eq!(decide(&policy(), &case.request), case.want, "{}", case.name);
    }
}

#[test]
fn without_a_pinned_agent_any_service_account_bound_to_the_node_may_write() {
    let open = NodeReportsPolicy::default();
    let sa = "system:serviceaccount:monitoring:exporter";
    assert_eq!(
        decide(
            &open,
            &request(
                "NodeRecommendation",
                "node-a",
                "CREATE",
                sa,
                SA_GROUPS,
                &["node-a"]
            )
        ),
        Ok(())
    );
    assert!(
        decide(
            &open,
            &request(
                "NodeRecommendation",
                "node-b",
                "CREATE",
                sa,
                SA_GROUPS,
                &["node-a"]
            )
        )
        .is_err()
    );
    assert!(
        decide(
            &open,
            &request("NodeRecommendation", "node-a", "CREATE", "jane", &[], &["node-a"])
        )
        .is_err()
    );
}

#[test]
fn handler_answers_403_with_the_message() {
    let guard = NodeReportsGuard::new(policy());
    let response = guard.review(&request(
        "NodeRecommendation",
        "node-b",
        "CREATE",
        AGENT,
        SA_GROUPS,
        &["node-a"],
    ));
    assert!(!response.allowed);
    let status = response.status.expect("status");
    assert_eq!(status.code, Some(403));
    assert!(
        status.message.contains("bound to node node-a, not node-b"),
        "{}",
        status.message
    );
}

#[derive(Parser, Debug)]
struct Flags {
    #[command(flatten)]
    reports: NodeReportsArgs,
}

#[test]
fn flags_and_their_errors() {
    let flags = Flags::try_parse_from([
        "x",
        "--agent-service-account",
        "nodewarden:nodewarden-agent",
        "--node-reports-allowed-groups",
        "system:masters,ops",
    ])
    .expect("flags");
    let policy = NodeReportsPolicy::from(&flags.reports);
    assert_eq!(policy.agent_user.as_deref(), Some(AGENT));
    assert_eq!(policy.allowed_groups, vec!["system:masters", "ops"]);

    let defaults = NodeReportsPolicy::from(&Flags::try_parse_from(["x"]).expect("flags").reports);
    assert_eq!(defaults, NodeReportsPolicy::default());

    let err = parse_service_account("nodewarden-agent").expect_err("no namespace");
    assert_eq!(
        err,
        "\"nodewarden-agent\" is not a service account: expected namespace:name, e.g. nodewarden:nodewarden-agent"
    );
    assert!(parse_service_account("Nodewarden:agent").is_err());
}
