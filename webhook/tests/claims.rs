//! The ClusterClaim guard's rules: a table with every rule, allowed and denied, for each of the
//! three API shapes, on AdmissionRequests shaped as kube-apiserver sends them (DELETE carries
//! `oldObject` and a null `object`); then the handler: audit annotation, metrics, the memory of
//! its own recent writes, and the HTTP answer through the router.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nodewarden_webhook::admission::{self, AdmissionRequest, Handler, ReviewIn, Route};
use nodewarden_webhook::claims::{
    ClaimsGuard, ClaimsPolicy, Presence, Principals, RECENT_WRITE_TTL, Rule, ServiceAccountName, Shape,
    StaticView, decide,
};
use nodewarden_webhook::metrics::Metrics;
use serde_json::{Value, json};

const ADMIN: (&str, &[&str]) = ("kubernetes-admin", &["system:masters", "system:authenticated"]);
const PLAIN: (&str, &[&str]) = ("jane", &["developers", "system:authenticated"]);
const ALLOWED_SA: (&str, &[&str]) = (
    "system:serviceaccount:mcs-system:mcs-agent",
    &[
        "system:serviceaccounts",
        "system:serviceaccounts:mcs-system",
        "system:authenticated",
    ],
);
const ALLOWED_USER: (&str, &[&str]) = ("fleet-manager", &["system:authenticated"]);

fn policy(id_subdomain: bool) -> ClaimsPolicy {
    let sa: ServiceAccountName = "mcs-system:mcs-agent".parse().expect("service account");
    ClaimsPolicy {
        principals: Principals::new(
            ["fleet-manager".to_string()],
            ["system:masters".to_string()],
            [sa],
        ),
        id_subdomain,
    }
}

fn version(shape: Shape) -> &'static str {
    match shape {
        Shape::About => "v1beta1",
        _ => "v1alpha1",
    }
}

fn object(shape: Shape, name: &str, value: Option<&str>) -> Value {
    let mut spec = json!({});
    if let Some(v) = value {
        spec["value"] = json!(v);
    }
    json!({
        "apiVersion": format!("{}/{}", shape.group(), version(shape)),
        "kind": shape.kind(),
        "metadata": {
            "name": name,
            "uid": "7d9c4a1e-0d6f-4a57-9a55-0c8f3b1f2e11",
            "resourceVersion": "4711",
            "generation": 1,
            "creationTimestamp": "2026-11-21T07:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": format!("{}/{}", shape.group(), version(shape)), "time": "2026-11-21T07:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:value": {}}}}]
        },
        "spec": spec,
    })
}

/// An AdmissionReview as kube-apiserver sends it for a cluster-scoped custom resource.
fn review(
    shape: Shape,
    op: &str,
    name: &str,
    new: Option<&str>,
    old: Option<&str>,
    user: (&str, &[&str]),
) -> Value {
    let gvk = json!({"group": shape.group(), "version": version(shape), "kind": shape.kind()});
    let gvr = json!({"group": shape.group(), "version": version(shape), "resource": shape.plural()});
    let (obj, old_obj, options) = match op {
        "CREATE" => (
            object(shape, name, new),
            Value::Null,
            json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-client-side-apply"}),
        ),
        "UPDATE" => (
            object(shape, name, new),
            object(shape, name, old),
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
        ),
        "DELETE" => (
            Value::Null,
            object(shape, name, old),
            json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "propagationPolicy": "Background"}),
        ),
        other => panic!("no such operation in these tests: {other}"),
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0f8a8f33-5b0a-4b6e-9a43-6f4f3c0c2a01",
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": name,
            "operation": op,
            "userInfo": {"username": user.0, "uid": "u-1", "groups": user.1},
            "object": obj,
            "oldObject": old_obj,
            "dryRun": false,
            "options": options,
        }
    })
}

fn request(review: &Value) -> AdmissionRequest {
    let parsed: ReviewIn = serde_json::from_value(review.clone()).expect("review parses");
    parsed.request.expect("request")
}

struct Case {
    what: &'static str,
    op: &'static str,
    name: &'static str,
    new: Option<&'static str>,
    old: Option<&'static str>,
    user: (&'static str, &'static [&'static str]),
    /// Claims that exist in the same shape.
    existing: &'static [&'static str],
    subdomain: bool,
    allowed: bool,
    rule: Rule,
    /// A piece of the message a denial must carry.
    says: &'static str,
}

const fn case(what: &'static str, op: &'static str, name: &'static str) -> Case {
    Case {
        what,
        op,
        name,
        new: None,
        old: None,
        user: ADMIN,
        existing: &[],
        subdomain: false,
        allowed: true,
        rule: Rule::CustomName,
        says: "",
    }
}

impl Case {
    const fn value(mut self, v: &'static str) -> Self {
        self.new = Some(v);
        self
    }
    const fn was(mut self, v: &'static str) -> Self {
        self.old = Some(v);
        self
    }
    const fn by(mut self, user: (&'static str, &'static [&'static str])) -> Self {
        self.user = user;
        self
    }
    const fn with(mut self, existing: &'static [&'static str]) -> Self {
        self.existing = existing;
        self
    }
    const fn subdomain(mut self) -> Self {
        self.subdomain = true;
        self
    }
    const fn allow(mut self, rule: Rule) -> Self {
        self.allowed = true;
        self.rule = rule;
        self
    }
    const fn deny(mut self, rule: Rule, says: &'static str) -> Self {
        self.allowed = false;
        self.rule = rule;
        self.says = says;
        self
    }
}

const ID: &str = "id.k8s.io";
const CID: &str = "cluster.clusterset.k8s.io";
const SET: &str = "clusterset.k8s.io";
const LABEL_63: &str = "a23456789012345678901234567890123456789012345678901234567890123";
const LABEL_64: &str = "a234567890123456789012345678901234567890123456789012345678901234";
/// 127 characters: the longest subdomain ID.
static SUB_127: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{}.{}.{}", "a".repeat(63), "b".repeat(59), "c".repeat(3)));
/// 128 characters.
static SUB_128: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!("{}d", SUB_127.as_str()));

fn cases() -> Vec<Case> {
    vec![
        // custom names: free for everyone, subject to size
        case("custom create by a plain user", "CREATE", "region.example.com").value("eu-west-1").by(PLAIN),
        case("custom update by a plain user", "UPDATE", "region.example.com").value("eu-west-2").was("eu-west-1").by(PLAIN),
        case("custom delete by a plain user", "DELETE", "region.example.com").was("eu-west-1").by(PLAIN),
        case("a name merely containing k8s.io is custom", "CREATE", "notk8s.io").value("x").by(PLAIN),
        case("an empty value", "CREATE", "region.example.com").value("").by(PLAIN)
            .deny(Rule::ValueSize, "spec.value is empty; a claim value must be 1 to 131072 bytes"),
        case("a missing value", "CREATE", "region.example.com").by(PLAIN)
            .deny(Rule::ValueSize, "spec.value is empty"),
        case("an empty value on update", "UPDATE", "region.example.com").value("").was("eu").by(PLAIN)
            .deny(Rule::ValueSize, "spec.value is empty"),
        // reserved names
        case("reserved create by a plain user", "CREATE", "platform.k8s.io").value("x").by(PLAIN)
            .deny(Rule::ReservedName, "\"platform.k8s.io\" is reserved"),
        case("sigs.k8s.io by a plain user", "CREATE", "sigs.k8s.io").value("x").by(PLAIN)
            .deny(Rule::ReservedName, "\"jane\" may not create it"),
        case("k8s.io itself by a plain user", "CREATE", "k8s.io").value("x").by(PLAIN)
            .deny(Rule::ReservedName, "is reserved"),
        case("kubernetes.io delete by a plain user", "DELETE", "zone.kubernetes.io").was("x").by(PLAIN)
            .deny(Rule::ReservedName, "may not delete it"),
        case("reserved update by a plain user", "UPDATE", "platform.k8s.io").value("y").was("x").by(PLAIN)
            .deny(Rule::ReservedName, "may not update it"),
        case("ID claim by a plain user", "CREATE", ID).value("cluster-a").by(PLAIN)
            .deny(Rule::ReservedName, "may not create it"),
        case("clusterset delete by a plain user", "DELETE", SET).was("set-1").by(PLAIN).with(&[ID, SET])
            .deny(Rule::ReservedName, "may not delete it"),
        case("reserved create by system:masters", "CREATE", "platform.k8s.io").value("x").allow(Rule::ReservedName),
        case("reserved create by an allowed service account", "CREATE", "platform.k8s.io").value("x").by(ALLOWED_SA)
            .allow(Rule::ReservedName),
        case("reserved create by an allowed user", "CREATE", "platform.k8s.io").value("x").by(ALLOWED_USER)
            .allow(Rule::ReservedName),
        case("reserved name with an empty value", "CREATE", "platform.k8s.io").value("")
            .deny(Rule::ValueSize, "spec.value is empty"),
        // ID format
        case("ID create", "CREATE", ID).value("cluster-a").allow(Rule::IdClaim),
        case("ID of 63 characters", "CREATE", ID).value(LABEL_63).allow(Rule::IdClaim),
        case("kube-system UID as the ID", "CREATE", ID).value("3c1e0b59-6d0a-4a8c-b1c6-2d5f1e7a9b10").allow(Rule::IdClaim),
        case("ID of 64 characters", "CREATE", ID).value(LABEL_64)
            .deny(Rule::IdFormat, "is 64 characters long, at most 63 allowed"),
        case("ID with capitals", "CREATE", ID).value("Cluster_A")
            .deny(Rule::IdFormat, "spec.value \"Cluster_A\" contains 'C'; only lowercase letters, digits and '-' are allowed; the cluster ID must be an RFC 1123 DNS label"),
        case("ID starting with -", "CREATE", ID).value("-cluster")
            .deny(Rule::IdFormat, "must start and end with a lowercase letter or digit"),
        case("ID with a dot", "CREATE", CID).value("cluster.example")
            .deny(Rule::IdFormat, "contains '.'"),
        case("subdomain ID with the flag", "CREATE", CID).value("cluster-1.fleet.example").subdomain().allow(Rule::IdClaim),
        case("subdomain ID of 127 characters", "CREATE", CID).value(SUB_127.as_str()).subdomain().allow(Rule::IdClaim),
        case("subdomain ID of 128 characters", "CREATE", CID).value(SUB_128.as_str()).subdomain()
            .deny(Rule::IdFormat, "is 128 characters long, at most 127 allowed"),
        case("subdomain with an empty part", "CREATE", CID).value("a..b").subdomain()
            .deny(Rule::IdFormat, "has an empty part between dots"),
        case("the flag does not cover id.k8s.io", "CREATE", ID).value("cluster-1.fleet.example").subdomain()
            .deny(Rule::IdFormat, "contains '.'"),
        case("empty ID", "CREATE", ID).value("").deny(Rule::ValueSize, "spec.value is empty"),
        case("ID update to a bad value", "UPDATE", ID).value("BAD").was("cluster-a")
            .deny(Rule::IdFormat, "spec.value \"BAD\" contains 'B'"),
        case("a stored bad ID stays editable (value unchanged)", "UPDATE", ID).value("Old_Id").was("Old_Id").allow(Rule::IdClaim),
        // ID lifespan
        case("ID change outside a ClusterSet", "UPDATE", ID).value("cluster-b").was("cluster-a").with(&[ID]).allow(Rule::IdClaim),
        case("ID change while a member", "UPDATE", ID).value("cluster-b").was("cluster-a").with(&[ID, SET])
            .deny(Rule::IdLifespan, "\"id.k8s.io\" cannot change from \"cluster-a\" to \"cluster-b\" while"),
        case("metadata-only update while a member", "UPDATE", ID).value("cluster-a").was("cluster-a").with(&[ID, SET])
            .allow(Rule::IdClaim),
        case("ID delete while a member", "DELETE", ID).was("cluster-a").with(&[ID, SET])
            .deny(Rule::IdLifespan, "cannot be deleted while"),
        case("the other ID name delete while a member", "DELETE", CID).was("cluster-a").with(&[ID, CID, SET])
            .deny(Rule::IdLifespan, "cannot be deleted while"),
        case("ID delete by an allowed service account while a member", "DELETE", ID).was("cluster-a").by(ALLOWED_SA).with(&[ID, SET])
            .deny(Rule::IdLifespan, "delete clusterset.k8s.io first to leave the ClusterSet"),
        case("ID delete outside a ClusterSet", "DELETE", ID).was("cluster-a").with(&[ID]).allow(Rule::IdClaim),
        case("second ID name created while a member", "CREATE", CID).value("cluster-a").with(&[ID, SET]).allow(Rule::IdClaim),
        // clusterset
        case("clusterset create with id.k8s.io", "CREATE", SET).value("set-1").by(ALLOWED_SA).with(&[ID])
            .allow(Rule::ClustersetClaim),
        case("clusterset create with cluster.clusterset.k8s.io", "CREATE", SET).value("set-1").with(&[CID])
            .allow(Rule::ClustersetClaim),
        case("clusterset create without an ID", "CREATE", SET).value("set-1").with(&["region.example.com"])
            .deny(Rule::ClustersetRequiresId, "(value \"set-1\") cannot be created while no ID claim exists"),
        case("clusterset change", "UPDATE", SET).value("set-2").was("set-1").with(&[ID, SET])
            .deny(Rule::ClustersetImmutable, "cannot change from \"set-1\" to \"set-2\"; to move to another ClusterSet, delete it and create it again"),
        case("clusterset metadata-only update", "UPDATE", SET).value("set-1").was("set-1").with(&[ID, SET])
            .allow(Rule::ClustersetClaim),
        case("clusterset delete (leaving)", "DELETE", SET).was("set-1").with(&[ID, SET]).allow(Rule::ClustersetClaim),
    ]
}

fn view_for(shape: Shape, existing: &[&str]) -> StaticView {
    StaticView::empty().with(shape, existing)
}

#[test]
fn every_rule_allowed_and_denied_for_every_api_shape() {
    assert_eq!((SUB_127.len(), SUB_128.len()), (127, 128));
    let mut failures = Vec::new();
    for shape in Shape::ALL {
        for c in cases() {
            let r = request(&review(shape, c.op, c.name, c.new, c.old, c.user));
            let d = decide(&r, &policy(c.subdomain), &view_for(shape, c.existing));
            let ok = d.allowed == c.allowed
                && d.rule == c.rule
                && (c.allowed
                    || (d.message.starts_with(&format!("{}: ", c.rule)) && d.message.contains(c.says)))
                && d.code == if c.allowed { 200 } else { 403 };
            if !ok {
                failures.push(format!("{shape} / {}: got {d:?}", c.what));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_kind_in_messages_follows_the_api_shape() {
    let r = request(&review(Shape::About, "CREATE", ID, Some("Bad"), None, ADMIN));
    let d = decide(&r, &policy(false), &StaticView::empty());
    assert!(
        d.message
            .starts_with("id-format: ClusterProperty \"id.k8s.io\": "),
        "{}",
        d.message
    );
    let r = request(&review(Shape::About, "DELETE", ID, None, Some("a"), ADMIN));
    let d = decide(
        &r,
        &policy(false),
        &StaticView::empty().with(Shape::About, &[ID, SET]),
    );
    assert!(
        d.message
            .contains("while ClusterProperty \"clusterset.k8s.io\" exists"),
        "{}",
        d.message
    );
}

#[test]
fn sizes_at_the_limit() {
    let at_limit = "v".repeat(128 * 1024);
    let over = "v".repeat(128 * 1024 + 1);
    for shape in Shape::ALL {
        let r = request(&review(
            shape,
            "CREATE",
            "blob.example.com",
            Some(&at_limit),
            None,
            PLAIN,
        ));
        assert!(
            decide(&r, &policy(false), &StaticView::empty()).allowed,
            "{shape}"
        );
        let r = request(&review(
            shape,
            "CREATE",
            "blob.example.com",
            Some(&over),
            None,
            PLAIN,
        ));
        let d = decide(&r, &policy(false), &StaticView::empty());
        assert_eq!(d.rule, Rule::ValueSize);
        // the value is quoted, cut to 64 characters, with its size
        let expected = format!(
            "value-size: {} \"blob.example.com\": spec.value \"{}\"… (131073 bytes) is too long; a claim value must be 1 to 131072 bytes",
            shape.kind(),
            "v".repeat(64)
        );
        assert_eq!(d.message, expected);
    }
}

#[test]
fn exact_messages_of_the_policy_denials() {
    let r = request(&review(
        Shape::Nodewarden,
        "CREATE",
        ID,
        Some("cluster-a"),
        None,
        PLAIN,
    ));
    let d = decide(&r, &policy(false), &StaticView::empty());
    assert_eq!(
        d.message,
        "reserved-name: ClusterClaim \"id.k8s.io\" is reserved (names ending in .k8s.io or .kubernetes.io); \
         \"jane\" may not create it: only the users, groups and service accounts allowed by the nodewarden configuration may"
    );
    let r = request(&review(
        Shape::Nodewarden,
        "DELETE",
        ID,
        None,
        Some("cluster-a"),
        ADMIN,
    ));
    let d = decide(
        &r,
        &policy(false),
        &StaticView::empty().with(Shape::Nodewarden, &[ID, SET]),
    );
    assert_eq!(
        d.message,
        "id-lifespan: ClusterClaim \"id.k8s.io\" cannot be deleted while ClusterClaim \"clusterset.k8s.io\" exists \
         (the cluster is a ClusterSet member); delete clusterset.k8s.io first to leave the ClusterSet"
    );
    let r = request(&review(
        Shape::Nodewarden,
        "CREATE",
        SET,
        Some("set-1"),
        None,
        ADMIN,
    ));
    let d = decide(&r, &policy(false), &StaticView::empty());
    assert_eq!(
        d.message,
        "clusterset-requires-id: ClusterClaim \"clusterset.k8s.io\" (value \"set-1\") cannot be created while no ID \
         claim exists; create ClusterClaim \"id.k8s.io\" or \"cluster.clusterset.k8s.io\" first"
    );
}

#[test]
fn each_api_shape_is_a_set_of_claims_of_its_own() {
    // an ID in nodewarden's ClusterClaims does not let a ClusterProperty clusterset in
    let view = StaticView::empty().with(Shape::Nodewarden, &[ID, SET]);
    let r = request(&review(Shape::About, "CREATE", SET, Some("set-1"), None, ADMIN));
    assert_eq!(decide(&r, &policy(false), &view).rule, Rule::ClustersetRequiresId);
    // and an OCM clusterset does not pin nodewarden's ID
    let view = StaticView::empty()
        .with(Shape::OpenClusterManagement, &[ID, SET])
        .with(Shape::Nodewarden, &[ID]);
    let r = request(&review(Shape::Nodewarden, "DELETE", ID, None, Some("a"), ADMIN));
    assert!(decide(&r, &policy(false), &view).allowed);
}

#[test]
fn objects_on_their_way_out_count_as_maybe_present() {
    // a clusterset with a deletionTimestamp still pins the ID ...
    let view = StaticView::empty().with(Shape::Nodewarden, &[ID]).with_presence(
        Shape::Nodewarden,
        SET,
        Presence::UNCERTAIN,
    );
    let r = request(&review(Shape::Nodewarden, "DELETE", ID, None, Some("a"), ADMIN));
    assert_eq!(decide(&r, &policy(false), &view).rule, Rule::IdLifespan);
    // ... and an ID on its way out does not let a clusterset in
    let view = StaticView::empty().with_presence(Shape::Nodewarden, ID, Presence::UNCERTAIN);
    let r = request(&review(Shape::Nodewarden, "CREATE", SET, Some("s"), None, ADMIN));
    let d = decide(&r, &policy(false), &view);
    assert_eq!(d.rule, Rule::ClustersetRequiresId);
    assert!(
        d.message.ends_with(
            "cannot be created yet: ClusterClaim \"id.k8s.io\" was written moments ago or is being deleted, \
             and nodewarden has not seen it settle; retry shortly"
        ),
        "{}",
        d.message
    );
}

#[test]
fn without_a_synced_cache_only_the_cross_object_rules_wait() {
    let view = StaticView::empty().without(Shape::OpenClusterManagement);
    let shape = Shape::OpenClusterManagement;
    for (op, name, new, old) in [
        ("DELETE", ID, None, Some("a")),
        ("UPDATE", CID, Some("b"), Some("a")),
        ("CREATE", SET, Some("s"), None),
    ] {
        let d = decide(
            &request(&review(shape, op, name, new, old, ADMIN)),
            &policy(false),
            &view,
        );
        assert_eq!(
            (d.allowed, d.rule, d.code),
            (false, Rule::CacheNotSynced, 503),
            "{op} {name}"
        );
        assert!(d.message.contains("retry shortly"), "{}", d.message);
    }
    // everything else is decided at once
    let d = decide(
        &request(&review(shape, "CREATE", ID, Some("a"), None, ADMIN)),
        &policy(false),
        &view,
    );
    assert_eq!(d.rule, Rule::IdClaim);
    let d = decide(
        &request(&review(shape, "CREATE", SET, Some("s"), None, PLAIN)),
        &policy(false),
        &view,
    );
    assert_eq!(d.rule, Rule::ReservedName);
    let d = decide(
        &request(&review(shape, "CREATE", "x.example.com", Some("1"), None, PLAIN)),
        &policy(false),
        &view,
    );
    assert!(d.allowed);
}

#[test]
fn unreadable_requests_are_denied_with_400() {
    let mut r = review(
        Shape::Nodewarden,
        "CREATE",
        "x.example.com",
        Some("1"),
        None,
        ADMIN,
    );
    r["request"]["object"]["spec"]["value"] = json!(42);
    let d = decide(&request(&r), &policy(false), &StaticView::empty());
    assert_eq!((d.rule, d.code), (Rule::Malformed, 400));
    assert!(
        d.message
            .contains("object.spec.value must be a string, got a number"),
        "{}",
        d.message
    );

    let mut r = review(
        Shape::Nodewarden,
        "CREATE",
        "x.example.com",
        Some("1"),
        None,
        ADMIN,
    );
    r["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    let d = decide(&request(&r), &policy(false), &StaticView::empty());
    assert_eq!((d.rule, d.code), (Rule::UnsupportedKind, 400));
    assert!(d.message.contains("got /v1 ConfigMap"), "{}", d.message);
}

#[test]
fn a_delete_without_old_object_is_decided_by_name() {
    let mut r = review(Shape::Nodewarden, "DELETE", ID, None, Some("a"), ADMIN);
    r["request"]["oldObject"] = Value::Null;
    let view = StaticView::empty().with(Shape::Nodewarden, &[ID, SET]);
    assert_eq!(decide(&request(&r), &policy(false), &view).rule, Rule::IdLifespan);
}

#[test]
fn messages_quote_at_most_64_characters() {
    let long = format!("{}Z", "a".repeat(100));
    let r = request(&review(Shape::Nodewarden, "CREATE", ID, Some(&long), None, ADMIN));
    let d = decide(&r, &policy(false), &StaticView::empty());
    assert!(
        d.message
            .contains(&format!("\"{}\"… (101 bytes)", "a".repeat(64))),
        "{}",
        d.message
    );
    assert!(d.message.len() < 400, "{}", d.message);
}

// --- the handler ---

fn make_guard(view: StaticView) -> (ClaimsGuard, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (
        ClaimsGuard::new(policy(false), Arc::new(view), metrics.clone()),
        metrics,
    )
}

#[test]
fn every_answer_names_its_rule_in_an_audit_annotation_and_is_counted() {
    let (guard, metrics) = make_guard(StaticView::empty());
    let allowed = guard.review(&request(&review(
        Shape::Nodewarden,
        "CREATE",
        "x.example.com",
        Some("1"),
        None,
        PLAIN,
    )));
    assert!(allowed.allowed);
    assert_eq!(
        allowed.audit_annotations.get("rule").map(String::as_str),
        Some("custom-name")
    );
    let denied = guard.review(&request(&review(
        Shape::Nodewarden,
        "CREATE",
        ID,
        Some("a"),
        None,
        PLAIN,
    )));
    assert!(!denied.allowed);
    assert_eq!(
        denied.audit_annotations.get("rule").map(String::as_str),
        Some("reserved-name")
    );
    let status = denied.status.expect("status");
    assert_eq!((status.code, status.reason.as_str()), (Some(403), "Forbidden"));
    assert_eq!(denied.uid, "0f8a8f33-5b0a-4b6e-9a43-6f4f3c0c2a01");

    let text = metrics.encode();
    assert!(
        text.contains("nodewarden_claims_decisions_total{rule=\"custom-name\",outcome=\"allowed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("nodewarden_claims_decisions_total{rule=\"reserved-name\",outcome=\"denied\"} 1"),
        "{text}"
    );
}

#[test]
fn rule_names_are_a_fixed_set_of_valid_annotation_values() {
    for rule in Rule::ALL {
        let name = rule.as_str();
        assert!(
            name.len() <= 63 && name.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
            "{name}"
        );
    }
}

#[test]
fn the_guard_remembers_its_own_writes_until_the_cache_shows_them() {
    // the cache shows an ID and no clusterset
    let (guard, _) = make_guard(StaticView::empty().with(Shape::Nodewarden, &[ID]));
    let now = Instant::now();
    let join = request(&review(
        Shape::Nodewarden,
        "CREATE",
        SET,
        Some("set-1"),
        None,
        ADMIN,
    ));
    assert!(guard.decide_at(&join, now).allowed);
    // before the watch event arrives, the ID is already pinned
    let delete_id = request(&review(Shape::Nodewarden, "DELETE", ID, None, Some("a"), ADMIN));
    assert_eq!(
        guard.decide_at(&delete_id, now + Duration::from_millis(5)).rule,
        Rule::IdLifespan
    );
    // the memory fades if the cache never shows the write (e.g. another webhook refused it)
    assert!(
        guard
            .decide_at(&delete_id, now + RECENT_WRITE_TTL + Duration::from_secs(1))
            .allowed
    );

    // an admitted ID create is not yet proof that the ID exists: joining waits for the cache
    let (guard, _) = make_guard(StaticView::empty());
    let create_id = request(&review(Shape::Nodewarden, "CREATE", ID, Some("a"), None, ADMIN));
    assert!(guard.decide_at(&create_id, now).allowed);
    let d = guard.decide_at(&join, now + Duration::from_millis(5));
    assert!(
        d.rule == Rule::ClustersetRequiresId && d.message.contains("retry shortly"),
        "{d:?}"
    );

    // an admitted ID delete stops a clusterset create that the stale cache would allow
    let (guard, _) = make_guard(StaticView::empty().with(Shape::Nodewarden, &[ID]));
    assert!(guard.decide_at(&delete_id, now).allowed);
    assert_eq!(
        guard.decide_at(&join, now + Duration::from_millis(5)).rule,
        Rule::ClustersetRequiresId
    );
}

#[test]
fn dry_runs_are_not_remembered() {
    let (guard, _) = make_guard(StaticView::empty().with(Shape::Nodewarden, &[ID]));
    let now = Instant::now();
    let mut join = review(Shape::Nodewarden, "CREATE", SET, Some("set-1"), None, ADMIN);
    join["request"]["dryRun"] = json!(true);
    assert!(guard.decide_at(&request(&join), now).allowed);
    let delete_id = request(&review(Shape::Nodewarden, "DELETE", ID, None, Some("a"), ADMIN));
    assert!(guard.decide_at(&delete_id, now).allowed);
}

#[tokio::test]
async fn the_router_answers_a_denial_with_http_200_and_allowed_false() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let metrics = Arc::new(Metrics::new());
    let guard = Arc::new(ClaimsGuard::new(
        policy(false),
        Arc::new(StaticView::empty()),
        metrics.clone(),
    ));
    let app = admission::router(
        vec![Route {
            path: "/validate/claims",
            handler: guard,
        }],
        metrics,
        1 << 20,
    );
    let body = review(Shape::About, "CREATE", "platform.k8s.io", Some("x"), None, PLAIN).to_string();
    let req = http::Request::post("/validate/claims")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .expect("request");
    let resp = app.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), http::StatusCode::OK);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let out: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(out["response"]["allowed"], json!(false));
    assert_eq!(out["response"]["status"]["code"], json!(403));
    assert_eq!(
        out["response"]["auditAnnotations"],
        json!({"rule": "reserved-name"})
    );
    assert!(
        out["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("reserved-name: ClusterProperty \"platform.k8s.io\" is reserved")),
        "{out}"
    );
}
